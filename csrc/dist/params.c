#include "dist/params.h"

#include "dist/comm_device.h"

/* Queued on comm's stream of the model's device (the cpu's runs at once), then the half copy,
 * then one wait. */
gt_status gt_dist_broadcast_params(gt_comm *comm, gt_model *model, int root) {
    if (root < 0 || root >= comm->size)
        return GT_FAIL(GT_ERR_VALUE, "root must be in [0, %d), got %d", comm->size, root);
    int index = model->backend.device.index;
    GT_TRY(gt_comm_device_broadcast(comm, model->device, index, model->params.block.ptr,
                                    model->num_params * sizeof(float), root));
    GT_TRY(gt_model_refresh_lowp(model));
    GT_TRY(model->device->stream_synchronize(index, NULL));
    return gt_comm_device_check(comm);
}
