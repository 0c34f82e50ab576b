// The optimizer's kernels. The element updates are the GT_HD
// functions of core/adamw.h, core/sgd.h and core/ema_math.h, whose arithmetic is spelled with
// __f*_rn intrinsics (core/fp_ops.h), so each element gets the same bits as on the CPU
// (csrc/train/optim_cpu.c is the reference). The sum of squares follows the fixed order of
// core/sumsq_order.h, so it also matches the CPU bit for bit.
#include <cuda_runtime.h>

#include <mutex>

#include "core/adamw.h"
#include "core/clip_rules.h"
#include "core/ema_math.h"
#include "core/loss_mean.h"
#include "core/sgd.h"
#include "core/sumsq_order.h"
#include "cuda_internal.cuh"
#include "optim_cuda.h"

namespace {

constexpr int kThreads = 256;          // threads per block of the element kernels
constexpr size_t kMaxBlocks = 65535;   // grid cap; a grid-stride loop covers the rest

unsigned blocks_for(size_t n) {
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

template <gt_numerics kNumerics>
__global__ void adamw_kernel(gt_adamw_scalars s, float *p, const float *g, float *m, float *v, float *v_max,
                             size_t n) {
    float unused = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float *vm = s.amsgrad ? &v_max[i] : &unused;
        if (kNumerics == GT_NUMERICS_EXACT)
            gt_adamw_exact(&p[i], g[i], &m[i], &v[i], vm, &s);
        else
            gt_adamw_fast(&p[i], g[i], &m[i], &v[i], vm, &s);
    }
}

__global__ void sgd_kernel(gt_sgd_scalars s, float *p, const float *g, float *buf, size_t n) {
    float unused = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        gt_sgd_update(&p[i], g[i], s.use_momentum ? &buf[i] : &unused, &s);
}

__global__ void ema_kernel(float *ema, const float *p, float weight, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        gt_ema_update(&ema[i], p[i], weight);
}

__global__ void ema_swap_kernel(float *ema, float *p, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float kept = ema[i];
        ema[i] = p[i];
        p[i] = kept;
    }
}

// One block of GT_SUMSQ_LANES threads per chunk: lane l adds the squares of the chunk's
// elements l, l+16, ... in order, then the lanes fold pairwise; totals[chunk] gets the result.
__global__ void sumsq_kernel(const float *x, size_t n, size_t chunk_len, double *totals) {
    __shared__ double lanes[GT_SUMSQ_LANES];
    const size_t start = (size_t)blockIdx.x * chunk_len;
    const size_t len = n - start < chunk_len ? n - start : chunk_len;
    const unsigned lane = threadIdx.x;
    double acc = 0.0;
#pragma unroll 8
    for (size_t i = lane; i < len; i += GT_SUMSQ_LANES) {
        double value = (double)x[start + i];
        acc = __dadd_rn(acc, __dmul_rn(value, value));
    }
    lanes[lane] = acc;
    __syncwarp(0xFFFFu);
    for (unsigned width = GT_SUMSQ_LANES / 2; width >= 1; width /= 2) {
        if (lane < width)
            lanes[lane] = __dadd_rn(lanes[lane], lanes[lane + width]);
        __syncwarp(0xFFFFu);
    }
    if (lane == 0)
        totals[blockIdx.x] = lanes[0];
}

// *out = the chunk totals added in chunk order (one thread: the order of core/sumsq_order.h).
__global__ void sumsq_finish_kernel(const double *totals, size_t num_chunks, double *out) {
    double sum = 0.0;
    for (size_t c = 0; c < num_chunks; c++)
        sum = __dadd_rn(sum, totals[c]);
    *out = sum;
}

// *loss_sum += gt_loss_mean(values, rows, count) (one thread: row order).
__global__ void loss_accumulate_kernel(const float *values, int64_t rows, const int64_t *count, double *loss_sum) {
    *loss_sum = __dadd_rn(*loss_sum, gt_loss_mean(values, rows, count));
}

// grad[0..n) *= the clipping coefficient of *sumsq (core/clip_rules.h), read by every thread;
// nothing is written when it is 1 (uniform across the grid).
__global__ void grad_clip_kernel(float *grad, size_t n, const double *sumsq, double max_norm) {
    const float coef = gt_clip_rule_coef_sumsq(max_norm, *sumsq);
    if (coef == 1.0f)
        return;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        grad[i] = gt_mul(grad[i], coef);
}

