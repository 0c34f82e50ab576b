/* The per-channel math of BatchNorm (ops.h, gt_batchnorm_args), shared by the CPU op
 * (cpu_batchnorm.c), the CUDA kernels (cuda/ops_batchnorm.cu) and a host harness that runs the
 * kernels' math in CI (tests/_cnn_harness.c), so the three give the same bits.
 *
 * Sums are in double in a fixed order: each (n, c) plane of hw values is summed in 8 lanes
 * (lane j adds the k with k % 8 == j in increasing k; the lanes folded pairwise, the CPU's
 * GT_LANE_SUM), and a channel's plane sums are added in increasing n. The CPU runs the planes of
 * a channel one after another; the device sums the planes in parallel and adds them in n order.
 * Every operation is rounded once in both builds (-ffp-contract=off, nvcc --fmad=false); the
 * double sqrt and division are correctly rounded on both. */
#ifndef GT_BATCHNORM_HD_H
#define GT_BATCHNORM_HD_H

#include <math.h>

#include "ops/elem_hd.h"
#include "ops/ops.h"

enum { GT_BN_LANES = 8 };  /* lanes of a plane's fixed-order sum (the CPU's GT_LANES) */

/* The pairwise fold of a plane's 8 lane sums. */
GT_HD_INLINE double gt_bn_fold(const double *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* Sum over the plane [base, base + hw) of x (squares = 0) or of (x - mu)^2 (squares = 1). */
GT_HD_INLINE double gt_bn_plane_sum(const void *in, size_t base, size_t hw, double mu, int squares,
                                    gt_dtype dt) {
    double lanes[GT_BN_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t k = 0;
    for (; hw - k >= GT_BN_LANES; k += GT_BN_LANES)
        for (size_t j = 0; j < GT_BN_LANES; j++) {
            double x = (double)gt_hd_load(in, base + k + j, dt);
            lanes[j] += squares ? (x - mu) * (x - mu) : x;
        }
    for (size_t j = 0; k + j < hw; j++) {
        double x = (double)gt_hd_load(in, base + k + j, dt);
        lanes[j] += squares ? (x - mu) * (x - mu) : x;
    }
    return gt_bn_fold(lanes);
}

/* sums[0] = sum of dout, sums[1] = sum of dout * (x - mean) over the plane [base, base + hw). */
GT_HD_INLINE void gt_bn_grad_plane_sums(double *sums, const void *dout, const void *in, float mean,
                                        size_t base, size_t hw, gt_dtype dt) {
    double dy[GT_BN_LANES] = {0, 0, 0, 0, 0, 0, 0, 0}, dyx[GT_BN_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t k = 0;
    for (; hw - k >= GT_BN_LANES; k += GT_BN_LANES)
        for (size_t j = 0; j < GT_BN_LANES; j++) {
            double g = (double)gt_hd_load(dout, base + k + j, dt);
            dy[j] += g;
            dyx[j] += g * (double)(gt_hd_load(in, base + k + j, dt) - mean);
        }
    for (size_t j = 0; k + j < hw; j++) {
        double g = (double)gt_hd_load(dout, base + k + j, dt);
        dy[j] += g;
        dyx[j] += g * (double)(gt_hd_load(in, base + k + j, dt) - mean);
    }
    sums[0] = gt_bn_fold(dy);
    sums[1] = gt_bn_fold(dyx);
}

/* Offset of the first element of plane (i, c). */
GT_HD_INLINE size_t gt_bn_at(size_t i, size_t c, size_t channels, size_t hw) {
    return (i * channels + c) * hw;
}

/* The forward's output element: x * scale + shift, rounded once to dt. */
GT_HD_INLINE void gt_bn_apply(void *out, const void *in, size_t at, float scale, float shift, gt_dtype dt) {
    gt_hd_store(out, at, gt_hd_load(in, at, dt) * scale + shift, dt);
}

/* The weight of a new batch: momentum, or 1 / num_batches_tracked (already counted) when < 0. */
GT_HD_INLINE double gt_bn_factor(double momentum, int64_t batches) {
    return momentum < 0.0 ? 1.0 / (double)batches : momentum;
}

/* Folds channel c's batch mean and biased variance into the running statistics. */
GT_HD_INLINE void gt_bn_update_running(const gt_batchnorm_args *a, size_t c, double mean, double var,
                                       double factor) {
    double count = (double)(a->n * a->hw);
    double unbiased = var * count / (count - 1.0);
    a->running_mean[c] = (float)(factor * mean + (1.0 - factor) * (double)a->running_mean[c]);
    a->running_var[c] = (float)(factor * unbiased + (1.0 - factor) * (double)a->running_var[c]);
}

/* Channel c's forward from its double mean and (biased) variance: saves the statistics it
 * normalises with (mean, rstd = 1 / sqrt(var + eps)), folds them into the running ones when
 * update_running (with `factor`, gt_bn_factor), and gives out = x * *scale + *shift. */
GT_HD_INLINE void gt_bn_forward_channel(const gt_batchnorm_args *a, size_t c, double mean, double var,
                                        double factor, float *scale, float *shift) {
    float w = a->weight ? a->weight[c] : 1.0f, b = a->bias ? a->bias[c] : 0.0f;
    float m = (float)mean, s = (float)(1.0 / sqrt(var + (double)a->eps));
    *scale = s * w;
    *shift = b - m * *scale;
    a->mean[c] = m;
    a->rstd[c] = s;
    if (a->update_running)
        gt_bn_update_running(a, c, mean, var, factor);
}

/* Backward's per-channel terms from the channel sums (sum dout, sum dout (x - mean)): writes
 * dweight/dbias (per accumulate) and gives din = scale * dout - shift - slope * (x - mean). */
GT_HD_INLINE void gt_bn_backward_terms(const gt_batchnorm_args *a, size_t c, double sum_dy,
                                       double sum_dyx, float *scale, float *shift, float *slope) {
    float s = a->rstd[c], w = a->weight ? a->weight[c] : 1.0f;
    float dweight = (float)(sum_dyx * s), dbias = (float)sum_dy;
    double count = (double)(a->n * a->hw);
    if (a->dweight)
        a->dweight[c] = a->accumulate ? a->dweight[c] + dweight : dweight;
    if (a->dbias)
        a->dbias[c] = a->accumulate ? a->dbias[c] + dbias : dbias;
    *scale = s * w;
    *shift = *slope = 0.0f;
    if (a->batch_stats && count > 0.0) {
        *shift = (float)((double)*scale * sum_dy / count);
        *slope = (float)((double)*scale * sum_dyx * (double)s * (double)s / count);
    }
}

/* The input gradient's element: scale * dout - shift - slope * (x - mean), rounded once. */
GT_HD_INLINE void gt_bn_din(void *din, const void *dout, const void *in, size_t at, float mean,
                            float scale, float shift, float slope, gt_dtype dt) {
    float centred = gt_hd_load(in, at, dt) - mean;
    gt_hd_store(din, at, scale * gt_hd_load(dout, at, dt) - shift - slope * centred, dt);
}

#endif
