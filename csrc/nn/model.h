/* A model: a root Sequential of layers, its parameter/gradient arenas (built once) and its
 * activation arena (planned for a micro-batch input shape, rebuilt only when that changes). */
#ifndef GT_NN_MODEL_H
#define GT_NN_MODEL_H

#include "core/alloc.h"
#include "core/device_backend.h"
#include "core/scaler_rules.h"
#include "core/sumsq_order.h"
#include "nn/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gt_loss_kind {
    GT_LOSS_CROSS_ENTROPY = 0,  /* softmax + NLL over the last dim, int64 targets */
    GT_LOSS_MSE = 1,            /* mean squared error, f32 targets of the output's shape */
} gt_loss_kind;

typedef struct gt_loss {
    gt_loss_kind kind;       /* which loss */
    float label_smoothing;   /* cross-entropy: epsilon in [0, 1] */
    int64_t ignore_index;    /* cross-entropy: targets equal to this are skipped */
    float rdrop_alpha;       /* cross-entropy: > 0 is R-Drop (ops.h softmax_xent_rdrop): the output's
                                rows are two dropout passes, halves paired; 0: plain cross-entropy */
} gt_loss;

/* Bytes of every region of a model for one input shape, computed before allocating. */
typedef struct gt_model_plan {
    size_t param_bytes;       /* f32 parameters */
    size_t grad_bytes;        /* f32 gradients of the trainable (not frozen) parameters */
    size_t lowp_param_bytes;  /* half copy of the parameters but lookup-only tables (f16/bf16), else 0 */
    size_t buffer_bytes;      /* buffers: BatchNorm2d running statistics (not parameters) and the
                                 copy a failed training step restores them from, and frozen
                                 buffers (QLinear's packed weights and absmax) */
    size_t activation_bytes;  /* layer outputs and saved statistics kept for backward */
    size_t recompute_bytes;   /* shared region of checkpointed blocks (max over blocks) */
    size_t scratch_bytes;     /* backward ping-pong buffers: 2 per nesting level, each its largest gradient */
    size_t loss_bytes;        /* input cast buffer, output gradient, per-row losses; on a device
                                 model also the device copies of a host input and its targets */
    size_t workspace_bytes;   /* backend scratch (e.g. widened GEMM inputs) */
    size_t total_bytes;       /* sum of the above */
    size_t offload_bytes;     /* pinned host memory (not in total_bytes): the outputs of offloaded
                                 checkpoints (GT_CHECKPOINT_OFFLOAD) */
    int nesting_levels;       /* levels with scratch buffers */
    int64_t head_chunk_rows;  /* rows per block of a chunked LM head + loss (nn/head_loss.c);
                                 0: the logits are planned whole */
    /* What the allocator reserves for each arena of this plan (gt_block_reserved_bytes of the
     * bytes the model requests; the sizes its allocations use): */
    size_t param_arena_bytes;       /* the parameter arena */
    size_t grad_arena_bytes;        /* the gradient arena (0 when every parameter is frozen) */
    size_t lowp_arena_bytes;        /* the half copy's arena (0 in f32) */
    size_t buffer_arena_bytes;      /* the buffer arena (0 without buffers) */
    size_t activation_arena_bytes;  /* activations, recompute, scratch, loss buffers, workspace */
    size_t backend_arena_bytes;     /* the backend's own scratch block (accelerator models), else 0 */
    size_t step_scratch_bytes;      /* the training step's scratch block (in the model's device memory) */
} gt_model_plan;

/* A device model's training step in device memory (its step_scratch block): what the step's
 * kernels write and the host reads back once per step (every field before `sumsq_totals`). */
typedef struct gt_step_record {
    double loss_sum;      /* sum of the micro-batches' mean losses (gt_model_loss adds to it) */
    double grad_sumsq;    /* sum of squares of the unscaled gradients, when asked for */
    int64_t count;        /* rows the last cross-entropy counted */
    float mse;            /* mean of the last MSE */
    int found_inf;        /* 1 when the unscale saw a NaN/Inf gradient, else 0 */
    double sumsq_totals[GT_SUMSQ_MAX_CHUNKS]; /* (chunks,) scratch of the sum of squares */
} gt_step_record;

enum { GT_STEP_RECORDS = 2 };  /* records a device model keeps: step k writes record k % 2, so a
                                  deferred result (TrainStep(sync=False)) outlives the next step */

/* A device model's step scratch block: the records, then the state the step keeps on the device
 * from one step to the next (train/step_device.c). */
