// CUDA elementwise ops: bias add, activations (forward and backward), the residual add. Each
// element is loaded into f32, computed with the shared element math of core/activation.h (the
// CPU backend's code, dispatched by ops/activation_hd.h) and rounded once into the activation
// dtype; and the scale by a constant (the Scale layer). Outputs may alias inputs: every thread
// reads its element before writing it.
#include "ops/activation_hd.h"
#include "ops_kernels.cuh"

namespace {

template <gt_dtype DT>
__global__ void bias_add_kernel(void *out, const float *bias, size_t rows, size_t cols) {
    GT_GRID_STRIDE(i, rows * cols) {
        store_elem<DT>(out, i, load_elem<DT>(out, i) + bias[i % cols]);
    }
}

template <gt_dtype DT>
__global__ void activation_forward_kernel(void *out, const void *in, size_t n, gt_activation act) {
    GT_GRID_STRIDE(i, n) {
        store_elem<DT>(out, i, gt_activation_value(act, load_elem<DT>(in, i)));
    }
}

template <gt_dtype DT>
__global__ void activation_backward_kernel(void *din, const void *dout, const void *in, size_t n,
                                           gt_activation act) {
    GT_GRID_STRIDE(i, n) {
        store_elem<DT>(din, i, gt_activation_grad(act, load_elem<DT>(dout, i), load_elem<DT>(in, i)));
    }
}

template <gt_dtype DT>
__global__ void add_kernel(void *out, const void *a, const void *b, size_t n) {
    GT_GRID_STRIDE(i, n) {
        store_elem<DT>(out, i, load_elem<DT>(a, i) + load_elem<DT>(b, i));
    }
}

template <gt_dtype DT>
__global__ void scale_kernel(void *out, const void *in, size_t n, float factor) {
    GT_GRID_STRIDE(i, n) {
        store_elem<DT>(out, i, load_elem<DT>(in, i) * factor);
    }
}

gt_status check_activation(gt_activation act, int64_t n, gt_dtype dt) {
    if ((int)act < GT_ACT_RELU || (int)act > GT_ACT_SILU)
        return GT_FAIL(GT_ERR_VALUE, "act: unknown activation %d", (int)act);
    GT_TRY(gt_op_check_size(n, "n"));
    return gt_op_check_dtype(dt, "dt");
}

}  // namespace

gt_status gt_cuda_bias_add(gt_backend *be, void *out, const float *bias, int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (rows == 0 || cols == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(bias, "bias"));
    size_t n = (size_t)rows * (size_t)cols;
    GT_LAUNCH_DT(dt, bias_add_kernel, grid_for(n), kThreads, 0, stream_of(state), out, bias, (size_t)rows,
                 (size_t)cols);
    return gt_cuda_check_launch("bias_add_kernel launch");
}

gt_status gt_cuda_activation_forward(gt_backend *be, void *out, const void *in, int64_t n, gt_activation act,
                                     gt_dtype dt) {
    GT_TRY(check_activation(act, n, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    GT_LAUNCH_DT(dt, activation_forward_kernel, grid_for((size_t)n), kThreads, 0, stream_of(state), out, in,
                 (size_t)n, act);
    return gt_cuda_check_launch("activation_forward_kernel launch");
}

gt_status gt_cuda_activation_backward(gt_backend *be, void *din, const void *dout, const void *in, int64_t n,
                                      gt_activation act, gt_dtype dt) {
    GT_TRY(check_activation(act, n, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0 || !din)  // a NULL din: the input gradient is not wanted
        return GT_OK;
    GT_TRY(gt_op_check_ptr(din, "din"));
    GT_TRY(gt_op_check_ptr(dout, "dout"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    GT_LAUNCH_DT(dt, activation_backward_kernel, grid_for((size_t)n), kThreads, 0, stream_of(state), din, dout, in,
                 (size_t)n, act);
    return gt_cuda_check_launch("activation_backward_kernel launch");
}

gt_status gt_cuda_add(gt_backend *be, void *out, const void *a, const void *b, int64_t n, gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(a, "a"));
    GT_TRY(gt_op_check_ptr(b, "b"));
    GT_LAUNCH_DT(dt, add_kernel, grid_for((size_t)n), kThreads, 0, stream_of(state), out, a, b, (size_t)n);
    return gt_cuda_check_launch("add_kernel launch");
}

gt_status gt_cuda_scale(gt_backend *be, void *out, const void *in, int64_t n, float factor, gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (!isfinite(factor))
        return GT_FAIL(GT_ERR_VALUE, "factor: must be finite, got %g", (double)factor);
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    GT_LAUNCH_DT(dt, scale_kernel, grid_for((size_t)n), kThreads, 0, stream_of(state), out, in, (size_t)n, factor);
    return gt_cuda_check_launch("scale_kernel launch");
}
