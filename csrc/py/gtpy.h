/* Shared declarations of the binding layer (csrc/py/). The only place PyObject appears. */
#ifndef GTPY_H
#define GTPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Oldest NumPy the runtime requirement allows (numpy>=1.25 in pyproject.toml). */
#define NPY_NO_DEPRECATED_API NPY_1_25_API_VERSION
#define NPY_TARGET_VERSION NPY_1_25_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL gtpy_ARRAY_API
#ifndef GTPY_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>
#include <numpy/npy_2_compat.h>

#include "core/device.h"
#include "core/status.h"

/* Per-module state (no globals): the exception types created in exec. */
typedef struct gtpy_state {
    PyObject *out_of_memory_error;  /* gputrain.OutOfMemoryError(MemoryError) */
    PyObject *cuda_error;           /* gputrain.CudaError(RuntimeError) */
    struct gtpy_held_list *held;    /* other libraries' arrays kept alive until the device work
                                       reading them has run (external.c); NULL until the first */
} gtpy_state;

extern PyModuleDef gtpy_module_def;

/* The state of the module object `module`. */
gtpy_state *gtpy_state_of(PyObject *module);

/* Raises the Python exception for a failed gt_status with the thread's message; returns NULL. */
PyObject *gtpy_raise(PyObject *module, gt_status status);

/* Same, for callers that return int: returns -1. */
int gtpy_raise_int(PyObject *module, gt_status status);

/* Marks an object busy (*busy = 1) for a call that uses it without the GIL; the caller sets
 * *busy = 0 when done. -1 with RuntimeError "the <what> is in use by another thread" when a
 * call in another thread holds it (checked and set under the GIL, so no lock is needed). */
int gtpy_enter(int *busy, const char *what);

/* Parses a device argument (None -> `fallback`), naming `arg_name` in errors. */
int gtpy_parse_device(PyObject *module, PyObject *obj, const char *arg_name, gt_device fallback,
                      gt_device *out);

/* dict[key] = value, stealing the new reference `value` (NULL: an error is already set). */
int gtpy_dict_put(PyObject *dict, const char *key, PyObject *value);

/* dict[key] = int(value). */
int gtpy_dict_put_size(PyObject *dict, const char *key, size_t value);

/* Registration functions, one per binding file, called from the module's exec slot. */
int gtpy_add_memory(PyObject *module);
int gtpy_add_memory_plan(PyObject *module);
int gtpy_add_runtime(PyObject *module);
int gtpy_add_buffer(PyObject *module);
int gtpy_add_model(PyObject *module);
int gtpy_add_step(PyObject *module);
int gtpy_add_cast(PyObject *module);
int gtpy_add_quant(PyObject *module);
int gtpy_add_cuda(PyObject *module);
int gtpy_add_cuda_copy(PyObject *module);
int gtpy_add_cuda_stream(PyObject *module);
int gtpy_add_cuda_event(PyObject *module);
int gtpy_add_scaler(PyObject *module);
int gtpy_add_optim(PyObject *module);
int gtpy_add_optim_model(PyObject *module);
int gtpy_add_ema(PyObject *module);
int gtpy_add_loader(PyObject *module);
int gtpy_add_ops(PyObject *module);
int gtpy_add_errors(PyObject *module);

/* The gt_scaler inside a gputrain.amp.GradScaler (or _C.Scaler); NULL with TypeError otherwise. */
struct gt_scaler *gtpy_scaler_get(PyObject *obj);

/* Marks a scaler (checked by gtpy_scaler_get) busy for a training step: its state, or NULL with
 * RuntimeError when another thread's step holds it. gtpy_scaler_leave ends it. */
struct gt_scaler *gtpy_scaler_enter(PyObject *obj);
void gtpy_scaler_leave(PyObject *obj);

/* The _C.Optimizer of a gputrain.optim optimizer (after pushing its param_groups' hyperparameters
 * into C), or obj itself when it is one: a new reference (it outlives a concurrent
 * add_param_group, which replaces the optimizer's core), or NULL with an exception. */
PyObject *gtpy_optimizer_core(PyObject *obj);

/* Marks an optimizer core (_C.Optimizer or _C.ModelOptimizer) busy for a training step: its
 * gt_optimizer, or NULL with RuntimeError when a call in another thread holds it.
 * gtpy_optimizer_leave ends it. */
struct gt_optimizer *gtpy_optimizer_enter(PyObject *core);
void gtpy_optimizer_leave(PyObject *core);

#endif
