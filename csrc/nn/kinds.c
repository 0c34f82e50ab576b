/* The rows of the layer kinds that predate the table of kinds (nn/kind.h), and the table itself:
 * arguments as the spec tuples of python/gputrain/nn give them, parameters with PyTorch's shapes
 * and default initialisation, the names messages give the layers. */
#include "nn/kind.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define GT_ROW_PTR(NAME, name) &gt_layer_type_##name,
/* Arguments in gt_layer fields: sizes in [1, INT64_MAX] (the convolution's: INT31, in [low, INT_MAX]),
 * flags, probabilities in [0, 1], epsilons > 0. */
#define GT_SIZE(name, field) GT_ARG_SIZE_AT(name, GT_ARG_FIELD(field))
#define GT_INT31(type, name, field, low) {name, type, GT_ARG_FIELD(field), low, INT_MAX, 0, NULL}
#define GT_FLAG(name, field) GT_ARG_FLAG_AT(name, GT_ARG_FIELD(field))
#define GT_PROBABILITY(name, field) GT_ARG_PROBABILITY_AT(name, GT_ARG_FIELD(field))
#define GT_EPS(name, field) GT_ARG_EPS_AT(name, GT_ARG_FIELD(field))

_Static_assert(sizeof(gt_activation) == sizeof(int) && sizeof(gt_pool_mode) == sizeof(int) &&
               sizeof(gt_pool_kind) == sizeof(int), "enum arguments are stored as int");

void gt_layer_param(gt_param *param, int ndim, const int64_t *dims, gt_init_rule init, float value) {
    param->ndim = ndim;
    memset(param->shape, 0, sizeof param->shape);
    memcpy(param->shape, dims, (size_t)ndim * sizeof *dims);
    param->init = init;
    param->init_value = value;
}

/* A GEMM dimension of a Linear is a BLAS int. */
static gt_status check_gemm_dim(int64_t value, const char *arg_name, const char *layer) {
    if (value > INT_MAX)
        return GT_FAIL(GT_ERR_VALUE, "%s: %lld is more than %d, the largest matrix dimension the GEMMs "
                       "of %s can take", arg_name, (long long)value, INT_MAX, layer);
    return GT_OK;
}

/* ---- Linear: ("linear", in_features, out_features, bias) ---- */
static const gt_layer_arg linear_args[] = {
    GT_SIZE("in_features", in_features), GT_SIZE("out_features", out_features), GT_FLAG("bias", has_bias)};

static void describe_linear(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "Linear(%lld, %lld)", (long long)layer->in_features, (long long)layer->out_features);
}

/* weight (out, in), bias (out,): U(-1/sqrt(in), 1/sqrt(in)). */
static gt_status linear_params(gt_layer *layer) {
    char name[128];
    describe_linear(layer, name, sizeof name);
    GT_TRY(check_gemm_dim(layer->in_features, "in_features", name));
    GT_TRY(check_gemm_dim(layer->out_features, "out_features", name));
    const int64_t weight[2] = {layer->out_features, layer->in_features};
    gt_layer_param(&layer->weight, 2, weight, GT_INIT_FAN_IN_UNIFORM, 0.0f);
    if (layer->has_bias)
        gt_layer_param(&layer->bias, 1, &layer->out_features, GT_INIT_FAN_IN_UNIFORM, 0.0f);
    return GT_OK;
}

const gt_layer_type gt_layer_type_linear = {
    "linear", "Linear", GT_LAYER_ARGS(linear_args), GT_KIND_PARAMS | GT_KIND_FREEZES, NULL, describe_linear,
    linear_params, gt_plan_linear, gt_linear_forward, gt_linear_backward};

/* ---- Activation: ("activation", function) ---- */
static const gt_enum_name activation_names[] = {
    {"relu", GT_ACT_RELU}, {"gelu", GT_ACT_GELU_ERF}, {"gelu_tanh", GT_ACT_GELU_TANH},
    {"tanh", GT_ACT_TANH}, {"silu", GT_ACT_SILU}, {NULL, 0}};
static const gt_layer_arg activation_args[] = {
    {"function", GT_ARG_ENUM, GT_ARG_FIELD(activation), 0, 0, 0, activation_names}};

