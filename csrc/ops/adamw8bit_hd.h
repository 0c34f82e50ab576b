/* One block of 8-bit AdamW (bitsandbytes' optimizer_update_8bit_blockwise, "adam" with its
 * AdamW8bit weight decay), shared by the CPU/sim loop (train/optim8_cpu.c) and the CUDA kernel
 * (cuda/optim8.cu). For each element of a block of n <= GT_ADAMW8_BLOCK elements:
 *   m = code1[c1] * absmax1          v = code2[c2] * absmax2          (dequantize, f32)
 *   g = grad * grad_coef (negated when maximizing)
 *   m = m * f32(beta1) + f32(1 - beta1) * g
 *   v = v * f32(beta2) + (f32(1 - beta2) * g) * g
 *   p = p * f32(1 - lr*wd)                                            (decoupled decay first)
 *   p = p + (f32(-lr / (1 - beta1^t)) * m) / (sqrt(v) / f32(sqrt(1 - beta2^t)) + f32(eps))
 * each operation rounded to f32 once (no FMA), then the block's new absmax (max |m|, max |v|)
 * and the codes of m and v by nearest value of their maps: ops/quant_hd.h's quantizer, the one
 * gputrain.quant uses (multiply by f32(1 / absmax) in a full block, divide by it in the short last
 * block of a parameter, clamp to [-1, 1], bucketize over the maps' midpoints; an all-zero block's
 * absmax is 1e-38 when it is short). bitsandbytes' CPU backend runs this order (torch ops);
 * its CUDA kernel multiplies eps by sqrt(1 - beta2^t) instead of dividing sqrt(v) by it and decays
 * after the step, and its quantizer is a tree search: within rounding of this. */
#ifndef GT_ADAMW8BIT_HD_H
#define GT_ADAMW8BIT_HD_H

#include <stddef.h>
#include <stdint.h>

#include "core/adamw8bit.h"
#include "core/fp_ops.h"
#include "ops/quant_hd.h"

/* The dynamic maps as the block math reads them (static tables in C, __constant__ in CUDA). */
typedef struct gt_adamw8_maps {
    const float *code1;     /* (256,) signed map: first moment */
    const float *bounds1;   /* (255,) its midpoints */
    const float *code2;     /* (256,) unsigned map: second moment */
    const float *bounds2;   /* (255,) its midpoints */
    const uint8_t *order;   /* (256,) identity: both maps are sorted */
} gt_adamw8_maps;

/* Element i's update in f32: p, m, v read and written (m, v dequantized by the caller). */
GT_HD void gt_adamw8_element(float *p, float g_raw, float *m, float *v, const gt_adamw8_scalars *s) {
    float g = gt_adamw_grad(g_raw, &s->a);
    *m = gt_add(gt_mul(*m, s->beta1), gt_mul(s->a.beta1_weight, g));
    *v = gt_add(gt_mul(*v, s->a.beta2), gt_mul(gt_mul(s->a.one_minus_beta2, g), g));
    float param = gt_mul(*p, s->a.decay);
    float denom = gt_add(gt_div(gt_sqrt(*v), s->a.bc2_sqrt), s->a.eps);
    *p = gt_add(param, gt_div(gt_mul(s->a.neg_step_size, *m), denom));
}

/* A block's new absmax of values whose largest magnitude is amax, and what its elements are
 * scaled by (quant_hd.h): *inv (full block) or *divisor (short block). */
GT_HD float gt_adamw8_absmax(float amax, int partial, float *divisor, float *inv) {
    *divisor = gt_quant_divisor(amax);
    *inv = 1.0f / *divisor;
    return partial ? *divisor : amax;
}

/* The code of value x of a block scaled by inv / divisor. */
GT_HD uint8_t gt_adamw8_code(float x, float inv, float divisor, int partial, const float *bounds,
                             const uint8_t *order) {
    return gt_quant_encode(gt_quant_scale(x, inv, divisor, partial), bounds, order, 255);
}

/* |x| larger than amax (a comparison, so a NaN never becomes the absmax). */
GT_HD float gt_adamw8_amax(float amax, float x) {
    float a = x < 0.0f ? -x : x;
    return a > amax ? a : amax;
}

#endif
