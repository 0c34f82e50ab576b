/* Element math of the activation functions and their derivatives, shared by the CPU backend
 * and the CUDA kernels (DESIGN.md principle 3). All in f32, with erff/tanhf/expf from the
 * platform's math library (glibc on the CPU, CUDA's libdevice on the GPU), so the two backends
 * agree to a few ulp. Semantics follow PyTorch: relu(NaN) = NaN, relu'(0) = 0,
 * GELU "none" is x * Phi(x) with the exact erf, GELU "tanh" its tanh approximation. */
#ifndef GT_ACTIVATION_H
#define GT_ACTIVATION_H

#include <math.h>

#include "core/hd.h"

#define GT_SQRT1_2_F 0.70710678118654752440f    /* 1 / sqrt(2) */
#define GT_INV_SQRT_2PI_F 0.39894228040143267794f  /* 1 / sqrt(2 pi) */
#define GT_SQRT_2_OVER_PI_F 0.79788456080286535588f  /* sqrt(2 / pi) */
#define GT_GELU_TANH_COEF_F 0.044715f             /* the cubic term of the tanh approximation */

/* max(x, 0), keeping NaN. */
GT_HD float gt_relu(float x) { return x <= 0.0f ? 0.0f : x; }

/* dout * relu'(x): dout where x > 0, else 0. */
GT_HD float gt_relu_backward(float dout, float x) { return x > 0.0f ? dout : 0.0f; }

/* x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). */
GT_HD float gt_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * GT_SQRT1_2_F)); }

/* dout * (Phi(x) + x phi(x)) with phi(x) = exp(-x^2 / 2) / sqrt(2 pi). */
GT_HD float gt_gelu_erf_backward(float dout, float x) {
    float cdf = 0.5f * (1.0f + erff(x * GT_SQRT1_2_F));
    float pdf = expf(-0.5f * x * x) * GT_INV_SQRT_2PI_F;
    return dout * (cdf + x * pdf);
}

/* 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3). */
GT_HD float gt_gelu_tanh(float x) {
    float u = GT_SQRT_2_OVER_PI_F * (x + GT_GELU_TANH_COEF_F * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

/* dout * (0.5 (1 + t) + 0.5 x (1 - t^2) du/dx) with t = tanh(u), du/dx = sqrt(2/pi)(1 + 3c x^2). */
GT_HD float gt_gelu_tanh_backward(float dout, float x) {
    float x2 = x * x;
    float t = tanhf(GT_SQRT_2_OVER_PI_F * (x + GT_GELU_TANH_COEF_F * x2 * x));
    float du = GT_SQRT_2_OVER_PI_F * (1.0f + 3.0f * GT_GELU_TANH_COEF_F * x2);
    return dout * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

GT_HD float gt_tanh_act(float x) { return tanhf(x); }

/* dout * (1 - tanh(x)^2). */
GT_HD float gt_tanh_backward(float dout, float x) {
    float t = tanhf(x);
    return dout * (1.0f - t * t);
}

/* x * sigmoid(x) = x / (1 + exp(-x)). */
GT_HD float gt_silu(float x) { return x / (1.0f + expf(-x)); }

/* dout * s (1 + x (1 - s)) with s = sigmoid(x). */
GT_HD float gt_silu_backward(float dout, float x) {
    float s = 1.0f / (1.0f + expf(-x));
    return dout * (s * (1.0f + x * (1.0f - s)));
}

#endif
