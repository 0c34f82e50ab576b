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
 * `gemm_workspace_bytes`.
 *
 * How to add an op (say `foo`): in this file, write its contract comment and its parameters once,
 * `#define GT_PARAMS_FOO(P, A) P(void *, out) P(const void *, in) P(int64_t, n) P(gt_dtype, dt)`
 * (an argument struct is `A(gt_foo_args, args)`), and append `X(LAUNCH, foo, GT_PARAMS_FOO,
 * NO_SKIP)` to GT_OP_LIST (QUERY / WAIT / SKIP_IF_NULL(arg) where its contract
 * says so). Define `gt_status gt_cpu_foo(...)` in a csrc/ops/cpu_*.c file: the CPU declaration and
 * table, the sim backend (a job per call, run by the CPU op) and the device counters follow from
 * the list. With a CUDA kernel, define `gt_cuda_foo` in a cuda/ops_*.cu file and add `X(foo)` to
 * GT_CUDA_OP_LIST (cuda/ops_kernels.cuh); a backend that lacks an op has NULL there, which the
 * plan checks. What is still written by hand: the op's use in a layer (csrc/nn/), its test
 * binding (csrc/py/ops.c, or csrc/py_testing/ops_cnn.c, and run_op's table in
 * csrc/py_testing/run_op.c to run it on sim or CUDA), its Python wrapper (python/gputrain/functional.py) and stub (_C.pyi, checked against
 * the module by tests/test_stub_and_op_table.py), and its tests. */
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
 * have (heads * seq * D, seq * D, D). With K kv heads the decoder's fused (batch, seq, (H + 2K) D)
 * projection [q heads | k heads | v heads] gives q, k and v the strides (seq * W, D, W),
 * W = (H + 2K) D, with k = q + H D and v = q + (H + K) D. */
typedef struct gt_attn_strides {
    int64_t batch;  /* elements between consecutive batch entries */
    int64_t head;   /* elements between consecutive heads */
    int64_t row;    /* elements between consecutive positions */
} gt_attn_strides;

/* Scaled dot-product attention, per batch entry b and query head h (of H; kv head
 * g = h / (H / K) of the K = kv_heads heads of k and v: grouped-query attention, Hugging Face's
 * repeat_kv, without ever expanding k or v per query head):
 *   S = scale * Q_h K_g^T (seq, seq), masked: query i sees key j when all of
 *     j < key_lengths[b] (all keys when key_lengths is NULL),
 *     j <= i if causal,
 *     j > i - window if window > 0 (a sliding window of `window` keys ending at i when causal),
 *     j >= key_starts[b * seq + i] if key_starts is not NULL (packed documents, left padding);
 *   so each query sees one range [lo_i, hi_i) of keys; P = softmax(S) over it;
 *   out = (P * M) V_g with M the dropout multipliers (0 or gt_dropout_scale(p)) of element
 *   g = key.offset + ((b * heads + h) * seq + i) * seq + j under the rule of core/dropout.h.
 * A query that sees no key (an empty range) gets out = 0, lse = -inf and zero gradients (dq = 0,
 * and it adds nothing to dk, dv): no NaN. lse (the log-sum-exp of the visible scaled scores) is
 * what the backward needs besides the inputs and out: P is never stored. dk and dv of kv head g
 * sum the contributions of its H / K query heads in increasing h. */
typedef struct gt_attention_args {
    int64_t batch, heads, seq, head_dim;  /* B, H, T, D */
    int64_t kv_heads;              /* K: heads of k and v, >= 1, divides H (K = H: plain MHA) */
    const void *q, *k, *v;         /* q (B, H, T, D) at `in` strides, k and v (B, K, T, D) at
                                      `kv` strides; dtype dt */
    void *out;                     /* (B, H, T, D) at `out` strides; forward writes, backward reads */
    float *lse;                    /* (B, H, T) f32, contiguous; forward writes, backward reads */
    const void *dout;              /* backward: (B, H, T, D) at `out` strides */
    void *dq, *dk, *dv;            /* backward: dq at `in`, dk and dv at `kv` strides, written; may
                                      not overlap q, k, v, out or dout */
    gt_attn_strides in;            /* strides of q and dq (heads axis over H) */
    gt_attn_strides kv;            /* strides of k, v, dk and dv (heads axis over K) */
    gt_attn_strides out_strides;   /* strides of out and dout */
    float scale;                   /* multiplies Q K^T, usually 1 / sqrt(D) */
    int causal;                    /* 1: query i sees keys j <= i */
    int64_t window;                /* >= 0; > 0: query i sees keys j > i - window only */
    const int64_t *key_lengths;    /* (B,) keys visible per batch entry, in [0, T], or NULL */
    const int64_t *key_starts;     /* (B, T) contiguous: query i of entry b sees keys j >=
                                      key_starts[b * T + i] only (any int64: <= 0 limits nothing,
                                      >= T hides every key), or NULL */
    double dropout_p;              /* probability dropout in [0, 1] (0: none) */
    gt_dropout_key dropout_key;    /* Philox key of the probability dropout */
    gt_dtype dt;                   /* f32, f16 or bf16 */
} gt_attention_args;

/* Disentangled attention, DeBERTa(-v2/v3)'s DisentangledSelfAttention: per batch entry b and
 * head h, with r = rel_index[i - j + T - 1] the relative-position row of query i and key j,
 *   S[i, j] = scale * ((q_i . k_j + c2p) + p2c),  c2p = q_i . pos_k[r] (0 without pos_k),
 *                                                  p2c = k_j . pos_q[r] (0 without pos_q)
 * (each dot product summed in f32 in increasing d: ops/disentangled_hd.h, which CPU and CUDA both
 * run); keys j >= key_lengths[b] are masked; P = softmax(S) over the visible keys, lse its
 * log-sum-exp; out_i = sum_j (P[i, j] M[i, j]) v_j with M the dropout multipliers of element
 * g = key.offset + ((b * heads + h) * seq + i) * seq + j (core/dropout.h). A query that sees no
 * key gets out = 0, lse = -inf and zero gradients. transformers' scale is 1 / sqrt(D (1 + number
 * of c2p/p2c terms)), its rel_index clamp(bucket(i - j) + S, 0, 2S - 1) (log buckets: the layer
 * builds the table, nn/disentangled.c). Backward (dS = P (M dP - sum_j P M dP), dP = dO V^T):
 *   dq_i = scale sum_j dS_ij (k_j + pos_k[r]),  dk_j = scale sum_i dS_ij (q_i + pos_q[r]),
 *   dv_j = sum_i P_ij M_ij dO_i,  dpos_k[r] = scale sum_{b,i,j at r} dS_ij q_i,
 *   dpos_q[r] = scale sum_{b,i,j at r} dS_ij k_j,
 * every sum in a fixed order (any thread count gives the same bits); dpos_k and dpos_q are
 * written (not accumulated). */