typedef struct gt_step_scratch {
    gt_step_record records[GT_STEP_RECORDS]; /* step k writes records[k % 2] (sync=True: record 0) */
    gt_scaler scaler;     /* the loss scaler's state on the device: the unscale reads it, the
                             update (growth/backoff) applies core/scaler_rules.h to it there */
} gt_step_scratch;

#define GT_MODEL_STEP_SCRATCH_BYTES sizeof(gt_step_scratch)  /* a device model's step scratch */

/* What the allocator reserves now for each live arena of a model (0 for those it does not
 * hold), in the fields of gt_model_plan that say so. */
typedef struct gt_model_arenas {
    size_t params;       /* the parameter arena */
    size_t grads;        /* the gradient arena */
    size_t lowp;         /* the half copy */
    size_t buffers;      /* the buffer arena */
    size_t activations;  /* the activation arena (0 until a forward plans it) */
    size_t backend;      /* the backend's scratch (accelerator models) */
    size_t step_scratch; /* the training step's scratch (in the model's device memory) */
} gt_model_arenas;


/* What a chunked loss (nn/head_loss.c) leaves for the backward of the same micro-batch. */
typedef struct gt_head_pending {
    const void *input;        /* the first layer's input of the last forward (the head's, for a lone head) */
    const int64_t *targets;   /* (rows,) labels in the model's memory */
    const int64_t *count;     /* rows counted, in the model's memory */
    const float *loss_scale;  /* as gt_model_loss's */
    float dloss_divisor;      /* as gt_model_loss's */
    float label_smoothing;    /* the loss's */
    int64_t ignore_index;     /* the loss's */
    int ready;                /* 1 once a chunked loss ran since the last forward */
} gt_head_pending;

typedef struct gt_model {
    gt_layer root;              /* the top-level Sequential */
    gt_backend backend;         /* ops used by every layer */
    const gt_device_backend *device; /* the device's interface (the cpu's too) */
    gt_dtype dt;                /* activation precision: f32, f16 or bf16 */
    uint64_t seed;              /* initialisation and dropout seed */
    uint32_t step;              /* optimizer steps taken (dropout key) */
    int training;               /* 1: dropout active */
    int checkpointing;          /* GT_CHECKPOINT_*: units (Residual, Checkpoint) recompute their
                                   inside in backward, keeping their inputs on the device or offloaded */
    int grads_valid;            /* 0 after zero_grad(set_to_none): next backward writes */
    size_t num_params;          /* f32 elements in the parameter arena */
    size_t num_grads;           /* f32 elements in the gradient arena: the trainable parameters' */
    gt_arena params;            /* (num_params,) f32 */
    gt_arena grads;             /* (num_grads,) f32, the trainable parameters in state_dict order */
    size_t num_lowp;            /* elements of the half copy: the parameters but lookup-only tables */
    gt_arena lowp_params;       /* (num_lowp,) f16/bf16 when dt is half */
    size_t buffer_bytes;        /* bytes of the buffers, laid out in state_dict order */
    size_t stat_bytes;          /* the first stat_bytes of them: the running statistics (a failed step
                                   restores these); frozen buffers (nn/kind.h) follow */
    gt_arena buffers;           /* (buffer_bytes,) running statistics (f32) and counts (int64) and
                                   frozen buffers, then (stat_bytes,) the statistics' copy at the
                                   start of a training step */
    gt_arena activations;       /* everything sized by the input shape */
    gt_arena offload_host;      /* (plan.offload_bytes,) pinned host copies of offloaded checkpoints'
                                   outputs; empty without them */
    struct gt_copy_stream *offload_copies; /* the copies to and from offload_host (created with the
                                   first plan that offloads), or NULL */
    gt_tensor planned_input;    /* input shape/dtype the activations are planned for */
    int planned;                /* 1 when `activations` matches planned_input */
    gt_model_plan plan;         /* bytes of the current plan */
    int64_t loss_chunk_rows;    /* 0: the training step's LM head writes the logits of all rows; > 0:
                                   it and the cross-entropy run this many rows at a time */
    int full_head;              /* 1 while gt_model_forward plans the logits whole (they are its result) */
    void *head_logits;          /* (head_chunk_rows, classes) dt logits of one block, then their gradient */
    gt_head_pending head;       /* what the chunked loss left for the backward */
    void *input_cast;           /* (input numel,) dt copy of a float input in half mode */
    void *input_device;         /* (input bytes,) device copy of a host input (device model), else NULL */
    void *targets_device;       /* device copy of host targets (device model): room for (rows,) int64
                                   labels or (output numel,) f32 values; else NULL */
    void *dout;                 /* (output numel,) dt gradient of the loss w.r.t. the output */
    float *losses;              /* (output rows,) per-row losses */
    int64_t *key_lengths;       /* (micro-batch,) keys per sequence, written by a Tokens layer whose
                                   input carries an attention mask, read by Attention and Pool;
                                   NULL when the model's input has no mask */
    int64_t *key_starts;        /* (micro-batch, seq) first key of each query's segment, written by a
                                   Tokens layer with position ids, read by Attention; else NULL */
    int64_t *last_tokens;       /* (micro-batch,) last non-pad token, written by a Tokens layer with a
                                   pad_token_id, read by Pool "last"; else NULL */
    int has_positions;          /* 1: the input carries position ids (a Tokens layer's last channel) */
    int64_t positions_offset;   /* has_positions: elements from the input's start to row 0 of them */
    int64_t positions_stride;   /* has_positions: elements between their rows */
    void *scratch[GT_MAX_NESTING][2]; /* backward ping-pong buffers per nesting level */
    int step_record;            /* the record of step_scratch the step in progress writes */
    gt_block step_scratch;      /* a gt_step_scratch in the model's device memory (the host's on the
                                   cpu), for the training step's kernels, allocated with the model
                                   so a step allocates nothing */
    gt_scaler scaler_mirror;    /* what step_scratch's scaler holds once the queued work has run */
    int scaler_mirrored;        /* 1 when scaler_mirror is known (0: the next scaled step copies it in) */
    int plan_only;              /* 1: built by gt_model_create_plan_only: laid out, no arena allocated;
                                   it plans (and freezes), and refuses everything that needs values */
} gt_model;

