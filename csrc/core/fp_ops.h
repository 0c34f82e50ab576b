/* Correctly rounded float32 arithmetic spelled out for the element math shared by the C and
 * CUDA backends. In C the build has -ffp-contract=off, so plain operators are single IEEE
 * operations; under nvcc the __f*_rn intrinsics say the same explicitly (and stay exact
 * whatever --fmad or --use_fast_math say). Contraction happens only where gt_fma is written. */
#ifndef GT_FP_OPS_H
#define GT_FP_OPS_H

#include "core/hd.h"

#if defined(__CUDA_ARCH__)
GT_HD float gt_add(float a, float b) { return __fadd_rn(a, b); }
GT_HD float gt_sub(float a, float b) { return __fsub_rn(a, b); }
GT_HD float gt_mul(float a, float b) { return __fmul_rn(a, b); }
GT_HD float gt_div(float a, float b) { return __fdiv_rn(a, b); }
GT_HD float gt_sqrt(float a) { return __fsqrt_rn(a); }
GT_HD float gt_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
GT_HD float gt_bits_to_float(unsigned int bits) { return __uint_as_float(bits); }
GT_HD unsigned int gt_float_to_bits(float x) { return __float_as_uint(x); }
#else
#include <math.h>
#include <string.h>
GT_HD float gt_add(float a, float b) { return a + b; }
GT_HD float gt_sub(float a, float b) { return a - b; }
GT_HD float gt_mul(float a, float b) { return a * b; }
GT_HD float gt_div(float a, float b) { return a / b; }
GT_HD float gt_sqrt(float a) { return sqrtf(a); }
GT_HD float gt_fma(float a, float b, float c) { return fmaf(a, b, c); }
GT_HD float gt_bits_to_float(unsigned int bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}
GT_HD unsigned int gt_float_to_bits(float x) {
    unsigned int bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}
#endif

/* torch.maximum: the larger value, NaN when either is NaN (the second operand on ties). */
GT_HD float gt_max_nan(float a, float b) {
    if (a != a || b != b)
        return gt_add(a, b);
    return a > b ? a : b;
}

/* torch.lerp(start, end, weight) as PyTorch's vectorised CPU kernel computes it:
 * one fused multiply-add, anchored at `start` for |weight| < 0.5 and at `end` otherwise. */
GT_HD float gt_lerp(float start, float end, float weight) {
    float diff = gt_sub(end, start);
    if (fabsf(weight) < 0.5f)
        return gt_fma(weight, diff, start);
    return gt_fma(gt_sub(weight, 1.0f), diff, end);
}

/* 1/x by a bit-level first guess and three Newton-Raphson steps with FMAs: within one ulp of
 * the rounded quotient, no division, and the same bits on every backend. Outside
 * [2^-125, 2^125] (and for NaN) the guess is unusable and a division is used instead. */
#define GT_RECIP_MAGIC 0x7EF311C3u
GT_HD float gt_recip_newton(float x) {
    if (!(x >= 0x1p-125f && x <= 0x1p125f))
        return gt_div(1.0f, x);
    float y = gt_bits_to_float(GT_RECIP_MAGIC - gt_float_to_bits(x));
    for (int i = 0; i < 3; i++) {
        float e = gt_fma(-x, y, 1.0f);
        y = gt_fma(y, e, y);
    }
    return y;
}

#endif
