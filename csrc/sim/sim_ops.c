#include "sim/sim_ops.h"

#include <stdlib.h>

#include "sim/sim_stream.h"

/* The CPU backend the worker runs an op with: the sim backend's workspace, CPU ops. */
static gt_backend cpu_view(const gt_backend *be) {
    gt_backend cpu = {gt_cpu_ops(), gt_cpu_device(), be->workspace, be->workspace_bytes, NULL};
    return cpu;
}

static gt_status launch(gt_backend *be, gt_sim_job_fn fn, const void *job, size_t bytes) {
    const gt_sim_backend_state *state = be->impl;
    return gt_sim_enqueue(state->index, state->stream, fn, job, bytes);
}

/* Queues the op and waits for it (and for the stream's earlier work). */
static gt_status launch_wait(gt_backend *be, gt_sim_job_fn fn, const void *job, size_t bytes) {
    const gt_sim_backend_state *state = be->impl;
    GT_TRY(gt_sim_enqueue(state->index, state->stream, fn, job, bytes));
    return gt_sim_stream_synchronize(state->index, state->stream);
}

/* ------------------------------------------------------------ GEMM and bias -------- */

typedef struct gemm_job {
    gt_backend cpu;      /* the CPU backend over this backend's workspace */
    gt_gemm_args args;   /* the GEMM */
} gemm_job;

static gt_status run_gemm(void *p) {
    gemm_job *j = p;
    return gt_cpu_ops()->gemm(&j->cpu, &j->args);
}

static gt_status sim_gemm(gt_backend *be, const gt_gemm_args *args) {
    gemm_job job = {cpu_view(be), *args};
    return launch(be, run_gemm, &job, sizeof job);
}

typedef struct bias_job {
    gt_backend cpu;      /* the CPU backend */
    void *out;           /* forward: (rows, cols) dt output */
    float *dbias;        /* backward: (cols,) gradient */
    const float *bias;   /* forward: (cols,) */
    const void *dout;    /* backward: (rows, cols) dt */
    int64_t rows, cols;  /* sizes */
    gt_dtype dt;         /* activation dtype */
    int accumulate;      /* backward: 1 adds to dbias */
} bias_job;

static gt_status run_bias_add(void *p) {
    bias_job *j = p;
    return gt_cpu_ops()->bias_add(&j->cpu, j->out, j->bias, j->rows, j->cols, j->dt);
}

static gt_status run_bias_backward(void *p) {
    bias_job *j = p;
    return gt_cpu_ops()->bias_backward(&j->cpu, j->dbias, j->dout, j->rows, j->cols, j->dt, j->accumulate);
}

static gt_status sim_bias_add(gt_backend *be, void *out, const float *bias, int64_t rows, int64_t cols,
                              gt_dtype dt) {
    bias_job job = {.cpu = cpu_view(be), .out = out, .bias = bias, .rows = rows, .cols = cols, .dt = dt};
    return launch(be, run_bias_add, &job, sizeof job);
}

static gt_status sim_bias_backward(gt_backend *be, float *dbias, const void *dout, int64_t rows, int64_t cols,
                                   gt_dtype dt, int accumulate) {
    bias_job job = {.cpu = cpu_view(be), .dbias = dbias, .dout = dout, .rows = rows, .cols = cols, .dt = dt,
                    .accumulate = accumulate};
    return launch(be, run_bias_backward, &job, sizeof job);
}

/* ------------------------------------------------------------ elementwise ---------- */

typedef struct elementwise_job {
    gt_backend cpu;       /* the CPU backend */
    void *out;            /* output (din for the backward ops) */
    const void *a, *b;    /* inputs: forward `in`, or backward (dout, in); add: (a, b) */
    int64_t n;            /* elements */
    gt_activation act;    /* activations */
    double p;             /* dropout probability */
    gt_dropout_key key;   /* dropout mask key */
    gt_dtype dt;          /* dtype */
} elementwise_job;

static gt_status run_act_forward(void *p) {
    elementwise_job *j = p;
    return gt_cpu_ops()->activation_forward(&j->cpu, j->out, j->a, j->n, j->act, j->dt);
}

static gt_status run_act_backward(void *p) {
    elementwise_job *j = p;
    return gt_cpu_ops()->activation_backward(&j->cpu, j->out, j->a, j->b, j->n, j->act, j->dt);
}

static gt_status run_dropout_forward(void *p) {
    elementwise_job *j = p;
    return gt_cpu_ops()->dropout_forward(&j->cpu, j->out, j->a, j->n, j->p, j->key, j->dt);
}

