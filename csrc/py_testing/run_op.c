/* gputrain._C.run_op: runs one op of a backend's table (ops.h) on NumPy arrays, so tests can
 * compare the CUDA and sim backends with the CPU backend op by op on the same inputs.
 *
 *     run_op(backend, op, arrays, args, device=0)
 *
 * `arrays` are the op's array arguments in the order of its C signature (None only where the op
 * takes NULL); `args` its other arguments in signature order (dtypes as names: 'f32', 'f16',
 * 'bf16', ...). Every array is C-contiguous, aligned and writeable; its raw bytes are used, and
 * the sizes in `args` are checked against its byte size before anything runs, so a wrong call
 * raises ValueError instead of touching memory out of range. With backend 'cpu' the op works on
 * the arrays in place; with 'cuda' or 'sim' (device interface, core/device_backend.h) every array is copied to device memory (at the same offset
 * modulo 256 as the host array, so an array that starts at an odd element tests unaligned
 * device pointers), the op runs, and every array is copied back (outputs land in them; inputs
 * come back unchanged unless the op wrote them). A GEMM gets the workspace gemm_workspace_bytes
 * asks for. Returns the op's host result: the count of softmax_xent, the loss of mse (both
 * written to device memory by a device backend, then copied back), the sum of sum_squares;
 * None otherwise. An attention op gets the workspace attention_workspace_bytes asks for (with
 * the CPU's thread count). */
#include "py_testing/testing.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/threads.h"
#include "ops/ops.h"
#include "core/device_backend.h"

enum { MAX_ARRAYS = 11, DEVICE_ALIGN = 256 };

/* One call: the parsed arguments, the bytes each array must hold, and the pointers the op gets. */
typedef struct op_call {
    void *ptr[MAX_ARRAYS];    /* array arguments as the op sees them (host or device) */
    size_t need[MAX_ARRAYS];  /* bytes each array must hold for these arguments */
    long long size[3];        /* sizes in signature order (rows, cols, n, num, dim, ...) */
    double real[3];           /* float arguments in signature order */
    gt_dtype dt[2];           /* dtype arguments in signature order */
    int flag;                 /* accumulate, or the activation code (rmsnorm_forward: plus_one) */
    gt_dropout_key key;       /* dropout's key */
    gt_gemm_args gemm;        /* GEMM arguments (pointers filled in by run_gemm) */
    gt_attention_args attn;   /* attention arguments (pointers filled in by run_attention) */
    gt_rope_args rope;        /* rope arguments (pointers filled in by run_rope) */
    int64_t count;            /* softmax_xent's result (host) */
    float loss;               /* mse's result (host) */
    void *result;             /* where softmax_xent/mse write it: &count / &loss, or device memory */
    float dloss_scale;        /* softmax_xent's and mse's gradient scale (host) */
    const float *scale_at;    /* where they read it: &dloss_scale, or device memory */
    double sum;               /* sum_squares's result */
} op_call;

typedef struct op_spec {
    const char *name;                   /* the table entry */
    int num_arrays;                     /* array arguments */
    const char *arrays[MAX_ARRAYS];     /* their names in the C signature */
    unsigned optional;                  /* bit k set: array k may be None (NULL) */
    int (*parse)(PyObject *module, PyObject *args, op_call *call);  /* scalars and need[] */
    gt_status (*run)(gt_backend *be, op_call *call);                /* the op itself */
    char result;                        /* 'c' count, 'l' loss, 's' sum, 0 none */
} op_spec;

/* ------------------------------------------------------------ sizes ------------------------ */

/* Bytes of a * b elements of `elem` bytes; 0 when a or b is <= 0, SIZE_MAX on overflow. */
static size_t bytes_of(int64_t a, int64_t b, size_t elem) {
    if (a <= 0 || b <= 0)
        return 0;
    size_t ab, bytes;
    if (__builtin_mul_overflow((size_t)a, (size_t)b, &ab) || __builtin_mul_overflow(ab, elem, &bytes))
        return SIZE_MAX;
    return bytes;
}

/* Bytes spanned by `batch` (rows, cols) matrices with leading dimension ld and batch stride. */
static size_t matrix_bytes(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld, size_t elem) {
    if (batch <= 0 || rows <= 0 || cols <= 0 || ld <= 0 || (batch > 1 && stride < 0))
        return 0;
    int64_t last = 0, extent = 0;
    if (__builtin_mul_overflow(batch - 1, stride, &last) || __builtin_mul_overflow(rows - 1, ld, &extent) ||
        __builtin_add_overflow(last, extent, &extent) || __builtin_add_overflow(extent, cols, &extent))
        return SIZE_MAX;
    return bytes_of(extent, 1, elem);
}

static int parse_dtype(PyObject *module, const char *text, const char *name, gt_dtype *out) {
    gt_status status = gt_dtype_parse(text, name, out);
    return status == GT_OK ? 0 : gtpy_raise_int(module, status);
}

/* ------------------------------------------------------------ per-op arguments ------------- */

/* (trans_a, trans_b, m, n, k, alpha, a_dt, lda, b_dt, ldb, beta, c_dt, ldc, batch, stride_a,
 *  stride_b, stride_c): the fields of gt_gemm_args after the pointers are dropped. */