typedef struct gt_disentangled_args {
    int64_t batch, heads, seq, head_dim;  /* B, H, T, D */
    int64_t span;                  /* S: pos_k and pos_q have 2 S rows */
    const int32_t *rel_index;      /* (2T - 1,) int32 in [0, 2S), the backend's memory */
    const void *q, *k, *v;         /* (B, H, T, D) at `in` strides; dtype dt */
    const void *pos_k;             /* (2S, H, D): row r, head h at r * pos_row + h * D; NULL: no c2p */
    const void *pos_q;             /* (2S, H, D) likewise; NULL: no p2c */
    int64_t pos_row;               /* elements between rows of pos_k, pos_q, dpos_k and dpos_q */
    void *out;                     /* (B, H, T, D) at `out_strides`; forward writes */
    float *lse;                    /* (B, H, T) f32, contiguous; forward writes, backward reads */
    const void *dout;              /* backward: (B, H, T, D) at `out_strides` */
    void *dq, *dk, *dv;            /* backward: at `in` strides, written (NULL: the three not wanted) */
    void *dpos_k, *dpos_q;         /* backward: as pos_k and pos_q, written where those are given */
    gt_attn_strides in;            /* strides of q, k, v, dq, dk, dv */
    gt_attn_strides out_strides;   /* strides of out and dout */
    float scale;                   /* multiplies the three terms' sum */
    const int64_t *key_lengths;    /* (B,) keys visible per batch entry, in [0, T], or NULL */
    double dropout_p;              /* probability dropout in [0, 1] (0: none) */
    gt_dropout_key dropout_key;    /* Philox key of the probability dropout */
    gt_dtype dt;                   /* f32, f16 or bf16 */
} gt_disentangled_args;

/* Rotary position embedding in Hugging Face's `rotate_half` layout (transformers'
 * apply_rotary_pos_emb): per batch entry b, head h, position t and i < R / 2 (R = rotary_dim),
 * with x1 = x[i], x2 = x[i + R / 2] of the (b, h, t) row and a = attention_factor:
 *   angle = f32(positions[b, t]) * inv_freq[i]                  (f32, one rounding)
 *   c = dt(f32(f32(cos(angle)) a)), s = dt(f32(f32(sin(angle)) a))  (cos, sin in double of the
 *                                                                f32 angle, rounded to f32, times
 *                                                                a in f32, then rounded to dt)
 *   forward:  out[i] = dt(dt(x1 c) - dt(x2 s)),  out[i + R / 2] = dt(dt(x2 c) + dt(x1 s))
 *   backward: out[i] = dt(dt(x1 c) + dt(x2 s)),  out[i + R / 2] = dt(dt(x2 c) - dt(x1 s))
 * (the backward is the transpose rotation, applied to dout to give din), and out[d] = x[d] for
 * R <= d < D. dt(.) rounds to the activation dtype (nothing in f32): the roundings of PyTorch's
 * eager q * cos + rotate_half(q) * sin and of its autograd in bf16/f16, so a half result is
 * Hugging Face's bits wherever its cos/sin are (ops/rope_hd.h). inv_freq comes from
 * gt_rope_inv_freq (ops/rope.h). Positions restart per packed document through `positions`. */
typedef struct gt_rope_args {
    int64_t batch, heads, seq, head_dim;  /* B, H, T, D */
    int64_t rotary_dim;            /* R: even, in [2, D]; elements R <= d < D pass through */
    const void *in;                /* (B, H, T, D) at `strides`; dtype dt (backward: dout) */
    void *out;                     /* (B, H, T, D) at `strides`, written (backward: din); may be
                                      `in` (in place), else must not overlap it */
    gt_attn_strides strides;       /* strides of in and out (d contiguous) */
    const int64_t *positions;      /* (B, T) int64: entry (b, t) at b * positions_stride + t;
                                      NULL: position t (Hugging Face's default arange(T)) */
    int64_t positions_stride;      /* elements between rows of positions; 0: one row for all b */
    const float *inv_freq;         /* (R / 2,) f32 inverse frequencies */
    gt_dtype dt;                   /* f32, f16 or bf16 */
    float attention_factor;        /* > 0, finite: multiplies cos and sin in f32 before their
                                      rounding to dt (Hugging Face's attention_scaling: yarn's
                                      mscale); 1: none, the same bits as without it */
} gt_rope_args;

/* What a pooling op reduces the sequence axis of a (batch, seq, dim) input to. */
typedef enum gt_pool_mode {
    GT_POOL_FIRST = 0,  /* out[b] = in[b, 0] (the first, [CLS], token) */
    GT_POOL_MEAN = 1,   /* out[b] = mean of in[b, t] over t < lengths[b] (all t when NULL) */
    GT_POOL_LAST = 2,   /* out[b] = in[b, lengths[b]]: `lengths` holds each entry's last token
                           (Hugging Face's ...ForSequenceClassification); NULL: seq - 1 */
} gt_pool_mode;
/* 2-D convolution over NCHW activations, PyTorch's conv2d: for output channel o of group
 * g = o / (O / groups), out[n, o, y, x] = bias[o] + sum over c < C / groups, i < KH, j < KW of
 * weight[o, c, i, j] * in[n, g C / groups + c, y stride_h - pad_h + i dilation_h,
 * x stride_w - pad_w + j dilation_w], with zeros outside the input. The output is (N, O, OH, OW),
 * OH = (H + 2 pad_h - dilation_h (KH - 1) - 1) / stride_h + 1 (OW likewise): gt_conv2d_out_h/w.
 * gt_conv2d_check (ops/checks.h) says what a backend accepts. */
