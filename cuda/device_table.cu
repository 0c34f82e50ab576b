// The CUDA backend behind the device interface (core/device_backend.h): a gt_stream is a
// cudaStream_t and a gt_event a cudaEvent_t without timing. The interface's default stream (NULL)
// is gputrain's own stream of the device (cudaStreamNonBlocking, created on first use and kept
// for the process, as sim's default streams are), never CUDA's legacy default stream: blocking
// copies and fills are queued on it and waited for. Memory, kernels and the op table are the
// functions of the other cuda/ files.
#include <cuda_runtime.h>

#include <mutex>

#include "core/device_backend.h"
#include "cuda_backend.h"
#include "comm_nccl.h"
#include "cuda_internal.cuh"
#include "ops_cuda.h"
#include "optim_cuda.h"
#include "scaler_cuda.h"

namespace {

cudaStream_t own_streams[GT_MAX_CUDA_DEVICES];  // each device's default stream, once created
std::mutex own_lock;                            // guards their creation

cudaStream_t native(gt_stream *stream) { return reinterpret_cast<cudaStream_t>(stream); }

// The stream work for `stream` goes to on device `index` (current): itself, or for NULL the
// device's own default stream.
gt_status resolve(int index, gt_stream *stream, cudaStream_t *out) {
    *out = native(stream);
    if (stream)
        return GT_OK;
    if (index < 0 || index >= GT_MAX_CUDA_DEVICES)
        return GT_FAIL(GT_ERR_VALUE, "device: cuda:%d is beyond the %d devices gputrain handles", index,
                       GT_MAX_CUDA_DEVICES);
    std::lock_guard<std::mutex> guard(own_lock);
    if (!own_streams[index]) {
        GT_TRY(gt_cuda_require_device(index, "device"));
        GT_CUDA_TRY(cudaStreamCreateWithFlags(&own_streams[index], cudaStreamNonBlocking),
                    "cudaStreamCreateWithFlags");
    }
    *out = own_streams[index];
    return GT_OK;
}
cudaEvent_t native(gt_event *event) { return reinterpret_cast<cudaEvent_t>(event); }

int device_count() { return gt_cuda_device_count(); }

gt_status device_malloc(int index, size_t bytes, void **out) { return gt_cuda.device_malloc(index, bytes, out); }

void device_free(int index, void *ptr) { gt_cuda.device_free(index, ptr); }

gt_status mem_get_info(int index, size_t *free_bytes, size_t *total_bytes) {
    return gt_cuda.mem_get_info(index, free_bytes, total_bytes);
}

gt_status copy_async(int index, gt_stream *stream, void *dst, const void *src, size_t bytes) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    if (bytes > 0)
        GT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st), "cudaMemcpyAsync");
    return GT_OK;
}

// A blocking copy: queued on the default stream, then waited for.
gt_status copy(int index, void *dst, const void *src, size_t bytes) {
    if (bytes > 0 && (!dst || !src))
        return GT_FAIL(GT_ERR_VALUE, "copy: NULL pointer for %zu bytes", bytes);
    cudaStream_t st = nullptr;
    GT_TRY(copy_async(index, nullptr, dst, src, bytes));
    GT_TRY(resolve(index, nullptr, &st));
    GT_CUDA_TRY(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    return gt_cuda_stream_op_error(index, st);  // a bad id or target an op on it found
}

gt_status fill(int index, void *dst, int value, size_t bytes) {
    if (value < 0 || value > 255)
        return GT_FAIL(GT_ERR_VALUE, "value: must be a byte in 0..255, got %d", value);
    if (bytes > 0 && !dst)
        return GT_FAIL(GT_ERR_VALUE, "dst: must not be NULL");
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, nullptr, &st));
    if (bytes > 0)
        GT_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, st), "cudaMemsetAsync");
    GT_CUDA_TRY(cudaStreamSynchronize(st), "cudaStreamSynchronize");
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
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    GT_CUDA_TRY(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    return gt_cuda_stream_op_error(index, st);
}

gt_status stream_wait_event(int index, gt_stream *stream, gt_event *event) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    GT_CUDA_TRY(cudaStreamWaitEvent(st, native(event), 0), "cudaStreamWaitEvent");
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
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    GT_CUDA_TRY(cudaEventRecord(native(event), st), "cudaEventRecord");
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
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_adamw(index, numerics, s, p, g, m, v, v_max, n, st);
}

gt_status adamw8bit(int index, gt_stream *stream, const gt_adamw8_scalars *s, float *p, const float *g,
                    uint8_t *c1, uint8_t *c2, float *absmax1, float *absmax2, size_t n) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_adamw8bit(index, s, p, g, c1, c2, absmax1, absmax2, n, st);
}

gt_status sgd(int index, gt_stream *stream, const gt_sgd_scalars *s, float *p, const float *g, float *buf,
              size_t n) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_sgd(index, s, p, g, buf, n, st);
}

