/* Element loads and stores of f32/f16/bf16 activation arrays, shared by the CPU ops
 * (cpu_kernels.h), the CUDA kernels and the host harnesses that run the kernels' math in CI
 * (attention_hd.h, batchnorm_hd.h, pool2d_hd.h, sequence_hd.h).
 *
 * GT_HD_INLINE is GT_HD (core/hd.h) forced inline: the CPU kernels call these in their innermost
 * loops with a constant dtype inside per-SIMD-level variants (cpu_kernels.h, GT_CPU_KERNEL), and
 * only an inlined call folds the dtype switch away so the loop vectorises. */
#ifndef GT_ELEM_HD_H
#define GT_ELEM_HD_H

#include <stddef.h>
#include <stdint.h>

#include "core/half.h"
#include "core/hd.h"
#include "core/tensor.h"

#if defined(__CUDACC__)
#define GT_HD_INLINE static __host__ __device__ __forceinline__
#else
#define GT_HD_INLINE static inline __attribute__((always_inline))
#endif

/* Element i of an array of dtype dt, widened to f32 (exact). */
GT_HD_INLINE float gt_hd_load(const void *base, size_t i, gt_dtype dt) {
    if (dt == GT_F16)
        return gt_f16_to_f32(((const uint16_t *)base)[i]);
    if (dt == GT_BF16)
        return gt_bf16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

/* Stores an f32 value into element i of an array of dtype dt, rounding once (RNE). */
GT_HD_INLINE void gt_hd_store(void *base, size_t i, float value, gt_dtype dt) {
    if (dt == GT_F16)
        ((uint16_t *)base)[i] = gt_f32_to_f16(value);
    else if (dt == GT_BF16)
        ((uint16_t *)base)[i] = gt_f32_to_bf16(value);
    else
        ((float *)base)[i] = value;
}

/* x rounded to dt and widened back (x itself in f32): one PyTorch op's result in dt. */
GT_HD_INLINE float gt_hd_round(float x, gt_dtype dt) {
    if (dt == GT_F16)
        return gt_f16_to_f32(gt_f32_to_f16(x));
    if (dt == GT_BF16)
        return gt_bf16_to_f32(gt_f32_to_bf16(x));
    return x;
}

#endif