/* Takes ownership of root's children; lays out and initialises the parameters from `seed`. */
gt_status gt_model_create(gt_model *model, gt_layer root, gt_device device, gt_dtype dt,
                          uint64_t seed);

/* gt_model_create without its arenas (a model built for planning, e.g. one larger than this
 * machine's memory): the parameters, gradients and buffers are laid out and every size checked,
 * but nothing is allocated, initialised or pointed at. gt_model_compute_plan and
 * gt_model_set_frozen work (its plans equal a created model's, to the byte); everything that
 * reads, writes or runs values refuses (gt_model_check_values). */
gt_status gt_model_create_plan_only(gt_model *model, gt_layer root, gt_device device, gt_dtype dt);

/* GT_ERR_VALUE naming `what` for a model built for planning only (it holds no values), else GT_OK. */
gt_status gt_model_check_values(const gt_model *model, const char *what);

void gt_model_destroy(gt_model *model);

/* What the allocator reserves now for each of the model's arenas. */
void gt_model_live_arenas(const gt_model *model, gt_model_arenas *out);

/* The plan for an input shape, without allocating anything. */
gt_status gt_model_compute_plan(gt_model *model, const gt_tensor *input, int checkpointing,
                                gt_dtype dt, gt_model_plan *out);

/* Plans the activations for `input` (a no-op when already planned for it): in the current arena
 * when the plan fits in it (a smaller batch, e.g. an epoch's last one, allocates nothing), else in
 * a new arena that replaces it. */
gt_status gt_model_prepare(gt_model *model, const gt_tensor *input);

/* gt_model_prepare for gt_model_forward, whose result (the logits) is planned whole. */
gt_status gt_model_prepare_forward(gt_model *model, const gt_tensor *input);

/* Re-initialises every parameter from `seed` (PyTorch's default distributions). */
gt_status gt_model_init_params(gt_model *model, uint64_t seed);

/* Refreshes the half-precision copy of the parameters (all but the lookup tables no GEMM reads,
 * GT_KIND_LOOKUP) from the f32 master (after an update or a load). */
gt_status gt_model_refresh_lowp(gt_model *model);

/* Refreshes the half copy of the trainable parameters only: after an optimizer step, which
 * leaves frozen parameters (no gradient) as they were, so their half copy is still theirs. */
gt_status gt_model_refresh_trainable_lowp(gt_model *model);

/* Forward of the whole model on `input`; returns the output tensor (in the arena). */
gt_status gt_model_forward(gt_model *model, const gt_tensor *input, uint64_t micro,
                           gt_tensor *output);

/* gt_model_forward for a training step: with loss_chunk_rows the LM head is left to the loss and
 * the backward (the plan has no whole logits), and *output has the logits' shape but no data. */
gt_status gt_model_forward_step(gt_model *model, const gt_tensor *input, uint64_t micro,
                                gt_tensor *output);

/* Sets loss_chunk_rows (0: off); fails, naming it, for a negative count or a model whose last
 * layer is not a Linear, changing nothing. The activations are re-planned. */
gt_status gt_model_set_loss_chunk_rows(gt_model *model, int64_t rows);

