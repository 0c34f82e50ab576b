/* Bindings of the CPU op table (csrc/ops/ops.h) behind gputrain.functional: `_C.op_<name>`.
 * Outputs are allocated by the caller and passed in; every array is checked (ops_args.h), the
 * op's sizes are derived from the shapes after checking that they agree, and the op runs with
 * the GIL released (ops_args.h: what the bindings share). Half activations are float16 arrays
 * (f16) or uint16 arrays of bf16 bits. */
#include "py/gtpy.h"

#include "core/alloc.h"
#include "core/threads.h"
#include "ops/checks.h"
#include "ops/ops.h"
#include "ops/rope.h"
#include "py/ops_args.h"

/* One GEMM operand: the (rows, cols) of each matrix and the stride between batches. */
typedef struct gemm_operand {
    PyArrayObject *array;  /* (rows, cols) or (batch, rows, cols) */
    int64_t batch;         /* leading extent of a 3-D array, 1 for 2-D */
    int64_t rows, cols;    /* extents of one matrix */
    int64_t stride;        /* elements between matrices; 0 for a 2-D operand of a batch */
} gemm_operand;

static int gemm_operand_of(PyObject *obj, const char *name, gt_dtype dt, int writable,
                           gemm_operand *out) {
    out->array = gtpy_as_array(obj, name, gtpy_typenum_of(dt), writable);
    if (!out->array)
        return -1;
    int ndim = PyArray_NDIM(out->array);
    if (ndim != 2 && ndim != 3)
        return gtpy_fail_shape(out->array, name, "must be 2-D or 3-D (batch, rows, cols)");
    out->batch = ndim == 3 ? (int64_t)PyArray_DIM(out->array, 0) : 1;
    out->rows = (int64_t)PyArray_DIM(out->array, ndim - 2);
    out->cols = (int64_t)PyArray_DIM(out->array, ndim - 1);
    out->stride = ndim == 3 ? out->rows * out->cols : 0;
    return 0;
}

/* Fills the sizes of C = op(A) op(B) from the operands' shapes, checking that they agree. */
static int gemm_sizes(const gemm_operand *a, const gemm_operand *b, const gemm_operand *c,
                      gt_gemm_args *g) {
    g->m = g->trans_a ? a->cols : a->rows;
    g->k = g->trans_a ? a->rows : a->cols;
    int64_t kb = g->trans_b ? b->cols : b->rows;
    g->n = g->trans_b ? b->rows : b->cols;
    if (kb != g->k)
        return gtpy_fail_shape(b->array, "b", "inner dimension does not match a's");
    if (c->rows != g->m || c->cols != g->n)
        return gtpy_fail_shape(c->array, "c", "must be (m, n) = (rows of op(a), cols of op(b))");
    g->batch = c->batch;
    if ((PyArray_NDIM(a->array) == 3 && a->batch != g->batch) ||
        (PyArray_NDIM(b->array) == 3 && b->batch != g->batch))
        return gtpy_fail_shape(c->array, "c", "batch does not match a's or b's");
    g->lda = a->cols > 1 ? a->cols : 1;
    g->ldb = b->cols > 1 ? b->cols : 1;
    g->ldc = c->cols > 1 ? c->cols : 1;
    g->stride_a = a->stride, g->stride_b = b->stride, g->stride_c = c->stride;
    return 0;
}

static gt_status gemm_op(gt_backend *be, const void *g) { return be->ops->gemm(be, g); }

static PyObject *op_gemm(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"a", "b", "c", "a_dt", "b_dt", "c_dt", "trans_a", "trans_b",
                               "alpha", "beta", NULL};
    PyObject *a_obj, *b_obj, *c_obj;
    const char *a_text, *b_text, *c_text;
    int trans_a, trans_b;
    float alpha, beta;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOsssppff:op_gemm", keywords, &a_obj, &b_obj,
                                     &c_obj, &a_text, &b_text, &c_text, &trans_a, &trans_b, &alpha,
                                     &beta))
        return NULL;
    gt_gemm_args g = {.trans_a = trans_a, .trans_b = trans_b, .alpha = alpha, .beta = beta};
    gemm_operand a, b, c;
    if (gtpy_parse_act_dtype(module, a_text, "a_dt", &g.a_dt) < 0 ||
        gtpy_parse_act_dtype(module, b_text, "b_dt", &g.b_dt) < 0 ||
        gtpy_parse_act_dtype(module, c_text, "c_dt", &g.c_dt) < 0 ||
        gemm_operand_of(a_obj, "a", g.a_dt, 0, &a) < 0 ||
        gemm_operand_of(b_obj, "b", g.b_dt, 0, &b) < 0 ||
        gemm_operand_of(c_obj, "c", g.c_dt, 1, &c) < 0 || gemm_sizes(&a, &b, &c, &g) < 0)
        return NULL;
    g.a = PyArray_DATA(a.array), g.b = PyArray_DATA(b.array), g.c = PyArray_DATA(c.array);
    return gtpy_run_with_workspace(module, gemm_op, &g, gt_cpu_ops()->gemm_workspace_bytes(&g));
}

/* bias_add (backward = 0) or bias_backward (backward = 1). */
static PyObject *op_bias(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"x", "bias", "dt", "backward", "accumulate", NULL};
    PyObject *x_obj, *bias_obj;
    const char *text;
    int backward = 0, accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOs|pp:op_bias", keywords, &x_obj, &bias_obj,
                                     &text, &backward, &accumulate))
        return NULL;
    gt_dtype dt;
    int64_t rows, cols;
    const char *x_name = backward ? "dout" : "out";
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *x = typenum < 0 ? NULL : gtpy_as_array(x_obj, x_name, typenum, !backward), *bias;
    if (!x || gtpy_rows_cols(x, x_name, &rows, &cols) < 0 ||
        !(bias = gtpy_vector(bias_obj, backward ? "dbias" : "bias", NPY_FLOAT32, cols, backward)))
        return NULL;
    gt_backend be = gtpy_cpu_backend();
    if (backward)
        GTPY_RUN_OP(module, be.ops->bias_backward(&be, PyArray_DATA(bias), PyArray_DATA(x), rows,
                                                  cols, dt, accumulate));
    else
        GTPY_RUN_OP(module, be.ops->bias_add(&be, PyArray_DATA(x), PyArray_DATA(bias), rows, cols, dt));
    Py_RETURN_NONE;
}