typedef struct gt_conv2d_args {
    int64_t batch, in_channels, height, width;  /* N, C, H, W of the input */
    int64_t out_channels, groups;               /* O; C and O are multiples of groups */
    int64_t kernel_h, kernel_w;                 /* KH, KW >= 1 */
    int64_t stride_h, stride_w;                 /* >= 1 */
    int64_t pad_h, pad_w;                       /* zeros added on each side, >= 0 */
    int64_t dilation_h, dilation_w;             /* >= 1 */
    const void *x;         /* (N, C, H, W) dt */
    const void *weight;    /* (O, C / groups, KH, KW) dt (f32 master in f32, the half copy else) */
    const float *bias;     /* forward: (O,) f32, or NULL (no bias) */
    void *out;             /* forward: (N, O, OH, OW) dt, written */
    const void *dout;      /* backward: (N, O, OH, OW) dt */
    void *dx;              /* backward: (N, C, H, W) dt, written; NULL: not wanted */
    float *dweight;        /* backward: (O, C / groups, KH, KW) f32, (+)= per accumulate; NULL: not
                              wanted */
    float *dbias;          /* backward: (O,) f32, (+)= per accumulate; NULL: no bias */
    int accumulate;        /* backward: 0 writes dweight and dbias, 1 adds to them */
    gt_dtype dt;           /* f32, f16 or bf16 */
} gt_conv2d_args;

/* Output rows and columns of a convolution: 0 when the dilated kernel is larger than the padded
 * input (sizes within gt_conv2d_check's bounds, so nothing overflows). */
static inline int64_t gt_conv2d_out_size(int64_t in, int64_t pad, int64_t dilation, int64_t kernel,
                                         int64_t stride) {
    int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
    return span < 0 ? 0 : span / stride + 1;
}
static inline int64_t gt_conv2d_out_h(const gt_conv2d_args *a) {
    return gt_conv2d_out_size(a->height, a->pad_h, a->dilation_h, a->kernel_h, a->stride_h);
}
static inline int64_t gt_conv2d_out_w(const gt_conv2d_args *a) {
    return gt_conv2d_out_size(a->width, a->pad_w, a->dilation_w, a->kernel_w, a->stride_w);
}

/* BatchNorm over the channels of an NCHW activation seen as (N, C, HW), per channel c over its
 * M = N * HW elements:
 *   batch statistics: mean = sum(x) / M, var = sum((x - mean)^2) / M (biased), summed in double
 *   in a fixed order; rstd = 1 / sqrt(var + eps)
 *   forward: out = (x - mean) * rstd * weight + bias, with the batch statistics (batch_stats) or
 *   the running ones (mean = running_mean, rstd = 1 / sqrt(running_var + eps)); the statistics
 *   used are saved in mean and rstd for backward.
 *   update_running (with batch_stats): num_batches_tracked += 1, then with f = momentum (or
 *   1 / num_batches_tracked when momentum < 0, PyTorch's momentum=None)
 *   running_mean = f * mean + (1 - f) * running_mean and
 *   running_var = f * var * M / (M - 1) + (1 - f) * running_var (unbiased), in double.
 *   backward: din (may be NULL) = rstd * weight * (dout - [mean(dout) + xhat mean(dout xhat)] when
 *   batch_stats); dweight (+)= sum dout xhat, dbias (+)= sum dout (may be NULL: no affine).
 * Channels run in parallel; every sum has a fixed order, so any thread count gives the same bits. */
typedef struct gt_batchnorm_args {
    int64_t n, c, hw;                 /* input (N, C, H * W) */
    const void *in;                   /* (N, C, HW) dt */
    void *out;                        /* forward: (N, C, HW) dt */
    const float *weight, *bias;       /* (C,) f32, or NULL (affine=False: 1 and 0) */
    float *mean, *rstd;               /* (C,) f32 statistics used: forward writes, backward reads */
    float *running_mean;              /* (C,) f32 running mean, or NULL (no running statistics) */
    float *running_var;               /* (C,) f32 running (unbiased) variance, or NULL */
    int64_t *num_batches_tracked;     /* (1,) batches folded into the running statistics, or NULL */
    float eps;                        /* added to the variance */
    double momentum;                  /* weight of a new batch in [0, 1]; < 0: cumulative average */
    int batch_stats;                  /* 1: normalise with the batch's statistics, 0: running ones */
    int update_running;               /* forward: 1 folds the batch statistics into the running ones */
    const void *dout;                 /* backward: (N, C, HW) dt */
    void *din;                        /* backward: (N, C, HW) dt, or NULL (not wanted) */
    float *dweight, *dbias;           /* backward: (C,) f32 gradients, or NULL (affine=False) */
    int accumulate;                   /* backward: 1 adds to dweight and dbias */
    gt_dtype dt;                      /* f32, f16 or bf16 */
} gt_batchnorm_args;

typedef enum gt_pool_kind {
    GT_POOL_MAX = 0,           /* max over the window (padding never wins), backward to the first max */
    GT_POOL_AVG = 1,           /* mean over the window */
    GT_POOL_ADAPTIVE_AVG = 2,  /* mean over rows [floor(i H / OH), ceil((i + 1) H / OH)), same for columns */
} gt_pool_kind;

/* 2-D pooling of an NCHW activation, each (n, c) plane on its own (PyTorch's semantics). Output
 * (oh, ow) of MAX/AVG looks at rows oh * stride - padding + i * dilation for i < kernel (within
 * the input). MAX ties go to the first maximum in row-major window order; NaN counts as a
 * maximum. AVG divides by the window's size clipped to the padded input (count_include_pad) or to
 * the input. Backward adds each output gradient to its inputs in a fixed order (f32 accumulation,
 * rounded once), planes in parallel: any thread count gives the same bits. */
typedef struct gt_pool2d_args {
    gt_pool_kind kind;             /* which pooling */
    int64_t n, c, h, w;            /* input (N, C, H, W) */
    int64_t out_h, out_w;          /* output (N, C, out_h, out_w) */
    int64_t kernel[2];             /* MAX/AVG window (rows, cols) */
    int64_t stride[2];             /* MAX/AVG step between windows */
    int64_t padding[2];            /* MAX/AVG implicit padding on each side */
    int64_t dilation[2];           /* MAX spacing of window elements (AVG: 1) */
    int count_include_pad;         /* AVG: 1 counts padded elements in the divisor */
    const void *in;                /* (N, C, H, W) dt */
    void *out;                     /* forward: (N, C, out_h, out_w) dt */
    const void *dout;              /* backward: (N, C, out_h, out_w) dt */
    void *din;                     /* backward: (N, C, H, W) dt, written */
    int32_t *argmax;               /* MAX: (N, C, out_h, out_w) offset in its plane of each output's
                                      maximum, written by forward and read by backward; NULL:
                                      backward recomputes it from `in` */
    gt_dtype dt;                   /* f32, f16 or bf16 */
} gt_pool2d_args;

/* ---- The ops: one descriptor each ----
 * An op's parameters are written once, as GT_PARAMS_<OP>(P, A): P(type, name) is a parameter
 * passed as is, A(type, name) a `const type *name` argument struct (a queued op copies the struct,
 * not the pointer). Every op but a query takes `gt_backend *be` first. GT_OP_LIST below names
 * each op with its kind and its parameters; the table's fields, the CPU, sim and CUDA tables, the
 * sim wrappers and the device counters are generated from it. */

