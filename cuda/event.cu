// Events: recording on a stream, waiting, polling and elapsed time between two events.
#include <cuda_runtime.h>

#include <cstdlib>

#include "cuda_backend.h"
#include "cuda_internal.cuh"

static gt_status require_event(const gt_cuda_event *event, const char *arg_name) {
    if (!event)
        return GT_FAIL(GT_ERR_VALUE, "%s: must not be NULL", arg_name);
    return GT_OK;
}

extern "C" gt_status gt_cuda_event_create(int device, int timing, gt_cuda_event **out) {
    *out = NULL;
    if (timing != 0 && timing != 1)
        return GT_FAIL(GT_ERR_VALUE, "timing: must be 0 or 1, got %d", timing);
    GT_TRY(gt_cuda_require_device(device, "device"));
    gt_cuda_event *event = (gt_cuda_event *)calloc(1, sizeof *event);
    if (!event)
        return GT_FAIL(GT_ERR_OOM, "out of host memory for an event handle");
    unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
    cudaError_t err = cudaEventCreateWithFlags(&event->event, flags);
    if (err != cudaSuccess) {
        free(event);
        return gt_cuda_error(err, "cudaEventCreateWithFlags", __FILE__, __LINE__);
    }
    event->device = device;
    event->timing = timing;
    *out = event;
    return GT_OK;
}

extern "C" void gt_cuda_event_destroy(gt_cuda_event *event) {
    if (!event)
        return;
    cudaSetDevice(event->device);
    cudaEventDestroy(event->event);
    cudaGetLastError();
    free(event);
}

extern "C" gt_status gt_cuda_event_record(gt_cuda_event *event, gt_cuda_stream *stream) {
    GT_TRY(require_event(event, "event"));
    if (!stream)
        return GT_FAIL(GT_ERR_VALUE, "stream: must not be NULL");
    if (stream->device != event->device)
        return GT_FAIL(GT_ERR_VALUE, "stream: belongs to cuda:%d but the event to cuda:%d",
                       stream->device, event->device);
    GT_CUDA_TRY(cudaSetDevice(event->device), "cudaSetDevice");
    GT_CUDA_TRY(cudaEventRecord(event->event, stream->stream), "cudaEventRecord");
    return GT_OK;
}

extern "C" gt_status gt_cuda_event_synchronize(gt_cuda_event *event) {
    GT_TRY(require_event(event, "event"));
    GT_CUDA_TRY(cudaEventSynchronize(event->event), "cudaEventSynchronize");
    return GT_OK;
}

extern "C" gt_status gt_cuda_event_query(gt_cuda_event *event, int *done) {
    GT_TRY(require_event(event, "event"));
    cudaError_t err = cudaEventQuery(event->event);
    *done = err == cudaSuccess;
    if (err == cudaSuccess || err == cudaErrorNotReady) {
        cudaGetLastError();
        return GT_OK;
    }
    return gt_cuda_error(err, "cudaEventQuery", __FILE__, __LINE__);
}

extern "C" gt_status gt_cuda_event_elapsed_ms(gt_cuda_event *start, gt_cuda_event *end, float *ms) {
    GT_TRY(require_event(start, "start"));
    GT_TRY(require_event(end, "end"));
    if (!start->timing || !end->timing)
        return GT_FAIL(GT_ERR_VALUE, "%s: was created without timing",
                       start->timing ? "end" : "start");
    GT_CUDA_TRY(cudaEventElapsedTime(ms, start->event, end->event), "cudaEventElapsedTime");
    return GT_OK;
}
