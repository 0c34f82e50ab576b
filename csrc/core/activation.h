/* Element math of the activation functions and their derivatives, shared by the CPU backend
 * and the CUDA kernels (DESIGN.md principle 3). All in f32, with the branch-free exp, normal CDF
 * and tanh of core/vmath.h (not libm's, which neither vectorise nor match between glibc and
 * CUDA), so every SIMD level and the GPU give the same bits. Semantics follow PyTorch:
 * relu(NaN) = NaN, relu'(0) = 0, GELU "none" is x * Phi(x) with the exact erf, GELU "tanh" its
 * tanh approximation. The formulas are rearranged where PyTorch's cancel (1 + erf, 1 + tanh
 * and 1 - sigmoid for large |x|), so every result keeps f32 relative accuracy, which
 * half-precision outputs near 0 need. Always inlined (GT_VM), as vmath's functions: in a loop
 * over several activations GCC's inlining budget otherwise left one of them out of line in
 * some loop (the GLU backward's SiLU, or its tanh GELU), and that loop stayed scalar. */
#ifndef GT_ACTIVATION_H
#define GT_ACTIVATION_H

#include <math.h>

#include "core/hd.h"
#include "core/vmath.h"

#define GT_INV_SQRT_2PI_F 0.39894228040143267794f  /* 1 / sqrt(2 pi) */
#define GT_SQRT_2_OVER_PI_F 0.79788456080286535588f  /* sqrt(2 / pi) */
#define GT_GELU_TANH_COEF_F 0.044715f             /* the cubic term of the tanh approximation */

/* max(x, 0), keeping NaN. */
GT_VM float gt_relu(float x) { return x <= 0.0f ? 0.0f : x; }

/* dout * relu'(x): dout where x > 0, else 0. */
GT_VM float gt_relu_backward(float dout, float x) { return x > 0.0f ? dout : 0.0f; }

/* sigmoid(z) and 1 - sigmoid(z) without cancellation or overflow: e = exp(-|z|) <= 1, and
 * 1 / (1 + e), e / (1 + e) are assigned to s and 1 - s by the sign of z. */
GT_VM void gt_sigmoid_pair(float z, float *s, float *one_minus_s) {
    float e = gt_vm_expf(-fabsf(z));
    float big = 1.0f / (1.0f + e), small = e / (1.0f + e);
    *s = gt_vm_select(z >= 0.0f, big, small);
    *one_minus_s = gt_vm_select(z >= 0.0f, small, big);
}

/* x * Phi(x), with Phi accurate to the last bits in the left tail, where 1 + erf(x / sqrt 2)
 * would cancel. */
GT_VM float gt_gelu_erf(float x) { return x * gt_vm_normal_cdf(x); }

/* dout * (Phi(x) + x phi(x)) with phi(x) = exp(-x^2 / 2) / sqrt(2 pi). */
GT_VM float gt_gelu_erf_backward(float dout, float x) {
    float cdf = gt_vm_normal_cdf(x);
    float pdf = gt_vm_scaled_exp_neg_half_sq(GT_INV_SQRT_2PI_F, x);
    return dout * (cdf + x * pdf);
}

/* u = sqrt(2/pi) (x + 0.044715 x^3), the argument of the tanh approximation. */
GT_VM float gt_gelu_tanh_arg(float x) {
    return GT_SQRT_2_OVER_PI_F * (x + GT_GELU_TANH_COEF_F * x * x * x);
}

/* 0.5 x (1 + tanh(u)) = x sigmoid(2u): the same function, evaluated without the cancellation
 * of 1 + tanh(u) for u << 0. */
GT_VM float gt_gelu_tanh(float x) {
    float s, one_minus_s;
    gt_sigmoid_pair(2.0f * gt_gelu_tanh_arg(x), &s, &one_minus_s);
    return x * s;
}

/* dout * (0.5 (1 + t) + 0.5 x (1 - t^2) du/dx) with t = tanh(u), du/dx = sqrt(2/pi)(1 + 3c x^2);
 * with s = sigmoid(2u): 0.5 (1 + t) = s and 0.5 (1 - t^2) = 2 s (1 - s). */
GT_VM float gt_gelu_tanh_backward(float dout, float x) {
    float s, one_minus_s;
    gt_sigmoid_pair(2.0f * gt_gelu_tanh_arg(x), &s, &one_minus_s);
    float du = GT_SQRT_2_OVER_PI_F * (1.0f + 3.0f * GT_GELU_TANH_COEF_F * x * x);
    return dout * (s + 2.0f * x * (s * one_minus_s) * du);
}

GT_VM float gt_tanh_act(float x) { return gt_vm_tanhf(x); }

/* dout * (1 - tanh(x)^2). */
GT_VM float gt_tanh_backward(float dout, float x) {
    float t = gt_vm_tanhf(x);
    return dout * (1.0f - t * t);
}

/* x * sigmoid(x). */
GT_VM float gt_silu(float x) {
    float s, one_minus_s;
    gt_sigmoid_pair(x, &s, &one_minus_s);
    return x * s;
}

/* dout * s (1 + x (1 - s)) with s = sigmoid(x). */
GT_VM float gt_silu_backward(float dout, float x) {
    float s, one_minus_s;
    gt_sigmoid_pair(x, &s, &one_minus_s);
    return dout * (s * (1.0f + x * one_minus_s));
}

#endif