static int parse_gemm(PyObject *module, PyObject *args, op_call *call) {
    gt_gemm_args *g = &call->gemm;
    const char *a_dt, *b_dt, *c_dt;
    long long m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
    if (!PyArg_ParseTuple(args, "ppLLLfsLsLfsLLLLL:gemm", &g->trans_a, &g->trans_b, &m, &n, &k, &g->alpha, &a_dt,
                          &lda, &b_dt, &ldb, &g->beta, &c_dt, &ldc, &batch, &sa, &sb, &sc) ||
        parse_dtype(module, a_dt, "a_dt", &g->a_dt) < 0 || parse_dtype(module, b_dt, "b_dt", &g->b_dt) < 0 ||
        parse_dtype(module, c_dt, "c_dt", &g->c_dt) < 0)
        return -1;
    g->m = m, g->n = n, g->k = k, g->lda = lda, g->ldb = ldb, g->ldc = ldc;
    g->batch = batch, g->stride_a = sa, g->stride_b = sb, g->stride_c = sc;
    int64_t a_rows = g->trans_a ? k : m, a_cols = g->trans_a ? m : k;
    int64_t b_rows = g->trans_b ? n : k, b_cols = g->trans_b ? k : n;
    int reads_ab = m > 0 && n > 0 && k > 0;
    call->need[0] = reads_ab ? matrix_bytes(batch, sa, a_rows, a_cols, lda, gt_dtype_size(g->a_dt)) : 0;
    call->need[1] = reads_ab ? matrix_bytes(batch, sb, b_rows, b_cols, ldb, gt_dtype_size(g->b_dt)) : 0;
    call->need[2] = matrix_bytes(batch, sc, m, n, ldc, gt_dtype_size(g->c_dt));
    return 0;
}

static gt_status run_gemm(gt_backend *be, op_call *call) {
    call->gemm.a = call->ptr[0], call->gemm.b = call->ptr[1], call->gemm.c = call->ptr[2];
    return be->ops->gemm(be, &call->gemm);
}

/* (rows, cols, dt) */
static int parse_bias_add(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLs:bias_add", &call->size[0], &call->size[1], &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    call->need[0] = bytes_of(call->size[0], call->size[1], gt_dtype_size(call->dt[0]));
    call->need[1] = bytes_of(call->size[1], 1, sizeof(float));
    return 0;
}

static gt_status run_bias_add(gt_backend *be, op_call *call) {
    return be->ops->bias_add(be, call->ptr[0], call->ptr[1], call->size[0], call->size[1], call->dt[0]);
}

/* (rows, cols, dt, accumulate) */
static int parse_bias_backward(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLsp:bias_backward", &call->size[0], &call->size[1], &dt, &call->flag) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    call->need[0] = bytes_of(call->size[1], 1, sizeof(float));
    call->need[1] = bytes_of(call->size[0], call->size[1], gt_dtype_size(call->dt[0]));
    return 0;
}

static gt_status run_bias_backward(gt_backend *be, op_call *call) {
    return be->ops->bias_backward(be, call->ptr[0], call->ptr[1], call->size[0], call->size[1], call->dt[0],
                                  call->flag);
}

/* (n, act, dt): act is the gt_activation code */
static int parse_activation(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "Lis:activation", &call->size[0], &call->flag, &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    size_t bytes = bytes_of(call->size[0], 1, gt_dtype_size(call->dt[0]));
    for (int k = 0; k < 3; k++)
        call->need[k] = bytes;
    return 0;
}

static gt_status run_activation_forward(gt_backend *be, op_call *call) {
    return be->ops->activation_forward(be, call->ptr[0], call->ptr[1], call->size[0], (gt_activation)call->flag,
                                       call->dt[0]);
}

static gt_status run_activation_backward(gt_backend *be, op_call *call) {
    return be->ops->activation_backward(be, call->ptr[0], call->ptr[1], call->ptr[2], call->size[0],
                                        (gt_activation)call->flag, call->dt[0]);
}

/* (n, p, seed, layer, step, offset, dt) */
static int parse_dropout(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    unsigned long long seed, offset;
    unsigned int layer, step;
    if (!PyArg_ParseTuple(args, "LdKIIKs:dropout", &call->size[0], &call->real[0], &seed, &layer, &step, &offset,
                          &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    call->key = (gt_dropout_key){seed, layer, step, offset};
    call->need[0] = call->need[1] = bytes_of(call->size[0], 1, gt_dtype_size(call->dt[0]));
    return 0;
}

static gt_status run_dropout_forward(gt_backend *be, op_call *call) {
    return be->ops->dropout_forward(be, call->ptr[0], call->ptr[1], call->size[0], call->real[0], call->key,
                                    call->dt[0]);
}

static gt_status run_dropout_backward(gt_backend *be, op_call *call) {
    return be->ops->dropout_backward(be, call->ptr[0], call->ptr[1], call->size[0], call->real[0],
                                     call->key, call->dt[0]);
}

/* (n, dt) */
static int parse_add(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "Ls:add", &call->size[0], &dt) || parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    call->need[0] = call->need[1] = call->need[2] = bytes_of(call->size[0], 1, gt_dtype_size(call->dt[0]));
    return 0;
}

static gt_status run_add(gt_backend *be, op_call *call) {
    return be->ops->add(be, call->ptr[0], call->ptr[1], call->ptr[2], call->size[0], call->dt[0]);
}

/* (n, factor, dt): arrays out, in */
static int parse_scale(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "Lds:scale", &call->size[0], &call->real[0], &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    call->need[0] = call->need[1] = bytes_of(call->size[0], 1, gt_dtype_size(call->dt[0]));
    return 0;
}

static gt_status run_scale(gt_backend *be, op_call *call) {
    return be->ops->scale(be, call->ptr[0], call->ptr[1], call->size[0], (float)call->real[0], call->dt[0]);
}

/* (rows, cols, eps, dt): arrays out, mean, rstd, in, weight, bias */
static int parse_layernorm_forward(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLds:layernorm_forward", &call->size[0], &call->size[1], &call->real[0], &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    long long rows = call->size[0], cols = call->size[1];
    call->need[0] = call->need[3] = bytes_of(rows, cols, gt_dtype_size(call->dt[0]));
    call->need[1] = call->need[2] = bytes_of(rows, 1, sizeof(float));
    call->need[4] = call->need[5] = bytes_of(cols, 1, sizeof(float));
    return 0;
}

static gt_status run_layernorm_forward(gt_backend *be, op_call *call) {
    void **p = call->ptr;
    return be->ops->layernorm_forward(be, p[0], p[1], p[2], p[3], p[4], p[5], call->size[0], call->size[1],
                                      (float)call->real[0], call->dt[0]);
}

/* (rows, cols, dt, accumulate): arrays din, dweight, dbias, dout, in, weight, mean, rstd */
static int parse_layernorm_backward(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLsp:layernorm_backward", &call->size[0], &call->size[1], &dt, &call->flag) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    long long rows = call->size[0], cols = call->size[1];
    call->need[0] = call->need[3] = call->need[4] = bytes_of(rows, cols, gt_dtype_size(call->dt[0]));
    call->need[1] = call->need[2] = call->need[5] = bytes_of(cols, 1, sizeof(float));
    call->need[6] = call->need[7] = bytes_of(rows, 1, sizeof(float));
    return 0;
}

static gt_status run_layernorm_backward(gt_backend *be, op_call *call) {
    void **p = call->ptr;
    return be->ops->layernorm_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], call->size[0],
                                       call->size[1], call->dt[0], call->flag);
}

