/* LayerNorm over the last dimension and Embedding lookups: thin layers over their ops. A frozen
 * parameter (gt_param.frozen) gets no gradient: LayerNorm passes NULL for it, a frozen Embedding
 * table skips its scatter-add (its ids have no gradient: its backward is then nothing). */
#include "nn/layer.h"

gt_status gt_layernorm_forward(gt_layer *layer, const void *in, gt_run *run) {
    return run->backend->ops->layernorm_forward(
        run->backend, layer->out.ptr, layer->mean, layer->rstd, in, layer->weight.data,
        layer->has_bias ? layer->bias.data : NULL, gt_rows_of(&layer->in_shape),
        layer->in_features, layer->eps, run->dt);
}

gt_status gt_layernorm_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                gt_run *run) {
    return run->backend->ops->layernorm_backward(
        run->backend, din, layer->weight.frozen ? NULL : layer->weight.grad,
        layer->has_bias && !layer->bias.frozen ? layer->bias.grad : NULL, dout,
        in, layer->weight.data, layer->mean, layer->rstd, gt_rows_of(&layer->in_shape),
        layer->in_features, run->dt, gt_layer_accumulates(layer, run));
}

gt_status gt_embedding_forward(gt_layer *layer, const void *in, gt_run *run) {
    return run->backend->ops->embedding_forward(
        run->backend, layer->out.ptr, (const int64_t *)in, layer->weight.data, GT_F32,
        (int64_t)gt_tensor_numel(&layer->in_shape), layer->num_embeddings, layer->embedding_dim,
        run->dt);
}

gt_status gt_embedding_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                gt_run *run) {  /* ids have no gradient: din unused */
    if (layer->weight.frozen)
        return GT_OK;
    return run->backend->ops->embedding_backward(
        run->backend, layer->weight.grad, dout, (const int64_t *)in,
        (int64_t)gt_tensor_numel(&layer->in_shape), layer->num_embeddings, layer->embedding_dim,
        run->dt, gt_layer_accumulates(layer, run));
}