static gt_status run_dropout_backward(void *p) {
    elementwise_job *j = p;
    return gt_cpu_ops()->dropout_backward(&j->cpu, j->out, j->a, j->n, j->p, j->key, j->dt);
}

static gt_status run_add(void *p) {
    elementwise_job *j = p;
    return gt_cpu_ops()->add(&j->cpu, j->out, j->a, j->b, j->n, j->dt);
}

static gt_status sim_act_forward(gt_backend *be, void *out, const void *in, int64_t n, gt_activation act,
                                 gt_dtype dt) {
    elementwise_job job = {.cpu = cpu_view(be), .out = out, .a = in, .n = n, .act = act, .dt = dt};
    return launch(be, run_act_forward, &job, sizeof job);
}

static gt_status sim_act_backward(gt_backend *be, void *din, const void *dout, const void *in, int64_t n,
                                  gt_activation act, gt_dtype dt) {
    elementwise_job job = {.cpu = cpu_view(be), .out = din, .a = dout, .b = in, .n = n, .act = act, .dt = dt};
    return din ? launch(be, run_act_backward, &job, sizeof job) : GT_OK;
}

static gt_status sim_dropout_forward(gt_backend *be, void *out, const void *in, int64_t n, double p,
                                     gt_dropout_key key, gt_dtype dt) {
    elementwise_job job = {.cpu = cpu_view(be), .out = out, .a = in, .n = n, .p = p, .key = key, .dt = dt};
    return launch(be, run_dropout_forward, &job, sizeof job);
}

static gt_status sim_dropout_backward(gt_backend *be, void *din, const void *dout, int64_t n, double p,
                                      gt_dropout_key key, gt_dtype dt) {
    elementwise_job job = {.cpu = cpu_view(be), .out = din, .a = dout, .n = n, .p = p, .key = key, .dt = dt};
    return din ? launch(be, run_dropout_backward, &job, sizeof job) : GT_OK;
}

static gt_status sim_add(gt_backend *be, void *out, const void *a, const void *b, int64_t n, gt_dtype dt) {
    elementwise_job job = {.cpu = cpu_view(be), .out = out, .a = a, .b = b, .n = n, .dt = dt};
    return launch(be, run_add, &job, sizeof job);
}

/* ------------------------------------------------------------ LayerNorm ------------ */

typedef struct layernorm_job {
    gt_backend cpu;                   /* the CPU backend */
    void *out;                        /* forward output, or backward din (may be NULL) */
    float *mean, *rstd;               /* (rows,) statistics: written forward, read backward */
    float *dweight, *dbias;           /* backward parameter gradients (dbias may be NULL) */
    const void *in, *dout;            /* the input; backward: the output gradient */
    const float *weight, *bias;       /* (cols,) parameters (bias may be NULL) */
    int64_t rows, cols;               /* sizes */
    float eps;                        /* forward epsilon */
    gt_dtype dt;                      /* activation dtype */
    int accumulate;                   /* backward: 1 adds to the parameter gradients */
} layernorm_job;

static gt_status run_ln_forward(void *p) {
    layernorm_job *j = p;
    return gt_cpu_ops()->layernorm_forward(&j->cpu, j->out, j->mean, j->rstd, j->in, j->weight, j->bias,
                                           j->rows, j->cols, j->eps, j->dt);
}

static gt_status run_ln_backward(void *p) {
    layernorm_job *j = p;
    return gt_cpu_ops()->layernorm_backward(&j->cpu, j->out, j->dweight, j->dbias, j->dout, j->in, j->weight,
                                            j->mean, j->rstd, j->rows, j->cols, j->dt, j->accumulate);
}

static gt_status sim_ln_forward(gt_backend *be, void *out, float *mean, float *rstd, const void *in,
                                const float *weight, const float *bias, int64_t rows, int64_t cols, float eps,
                                gt_dtype dt) {
    layernorm_job job = {.cpu = cpu_view(be), .out = out, .mean = mean, .rstd = rstd, .in = in, .weight = weight,
                         .bias = bias, .rows = rows, .cols = cols, .eps = eps, .dt = dt};
    return launch(be, run_ln_forward, &job, sizeof job);
}

