// CUDA RMSNorm over the last dim of (rows, cols), on the math of ops/rmsnorm_hd.h that the CPU op
// runs too: one thread per row for the forward and din (the row's 8-lane double sums in the CPU's
// order), one thread per column for dweight (the rows added in order), so the results are the CPU
// op's bits. No atomics: the same bits on every run.
#include "ops/rmsnorm_hd.h"
#include "ops_kernels.cuh"

namespace {

template <gt_dtype DT>
__global__ void rmsnorm_forward_kernel(void *out, float *rstd, const void *in, const float *weight, int plus_one,
                                       size_t rows, size_t cols, float eps) {
    GT_GRID_STRIDE(r, rows)
    gt_rms_forward_row(out, rstd, in, weight, plus_one, r, cols, eps, DT);
}

template <gt_dtype DT>
__global__ void rmsnorm_din_kernel(void *din, const void *dout, const void *in, const float *weight,
                                   int plus_one, const float *rstd, size_t rows, size_t cols) {
    GT_GRID_STRIDE(r, rows)
    gt_rms_din_row(din, dout, in, weight, plus_one, rstd, r, cols, DT);
}

template <gt_dtype DT>
__global__ void rmsnorm_dweight_kernel(float *dweight, const void *dout, const void *in, const float *rstd,
                                       size_t rows, size_t cols, int accumulate) {
    GT_GRID_STRIDE(c, cols) {
        double sum = 0.0;
        for (size_t r = 0; r < rows; r++)
            sum += gt_rms_dweight_term(dout, in, rstd, r, c, cols, DT);
        gt_rms_dweight_store(dweight, c, sum, accumulate);
    }
}

gt_status check_rmsnorm(const void *in, int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (rows > 0 && cols == 0)
        return GT_FAIL(GT_ERR_VALUE, "cols: RMSNorm needs at least one column");
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(in, "in"));
    return GT_OK;
}

}  // namespace

gt_status gt_cuda_rmsnorm_forward(gt_backend *be, void *out, float *rstd, const void *in, const float *weight,
                                  int plus_one, int64_t rows, int64_t cols, float eps, gt_dtype dt) {
    GT_TRY(check_rmsnorm(in, rows, cols, dt));
    if (!(eps >= 0.0f))
        return GT_FAIL(GT_ERR_VALUE, "eps: must be >= 0, got %g", (double)eps);
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (rows == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(rstd, "rstd"));
    GT_LAUNCH_DT(dt, rmsnorm_forward_kernel, grid_for((size_t)rows), kThreads, 0, stream_of(state), out, rstd, in,
                 weight, plus_one, (size_t)rows, (size_t)cols, eps);
    return gt_cuda_check_launch("rmsnorm_forward_kernel launch");
}

// The weight gradient comes first: din may then alias dout, or be NULL (not wanted).
gt_status gt_cuda_rmsnorm_backward(gt_backend *be, void *din, float *dweight, const void *dout, const void *in,
                                   const float *weight, int plus_one, const float *rstd, int64_t rows, int64_t cols,
                                   gt_dtype dt,
                                   int accumulate) {
    GT_TRY(check_rmsnorm(in, rows, cols, dt));
    if (dweight && !weight)  /* a NULL dweight with a weight: a frozen weight, no gradient */
        return GT_FAIL(GT_ERR_VALUE, "dweight: needs a weight (none given)");
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    cudaStream_t stream = stream_of(state);
    if (dweight && cols > 0) {
        GT_LAUNCH_DT(dt, rmsnorm_dweight_kernel, grid_for((size_t)cols), kThreads, 0, stream, dweight, dout, in, rstd,
                     (size_t)rows, (size_t)cols, accumulate);
        GT_TRY(gt_cuda_check_launch("rmsnorm_dweight_kernel launch"));
    }
    if (rows == 0 || !din)
        return GT_OK;
    GT_LAUNCH_DT(dt, rmsnorm_din_kernel, grid_for((size_t)rows), kThreads, 0, stream, din, dout, in, weight, plus_one,
                 rstd, (size_t)rows, (size_t)cols);
    return gt_cuda_check_launch("rmsnorm_din_kernel launch");
}
