/* Gated activation: (..., 2 I) laid out [gate | up] -> (..., I) = act(gate) * up, the gated MLP of
 * Llama (SwiGLU: "silu") and Gemma (GeGLU: "gelu_tanh"), with the glu op (ops.h glu_forward and
 * glu_backward: PyTorch's eager roundings). Spec: ("glu", activation), the names of the
 * activation kind. Python's class is GatedActivation: torch.nn.GLU is another function
 * (a * sigmoid(b) of the halves). The kind's whole definition: its row, plan, forward and backward. */
#include <stdio.h>

#include "nn/kind.h"

static const gt_enum_name glu_activation_names[] = {
    {"relu", GT_ACT_RELU}, {"gelu", GT_ACT_GELU_ERF}, {"gelu_tanh", GT_ACT_GELU_TANH},
    {"tanh", GT_ACT_TANH}, {"silu", GT_ACT_SILU}, {NULL, 0}};
static const gt_layer_arg glu_args[] = {
    {"activation", GT_ARG_ENUM, GT_ARG_FIELD(activation), 0, 0, 0, glu_activation_names}};

static void describe_glu(const gt_layer *layer, char *buf, size_t bytes) {
    const char *name = "?";
    for (const gt_enum_name *e = glu_activation_names; e->name; e++)
        if (e->value == (int)layer->activation)
            name = e->name;
    snprintf(buf, bytes, "GatedActivation('%s')", name);
}

/* The input's last dimension 2 I must be even; the output's is I. */
static gt_status plan_glu(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    char name[GT_LAYER_PATH_BYTES + 64];
    gt_layer_describe(name, sizeof name, layer, site->path);
    if (!w->ops->glu_forward || !w->ops->glu_backward)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run this "
                       "model on the CPU", name, w->ops->name);
    GT_TRY(gt_plan_elementwise(w, layer, in, site));
    int64_t width = in->ndim ? in->shape[in->ndim - 1] : 0;
    if (in->ndim < 1 || width < 2 || width % 2)
        return GT_FAIL(GT_ERR_VALUE, "%s: %s takes (..., 2 * intermediate) inputs laid out [gate | up], but "
                       "gets a last dimension of %lld; it must be even and at least 2",
                       in == w->input ? w->input_name : "model", name, (long long)width);
    layer->out.shape[in->ndim - 1] = width / 2;
    return GT_OK;
}

static gt_status glu_forward(gt_layer *layer, const void *in, gt_run *run) {
    int64_t inter = layer->out.shape[layer->out.ndim - 1];
    return run->backend->ops->glu_forward(run->backend, layer->out.ptr, in, gt_rows_of(&layer->out), inter,
                                          layer->activation, run->dt);
}

static gt_status glu_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    int64_t inter = layer->out.shape[layer->out.ndim - 1];
    return run->backend->ops->glu_backward(run->backend, din, dout, in, gt_rows_of(&layer->out), inter,
                                           layer->activation, run->dt);
}

const gt_layer_type gt_layer_type_glu = {
    "glu", "GatedActivation", GT_LAYER_ARGS(glu_args), 0, NULL, describe_glu, NULL, plan_glu, glu_forward,
    glu_backward};
