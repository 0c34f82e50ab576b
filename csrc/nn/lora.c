/* LoRA Linear (PEFT's lora.Linear, use_dora=False): a frozen base Linear plus a trained low-rank path,
 *     y = x W^T + b + (dropout(x) A^T) B^T * scaling,
 * W (out, in) and b (out,) the base's (frozen), A (r, in), B (out, r), scaling = lora_alpha / r (or
 * lora_alpha / sqrt(r) with rsLoRA; Python passes the value). Dropout (the model's Philox masks) is on
 * the adapter's input only, as PEFT's lora_dropout. Spec: ("lora", r, scaling, dropout, use_dora,
 * [("linear", in, out, bias), ("linear", in, r, False), ("linear", r, out, False)]): the children are
 * base_layer, lora_A and lora_B (their parameters are laid out in that order, PEFT's state_dict
 * order); this kind runs their math itself, in one forward and one backward:
 *     forward:  y = x W^T (+ b);  xd = dropout(x);  h = xd A^T (r columns);  y += scaling * h B^T
 *     backward: dh = scaling * dy B;  dB (+)= scaling * dy^T h;  dA (+)= dh^T xd;
 *               dx = dy W + dropout_backward(dh A)
 * The base weight and bias are frozen (no gradient buffer: a backward with one refuses), so no
 * weight-gradient GEMM and no bias reduction for them, ever. Buffers: the output (rows, out), h (rows, r) and, with dropout, xd
 * (rows, in), which backward reuses for dh A before its dropout backward.
 *
 * DoRA (use_dora, PEFT's DoraLinearLayer): a fourth child, ("bias", out), holds the magnitude m (out,)
 * (PEFT's lora_magnitude_vector). With u = xd W^T (the base without bias; x W^T without dropout),
 * v = xd A^T B^T, the row norms n = ||W + scaling B A|| (f32 masters, a constant in backward: PEFT
 * detaches weight_norm) and g = m / n:
 *     y = x W^T + b + ((g - 1) u + (g v) scaling)                        (PEFT's result + result_dora)
 *     dm (+)= sum_rows dy (u + v scaling) / n;  dv = scaling g dy;  dB, dA as LoRA's from g dy;
 *     dx = (g dy) W + dh A, or with dropout dy W + dropout_backward(((g - 1) dy) W + dh A).
 * More buffers: u, v (rows, out), the combined weight (out, in) f32 and g, n (out,) f32. The kind's
 * whole definition: its row, plan, forward and backward.
 *
 * QLoRA: the base_layer may be a QLinear ("qlinear", in, out, bias, ...: a frozen NF4/FP4 weight).
 * Then the base's terms run through the child's own kind (nn/qlinear.c), so its tile-by-tile
 * dequantizing GEMMs are reused: forward y = qlinear(x) (written straight into this layer's
 * output, which the adapter path then adds to), backward dx = qlinear's input gradient (+ the
 * adapter's, as above); the child is planned by its kind's plan (its workspace holds the tile) and
 * takes no output buffer of its own. The packed weight never gets a gradient (it has none). DoRA on
 * a quantized base is refused (its norms need the dequantized weight).
 *
 * A half base (a QLinear "bf16" | "f16": the weight in half precision alone, no f32 master) runs LoRA
 * as a quantized base does, and DoRA too, in its own compute dtype: DoRA's GEMMs read the stored
 * weight where a Linear's read its half copy, and its norms widen it (exactly) where they copy the
 * f32 master, so a half base gives the bits of a Linear whose master holds its values. */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "nn/kind.h"

enum { LORA_BASE = 0, LORA_A = 1, LORA_B = 2, LORA_CHILDREN = 3, LORA_MAGNITUDE = 3 };

