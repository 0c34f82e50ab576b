// CUDA losses: fused softmax + cross-entropy (label smoothing, ignore_index) and the mean squared
// error, with the CPU backend's formulas (cpu_xent.c, cpu_reduce.c). For a counted row with
// target t, C classes, smoothing e, m = max_j x_j and lse = m + log(sum_j exp(x_j - m)):
//   loss = (1 - e) (lse - x_t) + e (lse - mean_j x_j)
//   dlogits_j = (p_j - (1 - e) [j == t] - e / C) * dloss_scale / count,  p_j = exp(x_j - lse)
// Nothing is read back: the targets are checked on the device (a bad one goes to the backend's
// error slot, reported at the stream's next wait, and the loss kernel then skips its work) and
// counted into *count (device memory), which the loss kernel reads for its gradient scale. One
// block per row; its sums run in double, per thread
// in class order and then folded in a fixed tree, so every run gives the same bits (the CPU sums
// in GT_LANE_SUM's lanes with gt_vm_expf, and CUDA's expf and log differ from those by a few ulp,
// so the CPU's bits are not reproduced exactly).
// mse follows the CPU's summation order exactly (fixed parts, GT_LANE_SUM), so its loss is
// bit-identical to the CPU's: *loss = sum (pred - target)^2 / n (its parts added on the device in
// the host's order), dpred = (pred - target) * (float)(2 dloss_scale / n). dloss_scale is
// gt_dloss_scale of the loss scale, read by the kernels (a scaler's scale in device memory).
#include <math.h>

#include "core/loss_mean.h"
#include "ops/rdrop_hd.h"
#include "ops_kernels.cuh"

namespace {

constexpr unsigned kRowThreads = 256;  // threads per row of the cross-entropy kernel

// *count += the rows whose target is in [0, classes) and not ignore_index.
__global__ void count_targets_kernel(const int64_t *targets, size_t rows, int64_t classes, int64_t ignore_index,
                                     unsigned long long *count) {
    GT_GRID_STRIDE(r, rows) {
        int64_t t = targets[r];
        if (t != ignore_index && t >= 0 && t < classes)
            atomicAdd(count, 1ull);
    }
}

// Block-wide fold of one value per thread in a fixed tree order; the result is in shared[0]
// (every thread reads it after the final barrier).
template <typename T, typename Combine>
__device__ T block_fold(T *shared, T value, Combine combine) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (unsigned width = kRowThreads / 2; width >= 1; width /= 2) {
        if (threadIdx.x < width)
            shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + width]);
        __syncthreads();
    }
    T result = shared[0];
    __syncthreads();  // shared may be reused by the next fold
    return result;
}

// The smoothing parameters of one call.
struct XentRule {
    size_t classes;        // C
    float smoothing;       // e in [0, 1]
    int64_t ignore_index;  // targets equal to it are skipped
    const float *loss_scale;  // device memory, or NULL (1): see gt_dloss_scale
    float dloss_divisor;      // the loss scale's divisor (micro-batches)
};

