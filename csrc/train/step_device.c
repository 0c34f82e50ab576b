#include "train/step_device.h"

#include "core/alloc.h"

/* Device scratch of one step (in the model's step_scratch block): the scaler state the kernel
 * reads, and the inf flag it sets. */
typedef struct step_scratch {
    gt_scaler scaler;  /* copy of the host scaler (scale, enabled, ...) */
    int found_inf;     /* 0 before the kernel, 1 after it if a gradient was not finite */
} step_scratch;

_Static_assert(sizeof(step_scratch) <= GT_MODEL_STEP_SCRATCH_BYTES, "the model's step scratch is too small");

/* With the scratch allocated: copy in, unscale on the default stream, read the flag. The
 * blocking copies are ordered with that stream, so with the model's kernels too. */
static gt_status unscale_with(gt_model *model, const gt_scaler *scaler, step_scratch *scratch, int *flag) {
    int index = model->backend.device.index;
    step_scratch host = {.scaler = *scaler, .found_inf = 0};
    GT_TRY(model->device->memcpy(index, scratch, &host, sizeof host));
    GT_TRY(model->device->scaler_unscale_check(index, NULL, &scratch->scaler, model->grads.block.ptr,
                                               model->num_params, &scratch->found_inf));
    return model->device->memcpy(index, flag, &scratch->found_inf, sizeof *flag);
}

static gt_status require_device_model(const gt_model *model) {
    if (!model->device)
        return GT_FAIL(GT_ERR_VALUE, "model: expected a model on an accelerator (cuda:N or sim:N)");
    return GT_OK;
}

gt_status gt_step_unscale_check_device(gt_model *model, const gt_scaler *scaler, int *found_inf) {
    GT_TRY(require_device_model(model));
    if (model->num_params == 0)
        return GT_OK;
    int flag = 0;
    GT_TRY(unscale_with(model, scaler, model->step_scratch.ptr, &flag));
    if (flag)
        *found_inf = 1;
    return GT_OK;
}

gt_status gt_step_grad_sumsq_device(gt_model *model, double *out) {
    GT_TRY(require_device_model(model));
    *out = 0.0;
    if (model->num_params == 0)
        return GT_OK;
    return model->device->grad_sumsq(model->backend.device.index, NULL, model->grads.block.ptr,
                                     model->num_params, out);
}
