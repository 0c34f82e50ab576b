/* The loss scaler on CUDA (cuda/scaler.cu), callable from C. The kernels apply the rules of
 * core/scaler_rules.h, the same code the CPU path runs, so both give identical bits.
 *
 * The state lives on the device as a gt_scaler struct, so a step needs no host round trip:
 * the unscale kernel reads the scale there, and the update kernel changes it there. The only
 * host read per step is found_inf (4 bytes), or none when later kernels read it on the device.
 * Included by C files only when built with GT_WITH_CUDA. */
#ifndef GT_SCALER_CUDA_H
#define GT_SCALER_CUDA_H

#include <stddef.h>

#include "core/scaler_rules.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Queues unscale_inf_check_kernel on `stream` (a cudaStream_t, NULL for the legacy default
 * stream) on the current device: grad[0..n) *= inv_scale of *scaler (no multiply when it is 1),
 * and *found_inf = 1 if any element was NaN/±Inf; *found_inf is otherwise left as it was (the
 * caller zeroes it once per step). `scaler`, `grad` and `found_inf` are device pointers. A
 * disabled scaler changes nothing. Returns after the launch. */
gt_status gt_cuda_scaler_unscale_check(const gt_scaler *scaler, float *grad, size_t n,
                                       int *found_inf, void *stream);

/* Queues scaler_update_kernel (one thread): gt_scaler_rule_update(scaler, *found_inf) on the
 * device copy of the state. Device pointers; returns after the launch. */
gt_status gt_cuda_scaler_update(gt_scaler *scaler, const int *found_inf, void *stream);

/* Runs both kernels on host data on device `device`, for tests and one-off use: copies
 * *scaler, grad[0..n) and *found_inf to the device, unscales, updates when `update` != 0,
 * copies all three back, and frees its device memory on every path. */
gt_status gt_cuda_scaler_run_host(gt_scaler *scaler, float *grad, size_t n, int *found_inf,
                                  int update, int device);

#ifdef __cplusplus
}
#endif
#endif
