/* CPU BatchNorm over the channels of (N, C, HW) (ops.h, gt_batchnorm_args). Per channel, the
 * statistics are two passes in double with fixed-order sums (GT_LANE_SUM per (n, c) plane, the
 * planes added in n order): mean = sum(x) / M, var = sum((x - mean)^2) / M (M = N * HW). The
 * forward then writes out = x * a + b with a = rstd * weight and b = bias - mean * a (f32, rounded
 * once to dt). Backward, with xhat = (x - mean) * rstd:
 *   dbias = sum dout, dweight = sum dout * xhat  (double, fixed order)
 *   din = rstd * weight * (dout - dbias / M - xhat * dweight / M)   (batch statistics)
 *   din = rstd * weight * dout                                       (running statistics)
 * Channels run in parallel and each is computed by one thread: any thread count gives the same
 * bits. */
#include <math.h>

#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

/* Sum of x and of (x - mu)^2 (when squares) over channel c's planes, in double. */
GT_INLINE double bn_channel_sum(const void *in, size_t n, size_t c, size_t channels, size_t hw,
                                double mu, int squares, gt_dtype dt) {
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        size_t base = (i * channels + c) * hw;
        double part;
        if (squares)
            GT_LANE_SUM(part, 0, hw, ((double)gt_cpu_load(in, base + k, dt) - mu) *
                                         ((double)gt_cpu_load(in, base + k, dt) - mu));
        else
            GT_LANE_SUM(part, 0, hw, (double)gt_cpu_load(in, base + k, dt));
        total += part;
    }
    return total;
}

/* Mean and biased variance of channel c. */
GT_INLINE void bn_stats_body(double *mean, double *var, const void *in, size_t n, size_t c,
                             size_t channels, size_t hw, gt_dtype dt) {
    double count = (double)(n * hw);
    double mu = bn_channel_sum(in, n, c, channels, hw, 0.0, 0, dt) / count;
    *mean = mu;
    *var = bn_channel_sum(in, n, c, channels, hw, mu, 1, dt) / count;
}
GT_CPU_KERNEL(bn_stats, (double *mean, double *var, const void *in, size_t n, size_t c,
                         size_t channels, size_t hw, gt_dtype dt),
              mean, var, in, n, c, channels, hw)

/* out = x * a + b over channel c's planes. */
GT_INLINE void bn_apply_body(void *out, const void *in, float a, float b, size_t n, size_t c,
                             size_t channels, size_t hw, gt_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        size_t base = (i * channels + c) * hw;
        for (size_t k = 0; k < hw; k++)
            gt_cpu_store(out, base + k, gt_cpu_load(in, base + k, dt) * a + b, dt);
    }
}
GT_CPU_KERNEL(bn_apply, (void *out, const void *in, float a, float b, size_t n, size_t c,
                         size_t channels, size_t hw, gt_dtype dt),
              out, in, a, b, n, c, channels, hw)

/* sum dout and sum dout * (x - mean) over channel c's planes, in double, both in one pass over
 * each plane (8 lanes each, combined as GT_LANE_SUM combines its lanes). */
GT_INLINE void bn_grad_sums_body(double *sum_dy, double *sum_dyx, const void *dout, const void *in,
                                 float mean, size_t n, size_t c, size_t channels, size_t hw,
                                 gt_dtype dt) {
    double dy = 0.0, dyx = 0.0;
    for (size_t i = 0; i < n; i++) {
        size_t base = (i * channels + c) * hw, k = 0;
        double lanes_dy[GT_LANES] = {0}, lanes_dyx[GT_LANES] = {0};
        for (; hw - k >= GT_LANES; k += GT_LANES)
            for (size_t j = 0; j < GT_LANES; j++) {
                double g = (double)gt_cpu_load(dout, base + k + j, dt);
                lanes_dy[j] += g;
                lanes_dyx[j] += g * (double)(gt_cpu_load(in, base + k + j, dt) - mean);
            }
        for (size_t j = 0; k + j < hw; j++) {
            double g = (double)gt_cpu_load(dout, base + k + j, dt);
            lanes_dy[j] += g;
            lanes_dyx[j] += g * (double)(gt_cpu_load(in, base + k + j, dt) - mean);
        }
        dy += ((lanes_dy[0] + lanes_dy[1]) + (lanes_dy[2] + lanes_dy[3])) +
              ((lanes_dy[4] + lanes_dy[5]) + (lanes_dy[6] + lanes_dy[7]));
        dyx += ((lanes_dyx[0] + lanes_dyx[1]) + (lanes_dyx[2] + lanes_dyx[3])) +
               ((lanes_dyx[4] + lanes_dyx[5]) + (lanes_dyx[6] + lanes_dyx[7]));
    }
    *sum_dy = dy;
    *sum_dyx = dyx;
}
GT_CPU_KERNEL(bn_grad_sums, (double *sum_dy, double *sum_dyx, const void *dout, const void *in,
                             float mean, size_t n, size_t c, size_t channels, size_t hw, gt_dtype dt),
              sum_dy, sum_dyx, dout, in, mean, n, c, channels, hw)

/* din = scale * dout - shift - slope * (x - mean) over channel c's planes. */
GT_INLINE void bn_din_body(void *din, const void *dout, const void *in, float mean, float scale,
                           float shift, float slope, size_t n, size_t c, size_t channels,
                           size_t hw, gt_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        size_t base = (i * channels + c) * hw;
        for (size_t k = 0; k < hw; k++) {
            float centred = gt_cpu_load(in, base + k, dt) - mean;
            gt_cpu_store(din, base + k, scale * gt_cpu_load(dout, base + k, dt) - shift - slope * centred, dt);
        }
    }
}
GT_CPU_KERNEL(bn_din, (void *din, const void *dout, const void *in, float mean, float scale,
                       float shift, float slope, size_t n, size_t c, size_t channels, size_t hw,
                       gt_dtype dt),
              din, dout, in, mean, scale, shift, slope, n, c, channels, hw)

