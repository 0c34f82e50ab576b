// The loss scaler's kernels: the fused unscale + inf check over a flat gradient arena and the
// one-thread state update. Both apply core/scaler_rules.h, the code the CPU path runs
// (csrc/train/scaler.c is the reference these kernels are tested against).
#include <cuda_runtime.h>

#include <stdint.h>

#include "core/scaler_rules.h"
#include "cuda_internal.cuh"
#include "scaler_cuda.h"

namespace {

constexpr int kThreads = 256;      // threads per block of the unscale kernel
constexpr size_t kMaxBlocks = 4096;  // grid cap; a grid-stride loop covers the rest

// One element: 1 when it is NaN/±Inf; stores x * inv when `multiply`.
__device__ __forceinline__ int unscale_one(float *slot, float x, float inv, bool multiply) {
    if (multiply)
        *slot = x * inv;
    return gt_f32_is_nonfinite(x);
}

// grad[0..n) *= inv_scale (skipped when it is 1) and *found_inf = 1 if any element was NaN/±Inf.
// float4 loads over the 16-byte-aligned body, then the tail; each block ORs its threads' flags
// with __syncthreads_or and one thread per block that saw one sets the flag with atomicOr.
__global__ void unscale_inf_check_kernel(float *grad, size_t n, const gt_scaler *scaler, int *found_inf) {
    if (!scaler->enabled)
        return;  // uniform across the grid: every thread reads the same flag
    const float inv = gt_scaler_rule_inv_scale(scaler->scale);
    const bool multiply = inv != 1.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t n4 = ((uintptr_t)grad % sizeof(float4) == 0) ? n / 4 : 0;
    float4 *grad4 = reinterpret_cast<float4 *>(grad);
    int bad = 0;
    for (size_t i = first; i < n4; i += stride) {
        float4 v = grad4[i];
        bad |= gt_f32_is_nonfinite(v.x) | gt_f32_is_nonfinite(v.y) | gt_f32_is_nonfinite(v.z) |
               gt_f32_is_nonfinite(v.w);
        if (multiply)
            grad4[i] = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    }
    for (size_t i = n4 * 4 + first; i < n; i += stride)
        bad |= unscale_one(grad + i, grad[i], inv, multiply);
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        atomicOr(found_inf, 1);
}

// The end-of-step update on the device copy of the state (launched with one thread).
__global__ void scaler_update_kernel(gt_scaler *scaler, const int *found_inf) {
    if (scaler->enabled)
        gt_scaler_rule_update(scaler, *found_inf != 0);
}

// Device memory freed when it goes out of scope, so every return path of run_host frees it.
struct DeviceScratch {
    void *ptr = nullptr;  // cudaMalloc'd memory, or nullptr
    ~DeviceScratch() {
        if (ptr)
            cudaFree(ptr);
    }
};

}  // namespace

extern "C" gt_status gt_cuda_scaler_unscale_check(const gt_scaler *scaler, float *grad, size_t n,
                                                  int *found_inf, void *stream) {
    if (!scaler)
        return GT_FAIL(GT_ERR_VALUE, "scaler: must not be NULL");
    if (!found_inf)
        return GT_FAIL(GT_ERR_VALUE, "found_inf: must not be NULL");
    if (n > 0 && !grad)
        return GT_FAIL(GT_ERR_VALUE, "grad: must not be NULL with n = %zu", n);
    if (n == 0)
        return GT_OK;
    size_t blocks = (n / 4 + kThreads - 1) / kThreads;
    blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
    unscale_inf_check_kernel<<<(unsigned)blocks, kThreads, 0, (cudaStream_t)stream>>>(grad, n, scaler, found_inf);
    GT_CUDA_TRY(cudaGetLastError(), "unscale_inf_check_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_scaler_update(gt_scaler *scaler, const int *found_inf, void *stream) {
    if (!scaler)
        return GT_FAIL(GT_ERR_VALUE, "scaler: must not be NULL");
    if (!found_inf)
        return GT_FAIL(GT_ERR_VALUE, "found_inf: must not be NULL");
    scaler_update_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(scaler, found_inf);
    GT_CUDA_TRY(cudaGetLastError(), "scaler_update_kernel launch");
    return GT_OK;
}

extern "C" gt_status gt_cuda_scaler_run_host(gt_scaler *scaler, float *grad, size_t n, int *found_inf,
                                             int update, int device) {
    if (!scaler || !found_inf || (n > 0 && !grad))
        return GT_FAIL(GT_ERR_VALUE, "scaler, grad and found_inf: must not be NULL");
    GT_TRY(gt_cuda_require_device(device, "device"));
    DeviceScratch d_scaler, d_grad, d_found;
    GT_CUDA_TRY(cudaMalloc(&d_scaler.ptr, sizeof(gt_scaler)), "cudaMalloc");
    GT_CUDA_TRY(cudaMalloc(&d_found.ptr, sizeof(int)), "cudaMalloc");
    GT_CUDA_TRY(cudaMalloc(&d_grad.ptr, n > 0 ? n * sizeof(float) : 1), "cudaMalloc");
    GT_CUDA_TRY(cudaMemcpy(d_scaler.ptr, scaler, sizeof(gt_scaler), cudaMemcpyHostToDevice), "cudaMemcpy");
    GT_CUDA_TRY(cudaMemcpy(d_found.ptr, found_inf, sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy");
    if (n > 0)
        GT_CUDA_TRY(cudaMemcpy(d_grad.ptr, grad, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    gt_scaler *dev_scaler = static_cast<gt_scaler *>(d_scaler.ptr);
    int *dev_found = static_cast<int *>(d_found.ptr);
    GT_TRY(gt_cuda_scaler_unscale_check(dev_scaler, static_cast<float *>(d_grad.ptr), n, dev_found, nullptr));
    if (update)
        GT_TRY(gt_cuda_scaler_update(dev_scaler, dev_found, nullptr));
    GT_CUDA_TRY(cudaMemcpy(scaler, d_scaler.ptr, sizeof(gt_scaler), cudaMemcpyDeviceToHost), "cudaMemcpy");
    GT_CUDA_TRY(cudaMemcpy(found_inf, d_found.ptr, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (n > 0)
        GT_CUDA_TRY(cudaMemcpy(grad, d_grad.ptr, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return GT_OK;
}