/* (rows, cols, eps, dt[, plus_one]): arrays out, rstd, in, weight */
static int parse_rmsnorm_forward(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLds|p:rmsnorm_forward", &call->size[0], &call->size[1], &call->real[0], &dt,
                          &call->flag) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    long long rows = call->size[0], cols = call->size[1];
    call->need[0] = call->need[2] = bytes_of(rows, cols, gt_dtype_size(call->dt[0]));
    call->need[1] = bytes_of(rows, 1, sizeof(float));
    call->need[3] = bytes_of(cols, 1, sizeof(float));
    return 0;
}

static gt_status run_rmsnorm_forward(gt_backend *be, op_call *call) {
    void **p = call->ptr;
    return be->ops->rmsnorm_forward(be, p[0], p[1], p[2], p[3], call->flag, call->size[0], call->size[1],
                                    (float)call->real[0], call->dt[0]);
}

/* (rows, cols, dt, accumulate[, plus_one]): arrays din, dweight, dout, in, weight, rstd */
static int parse_rmsnorm_backward(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    int plus_one = 0;
    if (!PyArg_ParseTuple(args, "LLsp|p:rmsnorm_backward", &call->size[0], &call->size[1], &dt, &call->flag,
                          &plus_one) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    call->size[2] = plus_one;
    long long rows = call->size[0], cols = call->size[1];
    call->need[0] = call->need[2] = call->need[3] = bytes_of(rows, cols, gt_dtype_size(call->dt[0]));
    call->need[1] = call->need[4] = bytes_of(cols, 1, sizeof(float));
    call->need[5] = bytes_of(rows, 1, sizeof(float));
    return 0;
}

static gt_status run_rmsnorm_backward(gt_backend *be, op_call *call) {
    void **p = call->ptr;
    return be->ops->rmsnorm_backward(be, p[0], p[1], p[2], p[3], p[4], (int)call->size[2], p[5], call->size[0],
                                     call->size[1], call->dt[0], call->flag);
}

/* forward (n, num, dim, dt): arrays out, ids, table; backward (n, num, dim, dt, accumulate):
 * arrays dtable, dout, ids */
static int parse_embedding(PyObject *module, PyObject *args, op_call *call, int backward) {
    const char *dt;
    long long *s = call->size;
    int ok = backward ? PyArg_ParseTuple(args, "LLLsp:embedding_backward", &s[0], &s[1], &s[2], &dt, &call->flag)
                      : PyArg_ParseTuple(args, "LLLs:embedding_forward", &s[0], &s[1], &s[2], &dt);
    if (!ok || parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    size_t rows_bytes = bytes_of(s[0], s[2], gt_dtype_size(call->dt[0]));
    size_t ids_bytes = bytes_of(s[0], 1, sizeof(int64_t)), table_bytes = bytes_of(s[1], s[2], sizeof(float));
    call->need[0] = backward ? table_bytes : rows_bytes;
    call->need[1] = backward ? rows_bytes : ids_bytes;
    call->need[2] = backward ? ids_bytes : table_bytes;
    return 0;
}

static int parse_embedding_forward(PyObject *module, PyObject *args, op_call *call) {
    return parse_embedding(module, args, call, 0);
}

static int parse_embedding_backward(PyObject *module, PyObject *args, op_call *call) {
    return parse_embedding(module, args, call, 1);
}

static gt_status run_embedding_forward(gt_backend *be, op_call *call) {
    return be->ops->embedding_forward(be, call->ptr[0], call->ptr[1], call->ptr[2], GT_F32, call->size[0],
                                      call->size[1], call->size[2], call->dt[0]);
}

static gt_status run_embedding_backward(gt_backend *be, op_call *call) {
    return be->ops->embedding_backward(be, call->ptr[0], call->ptr[1], call->ptr[2], call->size[0], call->size[1],
                                       call->size[2], call->dt[0], call->flag);
}

/* (rows, classes, label_smoothing, ignore_index, dloss_scale, dt): arrays losses, dlogits
 * (None: no gradient), logits, targets */
static int parse_softmax_xent(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLdLds:softmax_xent", &call->size[0], &call->size[1], &call->real[0],
                          &call->size[2], &call->real[1], &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    long long rows = call->size[0];
    call->dloss_scale = (float)call->real[1];
    call->need[0] = bytes_of(rows, 1, sizeof(float));
    call->need[1] = call->need[2] = bytes_of(rows, call->size[1], gt_dtype_size(call->dt[0]));
    call->need[3] = bytes_of(rows, 1, sizeof(int64_t));
    return 0;
}

static gt_status run_softmax_xent(gt_backend *be, op_call *call) {
    return be->ops->softmax_xent(be, call->ptr[0], call->result, call->ptr[1], call->ptr[2], call->ptr[3],
                                 call->size[0], call->size[1], (float)call->real[0], call->size[2],
                                 call->scale_at, 1.0f, call->dt[0]);
}

/* (rows, classes, label_smoothing, ignore_index, alpha, dloss_scale, dt): softmax_xent's arrays */
static int parse_softmax_xent_rdrop(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLdLdds:softmax_xent_rdrop", &call->size[0], &call->size[1], &call->real[0],
                          &call->size[2], &call->real[2], &call->real[1], &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    long long rows = call->size[0];
    call->dloss_scale = (float)call->real[1];
    call->need[0] = bytes_of(rows, 1, sizeof(float));
    call->need[1] = call->need[2] = bytes_of(rows, call->size[1], gt_dtype_size(call->dt[0]));
    call->need[3] = bytes_of(rows, 1, sizeof(int64_t));
    return 0;
}

static gt_status run_softmax_xent_rdrop(gt_backend *be, op_call *call) {
    return be->ops->softmax_xent_rdrop(be, call->ptr[0], call->result, call->ptr[1], call->ptr[2], call->ptr[3],
                                       call->size[0], call->size[1], (float)call->real[0], call->size[2],
                                       (float)call->real[2], call->scale_at, 1.0f, call->dt[0]);
}

/* (n, dloss_scale, dt): arrays dpred (None: no gradient), pred, target */
static int parse_mse(PyObject *module, PyObject *args, op_call *call) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "Lds:mse", &call->size[0], &call->real[0], &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    call->dloss_scale = (float)call->real[0];
    call->need[0] = call->need[1] = bytes_of(call->size[0], 1, gt_dtype_size(call->dt[0]));
    call->need[2] = bytes_of(call->size[0], 1, sizeof(float));
    return 0;
}

static gt_status run_mse(gt_backend *be, op_call *call) {
    return be->ops->mse(be, call->result, call->ptr[0], call->ptr[1], call->ptr[2], call->size[0],
                        call->scale_at, 1.0f, call->dt[0]);
}

/* (n,) */
static int parse_sum_squares(PyObject *module, PyObject *args, op_call *call) {
    if (!PyArg_ParseTuple(args, "L:sum_squares", &call->size[0]))
        return -1;
    call->need[0] = bytes_of(call->size[0], 1, sizeof(float));
    return 0;
}

static gt_status run_sum_squares(gt_backend *be, op_call *call) {
    return be->ops->sum_squares(be, &call->sum, call->ptr[0], call->size[0]);
}

/* (dst_dt, src_dt, n): arrays dst, src */
static int parse_cast(PyObject *module, PyObject *args, op_call *call) {
    const char *dst_dt, *src_dt;
    if (!PyArg_ParseTuple(args, "ssL:cast", &dst_dt, &src_dt, &call->size[0]) ||
        parse_dtype(module, dst_dt, "dst_dt", &call->dt[0]) < 0 ||
        parse_dtype(module, src_dt, "src_dt", &call->dt[1]) < 0)
        return -1;
    call->need[0] = bytes_of(call->size[0], 1, gt_dtype_size(call->dt[0]));
    call->need[1] = bytes_of(call->size[0], 1, gt_dtype_size(call->dt[1]));
    return 0;
}

static gt_status run_cast(gt_backend *be, op_call *call) {
    return be->ops->cast(be, call->ptr[0], call->dt[0], call->ptr[1], call->dt[1], call->size[0]);
}

/* (bytes,): copy has arrays dst, src; zero has dst */
static int parse_bytes(PyObject *module, PyObject *args, op_call *call) {
    if (!PyArg_ParseTuple(args, "L:copy/zero", &call->size[0]))
        return -1;
    if (call->size[0] < 0) {
        PyErr_Format(PyExc_ValueError, "bytes: must be >= 0, got %lld", (long long)call->size[0]);
        return -1;
    }
    call->need[0] = call->need[1] = (size_t)call->size[0];
    return 0;
}

static gt_status run_copy(gt_backend *be, op_call *call) {
    return be->ops->copy(be, call->ptr[0], call->ptr[1], (size_t)call->size[0]);
}

static gt_status run_zero(gt_backend *be, op_call *call) {
    return be->ops->zero(be, call->ptr[0], (size_t)call->size[0]);
}

/* Bytes of the product of `n` dimensions times `elem`; 0 when one is <= 0, SIZE_MAX on overflow. */
static size_t dims_bytes(const int64_t *dims, int n, size_t elem) {
    size_t total = elem;
    for (int i = 0; i < n; i++) {
        if (dims[i] <= 0)
            return 0;
        if (__builtin_mul_overflow(total, (size_t)dims[i], &total))
            return SIZE_MAX;
    }
    return total;
}

/* (batch, heads, seq, head_dim, causal, scale, dropout_p, seed, layer, step, offset, dt[, kv_heads,
 * window]): arrays q, out[, dout, dq] contiguous (batch, heads, seq, head_dim) of dt, k, v[, dk,
 * dv] contiguous (batch, kv_heads, seq, head_dim) (kv_heads 0 or absent: heads), lse (batch,
 * heads, seq) f32, key_lengths (batch,) int64 or None, key_starts (batch, seq) int64 or None. */
static int parse_attention(PyObject *module, PyObject *args, op_call *call, int backward) {
    gt_attention_args *a = &call->attn;
    long long b, h, t, d, kv = 0, window = 0;
    unsigned long long seed, layer, step, offset;
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLLLpfdKKKKs|LL:attention", &b, &h, &t, &d, &a->causal, &a->scale,
                          &a->dropout_p, &seed, &layer, &step, &offset, &dt, &kv, &window) ||
        parse_dtype(module, dt, "dt", &a->dt) < 0)
        return -1;
    kv = kv == 0 ? h : kv;
    a->batch = b, a->heads = h, a->seq = t, a->head_dim = d, a->kv_heads = kv, a->window = window;
    a->in = (gt_attn_strides){h * t * d, t * d, d};
    a->kv = (gt_attn_strides){kv * t * d, t * d, d};
    a->out_strides = a->in;
    a->dropout_key = (gt_dropout_key){seed, (uint32_t)layer, (uint32_t)step, offset};
    const int64_t dims[4] = {b, h, t, d}, kv_dims[4] = {b, kv, t, d};
    size_t operand = dims_bytes(dims, 4, gt_dtype_size(a->dt));
    size_t kv_operand = dims_bytes(kv_dims, 4, gt_dtype_size(a->dt));
    int lengths = backward ? 9 : 5;  /* the index of key_lengths; lse is array 4 */
    for (int k = 0; k < lengths; k++) {
        int is_kv = k == 1 || k == 2 || (backward && (k == 7 || k == 8));
        call->need[k] = k == 4 ? dims_bytes(dims, 3, sizeof(float)) : is_kv ? kv_operand : operand;
    }
    call->need[lengths] = dims_bytes(dims, 1, sizeof(int64_t));
    const int64_t starts[2] = {b, t};
    call->need[lengths + 1] = dims_bytes(starts, 2, sizeof(int64_t));
    return 0;
}