/* activation_forward (dout None) or activation_backward. */
static PyObject *op_activation(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "x", "act", "dt", "dout", NULL};
    PyObject *out_obj, *x_obj, *dout_obj = Py_None;
    int act;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOis|O:op_activation", keywords, &out_obj,
                                     &x_obj, &act, &text, &dout_obj))
        return NULL;
    gt_dtype dt;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *x = typenum < 0 ? NULL : gtpy_as_array(x_obj, "x", typenum, 0), *out;
    void *dout;
    if (!x || !(out = gtpy_array_like(out_obj, "out", typenum, 1, x, "x")) ||
        gtpy_optional_like(dout_obj, "dout", typenum, 0, x, "x", &dout) < 0)
        return NULL;
    gt_backend be = gtpy_cpu_backend();
    int64_t n = (int64_t)PyArray_SIZE(x);
    if (dout)
        GTPY_RUN_OP(module, be.ops->activation_backward(&be, PyArray_DATA(out), dout, PyArray_DATA(x),
                                                        n, (gt_activation)act, dt));
    else
        GTPY_RUN_OP(module, be.ops->activation_forward(&be, PyArray_DATA(out), PyArray_DATA(x), n,
                                                       (gt_activation)act, dt));
    Py_RETURN_NONE;
}

/* dropout_forward (backward = 0) or dropout_backward: out = x * mask * gt_dropout_scale(p). */
static PyObject *op_dropout(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "x", "p", "seed", "layer", "step", "offset", "dt",
                               "backward", NULL};
    PyObject *out_obj, *x_obj, *seed_obj, *layer_obj, *step_obj, *offset_obj;
    double p;
    const char *text;
    int backward = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOdOOOOs|p:op_dropout", keywords, &out_obj,
                                     &x_obj, &p, &seed_obj, &layer_obj, &step_obj, &offset_obj,
                                     &text, &backward))
        return NULL;
    gt_dtype dt;
    gt_dropout_key key;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    if (typenum < 0 || gtpy_parse_dropout_key(seed_obj, layer_obj, step_obj, offset_obj, &key) < 0)
        return NULL;
    const char *x_name = backward ? "dout" : "x";
    PyArrayObject *x = gtpy_as_array(x_obj, x_name, typenum, 0);
    PyArrayObject *out = x ? gtpy_array_like(out_obj, backward ? "din" : "out", typenum, 1, x, x_name) : NULL;
    if (!out)
        return NULL;
    gt_backend be = gtpy_cpu_backend();
    int64_t n = (int64_t)PyArray_SIZE(x);
    if (backward)
        GTPY_RUN_OP(module, be.ops->dropout_backward(&be, PyArray_DATA(out), PyArray_DATA(x), n, p, key, dt));
    else
        GTPY_RUN_OP(module, be.ops->dropout_forward(&be, PyArray_DATA(out), PyArray_DATA(x), n, p, key, dt));
    Py_RETURN_NONE;
}

static PyObject *op_add(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "a", "b", "dt", NULL};
    PyObject *out_obj, *a_obj, *b_obj;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOs:op_add", keywords, &out_obj, &a_obj,
                                     &b_obj, &text))
        return NULL;
    gt_dtype dt;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *out = typenum < 0 ? NULL : gtpy_as_array(out_obj, "out", typenum, 1), *a, *b;
    if (!out || !(a = gtpy_array_like(a_obj, "a", typenum, 0, out, "out")) ||
        !(b = gtpy_array_like(b_obj, "b", typenum, 0, out, "out")))
        return NULL;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->add(&be, PyArray_DATA(out), PyArray_DATA(a), PyArray_DATA(b),
                               (int64_t)PyArray_SIZE(out), dt));
    Py_RETURN_NONE;
}

static PyObject *op_layernorm_forward(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "mean", "rstd", "x", "weight", "bias", "eps", "dt", NULL};
    PyObject *out_obj, *mean_obj, *rstd_obj, *x_obj, *weight_obj, *bias_obj;
    float eps;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOfs:op_layernorm_forward", keywords,
                                     &out_obj, &mean_obj, &rstd_obj, &x_obj, &weight_obj,
                                     &bias_obj, &eps, &text))
        return NULL;
    gt_dtype dt;
    int64_t rows, cols;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *x = typenum < 0 ? NULL : gtpy_as_array(x_obj, "x", typenum, 0), *out, *mean,
                  *rstd, *weight, *bias;
    if (!x || gtpy_rows_cols(x, "x", &rows, &cols) < 0 ||
        !(out = gtpy_array_like(out_obj, "out", typenum, 1, x, "x")) ||
        !(mean = gtpy_vector(mean_obj, "mean", NPY_FLOAT32, rows, 1)) ||
        !(rstd = gtpy_vector(rstd_obj, "rstd", NPY_FLOAT32, rows, 1)) ||
        !(weight = gtpy_vector(weight_obj, "weight", NPY_FLOAT32, cols, 0)) ||
        !(bias = gtpy_vector(bias_obj, "bias", NPY_FLOAT32, cols, 0)))
        return NULL;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->layernorm_forward(&be, PyArray_DATA(out), PyArray_DATA(mean),
                                                  PyArray_DATA(rstd), PyArray_DATA(x),
                                                  PyArray_DATA(weight), PyArray_DATA(bias), rows,
                                                  cols, eps, dt));
    Py_RETURN_NONE;
}

