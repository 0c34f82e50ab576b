/* Disentangled attention: DeBERTa-v2/v3's DisentangledSelfAttention after its q, k, v
 * projections. Spec: ("disentangled_attention", embed_dim, num_heads, dropout, span, buckets,
 * max_position, c2p, p2c, [block]). Input (B, T, 3E) [q | k | v] (a Parallel of the three
 * projections, as the attention kind's), output (B, T, E), H heads of D = E / H.
 *
 * The relative-position rows come from the block, run on a (1, 2S, E) input of zeros placed by
 * the plan: DeBERTa's Position (the rel_embeddings table: zeros + rows 0..2S-1), LayerNorm
 * (norm_rel_ebd), Dropout (pos_dropout), and a Parallel of the projections giving
 * (1, 2S, P E) = [pos_key (c2p) | pos_query (p2c)] (P = c2p + p2c): the layer's own key/query
 * Linears again (share_att_key: ("tied", i) uses) or pos_key_proj / pos_query_proj. The block's
 * modules are ordinary layers, so the table, its LayerNorm and the projections are laid out,
 * shared across layers (tied uses) and get their gradients as any layer's; the block runs every
 * forward (its cost is 2S rows, no batch) and its backward takes dpos_k | dpos_q from the op.
 *
 * rel_index[i - j + T - 1] = clamp(bucket(i - j) + S, 0, 2S - 1), built on the host by the plan
 * and placed once: bucket(r) = r without buckets (buckets 0), else transformers'
 * make_log_bucket_position(r, buckets, max_position) in its f32 arithmetic. The op (ops.h
 * disentangled_forward/backward) computes softmax(scale (q k + c2p + p2c)) v with
 * scale = 1 / sqrt(D (1 + c2p + p2c)); keys past a sequence's length (the attention mask) are
 * masked; the dropout key of the probabilities is the attention kind's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"
#include "nn/kind.h"

/* The kind's own hyper-parameters, then what its plan places (in gt_layer.config). */
typedef struct disentangled_config {
    int64_t span;          /* S: the block gives 2S rows */
    int64_t buckets;       /* position_buckets: 0 none, else >= 2 (log buckets) */
    int64_t max_position;  /* max_relative_positions of the log buckets */
    int c2p, p2c;          /* 1 when the term is present */
    int32_t *rel_index;    /* plan: (2T - 1,) int32 in the persistent region */
    void *zeros;           /* plan: (1, 2S, E) zeros, the block's input */
    void *dpos;            /* plan: (1, 2S, P E) the block's output gradient */
} disentangled_config;
_Static_assert(sizeof(disentangled_config) <= GT_LAYER_CONFIG_BYTES, "the config fits gt_layer.config");

static disentangled_config config_of(const gt_layer *layer) {
    disentangled_config c;
    memcpy(&c, layer->config, sizeof c);
    return c;
}

static int64_t terms_of(const disentangled_config *c) { return (int64_t)c->c2p + c->p2c; }

/* transformers' make_log_bucket_position for one relative position r, in its f32 arithmetic. */
static int64_t log_bucket(int64_t r, int64_t buckets, int64_t max_position) {
    int64_t mid = buckets / 2, magnitude = r < 0 ? -r : r;
    int64_t abs_pos = r < mid && r > -mid ? mid - 1 : magnitude;
    if (abs_pos <= mid)
        return r;
    float ratio = (float)abs_pos / (float)mid, base = (float)((double)(max_position - 1) / (double)mid);
    float log_pos = ceilf(logf(ratio) / logf(base) * (float)(mid - 1)) + (float)mid;
    return (int64_t)(r < 0 ? -log_pos : log_pos);
}

/* rel_index (2T - 1,) of the config for T = seq. */
static void fill_rel_index(int32_t *out, const disentangled_config *c, int64_t seq) {
    for (int64_t r = -(seq - 1); r <= seq - 1; r++) {
        int64_t bucket = c->buckets > 0 ? log_bucket(r, c->buckets, c->max_position) : r;
        int64_t row = bucket + c->span;
        row = row < 0 ? 0 : row > 2 * c->span - 1 ? 2 * c->span - 1 : row;
        out[r + seq - 1] = (int32_t)row;
    }
}

