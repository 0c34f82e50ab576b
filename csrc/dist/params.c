#include "dist/params.h"

#include "dist/comm_device.h"

/* A device model's: queued on comm's device stream, then the half copy, then one wait. */
static gt_status broadcast_on_device(gt_comm *comm, gt_model *model, int root) {
    int index = model->backend.device.index;
    GT_TRY(gt_comm_device_broadcast(comm, model->device, index, model->params.block.ptr,
                                    model->num_params * sizeof(float), root));
    GT_TRY(gt_model_refresh_lowp(model));
    GT_TRY(model->device->stream_synchronize(index, NULL));
    return gt_comm_device_check(comm);
}

gt_status gt_dist_broadcast_params(gt_comm *comm, gt_model *model, int root) {
    if (root < 0 || root >= comm->size)
        return GT_FAIL(GT_ERR_VALUE, "root must be in [0, %d), got %d", comm->size, root);
    if (model->device)
        return broadcast_on_device(comm, model, root);
    GT_TRY(gt_comm_broadcast(comm, model->params.block.ptr, model->num_params * sizeof(float), root));
    return gt_model_refresh_lowp(model);
}
