/* The math of RMSNorm over the last dim of (rows, cols) (ops.h, rmsnorm_forward/backward),
 * shared by the CPU op (cpu_rmsnorm.c) and the CUDA kernels (cuda/ops_rmsnorm.cu), which call
 * these per row (forward, din) and per (row, column) term (dweight) in the same order, so the two
 * give the same bits (tests/test_rmsnorm.py runs them on the host through the CPU op):
 *   rstd = 1 / sqrt(sum(x^2) / cols + eps)        (double, 8 lanes: lane j adds the columns
 *                                                   c % 8 == j in order, folded pairwise; f32)
 *   xhat = x * rstd, out = xhat * weight           (f32, rounded once to dt; no weight: xhat;
 *                                                   plus_one: weight is f32(1 + weight), Gemma's)
 *   g = dout * weight: din = rstd * (g - xhat * mean(g * xhat))   (the mean in double lanes)
 *   dweight (+)= sum over rows, in order, of dout * xhat           (double, rounded once)
 * Every operation is rounded once in both builds (-ffp-contract=off, nvcc --fmad=false). */
#ifndef GT_RMSNORM_HD_H
#define GT_RMSNORM_HD_H

#include <math.h>

#include "ops/elem_hd.h"

enum { GT_RMS_LANES = 8 };  /* lanes of a row's fixed-order sums */

/* The pairwise fold of 8 lane sums. */
GT_HD_INLINE double gt_rms_fold(const double *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The weight of column c as the op uses it: weight[c], f32(1 + weight[c]) with plus_one (Gemma's
 * (1.0 + weight.float())), 1 without a weight. */
GT_HD_INLINE float gt_rms_weight(const float *weight, int plus_one, size_t c) {
    return weight ? (plus_one ? 1.0f + weight[c] : weight[c]) : 1.0f;
}

/* 1 / sqrt(mean(x^2) + eps) of row r. */
GT_HD_INLINE float gt_rms_row_rstd(const void *in, size_t r, size_t cols, float eps, gt_dtype dt) {
    double lanes[GT_RMS_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t c = 0; c < cols; c++) {
        double x = (double)gt_hd_load(in, r * cols + c, dt);
        lanes[c % GT_RMS_LANES] += x * x;
    }
    return (float)(1.0 / sqrt(gt_rms_fold(lanes) / (double)cols + (double)eps));
}

/* Row r of the forward: out and rstd[r]. */
GT_HD_INLINE void gt_rms_forward_row(void *out, float *rstd, const void *in, const float *weight, int plus_one,
                                     size_t r, size_t cols, float eps, gt_dtype dt) {
    float s = gt_rms_row_rstd(in, r, cols, eps, dt);
    for (size_t c = 0; c < cols; c++) {
        float xhat = gt_hd_load(in, r * cols + c, dt) * s;
        gt_hd_store(out, r * cols + c, weight ? xhat * gt_rms_weight(weight, plus_one, c) : xhat, dt);
    }
    rstd[r] = s;
}

/* Row r of din (may alias dout: each element is read before it is written). */
GT_HD_INLINE void gt_rms_din_row(void *din, const void *dout, const void *in, const float *weight, int plus_one,
                                 const float *rstd, size_t r, size_t cols, gt_dtype dt) {
    float s = rstd[r];
    double lanes[GT_RMS_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t c = 0; c < cols; c++) {
        float g = gt_hd_load(dout, r * cols + c, dt) * gt_rms_weight(weight, plus_one, c);
        lanes[c % GT_RMS_LANES] += (double)g * (double)(gt_hd_load(in, r * cols + c, dt) * s);
    }
    float mean_gx = (float)(gt_rms_fold(lanes) / (double)cols);
    for (size_t c = 0; c < cols; c++) {
        float g = gt_hd_load(dout, r * cols + c, dt) * gt_rms_weight(weight, plus_one, c);
        float xhat = gt_hd_load(in, r * cols + c, dt) * s;
        gt_hd_store(din, r * cols + c, s * (g - xhat * mean_gx), dt);
    }
}

/* The term of element (r, c) in dweight[c]'s sum. */
GT_HD_INLINE double gt_rms_dweight_term(const void *dout, const void *in, const float *rstd, size_t r,
                                        size_t c, size_t cols, gt_dtype dt) {
    return (double)(gt_hd_load(dout, r * cols + c, dt) * (gt_hd_load(in, r * cols + c, dt) * rstd[r]));
}

/* dweight[c] = sum, or += it with accumulate. */
GT_HD_INLINE void gt_rms_dweight_store(float *dweight, size_t c, double sum, int accumulate) {
    float w = (float)sum;
    dweight[c] = accumulate ? dweight[c] + w : w;
}

#endif