// The scalars of table t for the device's count (read by every thread: uniform across the grid).
template <typename Scalars>
__device__ const Scalars *table_entry(const gt_update_table &t) {
    return (const Scalars *)t.entries + (size_t)(*t.count % t.ring) * t.stride;
}

template <gt_numerics kNumerics>
__global__ void adamw_table_kernel(gt_update_table t, float *p, const float *g, float *m, float *v, float *v_max,
                                   size_t n) {
    if (*t.found_inf)
        return;
    const gt_adamw_scalars s = *table_entry<gt_adamw_scalars>(t);
    float unused = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float *vm = s.amsgrad ? &v_max[i] : &unused;
        if (kNumerics == GT_NUMERICS_EXACT)
            gt_adamw_exact(&p[i], g[i], &m[i], &v[i], vm, &s);
        else
            gt_adamw_fast(&p[i], g[i], &m[i], &v[i], vm, &s);
    }
}

__global__ void sgd_table_kernel(gt_update_table t, float *p, const float *g, float *buf, size_t n) {
    if (*t.found_inf)
        return;
    const gt_sgd_scalars s = *table_entry<gt_sgd_scalars>(t);
    float unused = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        gt_sgd_update(&p[i], g[i], s.use_momentum ? &buf[i] : &unused, &s);
}

// *count += 1 unless *found_inf (one thread).
__global__ void count_update_kernel(unsigned long long *count, const int *found_inf) {
    if (!*found_inf)
        *count += 1;
}

__device__ double sumsq_totals[GT_SUMSQ_MAX_CHUNKS];  // per-device chunk totals
std::mutex sumsq_lock;                                // one sum of squares at a time uses them

}  // namespace