static gt_status sim_ln_backward(gt_backend *be, void *din, float *dweight, float *dbias, const void *dout,
                                 const void *in, const float *weight, const float *mean, const float *rstd,
                                 int64_t rows, int64_t cols, gt_dtype dt, int accumulate) {
    layernorm_job job = {.cpu = cpu_view(be), .out = din, .mean = (float *)mean, .rstd = (float *)rstd,
                         .dweight = dweight, .dbias = dbias, .in = in, .dout = dout, .weight = weight,
                         .rows = rows, .cols = cols, .dt = dt, .accumulate = accumulate};
    return launch(be, run_ln_backward, &job, sizeof job);
}

/* ------------------------------------------------------------ embedding ------------ */

typedef struct embedding_job {
    gt_backend cpu;          /* the CPU backend */
    void *out;               /* forward: (n, dim) dt */
    float *dtable;           /* backward: (num, dim) gradient */
    const void *dout;        /* backward: (n, dim) dt */
    const int64_t *ids;      /* (n,) ids, checked against num */
    const float *table;      /* forward: (num, dim) */
    int64_t n, num, dim;     /* sizes */
    gt_dtype dt;             /* activation dtype */
    int accumulate;          /* backward: 1 adds to dtable */
} embedding_job;

static gt_status run_emb_forward(void *p) {
    embedding_job *j = p;
    return gt_cpu_ops()->embedding_forward(&j->cpu, j->out, j->ids, j->table, j->n, j->num, j->dim, j->dt);
}

static gt_status run_emb_backward(void *p) {
    embedding_job *j = p;
    return gt_cpu_ops()->embedding_backward(&j->cpu, j->dtable, j->dout, j->ids, j->n, j->num, j->dim, j->dt,
                                            j->accumulate);
}

static gt_status sim_emb_forward(gt_backend *be, void *out, const int64_t *ids, const float *table, int64_t n,
                                 int64_t num, int64_t dim, gt_dtype dt) {
    embedding_job job = {.cpu = cpu_view(be), .out = out, .ids = ids, .table = table, .n = n, .num = num,
                         .dim = dim, .dt = dt};
    return launch(be, run_emb_forward, &job, sizeof job);
}

static gt_status sim_emb_backward(gt_backend *be, float *dtable, const void *dout, const int64_t *ids, int64_t n,
                                  int64_t num, int64_t dim, gt_dtype dt, int accumulate) {
    embedding_job job = {.cpu = cpu_view(be), .dtable = dtable, .dout = dout, .ids = ids, .n = n, .num = num,
                         .dim = dim, .dt = dt, .accumulate = accumulate};
    return launch(be, run_emb_backward, &job, sizeof job);
}

/* ------------------------------------------------------------ losses and norms ----- */

typedef struct loss_job {
    gt_backend cpu;            /* the CPU backend */
    float *losses;             /* xent: (rows,) per-row losses */
    int64_t *count;            /* xent: host count of rows that count */
    float *loss;               /* mse: host mean */
    void *dpred;               /* gradient output, or NULL */
    const void *pred;          /* logits / predictions */
    const int64_t *targets;    /* xent: (rows,) labels */
    const float *values;       /* mse: (n,) f32 targets */
    int64_t rows, classes;     /* xent sizes; mse: rows = n */
    float label_smoothing;     /* xent */
    int64_t ignore_index;      /* xent */
    float dloss_scale;         /* gradient scale */
    gt_dtype dt;               /* activation dtype */
} loss_job;

static gt_status run_xent(void *p) {
    loss_job *j = p;
    return gt_cpu_ops()->softmax_xent(&j->cpu, j->losses, j->count, j->dpred, j->pred, j->targets, j->rows,
                                      j->classes, j->label_smoothing, j->ignore_index, j->dloss_scale, j->dt);
}

static gt_status run_mse(void *p) {
    loss_job *j = p;
    return gt_cpu_ops()->mse(&j->cpu, j->loss, j->dpred, j->pred, j->values, j->rows, j->dloss_scale, j->dt);
}

static gt_status sim_xent(gt_backend *be, float *losses, int64_t *count, void *dlogits, const void *logits,
                          const int64_t *targets, int64_t rows, int64_t classes, float label_smoothing,
                          int64_t ignore_index, float dloss_scale, gt_dtype dt) {
    loss_job job = {.cpu = cpu_view(be), .losses = losses, .count = count, .dpred = dlogits, .pred = logits,
                    .targets = targets, .rows = rows, .classes = classes, .label_smoothing = label_smoothing,
                    .ignore_index = ignore_index, .dloss_scale = dloss_scale, .dt = dt};
    return launch(be, run_xent, &job, sizeof job);
}