/* LoRA's own hyper-parameters and buffers (in gt_layer.config). */
typedef struct lora_config {
    int64_t r;      /* rank: rows of A, columns of B (>= 1) */
    double scaling; /* the low-rank path's factor (finite) */
    void *h;        /* (rows, r) dt: xd A^T, kept for dB (planned) */
    void *xd;       /* (rows, in) dt: dropout(x), kept for dA; NULL without dropout (planned) */
    int use_dora;   /* 1: DoRA, with the magnitude child; the buffers below are planned */
    void *u;        /* DoRA: (rows, out) dt: xd W^T */
    void *v;        /* DoRA: (rows, out) dt: xd A^T B^T; g dy in backward */
    float *weight;  /* DoRA: (out, in) f32: W + scaling B A */
    float *scale;   /* DoRA: (out,) f32: g = m / n */
    float *norm;    /* DoRA: (out,) f32: n, the row norms of weight */
} lora_config;
_Static_assert(sizeof(lora_config) <= GT_LAYER_CONFIG_BYTES, "LoRA's config fits gt_layer.config");

static lora_config config_of(const gt_layer *layer) {
    lora_config config;
    memcpy(&config, layer->config, sizeof config);
    return config;
}

static void set_config(gt_layer *layer, const lora_config *config) {
    memcpy(layer->config, config, sizeof *config);
}

static const gt_layer_arg lora_args[] = {
    GT_ARG_SIZE_AT("r", GT_ARG_CONFIG(lora_config, r)),
    {"scaling", GT_ARG_DOUBLE, GT_ARG_CONFIG(lora_config, scaling), -DBL_MAX, DBL_MAX, 0, NULL},
    GT_ARG_PROBABILITY_AT("dropout", GT_ARG_FIELD(p)),
    GT_ARG_FLAG_AT("use_dora", GT_ARG_CONFIG(lora_config, use_dora)),
    {"modules", GT_ARG_LAYERS, 0, 0, 0, 0, NULL}};

/* 1 when the base_layer is a QLinear (a quantized or half weight): its kind runs the base's terms. */
static int quantized_base(const gt_layer *layer) { return layer->children[LORA_BASE].kind == GT_LAYER_QLINEAR; }

/* The base's weight dtype when it is a half base (GT_BF16 or GT_F16), else GT_U8. */
static gt_dtype half_base_dtype(const gt_layer *layer) {
    return quantized_base(layer) ? gt_qlinear_stored_dtype(&layer->children[LORA_BASE]) : GT_U8;
}

/* 1 when `child` is an untied Linear (in, out) with or without a bias as `bias` says (-1: either). */
static int is_linear(const gt_layer *child, int64_t in, int64_t out, int bias) {
    return child->kind == GT_LAYER_LINEAR && !child->tied && child->in_features == in &&
           child->out_features == out && (bias < 0 || child->has_bias == bias);
}

/* The children must be base_layer Linear(in, out), lora_A Linear(in, r) and lora_B Linear(r, out)
 * without biases; the layer takes the base's sizes. */
static gt_status check_lora(gt_layer *layer) {
    lora_config config = config_of(layer);
    if (layer->num_children != LORA_CHILDREN + (config.use_dora ? 1 : 0))
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear takes %d modules (base_layer, lora_A, lora_B%s), got %zu",
                       LORA_CHILDREN + (config.use_dora ? 1 : 0), config.use_dora ? ", lora_magnitude_vector" : "",
                       layer->num_children);
    const gt_layer *base = &layer->children[LORA_BASE];
    if ((base->kind != GT_LAYER_LINEAR && base->kind != GT_LAYER_QLINEAR) || base->tied)
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear's base_layer must be a Linear or a QLinear of its own (not a "
                       "tied one)");
    if (config.use_dora && quantized_base(layer) && half_base_dtype(layer) == GT_U8)
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear: use_dora on a QLinear (quantized) base_layer is not implemented "
                       "(DoRA's norms need the dequantized weight); use LoRA without DoRA on a quantized base");
    int64_t in = base->in_features, out = base->out_features;
    if (!is_linear(&layer->children[LORA_A], in, config.r, 0))
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear's lora_A must be Linear(%lld, %lld, bias=False) for r=%lld",
                       (long long)in, (long long)config.r, (long long)config.r);
    if (!is_linear(&layer->children[LORA_B], config.r, out, 0))
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear's lora_B must be Linear(%lld, %lld, bias=False) for r=%lld",
                       (long long)config.r, (long long)out, (long long)config.r);
    const gt_layer *m = config.use_dora ? &layer->children[LORA_MAGNITUDE] : NULL;
    if (m && (m->kind != GT_LAYER_BIAS || m->tied || m->in_features != out))
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear's lora_magnitude_vector must be a Bias(%lld) of its own",
                       (long long)out);
    if (!isfinite(config.scaling))
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear's scaling must be finite");
    layer->in_features = in;
    layer->out_features = out;
    layer->has_bias = base->has_bias;
    return GT_OK;
}

