/* Bias: y = x + b over the last dim of a (..., C) input, b (C,) f32 initialised to 0. Spec:
 * ("bias", C). The output bias of an LM head whose weight is tied to the token embedding
 * (Hugging Face's BERT/RoBERTa/DistilBERT MLM decoders: tied_linear then bias). Backward:
 * db (+)= the sum of dy over the rows (fixed order), dx = dy. The kind's whole definition. */
#include <stdio.h>

#include "nn/kind.h"

static const gt_layer_arg bias_args[] = {GT_ARG_SIZE_AT("features", GT_ARG_FIELD(in_features))};

static void describe_bias(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "Bias(%lld)", (long long)layer->in_features);
}

/* bias (C,) = 0, PyTorch's zeros(vocab_size) of the MLM heads. */
static gt_status bias_params(gt_layer *layer) {
    gt_layer_param(&layer->bias, 1, &layer->in_features, GT_INIT_CONSTANT, 0.0f);
    return GT_OK;
}

static gt_status plan_bias(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    GT_TRY(gt_plan_check_features(w, in, layer->in_features, layer, site->path));
    return gt_plan_elementwise(w, layer, in, site);
}

static gt_status bias_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t cols = layer->in_features;
    GT_TRY(ops->copy(run->backend, layer->out.ptr, in, gt_tensor_bytes(&layer->out)));
    return ops->bias_add(run->backend, layer->out.ptr, layer->bias.data, gt_layer_out_numel(layer) / cols, cols,
                         run->dt);
}

static gt_status bias_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t cols = layer->in_features;
    if (!layer->bias.frozen)
        GT_TRY(ops->bias_backward(run->backend, layer->bias.grad, dout, gt_layer_out_numel(layer) / cols, cols,
                                  run->dt, gt_layer_accumulates(layer, run)));
    if (!din)
        return GT_OK;
    return ops->copy(run->backend, din, dout, gt_tensor_bytes(&layer->out));
}

const gt_layer_type gt_layer_type_bias = {
    "bias", "Bias", GT_LAYER_ARGS(bias_args), GT_KIND_PARAMS | GT_KIND_FREEZES, NULL, describe_bias, bias_params, plan_bias,
    bias_forward, bias_backward};
