/* Collectives of a device model's step, run by the device (core/device_backend.h's allreduce_sum,
 * broadcast and allgather) on a stream of the communicator's own, ordered against the model's stream by
 * events: the model's stream records `ready` after the backward, the communicator's stream waits
 * for it, sums, records `summed`, and the model's stream waits for that before the unscale, the
 * norm and the update. Nothing waits on the host: the step's one read covers the collectives.
 *
 * A collective that fails on a device's worker (sim) or watchdog (NCCL) keeps its message in the
 * communicator (gt_comm_device_failed); gt_comm_device_check returns it after a wait that covers
 * the collective, so the step fails with the transport's own message (a timeout names the rank). */
#ifndef GT_DIST_COMM_DEVICE_H
#define GT_DIST_COMM_DEVICE_H

#include "core/device_backend.h"
#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The communicator's stream on one device and the two events that order it (comm->device). */
typedef struct gt_comm_device {
    const gt_device_backend *dev;  /* the device's (counting) table */
    int index;                     /* its ordinal */
    gt_stream *stream;             /* where the collectives run */
    gt_event *ready;               /* recorded on the model's stream after the gradients are final */
    gt_event *summed;              /* recorded on `stream` after the collectives */
} gt_comm_device;

/* Queues, on device `index` of `dev`: grads (n f32) and *loss_sum (one f64), both device memory
 * written by work already queued on the default stream, summed over the ranks in rank order;
 * work queued on the default stream afterwards sees the sums. Creates comm's stream and events on
 * first use (again when the device changes). */
gt_status gt_comm_device_allreduce(gt_comm *comm, const gt_device_backend *dev, int index, float *grads, size_t n,
                                   double *loss_sum);

/* Queues, the same way: buf (bytes of device memory) on every rank becomes rank `root`'s. */
gt_status gt_comm_device_broadcast(gt_comm *comm, const gt_device_backend *dev, int index, void *buf, size_t bytes,
                                   int root);

/* Queues, the same way: chunk r of params (n f32 of device memory, gt_comm_chunk's chunks) becomes
 * rank r's on every rank (ZeRO-1: each rank's updated shard to every rank). */
gt_status gt_comm_device_allgather(gt_comm *comm, const gt_device_backend *dev, int index, float *params, size_t n);

/* What a backend's queued collective calls with its status: a failure's message is kept in comm
 * (and comm is failed) for gt_comm_device_check. Returns `status`. */
gt_status gt_comm_device_failed(gt_comm *comm, gt_status status);

/* GT_OK, or the kept failure of a device collective (to call after a wait that covers them). */
gt_status gt_comm_device_check(gt_comm *comm);

/* Releases comm's device stream and events (waits for the stream). */
void gt_comm_device_free(gt_comm *comm);

#ifdef __cplusplus
}
#endif
#endif
