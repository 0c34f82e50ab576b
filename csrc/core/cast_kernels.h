/* The conversion kernels behind gt_cast (private to csrc/core). Each converts `n` contiguous
 * elements with no alignment requirement and gives the same bits as core/half.h. */
#ifndef GT_CAST_KERNELS_H
#define GT_CAST_KERNELS_H

#include <stddef.h>

typedef void (*gt_cast_kernel)(const void *src, void *dst, size_t n);

/* AVX-512 F/BW/VL/DQ (cast_x86.c): F16C-style hardware rounding with NaN lanes fixed up to
 * NumPy's rule; bf16 by integer round-to-nearest-even (VCVTNEPS2BF16 flushes subnormals). */
void gt_cast_f32_to_f16_avx512(const void *src, void *dst, size_t n);
void gt_cast_f16_to_f32_avx512(const void *src, void *dst, size_t n);
void gt_cast_f32_to_bf16_avx512(const void *src, void *dst, size_t n);
void gt_cast_bf16_to_f32_avx512(const void *src, void *dst, size_t n);

/* AVX2 + F16C (cast_x86.c), same method on 8 lanes. */
void gt_cast_f32_to_f16_avx2(const void *src, void *dst, size_t n);
void gt_cast_f16_to_f32_avx2(const void *src, void *dst, size_t n);
void gt_cast_f32_to_bf16_avx2(const void *src, void *dst, size_t n);
void gt_cast_bf16_to_f32_avx2(const void *src, void *dst, size_t n);

#endif
