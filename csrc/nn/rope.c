/* Rope: the rotary position embedding of a decoder's fused projection, Hugging Face's
 * apply_rotary_pos_emb on q and k (modeling_llama.py). Spec: ("rope", H, K, D, rope_type, theta,
 * factor, low_freq_factor, high_freq_factor, original_max_position_embeddings, attention_factor,
 * beta_fast, beta_slow, truncate). The input and output are (B, T, (H + 2K) D), each row laid out
 * [q heads | k heads | v heads] of D each: the H + K q and k heads rotate (ops.h: rope, the whole
 * head, rotate_half layout) at the positions of run->positions (the Tokens layer's position ids;
 * NULL: 0..T-1), cos and sin times attention_factor (yarn's attention scaling, 1 otherwise); v
 * passes through. Backward: the transpose rotation of dq, dk; dv passes through.
 *
 * inv_freq ((D / 2,) f32, gt_rope_inv_freq: "default", "linear", "llama3", "yarn" as transformers
 * computes them) is no parameter and no buffer: it is never in state_dict and never trained. It is
 * a constant of the plan: the plan computes it on the host and copies it into the main activation
 * region (device memory on cuda/sim, where the op reads it) each time it places the layer, so it
 * is counted by the memory plan and survives checkpointing's shared recompute region. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/kind.h"
#include "ops/rope.h"

/* Rope's hyper-parameters (in gt_layer.config). */
typedef struct rope_config {
    int64_t heads;           /* H query heads */
    int64_t kv_heads;        /* K key (and value) heads */
    int64_t head_dim;        /* D, even: every element of a q or k head rotates */
    int rope_type;           /* a gt_rope_type */
    int truncate;            /* yarn: 1 rounds the ramp's ends to integers */
    double theta;            /* rope_theta */
    double factor;           /* linear, llama3, yarn */
    double low_freq_factor;  /* llama3 */
    double high_freq_factor; /* llama3 */
    double original_max_position_embeddings; /* llama3, yarn */
    double beta_fast;        /* yarn */
    double beta_slow;        /* yarn */
    float attention_factor;  /* multiplies cos and sin (f32) */
} rope_config;
_Static_assert(sizeof(rope_config) <= GT_LAYER_CONFIG_BYTES, "Rope's config fits gt_layer.config");

static rope_config config_of(const gt_layer *layer) {
    rope_config config;
    memcpy(&config, layer->config, sizeof config);
    return config;
}

static const gt_enum_name rope_type_names[] = {
    {"default", GT_ROPE_DEFAULT}, {"linear", GT_ROPE_LINEAR}, {"llama3", GT_ROPE_LLAMA3},
    {"yarn", GT_ROPE_YARN}, {NULL, 0}};

#define ROPE_AT(field) GT_ARG_CONFIG(rope_config, field)
/* A double >= 0 (0 where the rope type does not use it; the check says which must be > 0). */
#define ROPE_REAL(name, field) {name, GT_ARG_DOUBLE, ROPE_AT(field), 0, INFINITY, 0, NULL}
static const gt_layer_arg rope_args[] = {
    GT_ARG_SIZE_AT("num_heads", ROPE_AT(heads)), GT_ARG_SIZE_AT("num_kv_heads", ROPE_AT(kv_heads)),
    GT_ARG_SIZE_AT("head_dim", ROPE_AT(head_dim)),
    {"rope_type", GT_ARG_ENUM, ROPE_AT(rope_type), 0, 0, 0, rope_type_names},
    {"theta", GT_ARG_DOUBLE, ROPE_AT(theta), 0, INFINITY, 1, NULL},
    ROPE_REAL("factor", factor), ROPE_REAL("low_freq_factor", low_freq_factor),
    ROPE_REAL("high_freq_factor", high_freq_factor),
    ROPE_REAL("original_max_position_embeddings", original_max_position_embeddings),
    {"attention_factor", GT_ARG_FLOAT, ROPE_AT(attention_factor), 0, FLT_MAX, 1, NULL},
    ROPE_REAL("beta_fast", beta_fast), ROPE_REAL("beta_slow", beta_slow),
    GT_ARG_FLAG_AT("truncate", ROPE_AT(truncate))};

static gt_rope_freq freq_of(const rope_config *c) {
    gt_rope_freq f = {.theta = c->theta, .type = (gt_rope_type)c->rope_type, .factor = c->factor,
                      .low_freq_factor = c->low_freq_factor, .high_freq_factor = c->high_freq_factor,
                      .original_max_position_embeddings = c->original_max_position_embeddings,
                      .beta_fast = c->beta_fast, .beta_slow = c->beta_slow, .truncate = c->truncate};
    return f;
}

/* (D / 2,) inv_freq into a new host array (*out, to free); fails naming the bad field. */
static gt_status compute_inv_freq(const rope_config *c, float **out) {
    gt_rope_freq f = freq_of(c);
    float *table = malloc((size_t)c->head_dim / 2 * sizeof(float));
    if (!table)
        return GT_FAIL(GT_ERR_OOM, "RotaryEmbedding: no host memory for %lld inverse frequencies",
                       (long long)c->head_dim / 2);
    gt_status status = gt_rope_inv_freq(table, c->head_dim, &f);
    if (status != GT_OK) {
        free(table);
        return status;
    }
    *out = table;
    return GT_OK;
}

