/* Attention: the parameter-free core of MultiheadAttention and of the decoders' self-attention.
 * Spec: ("attention", embed_dim, num_heads, dropout, causal, num_kv_heads, head_dim, window,
 * scale). H = num_heads query heads, K = num_kv_heads kv heads (0: H; K divides H; query head h
 * reads kv head h / (H / K), Hugging Face's repeat_kv, without expanding k or v), D = head_dim
 * (0: embed_dim / H, which must then divide; else embed_dim must be H D), window W (0: none;
 * else query i sees keys j > i - W only, transformers' sliding_window), scale (0.0: 1 / sqrt(D);
 * else the score multiplier, e.g. Gemma's query_pre_attn_scalar ** -0.5). Its input is the fused
 * projection (B, T, (H + 2K) D) laid out [q heads | k heads | v heads] (head h at columns h D of
 * its part; with K = H that is MultiheadAttention's (B, T, 3, H, D)), its output (B, T, H D) as
 * (B, T, H, D): the op reads and writes those strided layouts directly, so no transpose is ever
 * copied. The dropout key of the probabilities is (seed, dropout_id, step, micro-batch * B * H *
 * T * T), as a Dropout layer's. Keys at or after a sequence's length (run->key_lengths, from the
 * model's attention mask) are masked, and keys before run->key_starts[b, i] (segments: left
 * padding, packed documents) when the model gives them. */
#include "nn/kind.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Attention's own hyper-parameters (in gt_layer.config); embed_dim, num_heads, dropout and
 * causal are gt_layer fields (in_features, num_heads, p, causal). */
typedef struct attention_config {
    int64_t kv_heads;  /* K as given: 0 means num_heads */
    int64_t head_dim;  /* D as given: 0 means embed_dim / num_heads */
    int64_t window;    /* W: 0 none, else keys j > i - W only */
    double scale;      /* 0: 1 / sqrt(D), else the multiplier of q . k */
} attention_config;
_Static_assert(sizeof(attention_config) <= GT_LAYER_CONFIG_BYTES, "Attention's config fits gt_layer.config");

static attention_config config_of(const gt_layer *layer) {
    attention_config config;
    memcpy(&config, layer->config, sizeof config);
    return config;
}

/* K and D with their defaults applied. */
static int64_t kv_heads_of(const gt_layer *layer) {
    int64_t k = config_of(layer).kv_heads;
    return k > 0 ? k : layer->num_heads;
}
static int64_t head_dim_of(const gt_layer *layer) {
    int64_t d = config_of(layer).head_dim;
    return d > 0 ? d : layer->in_features / layer->num_heads;
}

gt_attention_args gt_attention_layer_args(const gt_layer *layer, const gt_tensor *in) {
    attention_config config = config_of(layer);
    int64_t heads = layer->num_heads, kv = kv_heads_of(layer), dim = head_dim_of(layer);
    int64_t seq = in->shape[1], width = (heads + 2 * kv) * dim, out_width = heads * dim;
    gt_attention_args a = {
        .batch = in->shape[0], .heads = heads, .seq = seq, .head_dim = dim, .kv_heads = kv,
        .in = {seq * width, dim, width},
        .kv = {seq * width, dim, width},
        .out_strides = {seq * out_width, dim, out_width},
        .scale = config.scale > 0.0 ? (float)config.scale : 1.0f / sqrtf((float)dim),
        .causal = layer->causal, .window = config.window, .dt = in->dtype,
    };
    return a;
}

/* Input and output widths: (H + 2K) D and H D. */
int64_t gt_attention_in_width(const gt_layer *layer) {
    return (layer->num_heads + 2 * kv_heads_of(layer)) * head_dim_of(layer);
}
int64_t gt_attention_out_width(const gt_layer *layer) {
    return layer->num_heads * head_dim_of(layer);
}

/* The arguments of one forward or backward call: pointers, and dropout in training only. */
static gt_attention_args run_args(const gt_layer *layer, const void *in, const gt_run *run) {
    gt_attention_args a = gt_attention_layer_args(layer, &layer->in_shape);
    size_t elem = gt_dtype_size(run->dt), q_width = (size_t)(a.heads * a.head_dim);
    size_t kv_width = (size_t)(a.kv_heads * a.head_dim);
    a.dt = run->dt;
    a.q = in;
    a.k = (const char *)in + q_width * elem;
    a.v = (const char *)in + (q_width + kv_width) * elem;
    a.out = layer->out.ptr;
    a.lse = layer->lse;
    a.key_lengths = run->key_lengths;
    a.key_starts = run->key_starts;
    if (run->training && layer->p > 0.0) {
        uint64_t per_micro = (uint64_t)(a.batch * a.heads) * (uint64_t)a.seq * (uint64_t)a.seq;
        a.dropout_p = layer->p;
        a.dropout_key = (gt_dropout_key){run->seed, layer->dropout_id, run->step,
                                         run->micro_offset * per_micro};
    }
    return a;
}

