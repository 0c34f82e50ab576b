/* Parallel: every child reads the same input (..., C); the output is the children's outputs
 * concatenated along the last dimension, in child order (their leading dimensions must agree).
 * Backward: each child's input gradient, summed in child order into din (child 0 writes it, each
 * later one is added with the add op: din = ((g0 + g1) + g2) ...). Spec: ("parallel", [specs]);
 * the children are named 0, 1, ... as a Sequential's.
 *
 * Memory: the ops take no row stride, so each child writes its own output buffer (as planned by
 * its kind) and the forward copies it into its column slice of the Parallel's output (copy_2d):
 * the concatenation costs one more activation of the output's size and one strided copy per
 * child. The children sit one nesting level below the Parallel (as a Sequential's do); their
 * containers use deeper levels, so the Parallel uses that level's two scratch buffers itself:
 * [0] holds a child's slice of dout (copied out with copy_2d; the dout itself with one child),
 * [1] a later child's input gradient before it is added to din. Both are sized by the largest
 * activation, which the plan raises to the input's size. The kind's whole definition. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "nn/kind.h"

static const gt_layer_arg parallel_args[] = {{"modules", GT_ARG_LAYERS, 0, 0, 0, 0, NULL}};

static gt_status check_parallel(gt_layer *layer) {
    if (layer->num_children == 0)
        return GT_FAIL(GT_ERR_VALUE, "Parallel needs at least one module");
    return GT_OK;
}

static void describe_parallel(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "Parallel");
}

/* The module whose parameters a layer uses (itself, or the first use of a tied module). */
static const gt_layer *owner_of(const gt_layer *layer) { return layer->tied ? layer->tied : layer; }

/* 1 when a layer of tree `b` uses the parameters of a layer of tree `a`. */
static int shares_params(const gt_layer *a, const gt_layer *b) {
    for (size_t i = 0; i < b->num_children; i++)
        if (shares_params(a, &b->children[i]))
            return 1;
    if (!b->weight.numel && !b->bias.numel)
        return 0;
    for (size_t i = 0; i < a->num_children; i++)
        if (shares_params(&a->children[i], b))
            return 1;
    return (a->weight.numel || a->bias.numel) && owner_of(a) == owner_of(b);
}

/* Fails when two children use the same parameters: the rule of shared parameters (every use but
 * the last adds its gradients) assumes the uses run backward in reverse order of the spec, and
 * the children run backward in child order. */
static gt_status check_no_sharing(const gt_layer *layer, const char *path) {
    for (size_t j = 1; j < layer->num_children; j++)
        for (size_t i = 0; i < j; i++)
            if (shares_params(&layer->children[i], &layer->children[j]))
                return GT_FAIL(GT_ERR_VALUE, "model: children %zu and %zu of the Parallel '%s' use the same "
                               "parameters; a module may be used only once inside one Parallel", i, j, path);
    return GT_OK;
}

/* "2 x 16 x 8" into buf: the leading dimensions of a child's output. */
static void leading_dims(const gt_tensor *t, char *buf, size_t bytes) {
    buf[0] = '\0';
    for (int d = 0; d + 1 < t->ndim; d++) {
        size_t used = strlen(buf);
        snprintf(buf + used, bytes - used, "%s%lld", d ? " x " : "", (long long)t->shape[d]);
    }
}

/* Each child planned on the input at the next level; the output's last dimension is the sum of
 * theirs. */
