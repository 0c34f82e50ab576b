/* Branch-free f32 exp, normal CDF and tanh for the activation math (core/activation.h), shared
 * by the CPU backend and the CUDA kernels. libm's expf/erfcf/tanhf are calls the compiler cannot
 * vectorise; these are straight-line sequences of + - * /, compares, bit selects and integer
 * operations on the float's IEEE bits, so the CPU loops vectorise inside the SSE, AVX2 and
 * AVX-512 clones of ops/cpu_kernels.h. Every operation is a single correctly rounded IEEE
 * operation (the build uses -ffp-contract=off, nvcc --fmad=false, no fmaf), so the scalar, AVX2,
 * AVX-512 and CUDA paths give the same bits.
 *
 * Accuracy, measured against float64 at every multiple of 1e-6 in [-20, 20] (the activations
 * built on these are checked in tests/test_activation_accuracy.py): gt_vm_expf 1 ulp,
 * gt_vm_scaled_exp_neg_half_sq 1.2 ulp, gt_vm_tanhf 1.6 ulp, gt_vm_normal_cdf 5 ulp (an ulp of a
 * subnormal result being 2^-149). Special values follow libm: exp(-inf) = 0, exp(+inf) = +inf,
 * Phi(-inf) = 0, Phi(+inf) = 1, tanh(+-inf) = +-1, tanh(-0) = -0, NaN in gives NaN out. */
#ifndef GT_VMATH_H
#define GT_VMATH_H

#include <stdint.h>

#include "core/half.h"
#include "core/hd.h"

/* Inlined into the callers' target clones even where they are long (they must be, to vectorise). */
#if defined(__CUDACC__)
#define GT_VM GT_HD
#else
#define GT_VM GT_HD __attribute__((always_inline))
#endif

#define GT_VM_LOG2E_F 1.44269502f    /* 1 / ln 2 */
#define GT_VM_LN2_HI_F 0.693359375f           /* ln 2 to 9 bits: n * GT_VM_LN2_HI_F is exact */
#define GT_VM_LN2_LO_F -2.12194440e-4f        /* ln 2 - GT_VM_LN2_HI_F */
#define GT_VM_ROUND_SHIFT_F 12582912.0f       /* 1.5 * 2^23: x + it rounds x to an integer */
#define GT_VM_EXP_MAX_F 89.0f                 /* exp overflows above 88.73 */
#define GT_VM_EXP_MIN_F -120.0f               /* exp rounds to 0 below -103.98 */
#define GT_VM_NORMAL_MAX_F 15.0f              /* exp(-15^2 / 2) = 1.4e-49 rounds to 0 */

/* take_a ? a : b on the bits, with no branch. Without -fno-trapping-math GCC keeps some float
 * ?: as branches (a clamp followed by another, or arms holding a division), and a branch in the
 * loop stops the SSE and AVX2 clones from vectorising (AVX-512 masks them). */
GT_VM float gt_vm_select(int take_a, float a, float b) {
    uint32_t mask = 0u - (uint32_t)(take_a != 0);
    return gt_bits_f32((gt_f32_bits(a) & mask) | (gt_f32_bits(b) & ~mask));
}

/* m * exp(hi + lo) for hi + lo in [-170, 89] (or NaN), where lo may carry bits that hi + lo
 * would round away and m is a finite scale factor. Range reduction: n = round((hi + lo) / ln 2)
 * with the 1.5 * 2^23 rounding trick, r = (hi - n ln2_hi) + lo - n ln2_lo in [-0.35, 0.35]
 * (Cody-Waite: n ln2_hi is exact and hi - n ln2_hi nearly so). exp(r) = 1 + r + r^2 P(r), P of
 * degree 5 (Cephes expf's minimax coefficients; with the roundings, gt_vm_expf is within 1 ulp).
 * m exp(r) is scaled by 2^n as 2^n1 * 2^n2 with n1 + n2 = n, both normal powers of two, so a
 * result in the subnormals is rounded once and one above FLT_MAX becomes +-inf. The integer work
 * is unsigned on the float's bits, so a NaN argument (which gives NaN) is well defined. */
GT_VM float gt_vm_scaled_exp(float m, float hi, float lo) {
    float shifted = (hi + lo) * GT_VM_LOG2E_F + GT_VM_ROUND_SHIFT_F;
    float n = shifted - GT_VM_ROUND_SHIFT_F;
    float r = ((hi - n * GT_VM_LN2_HI_F) + lo) - n * GT_VM_LN2_LO_F;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    uint32_t biased = gt_f32_bits(shifted) - gt_f32_bits(GT_VM_ROUND_SHIFT_F) + 254u;  /* n + 254 */
    uint32_t e1 = (biased >> 1) & 0xffu, e2 = (biased - (biased >> 1)) & 0xffu;
    return ((m * p) * gt_bits_f32(e1 << 23)) * gt_bits_f32(e2 << 23);
}

