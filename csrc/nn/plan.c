/* The plan walk: shapes of every layer for one input shape, and the exact bytes of every
 * activation region. The same walk runs twice: once counting (base NULL), once assigning
 * pointers into the allocated arena, so the plan and the allocation cannot disagree. Every size
 * is checked (gt_size_*), so a shape too large for any memory fails with GT_ERR_OOM instead of
 * wrapping around; errors name the layer by its state_dict path, or the model's input. Each
 * layer is planned by its kind's row (nn/kind.h); the plans of the kinds that predate the table
 * are here, with the helpers every kind's plan may use (nn/plan.h). */
#include "nn/plan.h"
#include "nn/kind.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/threads.h"
#include "ops/checks.h"

gt_status gt_plan_take(gt_plan_cursor *cursor, size_t bytes, const char *what, void **out) {
    size_t aligned = 0, used = 0;
    GT_TRY(gt_size_align(bytes, what, &aligned));
    GT_TRY(gt_size_add(cursor->used, aligned, what, &used));
    *out = cursor->base ? cursor->base + cursor->used : NULL;
    cursor->used = used;
    return GT_OK;
}

gt_status gt_plan_constant(gt_plan_walk *w, const void *host, size_t bytes, const char *what, void **out) {
    GT_TRY(gt_plan_take(w->persistent, bytes, what, out));
    if (*out && w->fill)
        return w->fill(w->fill_ctx, *out, host, bytes);
    return GT_OK;
}

/* Notes the workspace of a GEMM as the layers run it: alpha 1, compact leading dimensions, and
 * beta 0, or both 0 and 1 when it may accumulate (native half GEMMs plan beta in their scratch). */
gt_status gt_plan_gemm_workspace(gt_plan_walk *w, int trans_a, int trans_b, int64_t m, int64_t n,
                                int64_t k, gt_dtype c_dt, int may_accumulate) {
    gt_gemm_args args = {.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                         .alpha = 1.0f, .a_dt = w->dt, .lda = trans_a ? m : k, .b_dt = w->dt,
                         .ldb = trans_b ? k : n, .c_dt = c_dt, .ldc = n, .batch = 1};
    for (int accumulate = 0; accumulate <= may_accumulate; accumulate++) {
        args.beta = accumulate ? 1.0f : 0.0f;
        size_t bytes = w->ops->gemm_workspace_bytes(&args);
        GT_TRY(gt_size_check(bytes, "workspace of a half-precision GEMM"));
        if (bytes > w->workspace_bytes)
            w->workspace_bytes = bytes;
    }
    return GT_OK;
}

gt_status gt_plan_check_features(gt_plan_walk *w, const gt_tensor *in, int64_t expected,
                                const gt_layer *layer, const char *path) {
    char name[GT_LAYER_PATH_BYTES + 64];
    gt_layer_describe(name, sizeof name, layer, path);
    if (in->dtype == GT_I64)
        return GT_FAIL(GT_ERR_TYPE, "model: %s takes floating-point features, but gets int64 ids; "
                       "only an Embedding can read ids", name);
    int64_t got = in->ndim ? in->shape[in->ndim - 1] : 0;
    if (in->ndim >= 1 && got == expected)
        return GT_OK;
    if (in == w->input)
        return GT_FAIL(GT_ERR_VALUE, "%s: expected %lld features (the size of the last dimension, "
                       "read by %s), got %lld", w->input_name, (long long)expected, name, (long long)got);
    return GT_FAIL(GT_ERR_VALUE, "model: %s expects %lld input features, but the layer before it "
                   "gives %lld; make the sizes of consecutive layers agree", name, (long long)expected,
                   (long long)got);
}