template <gt_dtype DT>
__global__ void softmax_xent_kernel(float *losses, void *dlogits, const void *logits, const int64_t *targets,
                                    const int64_t *count, const unsigned long long *first_bad, size_t rows,
                                    XentRule rule) {
    __shared__ double fold_d[kRowThreads];
    __shared__ float fold_f[kRowThreads];
    if (gt_check_failed(first_bad))
        return;
    const size_t classes = rule.classes;
    const float grad_scale =
        *count > 0 ? __fdiv_rn(gt_dloss_scale(rule.loss_scale, rule.dloss_divisor), (float)*count) : 0.0f;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const size_t row = r * classes;
        const int64_t t = targets[r];
        if (t == rule.ignore_index) {
            if (threadIdx.x == 0)
                losses[r] = 0.0f;
            for (size_t j = threadIdx.x; dlogits && j < classes; j += kRowThreads)
                store_elem<DT>(dlogits, row + j, 0.0f);
            continue;
        }
        const float x_t = load_elem<DT>(logits, row + (size_t)t);  // read before any dlogits write
        float m = -INFINITY;
        for (size_t j = threadIdx.x; j < classes; j += kRowThreads) {
            float x = load_elem<DT>(logits, row + j);
            m = x > m ? x : m;
        }
        m = block_fold(fold_f, m, [](float a, float b) { return b > a ? b : a; });
        double sum_exp = 0.0, sum_x = 0.0;
        for (size_t j = threadIdx.x; j < classes; j += kRowThreads) {
            float x = load_elem<DT>(logits, row + j);
            sum_exp = __dadd_rn(sum_exp, (double)expf(__fsub_rn(x, m)));
            sum_x = __dadd_rn(sum_x, (double)x);
        }
        auto add = [](double a, double b) { return __dadd_rn(a, b); };
        sum_exp = block_fold(fold_d, sum_exp, add);
        sum_x = block_fold(fold_d, sum_x, add);
        const double lse = __dadd_rn((double)m, log(sum_exp));
        if (threadIdx.x == 0) {
            double nll = __dsub_rn(lse, (double)x_t);
            double smooth = __dsub_rn(lse, __ddiv_rn(sum_x, (double)classes));
            double e = (double)rule.smoothing;
            losses[r] = __double2float_rn(__dadd_rn(__dmul_rn(__dsub_rn(1.0, e), nll), __dmul_rn(e, smooth)));
        }
        if (!dlogits)
            continue;
        const float inv_sum = __double2float_rn(__ddiv_rn(1.0, sum_exp));
        const float off = __fdiv_rn(rule.smoothing, (float)classes);
        const float on = __fadd_rn(__fsub_rn(1.0f, rule.smoothing), off);
        for (size_t j = threadIdx.x; j < classes; j += kRowThreads) {
            float p = __fmul_rn(expf(__fsub_rn(load_elem<DT>(logits, row + j), m)), inv_sum);
            float y = j == (size_t)t ? on : off;
            store_elem<DT>(dlogits, row + j, __fmul_rn(__fsub_rn(p, y), grad_scale));
        }
    }
}

// Queues the check of the targets (into the backend's error slot) and their count into *count
// (device memory; the rows not ignored), in stream order.
gt_status count_targets(const gt_cuda_backend_state *state, int64_t *count, const int64_t *targets, int64_t rows,
                        int64_t classes, int64_t ignore_index) {
    cudaStream_t stream = stream_of(state);
    unsigned long long *counted = reinterpret_cast<unsigned long long *>(count);  // the same 64 bits
    GT_CUDA_TRY(cudaMemsetAsync(counted, 0, sizeof *counted, stream), "cudaMemsetAsync");
    gt_cuda_op_error error = {GT_CUDA_CHECK_TARGETS, 0, 0, classes, ignore_index};
    GT_TRY(gt_cuda_check_entries(state, targets, (size_t)rows, error));
    if (rows == 0)
        return GT_OK;
    count_targets_kernel<<<grid_for((size_t)rows), kThreads, 0, stream>>>(targets, (size_t)rows, classes,
                                                                          ignore_index, counted);
    return gt_cuda_check_launch("count_targets_kernel launch");
}

gt_status check_xent(int64_t rows, int64_t classes, float label_smoothing, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (classes < 1)
        return GT_FAIL(GT_ERR_VALUE, "classes: must be >= 1, got %lld", (long long)classes);
    if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
        return GT_FAIL(GT_ERR_VALUE, "label_smoothing: must be in [0, 1], got %g", (double)label_smoothing);
    return GT_OK;
}

// One term of the squared error: (double)(pred - target)^2, the difference taken in f32.
template <gt_dtype DT>
struct SquaredErrorTerm {
    const void *pred;     // (n,) dtype DT
    const float *target;  // (n,)
    __device__ double operator()(size_t k) const {
        double d = (double)__fsub_rn(load_elem<DT>(pred, k), target[k]);
        return __dmul_rn(d, d);
    }
};

template <gt_dtype DT>
__global__ void mse_grad_kernel(void *dpred, const void *pred, const float *target, size_t n, const float *loss_scale,
                                float dloss_divisor) {
    const float grad_factor = gt_mse_grad_factor(gt_dloss_scale(loss_scale, dloss_divisor), (int64_t)n);
    GT_GRID_STRIDE(i, n) {
        store_elem<DT>(dpred, i, __fmul_rn(__fsub_rn(load_elem<DT>(pred, i), target[i]), grad_factor));
    }
}

