/* Layers: a model is a tree of gt_layer (Sequential and Residual nest). Each layer kind is a row
 * of the table of kinds (nn/kind.h, nn/kind_list.h): its arguments, parameters and their init,
 * plan (shapes and bytes for an input shape), forward and backward.
 *
 * Memory (DESIGN.md principle 1): parameters, gradients and activations each live in one
 * arena sized by the plan. Parameters are packed back to back (f32, no padding) so the
 * optimizer sees one flat slice; gradients use the same layout. Each layer writes its output
 * into an activation buffer of its own, except Flatten (a view). With gradient checkpointing a
 * Residual keeps its input and output only: the inside of its block is planned into a shared
 * recompute region and re-run during backward.
 *
 * Backward passes gradients through scratch buffers: nesting level L (a Sequential at depth L)
 * ping-pongs between the two scratch buffers of level L, so a Residual's incoming gradient is
 * never overwritten by its block. A module used more than once is one layer per use whose
 * parameters are those of its first use (`tied`): they are laid out, initialised and listed
 * once, and every use but the last adds its gradients, so they are summed as in PyTorch.
 * A NULL `din` means the input gradient is not needed (the
 * first layer of the model): no work is spent on it. */
#ifndef GT_NN_LAYER_H
#define GT_NN_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "nn/kind_list.h"
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GT_MAX_NESTING = 16 };

/* Gradient checkpointing (gt_model.checkpointing): what a checkpointed unit keeps for backward. */
enum {
    GT_CHECKPOINT_OFF = 0,      /* none: every layer keeps its activations */
    GT_CHECKPOINT_ON = 1,       /* units keep their input on the device and recompute the rest */
    GT_CHECKPOINT_OFFLOAD = 2,  /* as ON, but units side by side keep their outputs in pinned host
                                   memory, copied there after their forward and back for backward */
};

/* GT_LAYER_LINEAR, ...: one value per row of GT_LAYER_KIND_LIST (nn/kind_list.h), whose rows
 * (nn/kind.h) say what each kind takes and computes. */
#define GT_LAYER_KIND_ENUM(NAME, name) GT_LAYER_##NAME,
typedef enum gt_layer_kind { GT_LAYER_KIND_LIST(GT_LAYER_KIND_ENUM) GT_LAYER_KIND_COUNT } gt_layer_kind;
#undef GT_LAYER_KIND_ENUM

/* How a parameter starts (nn/init.c): one Philox stream per parameter, in state_dict order. */
typedef enum gt_init_rule {
    GT_INIT_FAN_IN_UNIFORM = 0,  /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = the layer's
                                    weight.numel / weight.shape[0] (PyTorch's Linear/Conv) */
    GT_INIT_NORMAL = 1,          /* N(0, 1) (PyTorch's Embedding) */
    GT_INIT_CONSTANT = 2,        /* every element = init_value */
} gt_init_rule;

enum { GT_LAYER_CONFIG_BYTES = 128 };  /* room for a kind's own hyper-parameters */

typedef struct gt_layer gt_layer;

/* A parameter of a layer: where it lives in the parameter and gradient arenas. */
typedef struct gt_param {
    float *data;          /* (numel,) in the parameter arena */
    float *grad;          /* (numel,) in the gradient arena at grad_offset; NULL when frozen */
    void *lowp;           /* (numel,) half-precision copy for GEMMs in f16/bf16 mode, else NULL */
    size_t offset;        /* elements from the start of the parameter arena */
    int has_lowp;         /* 1: it has a half copy in f16/bf16 mode (all but the tables of
                             GT_KIND_LOOKUP kinds that no GEMM reads) */
    size_t lowp_offset;   /* has_lowp: elements from the start of the half copy */
    size_t grad_offset;   /* elements from the start of the gradient arena (trainable only) */
    int frozen;           /* 1: requires_grad False (gt_model_set_frozen): no gradient, no
                             weight-gradient work in backward */
    size_t numel;         /* elements */
    int ndim;             /* 1, 2 or 4 */
    int64_t shape[4];     /* (out, in) for weights, (out, in / groups, kh, kw) for convolution
                             weights, (n,) for vectors */
    gt_init_rule init;    /* how it starts */
    float init_value;     /* GT_INIT_CONSTANT: the value */
} gt_param;

struct gt_layer {
    gt_layer_kind kind;        /* what this layer computes */
    /* configuration */
    int64_t in_features;       /* Linear: input width; LayerNorm: normalised dim; Attention:
                                  embed_dim E; Conv2d: in_channels; BatchNorm2d: num_features C */
    int64_t out_features;      /* Linear: output width; Conv2d: out_channels */
    int has_bias;              /* Linear/LayerNorm/Conv2d: 1 when a bias exists; BatchNorm2d: 1 when
                                  affine (weight and bias) */
    gt_activation activation;  /* Activation: which function */
    double p;                  /* Dropout, Attention: drop probability in [0, 1] */
    uint32_t dropout_id;       /* Dropout, Attention: layer id in the Philox key, unique in the
                                  model */
    float eps;                 /* LayerNorm, BatchNorm2d: variance epsilon */
    int64_t num_embeddings;    /* Embedding: rows of the table; Position: positions */
    int64_t embedding_dim;     /* Embedding, Position: columns of the table */
    int64_t position_offset;   /* Position: the table row added at position 0 (rows [offset, offset + T)
                                  are used; RoBERTa's: padding_idx + 1) */
    int64_t num_heads;         /* Attention: heads H (head_dim = in_features / H) */
    int causal;                /* Attention: 1 when query t sees only keys <= t */
    int64_t type_vocab;        /* Tokens: token types S (table rows [V, V + S), V = num_embeddings);
                                  0: the input has no type channel */
    int has_mask;              /* Tokens: 1 when the input's last channel is the 0/1 attention mask */
    gt_pool_mode pool;         /* Pool: which pooling */
    int64_t kernel[2];         /* Conv2d: kernel (height, width) */
    int64_t stride[2];         /* Conv2d: stride (rows, columns) */
    int64_t padding[2];        /* Conv2d: zeros added on each side (rows, columns) */
    int64_t dilation[2];       /* Conv2d: spacing of kernel elements (rows, columns) */
    int64_t groups;            /* Conv2d: channel groups (in and out channels divisible by it) */
    double momentum;           /* BatchNorm2d: weight of a batch in the running statistics; < 0:
                                  cumulative average (PyTorch's momentum=None) */
    int track_running_stats;   /* 1 when it keeps running statistics: BatchNorm2d's buffers (only
                                  BatchNorm2d sets it; the buffer code reads it alone) */
    gt_pool2d_args pool2d;     /* Pool2d: kind, kernel, stride, padding, dilation, count_include_pad
                                  (ceil_mode only shapes out_h/out_w); sizes set by the plan */
    int ceil_mode;             /* Pool2d MAX/AVG: 1 rounds the output size up */
    unsigned char config[GT_LAYER_CONFIG_BYTES]; /* a kind's own hyper-parameters: its struct,
                                  copied in and out with memcpy (GT_ARG_CONFIG, nn/kind.h) */
    gt_layer *children;        /* Sequential: its layers; Residual: one child, the block */
    size_t num_children;       /* length of children */
    /* parameters (Linear: weight (out, in), bias (out,); LayerNorm: weight, bias (dim,);
       Embedding: weight (num, dim); Conv2d: weight (out, in / groups, kh, kw), bias (out,)) */
    gt_param weight;           /* numel 0 when absent */
    gt_param bias;             /* numel 0 when absent */
    const gt_layer *tied;      /* Linear/LayerNorm/Embedding/Position/Conv2d: the first use of the same
                                  module, whose parameters this later use shares (weight tying),
                                  else NULL; a Linear may also share an Embedding's (num, dim)
                                  table as its (out, in) weight (an LM head tied to the tokens) */
    int grad_accumulates;      /* 1: adds its parameter gradients in every backward, because a later
                                  use of the same parameters (run before it in backward) wrote them */
    /* plan for the current input shape */
    gt_tensor in_shape;        /* shape and dtype of the input (ptr unused) */
    gt_tensor out;             /* output activation (ptr into an activation region) */
    float *mean;               /* LayerNorm: (rows,), BatchNorm2d: (C,) saved statistics */
    float *rstd;               /* LayerNorm: (rows,), BatchNorm2d: (C,) saved statistics */
    float *lse;                /* Attention: (B, H, T) saved log-sum-exp of each query's scores */
    int64_t *lengths;          /* Tokens with a mask: (B,) keys per sequence, written by forward */
    int64_t *key_starts;       /* Tokens with position ids: (B, T) first key of each query's segment,
                                  written by forward */
    int64_t *last_tokens;      /* Tokens with a pad_token_id: (B,) last token that is not padding,
                                  written by forward */
    float *inv_freq;           /* Rope: (head_dim / 2,) f32 inverse frequencies in the activation
                                  arena, written by the plan when it places the layer */
    /* buffers: state that is not a parameter (not optimised, no gradient), in the model's buffer
       arena, shared by every use of the module */
    size_t buffer_offset;      /* BatchNorm2d: bytes from the start of the buffer arena */
    float *running_mean;       /* BatchNorm2d: (C,) f32, or NULL without running statistics */
    float *running_var;        /* BatchNorm2d: (C,) f32 unbiased running variance, or NULL */
    int64_t *num_batches_tracked; /* BatchNorm2d: (1,) batches folded in, or NULL */
    size_t frozen_offset;      /* a kind with frozen buffers (nn/kind.h; QLinear's packed weight):
                                  bytes from the start of the buffer arena to its first piece */
    char *frozen;              /* the buffer arena at frozen_offset (NULL without frozen buffers) */
    const float *quant_code;   /* QLinear, a 4-bit Tokens table: (16,) f32 decoding table in the
                                  activation arena, written by the plan when it places the layer */
    int checkpointed;          /* Residual, Checkpoint: 1 when its block is recomputed in backward */
    void *offload_host;        /* Residual, Checkpoint with offloaded checkpoints: (out bytes) host copy
                                  of its output, whose device buffer is a slot it shares (nn/plan.c);
                                  NULL when the output stays in its own device buffer */
    int level;                 /* nesting depth of the Sequential holding this layer */
};

/* Everything a forward or backward call needs besides the layer itself. */
typedef struct gt_run {
    gt_backend *backend;            /* ops and workspace */
    gt_dtype dt;                    /* activation precision */
    int training;                   /* 1 in train mode (dropout active) */
    uint64_t seed;                  /* model seed for dropout */
    uint32_t step;                  /* training step for dropout */
    uint64_t micro_offset;          /* micro-batch index for dropout keys */
    int accumulate;                 /* 0: parameter gradients are written, 1: added */
    const int64_t *key_lengths;     /* (B,) keys per sequence of the micro-batch (the model's
                                       memory), read by Attention and Pool; NULL: all keys */
    const int64_t *positions;       /* (B, T) position ids of the micro-batch (the Tokens layer's
                                       position channel, row b at b * positions_stride), read by
                                       Rope; NULL: 0..T-1 */
    int64_t positions_stride;       /* elements between rows of positions */
    const int64_t *key_starts;  /* (B, T) first visible key of each query, or NULL */
    const int64_t *last_tokens;     /* (B,) each entry's last token (Pool "last"); NULL: T - 1 */
    struct gt_copy_stream *copies;  /* the model's stream for offloaded checkpoints' copies, or NULL */
    int recompute;                  /* 1 while a checkpointed block re-runs its forward in backward:
                                       running statistics are not updated a second time */
    void *scratch[GT_MAX_NESTING][2]; /* backward ping-pong buffers per nesting level */
    const gt_layer *hooked;         /* the Sequential whose children's backward each end with
                                       child_done(run, child), or NULL */
    gt_status (*child_done)(const struct gt_run *run, size_t child);
    void *hook_ctx;                 /* child_done's state */
} gt_run;

/* Forward of one layer; `in` has the planned input shape. */
gt_status gt_layer_forward(gt_layer *layer, const void *in, gt_run *run);

/* Backward of one layer: din (may be NULL) from dout; parameter gradients per run->accumulate.
 * `in` is the layer's forward input. */
gt_status gt_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                            gt_run *run);

/* Per-kind functions of the kinds that predate the table (rows in nn/kinds.c). */
gt_status gt_activation_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_activation_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                 gt_run *run);
gt_status gt_dropout_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_dropout_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                              gt_run *run);
gt_status gt_flatten_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_flatten_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                              gt_run *run);
gt_status gt_linear_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_linear_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                             gt_run *run);
gt_status gt_layernorm_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_layernorm_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                gt_run *run);
gt_status gt_embedding_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_embedding_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                gt_run *run);
gt_status gt_attention_layer_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_attention_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                      gt_run *run);
/* The attention op's arguments for the layer's planned shape (pointers unset); its input width
 * (H + 2K) D and output width H D. */
gt_attention_args gt_attention_layer_args(const gt_layer *layer, const gt_tensor *in);
int64_t gt_attention_in_width(const gt_layer *layer);
int64_t gt_attention_out_width(const gt_layer *layer);
/* Tokens' own hyper-parameters (in gt_layer.config; the rest are gt_layer fields). */
typedef struct gt_tokens_config {
    int position_ids;      /* 1: the input's last channel holds position ids (decoders) */
    int64_t pad_token_id;  /* the id of padding, whose rightmost non-pad token is the last token;
                              -1: none (the last token is T - 1) */
    int stored;            /* how the table is held (gt_tokens_stored): a parameter, or frozen alone */
    int64_t blocksize;     /* 4-bit table: elements per absmax block (divides embedding_dim); else 0 */
} gt_tokens_config;
/* How a TokenEmbedding holds its table: an f32 parameter; a frozen buffer (rows, dim) in bf16 or f16
 * alone (no f32 master, no gradient); or frozen 4-bit codes (NF4 or FP4, two a byte, bitsandbytes'
 * layout over the flattened table) and an f32 absmax per block of `blocksize` elements. */
typedef enum gt_tokens_stored {
    GT_TOKENS_F32 = 0,
    GT_TOKENS_BF16 = 1,
    GT_TOKENS_F16 = 2,
    GT_TOKENS_NF4 = 3,
    GT_TOKENS_FP4 = 4,
} gt_tokens_stored;
int gt_tokens_has_positions(const gt_layer *layer);
/* The table's element type: GT_F32 (a parameter), GT_BF16 / GT_F16 (a frozen half buffer) or GT_U8
 * (frozen 4-bit codes). */
gt_dtype gt_tokens_table_dtype(const gt_layer *layer);
/* 1 for a Linear tied to a TokenEmbedding table held frozen alone in f16/bf16 (nn/linear.c). */
int gt_linear_reads_half_table(const gt_layer *layer);
/* The absmax block of a 4-bit table; 0 for the others. */
int64_t gt_tokens_blocksize(const gt_layer *layer);
/* 1 for an NF4 table, 0 for the others (an FP4 one among them). */
int gt_tokens_nf4(const gt_layer *layer);
int64_t gt_tokens_pad_token_id(const gt_layer *layer);
gt_status gt_tokens_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_tokens_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                             gt_run *run);
gt_status gt_pool_forward(gt_layer *layer, const void *in, gt_run *run);
/* din may be NULL: nothing to do */
gt_status gt_pool_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run);
gt_status gt_position_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_position_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                               gt_run *run);
gt_status gt_conv2d_layer_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_conv2d_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                   gt_run *run);
/* The convolution op's arguments for the layer and an (N, C, H, W) input (pointers unset). */
gt_conv2d_args gt_conv2d_layer_args(const gt_layer *layer, const gt_tensor *in);
gt_status gt_batchnorm2d_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_batchnorm2d_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                  gt_run *run);
gt_status gt_pool2d_layer_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_pool2d_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                   gt_run *run);
/* Fails, naming the layer, when a BatchNorm2d of the tree would normalise a single value per
 * channel with batch statistics (PyTorch's rule in training) for the planned shapes. */
gt_status gt_batchnorm2d_check_tree(const gt_layer *layer, int training);
gt_status gt_sequential_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_sequential_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                 gt_run *run);
gt_status gt_checkpoint_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_checkpoint_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run);
gt_status gt_residual_forward(gt_layer *layer, const void *in, gt_run *run);
gt_status gt_residual_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                               gt_run *run);

/* 1 when the layer adds its parameter gradients (run->accumulate, or a shared use's rule). */
int gt_layer_accumulates(const gt_layer *layer, const gt_run *run);

/* 1 when `layer` or a layer inside it has a parameter that is not frozen. */
int gt_layer_trains(const gt_layer *layer);

/* The first of children [0, n) of `layer` that trains (gt_layer_trains); n when none does. */
size_t gt_first_trained_child(const gt_layer *layer, size_t n);

/* Rows of a tensor seen as (rows, last dim). */
int64_t gt_rows_of(const gt_tensor *t);

/* Elements of the layer's output. */
int64_t gt_layer_out_numel(const gt_layer *layer);

/* Frees the children arrays of a layer tree (not the layer itself). */
void gt_layer_free_children(gt_layer *layer);

#ifdef __cplusplus
}
#endif
#endif
