/* Bindings of the NCHW ops (csrc/ops/ops.h: BatchNorm2d and 2-D pooling) as `_C.op_<name>`, for
 * tests and benchmarks of the ops alone. Outputs are allocated by the caller; every array is
 * checked (ops_args.h) and the sizes come from the shapes once they agree; the ops run with the
 * GIL released. */
#include "py_testing/testing.h"

#include <string.h>

#include "core/threads.h"
#include "py/ops_args.h"

/* An (N, C, H, W) activation array of dtype dt; its sizes into dims. */
static PyArrayObject *nchw(PyObject *obj, const char *name, gt_dtype dt, int writable, int64_t dims[4]) {
    PyArrayObject *a = gtpy_array_nd(obj, name, gtpy_typenum_of(dt), writable, 4, NULL,
                                     "must be (N, C, H, W), got shape");
    for (int i = 0; a && i < 4; i++)
        dims[i] = PyArray_DIM(a, i);
    return a;
}

/* A (size,) float32 vector or None (*out NULL). */
static int optional_vector(PyObject *obj, const char *name, int64_t size, int writable, float **out) {
    void *data;
    int result = gtpy_optional_vector(obj, name, NPY_FLOAT32, size, writable, &data);
    *out = data;
    return result;
}

/* The batch statistics mean and rstd of a, (C,) float32 arrays (not None); -1 with an exception. */
static int mean_rstd(PyObject *mean_obj, PyObject *rstd_obj, int writable, gt_batchnorm_args *a) {
    if (optional_vector(mean_obj, "mean", a->c, writable, &a->mean) < 0 ||
        (a->mean && optional_vector(rstd_obj, "rstd", a->c, writable, &a->rstd) < 0))
        return -1;
    if (a->mean && a->rstd)
        return 0;
    PyErr_SetString(PyExc_TypeError, "mean and rstd must be float32 arrays, not None");
    return -1;
}

/* The dtype (text) and x (N, C, H, W) of a BatchNorm2d call into a, and y, an array of x's shape
 * (out, dout or din: `name`); y, or NULL with an exception. */
static PyArrayObject *batchnorm_inputs(PyObject *module, const char *text, PyObject *x_obj, PyObject *y_obj,
                                       const char *name, int writable, gt_batchnorm_args *a) {
    int64_t xd[4], yd[4];
    if (gtpy_parse_act_dtype(module, text, "dt", &a->dt) < 0)
        return NULL;
    PyArrayObject *x = nchw(x_obj, "x", a->dt, 0, xd), *y = x ? nchw(y_obj, name, a->dt, writable, yd) : NULL;
    if (!y || gtpy_same_shape(y, name, x, "x") < 0)
        return NULL;
    a->n = xd[0], a->c = xd[1], a->hw = xd[2] * xd[3], a->in = PyArray_DATA(x);
    return y;
}

/* num_batches_tracked: a writeable int64 array of one element, or None (*count NULL). */
static int optional_count(PyObject *obj, int64_t **count) {
    *count = NULL;
    if (obj == Py_None)
        return 0;
    PyArrayObject *a = gtpy_as_array(obj, "num_batches_tracked", NPY_INT64, 1);
    if (!a)
        return -1;
    if (PyArray_SIZE(a) != 1)
        return gtpy_fail_shape(a, "num_batches_tracked", "must hold one count, got shape");
    *count = PyArray_DATA(a);
    return 0;
}

static PyObject *op_batchnorm2d(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "mean", "rstd", "x", "weight", "bias", "running_mean", "running_var",
                               "num_batches_tracked", "eps", "momentum", "batch_stats", "update_running",
                               "dt", NULL};
    PyObject *out_obj, *mean_obj, *rstd_obj, *x_obj, *w_obj, *b_obj, *rm_obj, *rv_obj, *count_obj;
    float eps;
    double momentum;
    int batch_stats, update;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOfdpps:op_batchnorm2d", keywords, &out_obj,
                                     &mean_obj, &rstd_obj, &x_obj, &w_obj, &b_obj, &rm_obj, &rv_obj, &count_obj,
                                     &eps, &momentum, &batch_stats, &update, &text))
        return NULL;
    gt_batchnorm_args a = {.eps = eps, .momentum = momentum, .batch_stats = batch_stats,
                           .update_running = update};
    PyArrayObject *out = batchnorm_inputs(module, text, x_obj, out_obj, "out", 1, &a);
    if (!out)
        return NULL;
    a.out = PyArray_DATA(out);
    float *weight, *bias;
    if (mean_rstd(mean_obj, rstd_obj, 1, &a) < 0 || optional_vector(w_obj, "weight", a.c, 0, &weight) < 0 ||
        optional_vector(b_obj, "bias", a.c, 0, &bias) < 0 ||
        optional_vector(rm_obj, "running_mean", a.c, 1, &a.running_mean) < 0 ||
        optional_vector(rv_obj, "running_var", a.c, 1, &a.running_var) < 0 ||
        optional_count(count_obj, &a.num_batches_tracked) < 0)
        return NULL;
    a.weight = weight;
    a.bias = bias;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->batchnorm_forward(&be, &a));
    Py_RETURN_NONE;
}