gt_status gt_plan_linear(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    GT_TRY(gt_plan_check_features(w, in, layer->in_features, layer, path));
    if (gt_linear_reads_half_table(layer) && gt_tokens_table_dtype(layer->tied) != w->dt) {
        char name[GT_LAYER_PATH_BYTES + 64];
        return GT_FAIL(GT_ERR_VALUE, "%s reads the %s table of the TokenEmbedding it is tied to as stored: the "
                       "model must compute in %s, not %s", gt_layer_describe(name, sizeof name, layer, path),
                       gt_dtype_name(gt_tokens_table_dtype(layer->tied)),
                       gt_dtype_name(gt_tokens_table_dtype(layer->tied)), gt_dtype_name(w->dt));
    }
    layer->out.shape[in->ndim - 1] = layer->out_features;
    int64_t rows = gt_rows_of(in);
    if (rows > INT_MAX) {
        char name[GT_LAYER_PATH_BYTES + 64];
        return GT_FAIL(GT_ERR_VALUE, "%s: %lld rows per micro-batch are more than the GEMMs of %s can "
                       "take (%d); use a smaller batch or more micro_batches",
                       w->input_name, (long long)rows, gt_layer_describe(name, sizeof name, layer, path), INT_MAX);
    }
    GT_TRY(gt_plan_gemm_workspace(w, 0, 1, rows, layer->out_features, layer->in_features, w->dt, 0));
    GT_TRY(gt_plan_gemm_workspace(w, 1, 0, layer->out_features, layer->in_features, rows, GT_F32, 1));
    return gt_plan_gemm_workspace(w, 0, 0, rows, layer->in_features, layer->out_features, w->dt, 0);
}

gt_status gt_plan_layernorm(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    gt_plan_cursor *region = site->region;
    GT_TRY(gt_plan_check_features(w, in, layer->in_features, layer, path));
    const char *what = "LayerNorm statistics";
    size_t stat_bytes = 0;
    GT_TRY(gt_size_mul((size_t)gt_rows_of(in), sizeof(float), what, &stat_bytes));
    void *mean = NULL, *rstd = NULL;
    GT_TRY(gt_plan_take(region, stat_bytes, what, &mean));
    GT_TRY(gt_plan_take(region, stat_bytes, what, &rstd));
    layer->mean = mean;
    layer->rstd = rstd;
    return GT_OK;
}

gt_status gt_plan_embedding(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    char name[GT_LAYER_PATH_BYTES + 64];
    if (in->dtype != GT_I64)
        return GT_FAIL(GT_ERR_TYPE, "model: %s reads int64 ids, but gets %s activations; an Embedding "
                       "must be the model's first layer", gt_layer_describe(name, sizeof name, layer, path),
                       gt_dtype_name(in->dtype));
    if (in->ndim + 1 > GT_MAX_DIMS)
        return GT_FAIL(GT_ERR_VALUE, "%s: ids of %d dimensions are too many for an Embedding (at most %d)",
                       w->input_name, in->ndim, GT_MAX_DIMS - 1);
    layer->out.ndim = in->ndim + 1;
    layer->out.shape[in->ndim] = layer->embedding_dim;
    return GT_OK;
}

/* PositionEmbedding adds rows [0, T) of its table to a (..., T, C) input: T is the
 * second-to-last dimension, 1 <= T <= num_positions. */
gt_status gt_plan_position(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    char name[GT_LAYER_PATH_BYTES + 64];
    GT_TRY(gt_plan_check_features(w, in, layer->embedding_dim, layer, path));
    gt_layer_describe(name, sizeof name, layer, path);
    if (in->ndim < 2)
        return GT_FAIL(GT_ERR_VALUE, "model: %s takes (..., seq, embedding_dim) inputs, but gets %d "
                       "dimension(s)", name, in->ndim);
    int64_t seq = in->shape[in->ndim - 2], room = layer->num_embeddings - layer->position_offset;
    if (seq < 1 || seq > room)
        return GT_FAIL(GT_ERR_VALUE, "%s: a sequence of %lld positions does not fit %s, which has "
                       "positions 0..%lld (table rows from %lld); crop the sequences to at most %lld tokens",
                       w->input_name, (long long)seq, name, (long long)room - 1,
                       (long long)layer->position_offset, (long long)(room > 0 ? room : 0));
    return GT_OK;
}

/* Attention reads the fused (B, T, (H + 2K) D) projection and writes (B, T, H D); it keeps (B, H, T) f32
 * log-sum-exps for backward and notes its scratch in the workspace. A backend without the op is
 * refused here, before anything runs. */