static void describe_lora(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "LoraLinear(%lld, %lld, r=%lld%s)", (long long)layer->in_features,
             (long long)layer->out_features, (long long)config_of(layer).r, config_of(layer).use_dora ? ", DoRA" : "");
}

/* Takes `bytes` from the layer's region for `what` (checked product count * size). */
static gt_status take(const gt_plan_site *site, size_t count, size_t size, const char *what, void **out) {
    size_t bytes = 0;
    GT_TRY(gt_size_mul(count, size, what, &bytes));
    return gt_plan_take(site->region, bytes, what, out);
}

/* DoRA's buffers: u, v (rows, out) dt, the combined weight (out, in) f32, g and n (out,) f32; the
 * ops on this backend; the f32 GEMM of B A. */
static gt_status plan_dora(gt_plan_walk *w, gt_layer *layer, int64_t rows, const gt_plan_site *site,
                           lora_config *config) {
    char name[GT_LAYER_PATH_BYTES + 64];
    if (!w->ops->dora_norm || !w->ops->dora_combine || !w->ops->col_scale || !w->ops->dora_magnitude_backward)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s (DoRA) has no implementation on the '%s' backend yet; run "
                       "this model on the CPU", gt_layer_describe(name, sizeof name, layer, site->path), w->ops->name);
    size_t n_out = (size_t)layer->out_features, act = gt_dtype_size(w->dt);
    void *weight = NULL, *scale = NULL, *norm = NULL;
    GT_TRY(take(site, (size_t)rows * n_out, act, "DoRA's base output", &config->u));
    GT_TRY(take(site, (size_t)rows * n_out, act, "DoRA's low-rank output", &config->v));
    GT_TRY(take(site, n_out * (size_t)layer->in_features, sizeof(float), "DoRA's combined weight", &weight));
    GT_TRY(take(site, n_out, sizeof(float), "DoRA's scale", &scale));
    GT_TRY(take(site, n_out, sizeof(float), "DoRA's norms", &norm));
    config->weight = weight;
    config->scale = scale;
    config->norm = norm;
    return gt_plan_gemm_workspace(w, 0, 0, layer->out_features, layer->in_features, config->r, GT_F32, 1);
}

/* A QLinear base_layer planned by its kind for `in` as gt_plan_layer would, but with no output
 * buffer of its own (its forward writes this layer's); this layer's output shape is its. */
static gt_status plan_quantized_base(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    gt_layer *base = &layer->children[LORA_BASE];
    char path[GT_LAYER_PATH_BYTES];
    snprintf(path, sizeof path, "%s%sbase_layer", site->path, site->path[0] ? "." : "");
    const gt_plan_site child = {path, site->level, site->inside_checkpoint, site->region};
    base->in_shape = *in;
    base->in_shape.ptr = NULL;
    base->out = layer->out;
    GT_TRY(gt_layer_type_of(base->kind)->plan(w, base, in, &child));
    layer->out.shape[in->ndim - 1] = layer->out_features;
    return GT_OK;
}

/* The output as a Linear's (a QLinear base: as its kind plans it); h (rows, r) and, with dropout,
 * xd (rows, in) from the layer's region; the workspace of the low-rank GEMMs. */
