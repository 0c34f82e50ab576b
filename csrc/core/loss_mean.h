/* The mean loss of one micro-batch as the training step accumulates it, shared by the CPU
 * model (csrc/nn/model.c), the sim kernel and the CUDA kernel (DESIGN.md principle 3): the
 * per-row losses summed in row order in float64, divided by the rows that count. Also the
 * loss ops' gradient scale, read where the ops run (a device reads a scaler's scale there). */
#ifndef GT_LOSS_MEAN_H
#define GT_LOSS_MEAN_H

#include <stdint.h>

#include "core/fp_ops.h"
#include "core/hd.h"

/* count NULL: the mean of an MSE, values[0] (rows 1), widened. Otherwise the sum of
 * values[0..rows) in order over *count (0 when *count <= 0). */
GT_HD double gt_loss_mean(const float *values, int64_t rows, const int64_t *count) {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; r++)
        sum += (double)values[r];
    if (!count)
        return sum;
    return *count > 0 ? sum / (double)*count : 0.0;
}

/* The loss gradient's scale, f32(*loss_scale / divisor); loss_scale NULL: f32(1 / divisor). */
GT_HD float gt_dloss_scale(const float *loss_scale, float divisor) {
    return gt_div(loss_scale ? *loss_scale : 1.0f, divisor);
}

/* The MSE gradient's factor f32(2 dloss_scale / n), in float64. */
GT_HD float gt_mse_grad_factor(float dloss_scale, int64_t n) {
#if defined(__CUDA_ARCH__)
    return (float)__ddiv_rn(2.0 * (double)dloss_scale, (double)n);
#else
    return (float)(2.0 * (double)dloss_scale / (double)n);
#endif
}

#endif