gt_status gt_plan_attention(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    gt_plan_cursor *region = site->region;
    char name[GT_LAYER_PATH_BYTES + 96];
    gt_layer_describe(name, sizeof name, layer, path);
    if (!w->ops->attention_forward || !w->ops->attention_backward || !w->ops->attention_workspace_bytes)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run "
                       "this model on the CPU", name, w->ops->name);
    GT_TRY(gt_plan_check_features(w, in, gt_attention_in_width(layer), layer, path));
    if (in->ndim != 3)
        return GT_FAIL(GT_ERR_VALUE, "model: %s takes (batch, seq, embed_dim) inputs, but gets %d "
                       "dimensions", name, in->ndim);
    layer->out.shape[2] = gt_attention_out_width(layer);
    gt_attention_args args = gt_attention_layer_args(layer, in);
    size_t stats = 0, bytes = w->ops->attention_workspace_bytes(&args, gt_get_num_threads());
    GT_TRY(gt_size_check(bytes, "the workspace of attention"));
    if (bytes > w->workspace_bytes)
        w->workspace_bytes = bytes;
    const char *what = "attention statistics";
    GT_TRY(gt_size_mul((size_t)gt_rows_of(in), (size_t)layer->num_heads * sizeof(float), what, &stats));
    void *lse = NULL;
    GT_TRY(gt_plan_take(region, stats, what, &lse));
    layer->lse = lse;
    return GT_OK;
}

/* A backend without the mask and pooling ops is refused before anything runs. */
static gt_status check_sequence_ops(const gt_plan_walk *w, const char *name) {
    if (w->ops->mask_lengths && w->ops->pool_forward && w->ops->pool_backward && w->ops->key_starts)
        return GT_OK;
    return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run this "
                   "model on the CPU", name, w->ops->name);
}

/* Takes an int64 buffer of `count` elements from the site's region. */
static gt_status take_int64(const gt_plan_site *site, int64_t count, const char *what, int64_t **out) {
    size_t bytes = 0;
    void *ptr = NULL;
    GT_TRY(gt_size_mul((size_t)count, sizeof(int64_t), what, &bytes));
    GT_TRY(gt_plan_take(site->region, bytes, what, &ptr));
    *out = ptr;
    return GT_OK;
}

/* The buffers of a Tokens layer with position ids (B, T) key starts, and the position channel
 * every Rope reads; with a pad_token_id, (B,) last tokens. */
static gt_status plan_tokens_decoder(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                                     const gt_plan_site *site) {
    int64_t batch = in->shape[0], channels = in->shape[1], seq = in->shape[2];
    layer->key_starts = layer->last_tokens = NULL;
    if (gt_tokens_has_positions(layer)) {
        GT_TRY(take_int64(site, batch * seq, "key starts", &layer->key_starts));
        w->has_positions = 1;
        w->positions_offset = (channels - 1) * seq;
        w->positions_stride = channels * seq;
        w->key_starts = layer->key_starts;
    }
    if (gt_tokens_pad_token_id(layer) >= 0) {
        GT_TRY(take_int64(site, batch, "last tokens", &layer->last_tokens));
        w->last_tokens = layer->last_tokens;
    }
    return GT_OK;
}

/* A 4-bit table's decoding table, placed once (the lookup reads it on the device). */
static gt_status plan_tokens_code(gt_plan_walk *w, gt_layer *layer, const char *name) {
    if (gt_tokens_table_dtype(layer) != GT_U8)
        return GT_OK;
    if (!w->ops->quantized_embedding_forward)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s with a 4-bit table has no implementation on the '%s' backend "
                       "yet; run this model on the CPU", name, w->ops->name);
    float table[16];
    void *placed = NULL;
    gt_quant4_code_table(gt_tokens_nf4(layer), table);
    GT_TRY(gt_plan_constant(w, table, sizeof table, "the code table of a TokenEmbedding", &placed));
    layer->quant_code = placed;
    return GT_OK;
}

/* Tokens reads (B, C, T) int64 with C = 1 + (token types) + (mask) + (position ids) and writes
 * (B, T, E); with a mask (and no position ids) it keeps (B,) lengths, which every later Attention
 * and Pool layer reads; with position ids (B, T) key starts; with a pad_token_id (B,) last tokens. */
