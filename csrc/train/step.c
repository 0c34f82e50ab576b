#include "train/step.h"

#include <math.h>
#include <string.h>

#include "train/grad_norm.h"
#include "train/step_device.h"

/* Rows [first, first + count) of a batch tensor, as a tensor of its own. */
static gt_tensor micro_slice(const gt_tensor *batch, int64_t first, int64_t count) {
    gt_tensor slice = *batch;
    size_t row_bytes = batch->shape[0] ? gt_tensor_bytes(batch) / (size_t)batch->shape[0] : 0;
    slice.ptr = (char *)batch->ptr + (size_t)first * row_bytes;
    slice.shape[0] = count;
    return slice;
}

static gt_status check_batch(const gt_tensor *inputs, const gt_tensor *targets, int micro_batches) {
    if (micro_batches < 1)
        return GT_FAIL(GT_ERR_VALUE, "gradient_accumulation_steps must be >= 1, got %d", micro_batches);
    if (inputs->ndim < 1 || targets->ndim < 1 || inputs->shape[0] != targets->shape[0])
        return GT_FAIL(GT_ERR_VALUE, "y: expected %lld rows of targets to match x, got %lld",
                       inputs->ndim ? (long long)inputs->shape[0] : 0LL,
                       targets->ndim ? (long long)targets->shape[0] : 0LL);
    if (inputs->shape[0] == 0 || inputs->shape[0] % micro_batches != 0)
        return GT_FAIL(GT_ERR_VALUE,
                       "x: a batch of %lld rows does not split into %d equal micro-batches "
                       "(gradient_accumulation_steps); use a batch size divisible by it",
                       (long long)inputs->shape[0], micro_batches);
    return GT_OK;
}

gt_status gt_train_step_prepare(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                                const gt_step_config *cfg) {
    GT_TRY(check_batch(inputs, targets, cfg->micro_batches));
    gt_tensor x = *inputs, y = *targets;  /* the first micro-batch's shapes */
    x.shape[0] /= cfg->micro_batches;
    y.shape[0] /= cfg->micro_batches;
    GT_TRY(gt_model_prepare(model, &x));
    return gt_model_check_targets(model, &cfg->loss, &y);
}

/* Abandons the step when an interrupt was requested (cfg->interruptible). Nothing but the
 * gradients (once `grads_written`) and scratch memory has changed before the update, so the
 * gradients are marked invalid and the rest is as before the step. */
static gt_status poll_interrupt(gt_model *model, const gt_step_config *cfg, int grads_written) {
    if (!cfg->interruptible || !gt_interrupt_pending())
        return GT_OK;
    if (grads_written)
        model->grads_valid = 0;
    return GT_FAIL(GT_ERR_INTERRUPTED, "the training step was interrupted before its update (nothing applied)");
}

/* Forward, loss and backward of every micro-batch, accumulating f32 gradients. */
static gt_status accumulate_gradients(gt_model *model, const gt_tensor *inputs,
                                      const gt_tensor *targets, const gt_step_config *cfg,
                                      float loss_scale, double *mean_loss) {
    int64_t rows = inputs->shape[0] / cfg->micro_batches;
    float dloss_scale = loss_scale / (float)cfg->micro_batches;
    GT_TRY(poll_interrupt(model, cfg, 0));
    if (!cfg->set_to_none && model->num_params)
        GT_TRY(model->backend.ops->zero(&model->backend, model->grads.block.ptr,
                                        model->num_params * sizeof(float)));
    double loss_sum = 0.0;
    for (int m = 0; m < cfg->micro_batches; m++) {
        gt_tensor x = micro_slice(inputs, m * rows, rows), y = micro_slice(targets, m * rows, rows);
        gt_tensor output;
        double loss = 0.0;
        int64_t count = 0;
        int accumulate = m > 0 || !cfg->set_to_none;  /* the gradients hold this step's sums */
        GT_TRY(poll_interrupt(model, cfg, accumulate));
        GT_TRY(gt_model_forward(model, &x, (uint64_t)m, &output));
        GT_TRY(gt_model_loss(model, &cfg->loss, &y, dloss_scale, 1, &loss, &count));
        GT_TRY(poll_interrupt(model, cfg, accumulate));
        GT_TRY(gt_model_backward(model, &x, (uint64_t)m, accumulate));
        loss_sum += loss;
    }
    model->grads_valid = 1;
    *mean_loss = loss_sum / cfg->micro_batches;
    return GT_OK;
}

