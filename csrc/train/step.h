/* The one-call training step (DESIGN.md principle 2): every micro-batch's forward, loss and
 * backward, loss scaling, unscale + inf check, clipping, the optimizer update and the scaler
 * update, with no Python in between. */
#ifndef GT_TRAIN_STEP_H
#define GT_TRAIN_STEP_H

#include "nn/model.h"
#include "train/optim.h"
#include "train/scaler.h"
#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_step_config {
    int micro_batches;         /* TrainStep(micro_batches=): the batch splits into this many */
    gt_loss loss;              /* loss function */
    int set_to_none;           /* 1: zero_grad(set_to_none=True) (first backward writes);
                                  0: gradients are zeroed, then every backward accumulates */
    double max_grad_norm;      /* clip the global L2 norm to this; <= 0 disables clipping */
    int want_grad_norm;        /* 1: compute the norm even without clipping (for logging) */
    gt_scaler *scaler;         /* dynamic loss scaler, or NULL */
    gt_optimizer *optimizer;   /* the update, or NULL to compute gradients only */
    int interruptible;         /* 1: poll gt_interrupt_pending() between micro-batches and their
                                  forward/backward, and abandon the step before its update */
    int guard;                 /* 1: skip the update unless loss <= guard_loss and the gradient
                                  norm <= guard_grad_norm (a NaN is not); the norm is computed */
    double guard_loss;         /* the largest loss the guard lets update (DBL_MAX: any finite one) */
    double guard_grad_norm;    /* the largest unscaled gradient L2 norm the guard lets update */
    int deferred;              /* 1 (a device model, without guard): the step waits for nothing
                                  (clipping is decided on the device, which leaves the gradients
                                  clipped); its loss and norm stay in step record `record`
                                  (gt_step_read_record), the result's are NaN. With a scaler the
                                  update is gt_optimizer_step_deferred's, the record handed to the
                                  host through the optimizer's ring, and the host's scaler is not
                                  updated (the caller resolves the step: gt_optimizer_deferred_result) */
    int record;                /* which of the GT_STEP_RECORDS records a device step writes */
    const double *lrs;         /* deferred with a scaler: (GT_OPTIM_RING, groups) lr of each group for
                                  the next updates (gt_optimizer_step_deferred), or NULL: the groups' */
    size_t lrs_len;            /* entries of lrs */
    gt_comm *comm;             /* data parallelism: the batch is this rank's share of comm->size
                                  equal shares; gradients and losses are summed over the ranks
                                  (rank order) before the inf check, the norm and the update;
                                  NULL: one process */
} gt_step_config;

typedef struct gt_step_result {
    double loss;               /* mean over micro-batches (of every rank) of their mean loss (unscaled) */
    double grad_norm;          /* global L2 norm of the unscaled gradients; NaN if not computed */
    int skipped;               /* 1 when the update was skipped: the scaler found inf/NaN
                                  gradients, or the guard an outlier */
    int outlier;               /* 1 when the guard skipped the update (the scaler is not updated) */
    float scale;               /* the loss scale this step used (1 without a scaler) */
} gt_step_result;

/* Everything gt_train_step checks before it computes, for the shapes of `inputs` and `targets`
 * (their data is not read, ptr may be NULL): the batch split, the model's plan for a
 * micro-batch (allocated now) and the targets. Lets a caller validate a batch before copying it. */
gt_status gt_train_step_prepare(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                                const gt_step_config *cfg);

/* One training step over `inputs` (B, ...) and `targets` (B, ...), B divisible by
 * cfg->micro_batches. With cfg->interruptible, an interrupt request seen before the optimizer
 * update starts abandons the step with GT_ERR_INTERRUPTED: parameters, optimizer state, scaler
 * and step counter are as before the call; gradients already overwritten are marked invalid
 * (grads_valid = 0, as after zero_grad(set_to_none=True)). Once the update has started, the step
 * runs to its end. */
gt_status gt_train_step(gt_model *model, const gt_tensor *inputs, const gt_tensor *targets,
                        const gt_step_config *cfg, gt_step_result *out);

/* The result of the deferred step that wrote record `record` of a device model (reading it
 * waits for that step): its loss over `micro_batches`, and its gradient norm when `want_norm`
 * (NaN otherwise); not skipped, scale 1. */
gt_status gt_step_read_record(gt_model *model, int record, int micro_batches, int want_norm, gt_step_result *out);

#ifdef __cplusplus
}
#endif
#endif