/* gemm_workspace_bytes: scratch bytes the backend needs to run `args` (e.g. to widen half
 * inputs); gemm: the GEMM (gt_gemm_args). */
#define GT_PARAMS_GEMM(P, A) A(gt_gemm_args, args)

/* out[r, c] += bias[c] for rows x cols; out has dtype dt, bias is f32. */
#define GT_PARAMS_BIAS_ADD(P, A) \
    P(void *, out) P(const float *, bias) P(int64_t, rows) P(int64_t, cols) P(gt_dtype, dt)
/* dbias[c] (+)= sum over rows of dout[r, c]; fixed summation order (deterministic). */
#define GT_PARAMS_BIAS_BACKWARD(P, A) \
    P(float *, dbias) P(const void *, dout) P(int64_t, rows) P(int64_t, cols) P(gt_dtype, dt) \
    P(int, accumulate)

/* out = act(in), elementwise over n. */
#define GT_PARAMS_ACTIVATION_FORWARD(P, A) \
    P(void *, out) P(const void *, in) P(int64_t, n) P(gt_activation, act) P(gt_dtype, dt)
/* din = dout * act'(in), elementwise over n (din may alias dout; NULL din: nothing to do). */
#define GT_PARAMS_ACTIVATION_BACKWARD(P, A) \
    P(void *, din) P(const void *, dout) P(const void *, in) P(int64_t, n) P(gt_activation, act) \
    P(gt_dtype, dt)

/* out = in * mask * gt_dropout_scale(p) with mask = uniform(key, i) >= (float)p; p in
 * [0, 1] (p = 1: out = in * 0). p is a double so the scale is rounded as PyTorch's. */
#define GT_PARAMS_DROPOUT_FORWARD(P, A) \
    P(void *, out) P(const void *, in) P(int64_t, n) P(double, p) P(gt_dropout_key, key) \
    P(gt_dtype, dt)
/* din = dout * mask * gt_dropout_scale(p), the mask regenerated from the same key (NULL din:
 * nothing to do). */
#define GT_PARAMS_DROPOUT_BACKWARD(P, A) \
    P(void *, din) P(const void *, dout) P(int64_t, n) P(double, p) P(gt_dropout_key, key) \
    P(gt_dtype, dt)

/* out = a + b elementwise (out may alias a or b). */
#define GT_PARAMS_ADD(P, A) \
    P(void *, out) P(const void *, a) P(const void *, b) P(int64_t, n) P(gt_dtype, dt)
/* out = dt(in * factor) elementwise in f32, rounded once (out may alias in): the Scale layer's
 * forward and, with dout for in, its backward (PyTorch's x * tensor(factor, dtype=x.dtype) in
 * bf16/f16 computes in f32 and rounds once). */
#define GT_PARAMS_SCALE(P, A) \
    P(void *, out) P(const void *, in) P(int64_t, n) P(float, factor) P(gt_dtype, dt)

/* LayerNorm over the last dim: out = (in - mean) * rstd * weight + bias (bias may be NULL:
 * no bias). mean, rstd: (rows,) f32, saved for backward. */
#define GT_PARAMS_LAYERNORM_FORWARD(P, A) \
    P(void *, out) P(float *, mean) P(float *, rstd) P(const void *, in) P(const float *, weight) \
    P(const float *, bias) P(int64_t, rows) P(int64_t, cols) P(float, eps) P(gt_dtype, dt)
/* din = dLN/din (written; may alias dout; NULL: not wanted, only the parameter gradients are
 * computed); dweight, dbias (+)= per `accumulate`; dbias may be NULL (no bias). */
#define GT_PARAMS_LAYERNORM_BACKWARD(P, A) \
    P(void *, din) P(float *, dweight) P(float *, dbias) P(const void *, dout) P(const void *, in) \
    P(const float *, weight) P(const float *, mean) P(const float *, rstd) P(int64_t, rows) \
    P(int64_t, cols) P(gt_dtype, dt) P(int, accumulate)

/* out[i, :] = table[ids[i], :] for i < n, the table in table_dt (f32, or a frozen f16/bf16 table),
 * out in dt; ids checked against num (GT_ERR_INDEX; a device backend may return it at its stream's
 * next synchronisation). */
#define GT_PARAMS_EMBEDDING_FORWARD(P, A) \
    P(void *, out) P(const int64_t *, ids) P(const void *, table) P(gt_dtype, table_dt) P(int64_t, n) \
    P(int64_t, num) P(int64_t, dim) P(gt_dtype, dt)
/* out[i, :] = row ids[i] of a frozen table quantized blockwise (dequantize_blockwise's layout and
 * element math over the flattened (num, dim) table: `bits` 4 (two codes a byte, the even element in
 * the high nibble) or 8, one f32 absmax per block of `blocksize` elements, `code` the decoding
 * table), rounded to dt. dim is a multiple of blocksize, so a row is whole blocks (with 4 bits, whole
 * bytes): its codes start at ids[i] * dim * bits / 8 and its absmax at ids[i] * dim / blocksize.
 * ids checked as embedding_forward's. */
#define GT_PARAMS_QUANTIZED_EMBEDDING_FORWARD(P, A) \
    P(void *, out) P(const int64_t *, ids) P(const uint8_t *, codes) P(const float *, absmax) \
    P(const float *, code) P(int64_t, n) P(int64_t, num) P(int64_t, dim) P(int64_t, blocksize) P(int, bits) \
    P(gt_dtype, dt)
/* dtable[ids[i], :] (+)= dout[i, :]; deterministic (fixed order per row of dtable). */
#define GT_PARAMS_EMBEDDING_BACKWARD(P, A) \
    P(float *, dtable) P(const void *, dout) P(const int64_t *, ids) P(int64_t, n) P(int64_t, num) \
    P(int64_t, dim) P(gt_dtype, dt) P(int, accumulate)

/* Fused softmax + cross-entropy over logits (rows, classes) with integer targets.
 * losses[r] = per-row loss (0 for ignored rows); *count = rows not ignored (count, like
 * losses, is the backend's memory: on a device it is written when the stream runs the op).
 * When dlogits is non-NULL it receives dloss_scale * d(mean loss)/dlogits, i.e. for a
 * counted row (softmax - smoothed_one_hot) * dloss_scale / count (may alias logits), where
 * dloss_scale = f32(*loss_scale / dloss_divisor) (GT_DLOSS_SCALE; loss_scale NULL: 1).
 * label_smoothing in [0, 1]; targets equal to ignore_index are skipped; others must be in
 * [0, classes) (GT_ERR_INDEX naming the row otherwise; a device backend may return it at
 * its stream's next synchronisation). */
