/* Private helpers of the CPU backend (csrc/ops/cpu_*.c): dtype-specialised loads and stores,
 * SIMD-level variants of a kernel, and the fixed chunking of parallel loops.
 *
 * A kernel is written once as an always-inline `<name>_body(..., gt_dtype dt)`. GT_CPU_KERNEL
 * compiles it three times (portable, AVX2, AVX-512 via target attributes); each variant
 * switches on `dt` outside the loop and calls the body with a constant dtype, so the loads
 * and stores below fold to one conversion and the loop vectorises. The build uses
 * -ffp-contract=off, so the three variants give bit-identical results: only the width of the
 * vector registers differs. GT_CPU_RUN(name) picks the variant for gt_simd_level(). Off x86-64
 * only the portable variant exists. */
#ifndef GT_CPU_KERNELS_H
#define GT_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/cast.h"
#include "core/half.h"
#include "core/simd.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/checks.h"
#include "ops/elem_hd.h"

#define GT_INLINE static inline __attribute__((always_inline))

/* Elements per chunk of a parallel elementwise loop: chunks, not threads, fix the work split. */
enum { GT_CPU_CHUNK = 16384 };

/* Element i of an activation array of dtype dt, widened to f32, and the store rounding once:
 * the loads and stores shared with the CUDA kernels (ops/elem_hd.h, force-inlined like GT_INLINE). */
#define gt_cpu_load gt_hd_load
#define gt_cpu_store gt_hd_store

/* f16 elements converted per step by the staged kernels (GT_CPU_KERNEL_STAGED). */
enum { GT_STAGE = 2048 };

/* dst[0:len] = f16 src[begin:begin+len] widened through gt_cast, the vectorised bulk conversion
 * (the scalar gt_f16_to_f32/gt_f32_to_f16 do not vectorise). gt_cast gives the same bits as
 * core/half.h and cannot fail here: valid dtypes, non-NULL, non-overlapping stack buffers. */
GT_INLINE void gt_cpu_widen_f16(float *dst, const void *src, size_t begin, size_t len) {
    (void)gt_cast((const uint16_t *)src + begin, GT_F16, dst, GT_F32, len);
}

/* dst[begin:begin+len] = src[0:len] rounded to f16 through gt_cast. */
GT_INLINE void gt_cpu_narrow_f16(void *dst, size_t begin, const float *src, size_t len) {
    (void)gt_cast(src, GT_F32, (uint16_t *)dst + begin, GT_F16, len);
}

/* Elements of the staged block that starts at s, for a range ending at end. */
static inline size_t gt_stage_len(size_t s, size_t end) {
    return end - s < GT_STAGE ? end - s : GT_STAGE;
}

/* Defines <name>_<level> for the three SIMD levels; PARAMS must declare `gt_dtype dt` and
 * ARGS are the arguments passed on to <name>_body before the constant dtype. */
#define GT_CPU_KERNEL_AT(name, level, attr, PARAMS, ...)                  \
    attr static void name##_##level PARAMS {                              \
        switch (dt) {                                                     \
        case GT_F16: name##_body(__VA_ARGS__, GT_F16); break;             \
        case GT_BF16: name##_body(__VA_ARGS__, GT_BF16); break;           \
        default: name##_body(__VA_ARGS__, GT_F32); break;                 \
        }                                                                 \
    }

/* Same, with f16 handled by <name>_f16(ARGS) (a loop over GT_STAGE blocks converted with
 * gt_cpu_widen_f16/gt_cpu_narrow_f16 around the f32 body). */
#define GT_CPU_KERNEL_STAGED_AT(name, level, attr, PARAMS, ...)           \
    attr static void name##_##level PARAMS {                              \
        switch (dt) {                                                     \
        case GT_F16: name##_f16(__VA_ARGS__); break;                      \
        case GT_BF16: name##_body(__VA_ARGS__, GT_BF16); break;           \
        default: name##_body(__VA_ARGS__, GT_F32); break;                 \
        }                                                                 \
    }

