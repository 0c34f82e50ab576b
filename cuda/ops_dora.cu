// CUDA DoRA ops (ops.h: dora_norm, dora_combine, col_scale, dora_magnitude_backward): each thread
// runs the per-row, per-element or per-column function of ops/dora_hd.h, the CPU op's code, so the
// sums keep the CPU's order (one thread per row or column; DoRA's matrices are one layer's weight
// and one micro-batch's activations). Compiled for CI, not run on a GPU.
#include "ops/dora_hd.h"
#include "ops_kernels.cuh"

namespace {

__global__ void dora_norm_kernel(float *scale, float *norm, const float *w, const float *magnitude, size_t rows,
                                 size_t cols) {
    GT_GRID_STRIDE(r, rows) {
        gt_dora_norm_row(scale, norm, w, magnitude, r, cols);
    }
}

template <gt_dtype DT>
__global__ void dora_combine_kernel(void *out, const void *u, const void *v, const float *scale, float scaling,
                                    size_t n, size_t cols) {
    GT_GRID_STRIDE(e, n) {
        gt_dora_combine_element(out, u, v, scale, scaling, e, cols, DT);
    }
}

template <gt_dtype DT>
__global__ void col_scale_kernel(void *out, const void *in, const float *scale, float offset, size_t n, size_t cols) {
    GT_GRID_STRIDE(e, n) {
        gt_col_scale_element(out, in, scale, offset, e, cols, DT);
    }
}

template <gt_dtype DT>
__global__ void dora_magnitude_backward_kernel(float *dmagnitude, const void *dout, const void *u, const void *v,
                                               const float *norm, float scaling, size_t rows, size_t cols,
                                               int accumulate) {
    GT_GRID_STRIDE(c, cols) {
        gt_dora_magnitude_column(dmagnitude, dout, u, v, norm, scaling, c, rows, cols, DT, accumulate);
    }
}

}  // namespace

gt_status gt_cuda_dora_norm(gt_backend *be, float *scale, float *norm, const float *w, const float *magnitude,
                            int64_t rows, int64_t cols) {
    GT_TRY(gt_dora_norm_check(scale, norm, w, magnitude, rows, cols));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (rows == 0)
        return GT_OK;
    dora_norm_kernel<<<grid_for((size_t)rows), kThreads, 0, stream_of(state)>>>(scale, norm, w, magnitude,
                                                                                 (size_t)rows, (size_t)cols);
    return gt_cuda_check_launch("dora_norm_kernel launch");
}

gt_status gt_cuda_dora_combine(gt_backend *be, void *out, const void *u, const void *v, const float *scale,
                               float scaling, int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_dora_combine_check(out, u, v, scale, rows, cols, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (rows == 0 || cols == 0)
        return GT_OK;
    size_t n = (size_t)rows * (size_t)cols;
    GT_LAUNCH_DT(dt, dora_combine_kernel, grid_for(n), kThreads, 0, stream_of(state), out, u, v, scale, scaling, n,
                 (size_t)cols);
    return gt_cuda_check_launch("dora_combine_kernel launch");
}

gt_status gt_cuda_col_scale(gt_backend *be, void *out, const void *in, const float *scale, float offset,
                            int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_col_scale_check(out, in, scale, rows, cols, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (rows == 0 || cols == 0)
        return GT_OK;
    size_t n = (size_t)rows * (size_t)cols;
    GT_LAUNCH_DT(dt, col_scale_kernel, grid_for(n), kThreads, 0, stream_of(state), out, in, scale, offset, n,
                 (size_t)cols);
    return gt_cuda_check_launch("col_scale_kernel launch");
}

gt_status gt_cuda_dora_magnitude_backward(gt_backend *be, float *dmagnitude, const void *dout, const void *u,
                                          const void *v, const float *norm, float scaling, int64_t rows,
                                          int64_t cols, gt_dtype dt, int accumulate) {
    GT_TRY(gt_dora_magnitude_backward_check(dmagnitude, dout, u, v, norm, rows, cols, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (cols == 0)
        return GT_OK;
    GT_LAUNCH_DT(dt, dora_magnitude_backward_kernel, grid_for((size_t)cols), kThreads, 0, stream_of(state),
                 dmagnitude, dout, u, v, norm, scaling, (size_t)rows, (size_t)cols, accumulate);
    return gt_cuda_check_launch("dora_magnitude_backward_kernel launch");
}
