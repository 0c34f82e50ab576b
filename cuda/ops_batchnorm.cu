// CUDA BatchNorm over the channels of (N, C, HW) (ops.h, gt_batchnorm_args), on the per-channel
// math of ops/batchnorm_hd.h that the CPU op runs too and a host harness checks in CI
// (tests/test_cnn_cuda_math.py), since no GPU checks this file before it ships.
//
// One block per channel (grid-stride over channels). Its threads sum the channel's (n, c) planes
// in parallel, each plane in the CPU's 8-lane order, and thread 0 adds the plane sums in
// increasing n: the CPU's double sums to the bit. Thread 0 then forms the channel's terms (the
// saved statistics and the running update, or the parameter gradients), and the block writes the
// channel's outputs. No atomics: the same bits on every run, and the CPU op's bits.
// update_running first counts the batch on the device (batchnorm_count_kernel), so that
// momentum < 0 reads the new count in stream order.
#include "ops/batchnorm_hd.h"
#include "ops/cnn_checks.h"
#include "ops_kernels.cuh"

namespace {

constexpr unsigned kBnThreads = 256;  // threads (planes summed at once) per channel block

// totals[0:W] = the sums over the planes i < n of plane(i, values) (W values each), added in
// increasing i from 0 (the CPU's order); parts is the block's kBnThreads x W shared scratch.
// Every thread of the block calls it; totals (shared) is valid in all of them afterwards.
template <int W, typename Plane>
__device__ void channel_totals(size_t n, Plane plane, double (*parts)[W], double *totals) {
    double acc[W];
    for (int v = 0; v < W; v++)
        acc[v] = 0.0;
    for (size_t i0 = 0; i0 < n; i0 += blockDim.x) {
        if (i0 + threadIdx.x < n)
            plane(i0 + threadIdx.x, parts[threadIdx.x]);
        __syncthreads();
        size_t m = n - i0 < blockDim.x ? n - i0 : blockDim.x;
        for (size_t j = 0; threadIdx.x == 0 && j < m; j++)
            for (int v = 0; v < W; v++)
                acc[v] += parts[j][v];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int v = 0; v < W; v++)
            totals[v] = acc[v];
    __syncthreads();
}

__global__ void batchnorm_count_kernel(int64_t *num_batches_tracked) { *num_batches_tracked += 1; }

template <gt_dtype DT>
__global__ void batchnorm_forward_kernel(gt_batchnorm_args a) {
    __shared__ double parts[kBnThreads][1];
    __shared__ double sums[2];  // sum x, sum (x - mean)^2
    __shared__ float terms[2];  // scale, shift
    const size_t n = (size_t)a.n, channels = (size_t)a.c, hw = (size_t)a.hw, m = n * hw;
    for (size_t c = blockIdx.x; c < channels; c += gridDim.x) {
        double mu = 0.0;
        if (a.batch_stats) {
            channel_totals<1>(n, [&](size_t i, double *v) {
                v[0] = gt_bn_plane_sum(a.in, gt_bn_at(i, c, channels, hw), hw, 0.0, 0, DT);
            }, parts, &sums[0]);
            mu = sums[0] / (double)m;
            channel_totals<1>(n, [&](size_t i, double *v) {
                v[0] = gt_bn_plane_sum(a.in, gt_bn_at(i, c, channels, hw), hw, mu, 1, DT);
            }, parts, &sums[1]);
        }
        if (threadIdx.x == 0) {
            double mean = a.batch_stats ? mu : (double)a.running_mean[c];
            double var = a.batch_stats ? sums[1] / (double)m : (double)a.running_var[c];
            double factor = a.update_running ? gt_bn_factor(a.momentum, *a.num_batches_tracked) : a.momentum;
            gt_bn_forward_channel(&a, c, mean, var, factor, &terms[0], &terms[1]);
        }
        __syncthreads();
        for (size_t k = threadIdx.x; k < m; k += blockDim.x)
            gt_bn_apply(a.out, a.in, gt_bn_at(k / hw, c, channels, hw) + k % hw, terms[0], terms[1], DT);
        __syncthreads();
    }
}

template <gt_dtype DT>
__global__ void batchnorm_backward_kernel(gt_batchnorm_args a) {
    __shared__ double parts[kBnThreads][2];
    __shared__ double sums[2];  // sum dout, sum dout (x - mean)
    __shared__ float terms[3];  // scale, shift, slope
    const size_t n = (size_t)a.n, channels = (size_t)a.c, hw = (size_t)a.hw, m = n * hw;
    for (size_t c = blockIdx.x; c < channels; c += gridDim.x) {
        const float mean = a.mean[c];
        channel_totals<2>(n, [&](size_t i, double *v) {
            gt_bn_grad_plane_sums(v, a.dout, a.in, mean, gt_bn_at(i, c, channels, hw), hw, DT);
        }, parts, sums);
        if (threadIdx.x == 0)
            gt_bn_backward_terms(&a, c, sums[0], sums[1], &terms[0], &terms[1], &terms[2]);
        __syncthreads();
        for (size_t k = threadIdx.x; a.din && k < m; k += blockDim.x)
            gt_bn_din(a.din, a.dout, a.in, gt_bn_at(k / hw, c, channels, hw) + k % hw, mean, terms[0],
                      terms[1], terms[2], DT);
        __syncthreads();
    }
}

// The backend's state after the shared checks; NULL: nothing to do (no channels).
gt_status batchnorm_begin(gt_backend *be, const gt_batchnorm_args *a, int forward,
                          gt_cuda_backend_state **state) {
    GT_TRY(gt_batchnorm_check(a, forward));
    GT_TRY(gt_cuda_op_begin(be, state));
    if (a->c == 0)
        *state = NULL;
    return GT_OK;
}

}  // namespace

gt_status gt_cuda_batchnorm_forward(gt_backend *be, const gt_batchnorm_args *args) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(batchnorm_begin(be, args, 1, &state));
    if (!state)
        return GT_OK;
    cudaStream_t stream = stream_of(state);
    if (args->update_running) {
        batchnorm_count_kernel<<<1, 1, 0, stream>>>(args->num_batches_tracked);
        GT_TRY(gt_cuda_check_launch("batchnorm_count_kernel launch"));
    }
    GT_LAUNCH_DT(args->dt, batchnorm_forward_kernel, grid_for((size_t)args->c, 1), kBnThreads, 0, stream, *args);
    return gt_cuda_check_launch("batchnorm_forward_kernel launch");
}

gt_status gt_cuda_batchnorm_backward(gt_backend *be, const gt_batchnorm_args *args) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(batchnorm_begin(be, args, 0, &state));
    if (!state)
        return GT_OK;
    GT_LAUNCH_DT(args->dt, batchnorm_backward_kernel, grid_for((size_t)args->c, 1), kBnThreads, 0,
                 stream_of(state), *args);
    return gt_cuda_check_launch("batchnorm_backward_kernel launch");
}