static PyObject *op_layernorm_backward(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"din", "dweight", "dbias", "dout", "x", "weight", "mean", "rstd",
                               "dt", "accumulate", NULL};
    PyObject *din_obj, *dweight_obj, *dbias_obj, *dout_obj, *x_obj, *weight_obj, *mean_obj,
        *rstd_obj;
    const char *text;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOs|p:op_layernorm_backward", keywords,
                                     &din_obj, &dweight_obj, &dbias_obj, &dout_obj, &x_obj,
                                     &weight_obj, &mean_obj, &rstd_obj, &text, &accumulate))
        return NULL;
    gt_dtype dt;
    int64_t rows, cols;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *x = typenum < 0 ? NULL : gtpy_as_array(x_obj, "x", typenum, 0), *dout, *dweight,
                  *dbias, *weight, *mean, *rstd;
    void *din;
    if (!x || gtpy_rows_cols(x, "x", &rows, &cols) < 0 ||
        gtpy_optional_like(din_obj, "din", typenum, 1, x, "x", &din) < 0 ||
        !(dout = gtpy_array_like(dout_obj, "dout", typenum, 0, x, "x")) ||
        !(dweight = gtpy_vector(dweight_obj, "dweight", NPY_FLOAT32, cols, 1)) ||
        !(dbias = gtpy_vector(dbias_obj, "dbias", NPY_FLOAT32, cols, 1)) ||
        !(weight = gtpy_vector(weight_obj, "weight", NPY_FLOAT32, cols, 0)) ||
        !(mean = gtpy_vector(mean_obj, "mean", NPY_FLOAT32, rows, 0)) ||
        !(rstd = gtpy_vector(rstd_obj, "rstd", NPY_FLOAT32, rows, 0)))
        return NULL;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->layernorm_backward(&be, din, PyArray_DATA(dweight), PyArray_DATA(dbias),
                                                   PyArray_DATA(dout), PyArray_DATA(x),
                                                   PyArray_DATA(weight), PyArray_DATA(mean),
                                                   PyArray_DATA(rstd), rows, cols, dt, accumulate));
    Py_RETURN_NONE;
}

/* embedding_forward (backward = 0: x is out) or embedding_backward (x is dout): x has the
 * shape of ids plus (dim,), table is (num, dim). */
static PyObject *op_embedding(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"x", "ids", "table", "dt", "backward", "accumulate", NULL};
    PyObject *x_obj, *ids_obj, *table_obj;
    const char *text;
    int backward = 0, accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOs|pp:op_embedding", keywords, &x_obj,
                                     &ids_obj, &table_obj, &text, &backward, &accumulate))
        return NULL;
    gt_dtype dt;
    const char *x_name = backward ? "dout" : "out", *table_name = backward ? "dtable" : "table";
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *x = typenum < 0 ? NULL : gtpy_as_array(x_obj, x_name, typenum, !backward), *ids,
                  *table;
    if (!x || !(ids = gtpy_as_array(ids_obj, "ids", NPY_INT64, 0)) ||
        !(table = gtpy_array_nd(table_obj, table_name, NPY_FLOAT32, backward, 2, NULL,
                                "must be 2-D (num, dim)")))
        return NULL;
    int64_t num = (int64_t)PyArray_DIM(table, 0), dim = (int64_t)PyArray_DIM(table, 1);
    int64_t n = (int64_t)PyArray_SIZE(ids);
    if (PyArray_NDIM(x) != PyArray_NDIM(ids) + 1 || (int64_t)PyArray_DIM(x, PyArray_NDIM(ids)) != dim ||
        !PyArray_CompareLists(PyArray_DIMS(x), PyArray_DIMS(ids), PyArray_NDIM(ids))) {
        gtpy_fail_shape(x, x_name, "must have the shape of ids plus (dim,)");
        return NULL;
    }
    gt_backend be = gtpy_cpu_backend();
    if (backward)
        GTPY_RUN_OP(module, be.ops->embedding_backward(&be, PyArray_DATA(table), PyArray_DATA(x),
                                                       PyArray_DATA(ids), n, num, dim, dt, accumulate));
    else
        GTPY_RUN_OP(module, be.ops->embedding_forward(&be, PyArray_DATA(x), PyArray_DATA(ids),
                                                      PyArray_DATA(table), GT_F32, n, num, dim, dt));
    Py_RETURN_NONE;
}

/* Returns the count of rows not ignored. */
static PyObject *op_softmax_xent(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"losses", "dlogits", "logits", "targets", "label_smoothing",
                               "ignore_index", "dloss_scale", "dt", NULL};
    PyObject *losses_obj, *dlogits_obj, *logits_obj, *targets_obj;
    float label_smoothing, dloss_scale;
    long long ignore_index;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOfLfs:op_softmax_xent", keywords,
                                     &losses_obj, &dlogits_obj, &logits_obj, &targets_obj,
                                     &label_smoothing, &ignore_index, &dloss_scale, &text))
        return NULL;
    gt_dtype dt;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *logits = typenum < 0 ? NULL : gtpy_array_nd(logits_obj, "logits", typenum, 0, 2,
                                                               NULL, "must be 2-D (rows, classes)");
    if (!logits)
        return NULL;
    int64_t rows = (int64_t)PyArray_DIM(logits, 0), classes = (int64_t)PyArray_DIM(logits, 1);
    PyArrayObject *targets, *losses;
    void *dlogits;
    if (!(targets = gtpy_vector(targets_obj, "targets", NPY_INT64, rows, 0)) ||
        !(losses = gtpy_vector(losses_obj, "losses", NPY_FLOAT32, rows, 1)) ||
        gtpy_optional_like(dlogits_obj, "dlogits", typenum, 1, logits, "logits", &dlogits) < 0)
        return NULL;
    int64_t count = 0;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->softmax_xent(&be, PyArray_DATA(losses), &count, dlogits,
                                             PyArray_DATA(logits), PyArray_DATA(targets), rows,
                                             classes, label_smoothing, (int64_t)ignore_index,
                                             &dloss_scale, 1.0f, dt));
    return PyLong_FromLongLong((long long)count);
}

