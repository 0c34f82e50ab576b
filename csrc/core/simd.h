/* SIMD level chosen at run time for vectorised inner loops. Kernels compile their wide
 * variants with __attribute__((target(...))) and dispatch on gt_simd_level(). The wide variants
 * exist on x86-64 only (GT_SIMD_X86): elsewhere every kernel is its portable C, which the
 * compiler vectorises with the architecture's baseline SIMD (NEON on aarch64), and the level is
 * always GT_SIMD_SCALAR. */
#ifndef GT_SIMD_H
#define GT_SIMD_H

#include "core/status.h"

#if defined(__x86_64__)
#define GT_SIMD_X86 1
#else
#define GT_SIMD_X86 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gt_simd {
    GT_SIMD_SCALAR = 0,   /* portable C */
    GT_SIMD_AVX2 = 1,     /* AVX2 + FMA + F16C */
    GT_SIMD_AVX512 = 2,   /* AVX-512 F/BW/VL/DQ */
} gt_simd;

/* The level in use: the best the CPU supports, unless lowered by gt_set_simd_level. */
gt_simd gt_simd_level(void);

/* The best level this CPU supports. */
gt_simd gt_simd_supported(void);

/* Lowers the level (for tests and comparisons); refuses a level the CPU lacks. */
gt_status gt_set_simd_level(gt_simd level);

/* 1 when the CPU has AVX512_BF16 instructions. */
int gt_cpu_has_avx512_bf16(void);

const char *gt_simd_name(gt_simd level);

#ifdef __cplusplus
}
#endif
#endif