gt_status ema(int index, gt_stream *stream, float *shadow, const float *p, float weight, size_t n) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_ema(index, shadow, p, weight, n, st);
}

gt_status ema_swap(int index, gt_stream *stream, float *shadow, float *p, size_t n) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_ema_swap(index, shadow, p, n, st);
}

gt_status grad_sumsq(int index, gt_stream *stream, const float *x, size_t n, double *out) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_grad_sumsq(index, x, n, out, st);
}

gt_status unscale_check(int index, gt_stream *stream, const gt_scaler *scaler, float *grad, size_t n,
                        int *found_inf) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_scaler_unscale_check(scaler, grad, n, found_inf, st);
}

gt_status grad_sumsq_async(int index, gt_stream *stream, const float *x, size_t n, double *out, double *totals) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_grad_sumsq_async(index, x, n, out, totals, st);
}

gt_status loss_accumulate(int index, gt_stream *stream, const float *values, int64_t rows, const int64_t *count,
                          double *loss_sum) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_loss_accumulate(index, values, rows, count, loss_sum, st);
}

gt_status grad_clip(int index, gt_stream *stream, float *grad, size_t n, const double *sumsq, double max_norm) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_grad_clip(index, grad, n, sumsq, max_norm, st);
}

gt_status scaler_update(int index, gt_stream *stream, gt_scaler *scaler, const int *found_inf) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_scaler_update(scaler, found_inf, st);
}

gt_status allreduce_sum(int index, gt_stream *stream, gt_comm *comm, gt_dtype dtype, void *buf, size_t n) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_nccl_allreduce_sum(index, comm, dtype, buf, n, st);
}

gt_status broadcast(int index, gt_stream *stream, gt_comm *comm, void *buf, size_t bytes, int root) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_nccl_broadcast(index, comm, buf, bytes, root, st);
}

gt_status allgather(int index, gt_stream *stream, gt_comm *comm, float *buf, size_t n) {
    GT_TRY(gt_cuda_require_device(index, "device"));
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_nccl_allgather(index, comm, buf, n, st);
}

gt_status backend_init(gt_backend *be, int index, gt_stream *stream) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_backend_init(be, index, st);
}

// cudaStreamLegacy and cudaStreamPerThread are the handles 1 and 2 themselves.
gt_status stream_from_native(int index, uintptr_t handle, const char *arg_name, gt_stream **out) {
    *out = nullptr;
    if (handle == 0)
        return GT_FAIL(GT_ERR_VALUE, "%s: stream 0 is ambiguous (use 1 for the legacy default stream, 2 for the "
                       "per-thread one)", arg_name);
    GT_TRY(gt_cuda_require_device(index, arg_name));
    *out = reinterpret_cast<gt_stream *>(handle);
    return GT_OK;
}

gt_status pointer_device(const void *ptr, int *index) {
    *index = -1;
    cudaPointerAttributes attributes;
    cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
    if (err != cudaSuccess) {
        cudaGetLastError();  // memory the runtime does not know: not device memory
        return GT_OK;
    }
    if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged)
        *index = attributes.device;
    return GT_OK;
}

gt_status adamw_table(int index, gt_stream *stream, gt_numerics numerics, const gt_update_table *t, float *p,
                      const float *g, float *m, float *v, float *v_max, size_t n) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_adamw_table(index, numerics, t, p, g, m, v, v_max, n, st);
}

gt_status sgd_table(int index, gt_stream *stream, const gt_update_table *t, float *p, const float *g, float *buf,
                    size_t n) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_sgd_table(index, t, p, g, buf, n, st);
}

gt_status count_update(int index, gt_stream *stream, uint64_t *count, const int *found_inf) {
    cudaStream_t st = nullptr;
    GT_TRY(resolve(index, stream, &st));
    return gt_cuda_count_update(index, count, found_inf, st);
}

const gt_device_backend cuda_table = {
    "cuda", device_count, device_malloc, device_free, mem_get_info,
    copy, fill, copy_async, poison,
    stream_create, stream_destroy, stream_synchronize, stream_wait_event,
    event_create, event_destroy, event_record, event_query, event_synchronize, stream_native,
    adamw, sgd, ema, ema_swap, grad_sumsq, unscale_check,
    backend_init, gt_cuda_backend_release, GT_CUDA_SCRATCH_BYTES,
    stream_from_native, pointer_device, grad_sumsq_async, loss_accumulate, grad_clip, scaler_update,
    allreduce_sum, broadcast, allgather,
    adamw_table, sgd_table, count_update,
    0,  // host_memory
    adamw8bit,
};

}  // namespace

extern "C" void gt_cuda_install_device_backend(void) { gt_device_backend_install(GT_DEVICE_CUDA, &cuda_table); }