gt_status gt_plan_tokens(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    char name[GT_LAYER_PATH_BYTES + 64];
    gt_layer_describe(name, sizeof name, layer, path);
    GT_TRY(check_sequence_ops(w, name));
    int positions = gt_tokens_has_positions(layer);
    int64_t channels = 1 + (layer->type_vocab > 0) + layer->has_mask + positions;
    if (in->dtype != GT_I64 || in != w->input)
        return GT_FAIL(GT_ERR_TYPE, "model: %s reads the model's int64 input; it must be the model's "
                       "first layer", name);
    if (in->ndim != 3 || in->shape[1] != channels || in->shape[2] < 1)
        return GT_FAIL(GT_ERR_VALUE, "%s: %s reads (batch, %lld, seq) int64 rows (token ids%s%s%s) with "
                       "seq >= 1, got %d dimensions%s", w->input_name, name, (long long)channels,
                       layer->type_vocab ? ", token types" : "", layer->has_mask ? ", attention mask" : "",
                       positions ? ", position ids" : "", in->ndim, in->ndim == 3 ? " of another size" : "");
    layer->out.ndim = 3;
    layer->out.dtype = w->dt;
    layer->out.shape[1] = in->shape[2];
    layer->out.shape[2] = layer->embedding_dim;
    GT_TRY(plan_tokens_decoder(w, layer, in, site));
    GT_TRY(plan_tokens_code(w, layer, name));
    if (layer->type_vocab > 0) {  /* forward adds the token-type rows of an entry from a scratch buffer */
        gt_tensor types = {.dtype = w->dt, .ndim = 2, .shape = {in->shape[2], layer->embedding_dim}};
        GT_TRY(gt_plan_note_scratch(w, site->level, &types));
    }
    if (!layer->has_mask || positions)
        return GT_OK;
    size_t bytes = 0;
    void *lengths = NULL;
    GT_TRY(gt_size_mul((size_t)in->shape[0], sizeof(int64_t), "sequence lengths", &bytes));
    GT_TRY(gt_plan_take(site->region, bytes, "sequence lengths", &lengths));
    layer->lengths = lengths;
    w->key_lengths = lengths;
    w->masked = 1;
    return GT_OK;
}

/* A (B, T, E) input as the Pool layer reads. */
static gt_status check_sequence_input(gt_plan_walk *w, const gt_layer *layer, const gt_tensor *in,
                                      int64_t dim, const char *what, const char *path) {
    char name[GT_LAYER_PATH_BYTES + 64];
    gt_layer_describe(name, sizeof name, layer, path);
    GT_TRY(check_sequence_ops(w, name));
    GT_TRY(gt_plan_check_features(w, in, dim, layer, path));
    if (in->ndim != 3)
        return GT_FAIL(GT_ERR_VALUE, "model: %s takes (batch, seq, %s) inputs, but gets %d dimensions",
                       name, what, in->ndim);
    if (in->shape[1] < 1)
        return GT_FAIL(GT_ERR_VALUE, "%s: pooling needs sequences of at least one position", w->input_name);
    return GT_OK;
}

/* Conv2d reads (N, C, H, W) with C = in_channels, and a kernel that fits the padded input; the
 * output is (N, O, OH, OW). Its column tiles are workspace. A backend without the op is refused
 * here, before anything runs. */
gt_status gt_plan_conv2d(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    char name[GT_LAYER_PATH_BYTES + 96];
    gt_layer_describe(name, sizeof name, layer, path);
    const gt_ops *ops = w->ops;
    if (!ops->conv2d_forward || !ops->conv2d_backward || !ops->conv2d_workspace_bytes)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run "
                       "this model on the CPU", name, ops->name);
    if (in->dtype == GT_I64)
        return GT_FAIL(GT_ERR_TYPE, "model: %s takes floating-point images, but gets int64 ids; only an "
                       "Embedding can read ids", name);
    const char *who = in == w->input ? w->input_name : "model";
    if (in->ndim != 4)
        return GT_FAIL(GT_ERR_VALUE, "%s: %s takes (batch, channels, height, width) inputs, but gets %d "
                       "dimension%s", who, name, in->ndim, in->ndim == 1 ? "" : "s");
    if (in->shape[1] != layer->in_features)
        return GT_FAIL(GT_ERR_VALUE, "%s: %s expects %lld input channels (dimension 1), but %s %lld",
                       who, name, (long long)layer->in_features,
                       in == w->input ? "the input has" : "the layer before it gives", (long long)in->shape[1]);
    gt_conv2d_args args = gt_conv2d_layer_args(layer, in);
    for (int d = 0; d < 2; d++) {
        /* configuration <= INT_MAX (the spec parser), so nothing here overflows */
        int64_t size = in->shape[2 + d], span = layer->dilation[d] * (layer->kernel[d] - 1) + 1;
        if (span - 2 * layer->padding[d] > size)
            return GT_FAIL(GT_ERR_VALUE, "%s: %s: the input's %s %lld (%lld with padding) is smaller "
                           "than the kernel's %lld (kernel_size %lld, dilation %lld)", who, name,
                           d ? "width" : "height", (long long)size, (long long)(size + 2 * layer->padding[d]),
                           (long long)span, (long long)layer->kernel[d], (long long)layer->dilation[d]);
    }
    gt_conv2d_args sizes = args;
    sizes.batch = 0;  /* the sizes only: no pointers yet */
    if (gt_conv2d_check(&sizes, 0) != GT_OK) {
        char message[256];
        snprintf(message, sizeof message, "%s", gt_error_message());
        return GT_FAIL(GT_ERR_VALUE, "%s: %s: %s", who, name, message);
    }
    layer->out.shape[1] = layer->out_features;
    layer->out.shape[2] = gt_conv2d_out_h(&args);
    layer->out.shape[3] = gt_conv2d_out_w(&args);
    args.dt = w->dt;
    size_t bytes = ops->conv2d_workspace_bytes(&args, gt_get_num_threads());
    GT_TRY(gt_size_check(bytes, "the workspace of a convolution"));
    if (bytes > w->workspace_bytes)
        w->workspace_bytes = bytes;
    return GT_OK;
}

