/* ZeRO-1 inside the training step (train/step.c): each rank's optimizer keeps the state (AdamW's
 * moments, an offloaded share's master copy) of its shard only, chunk `rank` of the model's
 * num_params f32 elements split into comm->size chunks (gt_comm_chunk). After the backward the
 * gradients are reduce-scattered (rank-order sums: data parallelism's bits on the shard), the
 * inf check and the sum of squares run over the shard and are combined over the ranks into the
 * values one process gets from the whole summed buffer, the optimizer updates the shard and the
 * parameters are all-gathered. The result is bit-identical to the unsharded data-parallel step.
 *
 * A model on an accelerator keeps the device step's all-reduce of the whole gradient (so its inf
 * check and norm are the unsharded kernels'), updates its shard (device and pinned host share)
 * and all-gathers the parameters on the device (gt_step_device_gather_shards): the same bits, the
 * state's memory divided by the ranks, half again the all-reduce's bytes sent per step. */
#ifndef GT_TRAIN_ZERO_H
#define GT_TRAIN_ZERO_H

#include <stddef.h>

#include "core/status.h"
#include "dist/comm.h"
#include "train/scaler.h"

/* The step's sums of a sharded step over grads (n f32, the same n on every rank): the
 * reduce-scatter, then with a scaler the unscale of the shard and a found_inf that is 1 on
 * every rank when any rank's shard has an inf/NaN, then (finite gradients and want_norm) the
 * sum of squares, the bits gt_grad_sumsq gives for the whole summed buffer. Only this rank's
 * shard of grads holds summed (and unscaled) gradients afterwards. */
gt_status gt_zero_sums(gt_comm *comm, float *grads, size_t n, const gt_scaler *scaler, int want_norm,
                       int *found_inf, double *sumsq);

/* gt_grad_sumsq's value for the whole of x (n f32) when each rank holds only its shard of x:
 * the chunks of core/sumsq_order.h inside a shard are summed there, a chunk cut by shard
 * boundaries continues its 16 lane sums from rank to rank (in rank order), and the chunk totals
 * are gathered and added in chunk order. */
gt_status gt_zero_sumsq(gt_comm *comm, const float *x, size_t n, double *out);

#endif
