/* Private to the CPU backend: GEMMs of the CPU library (cpu_blas.h) split over gputrain's OpenMP
 * threads (cpu_gemm_split.c). */
#ifndef GT_CPU_GEMM_SPLIT_H
#define GT_CPU_GEMM_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "ops/cpu_blas.h"

/* How a GEMM is cut into library calls: from the GEMM and the CPU, never from the thread count. */
typedef struct gt_gemm_parts {
    int split_rows;  /* 1: parts are blocks of rows of C; 0: blocks of columns */
    int64_t count;   /* number of parts (1: one call for the whole GEMM) */
    int64_t extent;  /* rows (split_rows) or columns of C being cut */
} gt_gemm_parts;

gt_gemm_parts gt_gemm_parts_of(const gt_blas_gemm *g);

/* Scratch bytes gt_cpu_gemm_split(g) needs: one library scratch per part. */
gt_status gt_cpu_gemm_split_scratch(const gt_blas_gemm *g, size_t *bytes);

/* Runs g as its parts, spread over the OpenMP threads; the bits do not depend on the threads. */
gt_status gt_cpu_gemm_split(const gt_blas_gemm *g, void *scratch);

/* `batch` GEMMs like g, matrix i at a + i stride_a, b + i stride_b, c + i stride_c (elements):
 * small f32 GEMMs one per thread, others one after the other, each split. */
gt_status gt_cpu_gemm_split_batch(const gt_blas_gemm *g, int64_t batch, int64_t stride_a,
                                  int64_t stride_b, int64_t stride_c, void *scratch);

#endif
