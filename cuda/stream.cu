// Streams: creation, synchronisation, queries and cross-stream waits on events.
#include <cuda_runtime.h>

#include <cstdlib>

#include "cuda_backend.h"
#include "cuda_internal.cuh"

static gt_status require_stream(const gt_cuda_stream *stream) {
    if (!stream)
        return GT_FAIL(GT_ERR_VALUE, "stream: must not be NULL");
    return GT_OK;
}

extern "C" gt_status gt_cuda_stream_create(int device, gt_cuda_stream **out) {
    *out = NULL;
    GT_TRY(gt_cuda_require_device(device, "device"));
    gt_cuda_stream *stream = (gt_cuda_stream *)calloc(1, sizeof *stream);
    if (!stream)
        return GT_FAIL(GT_ERR_OOM, "out of host memory for a stream handle");
    cudaError_t err = cudaStreamCreateWithFlags(&stream->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        free(stream);
        return gt_cuda_error(err, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
    }
    stream->device = device;
    *out = stream;
    return GT_OK;
}

extern "C" void gt_cuda_stream_destroy(gt_cuda_stream *stream) {
    if (!stream)
        return;
    cudaSetDevice(stream->device);
    cudaStreamSynchronize(stream->stream);
    cudaStreamDestroy(stream->stream);
    cudaGetLastError();
    free(stream);
}

extern "C" int gt_cuda_stream_device(const gt_cuda_stream *stream) { return stream->device; }

extern "C" void *gt_cuda_stream_native(const gt_cuda_stream *stream) { return stream->stream; }

extern "C" gt_status gt_cuda_stream_synchronize(gt_cuda_stream *stream) {
    GT_TRY(require_stream(stream));
    GT_CUDA_TRY(cudaStreamSynchronize(stream->stream), "cudaStreamSynchronize");
    return GT_OK;
}

extern "C" gt_status gt_cuda_stream_query(gt_cuda_stream *stream, int *done) {
    GT_TRY(require_stream(stream));
    cudaError_t err = cudaStreamQuery(stream->stream);
    *done = err == cudaSuccess;
    if (err == cudaSuccess || err == cudaErrorNotReady) {
        cudaGetLastError();
        return GT_OK;
    }
    return gt_cuda_error(err, "cudaStreamQuery", __FILE__, __LINE__);
}

extern "C" gt_status gt_cuda_stream_wait_event(gt_cuda_stream *stream, gt_cuda_event *event) {
    GT_TRY(require_stream(stream));
    if (!event)
        return GT_FAIL(GT_ERR_VALUE, "event: must not be NULL");
    GT_CUDA_TRY(cudaSetDevice(stream->device), "cudaSetDevice");
    GT_CUDA_TRY(cudaStreamWaitEvent(stream->stream, event->event, 0), "cudaStreamWaitEvent");
    return GT_OK;
}
