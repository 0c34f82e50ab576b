/* The plan walk: shapes of every layer for one input shape, and the exact bytes of every
 * activation region. The same walk runs twice: once counting (base NULL), once assigning
 * pointers into the allocated arena, so the plan and the allocation cannot disagree. */
#include "nn/plan.h"

#include <string.h>

static void *cursor_take(gt_plan_cursor *cursor, size_t bytes) {
    void *ptr = cursor->base ? cursor->base + cursor->used : NULL;
    cursor->used += gt_align_up(bytes);
    return ptr;
}

static size_t tensor_bytes(const gt_tensor *t) { return gt_tensor_bytes(t); }

/* Notes the workspace of a GEMM as the layers run it: alpha 1, compact leading dimensions, and
 * beta 0, or both 0 and 1 when it may accumulate (native half GEMMs plan beta in their scratch). */
static void note_workspace(gt_plan_walk *w, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, gt_dtype a_dt, gt_dtype b_dt, gt_dtype c_dt,
                           int may_accumulate) {
    gt_gemm_args args = {.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                         .alpha = 1.0f, .a_dt = a_dt, .lda = trans_a ? m : k, .b_dt = b_dt,
                         .ldb = trans_b ? k : n, .c_dt = c_dt, .ldc = n, .batch = 1};
    for (int accumulate = 0; accumulate <= may_accumulate; accumulate++) {
        args.beta = accumulate ? 1.0f : 0.0f;
        size_t bytes = w->ops->gemm_workspace_bytes(&args);
        if (bytes > w->workspace_bytes)
            w->workspace_bytes = bytes;
    }
}

static gt_status check_last_dim(const gt_tensor *in, int64_t expected, const char *what) {
    if (in->ndim < 1 || in->shape[in->ndim - 1] != expected)
        return GT_FAIL(GT_ERR_VALUE, "input: %s expects a last dimension of %lld, got %lld", what,
                       (long long)expected, in->ndim ? (long long)in->shape[in->ndim - 1] : 0LL);
    if (in->dtype == GT_I64)
        return GT_FAIL(GT_ERR_TYPE, "input: %s expects floating-point input, got integer ids", what);
    return GT_OK;
}

static gt_status plan_linear(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in) {
    GT_TRY(check_last_dim(in, layer->in_features, "Linear"));
    layer->out.shape[in->ndim - 1] = layer->out_features;
    int64_t rows = gt_rows_of(in);
    gt_dtype wdt = w->dt;
    note_workspace(w, 0, 1, rows, layer->out_features, layer->in_features, w->dt, wdt, w->dt, 0);
    note_workspace(w, 1, 0, layer->out_features, layer->in_features, rows, w->dt, w->dt, GT_F32,
                   1);
    note_workspace(w, 0, 0, rows, layer->in_features, layer->out_features, w->dt, wdt, w->dt, 0);
    return GT_OK;
}

static gt_status plan_layernorm(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                                gt_plan_cursor *region) {
    GT_TRY(check_last_dim(in, layer->in_features, "LayerNorm"));
    size_t stat_bytes = (size_t)gt_rows_of(in) * sizeof(float);
    layer->mean = cursor_take(region, stat_bytes);
    layer->rstd = cursor_take(region, stat_bytes);
    return GT_OK;
}

static gt_status plan_embedding(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in) {
    if (in->dtype != GT_I64)
        return GT_FAIL(GT_ERR_TYPE, "input: Embedding expects int64 ids, got %s",
                       gt_dtype_name(in->dtype));
    if (in->ndim + 1 > GT_MAX_DIMS)
        return GT_FAIL(GT_ERR_VALUE, "input: too many dimensions for Embedding (%d)", in->ndim);
    layer->out.ndim = in->ndim + 1;
    layer->out.shape[in->ndim] = layer->embedding_dim;
    return GT_OK;
}

static gt_status plan_flatten(gt_layer *layer, const gt_tensor *in) {
    if (in->ndim < 1)
        return GT_FAIL(GT_ERR_VALUE, "input: Flatten needs at least one dimension");
    int64_t rest = 1;
    for (int i = 1; i < in->ndim; i++)
        rest *= in->shape[i];
    layer->out.ndim = in->ndim >= 2 ? 2 : 1;
    layer->out.shape[0] = in->shape[0];
    layer->out.shape[1] = rest;
    return GT_OK;
}

static gt_status plan_sequential(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                                 int level, int inside_checkpoint, gt_plan_cursor *region) {
    if (level >= GT_MAX_NESTING)
        return GT_FAIL(GT_ERR_VALUE, "model nests deeper than %d levels", GT_MAX_NESTING);
    if (level + 1 > w->levels)
        w->levels = level + 1;
    const gt_tensor *cur = in;
    for (size_t i = 0; i < layer->num_children; i++) {
        layer->children[i].level = level;
        GT_TRY(gt_plan_layer(w, &layer->children[i], cur, level, inside_checkpoint, region));
        cur = &layer->children[i].out;
    }
    layer->out = *cur;
    return GT_OK;
}

static gt_status plan_residual(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, int level,
                               int inside_checkpoint, gt_plan_cursor *region) {
    gt_layer *block = &layer->children[0];
    layer->checkpointed = w->checkpointing && !inside_checkpoint;
    if (layer->checkpointed) {
        gt_plan_cursor recompute = {w->recompute_base, 0};
        GT_TRY(plan_sequential(w, block, in, level + 1, 1, &recompute));
        if (recompute.used > w->recompute_bytes)
            w->recompute_bytes = recompute.used;
    } else {
        GT_TRY(plan_sequential(w, block, in, level + 1, inside_checkpoint, region));
    }
    if (block->out.ndim != in->ndim || memcmp(block->out.shape, in->shape, sizeof(int64_t) * (size_t)in->ndim) != 0)
        return GT_FAIL(GT_ERR_VALUE, "Residual: the block must keep the input shape");
    return GT_OK;
}

gt_status gt_plan_layer(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, int level,
                        int inside_checkpoint, gt_plan_cursor *region) {
    layer->in_shape = *in;
    layer->in_shape.ptr = NULL;
    layer->out = *in;
    layer->out.dtype = w->dt;
    layer->out.ptr = NULL;
    switch (layer->kind) {
    case GT_LAYER_LINEAR: GT_TRY(plan_linear(w, layer, in)); break;
    case GT_LAYER_ACTIVATION:
    case GT_LAYER_DROPOUT:
        if (in->dtype == GT_I64)
            return GT_FAIL(GT_ERR_TYPE, "input: elementwise layers expect floating-point input");
        break;
    case GT_LAYER_LAYERNORM: GT_TRY(plan_layernorm(w, layer, in, region)); break;
    case GT_LAYER_EMBEDDING: GT_TRY(plan_embedding(w, layer, in)); break;
    case GT_LAYER_FLATTEN: return plan_flatten(layer, in);  /* a view: no buffer */
    case GT_LAYER_SEQUENTIAL:
        return plan_sequential(w, layer, in, level + 1, inside_checkpoint, region);
    case GT_LAYER_RESIDUAL:
        GT_TRY(plan_residual(w, layer, in, level, inside_checkpoint, region));
        break;
    }
    size_t bytes = tensor_bytes(&layer->out);
    layer->out.ptr = cursor_take(region, bytes);
    if (bytes > w->max_activation_bytes)
        w->max_activation_bytes = bytes;
    return GT_OK;
}