/* D even, a row width (H + 2K) D that fits int64, and the rope type's fields (gt_rope_inv_freq's
 * check). */
static gt_status check_rope(gt_layer *layer) {
    rope_config c = config_of(layer);
    int64_t heads = 0, width = 0;
    if (c.head_dim % 2 != 0)
        return GT_FAIL(GT_ERR_VALUE, "RotaryEmbedding: head_dim must be even, got %lld", (long long)c.head_dim);
    if (__builtin_mul_overflow(c.kv_heads, 2, &heads) || __builtin_add_overflow(heads, c.heads, &heads) ||
        __builtin_mul_overflow(heads, c.head_dim, &width))
        return GT_FAIL(GT_ERR_VALUE, "RotaryEmbedding: (num_heads + 2 num_kv_heads) * head_dim is too large");
    float *table = NULL;
    gt_status status = compute_inv_freq(&c, &table);
    if (status != GT_OK) {
        char message[256];
        snprintf(message, sizeof message, "%s", gt_error_message());
        return GT_FAIL(status, "RotaryEmbedding: %s", message);
    }
    free(table);
    return GT_OK;
}

static void describe_rope(const gt_layer *layer, char *buf, size_t bytes) {
    rope_config c = config_of(layer);
    const char *type = "";
    for (const gt_enum_name *n = rope_type_names; n->name; n++)
        if (n->value == c.rope_type)
            type = n->name;
    snprintf(buf, bytes, "RotaryEmbedding(%lld, %lld, %lld, '%s')", (long long)c.heads, (long long)c.kv_heads,
             (long long)c.head_dim, type);
}

/* (B, T, (H + 2K) D) floating point in and out; inv_freq placed (and filled) once. */
static gt_status plan_rope(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    rope_config c = config_of(layer);
    char name[GT_LAYER_PATH_BYTES + 96];
    gt_layer_describe(name, sizeof name, layer, site->path);
    if (!w->ops->rope_forward || !w->ops->rope_backward || !w->ops->copy)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run "
                       "this model on the CPU", name, w->ops->name);
    GT_TRY(gt_plan_check_features(w, in, (c.heads + 2 * c.kv_heads) * c.head_dim, layer, site->path));
    if (in->ndim != 3)
        return GT_FAIL(GT_ERR_VALUE, "model: %s takes (batch, seq, (num_heads + 2 num_kv_heads) head_dim) "
                       "inputs, but gets %d dimensions", name, in->ndim);
    float *table = NULL;
    GT_TRY(compute_inv_freq(&c, &table));
    void *placed = NULL;
    gt_status status = gt_plan_constant(w, table, (size_t)c.head_dim / 2 * sizeof(float),
                                        "the inverse frequencies of a RotaryEmbedding", &placed);
    free(table);
    layer->inv_freq = placed;
    return status;
}

/* The op's arguments: the H + K q and k heads of each (B, T) row, in -> out. */
static gt_rope_args rope_args_of(const gt_layer *layer, const void *in, void *out, const gt_run *run) {
    rope_config c = config_of(layer);
    int64_t seq = layer->in_shape.shape[1], width = layer->in_shape.shape[2];
    gt_rope_args a = {
        .batch = layer->in_shape.shape[0], .heads = c.heads + c.kv_heads, .seq = seq, .head_dim = c.head_dim,
        .rotary_dim = c.head_dim, .in = in, .out = out, .strides = {seq * width, c.head_dim, width},
        .positions = run->positions, .positions_stride = run->positions_stride, .inv_freq = layer->inv_freq,
        .dt = run->dt, .attention_factor = c.attention_factor};
    return a;
}

/* out = in (v passes through), then the q and k heads rotate from in into out (forward), or the
 * transpose from dout into din; in place when din is dout. */
static gt_status rope_run(gt_layer *layer, void *out, const void *in, gt_run *run, int backward) {
    const gt_ops *ops = run->backend->ops;
    if (out != in)
        GT_TRY(ops->copy(run->backend, out, in, (size_t)gt_layer_out_numel(layer) * gt_dtype_size(run->dt)));
    gt_rope_args a = rope_args_of(layer, in, out, run);
    return backward ? ops->rope_backward(run->backend, &a) : ops->rope_forward(run->backend, &a);
}

static gt_status rope_forward(gt_layer *layer, const void *in, gt_run *run) {
    return rope_run(layer, layer->out.ptr, in, run, 0);
}

static gt_status rope_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    (void)in;
    if (!din)
        return GT_OK;
    return rope_run(layer, din, dout, run, 1);
}

const gt_layer_type gt_layer_type_rope = {
    "rope", "RotaryEmbedding", GT_LAYER_ARGS(rope_args), 0, check_rope, describe_rope, NULL, plan_rope,
    rope_forward, rope_backward};