/* The op's arguments for the planned shapes and the run (pointers of the forward set). */
static gt_disentangled_args run_args(const gt_layer *layer, const void *in, const gt_run *run) {
    disentangled_config c = config_of(layer);
    int64_t e = layer->in_features, heads = layer->num_heads, seq = layer->in_shape.shape[1];
    int64_t dim = e / heads, batch = layer->in_shape.shape[0];
    size_t elem = gt_dtype_size(run->dt);
    const char *pos = layer->children[0].out.ptr;
    gt_disentangled_args a = {
        .batch = batch, .heads = heads, .seq = seq, .head_dim = dim, .span = c.span,
        .rel_index = c.rel_index, .pos_row = terms_of(&c) * e, .out = layer->out.ptr, .lse = layer->lse,
        .in = {seq * 3 * e, dim, 3 * e}, .out_strides = {seq * e, dim, e},
        .scale = 1.0f / sqrtf((float)(dim * (1 + terms_of(&c)))), .key_lengths = run->key_lengths,
        .dt = run->dt};
    if (in) {  /* the plan asks for the workspace without pointers */
        a.q = in;
        a.k = (const char *)in + (size_t)e * elem;
        a.v = (const char *)in + 2 * (size_t)e * elem;
        a.pos_k = c.c2p ? pos : NULL;
        a.pos_q = c.p2c ? pos + (size_t)(c.c2p ? e : 0) * elem : NULL;
    }
    if (run->training && layer->p > 0.0) {
        uint64_t per_micro = (uint64_t)(batch * heads) * (uint64_t)seq * (uint64_t)seq;
        a.dropout_p = layer->p;
        a.dropout_key = (gt_dropout_key){run->seed, layer->dropout_id, run->step, run->micro_offset * per_micro};
    }
    return a;
}

static gt_status disentangled_forward(gt_layer *layer, const void *in, gt_run *run) {
    disentangled_config c = config_of(layer);
    GT_TRY(gt_layer_forward(&layer->children[0], c.zeros, run));
    gt_disentangled_args a = run_args(layer, in, run);
    return run->backend->ops->disentangled_forward(run->backend, &a);
}

static gt_status disentangled_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                       gt_run *run) {
    disentangled_config c = config_of(layer);
    gt_disentangled_args a = run_args(layer, in, run);
    size_t elem = gt_dtype_size(run->dt), e = (size_t)layer->in_features;
    a.dout = dout;
    if (din) {
        a.dq = din;
        a.dk = (char *)din + e * elem;
        a.dv = (char *)din + 2 * e * elem;
    }
    a.dpos_k = c.c2p ? c.dpos : NULL;
    a.dpos_q = c.p2c ? (char *)c.dpos + (c.c2p ? e : 0) * elem : NULL;
    GT_TRY(run->backend->ops->disentangled_backward(run->backend, &a));
    return gt_layer_backward(&layer->children[0], NULL, c.dpos, c.zeros, run);
}

/* Places rel_index and the zeros (persistent constants) for T = seq. */
static gt_status place_constants(gt_plan_walk *w, disentangled_config *c, int64_t seq, int64_t e) {
    size_t count = (size_t)(2 * seq - 1), zero_bytes = (size_t)(2 * c->span * e) * gt_dtype_size(w->dt);
    int32_t *table = malloc(count * sizeof *table);
    void *zeros = calloc(zero_bytes, 1), *placed = NULL;
    gt_status status = table && zeros ? GT_OK : GT_FAIL(GT_ERR_OOM, "disentangled attention: no host memory "
                                                        "for its relative positions");
    if (status == GT_OK) {
        fill_rel_index(table, c, seq);
        status = gt_plan_constant(w, table, count * sizeof *table, "relative positions", &placed);
        c->rel_index = placed;
    }
    if (status == GT_OK) {
        status = gt_plan_constant(w, zeros, zero_bytes, "relative position input", &placed);
        c->zeros = placed;
    }
    free(table);
    free(zeros);
    return status;
}

/* The block on (1, 2S, E) zeros one level deeper; it must give (1, 2S, P E) activations. */
static gt_status plan_block(gt_plan_walk *w, gt_layer *layer, disentangled_config *c, const gt_plan_site *site,
                            const char *name) {
    gt_layer *block = &layer->children[0];
    gt_tensor zin = {.dtype = w->dt, .ndim = 3, .shape = {1, 2 * c->span, layer->in_features}};
    char path[GT_LAYER_PATH_BYTES];
    snprintf(path, sizeof path, "%s%sblock", site->path, site->path[0] ? "." : "");
    block->level = site->level + 1;
    GT_TRY(gt_plan_layer(w, block, &zin, site->level + 1, site->inside_checkpoint, path, site->region));
    const gt_tensor *out = &block->out;
    if (out->ndim != 3 || out->shape[0] != 1 || out->shape[1] != 2 * c->span ||
        out->shape[2] != terms_of(c) * layer->in_features || out->dtype != w->dt)
        return GT_FAIL(GT_ERR_VALUE, "model: the block of %s must give (1, %lld, %lld) activations "
                       "[pos_key | pos_query], got last dimension %lld", name, (long long)(2 * c->span),
                       (long long)(terms_of(c) * layer->in_features),
                       out->ndim ? (long long)out->shape[out->ndim - 1] : 0LL);
    size_t bytes = 0;
    void *dpos = NULL;
    GT_TRY(gt_tensor_checked_bytes(out, "the relative positions' gradient", &bytes));
    GT_TRY(gt_plan_take(site->region, bytes, "the relative positions' gradient", &dpos));
    c->dpos = dpos;
    return GT_OK;
}