/* Returns the mean squared error; fills dpred unless it is None. */
static PyObject *op_mse(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dpred", "pred", "target", "dloss_scale", "dt", NULL};
    PyObject *dpred_obj, *pred_obj, *target_obj;
    float dloss_scale;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOfs:op_mse", keywords, &dpred_obj,
                                     &pred_obj, &target_obj, &dloss_scale, &text))
        return NULL;
    gt_dtype dt;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *pred = typenum < 0 ? NULL : gtpy_as_array(pred_obj, "pred", typenum, 0), *target;
    void *dpred;
    if (!pred || !(target = gtpy_array_like(target_obj, "target", NPY_FLOAT32, 0, pred, "pred")) ||
        gtpy_optional_like(dpred_obj, "dpred", typenum, 1, pred, "pred", &dpred) < 0)
        return NULL;
    float loss = 0.0f;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->mse(&be, &loss, dpred, PyArray_DATA(pred), PyArray_DATA(target),
                                    (int64_t)PyArray_SIZE(pred), &dloss_scale, 1.0f, dt));
    return PyFloat_FromDouble((double)loss);
}

static PyObject *op_sum_squares(PyObject *module, PyObject *arg) {
    PyArrayObject *x = gtpy_as_array(arg, "x", NPY_FLOAT32, 0);
    if (!x)
        return NULL;
    double sum = 0.0;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->sum_squares(&be, &sum, PyArray_DATA(x), (int64_t)PyArray_SIZE(x)));
    return PyFloat_FromDouble(sum);
}

static PyObject *op_cast(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dst", "dst_dt", "src", "src_dt", NULL};
    PyObject *dst_obj, *src_obj;
    const char *dst_text, *src_text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OsOs:op_cast", keywords, &dst_obj, &dst_text,
                                     &src_obj, &src_text))
        return NULL;
    gt_dtype dst_dt, src_dt;
    int dst_type = gtpy_parse_act_dtype(module, dst_text, "dst_dt", &dst_dt), src_type;
    if (dst_type < 0 || (src_type = gtpy_parse_act_dtype(module, src_text, "src_dt", &src_dt)) < 0)
        return NULL;
    PyArrayObject *src = gtpy_as_array(src_obj, "src", src_type, 0), *dst;
    if (!src || !(dst = gtpy_array_like(dst_obj, "dst", dst_type, 1, src, "src")))
        return NULL;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->cast(&be, PyArray_DATA(dst), dst_dt, PyArray_DATA(src), src_dt,
                                     (int64_t)PyArray_SIZE(src)));
    Py_RETURN_NONE;
}

/* A 4-D (batch, heads, seq, head_dim) attention operand of the shape of `like` (NULL: any),
 * named like_name in errors. */
static PyArrayObject *attention_operand_like(PyObject *obj, const char *name, int typenum, int writable,
                                             PyArrayObject *like, const char *like_name) {
    PyArrayObject *a = gtpy_array_nd(obj, name, typenum, writable, 4, NULL,
                                     "must be 4-D (batch, heads, seq, head_dim)");
    return a && (!like || gtpy_same_shape(a, name, like, like_name) == 0) ? a : NULL;
}

/* The same with q's shape. */
static PyArrayObject *attention_operand(PyObject *obj, const char *name, int typenum, int writable,
                                        PyArrayObject *like) {
    return attention_operand_like(obj, name, typenum, writable, like, "q");
}

static gt_status attention_forward_op(gt_backend *be, const void *a) {
    return be->ops->attention_forward(be, a);
}

static gt_status attention_backward_op(gt_backend *be, const void *a) {
    return be->ops->attention_backward(be, a);
}

/* Runs the attention op of `a` (forward, or backward when `backward`) with a workspace of its own. */
static PyObject *run_attention(PyObject *module, gt_attention_args *a, int backward) {
    size_t bytes = gt_cpu_ops()->attention_workspace_bytes(a, gt_get_num_threads());
    if (bytes == SIZE_MAX)
        return PyErr_Format(PyExc_MemoryError, "q: attention of this size needs more scratch "
                            "memory than can be addressed");
    return gtpy_run_with_workspace(module, backward ? attention_backward_op : attention_forward_op,
                                   a, bytes);
}

/* The dropout key and key lengths of an attention call; -1 with an exception. */
static int attention_options(PyObject *lengths_obj, PyObject *seed_obj, PyObject *layer_obj,
                             PyObject *step_obj, PyObject *offset_obj, gt_attention_args *a) {
    if (gtpy_parse_dropout_key(seed_obj, layer_obj, step_obj, offset_obj, &a->dropout_key) < 0)
        return -1;
    if (lengths_obj == Py_None)
        return 0;
    PyArrayObject *lengths = gtpy_vector(lengths_obj, "key_lengths", NPY_INT64, a->batch, 0);
    if (!lengths)
        return -1;
    a->key_lengths = PyArray_DATA(lengths);
    return 0;
}

/* A 4-D (batch, kv_heads, seq, head_dim) k/v operand: q's batch, seq and head_dim, kv_heads
 * dividing q's heads, and the shape of `like` when given (dk, dv: k's). */
static PyArrayObject *attention_kv_operand(PyObject *obj, const char *name, int typenum, int writable,
                                           PyArrayObject *q, PyArrayObject *like) {
    PyArrayObject *a = attention_operand_like(obj, name, typenum, writable, like, "k");
    if (!a || like)
        return a;
    npy_intp kv = PyArray_DIM(a, 1), heads = PyArray_DIM(q, 1);
    if (PyArray_DIM(a, 0) != PyArray_DIM(q, 0) || PyArray_DIM(a, 2) != PyArray_DIM(q, 2) ||
        PyArray_DIM(a, 3) != PyArray_DIM(q, 3) || kv < 1 || heads % kv != 0) {
        gtpy_fail_shape(a, name, "must have q's batch, seq and head_dim, and kv_heads dividing q's "
                        "heads (grouped-query attention)");
        return NULL;
    }
    return a;
}

/* key_starts: (batch, seq) int64, C-contiguous, or None (NULL). -1 with an exception. */
static int attention_key_starts(PyObject *obj, gt_attention_args *a) {
    if (obj == Py_None)
        return 0;
    const int64_t dims[2] = {a->batch, a->seq};
    PyArrayObject *starts = gtpy_array_nd(obj, "key_starts", NPY_INT64, 0, 2, dims,
                                          "must be (batch, seq) int64");
    if (!starts)
        return -1;
    a->key_starts = PyArray_DATA(starts);
    return 0;
}