#define GT_PARAMS_SOFTMAX_XENT(P, A) \
    P(float *, losses) P(int64_t *, count) P(void *, dlogits) P(const void *, logits) \
    P(const int64_t *, targets) P(int64_t, rows) P(int64_t, classes) P(float, label_smoothing) \
    P(int64_t, ignore_index) P(const float *, loss_scale) P(float, dloss_divisor) P(gt_dtype, dt)
/* R-Drop's loss (ops/rdrop_hd.h): rows is even, and row a < rows/2 and row a + rows/2 are two
 * dropout passes of one example. losses[r] = row r's cross-entropy (softmax_xent's, smoothed) +
 * alpha * (KL(pa||pb) + KL(pb||pa)) / 2 of its pair (no KL for a pair with an ignored target;
 * an ignored row: 0); *count = rows not ignored, so that the mean of losses over *count is
 * the cross-entropy averaged over both passes + alpha * the symmetric KL averaged over the
 * pairs. dlogits (if non-NULL; it must not alias logits) = dloss_scale * d(that mean)/dlogits,
 * dloss_scale and the target checks as softmax_xent's; alpha >= 0. */
#define GT_PARAMS_SOFTMAX_XENT_RDROP(P, A) \
    P(float *, losses) P(int64_t *, count) P(void *, dlogits) P(const void *, logits) \
    P(const int64_t *, targets) P(int64_t, rows) P(int64_t, classes) P(float, label_smoothing) \
    P(int64_t, ignore_index) P(float, alpha) P(const float *, loss_scale) P(float, dloss_divisor) \
    P(gt_dtype, dt)
/* The two halves of softmax_xent for a loss computed a block of rows at a time (nn/head_loss.c:
 * the LM head's logits never exist for a whole micro-batch). xent_count: *count = the rows of
 * targets (rows,) not equal to ignore_index (backend memory, as softmax_xent's), the others checked
 * against [0, classes) as softmax_xent checks them. softmax_xent_counted: softmax_xent's losses
 * and dlogits for `rows` rows whose targets xent_count has checked, with the gradient scale
 * dloss_scale / *count taken from the given count (the whole micro-batch's), so that every row's
 * loss and gradient are bit-identical to those one softmax_xent over all rows gives. */
#define GT_PARAMS_XENT_COUNT(P, A) \
    P(int64_t *, count) P(const int64_t *, targets) P(int64_t, rows) P(int64_t, classes) \
    P(int64_t, ignore_index)
#define GT_PARAMS_SOFTMAX_XENT_COUNTED(P, A) \
    P(float *, losses) P(const int64_t *, count) P(void *, dlogits) P(const void *, logits) \
    P(const int64_t *, targets) P(int64_t, rows) P(int64_t, classes) P(float, label_smoothing) \
    P(int64_t, ignore_index) P(const float *, loss_scale) P(float, dloss_divisor) P(gt_dtype, dt)
/* Mean squared error over n elements: *loss = mean((pred - target)^2) (loss is the
 * backend's memory, written when the stream runs the op);
 * dpred (if non-NULL) = dloss_scale * 2 (pred - target) / n, dloss_scale as softmax_xent's.
 * target is f32. */
#define GT_PARAMS_MSE(P, A) \
    P(float *, loss) P(void *, dpred) P(const void *, pred) P(const float *, target) P(int64_t, n) \
    P(const float *, loss_scale) P(float, dloss_divisor) P(gt_dtype, dt)

/* *out = sum of x[i]^2 over n f32 values, in a fixed order (same result for any threads); out
 * is a host pointer. */
#define GT_PARAMS_SUM_SQUARES(P, A) P(double *, out) P(const float *, x) P(int64_t, n)

/* dst = src converted between f32/f16/bf16 (RNE), n elements. */
#define GT_PARAMS_CAST(P, A) \
    P(void *, dst) P(gt_dtype, dst_dt) P(const void *, src) P(gt_dtype, src_dt) P(int64_t, n)
/* dst = src (bytes). */
#define GT_PARAMS_COPY(P, A) P(void *, dst) P(const void *, src) P(size_t, bytes)
/* A strided copy of `rows` rows of `width` bytes: row r of dst at dst + r * dst_pitch from row r
 * of src at src + r * src_pitch (pitches >= width; dst and src do not overlap). A column slice
 * of a row-major matrix in or out (the Parallel layer's concatenation and its split). */
#define GT_PARAMS_COPY_2D(P, A) \
    P(void *, dst) P(size_t, dst_pitch) P(const void *, src) P(size_t, src_pitch) P(size_t, width) \
    P(size_t, rows)
/* dst = 0 (bytes). */
#define GT_PARAMS_ZERO(P, A) P(void *, dst) P(size_t, bytes)

/* Scaled dot-product attention (gt_attention_args): scratch bytes for `args` when run with
 * up to `threads` threads (fewer are used when the workspace holds fewer), forward (writes
 * out and lse) and backward (writes dq, dk, dv). */
#define GT_PARAMS_ATTENTION_WORKSPACE(P, A) A(gt_attention_args, args) P(int, threads)
#define GT_PARAMS_ATTENTION(P, A) A(gt_attention_args, args)

/* Disentangled attention (gt_disentangled_args): scratch bytes for `args` with up to `threads`
 * threads, forward (writes out and lse) and backward (writes dq, dk, dv, dpos_k, dpos_q). */
#define GT_PARAMS_DISENTANGLED_WORKSPACE(P, A) A(gt_disentangled_args, args) P(int, threads)
#define GT_PARAMS_DISENTANGLED(P, A) A(gt_disentangled_args, args)

/* Sequence masks and pooling (checked by the plan).
 * lengths[b] = number of nonzero entries of mask[b, 0:seq] (row b at mask + b * stride),
 * for b < batch: the keys a query of sequence b sees. */
#define GT_PARAMS_MASK_LENGTHS(P, A) \
    P(int64_t *, lengths) P(const int64_t *, mask) P(int64_t, batch) P(int64_t, seq) \
    P(int64_t, stride)
/* out (batch, dim) = pool over t of in (batch, seq, dim) (gt_pool_mode; lengths (batch,) or
 * NULL, each in [0, seq]; a length of 0 gives 0; GT_POOL_LAST: token indices in [0, seq - 1]);
 * f32 sums in increasing t, rounded once. A bad
 * length is GT_ERR_VALUE naming it (a device backend may return it at its stream's next
 * synchronisation, as for key_lengths and for both pooling ops). */
