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

/* Converts an argument to a C-contiguous array of float32 (kind 'f', finite values only) or
 * int64 (kind 'i'); fills `tensor` (on the CPU). Returns a new reference or NULL. */
PyArrayObject *gtpy_array_arg(PyObject *obj, const char *arg_name, char kind, gt_tensor *tensor);

/* 1 when the model's first leaf layer is an Embedding (its input is int64 ids). */
int gtpy_model_takes_ids(const gt_model *model);

#endif
