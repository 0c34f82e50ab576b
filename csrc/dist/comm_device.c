/* comm_device.h: a device model's collectives on the communicator's stream. */
#include "dist/comm_device.h"

#include <stdlib.h>

void gt_comm_device_free(gt_comm *comm) {
    gt_comm_device *d = comm->device;
    if (!d)
        return;
    d->dev->stream_destroy(d->index, d->stream);
    d->dev->event_destroy(d->index, d->ready);
    d->dev->event_destroy(d->index, d->summed);
    free(d);
    comm->device = NULL;
}

/* comm->device for device `index` of `dev`, created (or re-created for another device). */
static gt_status device_of(gt_comm *comm, const gt_device_backend *dev, int index, gt_comm_device **out) {
    if (comm->device && comm->device->dev == dev && comm->device->index == index) {
        *out = comm->device;
        return GT_OK;
    }
    gt_comm_device_free(comm);
    gt_comm_device *d = calloc(1, sizeof *d);
    if (!d)
        return GT_FAIL(GT_ERR_OOM, "communicator: out of host memory for its device stream");
    *d = (gt_comm_device){.dev = dev, .index = index};
    comm->device = d;
    gt_status status = dev->stream_create(index, &d->stream);
    if (status == GT_OK)
        status = dev->event_create(index, &d->ready);
    if (status == GT_OK)
        status = dev->event_create(index, &d->summed);
    if (status != GT_OK) {
        gt_comm_device_free(comm);
        return status;
    }
    *out = d;
    return GT_OK;
}

/* comm's stream on the device, made to wait for the work queued so far on the default stream. */
static gt_status begin(gt_comm *comm, const gt_device_backend *dev, int index, gt_comm_device **out) {
    GT_TRY(device_of(comm, dev, index, out));
    GT_TRY(dev->event_record(index, (*out)->ready, NULL));
    return dev->stream_wait_event(index, (*out)->stream, (*out)->ready);
}

/* The default stream's later work waits for the collectives queued on comm's stream. */
static gt_status end(gt_comm_device *d) {
    GT_TRY(d->dev->event_record(d->index, d->summed, d->stream));
    return d->dev->stream_wait_event(d->index, NULL, d->summed);
}

gt_status gt_comm_device_allreduce(gt_comm *comm, const gt_device_backend *dev, int index, float *grads, size_t n,
                                   double *loss_sum) {
    gt_comm_device *d = NULL;
    GT_TRY(begin(comm, dev, index, &d));
    GT_TRY(dev->allreduce_sum(index, d->stream, comm, GT_F32, grads, n));
    GT_TRY(dev->allreduce_sum(index, d->stream, comm, GT_F64, loss_sum, 1));
    return end(d);
}

gt_status gt_comm_device_broadcast(gt_comm *comm, const gt_device_backend *dev, int index, void *buf, size_t bytes,
                                   int root) {
    gt_comm_device *d = NULL;
    GT_TRY(begin(comm, dev, index, &d));
    GT_TRY(dev->broadcast(index, d->stream, comm, buf, bytes, root));
    return end(d);
}

gt_status gt_comm_device_allgather(gt_comm *comm, const gt_device_backend *dev, int index, float *params, size_t n) {
    gt_comm_device *d = NULL;
    GT_TRY(begin(comm, dev, index, &d));
    GT_TRY(dev->allgather(index, d->stream, comm, params, n));
    return end(d);
}

gt_status gt_comm_device_failed(gt_comm *comm, gt_status status) {
    if (status == GT_OK || comm->device_failed)
        return status;
    gt_error_save(status, &comm->device_failure);
    comm->device_failed = 1;
    comm->failed = 1;
    return status;
}

gt_status gt_comm_device_check(gt_comm *comm) {
    return comm->device_failed ? gt_error_restore(&comm->device_failure) : GT_OK;
}
