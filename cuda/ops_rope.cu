// CUDA rotary position embedding (ops.h, gt_rope_args): rope_kernel runs the element math of
// ops/rope_hd.h, the GT_HD code the CPU op runs and a host harness checks in CI
// (tests/test_rope_cuda_math.py), since no GPU checks this file before it ships.
//
// One thread per column (b, t, i) of gt_rope_column: a rotated pair for every head, or one
// passed-through element for every head of an out-of-place call. No two threads write the same
// element; every operation is rounded once (--fmad=false), so the results are the CPU op's bits
// up to the double cos/sin's last ulp (rope_hd.h).
#include "ops/rope.h"
#include "ops/rope_hd.h"
#include "ops_kernels.cuh"

namespace {

__global__ void rope_kernel(gt_rope_args a, size_t rows, size_t columns, int backward) {
    const size_t seq = (size_t)a.seq;
    GT_GRID_STRIDE(u, rows * columns) {
        size_t r = u / columns;
        gt_rope_column(&a, r / seq, r % seq, u % columns, backward);
    }
}

gt_status rope_launch(gt_backend *be, const gt_rope_args *args, int backward) {
    GT_TRY(gt_rope_check(args));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    size_t rows = (size_t)args->batch * (size_t)args->seq;
    if (rows == 0 || args->heads == 0)
        return GT_OK;
    size_t columns = gt_rope_columns(args);
    rope_kernel<<<grid_for(rows * columns), kThreads, 0, stream_of(state)>>>(*args, rows, columns, backward);
    return gt_cuda_check_launch("rope_kernel launch");
}

}  // namespace

gt_status gt_cuda_rope_forward(gt_backend *be, const gt_rope_args *args) { return rope_launch(be, args, 0); }

gt_status gt_cuda_rope_backward(gt_backend *be, const gt_rope_args *args) { return rope_launch(be, args, 1); }
