/* Argument checks of the BatchNorm, 2-D pooling and sequence mask/pooling ops (ops.h) that every
 * backend shares: the same rules and messages on the CPU and on CUDA. They read the arguments'
 * sizes and pointers only, never the memory behind them (a device's). */
#ifndef GT_OPS_CNN_CHECKS_H
#define GT_OPS_CNN_CHECKS_H

#include "ops/checks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes, dtype, eps, and the pointers and buffers the forward (forward = 1) or the backward needs;
 * batch statistics need a value per channel, updating the running ones more than one. */
gt_status gt_batchnorm_check(const gt_batchnorm_args *a, int forward);

/* Sizes, dtype, kind, window (kernel, stride, dilation >= 1, padding >= 0), argmax's int32 range,
 * and the pointers the forward (backward = 0) or the backward needs. */
gt_status gt_pool2d_check(const gt_pool2d_args *a, int backward);

/* Sizes and a stride of at least seq. */
gt_status gt_mask_lengths_check(int64_t batch, int64_t seq, int64_t stride);

/* Sizes, dtype and mode of a sequence pooling (first-token pooling needs a position). */
gt_status gt_seq_pool_check(int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt);

/* Fails with GT_ERR_VALUE naming the first of lengths[0:batch] (host memory) outside [0, seq]. */
gt_status gt_seq_lengths_check(const int64_t *lengths, int64_t batch, int64_t seq);

/* The largest length (or token index, GT_POOL_LAST: seq - 1) a pooling of `mode` reads. */
int64_t gt_seq_lengths_limit(int64_t seq, gt_pool_mode mode);

/* Sizes, stride and the pointers key_starts (ops.h) needs for the outputs asked for. */
gt_status gt_key_starts_check(const int64_t *starts, const int64_t *last, const int64_t *ids,
                              const int64_t *mask, const int64_t *positions, int64_t batch, int64_t seq,
                              int64_t stride, int64_t pad_token_id);

#ifdef __cplusplus
}
#endif
#endif
