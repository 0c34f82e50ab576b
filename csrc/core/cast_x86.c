/* AVX-512 and AVX2 + F16C conversion kernels (declared in core/cast_kernels.h).
 * Hardware f16 conversion rounds like core/half.h but quiets signalling NaNs, so NaN lanes are
 * recomputed with NumPy's rule; bf16 uses integer round-to-nearest-even on the bit patterns.
 * Tails shorter than a vector go through the scalar functions of core/half.h. Empty off
 * x86-64 (core/simd.h). */
#include "core/simd.h"

#if GT_SIMD_X86
#include <immintrin.h>
#include <stdint.h>

#include "core/cast_kernels.h"
#include "core/half.h"

#define GT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define GT_AVX2 __attribute__((target("avx2,fma,f16c")))

/* ---- AVX-512: 16 lanes ---- */

/* f16 bits NumPy gives for NaN f32 lanes `bits`: sign | 0x7c00 | top 10 payload bits, or 1. */
GT_AVX512 static __m256i f16_nan_bits_avx512(__m512i bits) {
    __m512i payload = _mm512_and_si512(_mm512_srli_epi32(bits, 13), _mm512_set1_epi32(0x3ff));
    __mmask16 empty = _mm512_cmpeq_epi32_mask(payload, _mm512_setzero_si512());
    payload = _mm512_mask_mov_epi32(payload, empty, _mm512_set1_epi32(1));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000));
    __m512i nan = _mm512_or_si512(_mm512_or_si512(sign, payload), _mm512_set1_epi32(0x7c00));
    return _mm512_cvtepi32_epi16(nan);
}

GT_AVX512 void gt_cast_f32_to_f16_avx512(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(in + i);
        __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i bits = _mm512_castps_si512(x);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs_mask), inf);
        if (nan)
            h = _mm256_mask_blend_epi16(nan, h, f16_nan_bits_avx512(bits));
        _mm256_storeu_si256((__m256i *)(out + i), h);
    }
    for (; i < n; i++)
        out[i] = gt_f32_to_f16(in[i]);
}

GT_AVX512 void gt_cast_f16_to_f32_avx512(const void *src, void *dst, size_t n) {
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(in + i));
        __m512 x = _mm512_cvtph_ps(h);
        __m512i wide = _mm512_cvtepu16_epi32(h);
        __m512i magnitude = _mm512_and_si512(wide, _mm512_set1_epi32(0x7fff));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7c00));
        if (nan) {  /* keep signalling NaNs signalling: sign | 0x7f800000 | payload << 13 */
            __m512i sign = _mm512_slli_epi32(_mm512_and_si512(wide, _mm512_set1_epi32(0x8000)), 16);
            __m512i body = _mm512_add_epi32(_mm512_slli_epi32(magnitude, 13), _mm512_set1_epi32(0x70000000));
            x = _mm512_mask_mov_ps(x, nan, _mm512_castsi512_ps(_mm512_or_si512(sign, body)));
        }
        _mm512_storeu_ps(out + i, x);
    }
    for (; i < n; i++)
        out[i] = gt_f16_to_f32(in[i]);
}

GT_AVX512 void gt_cast_f32_to_bf16_avx512(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i bits = _mm512_loadu_si512((const void *)(in + i));
        __m512i high = _mm512_srli_epi32(bits, 16);
        __m512i odd = _mm512_and_si512(high, one);
        __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, bias), odd), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs_mask), inf);
        __m512i quiet = _mm512_or_si512(_mm512_and_si512(high, _mm512_set1_epi32(0x8000)),
                                        _mm512_set1_epi32(0x7fc0));
        rounded = _mm512_mask_mov_epi32(rounded, nan, quiet);
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(rounded));
    }
    for (; i < n; i++)
        out[i] = gt_f32_to_bf16(in[i]);
}