/* exp(x) for any f32 x: x is clamped into gt_vm_scaled_exp's range (the clamps keep NaN). */
GT_VM float gt_vm_expf(float x) {
    x = gt_vm_select(x > GT_VM_EXP_MAX_F, GT_VM_EXP_MAX_F, x);
    x = gt_vm_select(x < GT_VM_EXP_MIN_F, GT_VM_EXP_MIN_F, x);
    return gt_vm_scaled_exp(1.0f, x, 0.0f);
}

/* m * exp(-x^2 / 2) with the relative accuracy of exp even where x^2 / 2 is large: x^2 rounded
 * to f32 would be off by up to 2^-24 x^2 in the exponent (e.g. 4 ulp of the result at x = 4),
 * so |x| = xh + xl with xh its top 12 bits: -xh^2 / 2 is exact and -(|x| - xh)(|x| + xh) / 2
 * goes in as the low part. |x| is clamped at GT_VM_NORMAL_MAX_F, where the result is 0. */
GT_VM float gt_vm_scaled_exp_neg_half_sq(float m, float x) {
    float a = gt_bits_f32(gt_f32_bits(x) & 0x7fffffffu);
    a = gt_vm_select(a > GT_VM_NORMAL_MAX_F, GT_VM_NORMAL_MAX_F, a);
    float ah = gt_bits_f32(gt_f32_bits(a) & 0xfffff000u);
    return gt_vm_scaled_exp(m, -0.5f * (ah * ah), -0.5f * ((a - ah) * (a + ah)));
}

/* The standard normal CDF Phi(x), with relative accuracy in the left tail (1 - Phi would
 * cancel there), down to the subnormals. |x| < 0.75: Phi(x) = 1/2 + x S(x^2), S of degree 4 (a
 * relative-error least-squares fit, fit error 2.5e-9). Otherwise, for a = |x|:
 * Phi(-a) = exp(-a^2 / 2) R(a), where R(a) = Phi(-a) exp(a^2 / 2) (half the scaled complementary
 * error function at a / sqrt 2: smooth, from 0.5 down to ~1 / (a sqrt(2 pi))) is fitted as
 * t P(t) in t = 1 / (1 + a / 2), P of degree 10 (a relative-error least-squares fit on
 * a in [0.75, 15], fit error 4.5e-10). exp(-a^2 / 2) comes from gt_vm_scaled_exp_neg_half_sq
 * with t P(t) as its scale, so a subnormal Phi(-a) is rounded once. a is clamped at
 * GT_VM_NORMAL_MAX_F, where Phi(-a) rounds to 0. Phi(a) = 1 - Phi(-a). */
GT_VM float gt_vm_normal_cdf(float x) {
    float x2 = x * x;
    float s = 1.0294636e-04f;
    s = s * x2 - 1.1812910e-03f;
    s = s * x2 + 9.9723507e-03f;
    s = s * x2 - 6.6490293e-02f;
    s = s * x2 + 3.9894229e-01f;
    float central = 0.5f + x * s;
    float a = gt_bits_f32(gt_f32_bits(x) & 0x7fffffffu);
    a = gt_vm_select(a > GT_VM_NORMAL_MAX_F, GT_VM_NORMAL_MAX_F, a);
    float t = 1.0f / (1.0f + 0.5f * a);
    float p = -0.15918313f;
    p = p * t + 0.743219674f;
    p = p * t - 1.43619478f;
    p = p * t + 1.39453781f;
    p = p * t - 0.604979336f;
    p = p * t + 0.0552213527f;
    p = p * t - 0.0949872881f;
    p = p * t + 0.0540449843f;
    p = p * t + 0.149270207f;
    p = p * t + 0.199485928f;
    p = p * t + 0.199470863f;
    float left = gt_vm_scaled_exp_neg_half_sq(t * p, x);  /* Phi(-|x|) */
    float tail = gt_vm_select(x < 0.0f, left, 1.0f - left);
    return gt_vm_select((x < 0.75f) & (x > -0.75f), central, tail);
}

/* tanh(x), computed for a = |x| and given x's sign bit (so tanh(-0) = -0). a < 0.625:
 * a + a^3 P(a^2), P of degree 4 (Cephes tanhf's minimax coefficients). Otherwise
 * (1 - e) / (1 + e) with e = exp(-2a) <= 0.29, so 1 - e does not cancel; large a gives e = 0
 * and exactly 1. */
GT_VM float gt_vm_tanhf(float x) {
    uint32_t sign = gt_f32_bits(x) & 0x80000000u;
    float a = gt_bits_f32(gt_f32_bits(x) & 0x7fffffffu);
    float a2 = a * a;
    float p = -5.70498872745e-3f;
    p = p * a2 + 2.06390887954e-2f;
    p = p * a2 - 5.37397155531e-2f;
    p = p * a2 + 1.33314422036e-1f;
    p = p * a2 - 3.33332819422e-1f;
    float small = p * a2 * a + a;
    float e = gt_vm_expf(-2.0f * a);
    float large = (1.0f - e) / (1.0f + e);
    float magnitude = gt_vm_select(a < 0.625f, small, large);
    return gt_bits_f32(gt_f32_bits(magnitude) | sign);
}

#endif
