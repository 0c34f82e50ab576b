/* The dataset's arrays as gather fields (csrc/data/gather.h): fixed rows from an ndarray,
 * ragged rows from a (values, offsets, pad[, width multiple]) tuple built by gputrain.data.RaggedArray. */
#include "py/loader.h"

/* The bytes of one item (a row of `array` without its first dimension; 0 for an empty
 * trailing shape); -1 with an exception when items are not contiguous or hold objects. */
static int item_bytes_of(PyArrayObject *array, Py_ssize_t index, size_t *bytes) {
    if (PyArray_NDIM(array) < 1) {
        PyErr_Format(PyExc_ValueError, "data: array %zd is 0-d; samples run along the first dimension", index);
        return -1;
    }
    if (PyDataType_REFCHK(PyArray_DESCR(array))) {
        PyErr_Format(PyExc_TypeError, "data: array %zd holds Python objects (dtype %R); use a numeric dtype",
                     index, (PyObject *)PyArray_DESCR(array));
        return -1;
    }
    *bytes = (size_t)PyArray_ITEMSIZE(array);
    int empty = PyArray_SIZE(array) == 0;  /* NumPy gives empty arrays arbitrary (zero) strides */
    for (int d = PyArray_NDIM(array) - 1; d >= 1; d--) {
        if (!empty && PyArray_DIM(array, d) > 1 && PyArray_STRIDE(array, d) != (npy_intp)*bytes) {
            PyErr_Format(PyExc_ValueError, "data: array %zd's rows are not contiguous; pass "
                         "numpy.ascontiguousarray(...) of it", index);
            return -1;
        }
        *bytes *= (size_t)PyArray_DIM(array, d);
    }
    return 0;
}

static int describe_array(PyArrayObject *array, Py_ssize_t index, gt_field *field, npy_intp *rows) {
    size_t bytes;
    if (item_bytes_of(array, index, &bytes) < 0)
        return -1;
    *field = (gt_field){.base = PyArray_BYTES(array), .row_stride = PyArray_STRIDE(array, 0),
                        .row_bytes = bytes};
    *rows = PyArray_DIM(array, 0);
    return 0;
}

/* Checks a ragged field's offsets: non-decreasing, within the values; returns the longest row. */
static int check_offsets(PyArrayObject *offsets, npy_intp num_items, Py_ssize_t index, size_t *max_items) {
    const int64_t *o = PyArray_DATA(offsets);
    npy_intp n = PyArray_DIM(offsets, 0) - 1;
    *max_items = 0;
    if (o[0] < 0 || o[n] > num_items) {
        PyErr_Format(PyExc_ValueError, "data: ragged array %zd's offsets run outside its %zd values", index,
                     (Py_ssize_t)num_items);
        return -1;
    }
    for (npy_intp i = 0; i < n; i++) {
        if (o[i + 1] < o[i]) {
            PyErr_Format(PyExc_ValueError, "data: ragged array %zd's offsets decrease at row %zd", index,
                         (Py_ssize_t)i);
            return -1;
        }
        size_t items = (size_t)(o[i + 1] - o[i]);
        *max_items = items > *max_items ? items : *max_items;
    }
    return 0;
}

static int describe_ragged(PyObject *spec, Py_ssize_t index, gt_field *field, npy_intp *rows) {
    PyArrayObject *values, *offsets, *pad;
    Py_ssize_t multiple = 1;
    if (!PyArg_ParseTuple(spec, "O!O!O!|n:ragged field", &PyArray_Type, &values, &PyArray_Type, &offsets,
                          &PyArray_Type, &pad, &multiple))
        return -1;
    if (multiple < 1 || multiple > 65536) {
        PyErr_Format(PyExc_ValueError, "data: ragged array %zd's width multiple must be in [1, 65536], got %zd",
                     index, multiple);
        return -1;
    }
    size_t item_bytes;
    if (item_bytes_of(values, index, &item_bytes) < 0)
        return -1;
    if (!PyArray_IS_C_CONTIGUOUS(values) || PyArray_TYPE(offsets) != NPY_INT64 || PyArray_NDIM(offsets) != 1 ||
        !PyArray_IS_C_CONTIGUOUS(offsets) || !PyArray_ISALIGNED(offsets) || PyArray_DIM(offsets, 0) < 1 ||
        !PyArray_EquivTypes(PyArray_DESCR(pad), PyArray_DESCR(values)) || !PyArray_IS_C_CONTIGUOUS(pad) ||
        (size_t)PyArray_NBYTES(pad) != item_bytes) {
        PyErr_Format(PyExc_ValueError, "data: ragged array %zd needs C-contiguous values, aligned int64 offsets "
                     "and one padding item of the values' dtype", index);
        return -1;
    }
    size_t max_items;
    if (check_offsets(offsets, PyArray_DIM(values, 0), index, &max_items) < 0)
        return -1;
    max_items += (size_t)multiple - 1 - (max_items + (size_t)multiple - 1) % (size_t)multiple;  /* rounded up */
    *field = (gt_field){.base = PyArray_BYTES(values), .row_bytes = max_items * item_bytes,
                        .offsets = PyArray_DATA(offsets), .item_bytes = item_bytes,
                        .pad = PyArray_BYTES(pad), .width_multiple = (size_t)multiple};
    *rows = PyArray_DIM(offsets, 0) - 1;
    return 0;
}

gt_field *gtpy_loader_describe_fields(PyObject *arrays, uint64_t *num_rows) {
    Py_ssize_t n = PyTuple_GET_SIZE(arrays);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "data: needs at least one array");
        return NULL;
    }
    gt_field *fields = PyMem_Calloc((size_t)n, sizeof *fields);
    if (!fields)
        return (gt_field *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(arrays, i);
        npy_intp rows;
        int rc;
        if (PyTuple_Check(item))
            rc = describe_ragged(item, i, &fields[i], &rows);
        else if (PyArray_Check(item))
            rc = describe_array((PyArrayObject *)item, i, &fields[i], &rows);
        else
            rc = (PyErr_Format(PyExc_TypeError, "data: array %zd must be a numpy.ndarray, not %.100s", i,
                               Py_TYPE(item)->tp_name), -1);
        if (rc < 0)
            goto fail;
        if (i > 0 && (uint64_t)rows != *num_rows) {
            PyErr_Format(PyExc_ValueError, "data: arrays must have the same first dimension, "
                         "got %llu and %zd", (unsigned long long)*num_rows, (Py_ssize_t)rows);
            goto fail;
        }
        *num_rows = (uint64_t)rows;
    }
    return fields;
fail:
    PyMem_Free(fields);
    return NULL;
}