/* attention_forward (dout None: writes out and lse) or attention_backward (reads out, lse and
 * dout; writes dq, dk, dv). q, out, dout, dq are C-contiguous (batch, heads, seq, head_dim); k, v,
 * dk, dv (batch, kv_heads, seq, head_dim) with kv_heads dividing heads. */
static PyObject *op_attention(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "lse", "q", "k", "v", "dt", "causal", "scale", "key_lengths",
                               "dropout_p", "seed", "layer", "step", "offset", "dout", "dq", "dk",
                               "dv", "window", "key_starts", NULL};
    PyObject *out_obj, *lse_obj, *q_obj, *k_obj, *v_obj, *lengths_obj, *seed_obj, *layer_obj,
        *step_obj, *offset_obj, *dout_obj = Py_None, *dq_obj = Py_None, *dk_obj = Py_None,
        *dv_obj = Py_None, *starts_obj = Py_None;
    const char *text;
    int causal;
    float scale;
    double dropout_p;
    long long window = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOspfOdOOOO|OOOO$LO:op_attention", keywords,
                                     &out_obj, &lse_obj, &q_obj, &k_obj, &v_obj, &text, &causal,
                                     &scale, &lengths_obj, &dropout_p, &seed_obj, &layer_obj,
                                     &step_obj, &offset_obj, &dout_obj, &dq_obj, &dk_obj, &dv_obj,
                                     &window, &starts_obj))
        return NULL;
    gt_attention_args a = {.scale = scale, .causal = causal, .dropout_p = dropout_p, .window = window};
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &a.dt), backward = dout_obj != Py_None;
    PyArrayObject *q = typenum < 0 ? NULL : attention_operand(q_obj, "q", typenum, 0, NULL), *k, *v,
                  *out, *lse;
    if (!q || !(k = attention_kv_operand(k_obj, "k", typenum, 0, q, NULL)) ||
        !(v = attention_kv_operand(v_obj, "v", typenum, 0, q, k)) ||
        !(out = attention_operand(out_obj, "out", typenum, !backward, q)))
        return NULL;
    if (window < 0)
        return PyErr_Format(PyExc_ValueError, "window: must be >= 0 (0: no window), got %lld", window);
    a.batch = PyArray_DIM(q, 0), a.heads = PyArray_DIM(q, 1), a.seq = PyArray_DIM(q, 2);
    a.head_dim = PyArray_DIM(q, 3), a.kv_heads = PyArray_DIM(k, 1);
    a.in = (gt_attn_strides){a.heads * a.seq * a.head_dim, a.seq * a.head_dim, a.head_dim};
    a.kv = (gt_attn_strides){a.kv_heads * a.seq * a.head_dim, a.seq * a.head_dim, a.head_dim};
    a.out_strides = a.in;
    if (!(lse = gtpy_vector(lse_obj, "lse", NPY_FLOAT32, a.batch * a.heads * a.seq, !backward)) ||
        attention_options(lengths_obj, seed_obj, layer_obj, step_obj, offset_obj, &a) < 0 ||
        attention_key_starts(starts_obj, &a) < 0)
        return NULL;
    a.q = PyArray_DATA(q), a.k = PyArray_DATA(k), a.v = PyArray_DATA(v);
    a.out = PyArray_DATA(out), a.lse = PyArray_DATA(lse);
    if (!backward)
        return run_attention(module, &a, 0);
    PyArrayObject *dout, *dq, *dk, *dv;
    if (!(dout = attention_operand(dout_obj, "dout", typenum, 0, q)) ||
        !(dq = attention_operand(dq_obj, "dq", typenum, 1, q)) ||
        !(dk = attention_kv_operand(dk_obj, "dk", typenum, 1, q, k)) ||
        !(dv = attention_kv_operand(dv_obj, "dv", typenum, 1, q, k)))
        return NULL;
    a.dout = PyArray_DATA(dout), a.dq = PyArray_DATA(dq), a.dk = PyArray_DATA(dk);
    a.dv = PyArray_DATA(dv);
    return run_attention(module, &a, 1);
}

static gt_status conv2d_forward_op(gt_backend *be, const void *a) {
    return be->ops->conv2d_forward(be, a);
}

static gt_status conv2d_backward_op(gt_backend *be, const void *a) {
    return be->ops->conv2d_backward(be, a);
}

/* Runs the convolution `a` (forward, or backward when `backward`) with a workspace of its own. */
static PyObject *run_conv2d(PyObject *module, gt_conv2d_args *a, int backward) {
    gt_status status = gt_conv2d_check(a, backward);  /* before sizing anything by the args */
    if (status != GT_OK)
        return gtpy_raise(module, status);
    size_t bytes = gt_cpu_ops()->conv2d_workspace_bytes(a, gt_get_num_threads());
    if (bytes > GT_MAX_BYTES)
        return PyErr_Format(PyExc_MemoryError, "x: a convolution of this size needs more scratch "
                            "memory than can be addressed");
    return gtpy_run_with_workspace(module, backward ? conv2d_backward_op : conv2d_forward_op, a, bytes);
}

/* The options of a convolution as parsed by "(LL)(LL)(LL)L": stride, padding, dilation, groups. */
static gt_conv2d_args conv_options(const long long o[7]) {
    return (gt_conv2d_args){.stride_h = o[0], .stride_w = o[1], .pad_h = o[2], .pad_w = o[3],
                            .dilation_h = o[4], .dilation_w = o[5], .groups = o[6]};
}

/* The sizes of a convolution from x (N, C, H, W), the weight's kernel and the options; -1 with
 * an exception when the weight or the options do not fit x. */
static int conv_sizes(PyArrayObject *x, PyArrayObject *weight, gt_conv2d_args *a) {
    a->batch = PyArray_DIM(x, 0), a->in_channels = PyArray_DIM(x, 1);
    a->height = PyArray_DIM(x, 2), a->width = PyArray_DIM(x, 3);
    a->out_channels = PyArray_DIM(weight, 0);
    a->kernel_h = PyArray_DIM(weight, 2), a->kernel_w = PyArray_DIM(weight, 3);
    if (a->groups >= 1 && a->in_channels % a->groups == 0 &&
        PyArray_DIM(weight, 1) != a->in_channels / a->groups) {
        PyErr_Format(PyExc_ValueError, "weight: dimension 1 must be in_channels / groups = %lld, got %lld",
                     (long long)(a->in_channels / a->groups), (long long)PyArray_DIM(weight, 1));
        return -1;
    }
    return 0;
}

