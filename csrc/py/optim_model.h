/* _C.ModelOptimizer (csrc/py/optim_model.c), as the training step binding sees it. */
#ifndef GTPY_OPTIM_MODEL_H
#define GTPY_OPTIM_MODEL_H

#include "py/gtpy.h"
#include "train/optim.h"

/* The _C.ModelOptimizer of `obj` when it is one or a gputrain.optim ModelOptimizer (whose
 * param_groups' hyperparameters are pushed into C first): returns 1 with a new reference in
 * *core once it is checked to update `model_obj`; 0 when `obj` is neither (nothing set); -1
 * with a ValueError when it was built for another model, or any exception from the push. */
int gtpy_model_optimizer_resolve(PyObject *obj, PyObject *model_obj, PyObject **core);

/* Marks a _C.ModelOptimizer busy for a training step (gtpy_enter): its gt_optimizer, or NULL
 * with RuntimeError. gtpy_model_optimizer_leave ends it. */
gt_optimizer *gtpy_model_optimizer_enter(PyObject *core);
void gtpy_model_optimizer_leave(PyObject *core);

#endif