/* An NCHW layer's input: 4 floating-point dimensions (C = `channels` when positive). */
static gt_status check_nchw(gt_plan_walk *w, const gt_tensor *in, int64_t channels,
                            const gt_layer *layer, const char *path, int has_ops) {
    char name[GT_LAYER_PATH_BYTES + 64];
    gt_layer_describe(name, sizeof name, layer, path);
    if (in->dtype == GT_I64)
        return GT_FAIL(GT_ERR_TYPE, "model: %s takes floating-point values, but gets int64 ids; only an "
                       "Embedding can read ids", name);
    const char *source = in == w->input ? w->input_name : "model";
    if (in->ndim != 4)
        return GT_FAIL(GT_ERR_VALUE, "%s: %s takes (N, C, H, W) inputs, but gets %d dimensions", source,
                       name, in->ndim);
    if (channels > 0 && in->shape[1] != channels)
        return GT_FAIL(GT_ERR_VALUE, "%s: %s expects %lld channels (dimension 1), got %lld", source, name,
                       (long long)channels, (long long)in->shape[1]);
    if (!has_ops)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s has no implementation on the '%s' backend yet; run "
                       "this model on the CPU", name, w->ops->name);
    return GT_OK;
}

/* BatchNorm2d keeps the (C,) f32 mean and rstd it normalised with for backward. */
gt_status gt_plan_batchnorm2d(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    gt_plan_cursor *region = site->region;
    const gt_ops *ops = w->ops;
    GT_TRY(check_nchw(w, in, layer->in_features, layer, path, ops->batchnorm_forward && ops->batchnorm_backward));
    const char *what = "BatchNorm2d statistics";
    void *mean = NULL, *rstd = NULL;
    GT_TRY(gt_plan_take(region, (size_t)layer->in_features * sizeof(float), what, &mean));
    GT_TRY(gt_plan_take(region, (size_t)layer->in_features * sizeof(float), what, &rstd));
    layer->mean = mean;
    layer->rstd = rstd;
    return GT_OK;
}

/* PyTorch's pooling output size along one dimension (pooling_output_shape), or < 1. */
static int64_t pool_out_size(int64_t size, int64_t k, int64_t pad, int64_t stride, int64_t dil, int ceil_mode) {
    int64_t span = size + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
    int64_t out = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
    if (ceil_mode && (out - 1) * stride >= size + pad)
        out--;
    return out;
}

/* Pooling: the output size from the window (adaptive: as configured), MAX's saved maxima, and
 * the f32 planes its half-precision backward accumulates in, noted in the workspace. */