/* Checks the sizes of `a` (not its pointers, unset yet); -1 with an exception. */
static int check_conv_sizes(PyObject *module, const gt_conv2d_args *a) {
    gt_conv2d_args sizes = *a;
    sizes.batch = 0;
    gt_status status = gt_conv2d_check(&sizes, 0);
    return status == GT_OK ? 0 : gtpy_raise_int(module, status);
}

/* The dtype (text), x and weight of a convolution with the options in `a`: fills a's dtype, sizes
 * and x and weight pointers, and out_dims with (N, O, OH, OW); the arrays' NumPy type, or -1 with
 * an exception. */
static int conv_inputs(PyObject *module, const char *text, PyObject *x_obj, PyObject *weight_obj,
                       gt_conv2d_args *a, int64_t out_dims[4]) {
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &a->dt);
    PyArrayObject *x, *weight;
    if (typenum < 0 ||
        !(x = gtpy_array_nd(x_obj, "x", typenum, 0, 4, NULL, "must be 4-D (batch, channels, height, width)")) ||
        !(weight = gtpy_array_nd(weight_obj, "weight", typenum, 0, 4, NULL,
                                 "must be 4-D (out_channels, in_channels / groups, kh, kw)")) ||
        conv_sizes(x, weight, a) < 0 || check_conv_sizes(module, a) < 0)
        return -1;
    out_dims[0] = a->batch, out_dims[1] = a->out_channels;
    out_dims[2] = gt_conv2d_out_h(a), out_dims[3] = gt_conv2d_out_w(a);
    a->x = PyArray_DATA(x), a->weight = PyArray_DATA(weight);
    return typenum;
}

/* conv2d forward: out = conv(x, weight) + bias. x (N, C, H, W), weight (O, C / groups, KH, KW) in
 * dt, bias (O,) float32 or None, out (N, O, OH, OW) dt. */
static PyObject *op_conv2d(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "x", "weight", "bias", "dt", "stride", "padding", "dilation",
                               "groups", NULL};
    PyObject *out_obj, *x_obj, *weight_obj, *bias_obj;
    const char *text;
    long long o[7];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOs(LL)(LL)(LL)L:op_conv2d", keywords, &out_obj,
                                     &x_obj, &weight_obj, &bias_obj, &text, &o[0], &o[1], &o[2], &o[3],
                                     &o[4], &o[5], &o[6]))
        return NULL;
    gt_conv2d_args a = conv_options(o);
    int64_t out_dims[4];
    int typenum = conv_inputs(module, text, x_obj, weight_obj, &a, out_dims);
    PyArrayObject *out;
    void *bias;
    if (typenum < 0 || !(out = gtpy_array_nd(out_obj, "out", typenum, 1, 4, out_dims, "must be (N, O, OH, OW)")) ||
        gtpy_optional_vector(bias_obj, "bias", NPY_FLOAT32, a.out_channels, 0, &bias) < 0)
        return NULL;
    a.out = PyArray_DATA(out), a.bias = bias;
    return run_conv2d(module, &a, 0);
}

/* conv2d backward: dx (N, C, H, W) dt, dweight (O, C / groups, KH, KW) float32 and dbias (O,)
 * float32 (each None: not wanted), written or (accumulate) added to, from dout (N, O, OH, OW). */
static PyObject *op_conv2d_backward(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dx", "dweight", "dbias", "dout", "x", "weight", "dt", "stride",
                               "padding", "dilation", "groups", "accumulate", NULL};
    PyObject *dx_obj, *dweight_obj, *dbias_obj, *dout_obj, *x_obj, *weight_obj;
    const char *text;
    long long o[7];
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOs(LL)(LL)(LL)L|p:op_conv2d_backward", keywords,
                                     &dx_obj, &dweight_obj, &dbias_obj, &dout_obj, &x_obj, &weight_obj, &text,
                                     &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &accumulate))
        return NULL;
    gt_conv2d_args a = conv_options(o);
    a.accumulate = accumulate;
    int64_t out_dims[4];
    int typenum = conv_inputs(module, text, x_obj, weight_obj, &a, out_dims);
    if (typenum < 0)
        return NULL;
    const int64_t w_dims[4] = {a.out_channels, a.in_channels / a.groups, a.kernel_h, a.kernel_w};
    const int64_t x_dims[4] = {a.batch, a.in_channels, a.height, a.width};
    PyArrayObject *dout = gtpy_array_nd(dout_obj, "dout", typenum, 0, 4, out_dims, "must be (N, O, OH, OW)");
    void *dweight, *dbias;
    if (!dout || gtpy_optional_nd(dx_obj, "dx", typenum, 1, 4, x_dims, "must have x's shape", &a.dx) < 0 ||
        gtpy_optional_nd(dweight_obj, "dweight", NPY_FLOAT32, 1, 4, w_dims, "must have the weight's shape",
                         &dweight) < 0 ||
        gtpy_optional_vector(dbias_obj, "dbias", NPY_FLOAT32, a.out_channels, 1, &dbias) < 0)
        return NULL;
    a.dout = PyArray_DATA(dout), a.dweight = dweight, a.dbias = dbias;
    return run_conv2d(module, &a, 1);
}

/* glu_forward (dout None: out (..., inter) from x (..., 2 inter)) or glu_backward (out is din, of
 * x's shape; dout (..., inter)). */
