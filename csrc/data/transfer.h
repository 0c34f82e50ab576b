/* Device transfer of delivered batches: each host slot is copied to a device batch of the
 * same layout with asynchronous copies on a copy stream, then an event is recorded. The host
 * slot is handed back to the loader only after that event fired, and a device batch is reused
 * only after the caller released it; its contents are dead from the release on (the simulated
 * device poisons them in the copy stream's order: after the copy into it, before the next). The device is an accelerator of core/device_backend.h.
 *
 * Not thread-safe: callers serialise the calls (the bindings hold the GIL). */
#ifndef GT_DATA_TRANSFER_H
#define GT_DATA_TRANSFER_H

#include <stddef.h>

#include "core/alloc.h"
#include "core/device_backend.h"
#include "core/status.h"
#include "data/loader.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_transfer gt_transfer;

typedef struct gt_device_batch {
    gt_block block;      /* device memory laid out as a host slot (fields at their slot offsets) */
    gt_event *copied;    /* recorded on the copy stream after the copy into `block` */
    gt_event *consumed;  /* recorded on a consumer's stream after its last work reading `block` */
    int consumer;        /* 1 when `consumed` was recorded since the last copy into `block` */
    gt_slot *host;       /* host slot copied from, until `copied` has fired; then NULL */
    int in_use;          /* 1 while the caller holds the batch */
} gt_device_batch;

/* Device batches a transfer allocates for a caller that holds one batch at a time, as a `for`
 * loop over the loader does: the batch handed out, the one copied ahead of it, and the caller's
 * previous batch, still bound while the next copy is queued (python/gputrain/data/transfer.py). */
enum { GT_TRANSFER_PLANNED_BATCHES = 3 };

/* What a transfer of slots of `slot_bytes` to `device` reserves in the device's pool: its
 * GT_TRANSFER_PLANNED_BATCHES batches of *batch_bytes each, *bytes in all (0 off an accelerator). */
gt_status gt_transfer_plan(gt_device device, size_t slot_bytes, size_t *batch_bytes, size_t *bytes);

/* A transfer of `loader`'s slots (slot_bytes each) to accelerator `device`, with its own copy
 * stream. Keeps a reference on the loader. */
gt_status gt_transfer_create(gt_loader *loader, gt_device device, size_t slot_bytes, gt_transfer **out);

/* Queues the copy of `slot` (the caller's reference passes to the transfer) into a free
 * device batch, allocating one when all are in use; returns it marked in use. It first hands
 * back the host slots of the earlier copies, waiting for one still running, so the transfer
 * holds at most one loader slot when it returns (the loader's plan counts on it). */
gt_status gt_transfer_submit(gt_transfer *transfer, gt_slot *slot, gt_device_batch **out);

/* Blocks until the copy into `batch` is done. It changes nothing of the transfer's, so it may run
 * without the lock that serialises the other calls (the GIL, in the bindings) while another
 * thread submits; gt_transfer_reclaim then hands the batch's host slot back under that lock. */
gt_status gt_transfer_wait(gt_transfer *transfer, gt_device_batch *batch);

/* Hands `batch`'s host slot back to the loader if the copy from it is done (without waiting). */
gt_status gt_transfer_reclaim(gt_transfer *transfer, gt_device_batch *batch);

/* Work queued on `consumer` (a stream of the transfer's device, NULL: its default stream) from
 * now on runs after the copy into `batch` (the host is not blocked). */
gt_status gt_transfer_consume_begin(gt_transfer *transfer, gt_device_batch *batch, gt_stream *consumer);

/* The work queued on `consumer` so far is the last that reads `batch`: its release waits for it. */
gt_status gt_transfer_consume_end(gt_transfer *transfer, gt_device_batch *batch, gt_stream *consumer);

/* Work queued on the copy stream from now on (the poison and the next copy into any batch) waits
 * for the work queued on `consumer` so far: for a reader outside gputrain (an exported batch) that
 * gives no event back. If the wait cannot be queued, the host waits for `consumer` instead. */
void gt_transfer_wait_for(gt_transfer *transfer, gt_stream *consumer);

/* The device of the transfer's batches. */
gt_device gt_transfer_device(const gt_transfer *transfer);

/* The caller no longer uses `batch`; it may be filled again once the consumers' work recorded by
 * gt_transfer_consume_end has run (the copy stream waits for it, the host does not). */
void gt_transfer_release(gt_transfer *transfer, gt_device_batch *batch);

/* The native handle of the copy stream (CUDA: its cudaStream_t); consumers order their work after it. */
void *gt_transfer_native_stream(const gt_transfer *transfer);

/* Copies `bytes` of host memory into a new block of the transfer's device (synchronous). */
gt_status gt_transfer_copy_bytes(gt_transfer *transfer, const void *src, size_t bytes, gt_block *out);

/* Copies `bytes` of device memory at `src` to host memory at `dst` (synchronous). */
gt_status gt_transfer_to_host(gt_transfer *transfer, void *dst, const void *src, size_t bytes);

/* Waits for every copy, hands back the host slots, frees the device batches and the stream. */
void gt_transfer_destroy(gt_transfer *transfer);

#ifdef __cplusplus
}
#endif
#endif