static gt_status plan_lora(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    gt_dtype half = half_base_dtype(layer);
    if (config_of(layer).use_dora && half != GT_U8 && half != w->dt)
        return GT_FAIL(GT_ERR_VALUE, "LoraLinear '%s': DoRA on a %s base_layer computes in %s (its GEMMs read the "
                       "stored weight), not in %s", site->path, gt_dtype_name(half), gt_dtype_name(half),
                       gt_dtype_name(w->dt));
    if (quantized_base(layer))
        GT_TRY(plan_quantized_base(w, layer, in, site));
    else
        GT_TRY(gt_plan_linear(w, layer, in, site));
    lora_config config = config_of(layer);
    int64_t rows = gt_rows_of(in), r = config.r;
    size_t h_bytes = 0, xd_bytes = 0;
    GT_TRY(gt_size_mul((size_t)rows * gt_dtype_size(w->dt), (size_t)r, "LoRA's low-rank activation", &h_bytes));
    GT_TRY(gt_plan_take(site->region, h_bytes, "LoRA's low-rank activation", &config.h));
    config.xd = NULL;
    if (layer->p > 0.0) {
        GT_TRY(gt_size_mul((size_t)rows * gt_dtype_size(w->dt), (size_t)layer->in_features,
                           "LoRA's dropped-out input", &xd_bytes));
        GT_TRY(gt_plan_take(site->region, xd_bytes, "LoRA's dropped-out input", &config.xd));
    }
    if (config.use_dora)
        GT_TRY(plan_dora(w, layer, rows, site, &config));
    set_config(layer, &config);
    int64_t n_in = layer->in_features, n_out = layer->out_features;
    GT_TRY(gt_plan_gemm_workspace(w, 0, 1, rows, r, n_in, w->dt, 0));       /* h = xd A^T */
    GT_TRY(gt_plan_gemm_workspace(w, 0, 1, rows, n_out, r, w->dt, 1));      /* y += s h B^T */
    GT_TRY(gt_plan_gemm_workspace(w, 0, 0, rows, r, n_out, w->dt, 0));      /* dh = s dy B */
    GT_TRY(gt_plan_gemm_workspace(w, 1, 0, n_out, r, rows, GT_F32, 1));     /* dB */
    GT_TRY(gt_plan_gemm_workspace(w, 1, 0, r, n_in, rows, GT_F32, 1));      /* dA */
    return gt_plan_gemm_workspace(w, 0, 0, rows, n_in, r, w->dt, 1);        /* dx (+)= dh A */
}

/* A parameter as the GEMMs read it: the half copy in f16/bf16 mode, else the f32 master. */
static const void *compute_copy(const gt_param *param, const gt_run *run) {
    return run->dt == GT_F32 ? (const void *)param->data : param->lowp;
}

/* C (+)= alpha * op(a) @ op(b) in the run's dtype for a and b. */
static gt_status gemm(const gt_run *run, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c, gt_dtype c_dt,
                      int64_t ldc) {
    gt_gemm_args args = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .alpha = alpha, .a = a,
                         .a_dt = run->dt, .lda = lda, .b = b, .b_dt = run->dt, .ldb = ldb, .beta = beta,
                         .c = c, .c_dt = c_dt, .ldc = ldc, .batch = 1};
    return run->backend->ops->gemm(run->backend, &args);
}

static int dropout_active(const gt_layer *layer, const gt_run *run) { return run->training && layer->p > 0.0; }

/* The Philox key of the adapter's dropout: as a Dropout layer over the (rows, in) input. */
static gt_dropout_key dropout_key(const gt_layer *layer, const gt_run *run) {
    uint64_t numel = (uint64_t)gt_rows_of(&layer->in_shape) * (uint64_t)layer->in_features;
    gt_dropout_key key = {run->seed, layer->dropout_id, run->step, run->micro_offset * numel};
    return key;
}

static gt_status check_base_frozen(const gt_layer *layer);

/* The base weight as DoRA's GEMMs read it: a half base's stored weight (planned in its dtype), else
 * the Linear's compute copy. */
static const void *base_weight(const gt_layer *layer, const gt_run *run) {
    const gt_layer *base = &layer->children[LORA_BASE];
    return half_base_dtype(layer) != GT_U8 ? (const void *)base->frozen : compute_copy(&base->weight, run);
}