const gt_layer_type gt_layer_type_activation = {
    "activation", "Activation", GT_LAYER_ARGS(activation_args), 0, NULL, NULL, NULL,
    gt_plan_elementwise, gt_activation_forward, gt_activation_backward};

/* ---- Dropout: ("dropout", p) ---- */
static const gt_layer_arg dropout_args[] = {GT_PROBABILITY("p", p)};

const gt_layer_type gt_layer_type_dropout = {
    "dropout", "Dropout", GT_LAYER_ARGS(dropout_args), GT_KIND_DROPOUT_ID, NULL, NULL, NULL,
    gt_plan_elementwise, gt_dropout_forward, gt_dropout_backward};

/* ---- LayerNorm: ("layernorm", normalized_shape, eps, bias) ---- */
static const gt_layer_arg layernorm_args[] = {
    GT_SIZE("normalized_shape", in_features), GT_EPS("eps", eps), GT_FLAG("bias", has_bias)};

static void describe_layernorm(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "LayerNorm(%lld)", (long long)layer->in_features);
}

/* weight (C,) = 1, bias (C,) = 0. */
static gt_status layernorm_params(gt_layer *layer) {
    gt_layer_param(&layer->weight, 1, &layer->in_features, GT_INIT_CONSTANT, 1.0f);
    if (layer->has_bias)
        gt_layer_param(&layer->bias, 1, &layer->in_features, GT_INIT_CONSTANT, 0.0f);
    return GT_OK;
}

const gt_layer_type gt_layer_type_layernorm = {
    "layernorm", "LayerNorm", GT_LAYER_ARGS(layernorm_args), GT_KIND_PARAMS | GT_KIND_FREEZES, NULL, describe_layernorm,
    layernorm_params, gt_plan_layernorm, gt_layernorm_forward, gt_layernorm_backward};

/* ---- Embedding: ("embedding", num_embeddings, embedding_dim) ---- */
static const gt_layer_arg embedding_args[] = {
    GT_SIZE("num_embeddings", num_embeddings), GT_SIZE("embedding_dim", embedding_dim)};

static void describe_embedding(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "Embedding(%lld, %lld)", (long long)layer->num_embeddings,
             (long long)layer->embedding_dim);
}

/* A (rows, embedding_dim) table ~ N(0, 1). */
static void table_param(gt_layer *layer, int64_t rows) {
    const int64_t table[2] = {rows, layer->embedding_dim};
    gt_layer_param(&layer->weight, 2, table, GT_INIT_NORMAL, 0.0f);
}

static gt_status embedding_params(gt_layer *layer) {
    table_param(layer, layer->num_embeddings);
    return GT_OK;
}

const gt_layer_type gt_layer_type_embedding = {
    "embedding", "Embedding", GT_LAYER_ARGS(embedding_args),
    GT_KIND_PARAMS | GT_KIND_READS_IDS | GT_KIND_FREEZES | GT_KIND_LOOKUP, NULL,
    describe_embedding, embedding_params, gt_plan_embedding, gt_embedding_forward,
    gt_embedding_backward};

/* ---- Flatten: ("flatten",) ---- */
const gt_layer_type gt_layer_type_flatten = {
    "flatten", "Flatten", NULL, 0, GT_KIND_NO_BUFFER, NULL, NULL, NULL, gt_plan_flatten,
    gt_flatten_forward, gt_flatten_backward};

/* ---- Sequential: ("sequential", [specs]); Residual: ("residual", [specs of its block]) ---- */
static const gt_layer_arg sequential_args[] = {{"layers", GT_ARG_LAYERS, 0, 0, 0, 0, NULL}};
static const gt_layer_arg residual_args[] = {{"block", GT_ARG_BLOCK, 0, 0, 0, 0, NULL}};

static void describe_residual(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "Residual");
}

const gt_layer_type gt_layer_type_sequential = {
    "sequential", "Sequential", GT_LAYER_ARGS(sequential_args), GT_KIND_NO_BUFFER | GT_KIND_CONTAINER, NULL,
    NULL, NULL, gt_plan_sequential, gt_sequential_forward, gt_sequential_backward};

const gt_layer_type gt_layer_type_residual = {
    "residual", "Residual", GT_LAYER_ARGS(residual_args), GT_KIND_CONTAINER, NULL, describe_residual, NULL,
    gt_plan_residual, gt_residual_forward, gt_residual_backward};