static int parse_attention_forward(PyObject *module, PyObject *args, op_call *call) {
    return parse_attention(module, args, call, 0);
}

static int parse_attention_backward(PyObject *module, PyObject *args, op_call *call) {
    return parse_attention(module, args, call, 1);
}

static gt_status run_attention(gt_backend *be, op_call *call, int backward) {
    gt_attention_args *a = &call->attn;
    if (!be->ops->attention_forward || !be->ops->attention_backward)
        return GT_FAIL(GT_ERR_RUNTIME, "backend: '%s' has no attention", be->ops->name);
    a->q = call->ptr[0], a->k = call->ptr[1], a->v = call->ptr[2], a->out = call->ptr[3], a->lse = call->ptr[4];
    if (!backward) {
        a->key_lengths = call->ptr[5];
        a->key_starts = call->ptr[6];
        return be->ops->attention_forward(be, a);
    }
    a->dout = call->ptr[5], a->dq = call->ptr[6], a->dk = call->ptr[7], a->dv = call->ptr[8];
    a->key_lengths = call->ptr[9];
    a->key_starts = call->ptr[10];
    return be->ops->attention_backward(be, a);
}

static gt_status run_attention_forward(gt_backend *be, op_call *call) { return run_attention(be, call, 0); }

static gt_status run_attention_backward(gt_backend *be, op_call *call) { return run_attention(be, call, 1); }

