/* CPU GEMM (row-major): C = alpha op(A) op(B) + beta C, through the CPU library (cpu_blas.h)
 * split over gputrain's OpenMP threads (cpu_gemm_split.c).
 * - f32 operands go straight to the library (beta = 0 does not read C).
 * - bf16 operands go straight to it too where it multiplies them natively on this CPU
 *   (AVX512_BF16/AMX): f32 accumulation, C rounded once; its scratch is the workspace.
 * - Otherwise f16/bf16 operands are widened exactly to f32 in the workspace (one batch at a
 *   time), multiplied in f32, and the result is rounded once into a half C; a half C is widened
 *   first only when beta != 0. */

#include "core/alloc.h"
#include "core/cast.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/checks.h"
#include "ops/cpu_gemm_split.h"

/* The f32 copies of the half operands of one batch, carved from the workspace. */
typedef struct gemm_scratch {
    float *a;  /* op(A) stored as A is, compact: (a_rows, a_cols); NULL when A is f32 */
    float *b;  /* B compact: (b_rows, b_cols); NULL when B is f32 */
    float *c;  /* C compact: (m, n); NULL when C is f32 */
} gemm_scratch;


/* The library GEMM of matrix 0 of args, when the library multiplies its dtypes natively. */
static gt_blas_gemm library_gemm(const gt_gemm_args *g) {
    gt_blas_gemm lib = {g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, g->beta,
                        g->a, g->lda, g->b, g->ldb, g->a_dt, g->c, g->ldc, g->c_dt, 0};
    return lib;
}

/* 1 when args run natively in the library (bytes: the scratch that needs); a half GEMM whose
 * primitive the library cannot make is widened instead. */
static int native_gemm(const gt_gemm_args *g, size_t *scratch_bytes) {
    *scratch_bytes = 0;
    if (g->a_dt != g->b_dt || g->k == 0 || !gt_blas_native(g->a_dt, g->c_dt, g->alpha))
        return 0;
    gt_blas_gemm lib = library_gemm(g);
    return gt_cpu_gemm_split_scratch(&lib, scratch_bytes) == GT_OK;
}

/* Bytes of the f32 copies of the half operands a widened GEMM needs. */
static size_t widened_bytes(const gt_gemm_args *args) {
    size_t bytes = 0;
    if (args->a_dt != GT_F32)  /* saturating: SIZE_MAX when the sizes overflow (never allocated) */
        bytes = gt_size_add_sat(bytes, gt_align_up(gt_size_mul_sat(gt_gemm_a_rows(args) * sizeof(float),
                                                                   gt_gemm_a_cols(args))));
    if (args->b_dt != GT_F32)
        bytes = gt_size_add_sat(bytes, gt_align_up(gt_size_mul_sat(gt_gemm_b_rows(args) * sizeof(float),
                                                                   gt_gemm_b_cols(args))));
    if (args->c_dt != GT_F32)
        bytes = gt_size_add_sat(bytes, gt_align_up(gt_size_mul_sat((size_t)args->m * sizeof(float),
                                                                   (size_t)args->n)));
    return bytes;
}

size_t gt_cpu_gemm_workspace_bytes(const gt_gemm_args *args) {
    size_t scratch_bytes;
    return native_gemm(args, &scratch_bytes) ? scratch_bytes : widened_bytes(args);
}

/* Splits the workspace into the f32 copies the half operands need. */
static gt_status carve_scratch(gt_backend *be, const gt_gemm_args *g, gemm_scratch *s) {
    size_t need = widened_bytes(g);
    if (need > 0 && (!be->workspace || be->workspace_bytes < need))
        return GT_FAIL(GT_ERR_RUNTIME,
                       "workspace: a half-precision GEMM (%lld x %lld x %lld) needs %zu bytes, "
                       "the backend has %zu", (long long)g->m, (long long)g->n, (long long)g->k,
                       need, be->workspace ? be->workspace_bytes : (size_t)0);
    char *next = (char *)be->workspace;
    s->a = s->b = s->c = NULL;
    if (g->a_dt != GT_F32) {
        s->a = (float *)next;
        next += gt_align_up(gt_gemm_a_rows(g) * gt_gemm_a_cols(g) * sizeof(float));
    }
    if (g->b_dt != GT_F32) {
        s->b = (float *)next;
        next += gt_align_up(gt_gemm_b_rows(g) * gt_gemm_b_cols(g) * sizeof(float));
    }
    if (g->c_dt != GT_F32)
        s->c = (float *)next;
    return GT_OK;
}

