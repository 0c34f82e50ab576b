/* RMSNorm over the last dimension, PyTorch's nn.RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight
 * (statistics in f32 or wider, ops/rmsnorm_hd.h), weight (C,) = 1 with elementwise_affine.
 * Spec: ("rmsnorm", normalized_shape, eps, elementwise_affine). The kind's whole definition: its
 * row, plan, forward and backward. */
#include <stdio.h>
#include <string.h>

#include "nn/kind.h"

/* RMSNorm's own hyper-parameters (in gt_layer.config); the size and eps are gt_layer fields. */
typedef struct rmsnorm_config {
    int affine;  /* 1: a (C,) weight multiplies the output (elementwise_affine) */
} rmsnorm_config;
_Static_assert(sizeof(rmsnorm_config) <= GT_LAYER_CONFIG_BYTES, "RMSNorm's config fits gt_layer.config");

static rmsnorm_config config_of(const gt_layer *layer) {
    rmsnorm_config config;
    memcpy(&config, layer->config, sizeof config);
    return config;
}

static const gt_layer_arg rmsnorm_args[] = {
    GT_ARG_SIZE_AT("normalized_shape", GT_ARG_FIELD(in_features)), GT_ARG_EPS_AT("eps", GT_ARG_FIELD(eps)),
    GT_ARG_FLAG_AT("elementwise_affine", GT_ARG_CONFIG(rmsnorm_config, affine))};

static void describe_rmsnorm(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "RMSNorm(%lld)", (long long)layer->in_features);
}

/* weight (C,) = 1 with elementwise_affine. */
static gt_status rmsnorm_params(gt_layer *layer) {
    if (config_of(layer).affine)
        gt_layer_param(&layer->weight, 1, &layer->in_features, GT_INIT_CONSTANT, 1.0f);
    return GT_OK;
}

/* The input's last dimension is normalised; the (rows,) f32 rstd is kept for backward. */
static gt_status plan_rmsnorm(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    if (!w->ops->rmsnorm_forward || !w->ops->rmsnorm_backward) {
        char name[GT_LAYER_PATH_BYTES + 64];
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run "
                       "this model on the CPU", gt_layer_describe(name, sizeof name, layer, site->path),
                       w->ops->name);
    }
    GT_TRY(gt_plan_check_features(w, in, layer->in_features, layer, site->path));
    const char *what = "RMSNorm statistics";
    size_t bytes = 0;
    void *rstd = NULL;
    GT_TRY(gt_size_mul((size_t)gt_rows_of(in), sizeof(float), what, &bytes));
    GT_TRY(gt_plan_take(site->region, bytes, what, &rstd));
    layer->rstd = rstd;
    return GT_OK;
}

static gt_status rmsnorm_forward(gt_layer *layer, const void *in, gt_run *run) {
    const float *weight = config_of(layer).affine ? layer->weight.data : NULL;
    return run->backend->ops->rmsnorm_forward(run->backend, layer->out.ptr, layer->rstd, in, weight,
                                              gt_rows_of(&layer->in_shape), layer->in_features, layer->eps,
                                              run->dt);
}

static gt_status rmsnorm_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    int affine = config_of(layer).affine;
    return run->backend->ops->rmsnorm_backward(
        run->backend, din, affine ? layer->weight.grad : NULL, dout, in, affine ? layer->weight.data : NULL,
        layer->rstd, gt_rows_of(&layer->in_shape), layer->in_features, run->dt, gt_layer_accumulates(layer, run));
}

const gt_layer_type gt_layer_type_rmsnorm = {
    "rmsnorm", "RMSNorm", GT_LAYER_ARGS(rmsnorm_args), GT_KIND_PARAMS, NULL,
    describe_rmsnorm, rmsnorm_params, plan_rmsnorm, rmsnorm_forward, rmsnorm_backward};
