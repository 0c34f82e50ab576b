#include "train/step_device.h"

#include <stddef.h>

/* The record's fields the step resets (loss sum, sum of squares, count, mse, inf flag). */
static const gt_step_record zero_record;

static int index_of(const gt_model *model) { return model->backend.device.index; }

gt_step_record *gt_step_device_record(gt_model *model, int index) {
    return (gt_step_record *)model->step_scratch.ptr + index;
}

/* The record the step in progress writes (set by gt_step_device_begin). */
static gt_step_record *current(gt_model *model) { return gt_step_device_record(model, model->step_record); }

gt_status gt_step_device_begin(gt_model *model, int record) {
    model->step_record = record;
    return model->device->memcpy_async(index_of(model), NULL, current(model), &zero_record,
                                       offsetof(gt_step_record, scaler));
}

gt_status gt_step_device_unscale(gt_model *model, const gt_scaler *scaler) {
    if (model->num_params == 0)
        return GT_OK;
    gt_step_record *record = current(model);
    GT_TRY(model->device->memcpy_async(index_of(model), NULL, &record->scaler, scaler, sizeof *scaler));
    return model->device->scaler_unscale_check(index_of(model), NULL, &record->scaler, model->grads.block.ptr,
                                               model->num_params, &record->found_inf);
}

gt_status gt_step_device_sumsq(gt_model *model) {
    gt_step_record *record = current(model);
    return model->device->grad_sumsq_async(index_of(model), NULL, model->grads.block.ptr, model->num_params,
                                           &record->grad_sumsq, record->sumsq_totals);
}

gt_status gt_step_device_clip(gt_model *model, double max_norm) {
    return model->device->grad_clip(index_of(model), NULL, model->grads.block.ptr, model->num_params,
                                    &current(model)->grad_sumsq, max_norm);
}

gt_status gt_step_device_read(gt_model *model, int record, gt_step_sums *out) {
    gt_step_record head;
    GT_TRY(model->device->memcpy(index_of(model), &head, gt_step_device_record(model, record),
                                 offsetof(gt_step_record, sumsq_totals)));
    *out = (gt_step_sums){.loss_sum = head.loss_sum, .grad_sumsq = head.grad_sumsq, .found_inf = head.found_inf};
    return GT_OK;
}
