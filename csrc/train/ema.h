/* Exponential moving average of the weights ("EMA", "model averaging"): a shadow copy of every
 * parameter, updated after optimizer steps as shadow = lerp(shadow, p, f32(1 - decay)) (the
 * GT_HD rule of core/ema_math.h), and swapped in for evaluation.
 *
 * The shadow lives in one arena, either beside the parameters on the device (cpu pool, or an
 * accelerator's pool with its ema kernel) or in pinned host memory (the small-GPU recipe: the update
 * then streams the parameters to the host in chunks and averages them on the CPU). */
#ifndef GT_EMA_H
#define GT_EMA_H

#include <stddef.h>

#include "core/device_backend.h"
#include "core/status.h"

typedef struct gt_ema gt_ema;

/* A shadow of `num_params` parameters (param[i]: numel[i] floats on `device`), initialised to
 * their current values; on the host (pinned pool) when on_host, else in `device`'s pool.
 * On an accelerator, `compute_stream` (NULL: the default stream) is the training step's
 * stream: kernels are queued on it, and host-side copies wait for it first. */
gt_status gt_ema_create(gt_device device, int on_host, gt_stream *compute_stream, float *const *params,
                        const size_t *numels, size_t num_params, gt_ema **out);

void gt_ema_destroy(gt_ema *ema);

/* shadow = lerp(shadow, param, f32(1 - decay)) for every element; 0 <= decay <= 1. A host shadow
 * of accelerator parameters that fit one staging buffer only queues their copy on the compute
 * stream (no wait) and averages it at the next update, swap, copy or access of the shadow, which
 * then see the same bits as if it had been done at once. */
gt_status gt_ema_update(gt_ema *ema, double decay);

/* Exchanges the shadow and the parameters (twice restores both exactly). */
gt_status gt_ema_swap(gt_ema *ema);

/* Copies the shadow into the parameters (the parameters' values are lost). */
gt_status gt_ema_copy_to_params(gt_ema *ema);

/* Copies parameter `index`'s shadow to / from host memory (numel floats). */
gt_status gt_ema_read(const gt_ema *ema, size_t index, float *host);
gt_status gt_ema_write(gt_ema *ema, size_t index, const float *host);

/* Bytes of the shadow arena (and of the staging buffer, for a host shadow of device parameters). */
size_t gt_ema_bytes(const gt_ema *ema);

/* Where the arena of gt_ema_create(device, on_host, ..., `total_numel` elements in all) will be
 * (*pool) and what the allocator reserves for it (*bytes; gt_block_reserved_bytes of the
 * request), before it is built. */
gt_status gt_ema_plan(gt_device device, int on_host, size_t total_numel, gt_device *pool, size_t *bytes);

#endif