/* dst (out, in) f32 = the base weight: the Linear's f32 master, or a half base widened (exactly). */
static gt_status base_weight_f32(const gt_layer *layer, float *dst, const gt_run *run) {
    const gt_layer *base = &layer->children[LORA_BASE];
    int64_t n = layer->out_features * layer->in_features;
    gt_dtype half = half_base_dtype(layer);
    if (half != GT_U8)
        return run->backend->ops->cast(run->backend, dst, GT_F32, base->frozen, half, n);
    return run->backend->ops->copy(run->backend, dst, base->weight.data, (size_t)n * sizeof(float));
}

/* DoRA's forward (the file's comment): u, the output y = x W^T + b, v, g and n, then y's DoRA terms. */
static gt_status dora_forward(gt_layer *layer, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    const gt_layer *base = &layer->children[LORA_BASE];
    const gt_layer *a = &layer->children[LORA_A], *b = &layer->children[LORA_B];
    lora_config config = config_of(layer);
    int64_t rows = gt_rows_of(&layer->in_shape), n_in = layer->in_features, n_out = layer->out_features;
    int64_t r = config.r;
    const void *w = base_weight(layer, run);
    GT_TRY(gemm(run, 0, 1, rows, n_out, n_in, 1.0f, in, n_in, w, n_in, 0.0f, config.u, run->dt, n_out));
    GT_TRY(ops->copy(run->backend, layer->out.ptr, config.u, gt_tensor_bytes(&layer->out)));
    if (base->has_bias)
        GT_TRY(ops->bias_add(run->backend, layer->out.ptr, base->bias.data, rows, n_out, run->dt));
    const void *xd = in;
    if (dropout_active(layer, run)) {
        GT_TRY(ops->dropout_forward(run->backend, config.xd, in, rows * n_in, layer->p, dropout_key(layer, run),
                                    run->dt));
        xd = config.xd;
        GT_TRY(gemm(run, 0, 1, rows, n_out, n_in, 1.0f, xd, n_in, w, n_in, 0.0f, config.u, run->dt, n_out));
    }
    GT_TRY(gemm(run, 0, 1, rows, r, n_in, 1.0f, xd, n_in, compute_copy(&a->weight, run), n_in, 0.0f, config.h,
                run->dt, r));
    GT_TRY(gemm(run, 0, 1, rows, n_out, r, 1.0f, config.h, r, compute_copy(&b->weight, run), r, 0.0f, config.v,
                run->dt, n_out));
    /* n = ||W + scaling B A|| per row, from the f32 masters */
    GT_TRY(base_weight_f32(layer, config.weight, run));
    gt_gemm_args ba = {.trans_a = 0, .trans_b = 0, .m = n_out, .n = n_in, .k = r, .alpha = (float)config.scaling,
                       .a = b->weight.data, .a_dt = GT_F32, .lda = r, .b = a->weight.data, .b_dt = GT_F32,
                       .ldb = n_in, .beta = 1.0f, .c = config.weight, .c_dt = GT_F32, .ldc = n_in, .batch = 1};
    GT_TRY(ops->gemm(run->backend, &ba));
    GT_TRY(ops->dora_norm(run->backend, config.scale, config.norm, config.weight,
                          layer->children[LORA_MAGNITUDE].bias.data, n_out, n_in));
    return ops->dora_combine(run->backend, layer->out.ptr, config.u, config.v, config.scale, (float)config.scaling,
                             rows, n_out, run->dt);
}

/* DoRA's backward (the file's comment); v's buffer takes g dy, h's dh, u's (g - 1) dy and xd's the
 * dropped path's input gradient, each once its forward value is read. */
