/* The chunked LM head + cross-entropy (Liger-Kernel's and Unsloth's fused linear cross-entropy):
 * when a model ends with a Linear (the LM head, tied to the token embedding or not) and
 * loss_chunk_rows = C > 0, a training step never holds the (rows, classes) logits of a
 * micro-batch. The loss runs the head C rows at a time into one (C, classes) buffer and keeps the
 * per-row losses; the backward runs each block again (the same GEMM, the same bits), turns it into
 * its gradient in place, and takes the head's input gradient dX = dlogits W and weight gradient
 * dW += dlogits^T X of the block before the next. Each row's loss and gradient are the unchunked
 * ones (the xent's per-row math, with the whole micro-batch's count from xent_count) and dX
 * reduces over the classes, which blocks of rows do not split; dW sums the blocks' GEMMs, one
 * rounding per block (within f32 rounding of one GEMM over all rows). The cost: the logits GEMM
 * runs twice (4 head GEMMs instead of 3). A softcapped head (Gemma 2/3's scale, tanh, scale after
 * the Linear) is refused, not fused. The head may also be a QLinear (a frozen quantized or half
 * weight, e.g. the untied head of a bf16 model get_peft_model froze): its own kind runs each block
 * (its dequantizing or stored-weight GEMMs; no dW, it has no weight gradient). */
#include "nn/head_loss.h"

#include <stdio.h>

#include "nn/kind.h"

/* The root's last child, or NULL. */
static gt_layer *head_of(const gt_model *model) {
    size_t n = model->root.num_children;
    return n ? &model->root.children[n - 1] : NULL;
}

gt_status gt_head_check_chunk_rows(const gt_model *model, int64_t rows) {
    if (rows < 0)
        return GT_FAIL(GT_ERR_VALUE, "loss_chunk_rows: must be >= 0 (0: the logits of all rows at once), got %lld",
                       (long long)rows);
    const gt_layer *head = head_of(model);
    if (rows == 0 || (head && (head->kind == GT_LAYER_LINEAR || head->kind == GT_LAYER_QLINEAR)))
        return GT_OK;
    char name[GT_LAYER_PATH_BYTES + 64] = "nothing";
    if (head) {
        char path[32];
        snprintf(path, sizeof path, "%zu", model->root.num_children - 1);
        gt_layer_describe(name, sizeof name, head, path);
    }
    return GT_FAIL(GT_ERR_VALUE, "loss_chunk_rows: a chunked loss needs a model whose last layer is a Linear or "
                   "QLinear (the LM head), but it ends with %s (a soft-capped head, Gemma 2/3's scale-tanh-scale, "
                   "is not fused); use loss_chunk_rows=0", name);
}

gt_status gt_head_plan(gt_plan_walk *w, gt_model *model, int64_t chunk) {
    gt_layer *head = head_of(model);
    const gt_tensor hidden = model->root.out;  /* the head's input: the other layers' output */
    char path[32];
    snprintf(path, sizeof path, "%zu", model->root.num_children - 1);
    gt_tensor block = hidden;  /* one block of rows, for the GEMMs' workspace */
    block.ndim = 2;
    block.shape[0] = chunk;
    block.shape[1] = hidden.ndim ? hidden.shape[hidden.ndim - 1] : 0;
    gt_plan_cursor none = {NULL, 0};
    const gt_plan_site site = {path, 0, 0, &none};
    head->level = 0;
    GT_TRY(gt_layer_type_of(head->kind)->plan(w, head, &block, &site));
    head->in_shape = hidden;
    head->in_shape.ptr = NULL;
    head->out = hidden;
    head->out.dtype = w->dt;
    head->out.ptr = NULL;
    head->out.shape[hidden.ndim - 1] = head->out_features;
    model->root.out = head->out;
    return GT_OK;
}

gt_status gt_head_forward_body(gt_model *model, const void *in, gt_run *run) {
    const void *cur = in;
    model->head.input = in;
    model->head.ready = 0;
    for (size_t i = 0; i + 1 < model->root.num_children; i++) {
        GT_TRY(gt_layer_forward(&model->root.children[i], cur, run));
        cur = model->root.children[i].out.ptr;
    }
    return GT_OK;
}

/* The head's input: the output of the layer before it (or the model's input). */
static const char *head_input(const gt_model *model) {
    size_t n = model->root.num_children;
    return n > 1 ? model->root.children[n - 2].out.ptr : model->head.input;
}

/* The head (a Linear or QLinear) over rows [first, first + rows) of its input, writing
 * model->head_logits. */
static gt_layer block_view(const gt_model *model, int64_t rows) {
    gt_layer view = *head_of(model);
    view.in_shape.ndim = 2;
    view.in_shape.shape[0] = rows;
    view.in_shape.shape[1] = view.in_features;
    view.out.ndim = 2;
    view.out.shape[0] = rows;
    view.out.shape[1] = view.out_features;
    view.out.ptr = model->head_logits;
    return view;
}