#define GT_PARAMS_POOL_FORWARD(P, A) \
    P(void *, out) P(const void *, in) P(const int64_t *, lengths) P(int64_t, batch) \
    P(int64_t, seq) P(int64_t, dim) P(gt_pool_mode, mode) P(gt_dtype, dt)
/* din (batch, seq, dim) = the pooling's gradient from dout (batch, dim): dout (first token; last:
 * at t = lengths[b]), dout / lengths[b] (mean, t < lengths[b]), 0 elsewhere; din written entirely. */
#define GT_PARAMS_POOL_BACKWARD(P, A) \
    P(void *, din) P(const void *, dout) P(const int64_t *, lengths) P(int64_t, batch) \
    P(int64_t, seq) P(int64_t, dim) P(gt_pool_mode, mode) P(gt_dtype, dt)

/* The segments and last tokens of a decoder's input rows (the Tokens layer's (B, C, T) int64
 * channels; row b of ids, mask and positions at + b * stride, seq entries each).
 * starts (batch, seq) or NULL: starts[b, t] = the first index of t's segment, where row b splits
 * into segments before every t > 0 with (mask[b, t] != 0) != (mask[b, t - 1] != 0) and, where
 * mask[b, t] != 0, before every t with positions[b, t] == 0 (a packed document restarts its
 * positions): left padding, right padding and packed documents all "attend within your segment".
 * last (batch,) or NULL: the rightmost t with ids[b, t] != pad_token_id, 0 when every id is
 * pad_token_id (Hugging Face's (arange(T) * (ids != pad)).argmax(-1)); pad_token_id < 0: seq - 1.
 * starts needs mask and positions, last with pad_token_id >= 0 needs ids. One row per thread. */
#define GT_PARAMS_KEY_STARTS(P, A) \
    P(int64_t *, starts) P(int64_t *, last) P(const int64_t *, ids) P(const int64_t *, mask) \
    P(const int64_t *, positions) P(int64_t, batch) P(int64_t, seq) P(int64_t, stride) \
    P(int64_t, pad_token_id)

/* 2-D convolution (gt_conv2d_args): scratch bytes for `args` when run with up to `threads`
 * threads (fewer are used when the workspace holds fewer), forward (writes out) and backward
 * (writes dx, dweight, dbias). */
#define GT_PARAMS_CONV2D_WORKSPACE(P, A) A(gt_conv2d_args, args) P(int, threads)
#define GT_PARAMS_CONV2D(P, A) A(gt_conv2d_args, args)

/* BatchNorm2d (gt_batchnorm_args): forward and backward. */
#define GT_PARAMS_BATCHNORM(P, A) A(gt_batchnorm_args, args)

/* 2-D pooling (gt_pool2d_args): scratch bytes for `args` with up to `threads` threads (f32
 * accumulation planes of half-precision backwards), forward and backward. */
#define GT_PARAMS_POOL2D_WORKSPACE(P, A) A(gt_pool2d_args, args) P(int, threads)
#define GT_PARAMS_POOL2D(P, A) A(gt_pool2d_args, args)

/* RMSNorm over the last dim (ops/rmsnorm_hd.h): out = in * rstd * weight (weight NULL: no
 * affine), rstd = 1 / sqrt(mean(in^2) + eps): (rows,) f32, saved for backward. plus_one (with a
 * weight): the weight used is f32(1 + weight) (Gemma's RMSNorm; its gradient is dweight's). */
#define GT_PARAMS_RMSNORM_FORWARD(P, A) \
    P(void *, out) P(float *, rstd) P(const void *, in) P(const float *, weight) P(int, plus_one) \
    P(int64_t, rows) P(int64_t, cols) P(float, eps) P(gt_dtype, dt)
/* din = dRMSNorm/din (written; may alias dout; NULL: not wanted); dweight (+)= per `accumulate`
 * (NULL, with weight NULL: no affine); plus_one as the forward's. */
#define GT_PARAMS_RMSNORM_BACKWARD(P, A) \
    P(void *, din) P(float *, dweight) P(const void *, dout) P(const void *, in) \
    P(const float *, weight) P(int, plus_one) P(const float *, rstd) P(int64_t, rows) P(int64_t, cols) \
    P(gt_dtype, dt) P(int, accumulate)

/* Gated activation (SwiGLU with act = GT_ACT_SILU, GeGLU-tanh with GT_ACT_GELU_TANH, any
 * gt_activation): in is (rows, 2 inter), each row [gate | up] (the output of one GEMM by the
 * stacked [gate_proj; up_proj] weight, or two GEMMs into the halves); out (rows, inter) =
 * dt(dt(act(gate)) * up), rounded as PyTorch's eager act_fn(gate) * up is in bf16/f16. */
#define GT_PARAMS_GLU_FORWARD(P, A) \
    P(void *, out) P(const void *, in) P(int64_t, rows) P(int64_t, inter) P(gt_activation, act) \
    P(gt_dtype, dt)
/* din (rows, 2 inter) = [dgate | dup] with dup = dt(dout * dt(act(gate))) and dgate =
 * dt(act'(gate) * dt(dout * up)) (PyTorch autograd's roundings); din may alias in (each pair is
 * read before it is written), not dout; NULL din: nothing to do. */
#define GT_PARAMS_GLU_BACKWARD(P, A) \
    P(void *, din) P(const void *, dout) P(const void *, in) P(int64_t, rows) P(int64_t, inter) \
    P(gt_activation, act) P(gt_dtype, dt)

/* Rotary position embedding (gt_rope_args): forward rotates `in` into `out`; backward applies
 * the transpose rotation (in = dout, out = din). */
#define GT_PARAMS_ROPE(P, A) A(gt_rope_args, args)

/* bitsandbytes' blockwise quantization (ops/quant_hd.h; bits 4: NF4/FP4, bits 8: the dynamic
 * maps). Blocks of `blocksize` elements (the last may be partial): absmax[b] = max |in| over block
 * b (f32; a partial block's clamped to 1e-38), each element scaled into [-1, 1] and encoded as
 * order[i] for the first i with scaled <= bounds[i] ((1 << bits) - 1 sorted bounds, the midpoints
 * of the sorted code; order maps sorted position to code). bits 8: codes (n,) bytes; bits 4:
 * ceil(n / 2) bytes, the even element in the high nibble, an odd n padded with the code of 0.
 * The CPU (and sim) op refuses (GT_ERR_VALUE) a non-finite input element before writing anything;
 * the CUDA op does not look (gputrain.quant checks its input first). */