extern "C" gt_status gt_cuda_adamw(int device, gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                                   const float *g, float *m, float *v, float *v_max, size_t n, void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!p || !g || !m || !v || (s->amsgrad && !v_max))
        return GT_FAIL(GT_ERR_VALUE, "adamw: NULL device pointer for %zu elements", n);
    cudaStream_t st = (cudaStream_t)stream;
    if (numerics == GT_NUMERICS_EXACT)
        adamw_kernel<GT_NUMERICS_EXACT><<<blocks_for(n), kThreads, 0, st>>>(*s, p, g, m, v, v_max, n);
    else
        adamw_kernel<GT_NUMERICS_FAST><<<blocks_for(n), kThreads, 0, st>>>(*s, p, g, m, v, v_max, n);
    GT_CUDA_TRY(cudaGetLastError(), "adamw_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_sgd(int device, const gt_sgd_scalars *s, float *p, const float *g, float *buf,
                                 size_t n, void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!p || !g || (s->use_momentum && !buf))
        return GT_FAIL(GT_ERR_VALUE, "sgd: NULL device pointer for %zu elements", n);
    sgd_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(*s, p, g, buf, n);
    GT_CUDA_TRY(cudaGetLastError(), "sgd_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_ema(int device, float *ema, const float *p, float weight, size_t n, void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!ema || !p)
        return GT_FAIL(GT_ERR_VALUE, "ema: NULL device pointer for %zu elements", n);
    ema_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(ema, p, weight, n);
    GT_CUDA_TRY(cudaGetLastError(), "ema_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_ema_swap(int device, float *ema, float *p, size_t n, void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!ema || !p)
        return GT_FAIL(GT_ERR_VALUE, "ema: NULL device pointer for %zu elements", n);
    ema_swap_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(ema, p, n);
    GT_CUDA_TRY(cudaGetLastError(), "ema_swap_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_grad_sumsq(int device, const float *x, size_t n, double *out, void *stream) {
    *out = 0.0;
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!x)
        return GT_FAIL(GT_ERR_VALUE, "grad: NULL device pointer for %zu elements", n);
    size_t chunk = gt_sumsq_chunk_len(n);
    size_t num_chunks = (n + chunk - 1) / chunk;
    double totals[GT_SUMSQ_MAX_CHUNKS];
    std::lock_guard<std::mutex> guard(sumsq_lock);
    double *device_totals = nullptr;
    GT_CUDA_TRY(cudaGetSymbolAddress((void **)&device_totals, sumsq_totals), "cudaGetSymbolAddress");
    cudaStream_t st = (cudaStream_t)stream;
    sumsq_kernel<<<(unsigned)num_chunks, GT_SUMSQ_LANES, 0, st>>>(x, n, chunk, device_totals);
    GT_CUDA_TRY(cudaGetLastError(), "sumsq_kernel launch");
    GT_CUDA_TRY(cudaMemcpyAsync(totals, device_totals, num_chunks * sizeof(double), cudaMemcpyDeviceToHost, st),
                "cudaMemcpyAsync");
    GT_CUDA_TRY(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    double sum = 0.0;
    for (size_t c = 0; c < num_chunks; c++)
        sum += totals[c];
    *out = sum;
    return GT_OK;
}

extern "C" gt_status gt_cuda_grad_sumsq_async(int device, const float *x, size_t n, double *out, double *totals,
                                             void *stream) {
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (n > 0 && !x)
        return GT_FAIL(GT_ERR_VALUE, "grad: NULL device pointer for %zu elements", n);
    size_t chunk = gt_sumsq_chunk_len(n);
    size_t num_chunks = (n + chunk - 1) / chunk;
    cudaStream_t st = (cudaStream_t)stream;
    if (num_chunks > 0) {
        sumsq_kernel<<<(unsigned)num_chunks, GT_SUMSQ_LANES, 0, st>>>(x, n, chunk, totals);
        GT_CUDA_TRY(cudaGetLastError(), "sumsq_kernel launch");
    }
    sumsq_finish_kernel<<<1, 1, 0, st>>>(totals, num_chunks, out);
    GT_CUDA_TRY(cudaGetLastError(), "sumsq_finish_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_loss_accumulate(int device, const float *values, int64_t rows, const int64_t *count,
                                            double *loss_sum, void *stream) {
    GT_TRY(gt_cuda_require_device(device, "device"));
    loss_accumulate_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(values, rows, count, loss_sum);
    GT_CUDA_TRY(cudaGetLastError(), "loss_accumulate_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_grad_clip(int device, float *grad, size_t n, const double *sumsq, double max_norm,
                                      void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!grad || !sumsq)
        return GT_FAIL(GT_ERR_VALUE, "grad_clip: NULL device pointer for %zu elements", n);
    grad_clip_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(grad, n, sumsq, max_norm);
    GT_CUDA_TRY(cudaGetLastError(), "grad_clip_kernel launch");
    return GT_OK;
}

static gt_status check_table(const gt_update_table *t, const char *what) {
    if (!t->entries || !t->count || !t->found_inf || t->ring == 0)
        return GT_FAIL(GT_ERR_VALUE, "%s: the update table needs entries, a count, an inf flag and ring > 0", what);
    return GT_OK;
}

extern "C" gt_status gt_cuda_adamw_table(int device, gt_numerics numerics, const gt_update_table *t, float *p,
                                         const float *g, float *m, float *v, float *v_max, size_t n, void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    GT_TRY(check_table(t, "adamw"));
    if (!p || !g || !m || !v)
        return GT_FAIL(GT_ERR_VALUE, "adamw: NULL device pointer for %zu elements", n);
    cudaStream_t st = (cudaStream_t)stream;
    if (numerics == GT_NUMERICS_EXACT)
        adamw_table_kernel<GT_NUMERICS_EXACT><<<blocks_for(n), kThreads, 0, st>>>(*t, p, g, m, v, v_max, n);
    else
        adamw_table_kernel<GT_NUMERICS_FAST><<<blocks_for(n), kThreads, 0, st>>>(*t, p, g, m, v, v_max, n);
    GT_CUDA_TRY(cudaGetLastError(), "adamw_table_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_sgd_table(int device, const gt_update_table *t, float *p, const float *g, float *buf,
                                       size_t n, void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    GT_TRY(check_table(t, "sgd"));
    if (!p || !g)
        return GT_FAIL(GT_ERR_VALUE, "sgd: NULL device pointer for %zu elements", n);
    sgd_table_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(*t, p, g, buf, n);
    GT_CUDA_TRY(cudaGetLastError(), "sgd_table_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_count_update(int device, uint64_t *count, const int *found_inf, void *stream) {
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!count || !found_inf)
        return GT_FAIL(GT_ERR_VALUE, "count_update: NULL device pointer");
    count_update_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((unsigned long long *)count, found_inf);
    GT_CUDA_TRY(cudaGetLastError(), "count_update_kernel launch");
    return GT_OK;
}