/* dst (rows, cols) with leading dimension dst_ld = src converted, rows in parallel. */
static gt_status convert_rows(void *dst, gt_dtype dst_dt, size_t dst_ld, const void *src,
                              gt_dtype src_dt, size_t src_ld, size_t rows, size_t cols) {
    if (rows == 0 || cols == 0)
        return GT_OK;
    if (src_ld == cols && dst_ld == cols)
        return gt_cast(src, src_dt, dst, dst_dt, rows * cols);
    size_t dst_size = gt_dtype_size(dst_dt), src_size = gt_dtype_size(src_dt);
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed) if (rows * cols > GT_CPU_CHUNK)
    for (size_t r = 0; r < rows; r++)
        failed |= gt_cast((const char *)src + r * src_ld * src_size, src_dt,
                          (char *)dst + r * dst_ld * dst_size, dst_dt, cols) != GT_OK;
    if (failed)
        return GT_FAIL(GT_ERR_RUNTIME, "gemm: converting a %s matrix to %s failed",
                       gt_dtype_name(src_dt), gt_dtype_name(dst_dt));
    return GT_OK;
}

/* One GEMM of the batch: widen the half operands, sgemm, round a half C. */
static gt_status gemm_one(const gt_gemm_args *g, const gemm_scratch *s, const void *a,
                          const void *b, void *c) {
    const float *a32 = a, *b32 = b;
    float *c32 = c;
    int64_t lda = g->lda, ldb = g->ldb, ldc = g->ldc;
    if (s->a) {
        GT_TRY(convert_rows(s->a, GT_F32, gt_gemm_a_cols(g), a, g->a_dt, (size_t)g->lda, gt_gemm_a_rows(g), gt_gemm_a_cols(g)));
        a32 = s->a, lda = gt_gemm_a_cols(g) > 1 ? (int64_t)gt_gemm_a_cols(g) : 1;
    }
    if (s->b) {
        GT_TRY(convert_rows(s->b, GT_F32, gt_gemm_b_cols(g), b, g->b_dt, (size_t)g->ldb, gt_gemm_b_rows(g), gt_gemm_b_cols(g)));
        b32 = s->b, ldb = gt_gemm_b_cols(g) > 1 ? (int64_t)gt_gemm_b_cols(g) : 1;
    }
    if (s->c) {
        c32 = s->c, ldc = g->n > 1 ? g->n : 1;
        if (g->beta != 0.0f)
            GT_TRY(convert_rows(c32, GT_F32, (size_t)g->n, c, g->c_dt, (size_t)g->ldc,
                                (size_t)g->m, (size_t)g->n));
    }
    gt_blas_gemm sgemm = {g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, g->beta,
                          a32, lda, b32, ldb, GT_F32, c32, ldc, GT_F32, 0};
    GT_TRY(gt_cpu_gemm_split(&sgemm, NULL));
    if (s->c)
        GT_TRY(convert_rows(c, g->c_dt, (size_t)g->ldc, c32, GT_F32, (size_t)g->n,
                            (size_t)g->m, (size_t)g->n));
    return GT_OK;
}

/* A native GEMM: the library's scratch is the workspace. */
static gt_status native_run(gt_backend *be, const gt_gemm_args *g, size_t scratch_bytes) {
    if (scratch_bytes > 0 && (!be->workspace || be->workspace_bytes < scratch_bytes))
        return GT_FAIL(GT_ERR_RUNTIME,
                       "workspace: a %s GEMM (%lld x %lld x %lld) needs %zu bytes, the backend "
                       "has %zu", gt_dtype_name(g->a_dt), (long long)g->m, (long long)g->n,
                       (long long)g->k, scratch_bytes, be->workspace ? be->workspace_bytes : 0);
    gt_blas_gemm lib = library_gemm(g);
    return gt_cpu_gemm_split_batch(&lib, g->batch, g->stride_a, g->stride_b, g->stride_c,
                                   be->workspace);
}

gt_status gt_cpu_gemm(gt_backend *be, const gt_gemm_args *args) {
    GT_TRY(gt_gemm_check(args));
    if (args->m == 0 || args->n == 0)
        return GT_OK;
    size_t scratch_bytes;
    if (native_gemm(args, &scratch_bytes))
        return native_run(be, args, scratch_bytes);
    gemm_scratch scratch = {NULL, NULL, NULL};
    GT_TRY(carve_scratch(be, args, &scratch));
    size_t a_size = gt_dtype_size(args->a_dt), b_size = gt_dtype_size(args->b_dt);
    size_t c_size = gt_dtype_size(args->c_dt);
    for (int64_t i = 0; i < args->batch; i++) {
        const char *a = args->a ? (const char *)args->a + (size_t)(i * args->stride_a) * a_size : NULL;
        const char *b = args->b ? (const char *)args->b + (size_t)(i * args->stride_b) * b_size : NULL;
        char *c = (char *)args->c + (size_t)(i * args->stride_c) * c_size;
        GT_TRY(gemm_one(args, &scratch, a, b, c));
    }
    return GT_OK;
}