#define GT_PARAMS_QUANTIZE_BLOCKWISE(P, A) \
    P(uint8_t *, codes) P(float *, absmax) P(const void *, in) P(int64_t, n) P(int64_t, blocksize) \
    P(const float *, bounds) P(const uint8_t *, order) P(int, bits) P(gt_dtype, dt)
/* out[i] = dt(code[c_i] * absmax[i / blocksize]) with c_i the i-th code of `codes` (layout as
 * above; code has 1 << bits f32 entries). */
#define GT_PARAMS_DEQUANTIZE_BLOCKWISE(P, A) \
    P(void *, out) P(const uint8_t *, codes) P(const float *, absmax) P(const float *, code) \
    P(int64_t, n) P(int64_t, blocksize) P(int, bits) P(gt_dtype, dt)

/* DoRA (PEFT's DoraLinearLayer; the kind lora with use_dora, nn/lora.c). dora_norm: for the
 * (rows, cols) f32 matrix w = W + scaling B A, norm[r] = ||w[r, :]||_2 (f32, summed in column
 * order) and scale[r] = magnitude[r] / norm[r] (PEFT's mag_norm_scale, weight_norm detached). */
#define GT_PARAMS_DORA_NORM(P, A) \
    P(float *, scale) P(float *, norm) P(const float *, w) P(const float *, magnitude) P(int64_t, rows) \
    P(int64_t, cols)
/* out[r, c] = dt(out[r, c] + ((scale[c] - 1) u[r, c] + (scale[c] v[r, c]) scaling)) over (rows, cols),
 * in f32 (PEFT's result + result_dora, its order: (mag_norm_scale - 1) * base_result +
 * mag_norm_scale * lora_result * scaling). */
#define GT_PARAMS_DORA_COMBINE(P, A) \
    P(void *, out) P(const void *, u) P(const void *, v) P(const float *, scale) P(float, scaling) \
    P(int64_t, rows) P(int64_t, cols) P(gt_dtype, dt)
/* out[r, c] = dt(in[r, c] * (scale[c] + offset)) over (rows, cols); out may alias in. */
#define GT_PARAMS_COL_SCALE(P, A) \
    P(void *, out) P(const void *, in) P(const float *, scale) P(float, offset) P(int64_t, rows) \
    P(int64_t, cols) P(gt_dtype, dt)
/* dmagnitude[c] (+)= (sum over r, in row order, of dout[r, c] (u[r, c] + v[r, c] scaling)) / norm[c]
 * (f32): the magnitude's gradient through dora_combine with the norm a constant. */
#define GT_PARAMS_DORA_MAGNITUDE_BACKWARD(P, A) \
    P(float *, dmagnitude) P(const void *, dout) P(const void *, u) P(const void *, v) P(const float *, norm) \
    P(float, scaling) P(int64_t, rows) P(int64_t, cols) P(gt_dtype, dt) P(int, accumulate)

/* Every op: X(kind, name, params, skip), in table order (append a new op above the end marker).
 *   kind  QUERY: returns size_t, takes no backend and launches nothing (a workspace size);
 *         LAUNCH: on a device, queued on the backend's stream (returns without waiting);
 *         WAIT: queued, then waits for the stream on every device backend (a host result);
 *   skip  NO_SKIP, or SKIP_IF_NULL(arg): a device backend queues nothing when `arg` is NULL (the
 *         call still counts as a launch). */