static PyObject *op_batchnorm2d_backward(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"din", "dweight", "dbias", "dout", "x", "weight", "mean", "rstd", "batch_stats",
                               "dt", "accumulate", NULL};
    PyObject *din_obj, *dw_obj, *db_obj, *dout_obj, *x_obj, *w_obj, *mean_obj, *rstd_obj;
    int batch_stats, accumulate = 0;
    const char *text;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOps|p:op_batchnorm2d_backward", keywords, &din_obj,
                                     &dw_obj, &db_obj, &dout_obj, &x_obj, &w_obj, &mean_obj, &rstd_obj,
                                     &batch_stats, &text, &accumulate))
        return NULL;
    gt_batchnorm_args a = {.batch_stats = batch_stats, .accumulate = accumulate};
    PyArrayObject *dout = batchnorm_inputs(module, text, x_obj, dout_obj, "dout", 0, &a);
    if (!dout)
        return NULL;
    a.dout = PyArray_DATA(dout);
    if (din_obj != Py_None) {
        PyArrayObject *din = batchnorm_inputs(module, text, x_obj, din_obj, "din", 1, &a);
        if (!din)
            return NULL;
        a.din = PyArray_DATA(din);
    }
    float *weight;
    if (optional_vector(dw_obj, "dweight", a.c, 1, &a.dweight) < 0 ||
        optional_vector(db_obj, "dbias", a.c, 1, &a.dbias) < 0 ||
        optional_vector(w_obj, "weight", a.c, 0, &weight) < 0 || mean_rstd(mean_obj, rstd_obj, 0, &a) < 0)
        return NULL;
    a.weight = weight;
    gt_backend be = gtpy_cpu_backend();
    GTPY_RUN_OP(module, be.ops->batchnorm_backward(&be, &a));
    Py_RETURN_NONE;
}

/* A pair of ints into out[2]. */
static int parse_pair(PyObject *obj, const char *name, int64_t out[2]) {
    long long a = 0, b = 0;
    if (!PyTuple_Check(obj) || !PyArg_ParseTuple(obj, "LL", &a, &b)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a pair of ints", name);
        return -1;
    }
    out[0] = a;
    out[1] = b;
    return 0;
}

static int parse_pool_kind(const char *text, gt_pool_kind *kind) {
    static const char *names[] = {"max", "avg", "adaptive_avg"};
    for (int i = 0; i < 3; i++)
        if (strcmp(text, names[i]) == 0) {
            *kind = (gt_pool_kind)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "kind must be 'max', 'avg' or 'adaptive_avg', got '%s'", text);
    return -1;
}

static gt_status pool2d_forward_op(gt_backend *be, const void *a) {
    return be->ops->pool2d_forward(be, a);
}

static gt_status pool2d_backward_op(gt_backend *be, const void *a) {
    return be->ops->pool2d_backward(be, a);
}

/* op_pool2d(out, x, kind, kernel, stride, padding, dilation, count_include_pad, dt, dout=None,
 * argmax=None): forward into out, or (dout given) the input gradient into out (x's shape); MAX
 * with an int32 argmax of the pooled shape saves the maxima in forward and reads them in backward. */
