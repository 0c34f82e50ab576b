/* AVX-512 and AVX2 dequantization of a block of codes (declared in ops/quant_kernels.h). 4-bit:
 * the block's 16 possible outputs sit in registers; the nibbles of each code byte become two
 * lane indices, the high one first, and a permute or byte shuffle reads the outputs. 8-bit: a
 * gather of code[] entries, scaled and narrowed. Empty off x86-64 (core/simd.h). */
#include "ops/quant_kernels.h"

#if GT_SIMD_X86
#include "core/cast_x86.h"

/* ---- AVX-512 ---- */

/* 16 code bytes as 16 lanes of 32 bits, each byte's high nibble and low nibble in hi and lo. */
GT_AVX512 static void nibbles_avx512(const uint8_t *bytes, __m512i *hi, __m512i *lo) {
    __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    *hi = _mm512_srli_epi32(wide, 4);
    *lo = _mm512_and_si512(wide, _mm512_set1_epi32(0x0F));
}

GT_AVX512 static size_t lookup_f32_avx512(float *out, const uint8_t *codes, __m512 outputs, size_t begin,
                                          size_t end) {
    /* lane j of the first 16 elements: hi[j / 2] or lo[j / 2] (index + 16 picks lo) */
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
    size_t i = begin;
    for (; i + 32 <= end; i += 32) {
        __m512i hi, lo;
        nibbles_avx512(codes + (i >> 1), &hi, &lo);
        _mm512_storeu_ps(out + i, _mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, first, lo), outputs));
        _mm512_storeu_ps(out + i + 16, _mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, second, lo), outputs));
    }
    return i;
}

GT_AVX512 static size_t lookup_u16_avx512(uint16_t *out, const uint8_t *codes, __m256i outputs, size_t begin,
                                          size_t end) {
    const __m512i entries = _mm512_zextsi256_si512(outputs);
    size_t i = begin;
    for (; i + 32 <= end; i += 32) {
        __m512i hi, lo;
        nibbles_avx512(codes + (i >> 1), &hi, &lo);
        /* 32-bit lane j holds the 16-bit indices of elements 2j (low half) and 2j + 1 */
        __m512i index = _mm512_or_si512(hi, _mm512_slli_epi32(lo, 16));
        _mm512_storeu_si512(out + i, _mm512_permutexvar_epi16(index, entries));
    }
    return i;
}

GT_AVX512 size_t gt_dequantize4_avx512(void *out, const uint8_t *codes, const float *code, float scale,
                                       size_t begin, size_t end, gt_dtype dt) {
    __m512 outputs = _mm512_mul_ps(_mm512_loadu_ps(code), _mm512_set1_ps(scale));
    if (dt == GT_F32)
        return lookup_f32_avx512(out, codes, outputs, begin, end);
    __m256i narrowed = dt == GT_BF16 ? gt_narrow_bf16_avx512(outputs) : gt_narrow_f16_avx512(outputs);
    return lookup_u16_avx512(out, codes, narrowed, begin, end);
}

GT_AVX512 size_t gt_dequantize8_avx512(void *out, const uint8_t *codes, const float *code, float scale,
                                       size_t begin, size_t end, gt_dtype dt) {
    const __m512 scales = _mm512_set1_ps(scale);
    size_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m512i index = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i)));
        __m512 values = _mm512_mul_ps(_mm512_i32gather_ps(index, code, 4), scales);
        if (dt == GT_F32)
            _mm512_storeu_ps((float *)out + i, values);
        else
            _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), dt == GT_BF16 ? gt_narrow_bf16_avx512(values)
                                                                                : gt_narrow_f16_avx512(values));
    }
    return i;
}

/* ---- AVX2 ---- */

/* The indices of 16 elements (8 code bytes) in element order: high nibble, low nibble, ... */
GT_AVX2 static __m128i indices16_avx2(const uint8_t *bytes) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    __m128i packed = _mm_loadl_epi64((const __m128i *)bytes);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), nibble), lo = _mm_and_si128(packed, nibble);
    return _mm_unpacklo_epi8(hi, lo);
}

