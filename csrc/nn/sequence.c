/* The layers of a sequence encoder's ends: Tokens (the input) and Pool (learned positions are
 * PositionEmbedding, csrc/nn/position.c).
 *
 * Tokens reads int64 (B, C, T): channel 0 token ids in [0, V), then (type_vocab > 0) token type
 * ids in [0, S), then (has_mask) the 0/1 attention mask whose ones are each sequence's prefix.
 * out (B, T, E) = table[id] (+ table[V + type]); with a mask it also writes the keys per
 * sequence (the mask's ones) into `lengths`, which the model hands every Attention and Pool
 * layer (gt_run.key_lengths). Batch entry b's channels are contiguous rows of T ids, so the
 * layer runs the embedding ops once per entry and channel; the gradient rows add in increasing b.
 * A decoder's Tokens (position_ids) reads a last channel of position ids, which the model hands
 * every Rope (gt_run.positions), and writes instead of lengths the (B, T) key starts of each query's
 * segment (ops.h: key_starts), which every Attention reads; with a pad_token_id it writes the (B,)
 * last tokens (the rightmost that is not padding), which Pool "last" reads. The table may be held
 * frozen alone (stored_dtype; no gradient): in f16/bf16 (e.g. a bf16 PEFT model's untied embedding),
 * the lookup widening its rows exactly as it reads them; or in 4 bits (NF4/FP4, blocks within a
 * row), the lookup dequantizing the rows it reads (ops.h quantized_embedding_forward), each element
 * code * absmax rounded once, as QLinear dequantizes.
 *
 * Pool: out[b] = in[b, 0] (first token), the mean of in[b, t] over t < lengths[b], or
 * in[b, last_tokens[b]] (last token). */
#include <string.h>

#include "core/alloc.h"
#include "nn/layer.h"

static gt_tokens_config tokens_config(const gt_layer *layer) {
    gt_tokens_config config;
    memcpy(&config, layer->config, sizeof config);
    return config;
}

int gt_tokens_has_positions(const gt_layer *layer) { return tokens_config(layer).position_ids; }

int64_t gt_tokens_pad_token_id(const gt_layer *layer) { return tokens_config(layer).pad_token_id; }

gt_dtype gt_tokens_table_dtype(const gt_layer *layer) {
    switch (tokens_config(layer).stored) {
    case GT_TOKENS_BF16:
        return GT_BF16;
    case GT_TOKENS_F16:
        return GT_F16;
    case GT_TOKENS_NF4:
    case GT_TOKENS_FP4:
        return GT_U8;
    default:
        return GT_F32;
    }
}

int64_t gt_tokens_blocksize(const gt_layer *layer) { return tokens_config(layer).blocksize; }

int gt_tokens_nf4(const gt_layer *layer) { return tokens_config(layer).stored == GT_TOKENS_NF4; }

/* The key starts and last tokens of a decoder's input rows (either may be unplanned: NULL). */
static gt_status tokens_segments(gt_layer *layer, const int64_t *ids, gt_run *run) {
    int64_t batch = layer->in_shape.shape[0], channels = layer->in_shape.shape[1];
    int64_t seq = layer->in_shape.shape[2];
    if (!layer->key_starts && !layer->last_tokens)
        return GT_OK;
    const int64_t *mask = layer->key_starts ? ids + (channels - 2) * seq : NULL;
    const int64_t *positions = layer->key_starts ? ids + (channels - 1) * seq : NULL;
    return run->backend->ops->key_starts(run->backend, layer->key_starts, layer->last_tokens, ids, mask,
                                         positions, batch, seq, channels * seq,
                                         gt_tokens_pad_token_id(layer));
}

static size_t dsize(const gt_run *run) { return gt_dtype_size(run->dt); }

/* out (seq, dim) = rows first + ids of the table (its `num` rows from row `first`: the token rows, or
 * the token-type rows after them), however the table is held. */
