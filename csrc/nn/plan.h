/* Internal to csrc/nn: the walk that plans (and later places) a model's activations. */
#ifndef GT_NN_PLAN_H
#define GT_NN_PLAN_H

#include "core/alloc.h"
#include "nn/layer.h"

/* A region being carved: base NULL while counting bytes. */
typedef struct gt_plan_cursor {
    char *base;   /* start of the region, or NULL on the counting pass */
    size_t used;  /* bytes taken so far, pieces rounded to GT_ALIGN */
} gt_plan_cursor;

enum { GT_LAYER_PATH_BYTES = 160 };  /* room for a layer's dotted name, e.g. "2.block.0" */

typedef struct gt_plan_walk {
    const gt_ops *ops;            /* backend, for GEMM workspace sizes */
    gt_dtype dt;                  /* activation precision */
    int checkpointing;            /* 1: outermost Residuals recompute their block */
    const gt_tensor *input;       /* the model's input (messages say when a layer reads it) */
    const char *input_name;       /* the argument it came from: "x" or "shape" */
    char *recompute_base;         /* start of the shared recompute region (NULL counting) */
    size_t recompute_bytes;       /* largest checkpointed block inside */
    size_t max_activation_bytes;  /* largest single activation (sizes the scratch buffers) */
    size_t workspace_bytes;       /* largest GEMM workspace */
    int levels;                   /* nesting levels seen */
    int64_t *key_lengths;         /* the Tokens layer's (B,) lengths when its input has a mask */
    int masked;                   /* 1 once a Tokens layer with a mask was planned */
} gt_plan_walk;

/* Plans `layer` (named `path` as in state_dict, "" for the root) for input `in`: output shape,
 * and buffers taken from `region`. Fails on shapes the layer cannot take and on sizes that
 * overflow, naming the argument or the layer and leaving the layer's plan fields undefined. */
gt_status gt_plan_layer(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, int level,
                        int inside_checkpoint, const char *path, gt_plan_cursor *region);

#endif
