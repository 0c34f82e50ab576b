/* Dispatch of forward/backward by layer kind, and the parameter-free elementwise layers
 * (activation, dropout, flatten). */
#include "nn/layer.h"

#include <stdlib.h>

int64_t gt_rows_of(const gt_tensor *t) {
    if (t->ndim == 0)
        return 1;
    int64_t last = t->shape[t->ndim - 1];
    return last == 0 ? 0 : (int64_t)gt_tensor_numel(t) / last;
}

int gt_layer_accumulates(const gt_layer *layer, const gt_run *run) {
    return run->accumulate || layer->grad_accumulates;
}

int64_t gt_layer_out_numel(const gt_layer *layer) { return (int64_t)gt_tensor_numel(&layer->out); }

static gt_dropout_key dropout_key(const gt_layer *layer, const gt_run *run) {
    gt_dropout_key key = {run->seed, layer->dropout_id, run->step,
                          run->micro_offset * (uint64_t)gt_layer_out_numel(layer)};
    return key;
}

static int dropout_active(const gt_layer *layer, const gt_run *run) {
    return run->training && layer->p > 0.0f;
}

static gt_status dropout_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t n = gt_layer_out_numel(layer);
    if (!dropout_active(layer, run))
        return ops->copy(run->backend, layer->out.ptr, in, gt_tensor_bytes(&layer->out));
    return ops->dropout_forward(run->backend, layer->out.ptr, in, n, layer->p,
                                dropout_key(layer, run), run->dt);
}

static gt_status dropout_backward(gt_layer *layer, void *din, const void *dout, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t n = gt_layer_out_numel(layer);
    if (!dropout_active(layer, run))
        return ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out));
    return ops->dropout_backward(run->backend, din, dout, n, layer->p, dropout_key(layer, run),
                                 run->dt);
}

gt_status gt_layer_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    switch (layer->kind) {
    case GT_LAYER_LINEAR: return gt_linear_forward(layer, in, run);
    case GT_LAYER_ACTIVATION:
        return ops->activation_forward(run->backend, layer->out.ptr, in,
                                       gt_layer_out_numel(layer), layer->activation, run->dt);
    case GT_LAYER_DROPOUT: return dropout_forward(layer, in, run);
    case GT_LAYER_LAYERNORM: return gt_layernorm_forward(layer, in, run);
    case GT_LAYER_EMBEDDING: return gt_embedding_forward(layer, in, run);
    case GT_LAYER_FLATTEN: layer->out.ptr = (void *)in; return GT_OK;
    case GT_LAYER_SEQUENTIAL: return gt_sequential_forward(layer, in, run);
    case GT_LAYER_RESIDUAL: return gt_residual_forward(layer, in, run);
    case GT_LAYER_ATTENTION: return gt_attention_layer_forward(layer, in, run);
    case GT_LAYER_TOKENS: return gt_tokens_forward(layer, in, run);
    case GT_LAYER_POOL: return gt_pool_forward(layer, in, run);
    case GT_LAYER_POSITION: return gt_position_forward(layer, in, run);
    case GT_LAYER_CONV2D: return gt_conv2d_layer_forward(layer, in, run);
    case GT_LAYER_BATCHNORM2D: return gt_batchnorm2d_forward(layer, in, run);
    case GT_LAYER_POOL2D: return gt_pool2d_layer_forward(layer, in, run);
    }
    return GT_FAIL(GT_ERR_RUNTIME, "unknown layer kind %d", (int)layer->kind);
}

gt_status gt_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                            gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    switch (layer->kind) {
    case GT_LAYER_LINEAR: return gt_linear_backward(layer, din, dout, in, run);
    case GT_LAYER_ACTIVATION:
        if (!din)
            return GT_OK;
        return ops->activation_backward(run->backend, din, dout, in, gt_layer_out_numel(layer),
                                        layer->activation, run->dt);
    case GT_LAYER_DROPOUT: return din ? dropout_backward(layer, din, dout, run) : GT_OK;
    case GT_LAYER_LAYERNORM: return gt_layernorm_backward(layer, din, dout, in, run);
    case GT_LAYER_EMBEDDING: return gt_embedding_backward(layer, dout, in, run);
    case GT_LAYER_FLATTEN:
        return din ? ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out)) : GT_OK;
    case GT_LAYER_SEQUENTIAL: return gt_sequential_backward(layer, din, dout, in, run);
    case GT_LAYER_RESIDUAL: return gt_residual_backward(layer, din, dout, in, run);
    case GT_LAYER_ATTENTION: return gt_attention_layer_backward(layer, din, dout, in, run);
    case GT_LAYER_TOKENS: return gt_tokens_backward(layer, dout, in, run);
    case GT_LAYER_POOL: return din ? gt_pool_backward(layer, din, dout, run) : GT_OK;
    case GT_LAYER_POSITION: return gt_position_backward(layer, din, dout, run);
    case GT_LAYER_CONV2D: return gt_conv2d_layer_backward(layer, din, dout, in, run);
    case GT_LAYER_BATCHNORM2D: return gt_batchnorm2d_backward(layer, din, dout, in, run);
    case GT_LAYER_POOL2D: return gt_pool2d_layer_backward(layer, din, dout, in, run);
    }
    return GT_FAIL(GT_ERR_RUNTIME, "unknown layer kind %d", (int)layer->kind);
}

void gt_layer_free_children(gt_layer *layer) {
    for (size_t i = 0; i < layer->num_children; i++)
        gt_layer_free_children(&layer->children[i]);
    free(layer->children);
    layer->children = NULL;
    layer->num_children = 0;
}
