/* gputrain._C_testing.op_copy: the table's copy and zero ops on NumPy arrays (CPU backend). */
#include "py_testing/testing.h"

#include <stdint.h>

#include "py/ops_args.h"

/* copy (src given) or zero (src None) of dst's bytes. */
static PyObject *op_copy(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dst", "src", NULL};
    PyObject *dst_obj, *src_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:op_copy", keywords, &dst_obj, &src_obj))
        return NULL;
    PyArrayObject *dst = gtpy_as_array(dst_obj, "dst", -1, 1), *src = NULL;
    if (!dst || (src_obj != Py_None && !(src = gtpy_as_array(src_obj, "src", -1, 0))))
        return NULL;
    size_t bytes = (size_t)PyArray_NBYTES(dst);
    if (src && (size_t)PyArray_NBYTES(src) != bytes)
        return PyErr_Format(PyExc_ValueError, "src: has %zu bytes, dst has %zu",
                            (size_t)PyArray_NBYTES(src), bytes);
    uintptr_t d = (uintptr_t)PyArray_DATA(dst), s = src ? (uintptr_t)PyArray_DATA(src) : 0;
    if (src && bytes > 0 && d < s + bytes && s < d + bytes)
        return PyErr_Format(PyExc_ValueError, "src: overlaps dst");
    gt_backend be = gtpy_cpu_backend();
    if (src)
        GTPY_RUN_OP(module, be.ops->copy(&be, PyArray_DATA(dst), PyArray_DATA(src), bytes));
    else
        GTPY_RUN_OP(module, be.ops->zero(&be, PyArray_DATA(dst), bytes));
    Py_RETURN_NONE;
}

static PyMethodDef op_copy_methods[] = {
    {"op_copy", GTPY_KW(op_copy), "op_copy(dst, src=None)\n--\n\nCopies src's bytes into dst, or zeroes dst."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_op_copy(PyObject *module) { return PyModule_AddFunctions(module, op_copy_methods); }
