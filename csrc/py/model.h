/* The Model object shared by the binding files that take one (model.c, step.c). */
#ifndef GTPY_MODEL_H
#define GTPY_MODEL_H

#include "py/gtpy.h"

#include "nn/model.h"

typedef struct {
    PyObject_HEAD
    gt_model model;  /* the compiled layer tree and its arenas */
    int created;     /* 1 once gt_model_create ran (its arenas must be freed) */
} ModelObject;

/* The gt_model inside a gputrain._C.Model, or NULL with TypeError naming `arg_name`. */
gt_model *gtpy_model_get(PyObject *module, PyObject *obj, const char *arg_name);

/* Checks an input argument without copying an array: float32 (kind 'f') or any integer dtype
 * (kind 'i'), 1 to GT_MAX_DIMS dimensions, any memory layout (other objects are converted). Fills
 * `shape` (dtype f32 or i64, on the CPU, ptr NULL). Returns a new reference, or NULL with an
 * exception naming `arg_name`. */
PyArrayObject *gtpy_input_array(PyObject *obj, const char *arg_name, char kind, gt_tensor *shape);

/* The data of a checked input as a C-contiguous float32 (finite values only) or int64 array: the
 * array itself, or a copy (a NumPy MemoryError becomes OutOfMemoryError). Sets tensor->ptr.
 * Returns a new reference or NULL with an exception. */
PyArrayObject *gtpy_input_data(PyObject *module, PyArrayObject *array, const char *arg_name, char kind,
                               gt_tensor *tensor);

/* 1 when the model's first leaf layer is an Embedding (its input is int64 ids). */
int gtpy_model_takes_ids(const gt_model *model);

#endif
