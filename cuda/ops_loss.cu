// CUDA losses: fused softmax + cross-entropy (label smoothing, ignore_index) and the mean squared
// error, with the CPU backend's formulas (cpu_xent.c, cpu_reduce.c). For a counted row with
// target t, C classes, smoothing e, m = max_j x_j and lse = m + log(sum_j exp(x_j - m)):
//   loss = (1 - e) (lse - x_t) + e (lse - mean_j x_j)
//   dlogits_j = (p_j - (1 - e) [j == t] - e / C) * dloss_scale / count,  p_j = exp(x_j - lse)
// The targets are counted and checked on the device first (integer atomics) and the count read
// back, so the call waits for the stream; *count (device memory) is then written in stream order. One block per row; its sums run in double, per thread
// in class order and then folded in a fixed tree, so every run gives the same bits (CUDA's expf
// and log differ from glibc's by a few ulp, so the CPU's bits are not reproduced exactly).
// mse follows the CPU's summation order exactly (fixed parts, GT_LANE_SUM), so its loss is
// bit-identical to the CPU's: *loss = sum (pred - target)^2 / n,
// dpred = (pred - target) * (float)(2 dloss_scale / n).
#include <math.h>

#include "ops_kernels.cuh"

namespace {

constexpr unsigned kRowThreads = 256;  // threads per row of the cross-entropy kernel

__global__ void count_targets_kernel(const int64_t *targets, size_t rows, int64_t classes, int64_t ignore_index,
                                     unsigned long long *words) {
    GT_GRID_STRIDE(r, rows) {
        int64_t t = targets[r];
        if (t == ignore_index)
            continue;
        if (t < 0 || t >= classes)
            atomicMin(&words[1], (unsigned long long)r);
        else
            atomicAdd(&words[0], 1ull);
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
    float grad_scale;      // dloss_scale / count
};

template <gt_dtype DT>
__global__ void softmax_xent_kernel(float *losses, void *dlogits, const void *logits, const int64_t *targets,
                                    size_t rows, XentRule rule) {
    __shared__ double fold_d[kRowThreads];
    __shared__ float fold_f[kRowThreads];
    const size_t classes = rule.classes;
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
            store_elem<DT>(dlogits, row + j, __fmul_rn(__fsub_rn(p, y), rule.grad_scale));
        }
    }
}

