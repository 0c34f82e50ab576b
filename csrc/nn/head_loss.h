/* Internal to csrc/nn: the chunked LM head + cross-entropy (head_loss.c), the model's
 * `loss_chunk_rows`. */
#ifndef GT_NN_HEAD_LOSS_H
#define GT_NN_HEAD_LOSS_H

#include "nn/model.h"
#include "nn/plan.h"

/* Fails, naming loss_chunk_rows, unless `rows` is 0 (off) or a positive count the model's head can
 * take in blocks (its last top-level layer is a plain Linear). */
gt_status gt_head_check_chunk_rows(const gt_model *model, int64_t rows);

/* Plans the head (the root's last child) after the walk planned the others: its output shape
 * (root.out: the logits' shape, with no buffer), the GEMM workspace of blocks of `chunk` rows. */
gt_status gt_head_plan(gt_plan_walk *w, gt_model *model, int64_t chunk);

/* Forward of every top-level layer but the head, from the first layer's input `in`. */
gt_status gt_head_forward_body(gt_model *model, const void *in, gt_run *run);

/* The loss of a chunked plan: counts `targets` into *count (the model's memory), then block by
 * block the logits (in model->head_logits) and their per-row losses into model->losses; notes
 * what the backward needs (targets and count stay valid until it runs). */
gt_status gt_head_loss(gt_model *model, const gt_loss *loss, const int64_t *targets, int64_t *count,
                       const float *loss_scale, float dloss_divisor);

/* The backward of a chunked plan: block by block the logits again, their gradient in place, the
 * head's input gradient (model->dout) and weight gradient; then the other layers' backward from
 * model->dout, as gt_sequential_backward runs them (child_done included). `in`: the first
 * layer's input. */
gt_status gt_head_backward(gt_model *model, const void *in, gt_run *run);

#endif