gt_status gt_plan_pool2d(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    const char *path = site->path;
    gt_plan_cursor *region = site->region;
    const gt_ops *ops = w->ops;
    GT_TRY(check_nchw(w, in, 0, layer, path,
                      ops->pool2d_forward && ops->pool2d_backward && ops->pool2d_workspace_bytes));
    gt_pool2d_args *a = &layer->pool2d;
    a->n = in->shape[0];
    a->c = in->shape[1];
    a->h = in->shape[2];
    a->w = in->shape[3];
    a->dt = w->dt;
    if (a->kind != GT_POOL_ADAPTIVE_AVG) {
        a->out_h = pool_out_size(a->h, a->kernel[0], a->padding[0], a->stride[0], a->dilation[0], layer->ceil_mode);
        a->out_w = pool_out_size(a->w, a->kernel[1], a->padding[1], a->stride[1], a->dilation[1], layer->ceil_mode);
    }
    if (a->out_h < 1 || a->out_w < 1 || a->h < 1 || a->w < 1) {
        char name[GT_LAYER_PATH_BYTES + 64];
        return GT_FAIL(GT_ERR_VALUE, "%s: %s gets a %lld x %lld input and would give a %lld x %lld output; "
                       "the input is too small for its kernel_size, padding and dilation",
                       in == w->input ? w->input_name : "model", gt_layer_describe(name, sizeof name, layer, path),
                       (long long)a->h, (long long)a->w, (long long)a->out_h, (long long)a->out_w);
    }
    layer->out.shape[2] = a->out_h;
    layer->out.shape[3] = a->out_w;
    if (a->kind == GT_POOL_MAX) {  /* (N, C, OH, OW) int32 offsets of the maxima, for backward */
        char name[GT_LAYER_PATH_BYTES + 64];
        if (a->h * a->w > INT32_MAX)
            return GT_FAIL(GT_ERR_VALUE, "%s: %s gets planes of %lld x %lld elements, more than int32 offsets "
                           "can index", in == w->input ? w->input_name : "model",
                           gt_layer_describe(name, sizeof name, layer, path), (long long)a->h, (long long)a->w);
        const char *what = "the maxima of MaxPool2d";
        size_t bytes = 0;
        void *argmax = NULL;
        GT_TRY(gt_size_mul(gt_tensor_numel(&layer->out), sizeof(int32_t), what, &bytes));
        GT_TRY(gt_plan_take(region, bytes, what, &argmax));
        a->argmax = argmax;
    }
    size_t bytes = w->ops->pool2d_workspace_bytes(a, gt_get_num_threads());
    GT_TRY(gt_size_check(bytes, "the workspace of pooling"));
    if (bytes > w->workspace_bytes)
        w->workspace_bytes = bytes;
    return GT_OK;
}

/* Activation, Dropout: elementwise over floating-point values; the output is shaped as the input. */
gt_status gt_plan_elementwise(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                              const gt_plan_site *site) {
    if (in->dtype == GT_I64)
        return GT_FAIL(GT_ERR_TYPE, "model: layer '%s' takes floating-point values, but gets int64 "
                       "ids; only an Embedding can read ids", site->path);
    return GT_OK;
}

/* Pool: (B, T, E) -> (B, E). */
gt_status gt_plan_pool(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    GT_TRY(check_sequence_input(w, layer, in, in->ndim ? in->shape[in->ndim - 1] : 0, "dim", site->path));
    layer->out.ndim = 2;
    layer->out.shape[1] = in->shape[2];
    return GT_OK;
}

/* Flatten: a view, no buffer of its own. Its output's gradient (the size of its input, which may
 * be the model's input, an activation of no layer) is written into a scratch buffer by the layer
 * after it: its container notes it (plan_children), as every child's output. */
gt_status gt_plan_flatten(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                          const gt_plan_site *site) {
    if (in->ndim < 1)
        return GT_FAIL(GT_ERR_VALUE, "model: Flatten needs an input of at least one dimension");
    size_t rest = 1;
    for (int i = 1; i < in->ndim; i++)
        GT_TRY(gt_size_mul(rest, (size_t)in->shape[i], "Flatten: the flattened size", &rest));
    layer->out.ndim = in->ndim >= 2 ? 2 : 1;
    layer->out.shape[0] = in->shape[0];
    layer->out.shape[1] = (int64_t)rest;
    return GT_OK;
}

/* The dotted name of child i of a container named `path`. */
static void child_path(char *buf, size_t bytes, const char *path, size_t i) {
    snprintf(buf, bytes, "%s%s%zu", path, path[0] ? "." : "", i);
}

gt_status gt_plan_note_scratch(gt_plan_walk *w, int level, const gt_tensor *t) {
    size_t bytes = 0;
    if (t->dtype == GT_I64 || level < 0)
        return GT_OK;
    GT_TRY(gt_tensor_checked_bytes(t, "a gradient in the backward scratch", &bytes));
    if (bytes > w->level_scratch_bytes[level])
        w->level_scratch_bytes[level] = bytes;
    return GT_OK;
}

