/* Host harness of the CUDA BatchNorm, 2-D pooling and sequence kernels (cuda/ops_batchnorm.cu,
 * ops_pool2d.cu, ops_sequence.cu): the GT_HD functions of csrc/ops/batchnorm_hd.h, pool2d_hd.h
 * and sequence_hd.h run over the kernels' whole grids in the kernels' order of work, serially,
 * so the arithmetic the GPU runs is checked on any machine. tests/test_cnn_cuda_math.py compiles
 * it (C11, -ffp-contract=off like the extension) and calls it through ctypes. Sizes and flags
 * are those of ops.h's argument structs; dt is a gt_dtype (0 f32, 1 f16, 2 bf16). Each function
 * returns 0, or -1 when scratch memory is not available. */
#include <stdlib.h>

#include "ops/batchnorm_hd.h"
#include "ops/pool2d_hd.h"
#include "ops/sequence_hd.h"

/* The sum over channel c's planes as a channel block forms it: every plane's sum first (its
 * threads, here in reverse order to show that the order of the planes' work does not matter),
 * then added in increasing n from 0. which: 0 sum x, 1 sum (x - mu)^2, 2 the two gradient sums. */
static void channel_totals(const gt_batchnorm_args *a, size_t c, double mu, int which, double *parts,
                           double *totals) {
    size_t n = (size_t)a->n, channels = (size_t)a->c, hw = (size_t)a->hw;
    for (size_t i = n; i-- > 0;) {
        size_t base = gt_bn_at(i, c, channels, hw);
        if (which == 2)
            gt_bn_grad_plane_sums(parts + 2 * i, a->dout, a->in, a->mean[c], base, hw, a->dt);
        else
            parts[2 * i] = gt_bn_plane_sum(a->in, base, hw, mu, which, a->dt);
    }
    totals[0] = totals[1] = 0.0;
    for (size_t i = 0; i < n; i++) {
        totals[0] += parts[2 * i];
        if (which == 2)
            totals[1] += parts[2 * i + 1];
    }
}

/* batchnorm_count_kernel, then batchnorm_forward_kernel's blocks (one per channel). */
static void batchnorm_forward(const gt_batchnorm_args *a, double *parts) {
    size_t channels = (size_t)a->c, hw = (size_t)a->hw, m = (size_t)a->n * hw;
    if (a->update_running)
        *a->num_batches_tracked += 1;
    for (size_t c = 0; c < channels; c++) {
        double sum[2], squares[2], mean = a->running_mean ? a->running_mean[c] : 0.0;
        double var = a->running_var ? a->running_var[c] : 0.0;
        if (a->batch_stats) {
            channel_totals(a, c, 0.0, 0, parts, sum);
            mean = sum[0] / (double)m;
            channel_totals(a, c, mean, 1, parts, squares);
            var = squares[0] / (double)m;
        }
        double factor = a->update_running ? gt_bn_factor(a->momentum, *a->num_batches_tracked) : a->momentum;
        float scale = 0.0f, shift = 0.0f;
        gt_bn_forward_channel(a, c, mean, var, factor, &scale, &shift);
        for (size_t k = 0; k < m; k++)
            gt_bn_apply(a->out, a->in, gt_bn_at(k / hw, c, channels, hw) + k % hw, scale, shift, a->dt);
    }
}

/* batchnorm_backward_kernel's blocks (one per channel). */
static void batchnorm_backward(const gt_batchnorm_args *a, double *parts) {
    size_t channels = (size_t)a->c, hw = (size_t)a->hw, m = (size_t)a->n * hw;
    for (size_t c = 0; c < channels; c++) {
        double sums[2];
        float scale = 0.0f, shift = 0.0f, slope = 0.0f;
        channel_totals(a, c, 0.0, 2, parts, sums);
        gt_bn_backward_terms(a, c, sums[0], sums[1], &scale, &shift, &slope);
        for (size_t k = 0; a->din && k < m; k++)
            gt_bn_din(a->din, a->dout, a->in, gt_bn_at(k / hw, c, channels, hw) + k % hw, a->mean[c], scale,
                      shift, slope, a->dt);
    }
}

/* sizes = (n, c, hw); the forward (backward = 0) reads in, weight, bias and the running buffers
 * and writes out, mean, rstd (and the running buffers); the backward reads dout, in, weight,
 * mean, rstd and writes din, dweight, dbias. NULL pointers as ops.h allows them. */
int gt_harness_batchnorm(int backward, const int64_t sizes[3], const void *in, void *out, const float *weight,
                         const float *bias, float *mean, float *rstd, float *running_mean, float *running_var,
                         int64_t *num_batches_tracked, float eps, double momentum, int batch_stats,
                         int update_running, const void *dout, void *din, float *dweight, float *dbias,
                         int accumulate, int dt) {
    gt_batchnorm_args a = {
        .n = sizes[0], .c = sizes[1], .hw = sizes[2], .in = in, .out = out, .weight = weight, .bias = bias,
        .mean = mean, .rstd = rstd, .running_mean = running_mean, .running_var = running_var,
        .num_batches_tracked = num_batches_tracked, .eps = eps, .momentum = momentum,
        .batch_stats = batch_stats, .update_running = update_running, .dout = dout, .din = din,
        .dweight = dweight, .dbias = dbias, .accumulate = accumulate, .dt = (gt_dtype)dt,
    };
    double *parts = malloc(2 * ((size_t)a.n + 1) * sizeof(double));
    if (!parts)
        return -1;
    if (backward)
        batchnorm_backward(&a, parts);
    else
        batchnorm_forward(&a, parts);
    free(parts);
    return 0;
}