static gt_status sim_mse(gt_backend *be, float *loss, void *dpred, const void *pred, const float *target,
                         int64_t n, float dloss_scale, gt_dtype dt) {
    loss_job job = {.cpu = cpu_view(be), .loss = loss, .dpred = dpred, .pred = pred, .values = target, .rows = n,
                    .dloss_scale = dloss_scale, .dt = dt};
    return launch(be, run_mse, &job, sizeof job);
}

typedef struct sumsq_op_job {
    gt_backend cpu;    /* the CPU backend */
    double *out;       /* host result */
    const float *x;    /* (n,) values */
    int64_t n;         /* elements */
} sumsq_op_job;

static gt_status run_sum_squares(void *p) {
    sumsq_op_job *j = p;
    return gt_cpu_ops()->sum_squares(&j->cpu, j->out, j->x, j->n);
}

static gt_status sim_sum_squares(gt_backend *be, double *out, const float *x, int64_t n) {
    sumsq_op_job job = {cpu_view(be), out, x, n};
    return launch_wait(be, run_sum_squares, &job, sizeof job);
}

/* ------------------------------------------------------------ memory ops ----------- */

typedef struct memory_job {
    gt_backend cpu;          /* the CPU backend */
    void *dst;               /* destination */
    const void *src;         /* source (cast, copy) */
    gt_dtype dst_dt, src_dt; /* cast dtypes */
    int64_t n;               /* cast elements */
    size_t bytes;            /* copy/zero bytes */
} memory_job;

static gt_status run_cast(void *p) {
    memory_job *j = p;
    return gt_cpu_ops()->cast(&j->cpu, j->dst, j->dst_dt, j->src, j->src_dt, j->n);
}

static gt_status run_copy(void *p) {
    memory_job *j = p;
    return gt_cpu_ops()->copy(&j->cpu, j->dst, j->src, j->bytes);
}

static gt_status run_zero(void *p) {
    memory_job *j = p;
    return gt_cpu_ops()->zero(&j->cpu, j->dst, j->bytes);
}

static gt_status sim_cast(gt_backend *be, void *dst, gt_dtype dst_dt, const void *src, gt_dtype src_dt,
                          int64_t n) {
    memory_job job = {.cpu = cpu_view(be), .dst = dst, .src = src, .dst_dt = dst_dt, .src_dt = src_dt, .n = n};
    return launch(be, run_cast, &job, sizeof job);
}

static gt_status sim_copy(gt_backend *be, void *dst, const void *src, size_t bytes) {
    memory_job job = {.cpu = cpu_view(be), .dst = dst, .src = src, .bytes = bytes};
    return launch(be, run_copy, &job, sizeof job);
}

static gt_status sim_zero(gt_backend *be, void *dst, size_t bytes) {
    memory_job job = {.cpu = cpu_view(be), .dst = dst, .bytes = bytes};
    return launch(be, run_zero, &job, sizeof job);
}

/* ------------------------------------------------------------ the table ------------ */

/* ------------------------------------------------------------ attention ------------ */

typedef struct attention_job {
    gt_backend cpu;           /* the CPU backend over this backend's workspace */
    gt_attention_args args;   /* the attention (operands in sim memory) */
} attention_job;

static gt_status run_attention_forward(void *p) {
    attention_job *j = p;
    return gt_cpu_ops()->attention_forward(&j->cpu, &j->args);
}

static gt_status run_attention_backward(void *p) {
    attention_job *j = p;
    return gt_cpu_ops()->attention_backward(&j->cpu, &j->args);
}

static gt_status sim_attention_forward(gt_backend *be, const gt_attention_args *args) {
    attention_job job = {cpu_view(be), *args};
    return launch(be, run_attention_forward, &job, sizeof job);
}

static gt_status sim_attention_backward(gt_backend *be, const gt_attention_args *args) {
    attention_job job = {cpu_view(be), *args};
    return launch(be, run_attention_backward, &job, sizeof job);
}

static size_t sim_attention_workspace_bytes(const gt_attention_args *args, int threads) {
    return gt_cpu_ops()->attention_workspace_bytes(args, threads);
}

/* ------------------------------------------------------------ masks and pooling ---- */

typedef struct pool_job {
    gt_backend cpu;          /* the CPU backend */
    void *dst;               /* pool_forward: out (batch, dim); pool_backward: din (batch, seq, dim) */
    const void *src;         /* pool_forward: in; pool_backward: dout */
    int64_t *lengths_out;    /* mask_lengths: (batch,) written */
    const int64_t *mask;     /* mask_lengths: rows of `stride` ids */
    const int64_t *lengths;  /* pooling: (batch,) or NULL */
    int64_t batch, seq, dim, stride;  /* sizes */
    gt_pool_mode mode;       /* pooling */
    gt_dtype dt;             /* activation dtype */
} pool_job;

