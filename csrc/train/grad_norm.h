/* Gradient norms for clipping, deterministic: the result depends only on the data, not on the
 * number of threads or the SIMD level (the summation order of core/sumsq_order.h, which the
 * CUDA kernel follows too). */
#ifndef GT_GRAD_NORM_H
#define GT_GRAD_NORM_H

#include <stddef.h>

#include "core/status.h"
#include "core/sumsq_order.h"

/* Sum of squares of n host fp32 values, in float64 (threads: OpenMP). */
gt_status gt_grad_sumsq(const float *x, size_t n, double *out);

/* sqrt(gt_grad_sumsq(x, n)). */
gt_status gt_grad_norm_l2(const float *x, size_t n, double *out);

/* max |x| over n host fp32 values (NaN if any is NaN); 0 for n = 0. */
gt_status gt_grad_absmax(const float *x, size_t n, double *out);

#endif