static gt_status dora_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    lora_config config = config_of(layer);
    gt_layer *a = &layer->children[LORA_A], *b = &layer->children[LORA_B];
    int64_t rows = gt_rows_of(&layer->in_shape), n_in = layer->in_features, n_out = layer->out_features;
    int64_t r = config.r;
    int accumulate = gt_layer_accumulates(layer, run);
    float s = (float)config.scaling, beta = accumulate ? 1.0f : 0.0f;
    GT_TRY(check_base_frozen(layer));
    float *dm = layer->children[LORA_MAGNITUDE].bias.grad;
    if (dm)  /* NULL: a frozen adapter without a gradient buffer */
        GT_TRY(ops->dora_magnitude_backward(run->backend, dm, dout, config.u, config.v, config.norm, s, rows, n_out,
                                            run->dt, accumulate));
    void *gdy = config.v, *dh = config.h;
    GT_TRY(ops->col_scale(run->backend, gdy, dout, config.scale, 0.0f, rows, n_out, run->dt));
    if (b->weight.grad)
        GT_TRY(gemm(run, 1, 0, n_out, r, rows, s, gdy, n_out, config.h, r, beta, b->weight.grad, GT_F32, r));
    GT_TRY(gemm(run, 0, 0, rows, r, n_out, s, gdy, n_out, compute_copy(&b->weight, run), r, 0.0f, dh, run->dt, r));
    int dropped = dropout_active(layer, run);
    if (a->weight.grad)
        GT_TRY(gemm(run, 1, 0, r, n_in, rows, 1.0f, dh, r, dropped ? config.xd : in, n_in, beta, a->weight.grad,
                    GT_F32, n_in));
    if (!din)
        return GT_OK;
    const void *w = base_weight(layer, run), *wa = compute_copy(&a->weight, run);
    if (!dropped) {
        GT_TRY(gemm(run, 0, 0, rows, n_in, n_out, 1.0f, gdy, n_out, w, n_in, 0.0f, din, run->dt, n_in));
        return gemm(run, 0, 0, rows, n_in, r, 1.0f, dh, r, wa, n_in, 1.0f, din, run->dt, n_in);
    }
    GT_TRY(gemm(run, 0, 0, rows, n_in, n_out, 1.0f, dout, n_out, w, n_in, 0.0f, din, run->dt, n_in));
    GT_TRY(ops->col_scale(run->backend, config.u, dout, config.scale, -1.0f, rows, n_out, run->dt));
    GT_TRY(gemm(run, 0, 0, rows, n_in, n_out, 1.0f, config.u, n_out, w, n_in, 0.0f, config.xd, run->dt, n_in));
    GT_TRY(gemm(run, 0, 0, rows, n_in, r, 1.0f, dh, r, wa, n_in, 1.0f, config.xd, run->dt, n_in));
    GT_TRY(ops->dropout_backward(run->backend, config.xd, config.xd, rows * n_in, layer->p,
                                 dropout_key(layer, run), run->dt));
    return ops->add(run->backend, din, din, config.xd, rows * n_in, run->dt);
}

/* y = x W^T (+ b) into the layer's output: the Linear base's GEMM, or the QLinear base's own forward
 * writing there (its output pointer is this layer's, set here: the child has no buffer of its own). */
static gt_status base_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_layer *base = &layer->children[LORA_BASE];
    if (quantized_base(layer)) {
        base->out.ptr = layer->out.ptr;
        return gt_layer_forward(base, in, run);
    }
    int64_t rows = gt_rows_of(&layer->in_shape), n_in = layer->in_features, n_out = layer->out_features;
    GT_TRY(gemm(run, 0, 1, rows, n_out, n_in, 1.0f, in, n_in, compute_copy(&base->weight, run), n_in, 0.0f,
                layer->out.ptr, run->dt, n_out));
    if (!base->has_bias)
        return GT_OK;
    return run->backend->ops->bias_add(run->backend, layer->out.ptr, base->bias.data, rows, n_out, run->dt);
}

/* dx = dy W: the Linear base's GEMM, or the QLinear base's own backward (input gradient only: its
 * weight has no gradient, its bias is frozen). */
static gt_status base_input_gradient(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    gt_layer *base = &layer->children[LORA_BASE];
    if (quantized_base(layer))
        return gt_layer_backward(base, din, dout, in, run);
    int64_t rows = gt_rows_of(&layer->in_shape), n_in = layer->in_features, n_out = layer->out_features;
    return gemm(run, 0, 0, rows, n_in, n_out, 1.0f, dout, n_out, compute_copy(&base->weight, run), n_in, 0.0f, din,
                run->dt, n_in);
}