/* Checks `targets` (dtype, count) against the planned output for `loss`, before any forward. */
gt_status gt_model_check_targets(const gt_model *model, const gt_loss *loss, const gt_tensor *targets);

/* Loss of the last forward against `targets`: writes model->dout scaled by
 * f32(*loss_scale / dloss_divisor) (gt_dloss_scale; loss_scale is the model's memory, read when
 * the loss op runs, NULL: 1) and adds
 * the mean loss (cross-entropy: the per-row losses summed in row order in float64, over the
 * rows that count; MSE: its mean) to *loss_sum. loss_sum is the model's memory: a host double on
 * the cpu; on a device model it lies in device memory (a step record's loss_sum; the record's
 * count and mse take the op's results) and the sum is queued on the model's stream
 * (core/loss_mean.h), so nothing waits. */
gt_status gt_model_loss(gt_model *model, const gt_loss *loss, const gt_tensor *targets,
                        const float *loss_scale, float dloss_divisor, double *loss_sum);

/* Backward of the whole model from model->dout (after forward and loss on the same input). */
/* Told, during a backward, that the gradients [final_from, num_params) are final (no layer
 * still to run writes them): called after each of the model's top-level layers but the first. */
typedef struct gt_backward_hook {
    gt_status (*final)(void *ctx, size_t final_from);  /* final_from: f32 elements */
    void *ctx;                                         /* final's state */
} gt_backward_hook;

/* gt_model_backward, calling `hook` as the gradients become final. */
gt_status gt_model_backward_hooked(gt_model *model, const gt_tensor *input, uint64_t micro, int accumulate,
                                   const gt_backward_hook *hook);

gt_status gt_model_backward(gt_model *model, const gt_tensor *input, uint64_t micro,
                            int accumulate);

/* Changes the activation precision; the half copy is (re)built (a model built for planning only:
 * nothing is allocated, its plans follow). */
gt_status gt_model_set_dtype(gt_model *model, gt_dtype dt);

/* Freezes parameters: frozen[i] (1: requires_grad False) for parameter i of parameter_layout's
 * order (state_dict order, a shared module's once), `count` of them. A frozen parameter has no
 * gradient (the gradient arena holds the trainable ones only, packed in that order) and its
 * layer spends no work on its gradient. Refuses (GT_ERR_VALUE naming the parameter) a kind that
 * cannot skip a parameter's gradient; on any failure the model is as it was. The gradients of
 * parameters trainable before and after are kept; newly trainable ones start at zero. The old
 * gradient arena is handed to *retired (its memory may still be viewed by the caller; it frees it
 * with gt_arena_destroy), or freed when retired is NULL. */
gt_status gt_model_set_frozen(gt_model *model, const unsigned char *frozen, size_t count, gt_arena *retired);

/* 1 when a parameter of `layer`'s kind can be frozen (the kind skips its gradient). */
int gt_layer_can_freeze(const gt_layer *layer);

/* out[i] = 1 when parameter i (parameter_layout's order, `count` of them) may be frozen: every
 * layer that reads it is of a kind that can skip its gradient. */
gt_status gt_model_freezable(const gt_model *model, unsigned char *out, size_t count);

/* The parameters in parameter_layout's order (a shared module's once): up to `max` pointers into
 * out; returns how many there are. */
size_t gt_model_list_params(const gt_model *model, const gt_param **out, size_t max);

/* Copies the (num_params,) f32 parameters or (num_grads,) gradients to host memory `host` (from the device
 * for a device model), or writes the parameters from `host` (the half copy is refreshed). */
gt_status gt_model_read_parameters(gt_model *model, float *host);
gt_status gt_model_read_gradients(gt_model *model, float *host);
gt_status gt_model_write_parameters(gt_model *model, const float *host);

/* Copies the (buffer_bytes,) buffer arena to host memory `host`, or writes it from `host`. */
gt_status gt_model_read_buffers(gt_model *model, void *host);
gt_status gt_model_write_buffers(gt_model *model, const void *host);

/* Copies the buffers aside (a training step's start), or back (the step failed: its forwards'
 * updates of the running statistics are undone). */
gt_status gt_model_save_buffers(gt_model *model);
gt_status gt_model_restore_buffers(gt_model *model);

/* Writes zeros into every gradient (zero_grad(set_to_none=False)). */
gt_status gt_model_zero_gradients(gt_model *model);

/* Converts a tensor of the model's memory (e.g. the output of gt_model_forward) into
 * (numel,) f32 values in host memory `host`. */
gt_status gt_model_read_tensor(gt_model *model, const gt_tensor *t, float *host);

#ifdef __cplusplus
}
#endif
#endif
