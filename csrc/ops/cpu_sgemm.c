/* f32 GEMM on gputrain's OpenMP threads. C is split into one block of rows (or of columns when C
 * is wider than tall) per thread, and each thread runs a single-threaded OpenBLAS sgemm on its
 * block (openblas_set_num_threads_local(1) on that thread). OpenBLAS's own pthread pool is then
 * never woken, so the GEMMs and the OpenMP elementwise ops between them share one set of threads
 * instead of two sets spinning against each other on the same cores (with OpenBLAS threading, a
 * bf16 GEMM whose widening ran on OpenMP took 84 ms instead of 3 ms at 256x1024x784 on 2 cores).
 * GEMMs below GT_SGEMM_MIN_SPLIT_FLOPS run on one thread, and a batch of such small GEMMs runs
 * one GEMM per thread. OpenBLAS sums each element of C over k in the same order whatever block
 * holds it, so the result does not depend on the thread count (tests/test_ops_gemm.py). An
 * OpenBLAS without the per-thread setting (older than 0.3.27) runs each whole GEMM on its own
 * threads instead. */
#include <cblas.h>
#include <omp.h>

#include "ops/cpu_sgemm.h"

#pragma weak openblas_set_num_threads_local

enum {
    GT_SGEMM_MIN_SPLIT_FLOPS = 1 << 22,  /* 2 m n k below which one thread runs a GEMM */
    GT_SGEMM_PART_ALIGN = 16,            /* rows/columns per part are a multiple of this */
};

static double sgemm_flops(const gt_sgemm *g) {
    return 2.0 * (double)g->m * (double)g->n * (double)g->k;
}

/* The sgemm of rows [lo, hi) of C (split_rows) or of its columns [lo, hi). */
static void sgemm_part(const gt_sgemm *g, int split_rows, int64_t lo, int64_t hi) {
    const float *a = g->a, *b = g->b;
    float *c = g->c;
    int64_t m = g->m, n = g->n;
    if (split_rows) {
        a += g->trans_a ? lo : lo * g->lda;
        c += lo * g->ldc;
        m = hi - lo;
    } else {
        b += g->trans_b ? lo * g->ldb : lo;
        c += lo;
        n = hi - lo;
    }
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)g->k, g->alpha, a,
                (int)g->lda, b, (int)g->ldb, g->beta, c, (int)g->ldc);
}

/* Runs part `index` of `parts` on the calling thread with OpenBLAS single-threaded. */
static void sgemm_on_this_thread(const gt_sgemm *g, int split_rows, int64_t part_size,
                                 int64_t index) {
    int64_t extent = split_rows ? g->m : g->n;
    int64_t lo = index * part_size, hi = lo + part_size < extent ? lo + part_size : extent;
    if (lo >= hi)
        return;
    int previous = openblas_set_num_threads_local(1);
    sgemm_part(g, split_rows, lo, hi);
    openblas_set_num_threads_local(previous);
}

void gt_cpu_sgemm(const gt_sgemm *g) {
    if (!openblas_set_num_threads_local) {
        sgemm_part(g, 1, 0, g->m);
        return;
    }
    int split_rows = g->m >= g->n;
    int64_t extent = split_rows ? g->m : g->n;
    int64_t parts = sgemm_flops(g) < GT_SGEMM_MIN_SPLIT_FLOPS ? 1 : omp_get_max_threads();
    if (parts > extent / GT_SGEMM_PART_ALIGN)
        parts = extent / GT_SGEMM_PART_ALIGN > 1 ? extent / GT_SGEMM_PART_ALIGN : 1;
    int64_t part_size = (extent + parts - 1) / parts;
    part_size = (part_size + GT_SGEMM_PART_ALIGN - 1) / GT_SGEMM_PART_ALIGN * GT_SGEMM_PART_ALIGN;
#pragma omp parallel for schedule(static, 1) num_threads((int)parts) if (parts > 1)
    for (int64_t index = 0; index < parts; index++)
        sgemm_on_this_thread(g, split_rows, part_size, index);
}

void gt_cpu_sgemm_batch(const gt_sgemm *g, int64_t batch, int64_t stride_a, int64_t stride_b,
                        int64_t stride_c) {
    if (batch == 1) {  /* no enclosing region: a nested one would leave the split one thread */
        gt_cpu_sgemm(g);
        return;
    }
    int small = openblas_set_num_threads_local && sgemm_flops(g) < GT_SGEMM_MIN_SPLIT_FLOPS;
#pragma omp parallel for schedule(static) if (small)
    for (int64_t i = 0; i < batch; i++) {
        gt_sgemm one = *g;  /* a and b may be NULL when k = 0 */
        one.a = one.a ? one.a + i * stride_a : NULL;
        one.b = one.b ? one.b + i * stride_b : NULL;
        one.c += i * stride_c;
        gt_cpu_sgemm(&one);
    }
}