static gt_status run_mask_lengths(void *p) {
    pool_job *j = p;
    return gt_cpu_ops()->mask_lengths(&j->cpu, j->lengths_out, j->mask, j->batch, j->seq, j->stride);
}

static gt_status run_pool_forward(void *p) {
    pool_job *j = p;
    return gt_cpu_ops()->pool_forward(&j->cpu, j->dst, j->src, j->lengths, j->batch, j->seq, j->dim,
                                      j->mode, j->dt);
}

static gt_status run_pool_backward(void *p) {
    pool_job *j = p;
    return gt_cpu_ops()->pool_backward(&j->cpu, j->dst, j->src, j->lengths, j->batch, j->seq, j->dim,
                                       j->mode, j->dt);
}

static gt_status sim_mask_lengths(gt_backend *be, int64_t *lengths, const int64_t *mask, int64_t batch,
                                  int64_t seq, int64_t stride) {
    pool_job job = {.cpu = cpu_view(be), .lengths_out = lengths, .mask = mask, .batch = batch,
                    .seq = seq, .stride = stride};
    return launch(be, run_mask_lengths, &job, sizeof job);
}

static gt_status sim_pool_forward(gt_backend *be, void *out, const void *in, const int64_t *lengths,
                                  int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    pool_job job = {.cpu = cpu_view(be), .dst = out, .src = in, .lengths = lengths, .batch = batch,
                    .seq = seq, .dim = dim, .mode = mode, .dt = dt};
    return launch(be, run_pool_forward, &job, sizeof job);
}

static gt_status sim_pool_backward(gt_backend *be, void *din, const void *dout, const int64_t *lengths,
                                   int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt) {
    pool_job job = {.cpu = cpu_view(be), .dst = din, .src = dout, .lengths = lengths, .batch = batch,
                    .seq = seq, .dim = dim, .mode = mode, .dt = dt};
    return launch(be, run_pool_backward, &job, sizeof job);
}

/* ------------------------------------------------------------ convolution ---------- */

typedef struct conv2d_job {
    gt_backend cpu;        /* the CPU backend over this backend's workspace */
    gt_conv2d_args args;   /* the convolution (operands in sim memory) */
} conv2d_job;

static gt_status run_conv2d_forward(void *p) {
    conv2d_job *j = p;
    return gt_cpu_ops()->conv2d_forward(&j->cpu, &j->args);
}

static gt_status run_conv2d_backward(void *p) {
    conv2d_job *j = p;
    return gt_cpu_ops()->conv2d_backward(&j->cpu, &j->args);
}

static gt_status sim_conv2d_forward(gt_backend *be, const gt_conv2d_args *args) {
    conv2d_job job = {cpu_view(be), *args};
    return launch(be, run_conv2d_forward, &job, sizeof job);
}

static gt_status sim_conv2d_backward(gt_backend *be, const gt_conv2d_args *args) {
    conv2d_job job = {cpu_view(be), *args};
    return launch(be, run_conv2d_backward, &job, sizeof job);
}

static size_t sim_conv2d_workspace_bytes(const gt_conv2d_args *args, int threads) {
    return gt_cpu_ops()->conv2d_workspace_bytes(args, threads);
}

/* ------------------------------------------------------------ BatchNorm and pooling  */

typedef struct batchnorm_job {
    gt_backend cpu;            /* the CPU backend */
    gt_batchnorm_args args;    /* the BatchNorm (operands and running statistics in sim memory) */
} batchnorm_job;
_Static_assert(sizeof(batchnorm_job) <= GT_SIM_ARGS_BYTES, "a BatchNorm job fits a queue entry");

static gt_status run_batchnorm_forward(void *p) {
    batchnorm_job *j = p;
    return gt_cpu_ops()->batchnorm_forward(&j->cpu, &j->args);
}

static gt_status run_batchnorm_backward(void *p) {
    batchnorm_job *j = p;
    return gt_cpu_ops()->batchnorm_backward(&j->cpu, &j->args);
}

static gt_status sim_batchnorm_forward(gt_backend *be, const gt_batchnorm_args *args) {
    batchnorm_job job = {cpu_view(be), *args};
    return launch(be, run_batchnorm_forward, &job, sizeof job);
}

