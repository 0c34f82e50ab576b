/* CPU RMSNorm over the last dim of (rows, cols): the math of ops/rmsnorm_hd.h (shared with the
 * CUDA kernels), rows in parallel for the forward and din, column blocks in parallel for dweight
 * (each column's sum over the rows in order). Every sum has a fixed order, so any thread count
 * gives the same bits. */
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/rmsnorm_hd.h"

enum { GT_RMS_COLS = 128 };  /* columns per block of the weight gradient sums */

static gt_status check_rmsnorm(const void *in, int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (rows > 0 && cols == 0)
        return GT_FAIL(GT_ERR_VALUE, "cols: RMSNorm needs at least one column");
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(in, "in"));
    return GT_OK;
}

gt_status gt_cpu_rmsnorm_forward(gt_backend *be, void *out, float *rstd, const void *in, const float *weight,
                                 int plus_one, int64_t rows, int64_t cols, float eps, gt_dtype dt) {
    GT_TRY(check_rmsnorm(in, rows, cols, dt));
    if (!(eps >= 0.0f))
        return GT_FAIL(GT_ERR_VALUE, "eps: must be >= 0, got %g", (double)eps);
    size_t n = (size_t)rows, c = (size_t)cols;
#pragma omp parallel for schedule(static) if (n * c > GT_CPU_CHUNK)
    for (size_t r = 0; r < n; r++)
        gt_rms_forward_row(out, rstd, in, weight, plus_one, r, c, eps, dt);
    return GT_OK;
}

/* dweight[begin:end) from the rows in order. */
static void rms_dweight_block(float *dweight, const void *dout, const void *in, const float *rstd,
                              size_t rows, size_t cols, size_t begin, size_t end, int accumulate, gt_dtype dt) {
    double sums[GT_RMS_COLS] = {0};
    for (size_t r = 0; r < rows; r++)
        for (size_t c = begin; c < end; c++)
            sums[c - begin] += gt_rms_dweight_term(dout, in, rstd, r, c, cols, dt);
    for (size_t c = begin; c < end; c++)
        gt_rms_dweight_store(dweight, c, sums[c - begin], accumulate);
}

/* The weight gradient comes first: din may then alias dout. */
gt_status gt_cpu_rmsnorm_backward(gt_backend *be, void *din, float *dweight, const void *dout, const void *in,
                                  const float *weight, int plus_one, const float *rstd, int64_t rows, int64_t cols,
                                  gt_dtype dt, int accumulate) {
    GT_TRY(check_rmsnorm(in, rows, cols, dt));
    if (dweight && !weight)  /* a NULL dweight with a weight: a frozen weight, no gradient */
        return GT_FAIL(GT_ERR_VALUE, "dweight: needs a weight (none given)");
    size_t n = (size_t)rows, c = (size_t)cols, blocks = (c + GT_RMS_COLS - 1) / GT_RMS_COLS;
    if (dweight) {
#pragma omp parallel for schedule(static) if (blocks > 1 && n * c > GT_CPU_CHUNK)
        for (size_t b = 0; b < blocks; b++) {
            size_t end = (b + 1) * GT_RMS_COLS < c ? (b + 1) * GT_RMS_COLS : c;
            rms_dweight_block(dweight, dout, in, rstd, n, c, b * GT_RMS_COLS, end, accumulate, dt);
        }
    }
    if (!din)
        return GT_OK;
#pragma omp parallel for schedule(static) if (n * c > GT_CPU_CHUNK)
    for (size_t r = 0; r < n; r++)
        gt_rms_din_row(din, dout, in, weight, plus_one, rstd, r, c, dt);
    return GT_OK;
}
