/* The Model object shared by the binding files that take one (model.c, step.c). */
#ifndef GTPY_MODEL_H
#define GTPY_MODEL_H

#include "py/gtpy.h"

#include "nn/model.h"

typedef struct {
    PyObject_HEAD
    gt_model model;  /* the compiled layer tree and its arenas */
    int created;     /* 1 once gt_model_create ran (its arenas must be freed) */
    PyObject *grads_keeper; /* NULL, or the capsule that the NumPy views of the current gradient
                               arena have as base: it takes that arena over when the arena is
                               retired (gt_model_set_frozen) or the model dies, and frees it with
                               the last view */
    int busy;        /* 1 while a call (a training step, an EMA update, ...) uses it without the
                        GIL: every other call that reads or changes the model raises */
} ModelObject;

/* The gt_model inside a gputrain._C.Model, or NULL with TypeError naming `arg_name`. */
gt_model *gtpy_model_get(PyObject *module, PyObject *obj, const char *arg_name);

/* Marks a _C.Model busy for a call that uses it without the GIL (gtpy_enter): its gt_model,
 * or NULL with RuntimeError when another thread's call holds it. gtpy_model_leave ends it. */
gt_model *gtpy_model_enter(PyObject *obj);
void gtpy_model_leave(PyObject *obj);

/* The distinct _C.Model objects whose parameter or gradient arenas the NumPy arrays in the tuple
 * `arrays` view (found through their bases): a new tuple, empty when none does. */
PyObject *gtpy_model_owners(PyObject *arrays);

/* gtpy_model_enter on every model of a tuple from gtpy_model_owners, all or none: 0, or -1
 * with RuntimeError. gtpy_models_leave ends it. */
int gtpy_models_enter(PyObject *models);
void gtpy_models_leave(PyObject *models);

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
