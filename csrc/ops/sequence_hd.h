/* The per-element math of the sequence mask and pooling ops (ops.h: mask_lengths, pool_forward,
 * pool_backward), shared by the CPU ops (cpu_pool.c), the CUDA kernels (cuda/ops_sequence.cu)
 * and a host harness that runs the kernels' math in CI (tests/_cnn_harness.c). The mean sums its
 * positions in increasing t in f32 and divides once, so every build gives the same bits. */
#ifndef GT_SEQUENCE_HD_H
#define GT_SEQUENCE_HD_H

#include "ops/elem_hd.h"
#include "ops/ops.h"

/* The nonzero entries of mask row b (at mask + b * stride, seq entries). */
GT_HD_INLINE int64_t gt_seq_mask_length(const int64_t *mask, size_t b, size_t seq, size_t stride) {
    int64_t count = 0;
    for (size_t t = 0; t < seq; t++)
        count += mask[b * stride + t] != 0;
    return count;
}

/* Positions of sequence b that the pooling reads (lengths NULL: all seq). */
GT_HD_INLINE size_t gt_seq_pooled(const int64_t *lengths, size_t b, size_t seq, gt_pool_mode mode) {
    if (mode != GT_POOL_MEAN)
        return 1;
    return lengths ? (size_t)lengths[b] : seq;
}

/* The first position of sequence b that the pooling reads: the last token's for GT_POOL_LAST
 * (lengths[b], or seq - 1 without lengths), else 0. */
GT_HD_INLINE size_t gt_seq_pool_first(const int64_t *lengths, size_t b, size_t seq, gt_pool_mode mode) {
    if (mode != GT_POOL_LAST)
        return 0;
    return lengths ? (size_t)lengths[b] : seq - 1;
}

/* out[b, c] = the sum of in[b, t, c] over first <= t < first + count, in increasing t, divided by
 * count (0 when count is 0; x / 1 is x). */
GT_HD_INLINE float gt_seq_pool_value(const void *in, size_t b, size_t c, size_t seq, size_t dim,
                                     size_t first, size_t count, gt_dtype dt) {
    float sum = 0.0f;
    for (size_t t = first; t < first + count; t++)
        sum += gt_hd_load(in, (b * seq + t) * dim + c, dt);
    return count ? sum / (float)count : 0.0f;
}

/* din[b, t, c] = dout[b, c] / count for first <= t < first + count, else 0. */
GT_HD_INLINE float gt_seq_pool_grad(const void *dout, size_t b, size_t t, size_t c, size_t dim,
                                    size_t first, size_t count, gt_dtype dt) {
    return t >= first && t < first + count ? gt_hd_load(dout, b * dim + c, dt) / (float)count : 0.0f;
}

/* Row b of key_starts (ops.h): starts[b, t] for every t (mask and positions rows at b * stride). */
GT_HD_INLINE void gt_seq_key_starts_row(int64_t *starts, const int64_t *mask, const int64_t *positions,
                                        size_t b, size_t seq, size_t stride) {
    const int64_t *m = mask + b * stride, *p = positions + b * stride;
    int64_t start = 0;
    for (size_t t = 0; t < seq; t++) {
        int on = m[t] != 0;
        if (t > 0 && (on != (m[t - 1] != 0) || (on && p[t] == 0)))
            start = (int64_t)t;
        starts[b * seq + t] = start;
    }
}

/* The last token of row b (key_starts' `last`, ops.h): the rightmost id != pad_token_id, 0 when
 * none; seq - 1 when pad_token_id < 0. */
GT_HD_INLINE int64_t gt_seq_last_token(const int64_t *ids, size_t b, size_t seq, size_t stride,
                                       int64_t pad_token_id) {
    if (pad_token_id < 0)
        return (int64_t)seq - 1;
    for (size_t t = seq; t-- > 0;)
        if (ids[b * stride + t] != pad_token_id)
            return (int64_t)t;
    return 0;
}

#endif
