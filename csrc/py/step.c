/* gputrain._C.train_step: the binding of the one-call training step (csrc/train/step.c). */
#include "py/gtpy.h"

#include <math.h>

#include "py/model.h"
#include "py/optim_model.h"
#include "train/step.h"

static int parse_loss(PyObject *spec, gt_loss *loss) {
    const char *kind = NULL;
    double smoothing = 0.0;
    long long ignore_index = -100;
    if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "sdL", &kind, &smoothing, &ignore_index)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "loss must be a (kind, label_smoothing, ignore_index) tuple");
        return -1;
    }
    if (strcmp(kind, "cross_entropy") == 0)
        loss->kind = GT_LOSS_CROSS_ENTROPY;
    else if (strcmp(kind, "mse") == 0)
        loss->kind = GT_LOSS_MSE;
    else {
        PyErr_Format(PyExc_ValueError, "loss: unknown kind '%s'", kind);
        return -1;
    }
    if (!(smoothing >= 0.0 && smoothing <= 1.0)) {
        PyErr_Format(PyExc_ValueError, "label_smoothing must be in [0, 1], got %g", smoothing);
        return -1;
    }
    loss->label_smoothing = (float)smoothing;
    loss->ignore_index = ignore_index;
    return 0;
}

/* The C optimizer of `obj` for `model`: a ModelOptimizer (for_model) must have been built for
 * this model; a host optimizer (over NumPy arrays, on the CPU) cannot update a model on CUDA. */
static int resolve_optimizer(PyObject *obj, PyObject *model_obj, const gt_model *model, gt_optimizer **out) {
    int found = gtpy_model_optimizer_resolve(obj, model_obj, out);
    if (found != 0)
        return found < 0 ? -1 : 0;
    if (model->backend.device.kind == GT_DEVICE_CUDA) {
        char device[32];
        gt_device_name(model->backend.device, device, sizeof device);
        PyErr_Format(PyExc_ValueError, "optimizer: the model is on %s but this optimizer updates host (cpu) "
                     "NumPy arrays; build it with AdamW.for_model(model) or SGD.for_model(model)", device);
        return -1;
    }
    *out = gtpy_optimizer_get(obj);
    return *out ? 0 : -1;
}

static PyObject *step_result(const gt_step_result *r) {
    return Py_BuildValue("{s:d,s:d,s:O,s:d}", "loss", r->loss, "grad_norm", r->grad_norm, "skipped",
                         r->skipped ? Py_True : Py_False, "scale", (double)r->scale);
}

static PyObject *train_step(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"model", "x", "y", "loss", "micro_batches", "set_to_none",
                               "max_grad_norm", "want_grad_norm", "optimizer", "scaler", NULL};
    PyObject *model_obj, *x_obj, *y_obj, *loss_obj, *optimizer_obj = Py_None, *scaler_obj = Py_None;
    gt_step_config cfg = {.micro_batches = 1, .set_to_none = 1};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|ipdpOO:train_step", keywords, &model_obj, &x_obj,
                                     &y_obj, &loss_obj, &cfg.micro_batches, &cfg.set_to_none,
                                     &cfg.max_grad_norm, &cfg.want_grad_norm, &optimizer_obj, &scaler_obj))
        return NULL;
    gt_model *model = gtpy_model_get(module, model_obj, "model");
    if (!model || parse_loss(loss_obj, &cfg.loss) < 0)
        return NULL;
    if (!isfinite(cfg.max_grad_norm))
        return PyErr_Format(PyExc_ValueError, "max_grad_norm must be finite, got %g", cfg.max_grad_norm);
    if (optimizer_obj != Py_None && resolve_optimizer(optimizer_obj, model_obj, model, &cfg.optimizer) < 0)
        return NULL;
    if (scaler_obj != Py_None && !(cfg.scaler = gtpy_scaler_get(scaler_obj)))
        return NULL;
    gt_tensor x, y;
    char x_kind = gtpy_model_takes_ids(model) ? 'i' : 'f', y_kind = cfg.loss.kind == GT_LOSS_MSE ? 'f' : 'i';
    PyArrayObject *x_given = gtpy_input_array(x_obj, "x", x_kind, &x), *y_given = NULL;
    if (!x_given || !(y_given = gtpy_input_array(y_obj, "y", y_kind, &y))) {
        Py_XDECREF(x_given);
        return NULL;
    }
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_train_step_prepare(model, &x, &y, &cfg);  /* shapes checked before any copy */
    Py_END_ALLOW_THREADS
    PyArrayObject *x_array = NULL, *y_array = NULL;
    if (status == GT_OK && (x_array = gtpy_input_data(module, x_given, "x", x_kind, &x)))
        y_array = gtpy_input_data(module, y_given, "y", y_kind, &y);
    Py_DECREF(x_given);
    Py_DECREF(y_given);
    if (!y_array) {
        Py_XDECREF(x_array);
        return status == GT_OK ? NULL : gtpy_raise(module, status);
    }
    gt_step_result result;
    Py_BEGIN_ALLOW_THREADS
    status = gt_train_step(model, &x, &y, &cfg, &result);
    Py_END_ALLOW_THREADS
    Py_DECREF(x_array);
    Py_DECREF(y_array);
    return status == GT_OK ? step_result(&result) : gtpy_raise(module, status);
}

static PyMethodDef step_methods[] = {
    {"train_step", (PyCFunction)(void (*)(void))train_step, METH_VARARGS | METH_KEYWORDS,
     "train_step(model, x, y, loss, micro_batches=1, set_to_none=True, max_grad_norm=0.0, "
     "want_grad_norm=False, optimizer=None, scaler=None)\n--\n\n"
     "One training step in C; returns {'loss', 'grad_norm', 'skipped', 'scale'}."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_step(PyObject *module) { return PyModule_AddFunctions(module, step_methods); }