/* ---- Checkpoint: ("checkpoint", [specs of its block]) ---- */
const gt_layer_type gt_layer_type_checkpoint = {
    "checkpoint", "Checkpoint", GT_LAYER_ARGS(residual_args), GT_KIND_CONTAINER | GT_KIND_NO_BUFFER, NULL, NULL,
    NULL,
    gt_plan_checkpoint, gt_checkpoint_forward, gt_checkpoint_backward};

/* ---- Attention: its row is in nn/attention.c ---- */

/* ---- TokenEmbedding: ("tokens", num_embeddings, embedding_dim, type_vocab_size, attention_mask,
 * position_ids, pad_token_id, stored_dtype "f32" | "bf16" | "f16" | "nf4" | "fp4", blocksize (4-bit:
 * 2..4096, even, dividing embedding_dim; else 0)) ---- */
static const gt_enum_name table_stored_names[] = {
    {"f32", GT_TOKENS_F32}, {"bf16", GT_TOKENS_BF16}, {"f16", GT_TOKENS_F16}, {"nf4", GT_TOKENS_NF4},
    {"fp4", GT_TOKENS_FP4}, {NULL, 0}};
_Static_assert(sizeof(gt_tokens_config) <= GT_LAYER_CONFIG_BYTES, "Tokens' config fits gt_layer.config");
static const gt_layer_arg tokens_args[] = {
    GT_SIZE("num_embeddings", num_embeddings), GT_SIZE("embedding_dim", embedding_dim),
    {"type_vocab_size", GT_ARG_INT, GT_ARG_FIELD(type_vocab), 0, GT_ARG_INT64_MAX, 0, NULL},
    GT_FLAG("attention_mask", has_mask),
    GT_ARG_FLAG_AT("position_ids", GT_ARG_CONFIG(gt_tokens_config, position_ids)),
    {"pad_token_id", GT_ARG_INT, GT_ARG_CONFIG(gt_tokens_config, pad_token_id), -1, GT_ARG_INT64_MAX, 0, NULL},
    {"stored_dtype", GT_ARG_ENUM, GT_ARG_CONFIG(gt_tokens_config, stored), 0, 0, 0, table_stored_names},
    {"blocksize", GT_ARG_INT, GT_ARG_CONFIG(gt_tokens_config, blocksize), 0, 4096, 0, NULL}};

/* Elements of the whole table: the token rows, then the token-type rows. */
static gt_status table_elements(const gt_layer *layer, const char *what, size_t *elements) {
    size_t rows = 0;
    GT_TRY(gt_size_add((size_t)layer->num_embeddings, (size_t)layer->type_vocab, what, &rows));
    return gt_size_mul(rows, (size_t)layer->embedding_dim, what, elements);
}

/* A 4-bit table's block: even, at least 2, whole blocks a row; the others have none. */
static gt_status check_tokens_blocksize(const gt_layer *layer) {
    long long blocksize = (long long)gt_tokens_blocksize(layer);
    long long dim = (long long)layer->embedding_dim;
    if (gt_tokens_table_dtype(layer) != GT_U8)
        return blocksize == 0 ? GT_OK
                              : GT_FAIL(GT_ERR_VALUE, "TokenEmbedding: blocksize must be 0 for a table that is not "
                                        "quantized, got %lld", blocksize);
    if (blocksize < 2 || blocksize % 2)
        return GT_FAIL(GT_ERR_VALUE, "TokenEmbedding: blocksize must be even and at least 2 (two 4-bit codes a "
                       "byte), got %lld", blocksize);
    if (dim % blocksize)
        return GT_FAIL(GT_ERR_VALUE, "TokenEmbedding: embedding_dim %lld is not a multiple of blocksize %lld "
                       "(a 4-bit table's rows are whole blocks)", dim, blocksize);
    return GT_OK;
}

/* Segments come from the mask and the position ids together; a table held frozen alone has a size
 * in bytes (the parameter layout checks an f32 one). */
