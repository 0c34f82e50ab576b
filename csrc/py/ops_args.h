/* Argument checks of the op bindings (csrc/py/ops.c): arrays of an exact dtype, native byte
 * order, C-contiguous and aligned (writeable for outputs), with errors naming the argument. */
#ifndef GTPY_OPS_ARGS_H
#define GTPY_OPS_ARGS_H

#include <stdint.h>

#include "py/gtpy.h"

#include "core/tensor.h"

/* The NumPy type of an activation dtype's arrays: float32, float16, uint16 (bf16 bits). */
int gtpy_typenum_of(gt_dtype dt);

/* obj as a checked array (typenum < 0: any dtype); NULL with an exception naming `name`. */
PyArrayObject *gtpy_as_array(PyObject *obj, const char *name, int typenum, int writable);

/* Parses an activation dtype name ("f32", "f16", "bf16"); -1 with an exception. */
int gtpy_parse_act_dtype(PyObject *module, const char *text, const char *name, gt_dtype *dt);

/* An int argument in [0, max]; -1 with an exception. */
int gtpy_parse_uint(PyObject *obj, const char *name, unsigned long long max,
                    unsigned long long *out);

/* Raises ValueError "<name>: <what> <shape of a>"; returns -1. */
int gtpy_fail_shape(PyArrayObject *a, const char *name, const char *what);

/* 0 when a and b have the same shape; else -1 with an exception naming both. */
int gtpy_same_shape(PyArrayObject *a, const char *a_name, PyArrayObject *b, const char *b_name);

/* Splits an array of ndim >= 1 into (rows, cols) over its last dimension. */
int gtpy_rows_cols(PyArrayObject *a, const char *name, int64_t *rows, int64_t *cols);

/* A checked 1-D array of `size` elements of type typenum. */
PyArrayObject *gtpy_vector(PyObject *obj, const char *name, int typenum, int64_t size,
                           int writable);

#endif
