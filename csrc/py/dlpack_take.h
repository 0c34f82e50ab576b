/* The consumer's side of DLPack (dlpack.c), shared with the input conversion (external.c). */
#ifndef GTPY_DLPACK_TAKE_H
#define GTPY_DLPACK_TAKE_H

#include "py/external.h"

#include "py/dlpack.h"

/* A producer's tensor, not yet taken. */
typedef struct gtpy_dlpack {
    DLTensor *tensor;    /* inside the capsule's managed tensor */
    uint64_t flags;      /* DLPACK_FLAG_BITMASK_* (0 for an unversioned capsule) */
    PyObject *capsule;   /* the producer's capsule (a reference), still unused */
    int versioned;       /* 1: "dltensor_versioned" */
} gtpy_dlpack;

/* obj.__dlpack_device__() into `out`: 0, or -1 with an exception naming `arg_name`. */
int gtpy_dlpack_device(PyObject *obj, const char *arg_name, DLDevice *out);

/* The capsule of obj.__dlpack__(stream=`stream`, max_version=(1, 1)) (`stream` NULL: not
 * passed; a producer without max_version is asked again without it): 0, or -1 with an exception
 * naming `arg_name` (a DLPack 2.x or other capsule is refused before anything is read). */
int gtpy_dlpack_get(PyObject *obj, PyObject *stream, const char *arg_name, gtpy_dlpack *out);

/* Takes the tensor: renames the capsule "used_..." and returns an object whose destruction calls
 * the tensor's deleter (once); NULL with an exception, the capsule still the producer's. */
PyObject *gtpy_dlpack_take(gtpy_dlpack *d);

/* Drops the reference to the capsule (an untaken one frees its tensor through its destructor). */
void gtpy_dlpack_drop(gtpy_dlpack *d);

/* "float32", "int64", "bfloat16", ... */
void gtpy_dlpack_dtype_name(DLDataType dtype, char *buf, size_t bytes);

#endif