static PyObject *op_pool2d(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"out", "x", "kind", "kernel", "stride", "padding", "dilation",
                               "count_include_pad", "dt", "dout", "argmax", NULL};
    PyObject *out_obj, *x_obj, *k_obj, *s_obj, *p_obj, *d_obj, *dout_obj = Py_None, *argmax_obj = Py_None;
    const char *kind_text, *text;
    int include_pad;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOsOOOOps|OO:op_pool2d", keywords, &out_obj, &x_obj, &kind_text,
                                     &k_obj, &s_obj, &p_obj, &d_obj, &include_pad, &text, &dout_obj, &argmax_obj))
        return NULL;
    gt_pool2d_args a = {.count_include_pad = include_pad};
    int64_t xd[4], od[4];
    if (parse_pool_kind(kind_text, &a.kind) < 0 || parse_pair(k_obj, "kernel", a.kernel) < 0 ||
        parse_pair(s_obj, "stride", a.stride) < 0 || parse_pair(p_obj, "padding", a.padding) < 0 ||
        parse_pair(d_obj, "dilation", a.dilation) < 0 || gtpy_parse_act_dtype(module, text, "dt", &a.dt) < 0)
        return NULL;
    int backward = dout_obj != Py_None;
    PyArrayObject *x = nchw(x_obj, "x", a.dt, 0, xd), *out = x ? nchw(out_obj, "out", a.dt, 1, od) : NULL;
    PyArrayObject *pooled = out && backward ? nchw(dout_obj, "dout", a.dt, 0, od) : out;
    if (!pooled)
        return NULL;
    if (backward && gtpy_same_shape(out, "out", x, "x") < 0)
        return NULL;
    if (od[0] != xd[0] || od[1] != xd[1]) {
        gtpy_fail_shape(pooled, backward ? "dout" : "out", "must have x's N and C, got shape");
        return NULL;
    }
    a.n = xd[0], a.c = xd[1], a.h = xd[2], a.w = xd[3], a.out_h = od[2], a.out_w = od[3];
    if (argmax_obj != Py_None) {
        PyArrayObject *argmax = gtpy_as_array(argmax_obj, "argmax", NPY_INT32, 1);
        if (!argmax || gtpy_same_shape(argmax, "argmax", pooled, backward ? "dout" : "out") < 0)
            return NULL;
        if (a.kind != GT_POOL_MAX) {
            PyErr_SetString(PyExc_ValueError, "argmax: only max pooling saves its maxima");
            return NULL;
        }
        a.argmax = PyArray_DATA(argmax);
        if (backward) {  /* offsets read from Python: each must lie in its plane */
            const int32_t *k = a.argmax;
            for (npy_intp i = 0; i < PyArray_SIZE(argmax); i++)
                if (k[i] < 0 || k[i] >= a.h * a.w)
                    return PyErr_Format(PyExc_ValueError, "argmax[%zd]: %d is outside a %lld x %lld plane",
                                        (Py_ssize_t)i, (int)k[i], (long long)a.h, (long long)a.w);
        }
    }
    a.in = PyArray_DATA(x);
    if (backward) {
        a.dout = PyArray_DATA(pooled);
        a.din = PyArray_DATA(out);
    } else {
        a.out = PyArray_DATA(out);
    }
    if (!backward)
        return gtpy_run_with_workspace(module, pool2d_forward_op, &a, 0);
    return gtpy_run_with_workspace(module, pool2d_backward_op, &a,
                                   gt_cpu_ops()->pool2d_workspace_bytes(&a, gt_get_num_threads()));
}

static PyMethodDef cnn_ops_methods[] = {
    {"op_batchnorm2d", GTPY_KW(op_batchnorm2d),
     "op_batchnorm2d(out, mean, rstd, x, weight, bias, running_mean, running_var, num_batches_tracked, eps, "
     "momentum, batch_stats, update_running, dt)\n--\n\nBatchNorm2d forward over (N, C, H, W); None for "
     "absent weight/bias/running statistics."},
    {"op_batchnorm2d_backward", GTPY_KW(op_batchnorm2d_backward),
     "op_batchnorm2d_backward(din, dweight, dbias, dout, x, weight, mean, rstd, batch_stats, dt, "
     "accumulate=False)\n--\n\nGradients of BatchNorm2d (None: not wanted or absent)."},
    {"op_pool2d", GTPY_KW(op_pool2d),
     "op_pool2d(out, x, kind, kernel, stride, padding, dilation, count_include_pad, dt, dout=None, argmax=None)"
     "\n--\n\n2-D pooling into out (its shape sets the output size), or with dout the input gradient into "
     "out; argmax (int32, max pooling): the maxima saved by forward, read by backward."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_cnn_ops(PyObject *module) { return PyModule_AddFunctions(module, cnn_ops_methods); }
