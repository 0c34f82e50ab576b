/* What the op bindings (csrc/py/ops.c, csrc/py_testing/ops_cnn.c) share: argument checks of arrays of an exact
 * dtype, native byte order, C-contiguous and aligned (writeable for outputs), with errors naming
 * the argument; and running an op on the CPU backend with the GIL released. */
#ifndef GTPY_OPS_ARGS_H
#define GTPY_OPS_ARGS_H

#include <stdint.h>

#include "py/gtpy.h"

#include "core/tensor.h"
#include "ops/ops.h"

/* A METH_VARARGS | METH_KEYWORDS entry of a PyMethodDef table. */
#define GTPY_KW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS

/* The NumPy type of an activation dtype's arrays: float32, float16, uint16 (bf16 bits). */
int gtpy_typenum_of(gt_dtype dt);

/* obj as a checked array (typenum < 0: any dtype); NULL with an exception naming `name`. */
PyArrayObject *gtpy_as_array(PyObject *obj, const char *name, int typenum, int writable);

/* Parses an activation dtype name ("f32", "f16", "bf16") into *dt; returns the NumPy type of its
 * arrays (gtpy_typenum_of), or -1 with an exception. */
int gtpy_parse_act_dtype(PyObject *module, const char *text, const char *name, gt_dtype *dt);

/* An int argument in [0, max]; -1 with an exception. */
int gtpy_parse_uint(PyObject *obj, const char *name, unsigned long long max,
                    unsigned long long *out);

/* The Philox key of a dropout mask from the arguments seed, layer, step and offset; -1 with an
 * exception. */
int gtpy_parse_dropout_key(PyObject *seed, PyObject *layer, PyObject *step, PyObject *offset,
                           gt_dropout_key *key);

/* Raises ValueError "<name>: <what> <shape of a>"; returns -1. */
int gtpy_fail_shape(PyArrayObject *a, const char *name, const char *what);

/* 0 when a and b have the same shape; else -1 with an exception naming both. */
int gtpy_same_shape(PyArrayObject *a, const char *a_name, PyArrayObject *b, const char *b_name);

/* A checked array with the shape of `like` (named like_name in the error). */
PyArrayObject *gtpy_array_like(PyObject *obj, const char *name, int typenum, int writable,
                               PyArrayObject *like, const char *like_name);

/* As gtpy_array_like into *data, which is NULL when obj is None; -1 with an exception. */
int gtpy_optional_like(PyObject *obj, const char *name, int typenum, int writable,
                       PyArrayObject *like, const char *like_name, void **data);

/* A checked array of `ndim` dimensions equal to dims (NULL: any extents); the error says what. */
PyArrayObject *gtpy_array_nd(PyObject *obj, const char *name, int typenum, int writable, int ndim,
                             const int64_t *dims, const char *what);

/* As gtpy_array_nd into *data, which is NULL when obj is None; -1 with an exception. */
int gtpy_optional_nd(PyObject *obj, const char *name, int typenum, int writable, int ndim,
                     const int64_t *dims, const char *what, void **data);

/* Splits an array of ndim >= 1 into (rows, cols) over its last dimension. */
int gtpy_rows_cols(PyArrayObject *a, const char *name, int64_t *rows, int64_t *cols);

/* A checked 1-D array of `size` elements of type typenum. */
PyArrayObject *gtpy_vector(PyObject *obj, const char *name, int typenum, int64_t size,
                           int writable);

/* As gtpy_vector into *data, which is NULL when obj is None; -1 with an exception. */
int gtpy_optional_vector(PyObject *obj, const char *name, int typenum, int64_t size, int writable,
                         void **data);

/* The CPU backend without scratch memory. */
gt_backend gtpy_cpu_backend(void);

/* Runs `call` (a gt_status expression) without the GIL; returns NULL from the calling function
 * with the error raised when it fails. */
#define GTPY_RUN_OP(module, call)                               \
    do {                                                        \
        gt_status status_;                                      \
        Py_BEGIN_ALLOW_THREADS                                  \
        status_ = (call);                                       \
        Py_END_ALLOW_THREADS                                    \
        if (status_ != GT_OK)                                   \
            return gtpy_raise((module), status_);               \
    } while (0)

/* An op of the table on its arguments (a gt_*_args struct). */
typedef gt_status (*gtpy_op_fn)(gt_backend *be, const void *args);

/* Runs op(args) without the GIL on the CPU backend with `bytes` of scratch memory of its own
 * (0: none); None, or NULL with the error raised. */
PyObject *gtpy_run_with_workspace(PyObject *module, gtpy_op_fn op, const void *args, size_t bytes);

#endif
