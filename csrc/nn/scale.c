/* Scale: y = x * dt(factor), the factor rounded to the activation dtype first as Hugging Face's
 * Gemma rounds its embedding normaliser (torch.tensor(sqrt(hidden), dtype=x.dtype); here the double
 * is rounded to f32, then to dt); backward dx = dy * dt(factor). Spec: ("scale", factor), factor a
 * finite nonzero double. The kind's whole definition: its row, plan, forward and backward. */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "core/half.h"
#include "nn/kind.h"

/* Scale's own hyper-parameter (in gt_layer.config). */
typedef struct scale_config {
    double factor;  /* the multiplier as given (finite, nonzero) */
} scale_config;
_Static_assert(sizeof(scale_config) <= GT_LAYER_CONFIG_BYTES, "Scale's config fits gt_layer.config");

static double factor_of(const gt_layer *layer) {
    scale_config config;
    memcpy(&config, layer->config, sizeof config);
    return config.factor;
}

static const gt_layer_arg scale_args[] = {
    {"factor", GT_ARG_DOUBLE, GT_ARG_CONFIG(scale_config, factor), -DBL_MAX, DBL_MAX, 0, NULL}};

static gt_status check_scale(gt_layer *layer) {
    if (factor_of(layer) == 0.0)
        return GT_FAIL(GT_ERR_VALUE, "Scale factor must be nonzero");
    return GT_OK;
}

static void describe_scale(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "Scale(%g)", factor_of(layer));
}

/* The factor as the op multiplies by: rounded to f32, then to dt. */
static float factor_in(const gt_layer *layer, gt_dtype dt) {
    float f = (float)factor_of(layer);
    return dt == GT_BF16 ? gt_round_to_bf16(f) : dt == GT_F16 ? gt_round_to_f16(f) : f;
}

/* Elementwise; the factor must stay finite and nonzero in the activation dtype. */
static gt_status plan_scale(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    char name[GT_LAYER_PATH_BYTES + 64];
    gt_layer_describe(name, sizeof name, layer, site->path);
    if (!w->ops->scale)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run this "
                       "model on the CPU", name, w->ops->name);
    GT_TRY(gt_plan_elementwise(w, layer, in, site));
    float f = factor_in(layer, w->dt);
    if (!isfinite(f) || f == 0.0f)
        return GT_FAIL(GT_ERR_VALUE, "model: %s: factor %g becomes %g in %s activations; use a factor "
                       "that %s can hold", name, factor_of(layer), (double)f, gt_dtype_name(w->dt),
                       gt_dtype_name(w->dt));
    return GT_OK;
}

static gt_status scale_forward(gt_layer *layer, const void *in, gt_run *run) {
    return run->backend->ops->scale(run->backend, layer->out.ptr, in, gt_layer_out_numel(layer),
                                    factor_in(layer, run->dt), run->dt);
}

static gt_status scale_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    if (!din)
        return GT_OK;
    return run->backend->ops->scale(run->backend, din, dout, gt_layer_out_numel(layer),
                                    factor_in(layer, run->dt), run->dt);
}

const gt_layer_type gt_layer_type_scale = {
    "scale", "Scale", GT_LAYER_ARGS(scale_args), 0, check_scale, describe_scale, NULL, plan_scale,
    scale_forward, scale_backward};
