/* Private to the CPU backend: row-major f32 GEMM on gputrain's OpenMP threads (cpu_sgemm.c). */
#ifndef GT_CPU_SGEMM_H
#define GT_CPU_SGEMM_H

#include <stdint.h>

/* C = alpha op(A) op(B) + beta C for one row-major f32 GEMM; sizes already checked to fit int. */
typedef struct gt_sgemm {
    int trans_a, trans_b;  /* 1 when A / B are stored transposed */
    int64_t m, n, k;       /* op(A) is (m, k), op(B) is (k, n), C is (m, n) */
    float alpha, beta;     /* scales of the product and of C (beta = 0: C is not read) */
    const float *a;        /* A: (m, k), or (k, m) when trans_a */
    int64_t lda;           /* elements between rows of A */
    const float *b;        /* B: (k, n), or (n, k) when trans_b */
    int64_t ldb;           /* elements between rows of B */
    float *c;              /* C: (m, n) */
    int64_t ldc;           /* elements between rows of C */
} gt_sgemm;

/* Runs the GEMM with one single-threaded OpenBLAS sgemm per OpenMP thread (see cpu_sgemm.c). */
void gt_cpu_sgemm(const gt_sgemm *g);

/* `batch` GEMMs like g, matrix i at a + i stride_a, b + i stride_b, c + i stride_c (elements):
 * small GEMMs one per thread, larger ones one after the other, each split over the threads. */
void gt_cpu_sgemm_batch(const gt_sgemm *g, int64_t batch, int64_t stride_a, int64_t stride_b,
                        int64_t stride_c);

#endif