/* (batch, heads, seq, head_dim, rotary_dim, positions_rows, dt): arrays in, out (contiguous
 * (batch, heads, seq, head_dim) of dt), positions (positions_rows = 1 or batch, seq) int64,
 * inv_freq (rotary_dim / 2,) f32. */
static int parse_rope(PyObject *module, PyObject *args, op_call *call) {
    gt_rope_args *a = &call->rope;
    long long b, h, t, d, r, rows;
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLLLLLs:rope", &b, &h, &t, &d, &r, &rows, &dt) ||
        parse_dtype(module, dt, "dt", &a->dt) < 0)
        return -1;
    if (rows != 1 && rows != b) {
        PyErr_Format(PyExc_ValueError, "positions_rows must be 1 or batch (%lld), got %lld", b, rows);
        return -1;
    }
    a->batch = b, a->heads = h, a->seq = t, a->head_dim = d, a->rotary_dim = r;
    a->strides = (gt_attn_strides){h * t * d, t * d, d};
    a->positions_stride = rows == 1 ? 0 : t;
    a->attention_factor = 1.0f;
    const int64_t dims[4] = {b, h, t, d};
    call->need[0] = call->need[1] = dims_bytes(dims, 4, gt_dtype_size(a->dt));
    call->need[2] = bytes_of(rows, t, sizeof(int64_t));
    call->need[3] = bytes_of(r / 2, 1, sizeof(float));
    return 0;
}

static gt_status run_rope(gt_backend *be, op_call *call, int backward) {
    gt_rope_args *a = &call->rope;
    if (!be->ops->rope_forward || !be->ops->rope_backward)
        return GT_FAIL(GT_ERR_RUNTIME, "backend: '%s' has no rope", be->ops->name);
    a->in = call->ptr[0], a->out = call->ptr[1], a->positions = call->ptr[2], a->inv_freq = call->ptr[3];
    return backward ? be->ops->rope_backward(be, a) : be->ops->rope_forward(be, a);
}

static gt_status run_rope_forward(gt_backend *be, op_call *call) { return run_rope(be, call, 0); }

static gt_status run_rope_backward(gt_backend *be, op_call *call) { return run_rope(be, call, 1); }

/* (rows, inter, act, dt): forward arrays out (rows, inter), in (rows, 2 inter); backward arrays din
 * (rows, 2 inter), dout (rows, inter), in. */
static int parse_glu(PyObject *module, PyObject *args, op_call *call, int backward) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLis:glu", &call->size[0], &call->size[1], &call->flag, &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    size_t elem = gt_dtype_size(call->dt[0]);
    size_t half = bytes_of(call->size[0], call->size[1], elem);
    size_t full = half == SIZE_MAX ? SIZE_MAX : bytes_of(call->size[0], call->size[1], 2 * elem);
    call->need[0] = backward ? full : half;
    call->need[1] = backward ? half : full;
    call->need[2] = full;
    return 0;
}

static int parse_glu_forward(PyObject *module, PyObject *args, op_call *call) { return parse_glu(module, args, call, 0); }

static int parse_glu_backward(PyObject *module, PyObject *args, op_call *call) { return parse_glu(module, args, call, 1); }

static gt_status run_glu_forward(gt_backend *be, op_call *call) {
    return be->ops->glu_forward(be, call->ptr[0], call->ptr[1], call->size[0], call->size[1],
                                (gt_activation)call->flag, call->dt[0]);
}

static gt_status run_glu_backward(gt_backend *be, op_call *call) {
    return be->ops->glu_backward(be, call->ptr[0], call->ptr[1], call->ptr[2], call->size[0], call->size[1],
                                 (gt_activation)call->flag, call->dt[0]);
}

/* (batch, seq, channels, pad_token_id): arrays starts (batch, seq) or None, last (batch,) or None,
 * rows (batch, channels, seq) int64 = ids | ... | mask | positions (channels >= 3 with starts). */
