/* fp32 <-> fp16 and fp32 <-> bf16 conversions shared by the CPU backend and CUDA kernels
 * (DESIGN.md principle 3). Pure integer arithmetic on the bit patterns, so the result never
 * depends on the FPU's rounding mode, flush-to-zero or denormals-are-zero settings.
 *
 * fp16: round to nearest, ties to even; overflow (|x| >= 65520) gives +-inf; subnormals are
 * rounded, not flushed. NaNs follow NumPy's npy_floatbits_to_halfbits bit for bit: the sign and
 * the top 10 payload bits are kept (a signalling NaN stays signalling), and a payload that would
 * vanish becomes 1, so the result is still a NaN. Bit-identical to np.float32.astype(np.float16)
 * for all 2^32 inputs (tests/test_half.py).
 * bf16: round to nearest, ties to even; every NaN becomes the quiet NaN 0x7fc0 with its sign,
 * as ml_dtypes.bfloat16 does.
 * Widening (fp16/bf16 -> fp32) is exact and keeps NaN payloads. */
#ifndef GT_HALF_H
#define GT_HALF_H

#include <stdint.h>

#include "core/hd.h"

/* The IEEE-754 bits of a float, and back (no memcpy: this runs in device code too). */
GT_HD uint32_t gt_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    union { float f; uint32_t u; } pun;
    pun.f = f;
    return pun.u;
#endif
}

GT_HD float gt_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    union { uint32_t u; float f; } pun;
    pun.u = u;
    return pun.f;
#endif
}

/* fp32 magnitude bits (sign cleared) that land in the fp16 subnormal range [2^-25, 2^-14):
 * the significand with its implicit bit is shifted to units of 2^-24 and rounded half to even. */
GT_HD uint16_t gt_f16_subnormal_bits(uint32_t magnitude) {
    uint32_t significand = (magnitude & 0x007fffffu) | 0x00800000u;
    uint32_t shift = 126u - (magnitude >> 23);           /* 14..24 */
    uint32_t kept = significand >> shift;
    uint32_t dropped = significand & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (dropped > halfway || (dropped == halfway && (kept & 1u)))
        kept += 1u;                                       /* may carry into the smallest normal */
    return (uint16_t)kept;
}

GT_HD uint16_t gt_f32_to_f16(float f) {
    uint32_t bits = gt_f32_bits(f);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) {                       /* inf or NaN */
        if (magnitude == 0x7f800000u)
            return (uint16_t)(sign | 0x7c00u);
        uint16_t nan = (uint16_t)(0x7c00u | ((magnitude & 0x007fffffu) >> 13));
        return (uint16_t)(sign | (nan == 0x7c00u ? 0x7c01u : nan));
    }
    if (magnitude >= 0x477ff000u)                         /* >= 65520 rounds past 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {                       /* normal fp16: >= 2^-14 */
        uint32_t odd = (magnitude >> 13) & 1u;
        uint32_t rounded = magnitude + 0x00000fffu + odd; /* ties to even; carries into exponent */
        return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
    }
    if (magnitude < 0x33000000u)                          /* < 2^-25: rounds to zero */
        return sign;
    return (uint16_t)(sign | gt_f16_subnormal_bits(magnitude));
}

GT_HD float gt_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exponent = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mantissa = (uint32_t)h & 0x03ffu;
    if (exponent == 0x1fu)                                /* inf or NaN, payload kept */
        return gt_bits_f32(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0u)                                   /* normal: rebias 15 -> 127 */
        return gt_bits_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    /* zero or subnormal: mantissa * 2^-24, exact in fp32 (a normal number or zero) */
    float magnitude = (float)mantissa * 5.9604644775390625e-8f;
    return gt_bits_f32(sign | gt_f32_bits(magnitude));
}

GT_HD uint16_t gt_f32_to_bf16(float f) {
    uint32_t bits = gt_f32_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u)               /* NaN: quiet, sign kept */
        return (uint16_t)(((bits >> 16) & 0x8000u) | 0x7fc0u);
    uint32_t odd = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7fffu + odd) >> 16);      /* ties to even; overflow gives inf */
}

GT_HD float gt_bf16_to_f32(uint16_t h) { return gt_bits_f32((uint32_t)h << 16); }

/* x rounded to the nearest fp16 / bf16 value, as an fp32 (mixed-precision storage). */
GT_HD float gt_round_to_f16(float f) { return gt_f16_to_f32(gt_f32_to_f16(f)); }

GT_HD float gt_round_to_bf16(float f) { return gt_bf16_to_f32(gt_f32_to_bf16(f)); }

#endif
