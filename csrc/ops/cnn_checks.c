/* The shared checks of the BatchNorm, 2-D pooling and sequence ops (cnn_checks.h). */
#include "ops/cnn_checks.h"

gt_status gt_batchnorm_check(const gt_batchnorm_args *a, int forward) {
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

gt_status gt_pool2d_check(const gt_pool2d_args *a, int backward) {
    const int64_t sizes[] = {a->n, a->c, a->h, a->w, a->out_h, a->out_w};
    const char *names[] = {"n", "c", "h", "w", "out_h", "out_w"};
    for (int i = 0; i < 6; i++)
        GT_TRY(gt_op_check_size(sizes[i], names[i]));
    GT_TRY(gt_op_check_dtype(a->dt, "dt"));
    if (a->kind != GT_POOL_MAX && a->kind != GT_POOL_AVG && a->kind != GT_POOL_ADAPTIVE_AVG)
        return GT_FAIL(GT_ERR_VALUE, "kind: unknown pooling %d", (int)a->kind);
    for (int d = 0; d < 2 && a->kind != GT_POOL_ADAPTIVE_AVG; d++) {
        if (a->kernel[d] < 1 || a->stride[d] < 1 || a->dilation[d] < 1 || a->padding[d] < 0)
            return GT_FAIL(GT_ERR_VALUE, "kernel, stride and dilation must be >= 1 and padding >= 0");
    }
    if (a->kind == GT_POOL_MAX && a->argmax && a->h * a->w > INT32_MAX)
        return GT_FAIL(GT_ERR_VALUE, "argmax: planes of %lld x %lld elements are beyond int32 offsets",
                       (long long)a->h, (long long)a->w);
    if (a->kind == GT_POOL_ADAPTIVE_AVG && a->n * a->c > 0 && (a->out_h < 1 || a->out_w < 1))
        return GT_FAIL(GT_ERR_VALUE, "out_h, out_w: adaptive pooling needs an output of at least 1 x 1");
    if (a->n * a->c * a->out_h * a->out_w == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(a->in, "in"));
    GT_TRY(gt_op_check_ptr(backward ? a->dout : a->out, backward ? "dout" : "out"));
    return backward ? gt_op_check_ptr(a->din, "din") : GT_OK;
}

gt_status gt_mask_lengths_check(int64_t batch, int64_t seq, int64_t stride) {
    GT_TRY(gt_op_check_size(batch, "batch"));
    GT_TRY(gt_op_check_size(seq, "seq"));
    if (stride < seq)
        return GT_FAIL(GT_ERR_VALUE, "stride: must be >= seq (%lld), got %lld", (long long)seq,
                       (long long)stride);
    return GT_OK;
}

gt_status gt_seq_pool_check(int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    GT_TRY(gt_op_check_size(batch, "batch"));
    GT_TRY(gt_op_check_size(seq, "seq"));
    GT_TRY(gt_op_check_size(dim, "dim"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (mode != GT_POOL_FIRST && mode != GT_POOL_MEAN && mode != GT_POOL_LAST)
        return GT_FAIL(GT_ERR_VALUE, "mode: unknown pooling %d", (int)mode);
    if (mode != GT_POOL_MEAN && seq < 1 && batch > 0)
        return GT_FAIL(GT_ERR_VALUE, "seq: first- and last-token pooling need at least one position");
    return GT_OK;
}

gt_status gt_seq_lengths_check(const int64_t *lengths, int64_t batch, int64_t seq) {
    for (int64_t b = 0; lengths && b < batch; b++)
        if (lengths[b] < 0 || lengths[b] > seq)
            return GT_FAIL(GT_ERR_VALUE, "lengths[%lld]: must be in [0, %lld], got %lld", (long long)b,
                           (long long)seq, (long long)lengths[b]);
    return GT_OK;
}

int64_t gt_seq_lengths_limit(int64_t seq, gt_pool_mode mode) { return mode == GT_POOL_LAST ? seq - 1 : seq; }

gt_status gt_key_starts_check(const int64_t *starts, const int64_t *last, const int64_t *ids,
                              const int64_t *mask, const int64_t *positions, int64_t batch, int64_t seq,
                              int64_t stride, int64_t pad_token_id) {
    GT_TRY(gt_op_check_size(batch, "batch"));
    GT_TRY(gt_op_check_size(seq, "seq"));
    if (stride < seq)
        return GT_FAIL(GT_ERR_VALUE, "stride: must be >= seq (%lld), got %lld", (long long)seq,
                       (long long)stride);
    if (batch == 0 || seq == 0)
        return GT_OK;
    if (starts) {
        GT_TRY(gt_op_check_ptr(mask, "mask"));
        GT_TRY(gt_op_check_ptr(positions, "positions"));
    }
    if (last && pad_token_id >= 0)
        GT_TRY(gt_op_check_ptr(ids, "ids"));
    return GT_OK;
}
