/* The CPU GEMM library off x86-64 (aarch64): OpenBLAS from the scipy-openblas32 wheel, a
 * DYNAMIC_ARCH build whose kernels are chosen for the core at run time (ARMv8 NEON through
 * Neoverse SVE; its symbols carry a scipy_ prefix, so it never clashes with another OpenBLAS in
 * the process). OpenBLAS is kept single-threaded: cpu_gemm_split.c splits GEMMs over gputrain's
 * OpenMP threads, so OpenBLAS's pthreads never spin against them. It has no half GEMM in this
 * build, so f16/bf16 GEMMs are widened to f32 (cpu_gemm.c). */
#include <cblas.h>

#include "ops/cpu_blas.h"

void gt_blas_init(void) { scipy_openblas_set_num_threads(1); }

int gt_blas_native(gt_dtype ab_dt, gt_dtype c_dt, float alpha) {
    return ab_dt == GT_F32 && c_dt == GT_F32;
}

int64_t gt_blas_min_part(const gt_blas_gemm *g) { return 128; }

gt_status gt_blas_scratch_bytes(const gt_blas_gemm *g, size_t *bytes) {
    *bytes = 0;
    return GT_OK;
}

gt_status gt_blas_gemm_run(const gt_blas_gemm *g, void *scratch) {
    if (g->ab_dt != GT_F32 || g->c_dt != GT_F32)
        return GT_FAIL(GT_ERR_RUNTIME, "OpenBLAS has no %s GEMM here", gt_dtype_name(g->ab_dt));
    scipy_cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                      g->trans_b ? CblasTrans : CblasNoTrans, (blasint)g->m, (blasint)g->n,
                      (blasint)g->k, g->alpha, g->a, (blasint)g->lda, g->b, (blasint)g->ldb,
                      g->beta, g->c, (blasint)g->ldc);
    return GT_OK;
}

gt_status gt_blas_shared_b_bytes(const gt_blas_gemm *parts, int64_t count, size_t *bytes) {
    (void)parts, (void)count;
    *bytes = 0;  /* sgemm packs its own panels */
    return GT_OK;
}

gt_status gt_blas_pack_b(const gt_blas_gemm *g, void *packed) {
    (void)g, (void)packed;
    return GT_FAIL(GT_ERR_RUNTIME, "OpenBLAS has no packed B");
}

int gt_blas_wants_dense_c(const gt_blas_gemm *g) {
    (void)g;
    return 0;  /* sgemm writes C through ldc at no cost */
}

const char *gt_blas_name(void) { return "openblas"; }

const char *gt_blas_config(void) { return scipy_openblas_get_config(); }

const char *gt_blas_kernel(void) { return scipy_openblas_get_corename(); }