/* sizes = (kind, n, c, h, w, out_h, out_w); window = (kernel, stride, padding, dilation), rows
 * then columns. The forward writes out (and argmax when given) one output after another as
 * pool2d_forward_kernel's threads do; the backward writes din one input element after another
 * as pool2d_backward_kernel's threads gather it. */
int gt_harness_pool2d(int backward, const int64_t sizes[7], const int64_t window[8], int count_include_pad,
                      const void *in, void *out, const void *dout, void *din, int32_t *argmax, int dt) {
    gt_pool2d_args a = {
        .kind = (gt_pool_kind)sizes[0], .n = sizes[1], .c = sizes[2], .h = sizes[3], .w = sizes[4],
        .out_h = sizes[5], .out_w = sizes[6], .kernel = {window[0], window[1]},
        .stride = {window[2], window[3]}, .padding = {window[4], window[5]},
        .dilation = {window[6], window[7]}, .count_include_pad = count_include_pad, .in = in, .out = out,
        .dout = dout, .din = din, .argmax = argmax, .dt = (gt_dtype)dt,
    };
    size_t plane = (size_t)(a.h * a.w), plane_out = (size_t)(a.out_h * a.out_w);
    size_t planes = (size_t)(a.n * a.c);
    for (size_t k = 0; !backward && k < planes * plane_out; k++) {
        size_t p = k / plane_out, o = k % plane_out;
        gt_pool2d_span r = gt_pool2d_window(&a, 0, (int64_t)(o / (size_t)a.out_w), a.h, a.out_h);
        gt_pool2d_span c = gt_pool2d_window(&a, 1, (int64_t)(o % (size_t)a.out_w), a.w, a.out_w);
        gt_pool2d_output(&a, p * plane, k, &r, &c, a.dt);
    }
    for (size_t k = 0; backward && k < planes * plane; k++) {
        size_t p = k / plane, at = k % plane;
        float g = gt_pool2d_gather(&a, p, (int64_t)(at / (size_t)a.w), (int64_t)(at % (size_t)a.w), a.dt);
        gt_hd_store(a.din, k, g, a.dt);
    }
    return 0;
}

/* mask_lengths_kernel's threads: lengths[b] for b < batch. */
int gt_harness_mask_lengths(int64_t *lengths, const int64_t *mask, int64_t batch, int64_t seq, int64_t stride) {
    for (size_t b = 0; b < (size_t)batch; b++)
        lengths[b] = gt_seq_mask_length(mask, b, (size_t)seq, (size_t)stride);
    return 0;
}

/* key_starts_kernel's threads, one per row b (run last row first): starts (batch, seq) and last
 * (batch,), each NULL when not wanted; mask and positions rows at b * stride. */
int gt_harness_key_starts(int64_t *starts, int64_t *last, const int64_t *ids, const int64_t *mask,
                          const int64_t *positions, int64_t batch, int64_t seq, int64_t stride, int64_t pad_token_id) {
    for (size_t b = (size_t)batch; b-- > 0;) {
        if (starts)
            gt_seq_key_starts_row(starts, mask, positions, b, (size_t)seq, (size_t)stride);
        if (last)
            last[b] = gt_seq_last_token(ids, b, (size_t)seq, (size_t)stride, pad_token_id);
    }
    return 0;
}

/* seq_pool_forward_kernel's threads (backward = 0: out (batch, dim) from in) or
 * seq_pool_backward_kernel's (din (batch, seq, dim) from dout); mode a gt_pool_mode. */
int gt_harness_seq_pool(int backward, void *dst, const void *src, const int64_t *lengths, int64_t batch,
                        int64_t seq, int64_t dim, int mode, int dt) {
    size_t b_n = (size_t)batch, t_n = (size_t)seq, d_n = (size_t)dim;
    for (size_t k = 0; !backward && k < b_n * d_n; k++) {
        size_t b = k / d_n, count = gt_seq_pooled(lengths, b, t_n, (gt_pool_mode)mode);
        size_t first = gt_seq_pool_first(lengths, b, t_n, (gt_pool_mode)mode);
        gt_hd_store(dst, k, gt_seq_pool_value(src, b, k % d_n, t_n, d_n, first, count, (gt_dtype)dt), (gt_dtype)dt);
    }
    for (size_t k = 0; backward && k < b_n * t_n * d_n; k++) {
        size_t b = k / (t_n * d_n), count = gt_seq_pooled(lengths, b, t_n, (gt_pool_mode)mode);
        size_t first = gt_seq_pool_first(lengths, b, t_n, (gt_pool_mode)mode);
        float g = gt_seq_pool_grad(src, b, k / d_n % t_n, k % d_n, d_n, first, count, (gt_dtype)dt);
        gt_hd_store(dst, k, g, (gt_dtype)dt);
    }
    return 0;
}
