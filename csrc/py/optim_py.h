/* Shared by the optimizer binding files (csrc/py/optim.c, csrc/py/optim_device.c). */
#ifndef GTPY_OPTIM_PY_H
#define GTPY_OPTIM_PY_H

#include "py/gtpy.h"
#include "train/optim.h"

/* A group's hyperparameters from a dict with PyTorch's keys ("lr", "betas", "eps",
 * "weight_decay", "momentum", "dampening", "amsgrad", "nesterov", "maximize"); missing keys
 * take defaults. Returns -1 with TypeError/ValueError set. */
int gtpy_optim_parse_hparams(PyObject *dict, gt_optim_hparams *hp);

/* Registers optimizer_on_device and grad_sumsq_on_device (called by gtpy_add_optim). */
int gtpy_add_optim_device(PyObject *module);

#endif