/* outputs[index] for 8 lanes: index bit 3 chooses between the halves of the outputs. */
GT_AVX2 static __m256 lookup8_f32_avx2(__m256 low_half, __m256 high_half, __m256i index) {
    __m256 upper = _mm256_castsi256_ps(_mm256_slli_epi32(index, 28));  /* bit 3 in the sign bit */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(low_half, index), _mm256_permutevar8x32_ps(high_half, index),
                            upper);
}

GT_AVX2 static size_t lookup_f32_avx2(float *out, const uint8_t *codes, __m256 low_half, __m256 high_half,
                                      size_t begin, size_t end) {
    size_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m128i index = indices16_avx2(codes + (i >> 1));
        _mm256_storeu_ps(out + i, lookup8_f32_avx2(low_half, high_half, _mm256_cvtepu8_epi32(index)));
        _mm256_storeu_ps(out + i + 8,
                         lookup8_f32_avx2(low_half, high_half, _mm256_cvtepu8_epi32(_mm_srli_si128(index, 8))));
    }
    return i;
}

/* first8, last8: outputs 0-7 and 8-15 as 16-bit lanes; looked up as two 16-byte PSHUFB tables
 * (their low bytes and their high bytes). */
GT_AVX2 static size_t lookup_u16_avx2(uint16_t *out, const uint8_t *codes, __m128i first8, __m128i last8,
                                      size_t begin, size_t end) {
    const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i odd = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i low_bytes = _mm_unpacklo_epi64(_mm_shuffle_epi8(first8, even), _mm_shuffle_epi8(last8, even));
    const __m128i high_bytes = _mm_unpacklo_epi64(_mm_shuffle_epi8(first8, odd), _mm_shuffle_epi8(last8, odd));
    size_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m128i index = indices16_avx2(codes + (i >> 1));
        __m128i low = _mm_shuffle_epi8(low_bytes, index), high = _mm_shuffle_epi8(high_bytes, index);
        _mm_storeu_si128((__m128i *)(out + i), _mm_unpacklo_epi8(low, high));
        _mm_storeu_si128((__m128i *)(out + i + 8), _mm_unpackhi_epi8(low, high));
    }
    return i;
}

GT_AVX2 size_t gt_dequantize4_avx2(void *out, const uint8_t *codes, const float *code, float scale, size_t begin,
                                   size_t end, gt_dtype dt) {
    __m256 low_half = _mm256_mul_ps(_mm256_loadu_ps(code), _mm256_set1_ps(scale));
    __m256 high_half = _mm256_mul_ps(_mm256_loadu_ps(code + 8), _mm256_set1_ps(scale));
    if (dt == GT_F32)
        return lookup_f32_avx2(out, codes, low_half, high_half, begin, end);
    if (dt == GT_BF16)
        return lookup_u16_avx2(out, codes, gt_narrow_bf16_avx2(low_half), gt_narrow_bf16_avx2(high_half), begin, end);
    return lookup_u16_avx2(out, codes, gt_narrow_f16_avx2(low_half), gt_narrow_f16_avx2(high_half), begin, end);
}

GT_AVX2 size_t gt_dequantize8_avx2(void *out, const uint8_t *codes, const float *code, float scale, size_t begin,
                                   size_t end, gt_dtype dt) {
    const __m256 scales = _mm256_set1_ps(scale);
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256i index = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + i)));
        __m256 values = _mm256_mul_ps(_mm256_i32gather_ps(code, index, 4), scales);
        if (dt == GT_F32)
            _mm256_storeu_ps((float *)out + i, values);
        else
            _mm_storeu_si128((__m128i *)((uint16_t *)out + i), dt == GT_BF16 ? gt_narrow_bf16_avx2(values)
                                                                             : gt_narrow_f16_avx2(values));
    }
    return i;
}
#endif
