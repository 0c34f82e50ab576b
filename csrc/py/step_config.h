/* gputrain._C.StepConfig (csrc/py/step_config.c): the checked settings train_step takes. */
#ifndef GTPY_STEP_CONFIG_H
#define GTPY_STEP_CONFIG_H

#include "py/gtpy.h"

#include "train/step.h"

/* The settings of a StepConfig `obj` into *cfg, with its optimizer and scaler (borrowed, NULL
 * for None); -1 with TypeError naming `config` when obj is not one. */
int gtpy_step_config_get(PyObject *module, PyObject *obj, gt_step_config *cfg, PyObject **optimizer,
                         PyObject **scaler);

int gtpy_add_step_config(PyObject *module);

#endif