#define GT_OP_LIST(X)                                                                   \
    X(QUERY, gemm_workspace_bytes, GT_PARAMS_GEMM, NO_SKIP)                             \
    X(LAUNCH, gemm, GT_PARAMS_GEMM, NO_SKIP)                                            \
    X(LAUNCH, bias_add, GT_PARAMS_BIAS_ADD, NO_SKIP)                                    \
    X(LAUNCH, bias_backward, GT_PARAMS_BIAS_BACKWARD, NO_SKIP)                          \
    X(LAUNCH, activation_forward, GT_PARAMS_ACTIVATION_FORWARD, NO_SKIP)                \
    X(LAUNCH, activation_backward, GT_PARAMS_ACTIVATION_BACKWARD, SKIP_IF_NULL(din))    \
    X(LAUNCH, dropout_forward, GT_PARAMS_DROPOUT_FORWARD, NO_SKIP)                      \
    X(LAUNCH, dropout_backward, GT_PARAMS_DROPOUT_BACKWARD, SKIP_IF_NULL(din))          \
    X(LAUNCH, add, GT_PARAMS_ADD, NO_SKIP)                                              \
    X(LAUNCH, layernorm_forward, GT_PARAMS_LAYERNORM_FORWARD, NO_SKIP)                  \
    X(LAUNCH, layernorm_backward, GT_PARAMS_LAYERNORM_BACKWARD, NO_SKIP)                \
    X(LAUNCH, embedding_forward, GT_PARAMS_EMBEDDING_FORWARD, NO_SKIP)                  \
    X(LAUNCH, embedding_backward, GT_PARAMS_EMBEDDING_BACKWARD, NO_SKIP)                \
    X(LAUNCH, softmax_xent, GT_PARAMS_SOFTMAX_XENT, NO_SKIP)                            \
    X(LAUNCH, mse, GT_PARAMS_MSE, NO_SKIP)                                              \
    X(WAIT, sum_squares, GT_PARAMS_SUM_SQUARES, NO_SKIP)                                \
    X(LAUNCH, cast, GT_PARAMS_CAST, NO_SKIP)                                            \
    X(LAUNCH, copy, GT_PARAMS_COPY, NO_SKIP)                                            \
    X(LAUNCH, zero, GT_PARAMS_ZERO, NO_SKIP)                                            \
    X(QUERY, attention_workspace_bytes, GT_PARAMS_ATTENTION_WORKSPACE, NO_SKIP)         \
    X(LAUNCH, attention_forward, GT_PARAMS_ATTENTION, NO_SKIP)                          \
    X(LAUNCH, attention_backward, GT_PARAMS_ATTENTION, NO_SKIP)                         \
    X(LAUNCH, mask_lengths, GT_PARAMS_MASK_LENGTHS, NO_SKIP)                            \
    X(LAUNCH, pool_forward, GT_PARAMS_POOL_FORWARD, NO_SKIP)                            \
    X(LAUNCH, pool_backward, GT_PARAMS_POOL_BACKWARD, NO_SKIP)                          \
    X(QUERY, conv2d_workspace_bytes, GT_PARAMS_CONV2D_WORKSPACE, NO_SKIP)               \
    X(LAUNCH, conv2d_forward, GT_PARAMS_CONV2D, NO_SKIP)                                \
    X(LAUNCH, conv2d_backward, GT_PARAMS_CONV2D, NO_SKIP)                               \
    X(LAUNCH, batchnorm_forward, GT_PARAMS_BATCHNORM, NO_SKIP)                          \
    X(LAUNCH, batchnorm_backward, GT_PARAMS_BATCHNORM, NO_SKIP)                         \
    X(QUERY, pool2d_workspace_bytes, GT_PARAMS_POOL2D_WORKSPACE, NO_SKIP)               \
    X(LAUNCH, pool2d_forward, GT_PARAMS_POOL2D, NO_SKIP)                                \
    X(LAUNCH, pool2d_backward, GT_PARAMS_POOL2D, NO_SKIP)                               \
    X(LAUNCH, rmsnorm_forward, GT_PARAMS_RMSNORM_FORWARD, NO_SKIP)                      \
    X(LAUNCH, rmsnorm_backward, GT_PARAMS_RMSNORM_BACKWARD, NO_SKIP)                    \
    X(LAUNCH, rope_forward, GT_PARAMS_ROPE, NO_SKIP)                                    \
    X(LAUNCH, rope_backward, GT_PARAMS_ROPE, NO_SKIP)                                   \
    X(LAUNCH, glu_forward, GT_PARAMS_GLU_FORWARD, NO_SKIP)                              \
    X(LAUNCH, glu_backward, GT_PARAMS_GLU_BACKWARD, SKIP_IF_NULL(din))                  \
    X(LAUNCH, key_starts, GT_PARAMS_KEY_STARTS, NO_SKIP)                                \
    X(LAUNCH, scale, GT_PARAMS_SCALE, NO_SKIP)                                          \
    X(LAUNCH, copy_2d, GT_PARAMS_COPY_2D, NO_SKIP)                                      \
    X(QUERY, disentangled_workspace_bytes, GT_PARAMS_DISENTANGLED_WORKSPACE, NO_SKIP)   \
    X(LAUNCH, disentangled_forward, GT_PARAMS_DISENTANGLED, NO_SKIP)                    \
    X(LAUNCH, disentangled_backward, GT_PARAMS_DISENTANGLED, NO_SKIP)                   \
    X(LAUNCH, softmax_xent_rdrop, GT_PARAMS_SOFTMAX_XENT_RDROP, NO_SKIP)                \
    X(LAUNCH, xent_count, GT_PARAMS_XENT_COUNT, NO_SKIP)                                \
    X(LAUNCH, softmax_xent_counted, GT_PARAMS_SOFTMAX_XENT_COUNTED, NO_SKIP)            \
    X(LAUNCH, quantize_blockwise, GT_PARAMS_QUANTIZE_BLOCKWISE, NO_SKIP)                \
    X(LAUNCH, dequantize_blockwise, GT_PARAMS_DEQUANTIZE_BLOCKWISE, NO_SKIP)            \
    X(LAUNCH, dora_norm, GT_PARAMS_DORA_NORM, NO_SKIP)                                  \
    X(LAUNCH, dora_combine, GT_PARAMS_DORA_COMBINE, NO_SKIP)                            \
    X(LAUNCH, col_scale, GT_PARAMS_COL_SCALE, NO_SKIP)                                  \
    X(LAUNCH, dora_magnitude_backward, GT_PARAMS_DORA_MAGNITUDE_BACKWARD, NO_SKIP)      \
    X(LAUNCH, quantized_embedding_forward, GT_PARAMS_QUANTIZED_EMBEDDING_FORWARD, NO_SKIP) \
    /* end of the list */

/* The kinds of GT_OP_LIST as values (GT_OP_##kind). */
typedef enum gt_op_kind {
    GT_OP_QUERY = 0,         /* a size, no backend, no launch */
    GT_OP_LAUNCH = 1,        /* queued */
    GT_OP_WAIT = 2,          /* queued and waited for on every device backend */
} gt_op_kind;

/* The skips of GT_OP_LIST as expressions (GT_OP_##skip): true when a device backend queues
 * nothing. */
#define GT_OP_NO_SKIP 0
#define GT_OP_SKIP_IF_NULL(arg) ((arg) == NULL)

/* Expansions of a parameter list: GT_PARAMS_X(GT_OP_DECL_P, GT_OP_DECL_A) is ", type name, ...",
 * GT_PARAMS_X(GT_OP_ARG, GT_OP_ARG) is ", name, ...". */
#define GT_OP_DECL_P(type, name) , type name
#define GT_OP_DECL_A(type, name) , const type *name
#define GT_OP_ARG(type, name) , name

/* GT_OP_SELECT(kind, Q, L) is the macro name Q for a QUERY and L for the other kinds, so that
 * `GT_OP_SELECT(kind, Q, L)(args)` expands one or the other. */
#define GT_OP_SELECT(kind, query, launch) GT_OP_SELECT_##kind(query, launch)
#define GT_OP_SELECT_QUERY(query, launch) query
#define GT_OP_SELECT_LAUNCH(query, launch) launch
#define GT_OP_SELECT_WAIT(query, launch) launch

/* The function type of each op: gt_op_<name>_fn (a backend defines `gt_op_<name>_fn
 * gt_<backend>_<name>;`). */
#define GT_OP_DROP_FIRST(...) GT_OP_DROP_FIRST_(__VA_ARGS__)
#define GT_OP_DROP_FIRST_(first, ...) __VA_ARGS__
#define GT_OP_QUERY_FN(name, params) \
    typedef size_t gt_op_##name##_fn(GT_OP_DROP_FIRST(0 params(GT_OP_DECL_P, GT_OP_DECL_A)));
#define GT_OP_LAUNCH_FN(name, params) \
    typedef gt_status gt_op_##name##_fn(gt_backend *be params(GT_OP_DECL_P, GT_OP_DECL_A));
#define GT_OP_FN(kind, name, params, skip) GT_OP_SELECT(kind, GT_OP_QUERY_FN, GT_OP_LAUNCH_FN)(name, params)
GT_OP_LIST(GT_OP_FN)

/* A backend is a table of these (DESIGN.md, "A backend is a table of op function pointers"). */
#define GT_OP_FIELD(kind, name, params, skip) gt_op_##name##_fn *name;
typedef struct gt_ops {
    const char *name;         /* "cpu", "sim" or "cuda" */
    GT_OP_LIST(GT_OP_FIELD)   /* one function per op of GT_OP_LIST; NULL where a backend has none */
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
