// CUDA gated activation (ops.h, glu_forward / glu_backward: SwiGLU, GeGLU, ...): one thread per
// element (r, i) of out, running the per-thread function of ops/glu_hd.h -- the CPU op's element
// math, checked on the host by tests/test_glu_cuda_math.py since no GPU checks this file before
// it ships. Every operation is rounded once (--fmad=false) and the activations are
// core/activation.h's, so the results are the CPU op's bits.
#include "ops/glu_hd.h"
#include "ops_kernels.cuh"

namespace {

template <gt_dtype DT>
__global__ void glu_forward_kernel(void *out, const void *in, size_t n, size_t inter, gt_activation act) {
    GT_GRID_STRIDE(e, n) {
        gt_glu_forward_element(out, in, e, inter, act, DT);
    }
}

template <gt_dtype DT>
__global__ void glu_backward_kernel(void *din, const void *dout, const void *in, size_t n, size_t inter,
                                    gt_activation act) {
    GT_GRID_STRIDE(e, n) {
        gt_glu_backward_element(din, dout, in, e, inter, act, DT);
    }
}

gt_status check_glu(int64_t rows, int64_t inter, gt_activation act, gt_dtype dt) {
    if ((int)act < GT_ACT_RELU || (int)act > GT_ACT_SILU)
        return GT_FAIL(GT_ERR_VALUE, "act: unknown activation %d", (int)act);
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(inter, "inter"));
    return gt_op_check_dtype(dt, "dt");
}

}  // namespace

gt_status gt_cuda_glu_forward(gt_backend *be, void *out, const void *in, int64_t rows, int64_t inter,
                              gt_activation act, gt_dtype dt) {
    GT_TRY(check_glu(rows, inter, act, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (rows == 0 || inter == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    size_t n = (size_t)rows * (size_t)inter;
    GT_LAUNCH_DT(dt, glu_forward_kernel, grid_for(n), kThreads, 0, stream_of(state), out, in, n, (size_t)inter,
                 act);
    return gt_cuda_check_launch("glu_forward_kernel launch");
}

gt_status gt_cuda_glu_backward(gt_backend *be, void *din, const void *dout, const void *in, int64_t rows,
                               int64_t inter, gt_activation act, gt_dtype dt) {
    GT_TRY(check_glu(rows, inter, act, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (!din || rows == 0 || inter == 0)  // a NULL din: the input gradient is not wanted
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dout, "dout"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    size_t n = (size_t)rows * (size_t)inter;
    GT_LAUNCH_DT(dt, glu_backward_kernel, grid_for(n), kThreads, 0, stream_of(state), din, dout, in, n,
                 (size_t)inter, act);
    return gt_cuda_check_launch("glu_backward_kernel launch");
}
