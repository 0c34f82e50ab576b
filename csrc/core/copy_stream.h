/* An ordered queue of memory copies between the device and host memory that runs beside the
 * calling thread: a stream of the device's for an accelerator (core/device_backend.h), and a
 * worker thread doing memcpy for the cpu
 * "device" (so the CPU-only build runs the same overlapped pipeline as the GPU build).
 * Copies run in the order they are queued; a ticket marks a point in the queue. */
#ifndef GT_COPY_STREAM_H
#define GT_COPY_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/device_backend.h"
#include "core/status.h"

typedef struct gt_copy_stream gt_copy_stream;

/* A stream for copies between `device` (cpu or an accelerator) memory and host memory. On an
 * accelerator, `compute_stream` (NULL = the default stream) is the stream whose earlier work
 * the copies wait for (gt_copy_stream_after_compute). */
gt_status gt_copy_stream_create(gt_device device, gt_stream *compute_stream, gt_copy_stream **out);

/* Waits for queued copies, then frees the stream. NULL is ignored. */
void gt_copy_stream_destroy(gt_copy_stream *stream);

/* Queues a copy of `bytes` (device and host pointers as the name says); never blocks on the
 * copy itself. */
gt_status gt_copy_stream_d2h(gt_copy_stream *stream, void *host_dst, const void *device_src, size_t bytes);
gt_status gt_copy_stream_h2d(gt_copy_stream *stream, void *device_dst, const void *host_src, size_t bytes);

/* Makes later copies wait for the work already queued on the compute stream (no-op on cpu). */
gt_status gt_copy_stream_after_compute(gt_copy_stream *stream);

/* Queues a device->host copy on the compute stream itself, behind the work queued there (so a
 * wait for that stream covers it); a plain memcpy on the cpu. */
gt_status gt_copy_stream_d2h_on_compute(gt_copy_stream *stream, void *host_dst, const void *device_src, size_t bytes);

/* Makes later work of the compute stream wait for the copies queued so far, without blocking
 * the host; on the cpu (no compute stream) it waits for them like gt_copy_stream_sync. */
gt_status gt_copy_stream_before_compute(gt_copy_stream *stream);

/* A ticket for everything queued so far; gt_copy_stream_wait blocks until it is done. */
gt_status gt_copy_stream_record(gt_copy_stream *stream, uint64_t *ticket);
gt_status gt_copy_stream_wait(gt_copy_stream *stream, uint64_t ticket);

/* Blocks until every queued copy is done. */
gt_status gt_copy_stream_sync(gt_copy_stream *stream);

/* A blocking copy of `bytes` between any two of device/host memory (ordered after the device's default stream). */
gt_status gt_memcpy_blocking(gt_device device, void *dst, const void *src, size_t bytes);

#endif
