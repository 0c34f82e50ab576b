/* CPU BatchNorm over the channels of (N, C, HW) (ops.h, gt_batchnorm_args). Per channel, the
 * statistics are two passes in double with fixed-order sums (8 lanes per (n, c) plane, the
 * planes added in n order; the math is batchnorm_hd.h's, shared with CUDA): mean = sum(x) / M,
 * var = sum((x - mean)^2) / M (M = N * HW). The forward then writes out = x * a + b with
 * a = rstd * weight and b = bias - mean * a (f32, rounded once to dt). Backward, with
 * xhat = (x - mean) * rstd:
 *   dbias = sum dout, dweight = sum dout * xhat  (double, fixed order)
 *   din = rstd * weight * (dout - dbias / M - xhat * dweight / M)   (batch statistics)
 *   din = rstd * weight * dout                                       (running statistics)
 * Channels run in parallel and each is computed by one thread: any thread count gives the same
 * bits. */
#include "ops/batchnorm_hd.h"
#include "ops/cnn_checks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

/* Mean and biased variance of channel c (batchnorm_hd.h's sums, planes in increasing n). */
GT_INLINE void bn_stats_body(double *mean, double *var, const void *in, size_t n, size_t c,
                             size_t channels, size_t hw, gt_dtype dt) {
    double count = (double)(n * hw), sum = 0.0, squares = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += gt_bn_plane_sum(in, gt_bn_at(i, c, channels, hw), hw, 0.0, 0, dt);
    double mu = sum / count;
    for (size_t i = 0; i < n; i++)
        squares += gt_bn_plane_sum(in, gt_bn_at(i, c, channels, hw), hw, mu, 1, dt);
    *mean = mu;
    *var = squares / count;
}
GT_CPU_KERNEL(bn_stats, (double *mean, double *var, const void *in, size_t n, size_t c,
                         size_t channels, size_t hw, gt_dtype dt),
              mean, var, in, n, c, channels, hw)

/* out = x * scale + shift over channel c's planes. */
GT_INLINE void bn_apply_body(void *out, const void *in, float scale, float shift, size_t n, size_t c,
                             size_t channels, size_t hw, gt_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        size_t base = gt_bn_at(i, c, channels, hw);
        for (size_t k = 0; k < hw; k++)
            gt_bn_apply(out, in, base + k, scale, shift, dt);
    }
}
GT_CPU_KERNEL(bn_apply, (void *out, const void *in, float scale, float shift, size_t n, size_t c,
                         size_t channels, size_t hw, gt_dtype dt),
              out, in, scale, shift, n, c, channels, hw)

/* sums[0] = sum dout, sums[1] = sum dout * (x - mean) over channel c's planes, in increasing n. */
GT_INLINE void bn_grad_sums_body(double *sums, const void *dout, const void *in, float mean, size_t n,
                                 size_t c, size_t channels, size_t hw, gt_dtype dt) {
    sums[0] = sums[1] = 0.0;
    for (size_t i = 0; i < n; i++) {
        double plane[2];
        gt_bn_grad_plane_sums(plane, dout, in, mean, gt_bn_at(i, c, channels, hw), hw, dt);
        sums[0] += plane[0];
        sums[1] += plane[1];
    }
}
GT_CPU_KERNEL(bn_grad_sums, (double *sums, const void *dout, const void *in, float mean, size_t n,
                             size_t c, size_t channels, size_t hw, gt_dtype dt),
              sums, dout, in, mean, n, c, channels, hw)

/* din = scale * dout - shift - slope * (x - mean) over channel c's planes. */
GT_INLINE void bn_din_body(void *din, const void *dout, const void *in, float mean, float scale,
                           float shift, float slope, size_t n, size_t c, size_t channels,
                           size_t hw, gt_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        size_t base = gt_bn_at(i, c, channels, hw);
        for (size_t k = 0; k < hw; k++)
            gt_bn_din(din, dout, in, base + k, mean, scale, shift, slope, dt);
    }
}
GT_CPU_KERNEL(bn_din, (void *din, const void *dout, const void *in, float mean, float scale,
                       float shift, float slope, size_t n, size_t c, size_t channels, size_t hw,
                       gt_dtype dt),
              din, dout, in, mean, scale, shift, slope, n, c, channels, hw)

gt_status gt_cpu_batchnorm_forward(gt_backend *be, const gt_batchnorm_args *a) {
    (void)be;
    GT_TRY(gt_batchnorm_check(a, 1));
    if (a->c == 0)
        return GT_OK;
    double factor = a->momentum;
    if (a->update_running) {
        *a->num_batches_tracked += 1;
        factor = gt_bn_factor(a->momentum, *a->num_batches_tracked);
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
        float scale = 0.0f, shift = 0.0f;
        gt_bn_forward_channel(a, c, mean, var, factor, &scale, &shift);
        apply(a->out, a->in, scale, shift, n, c, channels, hw, a->dt);
    }
    return GT_OK;
}

gt_status gt_cpu_batchnorm_backward(gt_backend *be, const gt_batchnorm_args *a) {
    (void)be;
    GT_TRY(gt_batchnorm_check(a, 0));
    __typeof__(&bn_grad_sums_scalar) sums = GT_CPU_RUN(bn_grad_sums);
    __typeof__(&bn_din_scalar) din = GT_CPU_RUN(bn_din);
    size_t n = (size_t)a->n, channels = (size_t)a->c, hw = (size_t)a->hw;
#pragma omp parallel for schedule(static) if (channels > 1 && n * hw * channels > GT_CPU_CHUNK)
    for (size_t c = 0; c < channels; c++) {
        double total[2];
        float scale = 0.0f, shift = 0.0f, slope = 0.0f;
        sums(total, a->dout, a->in, a->mean[c], n, c, channels, hw, a->dt);
        gt_bn_backward_terms(a, c, total[0], total[1], &scale, &shift, &slope);
        if (a->din)
            din(a->din, a->dout, a->in, a->mean[c], scale, shift, slope, n, c, channels, hw, a->dt);
    }
    return GT_OK;
}
