/* AVX-512 and AVX2 + F16C conversion kernels (declared in core/cast_kernels.h): loops over the
 * vector narrowing of core/cast_x86.h and its widening counterparts (exact, NaN payloads kept).
 * Tails shorter than a vector go through the scalar functions of core/half.h. Empty off x86-64
 * (core/simd.h). */
#include "core/simd.h"

#if GT_SIMD_X86
#include <stdint.h>

#include "core/cast_kernels.h"
#include "core/cast_x86.h"
#include "core/half.h"

/* ---- AVX-512: 16 lanes ---- */

GT_AVX512 void gt_cast_f32_to_f16_avx512(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), gt_narrow_f16_avx512(_mm512_loadu_ps(in + i)));
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
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), gt_narrow_bf16_avx512(_mm512_loadu_ps(in + i)));
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

GT_AVX2 void gt_cast_f32_to_f16_avx2(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), gt_narrow_f16_avx2(_mm256_loadu_ps(in + i)));
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
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), gt_narrow_bf16_avx2(_mm256_loadu_ps(in + i)));
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
