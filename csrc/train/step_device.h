/* The parts of the training step (train/step.c) that run on the model's device through
 * core/device_backend.h (the cpu's table runs them at once), with the step record (nn/model.h's gt_step_record, in the model's
 * step scratch) as the only memory they touch besides the model's arenas: the loss sum, the
 * loss scaler's unscale + inf check and growth/backoff (its state kept in the step scratch) and
 * the gradients' sum of squares are queued on the model's stream, and the host reads the record
 * back once per step, its only wait. */
#ifndef GT_TRAIN_STEP_DEVICE_H
#define GT_TRAIN_STEP_DEVICE_H

#include "dist/comm.h"
#include "nn/model.h"
#include "train/scaler.h"

/* What the host reads back: the record up to its scratch. */
typedef struct gt_step_sums {
    double loss_sum;    /* sum of the micro-batches' mean losses */
    double grad_sumsq;  /* sum of squares of the unscaled gradients (when queued) */
    int found_inf;      /* 1 when the unscale saw a NaN/Inf gradient */
} gt_step_sums;

/* Record `index` (< GT_STEP_RECORDS) of a device model's step scratch. */
gt_step_record *gt_step_device_record(gt_model *model, int index);

/* Queues zeros into record `record`'s loss sum, sum of squares and inf flag (a device model);
 * the functions below use that record until the next begin. */
gt_status gt_step_device_begin(gt_model *model, int record);

/* The device's loss scaler (the step scratch's), for a step with *scaler: *scale = its scale
 * (device memory), which the step's loss ops read. *scaler is queued in first only when the
 * device's state is not known to equal it (the model's mirror: after load_state_dict,
 * update(new_scale), another scaler, a failed step or a guard's outlier). */
gt_status gt_step_device_scale(gt_model *model, const gt_scaler *scaler, const float **scale);

/* The device's loss scaler for a deferred step while earlier ones are unresolved: the host's
 * scaler lags the device's (whose updates are the ones to come), so nothing is queued in. */
const float *gt_step_device_own_scale(gt_model *model);

/* Queues gt_scaler_unscale_check on the (num_params,) gradient arena with the device's scaler
 * (as gt_step_device_scale left it), setting the record's inf flag, then the scaler's
 * growth/backoff from that flag on the device (core/scaler_rules.h). */
gt_status gt_step_device_unscale(gt_model *model);

/* Queues the device scaler's growth/backoff from the record's inf flag (core/scaler_rules.h), for
 * a step whose inf flag was set otherwise (a ZeRO-1 shard's in host memory: train/zero.h). */
gt_status gt_step_device_scaler_update(gt_model *model);

/* Records that the queued scaler update has run with `found_inf` (after the record's read): the
 * mirror follows the device's state, so the next step copies nothing when the host's scaler
 * made the same update. */
void gt_step_device_scaler_ran(gt_model *model, int found_inf);

/* Queues the gradients' sum of squares into the record, in the CPU's order (the same bits). */
gt_status gt_step_device_sumsq(gt_model *model);

/* Queues the clipping of the gradient arena by the coefficient of the record's sum of squares
 * (queued before by gt_step_device_sumsq; core/clip_rules.h), in place: the update that follows
 * reads them with grad_coef 1 and gives the bits of the host's clip (nothing waits). */
gt_status gt_step_device_clip(gt_model *model, double max_norm);

/* Data parallelism for a device model: queues the rank-order sum of the (num_params,) gradients
 * and of the record's loss sum over comm's ranks, run by the device on comm's stream between two
 * events (dist/comm_device.h), before the unscale, the norm and the update that the model's
 * stream runs next. No host wait: a failure of the collective is known after the step's read
 * (gt_comm_device_check). */
gt_status gt_step_device_sum_over_ranks(gt_model *model, gt_comm *comm);

/* ZeRO-1 (train/zero.h): queues the all-gather of the parameters' shards (each rank updated its
 * own) over comm's ranks on comm's stream, after the update and before the model's stream goes
 * on. No host wait: a failure is known at the next wait (the next step's read; the stream's error
 * is sticky). */
gt_status gt_step_device_gather_shards(gt_model *model, gt_comm *comm);

/* Reads record `record` back: the host waits for everything queued so far (one sync). */
gt_status gt_step_device_read(gt_model *model, int record, gt_step_sums *out);

#endif