#if GT_SIMD_X86
#define GT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define GT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* Defines <name>_scalar, <name>_avx2 and <name>_avx512. */
#define GT_CPU_KERNEL(name, PARAMS, ...)                                  \
    GT_CPU_KERNEL_AT(name, scalar, , PARAMS, __VA_ARGS__)                 \
    GT_CPU_KERNEL_AT(name, avx2, GT_TARGET_AVX2, PARAMS, __VA_ARGS__)     \
    GT_CPU_KERNEL_AT(name, avx512, GT_TARGET_AVX512, PARAMS, __VA_ARGS__)

#define GT_CPU_KERNEL_STAGED(name, PARAMS, ...)                                  \
    GT_CPU_KERNEL_STAGED_AT(name, scalar, , PARAMS, __VA_ARGS__)                 \
    GT_CPU_KERNEL_STAGED_AT(name, avx2, GT_TARGET_AVX2, PARAMS, __VA_ARGS__)     \
    GT_CPU_KERNEL_STAGED_AT(name, avx512, GT_TARGET_AVX512, PARAMS, __VA_ARGS__)

/* The variant of kernel `name` for the SIMD level in use (a function designator). */
#define GT_CPU_RUN(name)                                                  \
    (gt_simd_level() == GT_SIMD_AVX512 ? name##_avx512                    \
     : gt_simd_level() == GT_SIMD_AVX2 ? name##_avx2                      \
                                        : name##_scalar)
#else /* one portable variant, vectorised with the architecture's baseline SIMD (core/simd.h) */
#define GT_CPU_KERNEL(name, PARAMS, ...) GT_CPU_KERNEL_AT(name, scalar, , PARAMS, __VA_ARGS__)
#define GT_CPU_KERNEL_STAGED(name, PARAMS, ...) \
    GT_CPU_KERNEL_STAGED_AT(name, scalar, , PARAMS, __VA_ARGS__)
#define GT_CPU_RUN(name) name##_scalar
#endif

/* Number of GT_CPU_CHUNK-sized chunks covering n elements. */
static inline size_t gt_cpu_chunks(size_t n) { return (n + GT_CPU_CHUNK - 1) / GT_CPU_CHUNK; }

/* One past the last element of the chunk that starts at `begin`, for n elements in all. */
static inline size_t gt_cpu_chunk_end(size_t begin, size_t n) {
    return n - begin > GT_CPU_CHUNK ? begin + GT_CPU_CHUNK : n;
}

/* Lanes of a fixed-order sum (GT_LANE_SUM). */
enum { GT_LANES = 8 };

/* out = the sum in double of EXPR (a double expression of the index `k`) over k in
 * [begin, end), in an order fixed by begin and end only: lane j adds the k with
 * (k - begin) % 8 == j in increasing k, and the lanes are combined pairwise. The lanes are
 * explicit, so the loop vectorises without reassociation and every SIMD level and thread
 * count gives the same bits. */
#define GT_LANE_SUM(out, begin, end, EXPR)                                              \
    do {                                                                                \
        double lanes_[GT_LANES] = {0};                                                  \
        size_t base_ = (begin), end_ = (end);                                           \
        for (; end_ - base_ >= GT_LANES; base_ += GT_LANES)                             \
            for (size_t j_ = 0; j_ < GT_LANES; j_++) {                                  \
                size_t k = base_ + j_;                                                  \
                lanes_[j_] += (EXPR);                                                   \
            }                                                                           \
        for (size_t j_ = 0; base_ + j_ < end_; j_++) {                                  \
            size_t k = base_ + j_;                                                      \
            lanes_[j_] += (EXPR);                                                       \
        }                                                                               \
        (out) = ((lanes_[0] + lanes_[1]) + (lanes_[2] + lanes_[3])) +                   \
                ((lanes_[4] + lanes_[5]) + (lanes_[6] + lanes_[7]));                    \
    } while (0)

#endif