static gt_status plan_parallel(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    int level = site->level + 1;
    if (level >= GT_MAX_NESTING)
        return GT_FAIL(GT_ERR_VALUE, "model: layers nest deeper than %d levels", GT_MAX_NESTING);
    if (!w->ops->copy_2d || !w->ops->add)
        return GT_FAIL(GT_ERR_RUNTIME, "model: the Parallel '%s' has no implementation on the '%s' backend yet; "
                       "run this model on the CPU", site->path, w->ops->name);
    if (level + 1 > w->levels)
        w->levels = level + 1;
    GT_TRY(check_no_sharing(layer, site->path));
    size_t width = 0;
    for (size_t i = 0; i < layer->num_children; i++) {
        gt_layer *child = &layer->children[i];
        char name[GT_LAYER_PATH_BYTES];
        snprintf(name, sizeof name, "%s%s%zu", site->path, site->path[0] ? "." : "", i);
        child->level = level;
        GT_TRY(gt_plan_layer(w, child, in, level, site->inside_checkpoint, name, site->region));
        GT_TRY(gt_plan_note_scratch(w, level, &child->out));  /* scratch [0] holds a slice of dout */
        const gt_tensor *out = &child->out, *first = &layer->children[0].out;
        if (out->ndim < 1 || out->ndim != first->ndim ||
            memcmp(out->shape, first->shape, sizeof(int64_t) * (size_t)(out->ndim - 1)) != 0) {
            char got[96], want[96];
            leading_dims(out, got, sizeof got);
            leading_dims(first, want, sizeof want);
            return GT_FAIL(GT_ERR_VALUE, "model: child %zu of the Parallel '%s' gives outputs of leading "
                           "dimensions (%s), child 0 (%s); the outputs are concatenated along the last "
                           "dimension, so the others must agree", i, site->path, got, want);
        }
        if (out->dtype != w->dt)
            return GT_FAIL(GT_ERR_TYPE, "model: child %zu of the Parallel '%s' gives %s values; its children "
                           "must give activations", i, site->path, gt_dtype_name(out->dtype));
        GT_TRY(gt_size_add(width, (size_t)out->shape[out->ndim - 1], "the Parallel's output width", &width));
        if (width > (size_t)INT64_MAX)
            return GT_FAIL(GT_ERR_OOM, "model: the Parallel '%s' gives outputs too wide for an int64", site->path);
    }
    layer->out = layer->children[0].out;
    layer->out.shape[layer->out.ndim - 1] = (int64_t)width;
    layer->out.ptr = NULL;
    return gt_plan_note_scratch(w, level, in);  /* scratch [1] holds an input gradient */
}

/* Bytes of one element and rows of the output (rows of every child's output too). */
static size_t elem_of(const gt_layer *layer) { return gt_dtype_size(layer->out.dtype); }

static size_t width_of(const gt_tensor *t) { return (size_t)t->shape[t->ndim - 1]; }

static gt_status parallel_forward(gt_layer *layer, const void *in, gt_run *run) {
    size_t elem = elem_of(layer), rows = (size_t)gt_rows_of(&layer->out), pitch = width_of(&layer->out) * elem;
    size_t offset = 0;
    for (size_t i = 0; i < layer->num_children; i++) {
        gt_layer *child = &layer->children[i];
        GT_TRY(gt_layer_forward(child, in, run));
        size_t bytes = width_of(&child->out) * elem;
        GT_TRY(run->backend->ops->copy_2d(run->backend, (char *)layer->out.ptr + offset, pitch, child->out.ptr,
                                          bytes, bytes, rows));
        offset += bytes;
    }
    return GT_OK;
}

static gt_status parallel_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    size_t n = layer->num_children, elem = elem_of(layer), rows = (size_t)gt_rows_of(&layer->out);
    size_t pitch = width_of(&layer->out) * elem, offset = 0;
    int level = layer->children[0].level;
    void *slice = run->scratch[level][0], *grad = run->scratch[level][1];
    for (size_t i = 0; i < n; i++) {
        gt_layer *child = &layer->children[i];
        size_t bytes = width_of(&child->out) * elem;
        const void *child_dout = dout;
        if (n > 1) {
            GT_TRY(ops->copy_2d(run->backend, slice, bytes, (const char *)dout + offset, pitch, bytes, rows));
            child_dout = slice;
        }
        offset += bytes;
        GT_TRY(gt_layer_backward(child, din && i > 0 ? grad : din, child_dout, in, run));
        if (din && i > 0)
            GT_TRY(ops->add(run->backend, din, din, grad, (int64_t)gt_tensor_numel(&layer->in_shape), run->dt));
    }
    return GT_OK;
}

const gt_layer_type gt_layer_type_parallel = {
    "parallel", "Parallel", GT_LAYER_ARGS(parallel_args), GT_KIND_CONTAINER, check_parallel, describe_parallel,
    NULL, plan_parallel, parallel_forward, parallel_backward};
