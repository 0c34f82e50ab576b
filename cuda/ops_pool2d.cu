// CUDA 2-D pooling of NCHW activations (ops.h, gt_pool2d_args) on the math of ops/pool2d_hd.h,
// which the CPU op runs too and a host harness checks in CI (tests/test_cnn_cuda_math.py).
//
//   forward   pool2d_forward_kernel: one thread per output, its window's maximum (and offset into
//             argmax) or average, as the CPU computes it;
//   backward  pool2d_backward_kernel: one thread per input element gathers the gradients of the
//             outputs whose windows hold it (MAX: whose maximum it is), in the order the CPU's
//             scatter adds them, in f32, rounded once into din.
// No thread writes what another writes: no atomics, no workspace, the CPU op's bits.
#include "ops/cnn_checks.h"
#include "ops/pool2d_hd.h"
#include "ops_kernels.cuh"

namespace {

template <gt_dtype DT>
__global__ void pool2d_forward_kernel(gt_pool2d_args a, size_t outputs) {
    const size_t plane_out = (size_t)(a.out_h * a.out_w);
    GT_GRID_STRIDE(k, outputs) {
        size_t p = k / plane_out, o = k % plane_out;
        int64_t oh = (int64_t)(o / (size_t)a.out_w), ow = (int64_t)(o % (size_t)a.out_w);
        gt_pool2d_span r = gt_pool2d_window(&a, 0, oh, a.h, a.out_h);
        gt_pool2d_span c = gt_pool2d_window(&a, 1, ow, a.w, a.out_w);
        gt_pool2d_output(&a, p * (size_t)(a.h * a.w), k, &r, &c, DT);
    }
}

template <gt_dtype DT>
__global__ void pool2d_backward_kernel(gt_pool2d_args a, size_t inputs) {
    const size_t plane = (size_t)(a.h * a.w);
    GT_GRID_STRIDE(k, inputs) {
        size_t p = k / plane, at = k % plane;
        float g = gt_pool2d_gather(&a, p, (int64_t)(at / (size_t)a.w), (int64_t)(at % (size_t)a.w), DT);
        gt_hd_store(a.din, k, g, DT);
    }
}

}  // namespace

// The device gathers in registers: no scratch.
size_t gt_cuda_pool2d_workspace_bytes(const gt_pool2d_args *args, int threads) {
    (void)args;
    (void)threads;
    return 0;
}

gt_status gt_cuda_pool2d_forward(gt_backend *be, const gt_pool2d_args *args) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_pool2d_check(args, 0));
    GT_TRY(gt_cuda_op_begin(be, &state));
    size_t outputs = (size_t)(args->n * args->c * args->out_h * args->out_w);
    if (outputs == 0)
        return GT_OK;
    GT_LAUNCH_DT(args->dt, pool2d_forward_kernel, grid_for(outputs), kThreads, 0, stream_of(state), *args,
                 outputs);
    return gt_cuda_check_launch("pool2d_forward_kernel launch");
}

gt_status gt_cuda_pool2d_backward(gt_backend *be, const gt_pool2d_args *args) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_pool2d_check(args, 1));
    GT_TRY(gt_cuda_op_begin(be, &state));
    size_t inputs = (size_t)(args->n * args->c * args->h * args->w);
    if (inputs == 0)
        return GT_OK;
    GT_LAUNCH_DT(args->dt, pool2d_backward_kernel, grid_for(inputs), kThreads, 0, stream_of(state), *args,
                 inputs);
    return gt_cuda_check_launch("pool2d_backward_kernel launch");
}