static int parse_key_starts(PyObject *module, PyObject *args, op_call *call) {
    (void)module;
    long long pad;
    if (!PyArg_ParseTuple(args, "LLLL:key_starts", &call->size[0], &call->size[1], &call->size[2], &pad))
        return -1;
    call->flag = 0;
    call->real[0] = (double)pad;
    call->need[0] = bytes_of(call->size[0], call->size[1], sizeof(int64_t));
    call->need[1] = bytes_of(call->size[0], 1, sizeof(int64_t));
    size_t row = bytes_of(call->size[1], call->size[2], sizeof(int64_t));
    call->need[2] = row == SIZE_MAX ? SIZE_MAX : bytes_of(call->size[0], 1, row);
    return 0;
}

static gt_status run_key_starts(gt_backend *be, op_call *call) {
    int64_t seq = call->size[1], channels = call->size[2];
    const int64_t *rows = call->ptr[2];
    const int64_t *mask = channels >= 2 ? rows + (channels - 2) * seq : NULL;
    const int64_t *positions = channels >= 2 ? rows + (channels - 1) * seq : NULL;
    return be->ops->key_starts(be, call->ptr[0], call->ptr[1], rows, mask, positions, call->size[0], seq,
                               channels * seq, (int64_t)call->real[0]);
}

/* (batch, seq, dim, mode, dt): forward arrays out (batch, dim), in (batch, seq, dim), lengths
 * (batch,) int64 or None; backward din (batch, seq, dim), dout (batch, dim), lengths. */
static int parse_seq_pool(PyObject *module, PyObject *args, op_call *call, int backward) {
    const char *dt;
    if (!PyArg_ParseTuple(args, "LLLis:pool", &call->size[0], &call->size[1], &call->size[2], &call->flag, &dt) ||
        parse_dtype(module, dt, "dt", &call->dt[0]) < 0)
        return -1;
    size_t elem = gt_dtype_size(call->dt[0]);
    size_t pooled = bytes_of(call->size[0], call->size[2], elem);
    size_t row = bytes_of(call->size[1], call->size[2], elem);
    size_t full = row == SIZE_MAX ? SIZE_MAX : bytes_of(call->size[0], 1, row);
    call->need[0] = backward ? full : pooled;
    call->need[1] = backward ? pooled : full;
    call->need[2] = bytes_of(call->size[0], 1, sizeof(int64_t));
    return 0;
}

static int parse_pool_forward(PyObject *module, PyObject *args, op_call *call) {
    return parse_seq_pool(module, args, call, 0);
}

static int parse_pool_backward(PyObject *module, PyObject *args, op_call *call) {
    return parse_seq_pool(module, args, call, 1);
}

static gt_status run_pool_forward(gt_backend *be, op_call *call) {
    return be->ops->pool_forward(be, call->ptr[0], call->ptr[1], call->ptr[2], call->size[0], call->size[1],
                                 call->size[2], (gt_pool_mode)call->flag, call->dt[0]);
}

static gt_status run_pool_backward(gt_backend *be, op_call *call) {
    return be->ops->pool_backward(be, call->ptr[0], call->ptr[1], call->ptr[2], call->size[0], call->size[1],
                                  call->size[2], (gt_pool_mode)call->flag, call->dt[0]);
}

static const op_spec specs[] = {
    {"gemm", 3, {"a", "b", "c"}, 0, parse_gemm, run_gemm, 0},
    {"bias_add", 2, {"out", "bias"}, 0, parse_bias_add, run_bias_add, 0},
    {"bias_backward", 2, {"dbias", "dout"}, 0, parse_bias_backward, run_bias_backward, 0},
    {"activation_forward", 2, {"out", "in"}, 0, parse_activation, run_activation_forward, 0},
    {"activation_backward", 3, {"din", "dout", "in"}, 1u << 0, parse_activation, run_activation_backward, 0},
    {"dropout_forward", 2, {"out", "in"}, 0, parse_dropout, run_dropout_forward, 0},
    {"dropout_backward", 2, {"din", "dout"}, 1u << 0, parse_dropout, run_dropout_backward, 0},
    {"add", 3, {"out", "a", "b"}, 0, parse_add, run_add, 0},
    {"scale", 2, {"out", "in"}, 0, parse_scale, run_scale, 0},
    {"layernorm_forward", 6, {"out", "mean", "rstd", "in", "weight", "bias"}, 1u << 5, parse_layernorm_forward,
     run_layernorm_forward, 0},
    {"layernorm_backward", 8, {"din", "dweight", "dbias", "dout", "in", "weight", "mean", "rstd"}, 1u << 0 | 1u << 1 | 1u << 2,
     parse_layernorm_backward, run_layernorm_backward, 0},
    {"rmsnorm_forward", 4, {"out", "rstd", "in", "weight"}, 1u << 3, parse_rmsnorm_forward, run_rmsnorm_forward, 0},
    {"rmsnorm_backward", 6, {"din", "dweight", "dout", "in", "weight", "rstd"}, 1u << 0 | 1u << 1 | 1u << 4,
     parse_rmsnorm_backward, run_rmsnorm_backward, 0},
    {"embedding_forward", 3, {"out", "ids", "table"}, 0, parse_embedding_forward, run_embedding_forward, 0},
    {"embedding_backward", 3, {"dtable", "dout", "ids"}, 0, parse_embedding_backward, run_embedding_backward, 0},
    {"softmax_xent", 4, {"losses", "dlogits", "logits", "targets"}, 1u << 1, parse_softmax_xent, run_softmax_xent,
     'c'},
    {"softmax_xent_rdrop", 4, {"losses", "dlogits", "logits", "targets"}, 1u << 1, parse_softmax_xent_rdrop,
     run_softmax_xent_rdrop, 'c'},
    {"mse", 3, {"dpred", "pred", "target"}, 1u << 0, parse_mse, run_mse, 'l'},
    {"sum_squares", 1, {"x"}, 0, parse_sum_squares, run_sum_squares, 's'},
    {"cast", 2, {"dst", "src"}, 0, parse_cast, run_cast, 0},
    {"copy", 2, {"dst", "src"}, 0, parse_bytes, run_copy, 0},
    {"zero", 1, {"dst"}, 0, parse_bytes, run_zero, 0},
    {"attention_forward", 7, {"q", "k", "v", "out", "lse", "key_lengths", "key_starts"}, 3u << 5,
     parse_attention_forward, run_attention_forward, 0},
    {"attention_backward", 11, {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "key_lengths",
     "key_starts"}, 3u << 9, parse_attention_backward, run_attention_backward, 0},
    {"rope_forward", 4, {"in", "out", "positions", "inv_freq"}, 0, parse_rope, run_rope_forward, 0},
    {"rope_backward", 4, {"in", "out", "positions", "inv_freq"}, 0, parse_rope, run_rope_backward, 0},
    {"glu_forward", 2, {"out", "in"}, 0, parse_glu_forward, run_glu_forward, 0},
    {"glu_backward", 3, {"din", "dout", "in"}, 1u << 0, parse_glu_backward, run_glu_backward, 0},
    {"key_starts", 3, {"starts", "last", "rows"}, 1u << 0 | 1u << 1, parse_key_starts, run_key_starts, 0},
    {"pool_forward", 3, {"out", "in", "lengths"}, 1u << 2, parse_pool_forward, run_pool_forward, 0},
    {"pool_backward", 3, {"din", "dout", "lengths"}, 1u << 2, parse_pool_backward, run_pool_backward, 0},
};

