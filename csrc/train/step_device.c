#include "train/step_device.h"

#include <stddef.h>

#include "dist/comm_device.h"

/* The record's fields the step resets (loss sum, sum of squares, count, mse, inf flag). */
static const gt_step_record zero_record;

static int index_of(const gt_model *model) { return model->backend.device.index; }

static gt_step_scratch *scratch_of(gt_model *model) { return model->step_scratch.ptr; }

gt_step_record *gt_step_device_record(gt_model *model, int index) { return &scratch_of(model)->records[index]; }

/* The record the step in progress writes (set by gt_step_device_begin). */
static gt_step_record *current(gt_model *model) { return gt_step_device_record(model, model->step_record); }

gt_status gt_step_device_begin(gt_model *model, int record) {
    model->step_record = record;
    return model->device->memcpy_async(index_of(model), NULL, current(model), &zero_record,
                                       offsetof(gt_step_record, sumsq_totals));
}

/* 1 when two scalers hold the same state (field by field: the struct has padding). */
static int same_scaler(const gt_scaler *a, const gt_scaler *b) {
    return a->scale == b->scale && a->growth_tracker == b->growth_tracker && a->growth_factor == b->growth_factor &&
           a->backoff_factor == b->backoff_factor && a->growth_interval == b->growth_interval &&
           a->min_scale == b->min_scale && a->enabled == b->enabled && a->skipped_steps == b->skipped_steps &&
           a->consecutive_skipped_steps == b->consecutive_skipped_steps;
}

gt_status gt_step_device_scale(gt_model *model, const gt_scaler *scaler, const float **scale) {
    gt_scaler *state = &scratch_of(model)->scaler;
    if (!model->scaler_mirrored || !same_scaler(&model->scaler_mirror, scaler)) {
        model->scaler_mirror = *scaler;  /* the copy's source: unchanged until the step's read */
        GT_TRY(model->device->memcpy_async(index_of(model), NULL, state, &model->scaler_mirror, sizeof *scaler));
    }
    model->scaler_mirrored = 0;  /* until gt_step_device_scaler_ran */
    *scale = &state->scale;
    return GT_OK;
}

const float *gt_step_device_own_scale(gt_model *model) {
    model->scaler_mirrored = 0;  /* the host's scaler is not the device's until every step is resolved */
    return &scratch_of(model)->scaler.scale;
}

gt_status gt_step_device_unscale(gt_model *model) {
    gt_scaler *state = &scratch_of(model)->scaler;
    gt_step_record *record = current(model);
    GT_TRY(model->device->scaler_unscale_check(index_of(model), NULL, state, model->grads.block.ptr,
                                               model->num_grads, &record->found_inf));
    return gt_step_device_scaler_update(model);
}

gt_status gt_step_device_scaler_update(gt_model *model) {
    return model->device->scaler_update(index_of(model), NULL, &scratch_of(model)->scaler, &current(model)->found_inf);
}

void gt_step_device_scaler_ran(gt_model *model, int found_inf) {
    gt_scaler_update(&model->scaler_mirror, found_inf);
    model->scaler_mirrored = 1;
}

gt_status gt_step_device_sumsq(gt_model *model) {
    gt_step_record *record = current(model);
    return model->device->grad_sumsq_async(index_of(model), NULL, model->grads.block.ptr, model->num_grads,
                                           &record->grad_sumsq, record->sumsq_totals);
}

gt_status gt_step_device_clip(gt_model *model, double max_norm) {
    return model->device->grad_clip(index_of(model), NULL, model->grads.block.ptr, model->num_grads,
                                    &current(model)->grad_sumsq, max_norm);
}

gt_status gt_step_device_read(gt_model *model, int record, gt_step_sums *out) {
    gt_step_record head;
    GT_TRY(model->device->memcpy(index_of(model), &head, gt_step_device_record(model, record),
                                 offsetof(gt_step_record, sumsq_totals)));
    *out = (gt_step_sums){.loss_sum = head.loss_sum, .grad_sumsq = head.grad_sumsq, .found_inf = head.found_inf};
    return GT_OK;
}

gt_status gt_step_device_gather_shards(gt_model *model, gt_comm *comm) {
    return gt_comm_device_allgather(comm, model->device, index_of(model), model->params.block.ptr, model->num_params);
}

gt_status gt_step_device_sum_over_ranks(gt_model *model, gt_comm *comm) {
    return gt_comm_device_allreduce(comm, model->device, index_of(model), model->grads.block.ptr, model->num_grads,
                                    &current(model)->loss_sum);
}
