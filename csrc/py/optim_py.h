/* Shared by the optimizer binding files (csrc/py/optim.c, optim_model.c; csrc/py_testing/optim_device.c). */
#ifndef GTPY_OPTIM_PY_H
#define GTPY_OPTIM_PY_H

#include "py/gtpy.h"
#include "train/optim.h"

/* A group's hyperparameters from a dict with PyTorch's keys ("lr", "betas", "eps",
 * "weight_decay", "momentum", "dampening", "amsgrad", "nesterov", "maximize"); missing keys
 * take defaults. Returns -1 with TypeError/ValueError set. */
int gtpy_optim_parse_hparams(PyObject *dict, gt_optim_hparams *hp);

/* gtpy_optim_parse_hparams of each dict of the fast sequence `hparams` into out[g]; -1 with an
 * exception. */
int gtpy_optim_parse_all_hparams(PyObject *hparams, gt_optim_hparams *out);

/* Parameter `index`'s state of `opt` as a new dict: "step" and each slot it keeps (a new float32
 * host array of `numel`). NULL with an exception set. */
PyObject *gtpy_optim_read_state(PyObject *module, gt_optimizer *opt, size_t index, npy_intp numel);

/* Sets parameter `index`'s step (>= 0) and the state arrays given in `slots` (slot name ->
 * array of `numel` floats; None or absent: left as is) of `opt`, on its device. Everything is
 * checked before anything is written. Returns None, or NULL with an exception set. */
PyObject *gtpy_optim_write_state(PyObject *module, gt_optimizer *opt, Py_ssize_t index, Py_ssize_t step,
                                 PyObject *slots, npy_intp numel);

/* The two above for an 8-bit AdamW (csrc/py/optim8.c): its fields, by this parameter's format. */
PyObject *gtpy_optim8_read_state(PyObject *module, gt_optimizer *opt, size_t index);
PyObject *gtpy_optim8_write_state(PyObject *module, gt_optimizer *opt, Py_ssize_t index, Py_ssize_t step,
                                  PyObject *slots);

/* "adamw", "sgd" or "adamw8bit" as a gt_optim_kind; -1 with ValueError naming `kind` otherwise. */
int gtpy_optim_parse_kind(const char *kind, gt_optim_kind *out);

#endif
