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

#ifdef __cplusplus
}
#endif
#endif