gt_status gt_attention_layer_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_attention_args a = run_args(layer, in, run);
    return run->backend->ops->attention_forward(run->backend, &a);
}

gt_status gt_attention_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                      gt_run *run) {
    if (!din)
        return GT_OK;
    gt_attention_args a = run_args(layer, in, run);
    size_t elem = gt_dtype_size(run->dt), q_width = (size_t)(a.heads * a.head_dim);
    size_t kv_width = (size_t)(a.kv_heads * a.head_dim);
    a.dout = dout;
    a.dq = din;
    a.dk = (char *)din + q_width * elem;
    a.dv = (char *)din + (q_width + kv_width) * elem;
    return run->backend->ops->attention_backward(run->backend, &a);
}

/* ---- the row ---- */
#define ATTN_INT_AT(name, at) {name, GT_ARG_INT, at, 0, GT_ARG_INT64_MAX, 0, NULL}  /* int >= 0 */
static const gt_layer_arg attention_args[] = {
    GT_ARG_SIZE_AT("embed_dim", GT_ARG_FIELD(in_features)), GT_ARG_SIZE_AT("num_heads", GT_ARG_FIELD(num_heads)),
    GT_ARG_PROBABILITY_AT("dropout", GT_ARG_FIELD(p)), GT_ARG_FLAG_AT("causal", GT_ARG_FIELD(causal)),
    ATTN_INT_AT("num_kv_heads", GT_ARG_CONFIG(attention_config, kv_heads)),
    ATTN_INT_AT("head_dim", GT_ARG_CONFIG(attention_config, head_dim)),
    ATTN_INT_AT("window", GT_ARG_CONFIG(attention_config, window)),
    {"scale", GT_ARG_DOUBLE, GT_ARG_CONFIG(attention_config, scale), 0, INFINITY, 0, NULL}};

/* The rules between the arguments: K divides H, D from embed_dim or consistent with it, a finite
 * scale, and widths that fit int64. */
static gt_status check_attention(gt_layer *layer) {
    attention_config c = config_of(layer);
    int64_t heads = layer->num_heads, embed = layer->in_features;
    if (c.head_dim == 0 && embed % heads != 0)
        return GT_FAIL(GT_ERR_VALUE, "MultiheadAttention needs embed_dim divisible by num_heads");
    if (c.head_dim > 0 && (c.head_dim > INT32_MAX || heads > INT32_MAX || embed != heads * c.head_dim))
        return GT_FAIL(GT_ERR_VALUE, "embed_dim: must be num_heads * head_dim = %lld * %lld when "
                       "head_dim is given, got %lld", (long long)heads, (long long)c.head_dim,
                       (long long)embed);
    if (c.kv_heads > 0 && heads % c.kv_heads != 0)
        return GT_FAIL(GT_ERR_VALUE, "num_kv_heads: must divide num_heads (%lld), got %lld",
                       (long long)heads, (long long)c.kv_heads);
    if (!(c.scale <= FLT_MAX))
        return GT_FAIL(GT_ERR_VALUE, "scale: must be a finite float >= 0 (0: 1 / sqrt(head_dim)), "
                       "got %g", c.scale);
    if (embed > INT64_MAX / 3)
        return GT_FAIL(GT_ERR_VALUE, "embed_dim: %lld is too large", (long long)embed);
    return GT_OK;
}

static void describe_attention(const gt_layer *layer, char *buf, size_t bytes) {
    attention_config c = config_of(layer);
    if (c.kv_heads == 0 && c.head_dim == 0 && c.window == 0 && c.scale == 0.0) {
        snprintf(buf, bytes, "the attention of MultiheadAttention(%lld, %lld)",
                 (long long)layer->in_features, (long long)layer->num_heads);
        return;
    }
    snprintf(buf, bytes, "Attention(num_heads=%lld, num_kv_heads=%lld, head_dim=%lld, window=%lld)",
             (long long)layer->num_heads, (long long)kv_heads_of(layer), (long long)head_dim_of(layer),
             (long long)c.window);
}

const gt_layer_type gt_layer_type_attention = {
    "attention", "MultiheadAttention", GT_LAYER_ARGS(attention_args), GT_KIND_DROPOUT_ID, check_attention,
    describe_attention, NULL, gt_plan_attention, gt_attention_layer_forward,
    gt_attention_layer_backward};