static PyObject *op_glu(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "x", "act", "dt", "dout", NULL};
    PyObject *out_obj, *x_obj, *dout_obj = Py_None;
    int act;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOis|O:op_glu", keywords, &out_obj, &x_obj, &act, &text,
                                     &dout_obj))
        return NULL;
    gt_dtype dt;
    int64_t rows, cols;
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &dt);
    PyArrayObject *x = typenum < 0 ? NULL : gtpy_as_array(x_obj, "x", typenum, 0), *out, *dout = NULL;
    if (!x || gtpy_rows_cols(x, "x", &rows, &cols) < 0)
        return NULL;
    if (cols % 2 != 0)
        return PyErr_Format(PyExc_ValueError, "x: the last dimension must be even ([gate | up] halves), got %lld",
                            (long long)cols);
    int64_t half_dims[NPY_MAXDIMS];
    int ndim = PyArray_NDIM(x);
    for (int k = 0; k < ndim; k++)
        half_dims[k] = (int64_t)PyArray_DIM(x, k);
    half_dims[ndim - 1] = cols / 2;
    const char *what = "must have x's shape with the last dimension halved";
    if (dout_obj == Py_None) {
        if (!(out = gtpy_array_nd(out_obj, "out", typenum, 1, ndim, half_dims, what)))
            return NULL;
    } else if (!(out = gtpy_array_like(out_obj, "out", typenum, 1, x, "x")) ||
               !(dout = gtpy_array_nd(dout_obj, "dout", typenum, 0, ndim, half_dims, what))) {
        return NULL;
    }
    gt_backend be = gtpy_cpu_backend();
    if (dout)
        GTPY_RUN_OP(module, be.ops->glu_backward(&be, PyArray_DATA(out), PyArray_DATA(dout), PyArray_DATA(x), rows,
                                                 cols / 2, (gt_activation)act, dt));
    else
        GTPY_RUN_OP(module, be.ops->glu_forward(&be, PyArray_DATA(out), PyArray_DATA(x), rows, cols / 2,
                                                (gt_activation)act, dt));
    Py_RETURN_NONE;
}

/* 1 when the bytes of two arrays overlap. */
static int arrays_overlap(PyArrayObject *a, PyArrayObject *b) {
    const char *a0 = PyArray_BYTES(a), *b0 = PyArray_BYTES(b);
    return a0 < b0 + PyArray_NBYTES(b) && b0 < a0 + PyArray_NBYTES(a);
}

/* rope_forward (x -> out) or rope_backward (x = dout -> out = din): x (batch, heads, seq, D)
 * when heads_axis is 1, (batch, seq, heads, D) when 2; out of x's shape, x itself (in place) or
 * not overlapping it; positions (batch, seq) or (1, seq) int64; inv_freq (R / 2,) float32. */
static PyObject *op_rope(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "x", "positions", "inv_freq", "dt", "heads_axis", "backward",
                               "attention_factor", NULL};
    PyObject *out_obj, *x_obj, *positions_obj, *inv_obj;
    const char *text;
    int heads_axis, backward = 0;
    float attention_factor = 1.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOsi|pf:op_rope", keywords, &out_obj, &x_obj,
                                     &positions_obj, &inv_obj, &text, &heads_axis, &backward,
                                     &attention_factor))
        return NULL;
    if (heads_axis != 1 && heads_axis != 2)
        return PyErr_Format(PyExc_ValueError, "heads_axis must be 1 (batch, heads, seq, head_dim) or 2 "
                            "(batch, seq, heads, head_dim), got %d", heads_axis);
    gt_rope_args a = {.positions_stride = 0, .attention_factor = attention_factor};
    int typenum = gtpy_parse_act_dtype(module, text, "dt", &a.dt);
    PyArrayObject *x = typenum < 0 ? NULL : gtpy_array_nd(x_obj, "x", typenum, 0, 4, NULL, "must be 4-D"), *out,
                  *positions, *inv;
    if (!x || !(out = gtpy_array_like(out_obj, "out", typenum, 1, x, "x")))
        return NULL;
    if (out != x && arrays_overlap(out, x))
        return PyErr_Format(PyExc_ValueError, "out must be x itself (in place) or not overlap it");
    const npy_intp *dims = PyArray_DIMS(x);
    a.batch = dims[0], a.heads = dims[heads_axis], a.seq = dims[3 - heads_axis], a.head_dim = dims[3];
    int64_t d = a.head_dim, h = a.heads, t = a.seq;
    a.strides = heads_axis == 1 ? (gt_attn_strides){h * t * d, t * d, d} : (gt_attn_strides){t * h * d, d, h * d};
    if (!(positions = gtpy_array_nd(positions_obj, "positions", NPY_INT64, 0, 2, NULL, "must be 2-D (batch, seq)")))
        return NULL;
    const npy_intp *p_dims = PyArray_DIMS(positions);
    if (p_dims[1] != t || (p_dims[0] != a.batch && p_dims[0] != 1))
        return PyErr_Format(PyExc_ValueError, "positions must be (batch, seq) = (%lld, %lld) or (1, seq), got "
                            "(%lld, %lld)", (long long)a.batch, (long long)t, (long long)p_dims[0],
                            (long long)p_dims[1]);
    a.positions_stride = p_dims[0] == 1 ? 0 : t;
    if (!(inv = gtpy_array_nd(inv_obj, "inv_freq", NPY_FLOAT32, 0, 1, NULL, "must be 1-D (rotary_dim / 2,)")))
        return NULL;
    a.rotary_dim = 2 * (int64_t)PyArray_DIM(inv, 0);
    a.in = PyArray_DATA(x), a.out = PyArray_DATA(out);
    a.positions = PyArray_DATA(positions), a.inv_freq = PyArray_DATA(inv);
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, backward ? be.ops->rope_backward(&be, &a) : be.ops->rope_forward(&be, &a));
    Py_RETURN_NONE;
}

