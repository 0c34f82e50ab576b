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
    int checkpointing;            /* GT_CHECKPOINT_*: outermost Residuals and Checkpoints recompute their block */
    const gt_tensor *input;       /* the model's input (messages say when a layer reads it) */
    const char *input_name;       /* the argument it came from: "x" or "shape" */
    char *recompute_base;         /* start of the shared recompute region (NULL counting) */
    size_t recompute_bytes;       /* largest checkpointed block inside */
    size_t level_scratch_bytes[GT_MAX_NESTING]; /* per nesting level: the largest activation whose
                                     gradient that level's two backward scratch buffers may hold */
    size_t workspace_bytes;       /* largest GEMM workspace */
    int levels;                   /* nesting levels seen */
    int64_t *key_lengths;         /* the Tokens layer's (B,) lengths when its input has a mask */
    int masked;                   /* 1 once a Tokens layer with a mask was planned */
    int has_positions;            /* 1 once a Tokens layer with position ids was planned */
    int64_t positions_offset;     /* has_positions: elements from the input's start to row 0 of
                                     its position channel */
    int64_t positions_stride;     /* has_positions: elements between the rows of positions */
    int64_t *key_starts;          /* the Tokens layer's (B, T) key starts (position ids), or NULL */
    int64_t *last_tokens;         /* the Tokens layer's (B,) last tokens (pad_token_id), or NULL */
    char *offload_base;           /* start of the pinned host region of offloaded checkpoints (NULL
                                     counting) */
    size_t offload_bytes;         /* bytes of that region taken so far */
    const gt_layer *offloaded;    /* the unit being planned whose output goes to a slot, or NULL */
    struct gt_offload_slots *slots; /* offloaded: the two slots of its run */
    gt_plan_cursor *persistent;   /* the main activation region: buffers a layer fills once when
                                     placed (never the recompute region, which others reuse) */
    /* Copies host bytes into the model's memory (blocking) on a placing walk; NULL: none */
    gt_status (*fill)(void *ctx, void *dst, const void *src, size_t bytes);
    void *fill_ctx;               /* fill's model */
} gt_plan_walk;

/* Where a layer is planned: what a kind's plan hook (nn/kind.h) gets besides the walk. */
typedef struct gt_plan_site {
    const char *path;        /* the layer's state_dict path ("" for the root), for messages */
    int level;               /* nesting depth of the Sequential holding it (-1: the root) */
    int inside_checkpoint;   /* 1 inside a checkpointed block (its buffers are recomputed) */
    gt_plan_cursor *region;  /* where its buffers (statistics, its output) are taken from */
} gt_plan_site;

/* Plans `layer` (named `path` as in state_dict, "" for the root) for input `in`: output shape,
 * and buffers taken from `region`. Fails on shapes the layer cannot take and on sizes that
 * overflow, naming the argument or the layer and leaving the layer's plan fields undefined. */
/* Notes that a backward scratch buffer of nesting `level` may hold the gradient of `t` (or, the
 * Tokens layer, its token-type rows): the level's buffers are sized to the largest (int64 tensors
 * have no gradient and are not counted). */
gt_status gt_plan_note_scratch(gt_plan_walk *w, int level, const gt_tensor *t);

gt_status gt_plan_layer(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, int level,
                        int inside_checkpoint, const char *path, gt_plan_cursor *region);

/* Helpers for the kinds' plan hooks. */
/* Takes `bytes` (rounded up to GT_ALIGN) from `cursor`: *out is NULL on the counting pass. */
gt_status gt_plan_take(gt_plan_cursor *cursor, size_t bytes, const char *what, void **out);
/* Raises the workspace to what a GEMM of these sizes needs, as the layers run it (beta 0, or
 * 0 and 1 when it may accumulate). */
gt_status gt_plan_gemm_workspace(gt_plan_walk *w, int trans_a, int trans_b, int64_t m, int64_t n,
                                 int64_t k, gt_dtype c_dt, int may_accumulate);
/* Takes `bytes` from the walk's persistent region and, on a placing walk, copies `host` there
 * (the bytes must be the same on every walk: they are written once per placement). */
gt_status gt_plan_constant(gt_plan_walk *w, const void *host, size_t bytes, const char *what, void **out);
/* Fails, naming the layer, unless `in` is floating point with `expected` features (last dim). */
gt_status gt_plan_check_features(gt_plan_walk *w, const gt_tensor *in, int64_t expected,
                                 const gt_layer *layer, const char *path);

/* The plans of the kinds that predate the table of kinds (their rows are in nn/kinds.c). */
#define GT_PLAN_DECL(name) \
    gt_status gt_plan_##name(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, \
                             const gt_plan_site *site);
GT_PLAN_DECL(linear)
GT_PLAN_DECL(elementwise)
GT_PLAN_DECL(layernorm)
GT_PLAN_DECL(embedding)
GT_PLAN_DECL(flatten)
GT_PLAN_DECL(sequential)
GT_PLAN_DECL(residual)
GT_PLAN_DECL(checkpoint)
GT_PLAN_DECL(attention)
GT_PLAN_DECL(tokens)
GT_PLAN_DECL(pool)
GT_PLAN_DECL(position)
GT_PLAN_DECL(conv2d)
GT_PLAN_DECL(batchnorm2d)
GT_PLAN_DECL(pool2d)
#undef GT_PLAN_DECL

#endif