/* With offloaded checkpoints (GT_CHECKPOINT_OFFLOAD), a run of checkpointed units side by side (a
 * decoder's layers; at least GT_OFFLOAD_MIN_RUN of them) keeps the outputs of all but its last
 * unit in pinned host memory: on the device they share two slots, which the units take in turn
 * (nn/container.c copies each output to the host after its forward, and back before the backward
 * of the unit that reads it). The run's last unit keeps a buffer of its own, since what follows
 * it may read it at any time. */
typedef struct gt_offload_slots {
    void *ptr[2];  /* the two device slots, (bytes) each */
    size_t bytes;  /* the size of each; 0: no run in progress */
    int next;      /* the slot the run's next unit takes */
} gt_offload_slots;

/* Residual and Checkpoint: units of gradient checkpointing. */
static int is_unit(const gt_layer *layer) {
    return layer->kind == GT_LAYER_RESIDUAL || layer->kind == GT_LAYER_CHECKPOINT;
}

enum { GT_OFFLOAD_MIN_RUN = 4 };  /* units a run needs to be offloaded: two slots must replace more
                                     than two of its outputs (GPT-2's blocks pair two Residuals: no) */

/* 1 when child i of `seq` offloads its output: a checkpointed unit followed by another, in a run of
 * at least GT_OFFLOAD_MIN_RUN units side by side. */
static int offloads_output(const gt_plan_walk *w, const gt_layer *seq, size_t i, int inside_checkpoint) {
    size_t n = seq->num_children, start = i, end = i + 1;
    if (w->checkpointing != GT_CHECKPOINT_OFFLOAD || inside_checkpoint || end >= n ||
        !is_unit(&seq->children[i]) || !is_unit(&seq->children[end]))
        return 0;
    while (start > 0 && is_unit(&seq->children[start - 1]))
        start--;
    while (end < n && is_unit(&seq->children[end]))
        end++;
    return end - start >= GT_OFFLOAD_MIN_RUN;
}

/* The children of a Sequential at nesting `level`, one after another; its output is its last
 * child's (no buffer of its own). Backward writes the gradient of each child's output but the
 * last's (a layer's, a container's, a Flatten's view) into a scratch buffer of this level
 * (nn/container.c); the last one's is the caller's. */
static gt_status plan_children(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                               int level, int inside_checkpoint, const char *path,
                               gt_plan_cursor *region) {
    if (level >= GT_MAX_NESTING)
        return GT_FAIL(GT_ERR_VALUE, "model: layers nest deeper than %d levels", GT_MAX_NESTING);
    if (level + 1 > w->levels)
        w->levels = level + 1;
    const gt_tensor *cur = in;
    gt_offload_slots slots = {0};  /* the current run of offloaded units' */
    const gt_layer *outer = w->offloaded;  /* this Sequential's own unit (planned by the caller) */
    gt_offload_slots *outer_slots = w->slots;
    for (size_t i = 0; i < layer->num_children; i++) {
        char name[GT_LAYER_PATH_BYTES];
        child_path(name, sizeof name, path, i);
        gt_layer *child = &layer->children[i];
        child->level = level;
        child->offload_host = NULL;
        int offloaded = offloads_output(w, layer, i, inside_checkpoint);
        if (!offloaded)
            slots.bytes = 0;  /* the run, if any, ends: a later one takes slots of its own */
        w->offloaded = offloaded ? child : NULL;
        w->slots = &slots;
        gt_status status = gt_plan_layer(w, child, cur, level, inside_checkpoint, name, region);
        w->offloaded = outer;
        w->slots = outer_slots;
        GT_TRY(status);
        if (i + 1 < layer->num_children)
            GT_TRY(gt_plan_note_scratch(w, level, &layer->children[i].out));
        cur = &layer->children[i].out;
    }
    layer->out = *cur;
    return GT_OK;
}

gt_status gt_plan_sequential(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                             const gt_plan_site *site) {
    return plan_children(w, layer, in, site->level + 1, site->inside_checkpoint, site->path, site->region);
}

/* The block of a Residual or Checkpoint one level deeper: when checkpointing and not inside a
 * checkpointed unit already, in the shared recompute region (the unit keeps only its input and its
 * own output; backward runs the block again), else in the site's region. */
