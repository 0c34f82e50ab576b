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

/* The total of one chunk of core/sumsq_order.h: x[0..n) its elements (n at most a chunk). */
double gt_sumsq_chunk(const float *x, size_t n);

/* sqrt(gt_grad_sumsq(x, n)). */
gt_status gt_grad_norm_l2(const float *x, size_t n, double *out);

/* max |x| over n host fp32 values (NaN if any is NaN); 0 for n = 0. */
gt_status gt_grad_absmax(const float *x, size_t n, double *out);

/* Clips n host fp32 gradients in place by the coefficient of core/clip_rules.h for the sum of
 * squares *sumsq: x[i] = x[i] * coef in fp32 (what the optimizer's grad_coef multiply does, so
 * an update with grad_coef 1 afterwards gives the bits of one with grad_coef = coef); nothing
 * is written when coef is 1. The cpu half of the device kernel that clips without a wait. */
gt_status gt_grad_clip(float *x, size_t n, const double *sumsq, double max_norm);

#endif
