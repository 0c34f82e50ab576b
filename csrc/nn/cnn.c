/* The NCHW layers around convolutions: BatchNorm2d and 2-D pooling, thin layers over their ops.
 *
 * BatchNorm2d's running statistics are buffers: they live in the model's buffer arena (planned,
 * not optimised, no gradient) and change only in the forward of a training micro-batch, once
 * per micro-batch as in PyTorch with gradient accumulation. A checkpointed block re-running its
 * forward in backward (run->recompute) normalises with the same batch statistics but does not
 * fold them in a second time. */
#include "nn/layer.h"

/* 1 when the layer normalises with the batch's statistics (training, or no running ones). */
static int uses_batch_stats(const gt_layer *layer, int training) {
    return training || !layer->track_running_stats;
}

static gt_batchnorm_args batchnorm_args(const gt_layer *layer, const void *in, const gt_run *run) {
    const gt_tensor *s = &layer->in_shape;
    gt_batchnorm_args a = {
        .n = s->shape[0], .c = s->shape[1], .hw = s->shape[2] * s->shape[3], .in = in,
        .out = layer->out.ptr, .weight = layer->has_bias ? layer->weight.data : NULL,
        .bias = layer->has_bias ? layer->bias.data : NULL, .mean = layer->mean, .rstd = layer->rstd,
        .running_mean = layer->running_mean, .running_var = layer->running_var,
        .num_batches_tracked = layer->num_batches_tracked, .eps = layer->eps,
        .momentum = layer->momentum, .batch_stats = uses_batch_stats(layer, run->training), .dt = run->dt,
    };
    return a;
}

gt_status gt_batchnorm2d_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_batchnorm_args a = batchnorm_args(layer, in, run);
    a.update_running = run->training && layer->track_running_stats && !run->recompute;
    return run->backend->ops->batchnorm_forward(run->backend, &a);
}

gt_status gt_batchnorm2d_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                  gt_run *run) {
    if (!din && !layer->has_bias)
        return GT_OK;
    gt_batchnorm_args a = batchnorm_args(layer, in, run);
    a.out = NULL;
    a.dout = dout;
    a.din = din;
    a.dweight = layer->has_bias ? layer->weight.grad : NULL;
    a.dbias = layer->has_bias ? layer->bias.grad : NULL;
    a.accumulate = gt_layer_accumulates(layer, run);
    return run->backend->ops->batchnorm_backward(run->backend, &a);
}

gt_status gt_batchnorm2d_check_tree(const gt_layer *layer, int training) {
    for (size_t i = 0; i < layer->num_children; i++)
        GT_TRY(gt_batchnorm2d_check_tree(&layer->children[i], training));
    if (layer->kind != GT_LAYER_BATCHNORM2D || !uses_batch_stats(layer, training))
        return GT_OK;
    const int64_t *s = layer->in_shape.shape;
    if (s[0] * s[2] * s[3] != 1)
        return GT_OK;
    return GT_FAIL(GT_ERR_VALUE, "x: BatchNorm2d(%lld) expected more than 1 value per channel when "
                   "training, got input of size (%lld, %lld, %lld, %lld); use a batch of 2 or more, or "
                   "eval()", (long long)layer->in_features, (long long)s[0], (long long)s[1],
                   (long long)s[2], (long long)s[3]);
}

/* The pooling op's arguments for the planned shapes and this run's pointers. */
static gt_pool2d_args pool_args(const gt_layer *layer, const void *in, const gt_run *run) {
    gt_pool2d_args a = layer->pool2d;
    a.in = in;
    a.out = layer->out.ptr;
    a.dt = run->dt;
    return a;
}

gt_status gt_pool2d_layer_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_pool2d_args a = pool_args(layer, in, run);
    return run->backend->ops->pool2d_forward(run->backend, &a);
}

gt_status gt_pool2d_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                   gt_run *run) {
    if (!din)
        return GT_OK;
    gt_pool2d_args a = pool_args(layer, in, run);
    a.out = NULL;
    a.dout = dout;
    a.din = din;
    return run->backend->ops->pool2d_backward(run->backend, &a);
}
