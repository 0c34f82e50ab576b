// CUDA dropout: out = in * mask * gt_dropout_scale(p), the mask drawn by the rule of core/dropout.h (the CPU
// backend's code): element g = offset + i uses word g % 4 of
// gt_philox_random4(seed, layer, step, g / 4). One thread per Philox group of four elements,
// so each group's four words are drawn once; the groups cut by the range ends skip the
// elements outside it. The masks are bit-identical to the CPU's; backward regenerates them.
#include "core/dropout.h"
#include "ops_kernels.cuh"

namespace {

template <gt_dtype DT>
__global__ void dropout_kernel(void *out, const void *in, size_t n, gt_dropout_key key, float p, float scale) {
    const uint64_t first = key.offset, last = key.offset + n;  // global element range [first, last)
    const uint64_t group_begin = first / 4u, group_end = (last + 3u) / 4u;
    GT_GRID_STRIDE(t, (size_t)(group_end - group_begin)) {
        uint64_t group = group_begin + t;
        uint32_t words[4];
        gt_philox_random4(key.seed, key.layer, key.step, group, words);
        for (unsigned j = 0; j < 4; j++) {
            uint64_t g = group * 4u + j;
            if (g < first || g >= last)
                continue;
            size_t i = (size_t)(g - first);
            store_elem<DT>(out, i, load_elem<DT>(in, i) * gt_dropout_factor(words[j], p, scale));
        }
    }
}

gt_status dropout_apply(gt_backend *be, void *out, const void *in, int64_t n, double p, const gt_dropout_key &key,
                        gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (!(p >= 0.0 && p <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "p: dropout probability must be in [0, 1], got %g", p);
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    uint64_t groups = (key.offset + (uint64_t)n + 3u) / 4u - key.offset / 4u;
    GT_LAUNCH_DT(dt, dropout_kernel, grid_for((size_t)groups), kThreads, 0, stream_of(state), out, in, (size_t)n,
                 key, (float)p, gt_dropout_scale(p));
    return gt_cuda_check_launch("dropout_kernel launch");
}

}  // namespace

gt_status gt_cuda_dropout_forward(gt_backend *be, void *out, const void *in, int64_t n, double p, gt_dropout_key key,
                                  gt_dtype dt) {
    return dropout_apply(be, out, in, n, p, key, dt);
}

gt_status gt_cuda_dropout_backward(gt_backend *be, void *din, const void *dout, int64_t n, double p,
                                   gt_dropout_key key, gt_dtype dt) {
    // A NULL din: the input gradient is not wanted; only the arguments are checked.
    return dropout_apply(be, din, dout, din ? n : 0, p, key, dt);
}
