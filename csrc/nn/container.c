/* Sequential and Residual: the layers that hold layers.
 * Sequential backward ping-pongs its gradients between the two scratch buffers of its nesting
 * level; a Residual's block runs one level deeper, so the Residual's incoming gradient (held
 * by the level above) survives the block's backward. */
#include "nn/layer.h"

gt_status gt_sequential_forward(gt_layer *layer, const void *in, gt_run *run) {
    const void *cur = in;
    for (size_t i = 0; i < layer->num_children; i++) {
        GT_TRY(gt_layer_forward(&layer->children[i], cur, run));
        cur = layer->children[i].out.ptr;
    }
    layer->out.ptr = (void *)cur;
    return GT_OK;
}

gt_status gt_sequential_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                 gt_run *run) {
    size_t n = layer->num_children;
    if (n == 0)
        return din ? run->backend->ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out))
                   : GT_OK;
    int level = layer->children[0].level;
    const void *cur = dout;
    int next = 0;
    for (size_t i = n; i-- > 0;) {
        gt_layer *child = &layer->children[i];
        const void *child_in = i > 0 ? layer->children[i - 1].out.ptr : in;
        void *target = i > 0 ? run->scratch[level][next] : din;
        GT_TRY(gt_layer_backward(child, target, cur, child_in, run));
        if (layer == run->hooked && i > 0)  /* after the first layer the backward is over */
            GT_TRY(run->child_done(run, i));
        cur = target;
        next ^= 1;
    }
    return GT_OK;
}

gt_status gt_residual_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_layer *block = &layer->children[0];
    GT_TRY(gt_sequential_forward(block, in, run));
    return run->backend->ops->add(run->backend, layer->out.ptr, in, block->out.ptr,
                                  gt_layer_out_numel(layer), run->dt);
}

gt_status gt_residual_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                               gt_run *run) {
    gt_layer *block = &layer->children[0];
    if (layer->checkpointed) {  /* re-run the block: same inputs and dropout keys, same bits */
        run->recompute = 1;     /* the running statistics were updated by the first run */
        gt_status status = gt_sequential_forward(block, in, run);
        run->recompute = 0;
        GT_TRY(status);
    }
    GT_TRY(gt_sequential_backward(block, din, dout, in, run));
    if (!din)
        return GT_OK;
    return run->backend->ops->add(run->backend, din, din, dout, gt_layer_out_numel(layer), run->dt);
}
