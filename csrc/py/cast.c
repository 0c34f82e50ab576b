/* Binding of the bulk conversions: _C.cast(array, dtype, *, src_dtype=None, out=None).
 * Works on bit patterns: bf16 arrays are uint16 here; python/gputrain/_cast.py adds ml_dtypes. */
#include "py/gtpy.h"

#include "core/cast.h"
#include "core/tensor.h"

/* The NumPy type that holds a dtype's elements (bf16 as its uint16 bit patterns). */
static int numpy_type_of(gt_dtype dtype) {
    return dtype == GT_F32 ? NPY_FLOAT : dtype == GT_F16 ? NPY_HALF : NPY_UINT16;
}

/* Parses a dtype string among f32/f16/bf16 (and their long names), naming `arg_name`. */
static int parse_cast_dtype(PyObject *obj, const char *arg_name, gt_dtype *out) {
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str ('f32', 'f16' or 'bf16'), not %.100s", arg_name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *text = PyUnicode_AsUTF8(obj);
    if (!text)
        return -1;
    if (gt_dtype_parse(text, arg_name, out) != GT_OK ||
        (*out != GT_F32 && *out != GT_F16 && *out != GT_BF16)) {
        gt_clear_error();
        PyErr_Format(PyExc_ValueError, "%s must be 'f32', 'f16' or 'bf16', got %R", arg_name, obj);
        return -1;
    }
    return 0;
}

/* The gputrain dtype of `array`'s elements: float32, float16, or uint16 bits named by src_dtype. */
static int source_dtype(PyArrayObject *array, PyObject *src_dtype_obj, gt_dtype *out) {
    int type = PyArray_TYPE(array);
    if (type != NPY_FLOAT && type != NPY_HALF && type != NPY_UINT16) {
        PyErr_Format(PyExc_TypeError,
                     "array must hold float32, float16 or uint16 bit patterns, not %R "
                     "(convert with .astype(np.float32) first)", (PyObject *)PyArray_DESCR(array));
        return -1;
    }
    if (src_dtype_obj == Py_None) {
        if (type == NPY_UINT16) {
            PyErr_SetString(PyExc_TypeError,
                            "array holds uint16: pass src_dtype='bf16' or 'f16' to say what the bits are");
            return -1;
        }
        *out = type == NPY_FLOAT ? GT_F32 : GT_F16;
        return 0;
    }
    if (parse_cast_dtype(src_dtype_obj, "src_dtype", out) < 0)
        return -1;
    if (numpy_type_of(*out) != type && !(type == NPY_UINT16 && *out == GT_F16)) {
        PyErr_Format(PyExc_ValueError, "src_dtype %R does not describe an array of %R", src_dtype_obj,
                     (PyObject *)PyArray_DESCR(array));
        return -1;
    }
    return 0;
}

static int same_shape(PyArrayObject *a, PyArrayObject *b) {
    return PyArray_NDIM(a) == PyArray_NDIM(b) &&
           PyArray_CompareLists(PyArray_DIMS(a), PyArray_DIMS(b), PyArray_NDIM(a));
}

/* Raises "out: shape (..) differs from array's shape (..)"; returns NULL. */
static PyArrayObject *shape_error(PyArrayObject *out, PyArrayObject *src) {
    PyObject *out_shape = PyArray_IntTupleFromIntp(PyArray_NDIM(out), PyArray_DIMS(out));
    PyObject *src_shape = PyArray_IntTupleFromIntp(PyArray_NDIM(src), PyArray_DIMS(src));
    if (out_shape && src_shape)
        PyErr_Format(PyExc_ValueError, "out: shape %R differs from array's shape %R", out_shape, src_shape);
    Py_XDECREF(out_shape);
    Py_XDECREF(src_shape);
    return NULL;
}

/* Checks a caller's `out` array; returns a new reference to it or NULL. */
static PyArrayObject *checked_out(PyObject *out_obj, PyArrayObject *src, gt_dtype dst_dtype) {
    if (!PyArray_Check(out_obj))
        return (PyArrayObject *)PyErr_Format(PyExc_TypeError, "out must be a numpy.ndarray, not %.100s",
                                             Py_TYPE(out_obj)->tp_name);
    PyArrayObject *out = (PyArrayObject *)out_obj;
    int type = PyArray_TYPE(out);
    int accepted = type == numpy_type_of(dst_dtype) || (dst_dtype == GT_F16 && type == NPY_UINT16);
    if (!accepted || !PyArray_ISNOTSWAPPED(out))
        return (PyArrayObject *)PyErr_Format(PyExc_TypeError, "out: dtype %R cannot hold '%s' results",
                                             (PyObject *)PyArray_DESCR(out), gt_dtype_name(dst_dtype));
    if (!PyArray_ISCARRAY(out))
        return (PyArrayObject *)PyErr_Format(PyExc_ValueError,
                                             "out must be C-contiguous, aligned and writeable");
    if (!same_shape(out, src))
        return shape_error(out, src);
    const char *a = PyArray_BYTES(src), *b = PyArray_BYTES(out);
    if (a < b + PyArray_NBYTES(out) && b < a + PyArray_NBYTES(src))
        return (PyArrayObject *)PyErr_Format(PyExc_ValueError, "out must not share memory with array");
    return (PyArrayObject *)Py_NewRef(out_obj);
}

static PyObject *cast(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"array", "dtype", "src_dtype", "out", NULL};
    PyObject *array_obj, *dtype_obj, *src_dtype_obj = Py_None, *out_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$OO:cast", keywords, &array_obj, &dtype_obj,
                                     &src_dtype_obj, &out_obj))
        return NULL;
    if (!PyArray_Check(array_obj))
        return PyErr_Format(PyExc_TypeError, "array must be a numpy.ndarray, not %.100s",
                            Py_TYPE(array_obj)->tp_name);
    gt_dtype src_dtype, dst_dtype;
    if (parse_cast_dtype(dtype_obj, "dtype", &dst_dtype) < 0 ||
        source_dtype((PyArrayObject *)array_obj, src_dtype_obj, &src_dtype) < 0)
        return NULL;
    PyArrayObject *src = (PyArrayObject *)PyArray_FROM_OTF(
        array_obj, PyArray_TYPE((PyArrayObject *)array_obj), NPY_ARRAY_IN_ARRAY);
    if (!src)
        return NULL;
    PyArrayObject *dst = out_obj == Py_None
        ? (PyArrayObject *)PyArray_SimpleNew(PyArray_NDIM(src), PyArray_DIMS(src), numpy_type_of(dst_dtype))
        : checked_out(out_obj, src, dst_dtype);
    if (!dst) {
        Py_DECREF(src);
        return NULL;
    }
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_cast(PyArray_DATA(src), src_dtype, PyArray_DATA(dst), dst_dtype, (size_t)PyArray_SIZE(src));
    Py_END_ALLOW_THREADS
    Py_DECREF(src);
    if (status != GT_OK) {
        Py_DECREF(dst);
        return gtpy_raise(module, status);
    }
    return (PyObject *)dst;
}

static PyMethodDef cast_methods[] = {
    {"cast", (PyCFunction)(void (*)(void))cast, METH_VARARGS | METH_KEYWORDS,
     "cast(array, dtype, *, src_dtype=None, out=None)\n--\n\n"
     "Convert float32/float16/uint16-bit-pattern arrays between 'f32', 'f16' and 'bf16' "
     "(round to nearest even; bf16 results are uint16 bit patterns)."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_cast(PyObject *module) { return PyModule_AddFunctions(module, cast_methods); }