/* ------------------------------------------------------------ running ---------------------- */

/* The arrays of a call, checked against the op's needs; borrowed from the `arrays` sequence. */
static int collect_arrays(const op_spec *spec, PyObject *seq, const op_call *call, PyArrayObject **out) {
    if (PySequence_Fast_GET_SIZE(seq) != spec->num_arrays) {
        PyErr_Format(PyExc_ValueError, "arrays: %s takes %d arrays, got %zd", spec->name, spec->num_arrays,
                     PySequence_Fast_GET_SIZE(seq));
        return -1;
    }
    for (int k = 0; k < spec->num_arrays; k++) {
        PyObject *obj = PySequence_Fast_GET_ITEM(seq, k);
        const char *name = spec->arrays[k];
        out[k] = NULL;
        if (obj == Py_None && (spec->optional >> k & 1u))
            continue;
        if (!PyArray_Check(obj)) {
            PyErr_Format(PyExc_TypeError, "arrays[%d] (%s) must be a numpy.ndarray, not %.100s", k, name,
                         Py_TYPE(obj)->tp_name);
            return -1;
        }
        PyArrayObject *array = (PyArrayObject *)obj;
        if (!PyArray_IS_C_CONTIGUOUS(array) || !PyArray_ISALIGNED(array) || !PyArray_ISWRITEABLE(array)) {
            PyErr_Format(PyExc_ValueError, "arrays[%d] (%s) must be C-contiguous, aligned and writeable", k, name);
            return -1;
        }
        if ((size_t)PyArray_NBYTES(array) < call->need[k]) {
            PyErr_Format(PyExc_ValueError, "arrays[%d] (%s): these arguments need %zu bytes, it has %zd", k, name,
                         call->need[k], (Py_ssize_t)PyArray_NBYTES(array));
            return -1;
        }
        out[k] = array;
    }
    return 0;
}

/* The GEMM or attention workspace the table asks for (0 for other ops or arguments the op will
 * refuse). */
static size_t workspace_bytes(const gt_ops *ops, const op_spec *spec, const op_call *call) {
    const gt_gemm_args *g = &call->gemm;
    if (strncmp(spec->name, "attention_", 10) == 0) {
        size_t bytes = ops->attention_workspace_bytes ? ops->attention_workspace_bytes(&call->attn,
                                                                                         gt_get_num_threads()) : 0;
        return bytes == SIZE_MAX ? 0 : bytes;
    }
    if (strcmp(spec->name, "gemm") != 0 || g->m < 0 || g->n < 0 || g->k < 0 || g->m > INT_MAX || g->n > INT_MAX ||
        g->k > INT_MAX || gt_dtype_size(g->a_dt) == 0 || gt_dtype_size(g->b_dt) == 0 || gt_dtype_size(g->c_dt) == 0)
        return 0;
    return ops->gemm_workspace_bytes(g);
}

static gt_status run_cpu(const op_spec *spec, op_call *call, PyArrayObject **arrays) {
    const gt_ops *ops = gt_cpu_ops();
    gt_block workspace = {0};
    size_t bytes = workspace_bytes(ops, spec, call);
    if (bytes > 0)
        GT_TRY(gt_block_alloc(gt_cpu_device(), bytes, &workspace));
    gt_backend be = {ops, gt_cpu_device(), workspace.ptr, bytes, NULL};
    call->result = spec->result == 'c' ? (void *)&call->count : (void *)&call->loss;
    call->scale_at = &call->dloss_scale;
    for (int k = 0; k < spec->num_arrays; k++)
        call->ptr[k] = arrays[k] ? PyArray_DATA(arrays[k]) : NULL;
    gt_status status = spec->run(&be, call);
    gt_block_free(&workspace);
    return status;
}

/* Device copies of the arrays (each at its host address's offset modulo DEVICE_ALIGN). */
typedef struct device_copies {
    gt_block blocks[MAX_ARRAYS];  /* one device block per array (empty for None) */
    gt_block workspace;           /* the GEMM workspace, or empty */
    gt_block result;              /* softmax_xent's count or mse's loss, then their dloss_scale */
} device_copies;

static void free_copies(device_copies *copies) {
    for (int k = 0; k < MAX_ARRAYS; k++)
        gt_block_free(&copies->blocks[k]);
    gt_block_free(&copies->workspace);
    gt_block_free(&copies->result);
}

static gt_status copy_in(const gt_device_backend *dev, gt_backend *be, const op_spec *spec, op_call *call,
                         PyArrayObject **arrays, device_copies *copies) {
    for (int k = 0; k < spec->num_arrays; k++) {
        call->ptr[k] = NULL;
        if (!arrays[k])
            continue;
        size_t bytes = (size_t)PyArray_NBYTES(arrays[k]);
        size_t offset = (uintptr_t)PyArray_DATA(arrays[k]) % DEVICE_ALIGN;
        GT_TRY(gt_block_alloc(be->device, offset + bytes + 1, &copies->blocks[k]));
        call->ptr[k] = (char *)copies->blocks[k].ptr + offset;
        GT_TRY(dev->memcpy(be->device.index, call->ptr[k], PyArray_DATA(arrays[k]), bytes));
    }
    return GT_OK;
}