// One thread: *loss = (float)(the parts added in part order / n), as the host's add_parts would.
__global__ void mean_of_parts_kernel(float *loss, const double *parts, size_t num_parts, size_t n) {
    double total = 0.0;
    for (size_t p = 0; p < num_parts; p++)
        total = __dadd_rn(total, parts[p]);
    *loss = __double2float_rn(__ddiv_rn(total, (double)n));
}

// Queues *loss = the mean squared error (nothing is read back).
template <gt_dtype DT>
gt_status mse_mean(const gt_cuda_backend_state *state, float *loss, const void *pred, const float *target,
                   size_t n) {
    size_t num_parts = 0;
    GT_TRY(gt_cuda_fixed_order_parts(state, n, SquaredErrorTerm<DT>{pred, target}, &num_parts));
    mean_of_parts_kernel<<<1, 1, 0, stream_of(state)>>>(loss, scratch_parts(state), num_parts, n);
    return gt_cuda_check_launch("mean_of_parts_kernel launch");
}

}  // namespace

gt_status gt_cuda_softmax_xent(gt_backend *be, float *losses, int64_t *count, void *dlogits, const void *logits,
                               const int64_t *targets, int64_t rows, int64_t classes, float label_smoothing,
                               int64_t ignore_index, const float *loss_scale, float dloss_divisor, gt_dtype dt) {
    GT_TRY(check_xent(rows, classes, label_smoothing, dt));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows > 0) {
        GT_TRY(gt_op_check_ptr(targets, "targets"));
        GT_TRY(gt_op_check_ptr(losses, "losses"));
        GT_TRY(gt_op_check_ptr(logits, "logits"));
    }
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    GT_TRY(count_targets(state, count, targets, rows, classes, ignore_index));
    if (rows == 0)
        return GT_OK;
    XentRule rule = {(size_t)classes, label_smoothing, ignore_index, loss_scale, dloss_divisor};
    unsigned grid = (unsigned)((size_t)rows < kMaxBlocks ? (size_t)rows : kMaxBlocks);
    GT_LAUNCH_DT(dt, softmax_xent_kernel, grid, kRowThreads, 0, stream_of(state), losses, dlogits, logits, targets,
                 count, scratch_words(state), (size_t)rows, rule);
    return gt_cuda_check_launch("softmax_xent_kernel launch");
}

gt_status gt_cuda_xent_count(gt_backend *be, int64_t *count, const int64_t *targets, int64_t rows, int64_t classes,
                             int64_t ignore_index) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(targets, "targets"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    return count_targets(state, count, targets, rows, classes, ignore_index);
}

