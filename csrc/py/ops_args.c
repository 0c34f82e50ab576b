/* Argument checks of the op bindings and their runs on the CPU backend (ops_args.h). */
#include "py/ops_args.h"

#include <stdio.h>

#include "core/alloc.h"

int gtpy_typenum_of(gt_dtype dt) {
    switch (dt) {
    case GT_F16: return NPY_FLOAT16;
    case GT_BF16: return NPY_UINT16;
    default: return NPY_FLOAT32;
    }
}

static const char *typenum_name(int typenum) {
    switch (typenum) {
    case NPY_FLOAT32: return "float32";
    case NPY_FLOAT16: return "float16";
    case NPY_UINT16: return "uint16 (bf16 bit patterns)";
    case NPY_INT64: return "int64";
    default: return "?";
    }
}

/* "(d0, d1, ...)" into buf. */
static const char *shape_text(PyArrayObject *a, char *buf, size_t bytes) {
    size_t used = (size_t)snprintf(buf, bytes, "(");
    for (int i = 0; i < PyArray_NDIM(a) && used < bytes; i++)
        used += (size_t)snprintf(buf + used, bytes - used, i ? ", %lld" : "%lld",
                                 (long long)PyArray_DIM(a, i));
    if (used < bytes)
        snprintf(buf + used, bytes - used, PyArray_NDIM(a) == 1 ? ",)" : ")");
    return buf;
}

PyArrayObject *gtpy_as_array(PyObject *obj, const char *name, int typenum, int writable) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, not %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *array = (PyArrayObject *)obj;
    if (typenum >= 0 && (PyArray_TYPE(array) != typenum || !PyArray_ISNOTSWAPPED(array))) {
        PyErr_Format(PyExc_TypeError, "%s must have native dtype %s, got %R", name,
                     typenum_name(typenum), (PyObject *)PyArray_DESCR(array));
        return NULL;
    }
    if (!PyArray_IS_C_CONTIGUOUS(array) || !PyArray_ISALIGNED(array)) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous and aligned", name);
        return NULL;
    }
    if (writable && !PyArray_ISWRITEABLE(array)) {
        PyErr_Format(PyExc_ValueError, "%s must be writeable", name);
        return NULL;
    }
    return array;
}

int gtpy_parse_act_dtype(PyObject *module, const char *text, const char *name, gt_dtype *dt) {
    gt_status status = gt_dtype_parse(text, name, dt);
    if (status != GT_OK)
        return gtpy_raise_int(module, status);
    if (*dt != GT_F32 && *dt != GT_F16 && *dt != GT_BF16) {
        PyErr_Format(PyExc_ValueError, "%s must be 'f32', 'f16' or 'bf16', got '%s'", name, text);
        return -1;
    }
    return gtpy_typenum_of(*dt);
}

int gtpy_parse_uint(PyObject *obj, const char *name, unsigned long long max,
                    unsigned long long *out) {
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long value = PyLong_AsUnsignedLongLong(obj);
    if (PyErr_Occurred() || value > max) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be in [0, %llu], got %R", name, max, obj);
        return -1;
    }
    *out = value;
    return 0;
}

int gtpy_parse_dropout_key(PyObject *seed, PyObject *layer, PyObject *step, PyObject *offset,
                           gt_dropout_key *key) {
    unsigned long long s, l, t, o;
    if (gtpy_parse_uint(seed, "seed", UINT64_MAX, &s) < 0 ||
        gtpy_parse_uint(layer, "layer", UINT32_MAX, &l) < 0 ||
        gtpy_parse_uint(step, "step", UINT32_MAX, &t) < 0 ||
        gtpy_parse_uint(offset, "offset", INT64_MAX, &o) < 0)
        return -1;
    *key = (gt_dropout_key){s, (uint32_t)l, (uint32_t)t, o};
    return 0;
}

int gtpy_fail_shape(PyArrayObject *a, const char *name, const char *what) {
    char buf[160];
    PyErr_Format(PyExc_ValueError, "%s: %s, got shape %s", name, what,
                 shape_text(a, buf, sizeof buf));
    return -1;
}