static gt_status check_batchnorm(const gt_batchnorm_args *a, int forward) {
    GT_TRY(gt_op_check_size(a->n, "n"));
    GT_TRY(gt_op_check_size(a->c, "c"));
    GT_TRY(gt_op_check_size(a->hw, "hw"));
    GT_TRY(gt_op_check_dtype(a->dt, "dt"));
    if (!(a->eps >= 0.0f))
        return GT_FAIL(GT_ERR_VALUE, "eps: must be >= 0, got %g", (double)a->eps);
    if (a->c > 0 && (!a->in || !a->mean || !a->rstd || (forward ? !a->out : !a->dout)))
        return GT_FAIL(GT_ERR_VALUE, "in, mean, rstd, %s: must not be NULL", forward ? "out" : "dout");
    if (!forward)
        return GT_OK;
    if (!a->batch_stats && (!a->running_mean || !a->running_var))
        return GT_FAIL(GT_ERR_VALUE, "running_mean: normalising with running statistics needs them");
    if (a->update_running && (!a->batch_stats || !a->running_mean || !a->running_var || !a->num_batches_tracked))
        return GT_FAIL(GT_ERR_VALUE, "update_running: needs batch statistics and the running buffers");
    if (a->batch_stats && a->n * a->hw < 1 && a->c > 0)
        return GT_FAIL(GT_ERR_VALUE, "n: batch statistics need at least one value per channel");
    if (a->update_running && a->n * a->hw < 2 && a->c > 0)
        return GT_FAIL(GT_ERR_VALUE, "n: expected more than 1 value per channel when training, got "
                       "input of %lld x %lld values per channel", (long long)a->n, (long long)a->hw);
    return GT_OK;
}

/* Folds channel c's batch mean and biased variance into the running statistics. */
static void update_running(const gt_batchnorm_args *a, size_t c, double mean, double var, double factor) {
    double count = (double)(a->n * a->hw);
    double unbiased = var * count / (count - 1.0);
    a->running_mean[c] = (float)(factor * mean + (1.0 - factor) * (double)a->running_mean[c]);
    a->running_var[c] = (float)(factor * unbiased + (1.0 - factor) * (double)a->running_var[c]);
}

gt_status gt_cpu_batchnorm_forward(gt_backend *be, const gt_batchnorm_args *a) {
    (void)be;
    GT_TRY(check_batchnorm(a, 1));
    if (a->c == 0)
        return GT_OK;
    double factor = a->momentum;
    if (a->update_running) {
        *a->num_batches_tracked += 1;
        if (factor < 0.0)
            factor = 1.0 / (double)*a->num_batches_tracked;
    }
    __typeof__(&bn_stats_scalar) stats = GT_CPU_RUN(bn_stats);
    __typeof__(&bn_apply_scalar) apply = GT_CPU_RUN(bn_apply);
    size_t n = (size_t)a->n, channels = (size_t)a->c, hw = (size_t)a->hw;
#pragma omp parallel for schedule(static) if (channels > 1 && n * hw * channels > GT_CPU_CHUNK)
    for (size_t c = 0; c < channels; c++) {
        double mean = 0.0, var = 0.0;
        if (a->batch_stats)
            stats(&mean, &var, a->in, n, c, channels, hw, a->dt);
        else {
            mean = a->running_mean[c];
            var = a->running_var[c];
        }
        float m = (float)mean, s = (float)(1.0 / sqrt(var + (double)a->eps));
        float w = a->weight ? a->weight[c] : 1.0f, b = a->bias ? a->bias[c] : 0.0f;
        float scale = s * w;
        apply(a->out, a->in, scale, b - m * scale, n, c, channels, hw, a->dt);
        a->mean[c] = m;
        a->rstd[c] = s;
        if (a->update_running)
            update_running(a, c, mean, var, factor);
    }
    return GT_OK;
}

gt_status gt_cpu_batchnorm_backward(gt_backend *be, const gt_batchnorm_args *a) {
    (void)be;
    GT_TRY(check_batchnorm(a, 0));
    __typeof__(&bn_grad_sums_scalar) sums = GT_CPU_RUN(bn_grad_sums);
    __typeof__(&bn_din_scalar) din = GT_CPU_RUN(bn_din);
    size_t n = (size_t)a->n, channels = (size_t)a->c, hw = (size_t)a->hw;
    double count = (double)(n * hw);
#pragma omp parallel for schedule(static) if (channels > 1 && n * hw * channels > GT_CPU_CHUNK)
    for (size_t c = 0; c < channels; c++) {
        double sum_dy = 0.0, sum_dyx = 0.0;
        float m = a->mean[c], s = a->rstd[c], w = a->weight ? a->weight[c] : 1.0f;
        sums(&sum_dy, &sum_dyx, a->dout, a->in, m, n, c, channels, hw, a->dt);
        float dweight = (float)(sum_dyx * s), dbias = (float)sum_dy;
        if (a->dweight)
            a->dweight[c] = a->accumulate ? a->dweight[c] + dweight : dweight;
        if (a->dbias)
            a->dbias[c] = a->accumulate ? a->dbias[c] + dbias : dbias;
        if (!a->din)
            continue;
        float scale = s * w, shift = 0.0f, slope = 0.0f;
        if (a->batch_stats && count > 0.0) {
            shift = (float)((double)scale * sum_dy / count);
            slope = (float)((double)scale * sum_dyx * (double)s * (double)s / count);
        }
        din(a->din, a->dout, a->in, m, scale, shift, slope, n, c, channels, hw, a->dt);
    }
    return GT_OK;
}