static gt_status check_tokens(gt_layer *layer) {
    if (gt_tokens_has_positions(layer) && !layer->has_mask)
        return GT_FAIL(GT_ERR_VALUE, "TokenEmbedding: position_ids needs attention_mask (the segments of "
                       "a row come from both)");
    GT_TRY(check_tokens_blocksize(layer));
    gt_dtype dt = gt_tokens_table_dtype(layer);
    if (dt == GT_F32)
        return GT_OK;
    const char *what = "the frozen table of a TokenEmbedding";
    size_t elements = 0, bytes = 0;
    GT_TRY(table_elements(layer, what, &elements));
    GT_TRY(gt_size_mul(elements, dt == GT_U8 ? 1 : gt_dtype_size(dt), what, &bytes));
    return gt_size_check(bytes, what);
}

static void describe_tokens(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "TokenEmbedding(%lld, %lld)", (long long)layer->num_embeddings,
             (long long)layer->embedding_dim);
}

/* One table: the token rows, then the token-type rows; a parameter unless held frozen alone. */
static gt_status tokens_params(gt_layer *layer) {
    if (gt_tokens_table_dtype(layer) == GT_F32)
        table_param(layer, layer->num_embeddings + layer->type_vocab);
    return GT_OK;
}

/* A table held frozen alone: 'weight' (rows, dim) f16/bf16; or, 4-bit, 'weight' ((rows * dim / 2, 1)
 * uint8 codes, bitsandbytes' packed shape) and 'weight.absmax' ((rows * dim / blocksize,) f32). None
 * for a parameter. (Sizes checked by check_tokens.) */
static size_t tokens_frozen(const gt_layer *layer, gt_frozen_piece *pieces) {
    gt_dtype dt = gt_tokens_table_dtype(layer);
    int64_t rows = layer->num_embeddings + layer->type_vocab, dim = layer->embedding_dim;
    size_t elements = (size_t)rows * (size_t)dim;
    if (dt == GT_F32)
        return 0;
    if (dt != GT_U8) {
        pieces[0] = (gt_frozen_piece){0, elements * gt_dtype_size(dt), dt, 2, {rows, dim}};
        return 1;
    }
    size_t bytes = elements / 2, blocks = elements / (size_t)gt_tokens_blocksize(layer);
    pieces[0] = (gt_frozen_piece){0, bytes, GT_U8, 2, {(int64_t)bytes, 1}};
    pieces[1] = (gt_frozen_piece){gt_align_up(bytes), blocks * sizeof(float), GT_F32, 1, {(int64_t)blocks, 0}};
    return 2;
}

const gt_layer_type gt_layer_type_tokens = {
    "tokens", "TokenEmbedding", GT_LAYER_ARGS(tokens_args),
    GT_KIND_PARAMS | GT_KIND_READS_IDS | GT_KIND_FREEZES | GT_KIND_LOOKUP, check_tokens,
    describe_tokens, tokens_params, gt_plan_tokens, gt_tokens_forward, gt_tokens_backward, tokens_frozen};

/* ---- SequencePool: ("pool", mode): "cls", "mean" or "last" (run->last_tokens) ---- */
static const gt_enum_name pool_names[] = {
    {"cls", GT_POOL_FIRST}, {"mean", GT_POOL_MEAN}, {"last", GT_POOL_LAST}, {NULL, 0}};
static const gt_layer_arg pool_args[] = {{"mode", GT_ARG_ENUM, GT_ARG_FIELD(pool), 0, 0, 0, pool_names}};

const gt_layer_type gt_layer_type_pool = {
    "pool", "SequencePool", GT_LAYER_ARGS(pool_args), 0, NULL, NULL, NULL, gt_plan_pool, gt_pool_forward,
    gt_pool_backward};

/* ---- PositionEmbedding: ("position", num_positions, embedding_dim, offset) ---- */
static const gt_layer_arg position_args[] = {
    GT_SIZE("num_positions", num_embeddings), GT_SIZE("embedding_dim", embedding_dim),
    {"offset", GT_ARG_INT, GT_ARG_FIELD(position_offset), 0, GT_ARG_INT64_MAX, 0, NULL}};

static void describe_position(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "PositionEmbedding(%lld, %lld)", (long long)layer->num_embeddings,
             (long long)layer->embedding_dim);
}

