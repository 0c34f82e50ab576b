/* PositionEmbedding: out[b, t, :] = in[b, t, :] + W[o + t, :] for the positions t in [0, T) of a
 * (..., T, C) input, W (num_positions, C) f32, o the offset (0; RoBERTa's padding_idx + 1, the row
 * of its first real token under right padding). Seen as (rows, T * C), W[o:o+T] is a bias of
 * T * C columns, so the layer runs on the bias ops of any backend: forward copies and adds it,
 * backward passes dout through and sums it over the rows into dW[o:o+T]. The other rows of dW get
 * no gradient: written as zeros unless the gradients accumulate. */
#include "nn/layer.h"

/* T * C: the columns of the input seen as a bias-shaped matrix. */
static int64_t position_cols(const gt_layer *layer) {
    const gt_tensor *in = &layer->in_shape;
    return in->shape[in->ndim - 2] * layer->embedding_dim;
}

/* Elements of W before row o. */
static size_t position_skip(const gt_layer *layer) {
    return (size_t)(layer->position_offset * layer->embedding_dim);
}

gt_status gt_position_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t cols = position_cols(layer);
    GT_TRY(ops->copy(run->backend, layer->out.ptr, in, gt_tensor_bytes(&layer->out)));
    return ops->bias_add(run->backend, layer->out.ptr, layer->weight.data + position_skip(layer),
                         gt_layer_out_numel(layer) / cols, cols, run->dt);
}

/* The table's gradient: the column sums of dout in its rows [skip, skip + T), zeros elsewhere
 * unless the gradients accumulate. */
static gt_status position_dweight(gt_layer *layer, const void *dout, int accumulate, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t cols = position_cols(layer);
    size_t skip = position_skip(layer);
    GT_TRY(ops->bias_backward(run->backend, layer->weight.grad + skip, dout,
                              gt_layer_out_numel(layer) / cols, cols, run->dt, accumulate));
    size_t unused = layer->weight.numel - skip - (size_t)cols;
    if (!accumulate && skip > 0)
        GT_TRY(ops->zero(run->backend, layer->weight.grad, skip * sizeof(float)));
    if (!accumulate && unused > 0)
        GT_TRY(ops->zero(run->backend, layer->weight.grad + skip + cols, unused * sizeof(float)));
    return GT_OK;
}

gt_status gt_position_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                               gt_run *run) {
    int accumulate = gt_layer_accumulates(layer, run);
    if (!layer->weight.frozen)  /* a frozen table has no gradient */
        GT_TRY(position_dweight(layer, dout, accumulate, run));
    if (!din)
        return GT_OK;
    return run->backend->ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out));
}
