// CUDA sequence masks and pooling over (batch, seq, dim) activations (ops.h: mask_lengths,
// pool_forward, pool_backward) on the per-element math of ops/sequence_hd.h, which the CPU ops
// run too and a host harness checks in CI (tests/test_cnn_cuda_math.py): one thread per
// sequence (mask lengths; key starts and last tokens, a row scan), per output (the mean sums its positions in increasing t, as the CPU)
// and per input-gradient element, so the results are the CPU op's bits.
//
// lengths is device memory; the pooling checks it on the device like the attention op checks its
// key lengths, without waiting: the first entry outside [0, seq] goes to the backend's error slot
// (named with the CPU's message at the stream's next wait) and the pooling kernels skip their work.
#include "ops/cnn_checks.h"
#include "ops/sequence_hd.h"
#include "ops_kernels.cuh"

namespace {

__global__ void mask_lengths_kernel(int64_t *lengths, const int64_t *mask, size_t batch, size_t seq,
                                    size_t stride) {
    GT_GRID_STRIDE(b, batch) lengths[b] = gt_seq_mask_length(mask, b, seq, stride);
}

template <gt_dtype DT>
__global__ void seq_pool_forward_kernel(void *out, const void *in, const int64_t *lengths, size_t batch,
                                        size_t seq, size_t dim, gt_pool_mode mode,
                                        const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    GT_GRID_STRIDE(k, batch * dim) {
        size_t b = k / dim, c = k % dim, count = gt_seq_pooled(lengths, b, seq, mode);
        size_t first = gt_seq_pool_first(lengths, b, seq, mode);
        gt_hd_store(out, k, gt_seq_pool_value(in, b, c, seq, dim, first, count, DT), DT);
    }
}

template <gt_dtype DT>
__global__ void seq_pool_backward_kernel(void *din, const void *dout, const int64_t *lengths, size_t batch,
                                         size_t seq, size_t dim, gt_pool_mode mode,
                                         const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    GT_GRID_STRIDE(k, batch * seq * dim) {
        size_t b = k / (seq * dim), t = k / dim % seq, c = k % dim;
        size_t first = gt_seq_pool_first(lengths, b, seq, mode), count = gt_seq_pooled(lengths, b, seq, mode);
        gt_hd_store(din, k, gt_seq_pool_grad(dout, b, t, c, dim, first, count, DT), DT);
    }
}

// The state after the shared checks, with the device check of lengths queued (as the CPU: in every
// mode); *first_bad = its result for the kernels (NULL without lengths).
gt_status pool_begin(gt_backend *be, const int64_t *lengths, int64_t batch, int64_t seq, int64_t dim,
                     gt_pool_mode mode, gt_dtype dt, gt_cuda_backend_state **state,
                     const unsigned long long **first_bad) {
    GT_TRY(gt_seq_pool_check(batch, seq, dim, mode, dt));
    GT_TRY(gt_cuda_op_begin(be, state));
    *first_bad = NULL;
    if (batch == 0 || !lengths)
        return GT_OK;
    gt_cuda_op_error error = {GT_CUDA_CHECK_LENGTHS, 0, 0, gt_seq_lengths_limit(seq, mode), 0};
    GT_TRY(gt_cuda_check_entries(*state, lengths, (size_t)batch, error));
    *first_bad = scratch_words(*state);
    return GT_OK;
}

__global__ void key_starts_kernel(int64_t *starts, int64_t *last, const int64_t *ids, const int64_t *mask,
                                  const int64_t *positions, size_t batch, size_t seq, size_t stride,
                                  int64_t pad_token_id) {
    GT_GRID_STRIDE(b, batch) {
        if (starts)
            gt_seq_key_starts_row(starts, mask, positions, b, seq, stride);
        if (last)
            last[b] = gt_seq_last_token(ids, b, seq, stride, pad_token_id);
    }
}

}  // namespace

gt_status gt_cuda_key_starts(gt_backend *be, int64_t *starts, int64_t *last, const int64_t *ids, const int64_t *mask,
                             const int64_t *positions, int64_t batch, int64_t seq, int64_t stride,
                             int64_t pad_token_id) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_key_starts_check(starts, last, ids, mask, positions, batch, seq, stride, pad_token_id));
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (batch == 0 || seq == 0 || (!starts && !last))
        return GT_OK;
    key_starts_kernel<<<grid_for((size_t)batch), kThreads, 0, stream_of(state)>>>(
        starts, last, ids, mask, positions, (size_t)batch, (size_t)seq, (size_t)stride, pad_token_id);
    return gt_cuda_check_launch("key_starts_kernel launch");
}

gt_status gt_cuda_mask_lengths(gt_backend *be, int64_t *lengths, const int64_t *mask, int64_t batch, int64_t seq,
                               int64_t stride) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_mask_lengths_check(batch, seq, stride));
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (batch == 0)
        return GT_OK;
    mask_lengths_kernel<<<grid_for((size_t)batch), kThreads, 0, stream_of(state)>>>(lengths, mask, (size_t)batch,
                                                                                  (size_t)seq, (size_t)stride);
    return gt_cuda_check_launch("mask_lengths_kernel launch");
}

gt_status gt_cuda_pool_forward(gt_backend *be, void *out, const void *in, const int64_t *lengths, int64_t batch,
                               int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    gt_cuda_backend_state *state = NULL;
    const unsigned long long *first_bad = NULL;
    size_t outputs = (size_t)(batch * dim);
    GT_TRY(pool_begin(be, lengths, batch, seq, dim, mode, dt, &state, &first_bad));
    if (outputs == 0)
        return GT_OK;
    GT_LAUNCH_DT(dt, seq_pool_forward_kernel, grid_for(outputs), kThreads, 0, stream_of(state), out, in, lengths,
                 (size_t)batch, (size_t)seq, (size_t)dim, mode, first_bad);
    return gt_cuda_check_launch("seq_pool_forward_kernel launch");
}

gt_status gt_cuda_pool_backward(gt_backend *be, void *din, const void *dout, const int64_t *lengths, int64_t batch,
                                int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    gt_cuda_backend_state *state = NULL;
    const unsigned long long *first_bad = NULL;
    size_t inputs = (size_t)(batch * seq * dim);
    GT_TRY(pool_begin(be, lengths, batch, seq, dim, mode, dt, &state, &first_bad));
    if (inputs == 0)
        return GT_OK;
    GT_LAUNCH_DT(dt, seq_pool_backward_kernel, grid_for(inputs), kThreads, 0, stream_of(state), din, dout, lengths,
                 (size_t)batch, (size_t)seq, (size_t)dim, mode, first_bad);
    return gt_cuda_check_launch("seq_pool_backward_kernel launch");
}
