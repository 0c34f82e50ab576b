/* The dynamic loss scaler on the CPU: configuration, the fused unscale + inf check over a
 * flat fp32 gradient arena, and the state update. The state (struct gt_scaler, with a comment
 * on every field) and the update rules live in core/scaler_rules.h, shared with the CUDA
 * kernels in cuda/scaler.cu.
 *
 * One training step with the scaler (what the fused step does, without Python in between):
 *   loss_scaled = loss * s->scale
 *   ... backward writes scaled gradients into grad[0..n) ...
 *   int found_inf = 0;
 *   GT_TRY(gt_scaler_unscale_check(s, grad, n, &found_inf));
 *   if (!found_inf) ... optimizer update (the LR schedule advances only here) ...
 *   gt_scaler_update(s, found_inf);
 */
#ifndef GT_TRAIN_SCALER_H
#define GT_TRAIN_SCALER_H

#include <stddef.h>
#include <stdint.h>

#include "core/scaler_rules.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills `out` with a fresh scaler (growth_tracker and counters 0) after checking every value:
 * init_scale finite and > 0 once rounded to fp32, growth_factor > 1, 0 < backoff_factor < 1,
 * 1 <= growth_interval <= INT32_MAX, min_scale finite and >= 0 (0 = no floor). Failures are
 * GT_ERR_VALUE naming the argument; `out` is untouched then. */
gt_status gt_scaler_init(gt_scaler *out, double init_scale, double growth_factor,
                         double backoff_factor, int64_t growth_interval, double min_scale,
                         int enabled);

/* Checks a filled-in scaler (after a caller changed fields): the rules of gt_scaler_init, with
 * `scale` allowed to be 0 (a backoff can reach it); any growth_tracker is accepted. */
gt_status gt_scaler_validate(const gt_scaler *s);

/* Multiplies grad[0..n) by gt_scaler_inv_scale(s) in fp32, in place (no multiply when it is 1),
 * and sets *found_inf = 1 if any element was NaN, +Inf or -Inf before the multiply; *found_inf
 * is left as it was otherwise, so several pieces of one arena can share a flag that the caller
 * set to 0 first. One pass, vectorised (gt_simd_level()) and OpenMP-parallel. A disabled
 * scaler changes nothing. */
gt_status gt_scaler_unscale_check(const gt_scaler *s, float *grad, size_t n, int *found_inf);

/* The end-of-iteration update from found_inf (PyTorch's rules, core/scaler_rules.h); a
 * disabled scaler changes nothing. */
void gt_scaler_update(gt_scaler *s, int found_inf);

/* update(new_scale): sets the scale (rounded to fp32; finite and > 0) and counts the
 * iteration's found_inf in the skip counters; growth_tracker is kept, as in PyTorch. */
gt_status gt_scaler_set_scale(gt_scaler *s, double new_scale, int found_inf);

/* (float)(1.0 / (double)scale); 1.0f for a disabled scaler. */
float gt_scaler_inv_scale(const gt_scaler *s);

/* The sum of x[0..n) read with the same parallel, vectorised pass as the unscale (no stores):
 * the read-bandwidth baseline the unscale benchmark is compared with. */
double gt_scaler_read_baseline(const float *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif
