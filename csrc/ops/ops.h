/* The op table every backend implements (DESIGN.md, "A backend is a table of op function
 * pointers"). Conventions, after llm.c: outputs first, then inputs, then sizes; matrices are
 * row-major; `n`, `rows`, `cols` count elements; pointers are device pointers of the backend.
 *
 * Precision: parameters and their gradients are always f32. Activations (`dt` arguments) are
 * f32, f16 or bf16: ops load them into f32, compute in f32 and round the result once into
 * `dt` with the shared RNE conversions (core/half.h). Reductions (softmax, LayerNorm
 * statistics, losses, norms) accumulate in f32 or wider.
 *
 * Gradient accumulation: ops that produce parameter gradients take `accumulate`: 0 writes the
 * gradient (the first backward after zero_grad(set_to_none=True)), 1 adds to it. Ops never
 * allocate: scratch memory comes from the backend's workspace, sized by the plan through
 * `gemm_workspace_bytes`. */
#ifndef GT_OPS_H
#define GT_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_backend gt_backend;

typedef enum gt_gelu_kind {
    GT_GELU_ERF = 0,   /* exact: x * Phi(x) */
    GT_GELU_TANH = 1,  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
} gt_gelu_kind;

typedef enum gt_activation {
    GT_ACT_RELU = 0,
    GT_ACT_GELU_ERF = 1,
    GT_ACT_GELU_TANH = 2,
    GT_ACT_TANH = 3,
    GT_ACT_SILU = 4,
} gt_activation;

/* Where a dropout mask comes from: Philox(seed; stream_a = layer, stream_b = step; index). */
typedef struct gt_dropout_key {
    uint64_t seed;    /* the model's seed */
    uint32_t layer;   /* layer id, unique per dropout layer in a model */
    uint32_t step;    /* training step (micro-batches of one step share it, see micro) */
    uint64_t offset;  /* element offset of this micro-batch: micro index * elements per micro */
} gt_dropout_key;

/* Arguments of a GEMM: C = alpha * op(A) @ op(B) + beta * C, row-major.
 * op(A) is (m, k): A is (m, k) with lda >= k, or (k, m) with lda >= m when trans_a.
 * op(B) is (k, n): B is (k, n) with ldb >= n, or (n, k) with ldb >= k when trans_b. */
typedef struct gt_gemm_args {
    int trans_a;            /* 1 when A is stored transposed */
    int trans_b;            /* 1 when B is stored transposed */
    int64_t m, n, k;        /* logical sizes of op(A) (m, k) and op(B) (k, n) */
    float alpha;            /* scale of the product */
    const void *a;          /* A; dtype a_dt */
    gt_dtype a_dt;          /* f32, f16 or bf16 */
    int64_t lda;            /* leading dimension of A in elements */
    const void *b;          /* B; dtype b_dt */
    gt_dtype b_dt;          /* f32, f16 or bf16 */
    int64_t ldb;            /* leading dimension of B in elements */
    float beta;             /* 0 overwrites C (without reading it), 1 accumulates */
    void *c;                /* C; dtype c_dt */
    gt_dtype c_dt;          /* f32, f16 or bf16 */
    int64_t ldc;            /* leading dimension of C in elements */
    int64_t batch;          /* number of GEMMs (1 for a plain GEMM) */
    int64_t stride_a;       /* elements between consecutive A matrices (batch > 1) */
    int64_t stride_b;       /* elements between consecutive B matrices */
    int64_t stride_c;       /* elements between consecutive C matrices */
} gt_gemm_args;

/* Where the elements of an attention operand lie: element (b, h, t, d) of a
 * (batch, heads, seq, head_dim) operand is at base + b * batch + h * head + t * row + d. The
 * layer's fused layout (batch, seq, 3, heads, head_dim) gives q, k, v strides
 * (seq * 3 E, D, 3 E) with k = q + E, v = q + 2 E (E = heads * D); its output (batch, seq,
 * heads, head_dim) has strides (seq * E, D, E); separate (batch, heads, seq, head_dim) arrays
 * have (heads * seq * D, seq * D, D). */
typedef struct gt_attn_strides {
    int64_t batch;  /* elements between consecutive batch entries */
    int64_t head;   /* elements between consecutive heads */
    int64_t row;    /* elements between consecutive positions */
} gt_attn_strides;

/* Scaled dot-product attention, per batch entry b and head h:
 *   S = scale * Q K^T (seq, seq), masked: query i sees key j when j < key_lengths[b] (all keys
 *   when key_lengths is NULL) and, if causal, j <= i; P = softmax(S) over the visible keys;
 *   out = (P * M) V with M the dropout multipliers (0 or gt_dropout_scale(p)) of element
 *   g = key.offset + ((b * heads + h) * seq + i) * seq + j under the rule of core/dropout.h.
 * A query that sees no key gets out = 0, lse = -inf and zero gradients. lse (the log-sum-exp of
 * the visible scaled scores) is what the backward needs besides the inputs and out: P is never
 * stored. */
typedef struct gt_attention_args {
    int64_t batch, heads, seq, head_dim;  /* B, H, T, D */
    const void *q, *k, *v;         /* (B, H, T, D) at `in` strides; dtype dt */
    void *out;                     /* (B, H, T, D) at `out` strides; forward writes, backward reads */
    float *lse;                    /* (B, H, T) f32, contiguous; forward writes, backward reads */
    const void *dout;              /* backward: (B, H, T, D) at `out` strides */
    void *dq, *dk, *dv;            /* backward: (B, H, T, D) at `in` strides, written; may not
                                      overlap q, k, v, out or dout */
    gt_attn_strides in;            /* strides of q, k, v, dq, dk, dv */
    gt_attn_strides out_strides;   /* strides of out and dout */
    float scale;                   /* multiplies Q K^T, usually 1 / sqrt(D) */
    int causal;                    /* 1: query i sees keys j <= i */
    const int64_t *key_lengths;    /* (B,) keys visible per batch entry, in [0, T], or NULL */
    double dropout_p;              /* probability dropout in [0, 1] (0: none) */
    gt_dropout_key dropout_key;    /* Philox key of the probability dropout */
    gt_dtype dt;                   /* f32, f16 or bf16 */
} gt_attention_args;

typedef struct gt_ops {
    const char *name;  /* "cpu" or "cuda" */

    /* Scratch bytes the backend needs to run `args` (e.g. to widen half inputs). */
    size_t (*gemm_workspace_bytes)(const gt_gemm_args *args);
    gt_status (*gemm)(gt_backend *be, const gt_gemm_args *args);

    /* out[r, c] += bias[c] for rows x cols; out has dtype dt, bias is f32. */
    gt_status (*bias_add)(gt_backend *be, void *out, const float *bias, int64_t rows,
                          int64_t cols, gt_dtype dt);
    /* dbias[c] (+)= sum over rows of dout[r, c]; fixed summation order (deterministic). */
    gt_status (*bias_backward)(gt_backend *be, float *dbias, const void *dout, int64_t rows,
                               int64_t cols, gt_dtype dt, int accumulate);

    /* out = act(in), elementwise over n. */
    gt_status (*activation_forward)(gt_backend *be, void *out, const void *in, int64_t n,
                                    gt_activation act, gt_dtype dt);
    /* din = dout * act'(in), elementwise over n (din may alias dout; NULL din: nothing to do). */
    gt_status (*activation_backward)(gt_backend *be, void *din, const void *dout,
                                     const void *in, int64_t n, gt_activation act, gt_dtype dt);

    /* out = in * mask * gt_dropout_scale(p) with mask = uniform(key, i) >= (float)p; p in
     * [0, 1] (p = 1: out = in * 0). p is a double so the scale is rounded as PyTorch's. */
    gt_status (*dropout_forward)(gt_backend *be, void *out, const void *in, int64_t n, double p,
                                 gt_dropout_key key, gt_dtype dt);
    /* din = dout * mask * gt_dropout_scale(p), the mask regenerated from the same key (NULL din:
     * nothing to do). */
    gt_status (*dropout_backward)(gt_backend *be, void *din, const void *dout, int64_t n,
                                  double p, gt_dropout_key key, gt_dtype dt);

    /* out = a + b elementwise (out may alias a or b). */
    gt_status (*add)(gt_backend *be, void *out, const void *a, const void *b, int64_t n,
                     gt_dtype dt);

    /* LayerNorm over the last dim: out = (in - mean) * rstd * weight + bias (bias may be NULL:
     * no bias). mean, rstd: (rows,) f32, saved for backward. */
    gt_status (*layernorm_forward)(gt_backend *be, void *out, float *mean, float *rstd,
                                   const void *in, const float *weight, const float *bias,
                                   int64_t rows, int64_t cols, float eps, gt_dtype dt);
    /* din = dLN/din (written; may alias dout; NULL: not wanted, only the parameter gradients are
     * computed); dweight, dbias (+)= per `accumulate`; dbias may be NULL (no bias). */
    gt_status (*layernorm_backward)(gt_backend *be, void *din, float *dweight, float *dbias,
                                    const void *dout, const void *in, const float *weight,
                                    const float *mean, const float *rstd, int64_t rows,
                                    int64_t cols, gt_dtype dt, int accumulate);

    /* out[i, :] = table[ids[i], :] for i < n; ids checked against num (GT_ERR_INDEX; a device
     * backend may return it at its stream's next synchronisation). */
    gt_status (*embedding_forward)(gt_backend *be, void *out, const int64_t *ids,
                                   const float *table, int64_t n, int64_t num, int64_t dim,
                                   gt_dtype dt);
    /* dtable[ids[i], :] (+)= dout[i, :]; deterministic (fixed order per row of dtable). */
    gt_status (*embedding_backward)(gt_backend *be, float *dtable, const void *dout,
                                    const int64_t *ids, int64_t n, int64_t num, int64_t dim,
                                    gt_dtype dt, int accumulate);

    /* Fused softmax + cross-entropy over logits (rows, classes) with integer targets.
     * losses[r] = per-row loss (0 for ignored rows); *count = rows not ignored (count, like
     * losses, is the backend's memory: on a device it is written when the stream runs the op).
     * When dlogits is non-NULL it receives dloss_scale * d(mean loss)/dlogits, i.e. for a
     * counted row (softmax - smoothed_one_hot) * dloss_scale / count (may alias logits).
     * label_smoothing in [0, 1]; targets equal to ignore_index are skipped; others must be in
     * [0, classes) (GT_ERR_INDEX naming the row otherwise; a device backend may return it at
     * its stream's next synchronisation). */
    gt_status (*softmax_xent)(gt_backend *be, float *losses, int64_t *count, void *dlogits,
                              const void *logits, const int64_t *targets, int64_t rows,
                              int64_t classes, float label_smoothing, int64_t ignore_index,
                              float dloss_scale, gt_dtype dt);
    /* Mean squared error over n elements: *loss = mean((pred - target)^2) (loss is the
     * backend's memory, written when the stream runs the op);
     * dpred (if non-NULL) = dloss_scale * 2 (pred - target) / n. target is f32. */
    gt_status (*mse)(gt_backend *be, float *loss, void *dpred, const void *pred,
                     const float *target, int64_t n, float dloss_scale, gt_dtype dt);

    /* *out = sum of x[i]^2 over n f32 values, in a fixed order (same result for any threads). */
    gt_status (*sum_squares)(gt_backend *be, double *out, const float *x, int64_t n);

    /* dst = src converted between f32/f16/bf16 (RNE), n elements. */
    gt_status (*cast)(gt_backend *be, void *dst, gt_dtype dst_dt, const void *src,
                      gt_dtype src_dt, int64_t n);
    /* dst = src (bytes). */
    gt_status (*copy)(gt_backend *be, void *dst, const void *src, size_t bytes);
    /* dst = 0 (bytes). */
    gt_status (*zero)(gt_backend *be, void *dst, size_t bytes);

    /* Scaled dot-product attention (gt_attention_args): scratch bytes for `args` when run with
     * up to `threads` threads (fewer are used when the workspace holds fewer), forward (writes
     * out and lse) and backward (writes dq, dk, dv). NULL where a backend has no attention (last in
     * the table, so a positional table without them leaves them NULL). */
    size_t (*attention_workspace_bytes)(const gt_attention_args *args, int threads);
    gt_status (*attention_forward)(gt_backend *be, const gt_attention_args *args);
    gt_status (*attention_backward)(gt_backend *be, const gt_attention_args *args);
} gt_ops;

/* A backend instance: its op table plus the scratch memory ops may use. */
struct gt_backend {
    const gt_ops *ops;      /* the functions */
    gt_device device;       /* where its pointers live */
    void *workspace;        /* scratch memory owned by the caller (a model's plan) */
    size_t workspace_bytes; /* size of workspace */
    void *impl;             /* backend-specific state (CUDA: stream and handles); NULL on CPU */
};

/* The CPU backend's table (csrc/ops/cpu_*.c). */
const gt_ops *gt_cpu_ops(void);

#ifdef __cplusplus
}
#endif
#endif