// Counts the rows not ignored into *count; fails with GT_ERR_INDEX naming the first bad target.
gt_status count_targets(const gt_cuda_backend_state *state, int64_t *count, const int64_t *targets, int64_t rows,
                        int64_t classes, int64_t ignore_index) {
    *count = 0;
    if (rows == 0)
        return GT_OK;
    cudaStream_t stream = stream_of(state);
    unsigned long long *words = scratch_words(state), host[2] = {0, 0};
    GT_CUDA_TRY(cudaMemsetAsync(&words[0], 0, sizeof words[0], stream), "cudaMemsetAsync");
    GT_CUDA_TRY(cudaMemsetAsync(&words[1], 0xff, sizeof words[1], stream), "cudaMemsetAsync");
    count_targets_kernel<<<grid_for((size_t)rows), kThreads, 0, stream>>>(targets, (size_t)rows, classes,
                                                                          ignore_index, words);
    GT_TRY(gt_cuda_check_launch("count_targets_kernel launch"));
    GT_CUDA_TRY(cudaMemcpyAsync(host, words, sizeof host, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    GT_CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (host[1] < (unsigned long long)rows) {
        int64_t target = 0;
        GT_CUDA_TRY(cudaMemcpyAsync(&target, targets + host[1], sizeof target, cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync");
        GT_CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        return GT_FAIL(GT_ERR_INDEX, "targets[%lld] = %lld is out of range [0, %lld) (ignore_index %lld)",
                       (long long)host[1], (long long)target, (long long)classes, (long long)ignore_index);
    }
    *count = (int64_t)host[0];
    return GT_OK;
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
__global__ void mse_grad_kernel(void *dpred, const void *pred, const float *target, size_t n, float grad_factor) {
    GT_GRID_STRIDE(i, n) {
        store_elem<DT>(dpred, i, __fmul_rn(__fsub_rn(load_elem<DT>(pred, i), target[i]), grad_factor));
    }
}

template <gt_dtype DT>
gt_status mse_sum(const gt_cuda_backend_state *state, const void *pred, const float *target, size_t n,
                  double *out) {
    return gt_cuda_fixed_order_sum(state, n, SquaredErrorTerm<DT>{pred, target}, out);
}

// Writes a host result into the op's output in device memory, in stream order. The source is
// pageable host memory, which cudaMemcpyAsync stages before it returns.
gt_status store_result(const gt_cuda_backend_state *state, void *device_dst, const void *host_src, size_t bytes) {
    GT_CUDA_TRY(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_of(state)),
                "cudaMemcpyAsync");
    return GT_OK;
}

}  // namespace

gt_status gt_cuda_softmax_xent(gt_backend *be, float *losses, int64_t *count, void *dlogits, const void *logits,
                               const int64_t *targets, int64_t rows, int64_t classes, float label_smoothing,
                               int64_t ignore_index, float dloss_scale, gt_dtype dt) {
    GT_TRY(check_xent(rows, classes, label_smoothing, dt));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows > 0) {
        GT_TRY(gt_op_check_ptr(targets, "targets"));
        GT_TRY(gt_op_check_ptr(losses, "losses"));
        GT_TRY(gt_op_check_ptr(logits, "logits"));
    }
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    int64_t counted = 0;
    GT_TRY(count_targets(state, &counted, targets, rows, classes, ignore_index));
    GT_TRY(store_result(state, count, &counted, sizeof counted));
    if (rows == 0)
        return GT_OK;
    XentRule rule = {(size_t)classes, label_smoothing, ignore_index,
                     counted > 0 ? dloss_scale / (float)counted : 0.0f};
    unsigned grid = (unsigned)((size_t)rows < kMaxBlocks ? (size_t)rows : kMaxBlocks);
    GT_LAUNCH_DT(dt, softmax_xent_kernel, grid, kRowThreads, 0, stream_of(state), losses, dlogits, logits, targets,
                 (size_t)rows, rule);
    return gt_cuda_check_launch("softmax_xent_kernel launch");
}

gt_status gt_cuda_mse(gt_backend *be, float *loss, void *dpred, const void *pred, const float *target, int64_t n,
                      float dloss_scale, gt_dtype dt) {
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    GT_TRY(gt_op_check_ptr(loss, "loss"));
    if (n < 1)
        return GT_FAIL(GT_ERR_VALUE, "n: the mean squared error needs n >= 1, got %lld", (long long)n);
    GT_TRY(gt_op_check_ptr(pred, "pred"));
    GT_TRY(gt_op_check_ptr(target, "target"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    double total = 0.0;
    switch (dt) {
    case GT_F16: GT_TRY(mse_sum<GT_F16>(state, pred, target, (size_t)n, &total)); break;
    case GT_BF16: GT_TRY(mse_sum<GT_BF16>(state, pred, target, (size_t)n, &total)); break;
    default: GT_TRY(mse_sum<GT_F32>(state, pred, target, (size_t)n, &total)); break;
    }
    if (dpred) {
        float grad_factor = (float)(2.0 * (double)dloss_scale / (double)n);
        GT_LAUNCH_DT(dt, mse_grad_kernel, grid_for((size_t)n), kThreads, 0, stream_of(state), dpred, pred, target,
                     (size_t)n, grad_factor);
        GT_TRY(gt_cuda_check_launch("mse_grad_kernel launch"));
    }
    float mean = (float)(total / (double)n);
    return store_result(state, loss, &mean, sizeof mean);
}