/* A run for the head's blocks: the model's, with nothing hooked. */
static gt_run block_run(gt_model *model) {
    gt_run run = {.backend = &model->backend, .dt = model->dt, .training = model->training};
    return run;
}

gt_status gt_head_loss(gt_model *model, const gt_loss *loss, const int64_t *targets, int64_t *count,
                       const float *loss_scale, float dloss_divisor) {
    const gt_ops *ops = model->backend.ops;
    const gt_layer *head = head_of(model);
    int64_t rows = gt_rows_of(&head->in_shape), chunk = model->plan.head_chunk_rows, classes = head->out_features;
    size_t row_bytes = (size_t)head->in_features * gt_dtype_size(model->dt);
    const char *x = head_input(model);
    model->head.ready = 0;
    GT_TRY(ops->xent_count(&model->backend, count, targets, rows, classes, loss->ignore_index));
    gt_run run = block_run(model);
    for (int64_t first = 0; first < rows; first += chunk) {
        int64_t n = rows - first < chunk ? rows - first : chunk;
        gt_layer view = block_view(model, n);
        GT_TRY(gt_layer_type_of(view.kind)->forward(&view, x + (size_t)first * row_bytes, &run));
        GT_TRY(ops->softmax_xent_counted(&model->backend, model->losses + first, count, NULL, model->head_logits,
                                         targets + first, n, classes, loss->label_smoothing, loss->ignore_index,
                                         loss_scale, dloss_divisor, model->dt));
    }
    model->head = (gt_head_pending){model->head.input, targets, count, loss_scale, dloss_divisor,
                                    loss->label_smoothing, loss->ignore_index, 1};
    return GT_OK;
}

/* The head's backward, block by block: logits, their gradient in place, dX into model->dout, dW. */
static gt_status head_blocks_backward(gt_model *model, const gt_run *outer) {
    const gt_ops *ops = model->backend.ops;
    const gt_layer *head = head_of(model);
    const gt_head_pending *p = &model->head;
    int64_t rows = gt_rows_of(&head->in_shape), chunk = model->plan.head_chunk_rows, classes = head->out_features;
    size_t row_bytes = (size_t)head->in_features * gt_dtype_size(model->dt);
    const char *x = head_input(model);
    gt_run run = block_run(model);
    size_t below = model->root.num_children - 1;  /* layers before the head */
    int wants_dx = gt_first_trained_child(&model->root, below) < below;  /* else nothing below trains */
    for (int64_t first = 0; first < rows; first += chunk) {
        int64_t n = rows - first < chunk ? rows - first : chunk;
        gt_layer view = block_view(model, n);
        const gt_layer_type *kind = gt_layer_type_of(view.kind);
        GT_TRY(kind->forward(&view, x + (size_t)first * row_bytes, &run));
        GT_TRY(ops->softmax_xent_counted(&model->backend, model->losses + first, p->count, model->head_logits,
                                         model->head_logits, p->targets + first, n, classes, p->label_smoothing,
                                         p->ignore_index, p->loss_scale, p->dloss_divisor, model->dt));
        run.accumulate = outer->accumulate || first > 0;  /* the first block writes, unless the step adds */
        void *dx = wants_dx ? (char *)model->dout + (size_t)first * row_bytes : NULL;
        GT_TRY(kind->backward(&view, dx, model->head_logits, x + (size_t)first * row_bytes, &run));
    }
    return GT_OK;
}

gt_status gt_head_backward(gt_model *model, const void *in, gt_run *run) {
    if (!model->head.ready)
        return GT_FAIL(GT_ERR_RUNTIME, "backward called before the loss (loss_chunk_rows: the LM head's gradient "
                       "comes from the loss of the same forward)");
    gt_layer *root = &model->root;
    size_t n = root->num_children;
    GT_TRY(head_blocks_backward(model, run));
    if (root == run->hooked && n > 1)
        GT_TRY(run->child_done(run, n - 1));
    if (n < 2)
        return GT_OK;
    int level = root->children[0].level;
    size_t start = gt_first_trained_child(root, n - 1);  /* as gt_sequential_backward's `first` */
    const void *cur = model->dout;
    int next = 0;
    for (size_t i = n - 1; i-- > 0;) {  /* gt_sequential_backward from the layer before the head */
        gt_layer *child = &root->children[i];
        if (i < start) {
            if (root == run->hooked && i > 0)
                GT_TRY(run->child_done(run, i));
            continue;
        }
        const void *child_in = i > 0 ? root->children[i - 1].out.ptr : in;
        void *target = i > start ? run->scratch[level][next] : NULL;
        GT_TRY(gt_layer_backward(child, target, cur, child_in, run));
        if (root == run->hooked && i > 0)
            GT_TRY(run->child_done(run, i));
        cur = target;
        next ^= 1;
    }
    return GT_OK;
}