GT_AVX512 void gt_cast_bf16_to_f32_avx512(const void *src, void *dst, size_t n) {
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(in + i)));
        _mm512_storeu_si512((void *)(out + i), _mm512_slli_epi32(wide, 16));
    }
    for (; i < n; i++)
        out[i] = gt_bf16_to_f32(in[i]);
}

/* ---- AVX2 + F16C: 8 lanes ---- */

/* Packs eight 32-bit lanes holding values in 0..0xffff into eight uint16 (in order). */
GT_AVX2 static __m128i narrow_u16_avx2(__m256i lanes) {
    return _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
}

/* 0xffffffff where the f32 lane `bits` is a NaN. */
GT_AVX2 static __m256i nan_lanes_avx2(__m256i bits) {
    __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    return _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
}

GT_AVX2 static __m128i f16_nan_bits_avx2(__m256i bits) {
    __m256i payload = _mm256_and_si256(_mm256_srli_epi32(bits, 13), _mm256_set1_epi32(0x3ff));
    __m256i empty = _mm256_cmpeq_epi32(payload, _mm256_setzero_si256());
    payload = _mm256_or_si256(payload, _mm256_and_si256(empty, _mm256_set1_epi32(1)));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000));
    __m256i nan = _mm256_or_si256(_mm256_or_si256(sign, payload), _mm256_set1_epi32(0x7c00));
    return narrow_u16_avx2(nan);
}

GT_AVX2 void gt_cast_f32_to_f16_avx2(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(in + i);
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i bits = _mm256_castps_si256(x);
        __m256i nan = nan_lanes_avx2(bits);
        if (!_mm256_testz_si256(nan, nan)) {
            __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
            h = _mm_blendv_epi8(h, f16_nan_bits_avx2(bits), nan16);
        }
        _mm_storeu_si128((__m128i *)(out + i), h);
    }
    for (; i < n; i++)
        out[i] = gt_f32_to_f16(in[i]);
}

GT_AVX2 void gt_cast_f16_to_f32_avx2(const void *src, void *dst, size_t n) {
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(in + i));
        __m256 x = _mm256_cvtph_ps(h);
        __m256i wide = _mm256_cvtepu16_epi32(h);
        __m256i magnitude = _mm256_and_si256(wide, _mm256_set1_epi32(0x7fff));
        __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7c00));
        if (!_mm256_testz_si256(nan, nan)) {  /* keep signalling NaNs signalling */
            __m256i sign = _mm256_slli_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x8000)), 16);
            __m256i body = _mm256_add_epi32(_mm256_slli_epi32(magnitude, 13), _mm256_set1_epi32(0x70000000));
            __m256 exact = _mm256_castsi256_ps(_mm256_or_si256(sign, body));
            x = _mm256_blendv_ps(x, exact, _mm256_castsi256_ps(nan));
        }
        _mm256_storeu_ps(out + i, x);
    }
    for (; i < n; i++)
        out[i] = gt_f16_to_f32(in[i]);
}

GT_AVX2 void gt_cast_f32_to_bf16_avx2(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(in + i));
        __m256i high = _mm256_srli_epi32(bits, 16);
        __m256i odd = _mm256_and_si256(high, one);
        __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, bias), odd), 16);
        __m256i quiet = _mm256_or_si256(_mm256_and_si256(high, _mm256_set1_epi32(0x8000)),
                                        _mm256_set1_epi32(0x7fc0));
        rounded = _mm256_blendv_epi8(rounded, quiet, nan_lanes_avx2(bits));
        _mm_storeu_si128((__m128i *)(out + i), narrow_u16_avx2(rounded));
    }
    for (; i < n; i++)
        out[i] = gt_f32_to_bf16(in[i]);
}

GT_AVX2 void gt_cast_bf16_to_f32_avx2(const void *src, void *dst, size_t n) {
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i)));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_slli_epi32(wide, 16));
    }
    for (; i < n; i++)
        out[i] = gt_bf16_to_f32(in[i]);
}

#endif
