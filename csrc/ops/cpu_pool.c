/* CPU sequence masks and pooling over the sequence axis of (batch, seq, dim) activations:
 * the key lengths of 0/1 attention masks, first-token ([CLS]) pooling and masked mean pooling.
 * Each batch entry is independent (parallel over b); inside one, the mean sums its positions in
 * increasing t in f32, so the result does not depend on the thread count. */
#include <string.h>

#include "ops/checks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

gt_status gt_cpu_mask_lengths(gt_backend *be, int64_t *lengths, const int64_t *mask, int64_t batch,
                              int64_t seq, int64_t stride) {
    (void)be;
    GT_TRY(gt_op_check_size(batch, "batch"));
    GT_TRY(gt_op_check_size(seq, "seq"));
    if (stride < seq)
        return GT_FAIL(GT_ERR_VALUE, "stride: must be >= seq (%lld), got %lld", (long long)seq,
                       (long long)stride);
    for (int64_t b = 0; b < batch; b++) {
        int64_t count = 0;
        for (int64_t t = 0; t < seq; t++)
            count += mask[b * stride + t] != 0;
        lengths[b] = count;
    }
    return GT_OK;
}

static gt_status check_pool(const int64_t *lengths, int64_t batch, int64_t seq, int64_t dim,
                            gt_pool_mode mode, gt_dtype dt) {
    GT_TRY(gt_op_check_size(batch, "batch"));
    GT_TRY(gt_op_check_size(seq, "seq"));
    GT_TRY(gt_op_check_size(dim, "dim"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (mode != GT_POOL_FIRST && mode != GT_POOL_MEAN)
        return GT_FAIL(GT_ERR_VALUE, "mode: unknown pooling %d", (int)mode);
    if (mode == GT_POOL_FIRST && seq < 1 && batch > 0)
        return GT_FAIL(GT_ERR_VALUE, "seq: first-token pooling needs at least one position");
    for (int64_t b = 0; lengths && b < batch; b++)
        if (lengths[b] < 0 || lengths[b] > seq)
            return GT_FAIL(GT_ERR_VALUE, "lengths[%lld]: must be in [0, %lld], got %lld", (long long)b,
                           (long long)seq, (long long)lengths[b]);
    return GT_OK;
}

/* Positions of sequence b that the pooling reads. */
static size_t pooled_positions(const int64_t *lengths, int64_t b, int64_t seq, gt_pool_mode mode) {
    if (mode == GT_POOL_FIRST)
        return 1;
    return lengths ? (size_t)lengths[b] : (size_t)seq;
}

GT_INLINE void pool_forward_body(void *out, const void *in, size_t b, size_t seq, size_t dim,
                                 size_t count, gt_dtype dt) {
    for (size_t c = 0; c < dim; c++) {
        float sum = 0.0f;
        for (size_t t = 0; t < count; t++)
            sum += gt_cpu_load(in, (b * seq + t) * dim + c, dt);
        gt_cpu_store(out, b * dim + c, count ? sum / (float)count : 0.0f, dt);
    }
}
GT_CPU_KERNEL(pool_forward, (void *out, const void *in, size_t b, size_t seq, size_t dim,
                             size_t count, gt_dtype dt),
              out, in, b, seq, dim, count)

gt_status gt_cpu_pool_forward(gt_backend *be, void *out, const void *in, const int64_t *lengths,
                              int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    (void)be;
    GT_TRY(check_pool(lengths, batch, seq, dim, mode, dt));
    __typeof__(&pool_forward_scalar) kernel = GT_CPU_RUN(pool_forward);
#pragma omp parallel for schedule(static) if (batch * seq * dim > GT_CPU_CHUNK)
    for (int64_t b = 0; b < batch; b++)
        kernel(out, in, (size_t)b, (size_t)seq, (size_t)dim, pooled_positions(lengths, b, seq, mode), dt);
    return GT_OK;
}

GT_INLINE void pool_backward_body(void *din, const void *dout, size_t b, size_t seq, size_t dim,
                                  size_t count, gt_dtype dt) {
    for (size_t t = 0; t < seq; t++)
        for (size_t c = 0; c < dim; c++) {
            float g = t < count ? gt_cpu_load(dout, b * dim + c, dt) / (float)count : 0.0f;
            gt_cpu_store(din, (b * seq + t) * dim + c, g, dt);
        }
}
GT_CPU_KERNEL(pool_backward, (void *din, const void *dout, size_t b, size_t seq, size_t dim,
                              size_t count, gt_dtype dt),
              din, dout, b, seq, dim, count)

gt_status gt_cpu_pool_backward(gt_backend *be, void *din, const void *dout, const int64_t *lengths,
                               int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    (void)be;
    GT_TRY(check_pool(lengths, batch, seq, dim, mode, dt));
    __typeof__(&pool_backward_scalar) kernel = GT_CPU_RUN(pool_backward);
#pragma omp parallel for schedule(static) if (batch * seq * dim > GT_CPU_CHUNK)
    for (int64_t b = 0; b < batch; b++)
        kernel(din, dout, (size_t)b, (size_t)seq, (size_t)dim, pooled_positions(lengths, b, seq, mode), dt);
    return GT_OK;
}
