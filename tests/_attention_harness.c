/* Host harness of the CUDA attention kernels (cuda/ops_attention.cu): the per-thread functions
 * of csrc/ops/attention_hd.h run over the kernels' whole grid, one row after another, so the
 * arithmetic the GPU runs is checked on any machine. tests/test_attention_cuda_math.py compiles
 * it (C11, -ffp-contract=off like the extension) and calls gt_harness_attention through ctypes.
 *
 * gt_harness_attention(backward, sizes, ...): sizes = (batch, heads, seq, head_dim, kv_heads);
 * the pointers, strides (q's, k's and v's, out's), scale, masks (causal, key_lengths, window,
 * key_starts) and dropout key as gt_attention_args (ops.h) takes them;
 * dropout_key = (seed, layer, step, offset); dt a gt_dtype (0 f32, 1 f16, 2 bf16). Forward
 * writes out and lse; backward reads them and dout and writes dq, dk, dv, computing the row
 * terms D_i first as the device does. Returns 0, or -1 when scratch memory is not available. */
#include <stdlib.h>

#include "ops/attention_hd.h"

int gt_harness_attention(int backward, const int64_t sizes[5], const void *q, const void *k,
                         const void *v, void *out, float *lse, const void *dout, void *dq,
                         void *dk, void *dv, const int64_t in_strides[3],
                         const int64_t kv_strides[3], const int64_t out_strides[3], float scale,
                         int causal, const int64_t *key_lengths, int64_t window,
                         const int64_t *key_starts, double dropout_p,
                         const uint64_t dropout_key[4], int dt) {
    gt_attention_args a = {
        .batch = sizes[0], .heads = sizes[1], .seq = sizes[2], .head_dim = sizes[3],
        .kv_heads = sizes[4],
        .q = q, .k = k, .v = v, .out = out, .lse = lse, .dout = dout, .dq = dq, .dk = dk, .dv = dv,
        .in = {in_strides[0], in_strides[1], in_strides[2]},
        .kv = {kv_strides[0], kv_strides[1], kv_strides[2]},
        .out_strides = {out_strides[0], out_strides[1], out_strides[2]},
        .scale = scale, .causal = causal, .window = window, .key_lengths = key_lengths,
        .key_starts = key_starts, .dropout_p = dropout_p,
        .dropout_key = {dropout_key[0], (uint32_t)dropout_key[1], (uint32_t)dropout_key[2],
                        dropout_key[3]},
        .dt = (gt_dtype)dt,
    };
    size_t rows = (size_t)(a.batch * a.heads * a.seq), dim = (size_t)a.head_dim;
    size_t kv_rows = (size_t)(a.batch * a.kv_heads * a.seq);  /* the dk/dv kernel's grid */
    size_t tile = GT_ATTN_Q_TILE > GT_ATTN_K_TILE ? GT_ATTN_Q_TILE : GT_ATTN_K_TILE;
    float *scratch = malloc((4 * dim + 2 * tile + rows + 1) * sizeof(float));
    if (!scratch)
        return -1;
    float *r0 = scratch, *r1 = r0 + dim, *r2 = r1 + dim, *r3 = r2 + dim;  /* head_dim each */
    float *t0 = r3 + dim, *t1 = t0 + tile, *delta = t1 + tile;            /* tiles, (rows,) */
    for (size_t u = 0; !backward && u < rows; u++)
        gt_attn_forward_row(&a, u, r0, r1, t0);
    for (size_t u = 0; backward && u < rows; u++)
        gt_attn_delta_row(&a, u, delta);
    for (size_t u = 0; backward && u < kv_rows; u++)
        gt_attn_dkdv_row(&a, u, delta, r0, r1, r2, r3, t0, t1);
    for (size_t u = 0; backward && u < rows; u++)
        gt_attn_dq_row(&a, u, delta, r0, r1, r2, t0);
    free(scratch);
    return 0;
}
