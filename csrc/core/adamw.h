/* AdamW's element update, shared by the CPU loops (csrc/train/optim_cpu.c) and the CUDA
 * kernel (cuda/optim.cu), so both give the same bits.
 *
 * "exact" numerics reproduce PyTorch's CPU AdamW (foreach=False) operation by operation, with
 * scalars computed in float64 on the host and rounded to float32 once:
 *   p = p * f32(1 - lr*wd)
 *   m = lerp(m, g, f32(1 - beta1))                     (one FMA, as torch's vectorised lerp_)
 *   v = fma(f32(1 - beta2) * g, g, v * f32(beta2))     (torch's mul_, then addcmul_: one FMA)
 *   denom = sqrt(v) / f32(sqrt(1 - beta2^t)) + f32(eps)
 *   p = p + (f32(-lr / (1 - beta1^t)) * m) / denom     (torch's addcdiv_)
 * The square root is IEEE's (correctly rounded, the same on every backend). PyTorch's CPU
 * Tensor.sqrt goes through MKL's vsSqrt, which is within 1 ulp but not always correctly
 * rounded; that is the one place where the results can differ from PyTorch's (see
 * tests/test_optim_torch.py, which also checks bit equality with a correctly rounded sqrt).
 * "fast" numerics keep m and v identical but replace both divisions: the bias correction is a
 * multiplication by its float64 reciprocal fused with the eps addition, and 1/denom is a
 * Newton-Raphson reciprocal (gt_recip_newton) fused into the parameter update (DeepSpeed's
 * CPU-Adam style; a few ulps from exact, see tests/test_optim_numerics.py). */
#ifndef GT_ADAMW_H
#define GT_ADAMW_H

#include <stdint.h>

#include "core/fp_ops.h"

typedef enum gt_numerics {
    GT_NUMERICS_EXACT = 0,  /* PyTorch's CPU AdamW bits */
    GT_NUMERICS_FAST = 1,   /* reciprocals and FMAs, a few ulps from exact */
} gt_numerics;

/* The per-step float32 constants of one run of parameters with the same step count. */
typedef struct gt_adamw_scalars {
    float grad_coef;       /* multiplies every gradient element as it is read (1 = no-op) */
    float decay;           /* f32(1 - lr*weight_decay): decoupled weight decay factor */
    float beta1_weight;    /* f32(1 - beta1): lerp weight of the first moment */
    float beta2;           /* f32(beta2): decay of the second moment */
    float one_minus_beta2; /* f32(1 - beta2): weight of g*g in the second moment */
    float bc2_sqrt;        /* f32(sqrt(1 - beta2^t)): exact numerics divide by it */
    float inv_bc2_sqrt;    /* f32(1 / sqrt(1 - beta2^t)): fast numerics multiply by it */
    float eps;             /* f32(eps) */
    float neg_step_size;   /* f32(-lr / (1 - beta1^t)) */
    int maximize;          /* 1: ascend the objective (gradient negated) */
    int amsgrad;           /* 1: normalise by the running maximum of v */
} gt_adamw_scalars;

/* The constants for update number `step` (>= 1), as torch computes them in Python floats. */
static inline gt_adamw_scalars gt_adamw_scalars_make(double lr, double beta1, double beta2,
                                                     double eps, double weight_decay,
                                                     int64_t step, float grad_coef,
                                                     int maximize, int amsgrad) {
    double bias_correction1 = 1.0 - pow(beta1, (double)step);
    double bias_correction2 = 1.0 - pow(beta2, (double)step);
    double bc2_sqrt = pow(bias_correction2, 0.5);
    gt_adamw_scalars s;
    s.grad_coef = grad_coef;
    s.decay = (float)(1.0 - lr * weight_decay);
    s.beta1_weight = (float)(1.0 - beta1);
    s.beta2 = (float)beta2;
    s.one_minus_beta2 = (float)(1.0 - beta2);
    s.bc2_sqrt = (float)bc2_sqrt;
    s.inv_bc2_sqrt = (float)(1.0 / bc2_sqrt);
    s.eps = (float)eps;
    s.neg_step_size = (float)(-(lr / bias_correction1));
    s.maximize = maximize;
    s.amsgrad = amsgrad;
    return s;
}

/* The gradient as the update reads it: scaled by grad_coef, negated when maximizing. */
GT_HD float gt_adamw_grad(float g, const gt_adamw_scalars *s) {
    float scaled = gt_mul(g, s->grad_coef);
    return s->maximize ? -scaled : scaled;
}

/* Updates the moments in place and returns the second moment the denominator uses. */
GT_HD float gt_adamw_moments(float g, float *m, float *v, float *v_max, const gt_adamw_scalars *s) {
    *m = gt_lerp(*m, g, s->beta1_weight);
    *v = gt_fma(gt_mul(s->one_minus_beta2, g), g, gt_mul(*v, s->beta2));
    if (!s->amsgrad)
        return *v;
    *v_max = gt_max_nan(*v_max, *v);
    return *v_max;
}

/* One element of the exact update. v_max is read only when s->amsgrad. */
GT_HD void gt_adamw_exact(float *p, float g_raw, float *m, float *v, float *v_max,
                          const gt_adamw_scalars *s) {
    float g = gt_adamw_grad(g_raw, s);
    float param = gt_mul(*p, s->decay);
    float v_used = gt_adamw_moments(g, m, v, v_max, s);
    float denom = gt_add(gt_div(gt_sqrt(v_used), s->bc2_sqrt), s->eps);
    *p = gt_add(param, gt_div(gt_mul(s->neg_step_size, *m), denom));
}

/* One element of the fast update (same moments, no divisions in the common range). */
GT_HD void gt_adamw_fast(float *p, float g_raw, float *m, float *v, float *v_max,
                         const gt_adamw_scalars *s) {
    float g = gt_adamw_grad(g_raw, s);
    float param = gt_mul(*p, s->decay);
    float v_used = gt_adamw_moments(g, m, v, v_max, s);
    float denom = gt_fma(gt_sqrt(v_used), s->inv_bc2_sqrt, s->eps);
    *p = gt_fma(gt_mul(s->neg_step_size, *m), gt_recip_newton(denom), param);
}

#endif