static gt_status lookup(gt_layer *layer, void *out, const int64_t *ids, int64_t first, int64_t num, gt_run *run) {
    gt_backend *be = run->backend;
    int64_t seq = layer->in_shape.shape[2], dim = layer->embedding_dim;
    size_t skipped = (size_t)first * (size_t)dim;  /* elements of the flattened table before row `first` */
    gt_dtype table_dt = gt_tokens_table_dtype(layer);
    if (table_dt == GT_F32)
        return be->ops->embedding_forward(be, out, ids, layer->weight.data + skipped, GT_F32, seq, num, dim, run->dt);
    if (table_dt != GT_U8)
        return be->ops->embedding_forward(be, out, ids, layer->frozen + skipped * 2, table_dt, seq, num, dim,
                                          run->dt);
    int64_t blocksize = gt_tokens_blocksize(layer);
    size_t elements = (size_t)(layer->num_embeddings + layer->type_vocab) * (size_t)dim;
    const float *absmax = (const float *)(layer->frozen + gt_align_up(elements / 2));
    return be->ops->quantized_embedding_forward(be, out, ids, (const uint8_t *)layer->frozen + skipped / 2,
                                                absmax + skipped / (size_t)blocksize, layer->quant_code, seq, num,
                                                dim, blocksize, 4, run->dt);
}

gt_status gt_tokens_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    const int64_t *ids = in;
    int64_t batch = layer->in_shape.shape[0], channels = layer->in_shape.shape[1];
    int64_t seq = layer->in_shape.shape[2], vocab = layer->num_embeddings, dim = layer->embedding_dim;
    size_t row = (size_t)(seq * dim) * dsize(run);
    GT_TRY(tokens_segments(layer, ids, run));
    if (gt_tokens_has_positions(layer)) {  /* as make_run (nn/model.c) sets them for every pass */
        run->positions = ids + (channels - 1) * seq;
        run->positions_stride = channels * seq;
    }
    if (layer->has_mask && !gt_tokens_has_positions(layer))
        GT_TRY(ops->mask_lengths(run->backend, layer->lengths, ids + (channels - 1) * seq, batch, seq,
                                 channels * seq));
    void *types = run->scratch[layer->level][0];  /* free in forward: backward alone uses it (sized by
                                                     gt_plan_tokens) */
    for (int64_t b = 0; b < batch; b++) {
        char *out = (char *)layer->out.ptr + (size_t)b * row;
        const int64_t *entry = ids + b * channels * seq;
        GT_TRY(lookup(layer, out, entry, 0, vocab, run));
        if (layer->type_vocab == 0)
            continue;
        GT_TRY(lookup(layer, types, entry + seq, vocab, layer->type_vocab, run));
        GT_TRY(ops->add(run->backend, out, out, types, seq * dim, run->dt));
    }
    return GT_OK;
}

gt_status gt_tokens_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                             gt_run *run) {  /* ids have no gradient: din unused */
    const gt_ops *ops = run->backend->ops;
    const int64_t *ids = in;
    int64_t batch = layer->in_shape.shape[0], channels = layer->in_shape.shape[1];
    int64_t seq = layer->in_shape.shape[2], vocab = layer->num_embeddings, dim = layer->embedding_dim;
    size_t row = (size_t)(seq * dim) * dsize(run);
    int accumulate = gt_layer_accumulates(layer, run);
    if (layer->weight.frozen || gt_tokens_table_dtype(layer) != GT_F32)  /* a frozen table: no scatter-add
                                                                             (and ids have no gradient) */
        return GT_OK;
    for (int64_t b = 0; b < batch; b++) {
        const char *grad = (const char *)dout + (size_t)b * row;
        const int64_t *entry = ids + b * channels * seq;
        int add = accumulate || b > 0;
        GT_TRY(ops->embedding_backward(run->backend, layer->weight.grad, grad, entry, seq, vocab, dim,
                                       run->dt, add));
        if (layer->type_vocab > 0)
            GT_TRY(ops->embedding_backward(run->backend, layer->weight.grad + (size_t)(vocab * dim), grad,
                                           entry + seq, seq, layer->type_vocab, dim, run->dt, add));
    }
    return GT_OK;
}

/* What the pooling reads besides its input: the lengths (mean), the last tokens (last). */
static const int64_t *pool_lengths(const gt_layer *layer, const gt_run *run) {
    return layer->pool == GT_POOL_LAST ? run->last_tokens : run->key_lengths;
}

gt_status gt_pool_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_tensor *s = &layer->in_shape;
    return run->backend->ops->pool_forward(run->backend, layer->out.ptr, in, pool_lengths(layer, run),
                                           s->shape[0], s->shape[1], s->shape[2], layer->pool, run->dt);
}

gt_status gt_pool_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    const gt_tensor *s = &layer->in_shape;
    if (!din)
        return GT_OK;
    return run->backend->ops->pool_backward(run->backend, din, dout, pool_lengths(layer, run), s->shape[0],
                                            s->shape[1], s->shape[2], layer->pool, run->dt);
}
