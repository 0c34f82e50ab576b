#include "ops/checks.h"

#include <limits.h>

gt_status gt_op_check_dtype(gt_dtype dt, const char *arg_name) {
    if (dt == GT_F32 || dt == GT_F16 || dt == GT_BF16)
        return GT_OK;
    return GT_FAIL(GT_ERR_VALUE, "%s: expected f32, f16 or bf16, got %s", arg_name,
                   gt_dtype_name(dt));
}

gt_status gt_op_check_size(int64_t value, const char *arg_name) {
    if (value < 0)
        return GT_FAIL(GT_ERR_VALUE, "%s: must be >= 0, got %lld", arg_name, (long long)value);
    return GT_OK;
}

gt_status gt_op_check_ptr(const void *ptr, const char *arg_name) {
    if (!ptr)
        return GT_FAIL(GT_ERR_VALUE, "%s: NULL pointer", arg_name);
    return GT_OK;
}

/* Fails unless value fits a BLAS's 32-bit int arguments and is >= minimum. */
static gt_status check_dim(int64_t value, int64_t minimum, const char *arg_name) {
    if (value < minimum || value > INT_MAX)
        return GT_FAIL(GT_ERR_VALUE, "%s: must be in [%lld, %d], got %lld", arg_name,
                       (long long)minimum, INT_MAX, (long long)value);
    return GT_OK;
}

static int64_t at_least_one(size_t value) { return value > 1 ? (int64_t)value : 1; }

gt_status gt_gemm_check(const gt_gemm_args *g) {
    GT_TRY(gt_op_check_ptr(g, "args"));
    GT_TRY(gt_op_check_dtype(g->a_dt, "a_dt"));
    GT_TRY(gt_op_check_dtype(g->b_dt, "b_dt"));
    GT_TRY(gt_op_check_dtype(g->c_dt, "c_dt"));
    GT_TRY(check_dim(g->m, 0, "m"));
    GT_TRY(check_dim(g->n, 0, "n"));
    GT_TRY(check_dim(g->k, 0, "k"));
    GT_TRY(check_dim(g->lda, at_least_one(gt_gemm_a_cols(g)), "lda"));
    GT_TRY(check_dim(g->ldb, at_least_one(gt_gemm_b_cols(g)), "ldb"));
    GT_TRY(check_dim(g->ldc, at_least_one((size_t)g->n), "ldc"));
    GT_TRY(check_dim(g->batch, 1, "batch"));
    if (g->batch > 1 && (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0))
        return GT_FAIL(GT_ERR_VALUE, "stride_a/stride_b/stride_c: must be >= 0");
    if (g->m > 0 && g->n > 0) {
        GT_TRY(gt_op_check_ptr(g->c, "c"));
        if (g->k > 0) {
            GT_TRY(gt_op_check_ptr(g->a, "a"));
            GT_TRY(gt_op_check_ptr(g->b, "b"));
        }
    }
    return GT_OK;
}
