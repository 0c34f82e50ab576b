/* Forward/backward through the kind's row (nn/kind.h), and the parameter-free elementwise
 * layers (activation, dropout, flatten). */
#include "nn/layer.h"

#include "nn/kind.h"

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

gt_status gt_dropout_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t n = gt_layer_out_numel(layer);
    if (!dropout_active(layer, run))
        return ops->copy(run->backend, layer->out.ptr, in, gt_tensor_bytes(&layer->out));
    return ops->dropout_forward(run->backend, layer->out.ptr, in, n, layer->p,
                                dropout_key(layer, run), run->dt);
}

gt_status gt_dropout_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                              gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t n = gt_layer_out_numel(layer);
    if (!din)
        return GT_OK;
    if (!dropout_active(layer, run))
        return ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out));
    return ops->dropout_backward(run->backend, din, dout, n, layer->p, dropout_key(layer, run),
                                 run->dt);
}

gt_status gt_activation_forward(gt_layer *layer, const void *in, gt_run *run) {
    return run->backend->ops->activation_forward(run->backend, layer->out.ptr, in,
                                                 gt_layer_out_numel(layer), layer->activation, run->dt);
}

gt_status gt_activation_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                 gt_run *run) {
    if (!din)
        return GT_OK;
    return run->backend->ops->activation_backward(run->backend, din, dout, in, gt_layer_out_numel(layer),
                                                  layer->activation, run->dt);
}

/* Flatten's output is a view of its input; its gradient is dout itself. */
gt_status gt_flatten_forward(gt_layer *layer, const void *in, gt_run *run) {
    layer->out.ptr = (void *)in;
    return GT_OK;
}

gt_status gt_flatten_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                              gt_run *run) {
    return din ? run->backend->ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out)) : GT_OK;
}

gt_status gt_layer_forward(gt_layer *layer, const void *in, gt_run *run) {
    return gt_layer_type_of(layer->kind)->forward(layer, in, run);
}

gt_status gt_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                            gt_run *run) {
    return gt_layer_type_of(layer->kind)->backward(layer, din, dout, in, run);
}

void gt_layer_free_children(gt_layer *layer) {
    for (size_t i = 0; i < layer->num_children; i++)
        gt_layer_free_children(&layer->children[i]);
    free(layer->children);
    layer->children = NULL;
    layer->num_children = 0;
}