static gt_status plan_disentangled(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in,
                                   const gt_plan_site *site) {
    char name[GT_LAYER_PATH_BYTES + 96];
    gt_layer_describe(name, sizeof name, layer, site->path);
    if (!w->ops->disentangled_forward || !w->ops->disentangled_backward || !w->ops->disentangled_workspace_bytes)
        return GT_FAIL(GT_ERR_RUNTIME, "model: %s (DeBERTa's disentangled attention) has no implementation on "
                       "the '%s' backend yet; run this model on the CPU", name, w->ops->name);
    GT_TRY(gt_plan_check_features(w, in, 3 * layer->in_features, layer, site->path));
    if (in->ndim != 3)
        return GT_FAIL(GT_ERR_VALUE, "model: %s takes (batch, seq, 3 * embed_dim) inputs, but gets %d "
                       "dimensions", name, in->ndim);
    if (in->shape[1] > (1 << 24))
        return GT_FAIL(GT_ERR_VALUE, "model: %s takes sequences of at most %d tokens, got %lld", name, 1 << 24,
                       (long long)in->shape[1]);
    disentangled_config c = config_of(layer);
    GT_TRY(plan_block(w, layer, &c, site, name));
    layer->out.shape[2] = layer->in_features;
    size_t stats = 0;
    GT_TRY(gt_size_mul((size_t)gt_rows_of(in), (size_t)layer->num_heads * sizeof(float), "attention statistics",
                       &stats));
    void *lse = NULL;
    GT_TRY(gt_plan_take(site->region, stats, "attention statistics", &lse));
    layer->lse = lse;
    GT_TRY(place_constants(w, &c, in->shape[1], layer->in_features));
    memcpy(layer->config, &c, sizeof c);
    gt_disentangled_args args = run_args(layer, NULL, &(gt_run){.dt = w->dt});
    size_t bytes = w->ops->disentangled_workspace_bytes(&args, gt_get_num_threads());
    GT_TRY(gt_size_check(bytes, "the workspace of disentangled attention"));
    if (bytes > w->workspace_bytes)
        w->workspace_bytes = bytes;
    return GT_OK;
}

/* ---- the row ---- */
#define DIS_INT_AT(name, min, field) {name, GT_ARG_INT, GT_ARG_CONFIG(disentangled_config, field), min, \
                                      GT_ARG_INT64_MAX, 0, NULL}
static const gt_layer_arg disentangled_args[] = {
    GT_ARG_SIZE_AT("embed_dim", GT_ARG_FIELD(in_features)), GT_ARG_SIZE_AT("num_heads", GT_ARG_FIELD(num_heads)),
    GT_ARG_PROBABILITY_AT("dropout", GT_ARG_FIELD(p)), DIS_INT_AT("span", 1, span),
    DIS_INT_AT("buckets", 0, buckets), DIS_INT_AT("max_position", 1, max_position),
    GT_ARG_FLAG_AT("c2p", GT_ARG_CONFIG(disentangled_config, c2p)),
    GT_ARG_FLAG_AT("p2c", GT_ARG_CONFIG(disentangled_config, p2c)),
    {"block", GT_ARG_BLOCK, 0, 0, 0, 0, NULL}};

/* E divisible by H, at least one term, log buckets >= 2 below a max_position above their middle. */
static gt_status check_disentangled(gt_layer *layer) {
    disentangled_config c = config_of(layer);
    if (layer->in_features % layer->num_heads != 0)
        return GT_FAIL(GT_ERR_VALUE, "DisentangledAttention needs embed_dim divisible by num_heads");
    if (!c.c2p && !c.p2c)
        return GT_FAIL(GT_ERR_VALUE, "DisentangledAttention needs c2p or p2c (else it is the attention kind)");
    if (c.span > (1 << 24) || layer->in_features > INT64_MAX / 4 / (2 * c.span))
        return GT_FAIL(GT_ERR_VALUE, "span: %lld is too large", (long long)c.span);
    if (c.buckets == 1 || (c.buckets > 1 && c.max_position - 1 <= c.buckets / 2))
        return GT_FAIL(GT_ERR_VALUE, "buckets: must be 0 or >= 2 with max_position - 1 > buckets / 2, got "
                       "buckets %lld, max_position %lld", (long long)c.buckets, (long long)c.max_position);
    return GT_OK;
}

static void describe_disentangled(const gt_layer *layer, char *buf, size_t bytes) {
    disentangled_config c = config_of(layer);
    snprintf(buf, bytes, "DisentangledAttention(%lld, num_heads=%lld, span=%lld, buckets=%lld, %s%s%s)",
             (long long)layer->in_features, (long long)layer->num_heads, (long long)c.span, (long long)c.buckets,
             c.c2p ? "c2p" : "", c.c2p && c.p2c ? "|" : "", c.p2c ? "p2c" : "");
}

const gt_layer_type gt_layer_type_disentangled_attention = {
    "disentangled_attention", "DisentangledAttention", GT_LAYER_ARGS(disentangled_args), GT_KIND_DROPOUT_ID,
    check_disentangled, describe_disentangled, NULL, plan_disentangled, disentangled_forward,
    disentangled_backward};