/* The scaler's unscale + inf check over the gradient arena, where the model's arenas live. */
static gt_status unscale_check(gt_model *model, const gt_scaler *scaler, int *found_inf) {
    if (model->device)
        return gt_step_unscale_check_device(model, scaler, found_inf);
    return gt_scaler_unscale_check(scaler, model->grads.block.ptr, model->num_params, found_inf);
}

/* The global L2 norm of the gradient arena; on a device with the kernel that sums in the CPU's
 * order (core/sumsq_order.h), on the model's stream (the default one). */
static gt_status grad_norm(gt_model *model, double *out) {
    if (!model->device)
        return gt_grad_norm_l2(model->grads.block.ptr, model->num_params, out);
    double sumsq = 0.0;
    GT_TRY(gt_step_grad_sumsq_device(model, &sumsq));
    *out = sqrt(sumsq);
    return GT_OK;
}

/* The guard's verdict on a step whose gradients are finite: an outlier unless its loss and its
 * gradient norm are both at most their limits (so a NaN loss or norm is one). */
static int is_outlier(const gt_step_config *cfg, const gt_step_result *out) {
    return cfg->guard && !(out->loss <= cfg->guard_loss && out->grad_norm <= cfg->guard_grad_norm);
}

/* The running statistics as the step found them, after a failure before its update (`status`
 * is returned with its message). */
static gt_status undo_buffers(gt_model *model, gt_status status) {
    gt_error_state saved;
    gt_error_save(status, &saved);
    (void)gt_model_restore_buffers(model);  /* a copy the step already made once */
    return gt_error_restore(&saved);
}

/* Gradients, unscale + inf check and clipping coefficient of the step, up to the last point
 * before anything is updated; *grad_coef multiplies the gradients in the update. */
static gt_status prepare_update(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                                const gt_step_config *cfg, gt_scaler *scaler, int *found_inf,
                                float *grad_coef, gt_step_result *out) {
    GT_TRY(accumulate_gradients(model, inputs, targets, cfg, out->scale, &out->loss));
    if (scaler)
        GT_TRY(unscale_check(model, scaler, found_inf));
    if (!*found_inf && (cfg->max_grad_norm > 0.0 || cfg->want_grad_norm || cfg->guard)) {
        GT_TRY(grad_norm(model, &out->grad_norm));
        if (cfg->max_grad_norm > 0.0)
            *grad_coef = gt_clip_coef(cfg->max_grad_norm, out->grad_norm);
    }
    return poll_interrupt(model, cfg, 1);  /* the last point before anything is updated */
}

gt_status gt_train_step(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                        const gt_step_config *cfg, gt_step_result *out) {
    GT_TRY(check_batch(inputs, targets, cfg->micro_batches));
    memset(out, 0, sizeof *out);
    gt_scaler *scaler = cfg->scaler && cfg->scaler->enabled ? cfg->scaler : NULL;
    out->scale = scaler ? scaler->scale : 1.0f;
    out->grad_norm = NAN;
    int found_inf = 0;
    float grad_coef = 1.0f;
    GT_TRY(gt_model_save_buffers(model));
    gt_status status = prepare_update(model, inputs, targets, cfg, scaler, &found_inf, &grad_coef, out);
    if (status != GT_OK)
        return undo_buffers(model, status);
    out->outlier = !found_inf && is_outlier(cfg, out);
    out->skipped = found_inf || out->outlier;
    if (!out->skipped && cfg->optimizer) {
        GT_TRY(gt_optimizer_step(cfg->optimizer, grad_coef));
        GT_TRY(gt_model_refresh_lowp(model));
    }
    if (scaler && !out->outlier)  /* on the host for device models too: found_inf is here, the rules are the kernel's */
        gt_scaler_update(scaler, found_inf);
    model->step++;
    return GT_OK;
}
