// The CUDA backend behind the device interface (core/device_backend.h): a gt_stream is a
// cudaStream_t (NULL: the legacy default stream) and a gt_event a cudaEvent_t without timing.
// Memory, kernels and the op table are the functions of the other cuda/ files.
#include <cuda_runtime.h>

#include "core/device_backend.h"
#include "cuda_backend.h"
#include "cuda_internal.cuh"
#include "ops_cuda.h"
#include "optim_cuda.h"
#include "scaler_cuda.h"

namespace {

cudaStream_t native(gt_stream *stream) { return reinterpret_cast<cudaStream_t>(stream); }
cudaEvent_t native(gt_event *event) { return reinterpret_cast<cudaEvent_t>(event); }

int device_count() { return gt_cuda_device_count(); }

gt_status device_malloc(int index, size_t bytes, void **out) { return gt_cuda.device_malloc(index, bytes, out); }

void device_free(int index, void *ptr) { gt_cuda.device_free(index, ptr); }

gt_status mem_get_info(int index, size_t *free_bytes, size_t *total_bytes) {
    return gt_cuda.mem_get_info(index, free_bytes, total_bytes);
}

gt_status copy(int index, void *dst, const void *src, size_t bytes) {
    return gt_cuda_memcpy(dst, src, bytes, GT_COPY_DEFAULT, index);
}

gt_status fill(int index, void *dst, int value, size_t bytes) { return gt_cuda_memset(dst, value, bytes, index); }

gt_status copy_async(int index, gt_stream *stream, void *dst, const void *src, size_t bytes) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    if (bytes > 0)
        GT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native(stream)), "cudaMemcpyAsync");
    return GT_OK;
}

gt_status poison(int, gt_stream *, void *, size_t) { return GT_OK; }

gt_status stream_create(int index, gt_stream **out) {
    *out = nullptr;
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t stream = nullptr;
    GT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    *out = reinterpret_cast<gt_stream *>(stream);
    return GT_OK;
}

void stream_destroy(int index, gt_stream *stream) {
    if (!stream)
        return;
    cudaSetDevice(index);
    cudaStreamSynchronize(native(stream));
    cudaStreamDestroy(native(stream));
    cudaGetLastError();
}

gt_status stream_synchronize(int index, gt_stream *stream) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    GT_CUDA_TRY(cudaStreamSynchronize(native(stream)), "cudaStreamSynchronize");
    return GT_OK;
}

gt_status stream_wait_event(int index, gt_stream *stream, gt_event *event) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    GT_CUDA_TRY(cudaStreamWaitEvent(native(stream), native(event), 0), "cudaStreamWaitEvent");
    return GT_OK;
}

gt_status event_create(int index, gt_event **out) {
    *out = nullptr;
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaEvent_t event = nullptr;
    GT_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    *out = reinterpret_cast<gt_event *>(event);
    return GT_OK;
}

void event_destroy(int index, gt_event *event) {
    if (!event)
        return;
    cudaSetDevice(index);
    cudaEventDestroy(native(event));
    cudaGetLastError();
}

gt_status event_record(int index, gt_event *event, gt_stream *stream) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    GT_CUDA_TRY(cudaEventRecord(native(event), native(stream)), "cudaEventRecord");
    return GT_OK;
}

gt_status event_query(int index, gt_event *event, int *done) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaError_t err = cudaEventQuery(native(event));
    *done = err != cudaErrorNotReady;
    if (err == cudaErrorNotReady || err == cudaSuccess)
        return GT_OK;
    return gt_cuda_error(err, "cudaEventQuery", __FILE__, __LINE__);
}

gt_status event_synchronize(int index, gt_event *event) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    GT_CUDA_TRY(cudaEventSynchronize(native(event)), "cudaEventSynchronize");
    return GT_OK;
}

void *stream_native(gt_stream *stream) { return native(stream); }

gt_status adamw(int index, gt_stream *stream, gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                const float *g, float *m, float *v, float *v_max, size_t n) {
    return gt_cuda_adamw(index, numerics, s, p, g, m, v, v_max, n, native(stream));
}

gt_status sgd(int index, gt_stream *stream, const gt_sgd_scalars *s, float *p, const float *g, float *buf,
              size_t n) {
    return gt_cuda_sgd(index, s, p, g, buf, n, native(stream));
}

gt_status ema(int index, gt_stream *stream, float *shadow, const float *p, float weight, size_t n) {
    return gt_cuda_ema(index, shadow, p, weight, n, native(stream));
}

gt_status ema_swap(int index, gt_stream *stream, float *shadow, float *p, size_t n) {
    return gt_cuda_ema_swap(index, shadow, p, n, native(stream));
}

gt_status grad_sumsq(int index, gt_stream *stream, const float *x, size_t n, double *out) {
    return gt_cuda_grad_sumsq(index, x, n, out, native(stream));
}

gt_status unscale_check(int index, gt_stream *stream, const gt_scaler *scaler, float *grad, size_t n,
                        int *found_inf) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    return gt_cuda_scaler_unscale_check(scaler, grad, n, found_inf, native(stream));
}

gt_status grad_sumsq_async(int index, gt_stream *stream, const float *x, size_t n, double *out, double *totals) {
    return gt_cuda_grad_sumsq_async(index, x, n, out, totals, native(stream));
}

gt_status loss_accumulate(int index, gt_stream *stream, const float *values, int64_t rows, const int64_t *count,
                          double *loss_sum) {
    return gt_cuda_loss_accumulate(index, values, rows, count, loss_sum, native(stream));
}

gt_status backend_init(gt_backend *be, int index, gt_stream *stream) {
    return gt_cuda_backend_init(be, index, native(stream));
}

const gt_device_backend cuda_table = {
    "cuda", device_count, device_malloc, device_free, mem_get_info,
    copy, fill, copy_async, poison,
    stream_create, stream_destroy, stream_synchronize, stream_wait_event,
    event_create, event_destroy, event_record, event_query, event_synchronize, stream_native,
    adamw, sgd, ema, ema_swap, grad_sumsq, unscale_check,
    backend_init, gt_cuda_backend_release, GT_CUDA_SCRATCH_BYTES,
    grad_sumsq_async, loss_accumulate,
};

}  // namespace

extern "C" void gt_cuda_install_device_backend(void) { gt_device_backend_install(GT_DEVICE_CUDA, &cuda_table); }
