/* Sampling orders from Python: parsing an order description, and sampler_rows(), the rows
 * an order yields (what gputrain.data's samplers iterate over, and what tests compare). */
#include "py/loader.h"

/* An int item of `spec` as uint64; negative values and missing keys raise. */
static int spec_uint64(PyObject *spec, const char *key, uint64_t *out) {
    PyObject *value = PyDict_GetItemString(spec, key);  /* borrowed */
    if (!value) {
        PyErr_Format(PyExc_KeyError, "order description lacks %s", key);
        return -1;
    }
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", key, Py_TYPE(value)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be in [0, 2**64), got %R", key, value);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* The "indices" item as a C-contiguous int64 array (new reference), or NULL for None. */
static int spec_indices(PyObject *spec, PyArrayObject **out) {
    PyObject *value = PyDict_GetItemString(spec, "indices");
    *out = NULL;
    if (!value || value == Py_None)
        return 0;
    *out = (PyArrayObject *)PyArray_FROM_OTF(value, NPY_INT64, NPY_ARRAY_IN_ARRAY);
    if (!*out)
        return -1;
    if (PyArray_NDIM(*out) != 1) {
        Py_CLEAR(*out);
        PyErr_SetString(PyExc_ValueError, "indices must be a 1-D array of sample indices");
        return -1;
    }
    return 0;
}

int gtpy_parse_sampler(PyObject *module, PyObject *spec, uint64_t num_rows, gt_sampler *sampler,
                       PyArrayObject **indices_out) {
    if (!PyDict_Check(spec)) {
        PyErr_Format(PyExc_TypeError, "order must be a dict, not %.100s", Py_TYPE(spec)->tp_name);
        return -1;
    }
    uint64_t kind, base_length, seed, epoch, num_replicas, rank;
    if (spec_uint64(spec, "kind", &kind) < 0 || spec_uint64(spec, "base_length", &base_length) < 0 ||
        spec_uint64(spec, "seed", &seed) < 0 || spec_uint64(spec, "epoch", &epoch) < 0 ||
        spec_uint64(spec, "num_replicas", &num_replicas) < 0 || spec_uint64(spec, "rank", &rank) < 0)
        return -1;
    PyObject *drop_obj = PyDict_GetItemString(spec, "drop_last");
    int drop_last = drop_obj ? PyObject_IsTrue(drop_obj) : 0;
    if (drop_last < 0 || spec_indices(spec, indices_out) < 0)
        return -1;
    const int64_t *indices = NULL;
    if (kind == GT_ORDER_ARRAY) {
        if (!*indices_out) {
            PyErr_SetString(PyExc_ValueError, "indices: an array order needs its index array");
            return -1;
        }
        indices = PyArray_DATA(*indices_out);
        base_length = (uint64_t)PyArray_DIM(*indices_out, 0);
    }
    gt_order_kind order = (gt_order_kind)(kind > 255 ? 255 : kind);  /* unknown kinds refused */
    gt_status status = gt_sampler_init(sampler, order, num_rows, base_length, seed, epoch, indices);
    if (status == GT_OK && num_replicas != 1)
        status = gt_sampler_shard(sampler, num_replicas, rank, drop_last);
    else if (status == GT_OK && rank != 0)
        status = GT_FAIL(GT_ERR_VALUE, "Invalid rank %llu, rank should be in the interval [0, 0]",
                         (unsigned long long)rank);
    if (status != GT_OK) {
        Py_CLEAR(*indices_out);
        return gtpy_raise_int(module, status);
    }
    return 0;
}

static PyObject *sampler_rows(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"num_rows", "order", NULL};
    unsigned long long num_rows = 0;
    PyObject *spec = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KO:sampler_rows", keywords, &num_rows, &spec))
        return NULL;
    gt_sampler sampler;
    PyArrayObject *indices = NULL;
    if (gtpy_parse_sampler(module, spec, num_rows, &sampler, &indices) < 0)
        return NULL;
    npy_intp length = (npy_intp)sampler.length;
    PyObject *rows = PyArray_SimpleNew(1, &length, NPY_INT64);
    if (rows) {
        int64_t *out = PyArray_DATA((PyArrayObject *)rows);
        Py_BEGIN_ALLOW_THREADS
        gt_sampler_rows(&sampler, 0, (uint64_t)length, out);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(indices);
    return rows;
}

static PyMethodDef sampler_methods[] = {
    {"sampler_rows", (PyCFunction)(void (*)(void))sampler_rows, METH_VARARGS | METH_KEYWORDS,
     "sampler_rows(num_rows, order)\n--\n\nThe rows an order over num_rows rows yields, as int64."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_loader_sampler(PyObject *module) {
    return PyModule_AddFunctions(module, sampler_methods);
}