// softmax_xent's kernel over rows whose targets xent_count counted (and checked: a bad one left
// the error slot set, so the kernel skips its work), with the given count's gradient scale.
gt_status gt_cuda_softmax_xent_counted(gt_backend *be, float *losses, const int64_t *count, void *dlogits,
                                       const void *logits, const int64_t *targets, int64_t rows, int64_t classes,
                                       float label_smoothing, int64_t ignore_index, const float *loss_scale,
                                       float dloss_divisor, gt_dtype dt) {
    GT_TRY(check_xent(rows, classes, label_smoothing, dt));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(targets, "targets"));
    GT_TRY(gt_op_check_ptr(losses, "losses"));
    GT_TRY(gt_op_check_ptr(logits, "logits"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    gt_cuda_op_error error = {GT_CUDA_CHECK_TARGETS, 0, 0, classes, ignore_index};
    GT_TRY(gt_cuda_check_entries(state, targets, (size_t)rows, error));
    XentRule rule = {(size_t)classes, label_smoothing, ignore_index, loss_scale, dloss_divisor};
    unsigned grid = (unsigned)((size_t)rows < kMaxBlocks ? (size_t)rows : kMaxBlocks);
    GT_LAUNCH_DT(dt, softmax_xent_kernel, grid, kRowThreads, 0, stream_of(state), losses, dlogits, logits, targets,
                 count, scratch_words(state), (size_t)rows, rule);
    return gt_cuda_check_launch("softmax_xent_kernel launch");
}

gt_status gt_cuda_mse(gt_backend *be, float *loss, void *dpred, const void *pred, const float *target, int64_t n,
                      const float *loss_scale, float dloss_divisor, gt_dtype dt) {
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    GT_TRY(gt_op_check_ptr(loss, "loss"));
    if (n < 1)
        return GT_FAIL(GT_ERR_VALUE, "n: the mean squared error needs n >= 1, got %lld", (long long)n);
    GT_TRY(gt_op_check_ptr(pred, "pred"));
    GT_TRY(gt_op_check_ptr(target, "target"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    switch (dt) {
    case GT_F16: GT_TRY(mse_mean<GT_F16>(state, loss, pred, target, (size_t)n)); break;
    case GT_BF16: GT_TRY(mse_mean<GT_BF16>(state, loss, pred, target, (size_t)n)); break;
    default: GT_TRY(mse_mean<GT_F32>(state, loss, pred, target, (size_t)n)); break;
    }
    if (dpred) {
        GT_LAUNCH_DT(dt, mse_grad_kernel, grid_for((size_t)n), kThreads, 0, stream_of(state), dpred, pred, target,
                     (size_t)n, loss_scale, dloss_divisor);
        return gt_cuda_check_launch("mse_grad_kernel launch");
    }
    return GT_OK;
}

// R-Drop's loss (ops.h softmax_xent_rdrop): one thread per pair of rows running the CPU op's
// per-pair math (ops/rdrop_hd.h) in the same order, so only CUDA's exp/log make the bits differ.
// One thread per pair keeps the two rows' reductions in class order, as the CPU's; it is fine for
// classification heads, slow for a large vocabulary (a block per pair would fold in a tree).
namespace {

__global__ void softmax_xent_rdrop_kernel(float *losses, void *dlogits, const void *logits, const int64_t *targets,
                                          const int64_t *count, const unsigned long long *first_bad, size_t pairs,
                                          gt_rdrop_rule rule, const float *loss_scale, float dloss_divisor,
                                          gt_dtype dt) {
    if (gt_check_failed(first_bad))
        return;
    rule.grad_scale = *count > 0 ? __fdiv_rn(gt_dloss_scale(loss_scale, dloss_divisor), (float)*count) : 0.0f;
    GT_GRID_STRIDE(a, pairs) {
        gt_rdrop_pair(losses, dlogits, logits, targets, a, &rule, dt);
    }
}

}  // namespace

gt_status gt_cuda_softmax_xent_rdrop(gt_backend *be, float *losses, int64_t *count, void *dlogits, const void *logits,
                                     const int64_t *targets, int64_t rows, int64_t classes, float label_smoothing,
                                     int64_t ignore_index, float alpha, const float *loss_scale, float dloss_divisor,
                                     gt_dtype dt) {
    GT_TRY(check_xent(rows, classes, label_smoothing, dt));
    if (rows % 2 != 0)
        return GT_FAIL(GT_ERR_VALUE, "rows: R-Drop pairs row r with row r + rows/2, so rows must be even, got %lld",
                       (long long)rows);
    if (!(alpha >= 0.0f && isfinite(alpha)))
        return GT_FAIL(GT_ERR_VALUE, "rdrop_alpha: must be a finite number >= 0, got %g", (double)alpha);
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (dlogits && dlogits == logits)
        return GT_FAIL(GT_ERR_VALUE, "dlogits: must not alias logits (a pair's gradient reads both rows)");
    if (rows > 0) {
        GT_TRY(gt_op_check_ptr(targets, "targets"));
        GT_TRY(gt_op_check_ptr(losses, "losses"));
        GT_TRY(gt_op_check_ptr(logits, "logits"));
    }
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    GT_TRY(count_targets(state, count, targets, rows, classes, ignore_index));
    if (rows == 0)
        return GT_OK;
    size_t pairs = (size_t)rows / 2;
    gt_rdrop_rule rule = {(size_t)classes, pairs, label_smoothing, alpha, ignore_index, 0.0f};
    softmax_xent_rdrop_kernel<<<grid_for(pairs), kThreads, 0, stream_of(state)>>>(
        losses, dlogits, logits, targets, count, scratch_words(state), pairs, rule, loss_scale, dloss_divisor, dt);
    return gt_cuda_check_launch("softmax_xent_rdrop_kernel launch");
}
