/* The part of the training step (train/step.c) that needs the CUDA backend's kernels: the
 * loss scaler's unscale + inf check over a model's gradient arena in device memory. */
#ifndef GT_TRAIN_STEP_DEVICE_H
#define GT_TRAIN_STEP_DEVICE_H

#include "nn/model.h"
#include "train/scaler.h"

/* gt_scaler_unscale_check on a cuda:N model's (num_params,) gradient arena: copies *scaler to
 * the device, runs the unscale kernel on the model's stream (the legacy default stream) and
 * reads the flag back (one int: the host waits for the kernel). Sets *found_inf = 1 when a
 * gradient was NaN/±Inf, leaves it as it was otherwise; *scaler is not changed. */
gt_status gt_step_unscale_check_device(gt_model *model, const gt_scaler *scaler, int *found_inf);

/* What the allocator reserves in a model's pool, for the length of one step, when a loss scaler
 * runs on `device`: the scratch block above on cuda:N; 0 elsewhere (the CPU check needs none). */
size_t gt_step_scaler_bytes(gt_device device);

#endif