static gt_status copy_out(const gt_device_backend *dev, gt_backend *be, const op_spec *spec, const op_call *call,
                          PyArrayObject **arrays) {
    for (int k = 0; k < spec->num_arrays; k++) {
        if (!arrays[k])
            continue;
        size_t bytes = (size_t)PyArray_NBYTES(arrays[k]);
        GT_TRY(dev->memcpy(be->device.index, PyArray_DATA(arrays[k]), call->ptr[k], bytes));
    }
    return GT_OK;
}

/* The op on the backend's stream (the default one), between blocking copies in its order. */
static gt_status run_device_on(const gt_device_backend *dev, gt_backend *be, const op_spec *spec, op_call *call,
                               PyArrayObject **arrays, device_copies *copies) {
    size_t bytes = workspace_bytes(be->ops, spec, call);
    if (bytes > 0) {
        GT_TRY(gt_block_alloc(be->device, bytes, &copies->workspace));
        be->workspace = copies->workspace.ptr;
        be->workspace_bytes = bytes;
    }
    GT_TRY(copy_in(dev, be, spec, call, arrays, copies));
    GT_TRY(gt_block_alloc(be->device, 2 * sizeof(int64_t), &copies->result));
    call->result = copies->result.ptr;
    call->scale_at = (const float *)((char *)copies->result.ptr + sizeof(int64_t));
    GT_TRY(dev->memcpy(be->device.index, (void *)call->scale_at, &call->dloss_scale, sizeof call->dloss_scale));
    GT_TRY(spec->run(be, call));
    GT_TRY(dev->stream_synchronize(be->device.index, NULL));
    if (spec->result == 'c' || spec->result == 'l')
        GT_TRY(dev->memcpy(be->device.index, spec->result == 'c' ? (void *)&call->count : (void *)&call->loss,
                           copies->result.ptr, spec->result == 'c' ? sizeof call->count : sizeof call->loss));
    return copy_out(dev, be, spec, call, arrays);
}

static gt_status run_device(const op_spec *spec, op_call *call, PyArrayObject **arrays, gt_device device) {
    const gt_device_backend *dev = NULL;
    GT_TRY(gt_device_backend_get(device, "backend", &dev));
    gt_backend be;
    GT_TRY(dev->backend_init(&be, device.index, NULL));
    device_copies copies;
    memset(&copies, 0, sizeof copies);
    gt_status status = run_device_on(dev, &be, spec, call, arrays, &copies);
    dev->backend_release(&be);
    free_copies(&copies);
    return status;
}

static const op_spec *find_spec(const char *name) {
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        if (strcmp(specs[i].name, name) == 0)
            return &specs[i];
    return NULL;
}

static PyObject *call_result(const op_spec *spec, const op_call *call) {
    switch (spec->result) {
    case 'c': return PyLong_FromLongLong(call->count);
    case 'l': return PyFloat_FromDouble(call->loss);
    case 's': return PyFloat_FromDouble(call->sum);
    default: return Py_NewRef(Py_None);
    }
}

/* Runs the parsed call on the CPU, or on `device` (an accelerator), without the GIL. */
static PyObject *dispatch(PyObject *module, const op_spec *spec, op_call *call, PyArrayObject **arrays,
                          gt_device device) {
    gt_status status = GT_OK;
    Py_BEGIN_ALLOW_THREADS
    status = gt_device_is_accelerator(device) ? run_device(spec, call, arrays, device) : run_cpu(spec, call, arrays);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? call_result(spec, call) : gtpy_raise(module, status);
}

static PyObject *run_op(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"backend", "op", "arrays", "args", "device", NULL};
    const char *backend, *name;
    PyObject *arrays_obj, *op_args;
    int device_index = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ssOO!|i:run_op", keywords, &backend, &name, &arrays_obj,
                                     &PyTuple_Type, &op_args, &device_index))
        return NULL;
    gt_device device = gt_cpu_device();
    if (strcmp(backend, "cuda") == 0 || strcmp(backend, "sim") == 0) {
        char name[32];  /* "cuda:N" or "sim:N", parsed by the one device parser */
        if (device_index < 0)
            return PyErr_Format(PyExc_ValueError, "device must be >= 0, got %d", device_index);
        snprintf(name, sizeof name, "%s:%d", backend, device_index);
        gt_status status = gt_device_parse(name, "device", &device);
        if (status != GT_OK)
            return gtpy_raise(module, status);
    } else if (strcmp(backend, "cpu") != 0) {
        return PyErr_Format(PyExc_ValueError, "backend must be 'cpu', 'cuda' or 'sim', got '%s'", backend);
    }
    const op_spec *spec = find_spec(name);
    if (!spec)
        return PyErr_Format(PyExc_ValueError, "op: unknown op '%s'", name);
    op_call call;
    memset(&call, 0, sizeof call);
    if (spec->parse(module, op_args, &call) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(arrays_obj, "arrays must be a sequence of numpy arrays");
    if (!seq)
        return NULL;
    PyArrayObject *arrays[MAX_ARRAYS];
    PyObject *result = NULL;
    if (collect_arrays(spec, seq, &call, arrays) == 0)
        result = dispatch(module, spec, &call, arrays, device);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef cuda_ops_methods[] = {
    {"run_op", (PyCFunction)(void (*)(void))run_op, METH_VARARGS | METH_KEYWORDS,
     "run_op(backend, op, arrays, args, device=0)\n--\n\n"
     "Runs one op of the 'cpu', 'cuda' or 'sim' op table on NumPy arrays (copied to the device and back "
     "for 'cuda' and 'sim'); returns softmax_xent's count, mse's loss, sum_squares's sum, else None."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_run_op(PyObject *module) { return PyModule_AddFunctions(module, cuda_ops_methods); }