/* Hugging Face's inv_freq of a head (ops/rope.h) as a new float32 array. */
static PyObject *op_rope_inv_freq(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"head_dim", "theta", "partial_rotary_factor", "rope_type", "factor",
                               "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
                               "beta_fast", "beta_slow", "truncate", NULL};
    static const char *const types[] = {"default", "llama3", "linear", "yarn"};  /* gt_rope_type order */
    long long head_dim;
    double partial = 1.0;
    const char *type = "default";
    gt_rope_freq f = {.type = GT_ROPE_DEFAULT, .factor = 1.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                      .original_max_position_embeddings = 8192.0, .beta_fast = 32.0, .beta_slow = 1.0,
                      .truncate = 1};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Ld|dsddddddp:op_rope_inv_freq", keywords, &head_dim,
                                     &f.theta, &partial, &type, &f.factor, &f.low_freq_factor,
                                     &f.high_freq_factor, &f.original_max_position_embeddings, &f.beta_fast,
                                     &f.beta_slow, &f.truncate))
        return NULL;
    int known = 0;
    for (int k = 0; k < 4; k++)
        if (strcmp(type, types[k]) == 0) {
            f.type = (gt_rope_type)k;
            known = 1;
        }
    if (!known)
        return PyErr_Format(PyExc_ValueError, "rope_type must be 'default', 'linear', 'llama3' or 'yarn', got '%s'",
                            type);
    int64_t rotary_dim = 0;
    gt_status status = gt_rope_rotary_dim((int64_t)head_dim, partial, &rotary_dim);
    if (status != GT_OK)
        return gtpy_raise(module, status);
    npy_intp n = (npy_intp)(rotary_dim / 2);
    PyObject *out = PyArray_SimpleNew(1, &n, NPY_FLOAT32);
    if (!out)
        return NULL;
    status = gt_rope_inv_freq(PyArray_DATA((PyArrayObject *)out), rotary_dim, &f);
    if (status != GT_OK) {
        Py_DECREF(out);
        return gtpy_raise(module, status);
    }
    return out;
}

static PyMethodDef ops_methods[] = {
    {"op_gemm", GTPY_KW(op_gemm), "op_gemm(a, b, c, a_dt, b_dt, c_dt, trans_a, trans_b, alpha, beta)\n--\n\n"
     "c = alpha op(a) @ op(b) + beta c in place; 3-D arrays are batches."},
    {"op_bias", GTPY_KW(op_bias), "op_bias(x, bias, dt, backward=False, accumulate=False)\n--\n\n"
     "x += bias over the last dim, or bias (+)= column sums of x when backward."},
    {"op_activation", GTPY_KW(op_activation), "op_activation(out, x, act, dt, dout=None)\n--\n\n"
     "out = act(x), or out = dout * act'(x) when dout is given."},
    {"op_dropout", GTPY_KW(op_dropout), "op_dropout(out, x, p, seed, layer, step, offset, dt, backward=False)\n--\n\n"
     "out = x * mask / (1 - p) with the Philox mask of (seed, layer, step, offset + i)."},
    {"op_add", GTPY_KW(op_add), "op_add(out, a, b, dt)\n--\n\nout = a + b."},
    {"op_layernorm_forward", GTPY_KW(op_layernorm_forward),
     "op_layernorm_forward(out, mean, rstd, x, weight, bias, eps, dt)\n--\n\nLayerNorm over the last dim."},
    {"op_layernorm_backward", GTPY_KW(op_layernorm_backward),
     "op_layernorm_backward(din, dweight, dbias, dout, x, weight, mean, rstd, dt, accumulate=False)\n--\n\n"
     "Gradients of LayerNorm (din None: the parameter gradients only)."},
    {"op_embedding", GTPY_KW(op_embedding), "op_embedding(x, ids, table, dt, backward=False, accumulate=False)\n--\n\n"
     "x = table[ids], or table (+)= scatter-add of x at ids when backward."},
    {"op_softmax_xent", GTPY_KW(op_softmax_xent),
     "op_softmax_xent(losses, dlogits, logits, targets, label_smoothing, ignore_index, dloss_scale, dt)\n--\n\n"
     "Per-row cross-entropy losses and (unless dlogits is None) the gradient; returns the count."},
    {"op_mse", GTPY_KW(op_mse), "op_mse(dpred, pred, target, dloss_scale, dt)\n--\n\n"
     "Mean squared error; fills dpred unless it is None."},
    {"op_sum_squares", (PyCFunction)op_sum_squares, METH_O, "op_sum_squares(x)\n--\n\n"
     "Sum of squares of a float32 array in a fixed order."},
    {"op_attention", GTPY_KW(op_attention),
     "op_attention(out, lse, q, k, v, dt, causal, scale, key_lengths, dropout_p, seed, layer, step, offset, "
     "dout=None, dq=None, dk=None, dv=None, *, window=0, key_starts=None)\n--\n\n"
     "Scaled dot-product attention over (batch, heads, seq, head_dim) q and (batch, kv_heads, seq, "
     "head_dim) k, v (grouped-query when kv_heads < heads): out and lse, or (dout given) dq, dk, dv."},
    {"op_conv2d", GTPY_KW(op_conv2d),
     "op_conv2d(out, x, weight, bias, dt, stride, padding, dilation, groups)\n--\n\n"
     "2-D convolution of (N, C, H, W) x by weight (O, C / groups, KH, KW), plus bias (O,) or None."},
    {"op_conv2d_backward", GTPY_KW(op_conv2d_backward),
     "op_conv2d_backward(dx, dweight, dbias, dout, x, weight, dt, stride, padding, dilation, groups, "
     "accumulate=False)\n--\n\nGradients of op_conv2d; dx, dweight and dbias may be None (not wanted)."},
    {"op_glu", GTPY_KW(op_glu), "op_glu(out, x, act, dt, dout=None)\n--\n\n"
     "Gated activation of x's [gate | up] halves: out = act(gate) * up, or out = [dgate | dup] when dout "
     "is given."},
    {"op_rope", GTPY_KW(op_rope),
     "op_rope(out, x, positions, inv_freq, dt, heads_axis, backward=False, attention_factor=1.0)\n--\n\n"
     "Rotary position embedding (rotate_half layout) of x into out, or its transpose when backward."},
    {"op_rope_inv_freq", GTPY_KW(op_rope_inv_freq),
     "op_rope_inv_freq(head_dim, theta, partial_rotary_factor=1.0, rope_type='default', factor=1.0, "
     "low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192.0, beta_fast=32.0, "
     "beta_slow=1.0, truncate=True)\n--\n\n"
     "Hugging Face's float32 inverse frequencies of a head ('default', 'linear', 'llama3' or 'yarn' rope_type)."},
    {"op_cast", GTPY_KW(op_cast), "op_cast(dst, dst_dt, src, src_dt)\n--\n\ndst = src converted (RNE)."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_ops(PyObject *module) { return PyModule_AddFunctions(module, ops_methods); }
