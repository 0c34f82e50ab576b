/* Sequential and Residual: the layers that hold layers.
 * Sequential backward ping-pongs its gradients between the two scratch buffers of its nesting
 * level; a Residual's block runs one level deeper, so the Residual's incoming gradient (held
 * by the level above) survives the block's backward. */
#include "nn/layer.h"

#include "core/copy_stream.h"

/* Offloaded checkpoints (nn/plan.c): a unit whose output is offloaded writes it into a slot that
 * the unit two before it in its run used; the copy of that one's output to the host must be done
 * first (the compute stream waits for the queued copies). */
static gt_status claim_slot(const gt_layer *unit, gt_run *run) {
    return unit->offload_host ? gt_copy_stream_before_compute(run->copies) : GT_OK;
}

/* ...and once written, the slot is copied to the unit's host copy behind the compute that wrote it. */
static gt_status offload_output(const gt_layer *unit, gt_run *run) {
    if (!unit->offload_host)
        return GT_OK;
    GT_TRY(gt_copy_stream_after_compute(run->copies));
    return gt_copy_stream_d2h(run->copies, unit->offload_host, unit->out.ptr, gt_tensor_bytes(&unit->out));
}

/* In backward, once child `done` of a Sequential no longer needs its input (the output of child
 * done - 1), that slot is free: the output of child done - 3, which took the same slot in forward,
 * is copied back into it for the backward of child done - 2 (which waits for it: wait_for_input).
 * It is queued after the wait of child done - 1 for its own input, so that the copy runs beside
 * that child's backward. The run's last two slots still hold their forward outputs. */
static gt_status prefetch_input(const gt_layer *seq, size_t done, size_t first, gt_run *run) {
    if (done < 3 || done - 2 < first)
        return GT_OK;
    const gt_layer *freed = &seq->children[done - 1], *back = &seq->children[done - 3];
    if (!freed->offload_host || !back->offload_host || freed->out.ptr != back->out.ptr)
        return GT_OK;
    GT_TRY(gt_copy_stream_after_compute(run->copies));
    return gt_copy_stream_h2d(run->copies, back->out.ptr, back->offload_host, gt_tensor_bytes(&back->out));
}

/* Before child i's backward: its input, when an offloaded output, must be back in its slot. */
static gt_status wait_for_input(const gt_layer *seq, size_t i, gt_run *run) {
    return i > 0 && seq->children[i - 1].offload_host ? gt_copy_stream_before_compute(run->copies) : GT_OK;
}

gt_status gt_sequential_forward(gt_layer *layer, const void *in, gt_run *run) {
    const void *cur = in;
    for (size_t i = 0; i < layer->num_children; i++) {
        GT_TRY(gt_layer_forward(&layer->children[i], cur, run));
        cur = layer->children[i].out.ptr;
    }
    layer->out.ptr = (void *)cur;
    return GT_OK;
}

int gt_layer_trains(const gt_layer *layer) {
    if ((layer->weight.numel && !layer->weight.frozen) || (layer->bias.numel && !layer->bias.frozen))
        return 1;
    for (size_t i = 0; i < layer->num_children; i++)
        if (gt_layer_trains(&layer->children[i]))
            return 1;
    return 0;
}

size_t gt_first_trained_child(const gt_layer *layer, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (gt_layer_trains(&layer->children[i]))
            return i;
    return n;
}

/* Without an input gradient wanted (din NULL), the children before the first one that trains
 * need no backward (nothing before them has a gradient), and that one no input gradient. */
gt_status gt_sequential_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                 gt_run *run) {
    size_t n = layer->num_children;
    if (n == 0)
        return din ? run->backend->ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out))
                   : GT_OK;
    int level = layer->children[0].level;
    size_t first = din ? 0 : gt_first_trained_child(layer, n);
    const void *cur = dout;
    int next = 0;
    for (size_t i = n; i-- > 0;) {
        gt_layer *child = &layer->children[i];
        if (i < first) {  /* skipped: still tell the hook (no gradient changes below) */
            if (layer == run->hooked && i > 0)
                GT_TRY(run->child_done(run, i));
            continue;
        }
        const void *child_in = i > 0 ? layer->children[i - 1].out.ptr : in;
        void *target = i > first ? run->scratch[level][next] : din;  /* i == first > 0: din is NULL */
        GT_TRY(wait_for_input(layer, i, run));
        if (i + 1 < n)
            GT_TRY(prefetch_input(layer, i + 1, first, run));
        GT_TRY(gt_layer_backward(child, target, cur, child_in, run));
        if (layer == run->hooked && i > 0)  /* after the first layer the backward is over */
            GT_TRY(run->child_done(run, i));
        cur = target;
        next ^= 1;
    }
    return GT_OK;
}

/* The block's forward again, as the first run did (same inputs and dropout keys, same bits), when
 * it was checkpointed: its activations were in the shared recompute region. */
static gt_status recompute_block(gt_layer *layer, const void *in, gt_run *run) {
    if (!layer->checkpointed)
        return GT_OK;
    run->recompute = 1;  /* the running statistics were updated by the first run */
    gt_status status = gt_sequential_forward(&layer->children[0], in, run);
    run->recompute = 0;
    return status;
}

/* Checkpointed, the block's output (in the recompute region) is copied into the unit's own buffer. */
gt_status gt_checkpoint_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_layer *block = &layer->children[0];
    GT_TRY(gt_sequential_forward(block, in, run));
    if (!layer->checkpointed)
        return GT_OK;
    GT_TRY(claim_slot(layer, run));
    GT_TRY(run->backend->ops->copy(run->backend, layer->out.ptr, block->out.ptr, gt_tensor_bytes(&layer->out)));
    return offload_output(layer, run);
}

gt_status gt_checkpoint_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    GT_TRY(recompute_block(layer, in, run));
    return gt_sequential_backward(&layer->children[0], din, dout, in, run);
}

gt_status gt_residual_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_layer *block = &layer->children[0];
    GT_TRY(gt_sequential_forward(block, in, run));
    GT_TRY(claim_slot(layer, run));
    GT_TRY(run->backend->ops->add(run->backend, layer->out.ptr, in, block->out.ptr,
                                  gt_layer_out_numel(layer), run->dt));
    return offload_output(layer, run);
}

gt_status gt_residual_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                               gt_run *run) {
    gt_layer *block = &layer->children[0];
    GT_TRY(recompute_block(layer, in, run));
    GT_TRY(gt_sequential_backward(block, din, dout, in, run));
    if (!din)
        return GT_OK;
    return run->backend->ops->add(run->backend, din, din, dout, gt_layer_out_numel(layer), run->dt);
}
