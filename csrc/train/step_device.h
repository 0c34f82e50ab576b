/* The parts of the training step (train/step.c) that run on an accelerator's kernels through
 * core/device_backend.h: the loss scaler's unscale + inf check and the gradient norm over a
 * model's gradient arena in device memory. */
#ifndef GT_TRAIN_STEP_DEVICE_H
#define GT_TRAIN_STEP_DEVICE_H

#include "nn/model.h"
#include "train/scaler.h"

/* gt_scaler_unscale_check on a device model's (num_params,) gradient arena: copies *scaler to
 * the model's step scratch on the device (nothing is allocated), runs the unscale kernel on the
 * model's stream (the default stream) and reads the flag back (one int: the host waits for it).
 * Sets *found_inf = 1 when a gradient was NaN/±Inf, leaves it as it was otherwise; *scaler is
 * not changed. */
gt_status gt_step_unscale_check_device(gt_model *model, const gt_scaler *scaler, int *found_inf);

/* The sum of squares of a device model's gradient arena, in the CPU's order (the same bits). */
gt_status gt_step_grad_sumsq_device(gt_model *model, double *out);

#endif
