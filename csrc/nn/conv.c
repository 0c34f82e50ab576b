/* Conv2d: the convolution op (ops.h, gt_conv2d_args) over (N, C, H, W) activations with a
 * weight (out, in / groups, kh, kw) and an optional bias (out,), PyTorch's nn.Conv2d. As Linear,
 * the op reads the half copy of the weight in f16/bf16 mode and writes f32 gradients. */
#include "nn/layer.h"

gt_conv2d_args gt_conv2d_layer_args(const gt_layer *layer, const gt_tensor *in) {
    gt_conv2d_args a = {
        .batch = in->shape[0], .in_channels = layer->in_features, .height = in->shape[2],
        .width = in->shape[3], .out_channels = layer->out_features, .groups = layer->groups,
        .kernel_h = layer->kernel[0], .kernel_w = layer->kernel[1],
        .stride_h = layer->stride[0], .stride_w = layer->stride[1],
        .pad_h = layer->padding[0], .pad_w = layer->padding[1],
        .dilation_h = layer->dilation[0], .dilation_w = layer->dilation[1], .dt = in->dtype,
    };
    return a;
}

/* The op's arguments of one call: the planned sizes, the input, and the weight in run->dt. */
static gt_conv2d_args run_args(const gt_layer *layer, const void *in, const gt_run *run) {
    gt_conv2d_args a = gt_conv2d_layer_args(layer, &layer->in_shape);
    a.dt = run->dt;
    a.x = in;
    a.weight = run->dt == GT_F32 ? (const void *)layer->weight.data : layer->weight.lowp;
    return a;
}

gt_status gt_conv2d_layer_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_conv2d_args a = run_args(layer, in, run);
    a.bias = layer->has_bias ? layer->bias.data : NULL;
    a.out = layer->out.ptr;
    return run->backend->ops->conv2d_forward(run->backend, &a);
}

gt_status gt_conv2d_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                   gt_run *run) {
    gt_conv2d_args a = run_args(layer, in, run);
    a.dout = dout;
    a.dx = din;
    a.dweight = layer->weight.grad;
    a.dbias = layer->has_bias ? layer->bias.grad : NULL;
    a.accumulate = gt_layer_accumulates(layer, run);
    return run->backend->ops->conv2d_backward(run->backend, &a);
}