static gt_status lora_forward(gt_layer *layer, const void *in, gt_run *run) {
    if (config_of(layer).use_dora)
        return dora_forward(layer, in, run);
    const gt_ops *ops = run->backend->ops;
    lora_config config = config_of(layer);
    int64_t rows = gt_rows_of(&layer->in_shape), n_in = layer->in_features, n_out = layer->out_features;
    int64_t r = config.r;
    GT_TRY(base_forward(layer, in, run));
    const void *xd = in;
    if (dropout_active(layer, run)) {
        GT_TRY(ops->dropout_forward(run->backend, config.xd, in, rows * n_in, layer->p, dropout_key(layer, run),
                                    run->dt));
        xd = config.xd;
    }
    GT_TRY(gemm(run, 0, 1, rows, r, n_in, 1.0f, xd, n_in, compute_copy(&layer->children[LORA_A].weight, run), n_in,
                0.0f, config.h, run->dt, r));
    return gemm(run, 0, 1, rows, n_out, r, (float)config.scaling, config.h, r,
                compute_copy(&layer->children[LORA_B].weight, run), r, 1.0f, layer->out.ptr, run->dt, n_out);
}

/* The frozen base has no gradient buffers (gt_model_set_frozen); TrainStep refuses an unfrozen one. */
static gt_status check_base_frozen(const gt_layer *layer) {
    const gt_layer *base = &layer->children[LORA_BASE];
    if (base->weight.grad || base->bias.grad)
        return GT_FAIL(GT_ERR_VALUE, "a LoRA layer's base Linear is frozen: set requires_grad=False on its weight "
                       "and bias");
    return GT_OK;
}

/* dB (+)= s dy^T h; dh = s dy B (into h's buffer, read by then); dA (+)= dh^T xd;
 * dx = dy W + dropout_backward(dh A) (dh A into xd's buffer, read by then). */
static gt_status lora_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    if (config_of(layer).use_dora)
        return dora_backward(layer, din, dout, in, run);
    const gt_ops *ops = run->backend->ops;
    lora_config config = config_of(layer);
    gt_layer *a = &layer->children[LORA_A], *b = &layer->children[LORA_B];
    int64_t rows = gt_rows_of(&layer->in_shape), n_in = layer->in_features, n_out = layer->out_features;
    int64_t r = config.r;
    float s = (float)config.scaling, beta = gt_layer_accumulates(layer, run) ? 1.0f : 0.0f;
    GT_TRY(check_base_frozen(layer));
    if (b->weight.grad)  /* NULL: a frozen adapter without a gradient buffer */
        GT_TRY(gemm(run, 1, 0, n_out, r, rows, s, dout, n_out, config.h, r, beta, b->weight.grad, GT_F32, r));
    void *dh = config.h;  /* h is read: its buffer holds dh from here on */
    GT_TRY(gemm(run, 0, 0, rows, r, n_out, s, dout, n_out, compute_copy(&b->weight, run), r, 0.0f, dh, run->dt, r));
    int dropped = dropout_active(layer, run);
    const void *xd = dropped ? config.xd : in;
    if (a->weight.grad)
        GT_TRY(gemm(run, 1, 0, r, n_in, rows, 1.0f, dh, r, xd, n_in, beta, a->weight.grad, GT_F32, n_in));
    if (!din)
        return GT_OK;
    GT_TRY(base_input_gradient(layer, din, dout, in, run));
    if (!dropped)
        return gemm(run, 0, 0, rows, n_in, r, 1.0f, dh, r, compute_copy(&a->weight, run), n_in, 1.0f, din,
                    run->dt, n_in);
    /* xd is read: its buffer takes dh A, then its dropout backward, then din adds it */
    GT_TRY(gemm(run, 0, 0, rows, n_in, r, 1.0f, dh, r, compute_copy(&a->weight, run), n_in, 0.0f, config.xd,
                run->dt, n_in));
    GT_TRY(ops->dropout_backward(run->backend, config.xd, config.xd, rows * n_in, layer->p,
                                 dropout_key(layer, run), run->dt));
    return ops->add(run->backend, din, din, config.xd, rows * n_in, run->dt);
}

const gt_layer_type gt_layer_type_lora = {
    "lora", "LoraLinear", GT_LAYER_ARGS(lora_args), GT_KIND_DROPOUT_ID, check_lora, describe_lora, NULL,
    plan_lora, lora_forward, lora_backward};
