/* One vector of f32 lanes narrowed to f16 or bf16 bits, as core/half.h rounds each element: the
 * bodies of the cast kernels (cast_x86.c), inlined where a kernel narrows values it computed
 * (ops/quant_x86.c). Hardware f16 conversion rounds like core/half.h but quiets signalling
 * NaNs, so NaN lanes are recomputed with NumPy's rule; bf16 uses integer round-to-nearest-even
 * on the bit patterns (VCVTNEPS2BF16 flushes subnormals). x86-64 only (core/simd.h). */
#ifndef GT_CAST_X86_H
#define GT_CAST_X86_H

#include "core/simd.h"

#if GT_SIMD_X86
#include <immintrin.h>

#define GT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define GT_AVX2 __attribute__((target("avx2,fma,f16c")))

/* ---- AVX-512: 16 lanes ---- */

/* f16 bits NumPy gives for NaN f32 lanes `bits`: sign | 0x7c00 | top 10 payload bits, or 1. */
GT_AVX512 static inline __m256i gt_f16_nan_bits_avx512(__m512i bits) {
    __m512i payload = _mm512_and_si512(_mm512_srli_epi32(bits, 13), _mm512_set1_epi32(0x3ff));
    __mmask16 empty = _mm512_cmpeq_epi32_mask(payload, _mm512_setzero_si512());
    payload = _mm512_mask_mov_epi32(payload, empty, _mm512_set1_epi32(1));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000));
    __m512i nan = _mm512_or_si512(_mm512_or_si512(sign, payload), _mm512_set1_epi32(0x7c00));
    return _mm512_cvtepi32_epi16(nan);
}

GT_AVX512 static inline __m256i gt_narrow_f16_avx512(__m512 x) {
    __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i bits = _mm512_castps_si512(x);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return nan ? _mm256_mask_blend_epi16(nan, h, gt_f16_nan_bits_avx512(bits)) : h;
}

GT_AVX512 static inline __m256i gt_narrow_bf16_avx512(__m512 x) {
    __m512i bits = _mm512_castps_si512(x);
    __m512i high = _mm512_srli_epi32(bits, 16);
    __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i quiet = _mm512_or_si512(_mm512_and_si512(high, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

/* ---- AVX2 + F16C: 8 lanes ---- */

/* Packs eight 32-bit lanes holding values in 0..0xffff into eight uint16 (in order). */
GT_AVX2 static inline __m128i gt_narrow_u16_avx2(__m256i lanes) {
    return _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
}

/* 0xffffffff where the f32 lane `bits` is a NaN. */
GT_AVX2 static inline __m256i gt_nan_lanes_avx2(__m256i bits) {
    __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    return _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
}

GT_AVX2 static inline __m128i gt_f16_nan_bits_avx2(__m256i bits) {
    __m256i payload = _mm256_and_si256(_mm256_srli_epi32(bits, 13), _mm256_set1_epi32(0x3ff));
    __m256i empty = _mm256_cmpeq_epi32(payload, _mm256_setzero_si256());
    payload = _mm256_or_si256(payload, _mm256_and_si256(empty, _mm256_set1_epi32(1)));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000));
    __m256i nan = _mm256_or_si256(_mm256_or_si256(sign, payload), _mm256_set1_epi32(0x7c00));
    return gt_narrow_u16_avx2(nan);
}

GT_AVX2 static inline __m128i gt_narrow_f16_avx2(__m256 x) {
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i bits = _mm256_castps_si256(x);
    __m256i nan = gt_nan_lanes_avx2(bits);
    if (_mm256_testz_si256(nan, nan))
        return h;
    __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    return _mm_blendv_epi8(h, gt_f16_nan_bits_avx2(bits), nan16);
}

GT_AVX2 static inline __m128i gt_narrow_bf16_avx2(__m256 x) {
    __m256i bits = _mm256_castps_si256(x);
    __m256i high = _mm256_srli_epi32(bits, 16);
    __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd), 16);
    __m256i quiet = _mm256_or_si256(_mm256_and_si256(high, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
    return gt_narrow_u16_avx2(_mm256_blendv_epi8(rounded, quiet, gt_nan_lanes_avx2(bits)));
}
#endif

#endif
