// Copies between host and device memory (sync and on a stream) and device fills.
#include <cuda_runtime.h>

#include "cuda_backend.h"
#include "cuda_internal.cuh"

// Checks the arguments every copy shares and maps the kind onto cudaMemcpyKind.
static gt_status check_copy(void *dst, const void *src, size_t bytes, gt_cuda_copy_kind kind,
                            cudaMemcpyKind *out) {
    if (kind < GT_COPY_HOST_TO_DEVICE || kind > GT_COPY_DEFAULT)
        return GT_FAIL(GT_ERR_VALUE, "kind: unknown copy kind %d", (int)kind);
    if (bytes > 0 && !dst)
        return GT_FAIL(GT_ERR_VALUE, "dst: must not be NULL");
    if (bytes > 0 && !src)
        return GT_FAIL(GT_ERR_VALUE, "src: must not be NULL");
    *out = (cudaMemcpyKind)kind;
    return GT_OK;
}

static gt_status check_fill(void *dst, int value, size_t bytes) {
    if (value < 0 || value > 255)
        return GT_FAIL(GT_ERR_VALUE, "value: must be a byte in 0..255, got %d", value);
    if (bytes > 0 && !dst)
        return GT_FAIL(GT_ERR_VALUE, "dst: must not be NULL");
    return GT_OK;
}

static gt_status require_stream(const gt_cuda_stream *stream) {
    if (!stream)
        return GT_FAIL(GT_ERR_VALUE, "stream: must not be NULL");
    GT_CUDA_TRY(cudaSetDevice(stream->device), "cudaSetDevice");
    return GT_OK;
}

extern "C" gt_status gt_cuda_memcpy(void *dst, const void *src, size_t bytes,
                                    gt_cuda_copy_kind kind, int device) {
    cudaMemcpyKind cuda_kind = cudaMemcpyDefault;
    GT_TRY(check_copy(dst, src, bytes, kind, &cuda_kind));
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (bytes > 0)
        GT_CUDA_TRY(cudaMemcpy(dst, src, bytes, cuda_kind), "cudaMemcpy");
    return GT_OK;
}

extern "C" gt_status gt_cuda_memcpy_async(void *dst, const void *src, size_t bytes,
                                          gt_cuda_copy_kind kind, gt_cuda_stream *stream) {
    cudaMemcpyKind cuda_kind = cudaMemcpyDefault;
    GT_TRY(check_copy(dst, src, bytes, kind, &cuda_kind));
    GT_TRY(require_stream(stream));
    if (bytes > 0)
        GT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cuda_kind, stream->stream), "cudaMemcpyAsync");
    return GT_OK;
}

extern "C" gt_status gt_cuda_memset(void *dst, int value, size_t bytes, int device) {
    GT_TRY(check_fill(dst, value, bytes));
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (bytes > 0)
        GT_CUDA_TRY(cudaMemset(dst, value, bytes), "cudaMemset");
    return GT_OK;
}

extern "C" gt_status gt_cuda_memset_async(void *dst, int value, size_t bytes,
                                          gt_cuda_stream *stream) {
    GT_TRY(check_fill(dst, value, bytes));
    GT_TRY(require_stream(stream));
    if (bytes > 0)
        GT_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, stream->stream), "cudaMemsetAsync");
    return GT_OK;
}