int gtpy_same_shape(PyArrayObject *a, const char *a_name, PyArrayObject *b, const char *b_name) {
    if (PyArray_SAMESHAPE(a, b))
        return 0;
    char a_buf[160], b_buf[160];
    PyErr_Format(PyExc_ValueError, "%s: shape %s does not match %s's shape %s", a_name,
                 shape_text(a, a_buf, sizeof a_buf), b_name, shape_text(b, b_buf, sizeof b_buf));
    return -1;
}

/* *data = a's data; -1 when a is NULL (its exception set). */
static int data_of(PyArrayObject *a, void **data) {
    *data = a ? PyArray_DATA(a) : NULL;
    return a ? 0 : -1;
}

PyArrayObject *gtpy_array_like(PyObject *obj, const char *name, int typenum, int writable,
                               PyArrayObject *like, const char *like_name) {
    PyArrayObject *a = gtpy_as_array(obj, name, typenum, writable);
    return a && gtpy_same_shape(a, name, like, like_name) == 0 ? a : NULL;
}

int gtpy_optional_like(PyObject *obj, const char *name, int typenum, int writable,
                       PyArrayObject *like, const char *like_name, void **data) {
    *data = NULL;
    return obj == Py_None ? 0 : data_of(gtpy_array_like(obj, name, typenum, writable, like, like_name), data);
}

PyArrayObject *gtpy_array_nd(PyObject *obj, const char *name, int typenum, int writable, int ndim,
                             const int64_t *dims, const char *what) {
    PyArrayObject *a = gtpy_as_array(obj, name, typenum, writable);
    if (!a)
        return NULL;
    int ok = PyArray_NDIM(a) == ndim;
    for (int i = 0; ok && dims && i < ndim; i++)
        ok = (int64_t)PyArray_DIM(a, i) == dims[i];
    if (!ok) {
        gtpy_fail_shape(a, name, what);
        return NULL;
    }
    return a;
}

int gtpy_optional_nd(PyObject *obj, const char *name, int typenum, int writable, int ndim,
                     const int64_t *dims, const char *what, void **data) {
    *data = NULL;
    return obj == Py_None ? 0 : data_of(gtpy_array_nd(obj, name, typenum, writable, ndim, dims, what), data);
}

int gtpy_rows_cols(PyArrayObject *a, const char *name, int64_t *rows, int64_t *cols) {
    if (PyArray_NDIM(a) < 1)
        return gtpy_fail_shape(a, name, "needs at least one dimension");
    *cols = (int64_t)PyArray_DIM(a, PyArray_NDIM(a) - 1);
    *rows = 1;
    for (int i = 0; i < PyArray_NDIM(a) - 1; i++)
        *rows *= (int64_t)PyArray_DIM(a, i);
    return 0;
}

PyArrayObject *gtpy_vector(PyObject *obj, const char *name, int typenum, int64_t size,
                           int writable) {
    PyArrayObject *a = gtpy_as_array(obj, name, typenum, writable);
    if (!a)
        return NULL;
    if (PyArray_NDIM(a) != 1 || (int64_t)PyArray_DIM(a, 0) != size) {
        char what[64];
        snprintf(what, sizeof what, "must have shape (%lld,)", (long long)size);
        gtpy_fail_shape(a, name, what);
        return NULL;
    }
    return a;
}

int gtpy_optional_vector(PyObject *obj, const char *name, int typenum, int64_t size, int writable,
                         void **data) {
    *data = NULL;
    return obj == Py_None ? 0 : data_of(gtpy_vector(obj, name, typenum, size, writable), data);
}

gt_backend gtpy_cpu_backend(void) {
    gt_backend be = {gt_cpu_ops(), gt_cpu_device(), NULL, 0, NULL};
    return be;
}

PyObject *gtpy_run_with_workspace(PyObject *module, gtpy_op_fn op, const void *args, size_t bytes) {
    gt_block workspace = {0};
    gt_status status = bytes > 0 ? gt_block_alloc(gt_cpu_device(), bytes, &workspace) : GT_OK;
    if (status != GT_OK)
        return gtpy_raise(module, status);
    gt_backend be = gtpy_cpu_backend();
    be.workspace = workspace.ptr;
    be.workspace_bytes = bytes;
    Py_BEGIN_ALLOW_THREADS
    status = op(&be, args);
    Py_END_ALLOW_THREADS
    gt_block_free(&workspace);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
}
