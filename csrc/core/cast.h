/* Bulk conversions between f32, f16 and bf16 on the CPU, bit-identical to the GT_HD functions of
 * core/half.h on every SIMD level (AVX-512, AVX2 + F16C, scalar), chosen by gt_simd_level(). */
#ifndef GT_CAST_H
#define GT_CAST_H

#include <stddef.h>

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Converts `n` elements of `src` (dtype src_dtype) into `dst` (dtype dst_dtype). Both dtypes must
 * be GT_F32, GT_F16 or GT_BF16; equal dtypes copy. f16 <-> bf16 goes through f32 (exact widening,
 * one rounding). The buffers must not overlap. Large conversions run on OpenMP threads. */
gt_status gt_cast(const void *src, gt_dtype src_dtype, void *dst, gt_dtype dst_dtype, size_t n);

#ifdef __cplusplus
}
#endif
#endif