static gt_status check_position(gt_layer *layer) {
    if (layer->position_offset >= layer->num_embeddings)
        return GT_FAIL(GT_ERR_VALUE, "PositionEmbedding offset %lld leaves no row of its %lld positions",
                       (long long)layer->position_offset, (long long)layer->num_embeddings);
    return GT_OK;
}

const gt_layer_type gt_layer_type_position = {
    "position", "PositionEmbedding", GT_LAYER_ARGS(position_args),
    GT_KIND_PARAMS | GT_KIND_FREEZES | GT_KIND_LOOKUP, check_position,
    describe_position,
    embedding_params, gt_plan_position, gt_position_forward, gt_position_backward};

/* ---- Conv2d: ("conv2d", in, out, kernel_size, stride, padding, dilation, groups, bias) ---- */
static const gt_layer_arg conv2d_args[] = {
    GT_INT31(GT_ARG_INT, "in_channels", in_features, 1), GT_INT31(GT_ARG_INT, "out_channels", out_features, 1),
    GT_INT31(GT_ARG_INT_PAIR, "kernel_size", kernel, 1), GT_INT31(GT_ARG_INT_PAIR, "stride", stride, 1),
    GT_INT31(GT_ARG_INT_PAIR, "padding", padding, 0), GT_INT31(GT_ARG_INT_PAIR, "dilation", dilation, 1),
    GT_INT31(GT_ARG_INT, "groups", groups, 1), GT_FLAG("bias", has_bias)};

static gt_status check_conv2d(gt_layer *layer) {
    if (layer->in_features % layer->groups || layer->out_features % layer->groups)
        return GT_FAIL(GT_ERR_VALUE, "Conv2d needs in_channels and out_channels divisible by groups");
    return GT_OK;
}

static void describe_conv2d(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "Conv2d(%lld, %lld, kernel_size=(%lld, %lld))", (long long)layer->in_features,
             (long long)layer->out_features, (long long)layer->kernel[0], (long long)layer->kernel[1]);
}

/* weight (out, in / groups, kh, kw), bias (out,): U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
static gt_status conv2d_params(gt_layer *layer) {
    const int64_t weight[4] = {layer->out_features, layer->in_features / layer->groups, layer->kernel[0],
                               layer->kernel[1]};
    gt_layer_param(&layer->weight, 4, weight, GT_INIT_FAN_IN_UNIFORM, 0.0f);
    if (layer->has_bias)
        gt_layer_param(&layer->bias, 1, &layer->out_features, GT_INIT_FAN_IN_UNIFORM, 0.0f);
    return GT_OK;
}

const gt_layer_type gt_layer_type_conv2d = {
    "conv2d", "Conv2d", GT_LAYER_ARGS(conv2d_args), GT_KIND_PARAMS, check_conv2d, describe_conv2d,
    conv2d_params, gt_plan_conv2d, gt_conv2d_layer_forward, gt_conv2d_layer_backward};

/* ---- BatchNorm2d: ("batchnorm2d", num_features, eps, momentum (< 0: cumulative average), affine,
 * track_running_stats) ---- */
static const gt_layer_arg batchnorm2d_args[] = {
    GT_INT31(GT_ARG_INT, "num_features", in_features, 1), GT_EPS("eps", eps),
    {"momentum", GT_ARG_DOUBLE, GT_ARG_FIELD(momentum), -INFINITY, 1, 0, NULL},
    GT_FLAG("affine", has_bias), GT_FLAG("track_running_stats", track_running_stats)};

static gt_status check_batchnorm2d(gt_layer *layer) {
    if (layer->momentum < 0.0)
        layer->momentum = -1.0;
    return GT_OK;
}

static void describe_batchnorm2d(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "BatchNorm2d(%lld)", (long long)layer->in_features);
}

/* With affine: weight (C,) = 1, bias (C,) = 0. */
static gt_status batchnorm2d_params(gt_layer *layer) {
    if (!layer->has_bias)
        return GT_OK;
    gt_layer_param(&layer->weight, 1, &layer->in_features, GT_INIT_CONSTANT, 1.0f);
    gt_layer_param(&layer->bias, 1, &layer->in_features, GT_INIT_CONSTANT, 0.0f);
    return GT_OK;
}

