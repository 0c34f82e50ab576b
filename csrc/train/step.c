#include "train/step.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "dist/comm_device.h"
#include "train/grad_norm.h"
#include "train/step_device.h"
#include "train/zero.h"

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
        return GT_FAIL(GT_ERR_VALUE, "micro_batches must be >= 1, got %d", micro_batches);
    if (inputs->ndim < 1 || targets->ndim < 1 || inputs->shape[0] != targets->shape[0])
        return GT_FAIL(GT_ERR_VALUE, "y: expected %lld rows of targets to match x, got %lld",
                       inputs->ndim ? (long long)inputs->shape[0] : 0LL,
                       targets->ndim ? (long long)targets->shape[0] : 0LL);
    if (inputs->shape[0] == 0 || inputs->shape[0] % micro_batches != 0)
        return GT_FAIL(GT_ERR_VALUE,
                       "x: a batch of %lld rows does not split into %d equal micro-batches "
                       "(micro_batches); use a batch size divisible by it",
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

/* 1 when the optimizer is a ZeRO-1 shard (train/zero.h): gradients reduce-scattered, not all-reduced. */
static int sharded(const gt_step_config *cfg) { return cfg->optimizer && gt_optimizer_zero_size(cfg->optimizer) > 0; }

/* The number of data-parallel ranks whose micro-batches make up the step. */
static int world_size(const gt_step_config *cfg) { return cfg->comm ? cfg->comm->size : 1; }

/* Data parallelism: every rank's gradients (already divided by the number of micro-batches of
 * all ranks) are summed over the ranks in rank order during the last backward (the buckets of
 * gt_comm_overlap, each started once its gradients are final), and the loss sums after it, so
 * that the inf check, the norm, clipping and the update that follow are the same on every rank
 * and the same as one process accumulating the ranks' micro-batches in rank order. */
static gt_status final_grads(void *ctx, size_t final_from) {
    return gt_comm_overlap_ready(ctx, final_from);
}

/* The last micro-batch's backward with the gradient buckets' exchanges overlapping it. */
static gt_status backward_summed(gt_model *model, const gt_tensor *x, uint64_t micro, int accumulate,
                                 gt_comm *comm) {
    gt_comm_overlap ov;
    GT_TRY(gt_comm_overlap_begin(comm, model->grads.block.ptr, model->num_grads, comm->bucket_elems, &ov));
    gt_backward_hook hook = {.final = final_grads, .ctx = &ov};
    gt_status status = gt_model_backward_hooked(model, x, micro, accumulate, &hook);
    if (status != GT_OK) {
        gt_comm_overlap_abandon(&ov);
        return status;
    }
    return gt_comm_overlap_finish(&ov);
}

static gt_status sum_losses(gt_model *model, const gt_step_config *cfg, double *loss_sum) {
    if (!cfg->comm)
        return GT_OK;
    gt_status status = gt_comm_sum_f64(cfg->comm, *loss_sum, loss_sum);
    if (status != GT_OK)
        model->grads_valid = 0;
    return status;
}

/* Forward, loss and backward of every micro-batch, accumulating f32 gradients, and their mean
 * losses into *loss_sum; the losses are scaled by *loss_scale (NULL: 1). Both are the model's
 * memory: see gt_model_loss. */
static gt_status accumulate_gradients(gt_model *model, const gt_tensor *inputs,
                                      const gt_tensor *targets, const gt_step_config *cfg,
                                      const float *loss_scale, double *loss_sum) {
    int64_t rows = inputs->shape[0] / cfg->micro_batches;
    float dloss_divisor = (float)(cfg->micro_batches * world_size(cfg));
    GT_TRY(poll_interrupt(model, cfg, 0));
    if (!cfg->set_to_none && model->num_grads)
        GT_TRY(model->backend.ops->zero(&model->backend, model->grads.block.ptr,
                                        model->num_grads * sizeof(float)));
    uint64_t first_micro = cfg->comm ? (uint64_t)cfg->comm->rank * (uint64_t)cfg->micro_batches : 0;
    for (int m = 0; m < cfg->micro_batches; m++) {
        uint64_t micro = first_micro + (uint64_t)m;  /* its index in the step of all ranks (dropout) */
        gt_tensor x = micro_slice(inputs, m * rows, rows), y = micro_slice(targets, m * rows, rows);
        gt_tensor output;
        int accumulate = m > 0 || !cfg->set_to_none;  /* the gradients hold this step's sums */
        GT_TRY(poll_interrupt(model, cfg, accumulate));
        GT_TRY(gt_model_forward_step(model, &x, micro, &output));
        GT_TRY(gt_model_loss(model, &cfg->loss, &y, loss_scale, dloss_divisor, loss_sum));
        GT_TRY(poll_interrupt(model, cfg, accumulate));
        int overlap = cfg->comm && model->device->host_memory && !sharded(cfg) &&
                      m == cfg->micro_batches - 1;  /* a device's are queued after it (sum_over_ranks) */
        gt_status status = overlap ? backward_summed(model, &x, micro, accumulate, cfg->comm)
                               : gt_model_backward(model, &x, micro, accumulate);
        if (status != GT_OK && cfg->comm)
            model->grads_valid = 0;  /* part of them may be summed */
        GT_TRY(status);
    }
    model->grads_valid = 1;
    return GT_OK;
}

static gt_status device_sum_over_ranks(gt_model *model, gt_comm *comm) {
    gt_status status = gt_step_device_sum_over_ranks(model, comm);
    if (status != GT_OK)
        model->grads_valid = 0;  /* part of them may be summed */
    return status;
}

/* 1 for a deferred step with a scaler while earlier deferred steps are unresolved. */
static int lagging(const gt_step_config *cfg) {
    return cfg->deferred && cfg->optimizer && gt_optimizer_pending(cfg->optimizer) > 0;
}

/* Data parallelism after the last backward. A model in host memory (the cpu) has exchanged its
 * gradient buckets during that backward (backward_summed) or, as a ZeRO-1 shard, reduce-scatters
 * them here with the inf check and the norm of gt_zero_sums written into the record (*sums_done);
 * its loss sum is summed by the host. On a device the sums of the gradients and of the loss are
 * queued on it. */
static gt_status sum_over_ranks(gt_model *model, const gt_step_config *cfg, const gt_scaler *scaler, int want_norm,
                                int *sums_done) {
    gt_step_record *record = gt_step_device_record(model, model->step_record);
    if (!model->device->host_memory)
        return device_sum_over_ranks(model, cfg->comm);
    GT_TRY(sum_losses(model, cfg, &record->loss_sum));
    if (!sharded(cfg))
        return GT_OK;
    *sums_done = 1;
    gt_status status = gt_zero_sums(cfg->comm, model->grads.block.ptr, model->num_grads, scaler, want_norm,
                                    &record->found_inf, &record->grad_sumsq);
    if (status != GT_OK)
        model->grads_valid = 0;  /* part of them may be summed */
    if (status == GT_OK && scaler)
        status = gt_step_device_scaler_update(model);
    return status;
}

/* The step's sums: everything is queued on the model's stream (the losses summed into the step
 * record, the offloaded share's gradients copied into its staging), then the record is read back,
 * the step's one wait (on the cpu the work is done as it is queued). A failure of the queued work
 * (e.g. a target out of range) surfaces at that read, before the update. */
static gt_status step_sums(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                           const gt_step_config *cfg, const gt_scaler *scaler, int want_norm, gt_step_sums *out) {
    GT_TRY(gt_step_device_begin(model, cfg->record));
    gt_step_record *record = gt_step_device_record(model, cfg->record);
    const float *loss_scale = NULL;
    if (scaler && lagging(cfg))
        loss_scale = gt_step_device_own_scale(model);
    else if (scaler)
        GT_TRY(gt_step_device_scale(model, scaler, &loss_scale));
    GT_TRY(accumulate_gradients(model, inputs, targets, cfg, loss_scale, &record->loss_sum));
    int sums_done = 0;
    if (cfg->comm)
        GT_TRY(sum_over_ranks(model, cfg, scaler, want_norm, &sums_done));
    if (scaler && !sums_done)
        GT_TRY(gt_step_device_unscale(model));
    if (want_norm && !sums_done)
        GT_TRY(gt_step_device_sumsq(model));
    if (cfg->deferred) {  /* the result stays in the record: no wait, nothing on the host depends on it */
        if (cfg->max_grad_norm > 0.0)  /* the clip, decided on the device from the record's norm */
            GT_TRY(gt_step_device_clip(model, cfg->max_grad_norm));
        *out = (gt_step_sums){.loss_sum = NAN, .grad_sumsq = NAN};
        return GT_OK;
    }
    if (cfg->optimizer)
        GT_TRY(gt_optimizer_prefetch(cfg->optimizer));
    gt_status status = gt_step_device_read(model, cfg->record, out);
    if (status == GT_OK && cfg->comm)  /* the read waited for the collectives too */
        status = gt_comm_device_check(cfg->comm);
    if (status != GT_OK) {
        model->grads_valid = 0;  /* the queued backward may have stopped part way */
        return status;
    }
    if (scaler)
        gt_step_device_scaler_ran(model, out->found_inf);
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

/* The step's sums (losses, inf check, gradient sum of squares) up to the last point before
 * anything is updated. */
static gt_status prepare_update(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                                const gt_step_config *cfg, const gt_scaler *scaler, int want_norm,
                                gt_step_sums *sums) {
    GT_TRY(step_sums(model, inputs, targets, cfg, scaler, want_norm, sums));
    return poll_interrupt(model, cfg, 1);  /* the last point before anything is updated */
}

/* A deferred step leaves every decision of the update to the device, so nothing may need the
 * result on the host. Clipping is decided there (gt_step_device_clip). With a scaler, found_inf
 * decides on the device whether the update runs (gt_optimizer_step_deferred: its constants come
 * from a table indexed by the device's count of updates) and the device updates its scaler; the
 * host resolves the step later from its record (the optimizer's ring), so the optimizer must be
 * able to defer. The guard's next limits are made from this step's loss and norm: refused. */
static gt_status check_deferred(const gt_model *model, const gt_step_config *cfg) {
    if (cfg->record < 0 || cfg->record >= GT_STEP_RECORDS)
        return GT_FAIL(GT_ERR_VALUE, "record: must be in [0, %d), got %d", GT_STEP_RECORDS, cfg->record);
    if (!cfg->deferred)
        return GT_OK;
    if (model->device->host_memory)  /* its work is done when queued: nothing to defer */
        return GT_FAIL(GT_ERR_VALUE, "sync: a deferred result needs a model on an accelerator (cuda:N or sim:N)");
    if (cfg->guard)
        return GT_FAIL(GT_ERR_VALUE, "sync=False: a spike guard decides the update from the step's result on the "
                       "host; use sync=True (one wait per step) with it");
    if (!cfg->scaler || !cfg->scaler->enabled)
        return GT_OK;
    if (!cfg->optimizer)
        return GT_FAIL(GT_ERR_VALUE, "optimizer: sync=False with a GradScaler needs the optimizer, whose deferred "
                       "steps resolve the scaler's updates");
    return gt_optimizer_check_deferred(cfg->optimizer, cfg->lrs, cfg->lrs_len);
}

/* A device model's collectives run on its device; whether they succeeded (a rank may have died)
 * is known at the step's read, before the update: a deferred step (no read) would update from
 * gradients that were never summed. */
static gt_status check_comm(const gt_model *model, const gt_step_config *cfg) {
    if (cfg->comm && cfg->deferred)
        return GT_FAIL(GT_ERR_VALUE, "sync=False: data parallelism checks the collectives at the step's read, "
                       "before the update; use sync=True with distributed.init()");
    return GT_OK;
}

/* A ZeRO-1 shard is updated in a step of the rank and world size it was cut for. */
static gt_status check_zero(const gt_step_config *cfg) {
    if (sharded(cfg) && (!cfg->comm || cfg->comm->size != gt_optimizer_zero_size(cfg->optimizer) ||
                         cfg->comm->rank != gt_optimizer_zero_rank(cfg->optimizer)))
        return GT_FAIL(GT_ERR_VALUE, "optimizer: zero_stage=1 sharded it for rank %d of %d; the step needs the "
                       "communicator of that rank (gputrain.distributed.init() in the same job)",
                       gt_optimizer_zero_rank(cfg->optimizer), gt_optimizer_zero_size(cfg->optimizer));
    return GT_OK;
}

/* Every rank's updated shard to every rank, queued on the model's device after the update (its
 * offloaded share's copies included), before the half copy's refresh. */
static gt_status gather_shards(gt_model *model, gt_comm *comm) { return gt_step_device_gather_shards(model, comm); }

_Static_assert(offsetof(gt_step_record, sumsq_totals) <= GT_OPTIM_RESULT_BYTES,
               "a step record's head is a deferred step's result");

/* A deferred step with a scaler: the update, skipped on the device by the record's inf flag, and
 * the record handed to the host through the optimizer's ring. */
static gt_status deferred_update(gt_model *model, const gt_step_config *cfg) {
    const gt_step_record *record = gt_step_device_record(model, cfg->record);
    GT_TRY(gt_optimizer_step_deferred(cfg->optimizer, &record->found_inf, cfg->lrs, record,
                                      offsetof(gt_step_record, sumsq_totals)));
    GT_TRY(gt_model_refresh_trainable_lowp(model));
    model->step++;
    return GT_OK;
}

static gt_status train_step(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                            const gt_step_config *cfg, gt_step_result *out) {
    GT_TRY(check_batch(inputs, targets, cfg->micro_batches));
    GT_TRY(check_deferred(model, cfg));
    GT_TRY(check_comm(model, cfg));
    GT_TRY(check_zero(cfg));
    memset(out, 0, sizeof *out);
    gt_scaler *scaler = cfg->scaler && cfg->scaler->enabled ? cfg->scaler : NULL;
    out->scale = scaler ? scaler->scale : 1.0f;
    out->grad_norm = NAN;
    int want_norm = cfg->max_grad_norm > 0.0 || cfg->want_grad_norm || cfg->guard;
    gt_step_sums sums = {0};
    GT_TRY(gt_model_save_buffers(model));
    gt_status status = prepare_update(model, inputs, targets, cfg, scaler, want_norm, &sums);
    if (status != GT_OK)
        return undo_buffers(model, status);
    out->loss = sums.loss_sum / (cfg->micro_batches * world_size(cfg));
    int found_inf = sums.found_inf;
    float grad_coef = 1.0f;
    if (!found_inf && want_norm && !cfg->deferred) {  /* deferred: clipped on the device */
        out->grad_norm = sqrt(sums.grad_sumsq);
        if (cfg->max_grad_norm > 0.0)
            grad_coef = gt_clip_coef(cfg->max_grad_norm, out->grad_norm);
    }
    if (cfg->deferred && scaler)  /* the device decides and counts; the host resolves it later */
        return deferred_update(model, cfg);
    out->outlier = !found_inf && is_outlier(cfg, out);
    out->skipped = found_inf || out->outlier;
    if (!out->skipped && cfg->optimizer) {
        GT_TRY(gt_optimizer_step(cfg->optimizer, grad_coef));
        if (sharded(cfg))
            GT_TRY(gather_shards(model, cfg->comm));
        GT_TRY(gt_model_refresh_trainable_lowp(model));
    }
    if (scaler && !out->outlier)  /* a device model's made the same update there (gt_step_device_unscale) */
        gt_scaler_update(scaler, found_inf);
    model->step++;
    return GT_OK;
}

gt_status gt_train_step(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                        const gt_step_config *cfg, gt_step_result *out) {
    gt_status status = train_step(model, inputs, targets, cfg, out);
    if (cfg->optimizer)  /* gradients staged for an update that did not run are not reused */
        gt_optimizer_unstage(cfg->optimizer);
    return status;
}

gt_status gt_step_read_record(gt_model *model, int record, int micro_batches, int want_norm, gt_step_result *out) {
    if (model->device->host_memory)  /* the cpu's step is never deferred: its result is the step's */
        return GT_FAIL(GT_ERR_VALUE, "model: step records are kept by models on an accelerator (cuda:N or sim:N)");
    if (record < 0 || record >= GT_STEP_RECORDS || micro_batches < 1)
        return GT_FAIL(GT_ERR_VALUE, "record: must be in [0, %d) with micro_batches >= 1, got %d and %d",
                       GT_STEP_RECORDS, record, micro_batches);
    gt_step_sums sums = {0};
    GT_TRY(gt_step_device_read(model, record, &sums));
    *out = (gt_step_result){.loss = sums.loss_sum / micro_batches, .grad_norm = want_norm ? sqrt(sums.grad_sumsq) : NAN,
                            .scale = 1.0f};
    return GT_OK;
}