static gt_status sim_batchnorm_backward(gt_backend *be, const gt_batchnorm_args *args) {
    batchnorm_job job = {cpu_view(be), *args};
    return launch(be, run_batchnorm_backward, &job, sizeof job);
}

typedef struct pool2d_job {
    gt_backend cpu;          /* the CPU backend over this backend's workspace */
    gt_pool2d_args args;     /* the pooling (operands in sim memory) */
} pool2d_job;
_Static_assert(sizeof(pool2d_job) <= GT_SIM_ARGS_BYTES, "a pooling job fits a queue entry");

static gt_status run_pool2d_forward(void *p) {
    pool2d_job *j = p;
    return gt_cpu_ops()->pool2d_forward(&j->cpu, &j->args);
}

static gt_status run_pool2d_backward(void *p) {
    pool2d_job *j = p;
    return gt_cpu_ops()->pool2d_backward(&j->cpu, &j->args);
}

static gt_status sim_pool2d_forward(gt_backend *be, const gt_pool2d_args *args) {
    pool2d_job job = {cpu_view(be), *args};
    return launch(be, run_pool2d_forward, &job, sizeof job);
}

static gt_status sim_pool2d_backward(gt_backend *be, const gt_pool2d_args *args) {
    pool2d_job job = {cpu_view(be), *args};
    return launch(be, run_pool2d_backward, &job, sizeof job);
}

static size_t sim_pool2d_workspace_bytes(const gt_pool2d_args *args, int threads) {
    return gt_cpu_ops()->pool2d_workspace_bytes(args, threads);
}

static size_t sim_gemm_workspace_bytes(const gt_gemm_args *args) { return gt_cpu_ops()->gemm_workspace_bytes(args); }

static const gt_ops sim_ops = {
    .name = "sim",
    .gemm_workspace_bytes = sim_gemm_workspace_bytes,
    .gemm = sim_gemm,
    .bias_add = sim_bias_add,
    .bias_backward = sim_bias_backward,
    .activation_forward = sim_act_forward,
    .activation_backward = sim_act_backward,
    .dropout_forward = sim_dropout_forward,
    .dropout_backward = sim_dropout_backward,
    .add = sim_add,
    .layernorm_forward = sim_ln_forward,
    .layernorm_backward = sim_ln_backward,
    .embedding_forward = sim_emb_forward,
    .embedding_backward = sim_emb_backward,
    .softmax_xent = sim_xent,
    .mse = sim_mse,
    .sum_squares = sim_sum_squares,
    .cast = sim_cast,
    .copy = sim_copy,
    .zero = sim_zero,
    .attention_workspace_bytes = sim_attention_workspace_bytes,
    .attention_forward = sim_attention_forward,
    .attention_backward = sim_attention_backward,
    .mask_lengths = sim_mask_lengths,
    .pool_forward = sim_pool_forward,
    .pool_backward = sim_pool_backward,
    .conv2d_workspace_bytes = sim_conv2d_workspace_bytes,
    .conv2d_forward = sim_conv2d_forward,
    .conv2d_backward = sim_conv2d_backward,
    .batchnorm_forward = sim_batchnorm_forward,
    .batchnorm_backward = sim_batchnorm_backward,
    .pool2d_workspace_bytes = sim_pool2d_workspace_bytes,
    .pool2d_forward = sim_pool2d_forward,
    .pool2d_backward = sim_pool2d_backward,
};

const gt_ops *gt_sim_ops(void) { return &sim_ops; }

gt_status gt_sim_backend_init(gt_backend *be, int index, gt_stream *stream) {
    *be = (gt_backend){0};
    if (index < 0 || index >= GT_SIM_DEVICES)
        return GT_FAIL(GT_ERR_VALUE, "device: 'sim:%d' does not exist (%d simulated devices)", index,
                       GT_SIM_DEVICES);
    gt_sim_backend_state *state = calloc(1, sizeof *state);
    if (!state)
        return GT_FAIL(GT_ERR_OOM, "sim: out of host memory for a backend state");
    state->index = index;
    state->stream = stream;
    be->ops = &sim_ops;
    be->device = (gt_device){GT_DEVICE_SIM, index};
    be->impl = state;
    return GT_OK;
}

void gt_sim_backend_release(gt_backend *be) {
    if (!be->impl)
        return;
    gt_sim_backend_state *state = be->impl;
    gt_sim_stream_synchronize(state->index, state->stream);
    gt_clear_error();
    free(state);
    be->impl = NULL;
}
