/* _C.ModelOptimizer (csrc/py/optim_model.c), as the training step binding sees it. */
#ifndef GTPY_OPTIM_MODEL_H
#define GTPY_OPTIM_MODEL_H

#include "py/gtpy.h"
#include "train/optim.h"

/* The C optimizer of `obj` when it is a _C.ModelOptimizer or a gputrain.optim ModelOptimizer
 * (whose param_groups' hyperparameters are pushed into C first): returns 1 with *out set once
 * it is checked to update `model_obj`; 0 when `obj` is neither (nothing set); -1 with a
 * ValueError when it was built for another model, or any exception from the push. */
int gtpy_model_optimizer_resolve(PyObject *obj, PyObject *model_obj, gt_optimizer **out);

#endif
