/* CPU sequence masks and pooling over the sequence axis of (batch, seq, dim) activations:
 * the key lengths of 0/1 attention masks, the segments (key starts) and last tokens of decoder
 * rows, first-token ([CLS]), last-token and masked mean pooling.
 * Each batch entry is independent (parallel over b); inside one, the mean sums its positions in
 * increasing t in f32, so the result does not depend on the thread count. */
#include <string.h>

#include "ops/cnn_checks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/sequence_hd.h"

gt_status gt_cpu_mask_lengths(gt_backend *be, int64_t *lengths, const int64_t *mask, int64_t batch,
                              int64_t seq, int64_t stride) {
    (void)be;
    GT_TRY(gt_mask_lengths_check(batch, seq, stride));
    for (int64_t b = 0; b < batch; b++)
        lengths[b] = gt_seq_mask_length(mask, (size_t)b, (size_t)seq, (size_t)stride);
    return GT_OK;
}

gt_status gt_cpu_key_starts(gt_backend *be, int64_t *starts, int64_t *last, const int64_t *ids,
                            const int64_t *mask, const int64_t *positions, int64_t batch, int64_t seq,
                            int64_t stride, int64_t pad_token_id) {
    (void)be;
    GT_TRY(gt_key_starts_check(starts, last, ids, mask, positions, batch, seq, stride, pad_token_id));
    for (int64_t b = 0; b < batch && seq > 0; b++) {
        if (starts)
            gt_seq_key_starts_row(starts, mask, positions, (size_t)b, (size_t)seq, (size_t)stride);
        if (last)
            last[b] = gt_seq_last_token(ids, (size_t)b, (size_t)seq, (size_t)stride, pad_token_id);
    }
    return GT_OK;
}

GT_INLINE void pool_forward_body(void *out, const void *in, size_t b, size_t seq, size_t dim,
                                 size_t first, size_t count, gt_dtype dt) {
    for (size_t c = 0; c < dim; c++)
        gt_cpu_store(out, b * dim + c, gt_seq_pool_value(in, b, c, seq, dim, first, count, dt), dt);
}
GT_CPU_KERNEL(pool_forward, (void *out, const void *in, size_t b, size_t seq, size_t dim,
                             size_t first, size_t count, gt_dtype dt),
              out, in, b, seq, dim, first, count)

gt_status gt_cpu_pool_forward(gt_backend *be, void *out, const void *in, const int64_t *lengths,
                              int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    (void)be;
    GT_TRY(gt_seq_pool_check(batch, seq, dim, mode, dt));
    GT_TRY(gt_seq_lengths_check(lengths, batch, gt_seq_lengths_limit(seq, mode)));
    __typeof__(&pool_forward_scalar) kernel = GT_CPU_RUN(pool_forward);
#pragma omp parallel for schedule(static) if (batch * seq * dim > GT_CPU_CHUNK)
    for (int64_t b = 0; b < batch; b++) {
        size_t count = gt_seq_pooled(lengths, (size_t)b, (size_t)seq, mode);
        size_t first = gt_seq_pool_first(lengths, (size_t)b, (size_t)seq, mode);
        kernel(out, in, (size_t)b, (size_t)seq, (size_t)dim, first, count, dt);
    }
    return GT_OK;
}

GT_INLINE void pool_backward_body(void *din, const void *dout, size_t b, size_t seq, size_t dim,
                                  size_t first, size_t count, gt_dtype dt) {
    for (size_t t = 0; t < seq; t++)
        for (size_t c = 0; c < dim; c++)
            gt_cpu_store(din, (b * seq + t) * dim + c, gt_seq_pool_grad(dout, b, t, c, dim, first, count, dt),
                         dt);
}
GT_CPU_KERNEL(pool_backward, (void *din, const void *dout, size_t b, size_t seq, size_t dim,
                              size_t first, size_t count, gt_dtype dt),
              din, dout, b, seq, dim, first, count)

gt_status gt_cpu_pool_backward(gt_backend *be, void *din, const void *dout, const int64_t *lengths,
                               int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    (void)be;
    GT_TRY(gt_seq_pool_check(batch, seq, dim, mode, dt));
    GT_TRY(gt_seq_lengths_check(lengths, batch, gt_seq_lengths_limit(seq, mode)));
    __typeof__(&pool_backward_scalar) kernel = GT_CPU_RUN(pool_backward);
#pragma omp parallel for schedule(static) if (batch * seq * dim > GT_CPU_CHUNK)
    for (int64_t b = 0; b < batch; b++) {
        size_t count = gt_seq_pooled(lengths, (size_t)b, (size_t)seq, mode);
        size_t first = gt_seq_pool_first(lengths, (size_t)b, (size_t)seq, mode);
        kernel(din, dout, (size_t)b, (size_t)seq, (size_t)dim, first, count, dt);
    }
    return GT_OK;
}