const gt_layer_type gt_layer_type_batchnorm2d = {
    "batchnorm2d", "BatchNorm2d", GT_LAYER_ARGS(batchnorm2d_args), GT_KIND_PARAMS, check_batchnorm2d,
    describe_batchnorm2d, batchnorm2d_params, gt_plan_batchnorm2d, gt_batchnorm2d_forward,
    gt_batchnorm2d_backward};

/* ---- Pool2d: ("pool2d", "max" | "avg" | "adaptive_avg", kernel_size, stride, padding, dilation,
 * ceil_mode, count_include_pad); adaptive: kernel_size is the output size, the rest unused ---- */
static const gt_enum_name pool2d_names[] = {
    {"max", GT_POOL_MAX}, {"avg", GT_POOL_AVG}, {"adaptive_avg", GT_POOL_ADAPTIVE_AVG}, {NULL, 0}};
static const gt_layer_arg pool2d_args[] = {
    {"kind", GT_ARG_ENUM, GT_ARG_FIELD(pool2d.kind), 0, 0, 0, pool2d_names},
    {"kernel_size", GT_ARG_INT_PAIR, GT_ARG_FIELD(pool2d.kernel), 1, INT32_MAX, 0, NULL},
    {"stride", GT_ARG_INT_PAIR, GT_ARG_FIELD(pool2d.stride), 1, INT32_MAX, 0, NULL},
    {"padding", GT_ARG_INT_PAIR, GT_ARG_FIELD(pool2d.padding), 0, INT32_MAX, 0, NULL},
    {"dilation", GT_ARG_INT_PAIR, GT_ARG_FIELD(pool2d.dilation), 1, INT32_MAX, 0, NULL},
    GT_FLAG("ceil_mode", ceil_mode), GT_FLAG("count_include_pad", pool2d.count_include_pad)};

/* Adaptive pooling: the pair read as kernel_size is the output size; no window. */
static gt_status check_pool2d(gt_layer *layer) {
    gt_pool2d_args *a = &layer->pool2d;
    if (a->kind != GT_POOL_ADAPTIVE_AVG)
        return GT_OK;
    a->out_h = a->kernel[0];
    a->out_w = a->kernel[1];
    for (int d = 0; d < 2; d++)
        a->kernel[d] = a->stride[d] = a->padding[d] = a->dilation[d] = 0;
    return GT_OK;
}

static void describe_pool2d(const gt_layer *layer, char *buf, size_t bytes) {
    static const char *names[] = {"MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"};
    snprintf(buf, bytes, "%s", names[layer->pool2d.kind]);
}

const gt_layer_type gt_layer_type_pool2d = {
    "pool2d", "Pool2d", GT_LAYER_ARGS(pool2d_args), 0, check_pool2d, describe_pool2d, NULL, gt_plan_pool2d,
    gt_pool2d_layer_forward, gt_pool2d_layer_backward};

/* ---- The table ---- */
static const gt_layer_type *const types[GT_LAYER_KIND_COUNT] = {GT_LAYER_KIND_LIST(GT_ROW_PTR)};

const gt_layer_type *gt_layer_type_of(gt_layer_kind kind) { return types[kind]; }

int gt_layer_kind_named(const char *name, gt_layer_kind *kind) {
    for (int k = 0; k < GT_LAYER_KIND_COUNT; k++)
        if (strcmp(types[k]->name, name) == 0) {
            *kind = (gt_layer_kind)k;
            return 1;
        }
    return 0;
}

size_t gt_layer_frozen_bytes(const gt_layer *layer) {
    const gt_layer_type *type = types[layer->kind];
    gt_frozen_piece pieces[GT_MAX_FROZEN_PIECES];
    size_t count = type->frozen ? type->frozen(layer, pieces) : 0;
    return count ? gt_align_up(pieces[count - 1].offset + pieces[count - 1].bytes) : 0;
}

const char *gt_layer_describe(char *buf, size_t bytes, const gt_layer *layer, const char *path) {
    const gt_layer_type *type = types[layer->kind];
    char text[128] = "";
    if (type->describe)
        type->describe(layer, text, sizeof text);
    if (text[0])
        snprintf(buf, bytes, "layer '%s' (%s)", path, text);
    else
        snprintf(buf, bytes, "layer '%s'", path);
    return buf;
}
