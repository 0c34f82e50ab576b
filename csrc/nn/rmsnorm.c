/* RMSNorm over the last dimension, PyTorch's nn.RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight
 * (statistics in f32 or wider, ops/rmsnorm_hd.h), weight (C,) = 1 with elementwise_affine.
 * Spec: ("rmsnorm", normalized_shape, eps, elementwise_affine, plus_one, groups). plus_one: the
 * weight is used as f32(1 + weight) and starts at 0 (Gemma's RMSNorm and its Hugging Face init).
 * groups G: the input's last dim is G * C, each chunk of C normalised on its own with the same (C,)
 * weight (QK-norm over the head_dim of (B, T, H * D)): the op sees (rows * G, C). The kind's
 * whole definition: its row, plan, forward and backward. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "nn/kind.h"

/* RMSNorm's own hyper-parameters (in gt_layer.config); the size and eps are gt_layer fields. */
typedef struct rmsnorm_config {
    int affine;      /* 1: a (C,) weight multiplies the output (elementwise_affine) */
    int plus_one;    /* 1: the weight is used as 1 + weight, and starts at 0 (Gemma) */
    int64_t groups;  /* G >= 1: chunks of C in the input's last dim (G * C) */
} rmsnorm_config;
_Static_assert(sizeof(rmsnorm_config) <= GT_LAYER_CONFIG_BYTES, "RMSNorm's config fits gt_layer.config");

static rmsnorm_config config_of(const gt_layer *layer) {
    rmsnorm_config config;
    memcpy(&config, layer->config, sizeof config);
    return config;
}

static const gt_layer_arg rmsnorm_args[] = {
    GT_ARG_SIZE_AT("normalized_shape", GT_ARG_FIELD(in_features)), GT_ARG_EPS_AT("eps", GT_ARG_FIELD(eps)),
    GT_ARG_FLAG_AT("elementwise_affine", GT_ARG_CONFIG(rmsnorm_config, affine)),
    GT_ARG_FLAG_AT("plus_one", GT_ARG_CONFIG(rmsnorm_config, plus_one)),
    GT_ARG_SIZE_AT("groups", GT_ARG_CONFIG(rmsnorm_config, groups))};

/* The input's last dim, G * C, must be an int64. */
static gt_status check_rmsnorm(gt_layer *layer) {
    rmsnorm_config config = config_of(layer);
    if (config.groups > INT64_MAX / layer->in_features)
        return GT_FAIL(GT_ERR_VALUE, "RMSNorm groups * normalized_shape must fit an int64, got %lld * %lld",
                       (long long)config.groups, (long long)layer->in_features);
    return GT_OK;
}

static void describe_rmsnorm(const gt_layer *layer, char *buf, size_t bytes) {
    rmsnorm_config config = config_of(layer);
    if (config.groups > 1)
        snprintf(buf, bytes, "RMSNorm(%lld, groups=%lld)", (long long)layer->in_features, (long long)config.groups);
    else
        snprintf(buf, bytes, "RMSNorm(%lld)", (long long)layer->in_features);
}

/* weight (C,) with elementwise_affine: 1, or 0 with plus_one (used as 1 + 0). */
static gt_status rmsnorm_params(gt_layer *layer) {
    rmsnorm_config config = config_of(layer);
    if (config.affine)
        gt_layer_param(&layer->weight, 1, &layer->in_features, GT_INIT_CONSTANT, config.plus_one ? 0.0f : 1.0f);
    return GT_OK;
}

/* Rows the op normalises: the input's rows times the groups. */
static int64_t op_rows(const gt_layer *layer) { return gt_rows_of(&layer->in_shape) * config_of(layer).groups; }

/* The input's last dimension (G * C) is normalised in G chunks; the (rows * G,) f32 rstd is kept
 * for backward. */
static gt_status plan_rmsnorm(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    if (!w->ops->rmsnorm_forward || !w->ops->rmsnorm_backward) {
        char name[GT_LAYER_PATH_BYTES + 64];
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run "
                       "this model on the CPU", gt_layer_describe(name, sizeof name, layer, site->path),
                       w->ops->name);
    }
    int64_t groups = config_of(layer).groups;
    GT_TRY(gt_plan_check_features(w, in, groups * layer->in_features, layer, site->path));
    const char *what = "RMSNorm statistics";
    size_t bytes = 0;
    void *rstd = NULL;
    GT_TRY(gt_size_mul((size_t)gt_rows_of(in), (size_t)groups, what, &bytes));
    GT_TRY(gt_size_mul(bytes, sizeof(float), what, &bytes));
    GT_TRY(gt_plan_take(site->region, bytes, what, &rstd));
    layer->rstd = rstd;
    return GT_OK;
}

static gt_status rmsnorm_forward(gt_layer *layer, const void *in, gt_run *run) {
    rmsnorm_config config = config_of(layer);
    const float *weight = config.affine ? layer->weight.data : NULL;
    return run->backend->ops->rmsnorm_forward(run->backend, layer->out.ptr, layer->rstd, in, weight,
                                              config.plus_one, op_rows(layer), layer->in_features, layer->eps,
                                              run->dt);
}

static gt_status rmsnorm_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    rmsnorm_config config = config_of(layer);
    int affine = config.affine;
    return run->backend->ops->rmsnorm_backward(
        run->backend, din, affine && !layer->weight.frozen ? layer->weight.grad : NULL, dout, in,
        affine ? layer->weight.data : NULL,
        config.plus_one, layer->rstd, op_rows(layer), layer->in_features, run->dt, gt_layer_accumulates(layer, run));
}

const gt_layer_type gt_layer_type_rmsnorm = {
    "rmsnorm", "RMSNorm", GT_LAYER_ARGS(rmsnorm_args), GT_KIND_PARAMS | GT_KIND_FREEZES, check_rmsnorm,
    describe_rmsnorm, rmsnorm_params, plan_rmsnorm, rmsnorm_forward, rmsnorm_backward};