static gt_status plan_unit_block(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    gt_layer *block = &layer->children[0];
    char name[GT_LAYER_PATH_BYTES];
    snprintf(name, sizeof name, "%s%sblock", site->path, site->path[0] ? "." : "");
    layer->checkpointed = w->checkpointing && !site->inside_checkpoint;
    if (!layer->checkpointed)
        return plan_children(w, block, in, site->level + 1, site->inside_checkpoint, name, site->region);
    gt_plan_cursor recompute = {w->recompute_base, 0};
    GT_TRY(plan_children(w, block, in, site->level + 1, 1, name, &recompute));
    if (recompute.used > w->recompute_bytes)
        w->recompute_bytes = recompute.used;
    return GT_OK;
}

static gt_status take_output(gt_plan_walk *w, gt_layer *layer, const gt_plan_site *site);

/* Checkpoint: its block (a unit of gradient checkpointing: the Residuals inside are recomputed
 * with it instead of each keeping its own input). Checkpointed, it has an output buffer of its own,
 * a copy of the block's output, which is in the recompute region; otherwise its output is the
 * block's (no buffer, as a Sequential's). */
gt_status gt_plan_checkpoint(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    GT_TRY(plan_unit_block(w, layer, in, site));
    layer->out = layer->children[0].out;
    if (!layer->checkpointed)
        return GT_OK;
    layer->out.ptr = NULL;
    return take_output(w, layer, site);
}

/* Residual: its block one level deeper (recomputed in backward when checkpointed), then its own
 * output buffer; the block must keep the input's shape. */
gt_status gt_plan_residual(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                           const gt_plan_site *site) {
    gt_layer *block = &layer->children[0];
    GT_TRY(plan_unit_block(w, layer, in, site));
    if (block->out.ndim != in->ndim ||
        memcmp(block->out.shape, in->shape, sizeof(int64_t) * (size_t)in->ndim) != 0) {
        char what[GT_LAYER_PATH_BYTES + 64];
        return GT_FAIL(GT_ERR_VALUE, "model: the block of %s changes the shape of its input (last "
                       "dimension %lld -> %lld); a Residual's block must keep its input's shape",
                       gt_layer_describe(what, sizeof what, layer, site->path),
                       in->ndim ? (long long)in->shape[in->ndim - 1] : 0LL,
                       block->out.ndim ? (long long)block->out.shape[block->out.ndim - 1] : 0LL);
    }
    return GT_OK;
}

/* An offloaded unit's output: a slot of its run (the run's first unit, or one whose output is of
 * another size, takes two new slots of its size from the site's region; the units then take them
 * in turn), and its host copy in the offload region. */
static gt_status take_slot(gt_plan_walk *w, gt_layer *layer, const gt_plan_site *site, size_t bytes,
                           const char *what) {
    gt_offload_slots *slots = w->slots;
    if (slots->bytes != bytes) {
        for (int k = 0; k < 2; k++)
            GT_TRY(gt_plan_take(site->region, bytes, what, &slots->ptr[k]));
        slots->bytes = bytes;
        slots->next = 0;
    }
    layer->out.ptr = slots->ptr[slots->next];
    slots->next ^= 1;
    gt_plan_cursor host = {w->offload_base, w->offload_bytes};
    GT_TRY(gt_plan_take(&host, bytes, what, &layer->offload_host));
    w->offload_bytes = host.used;
    return GT_OK;
}

/* The layer's own output buffer in the site's region (an offloaded unit's: a slot). */
static gt_status take_output(gt_plan_walk *w, gt_layer *layer, const gt_plan_site *site) {
    char what[GT_LAYER_PATH_BYTES + 96];
    snprintf(what, sizeof what, "%s: the activations of layer '%s'", w->input_name, site->path);
    size_t bytes = 0;
    void *ptr = NULL;
    GT_TRY(gt_tensor_checked_bytes(&layer->out, what, &bytes));
    if (layer == w->offloaded)
        return take_slot(w, layer, site, bytes, what);
    GT_TRY(gt_plan_take(site->region, bytes, what, &ptr));
    layer->out.ptr = ptr;
    return GT_OK;
}

gt_status gt_plan_layer(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, int level,
                        int inside_checkpoint, const char *path, gt_plan_cursor *region) {
    const gt_layer_type *type = gt_layer_type_of(layer->kind);
    const gt_plan_site site = {path, level, inside_checkpoint, region};
    layer->in_shape = *in;
    layer->in_shape.ptr = NULL;
    layer->out = *in;
    layer->out.dtype = w->dt;
    layer->out.ptr = NULL;
    GT_TRY(type->plan(w, layer, in, &site));
    return type->flags & GT_KIND_NO_BUFFER ? GT_OK : take_output(w, layer, &site);
}
