/* SIMD dequantization of one block of codes (quant_x86.c), the inner loops of the CPU's
 * dequantize_blockwise (cpu_quant.c). Each kernel writes element i of [begin, end) as
 * code[code of element i] * scale in f32 rounded once to dt (the element math of quant_hd.h,
 * narrowed as core/cast_x86.h does) for whole vectors from begin on, and returns the first
 * element it left to the caller's scalar loop: every level gives the same bits.
 *
 * 4-bit codes are two a byte, element i in codes[i / 2], the high nibble first, and begin is
 * even; the kernels make the block's 16 possible outputs in registers and look them up. 8-bit
 * codes are a byte each; the kernels gather code[] entries and scale them. */
#ifndef GT_QUANT_KERNELS_H
#define GT_QUANT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/simd.h"
#include "core/tensor.h"

#if GT_SIMD_X86
/* AVX-512 F/BW: 4-bit 32 elements a step (VPERMPS, VPERMW); 8-bit 16 (VGATHERDPS). */
size_t gt_dequantize4_avx512(void *out, const uint8_t *codes, const float *code, float scale, size_t begin,
                             size_t end, gt_dtype dt);
size_t gt_dequantize8_avx512(void *out, const uint8_t *codes, const float *code, float scale, size_t begin,
                             size_t end, gt_dtype dt);

/* AVX2: 4-bit 16 elements a step (f32: two VPERMPS and a blend; 16-bit: PSHUFB on the outputs'
 * bytes); 8-bit 8 (VGATHERDPS). */
size_t gt_dequantize4_avx2(void *out, const uint8_t *codes, const float *code, float scale, size_t begin,
                           size_t end, gt_dtype dt);
size_t gt_dequantize8_avx2(void *out, const uint8_t *codes, const float *code, float scale, size_t begin,
                           size_t end, gt_dtype dt);
#endif

#endif
