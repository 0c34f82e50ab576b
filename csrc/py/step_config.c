/* gputrain._C.StepConfig: the settings of a training step (loss, micro-batches, clipping,
 * optimizer, scaler, guard, sync), checked once when built; train_step takes it with the batch
 * and the few values that change from call to call. TrainStep builds one and keeps it. */
#include "py/step_config.h"

#include <math.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    gt_step_config cfg;   /* the checked settings (loss, micro_batches, clipping, guard, deferred);
                             optimizer, scaler, comm, record, guard limits and lrs set per call */
    PyObject *optimizer;  /* the optimizer as given (its core is resolved per call), or NULL */
    PyObject *scaler;     /* the GradScaler (checked by gtpy_scaler_get), or NULL */
} StepConfigObject;

static int parse_loss(PyObject *spec, gt_loss *loss) {
    const char *kind = NULL;
    double smoothing = 0.0;
    long long ignore_index = -100;
    double rdrop_alpha = 0.0;
    if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "sdL|d", &kind, &smoothing, &ignore_index, &rdrop_alpha)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "loss must be a (kind, label_smoothing, ignore_index[, rdrop_alpha]) tuple");
        return -1;
    }
    if (!(rdrop_alpha >= 0.0 && isfinite(rdrop_alpha))) {
        PyErr_Format(PyExc_ValueError, "rdrop_alpha must be a finite number >= 0, got %g", rdrop_alpha);
        return -1;
    }
    loss->rdrop_alpha = (float)rdrop_alpha;
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

/* StepConfig(loss, *, micro_batches=1, ...): every keyword on a line of its own. */
static PyObject *step_config_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {
        "loss",            /* (kind, label_smoothing, ignore_index[, rdrop_alpha]), a loss function's _spec() */
        "micro_batches",   /* equal parts the batch splits into */
        "set_to_none",     /* the first backward writes the gradients (else they are zeroed) */
        "max_grad_norm",   /* clip the global L2 norm to this (<= 0: no clipping) */
        "want_grad_norm",  /* compute the norm without clipping (logging) */
        "optimizer",       /* the update (None: gradients only) */
        "scaler",          /* a GradScaler (None: no loss scaling) */
        "guard",           /* skip the update unless the per-call guard limits hold */
        "sync",            /* False: a device step that waits for nothing */
        NULL,
    };
    PyObject *loss_obj, *optimizer = Py_None, *scaler = Py_None;
    gt_step_config cfg = {.micro_batches = 1, .set_to_none = 1, .guard_loss = INFINITY, .guard_grad_norm = INFINITY};
    int sync = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs,
                                     "O"   /* loss */
                                     "|$i" /* micro_batches */
                                     "p"   /* set_to_none */
                                     "d"   /* max_grad_norm */
                                     "p"   /* want_grad_norm */
                                     "O"   /* optimizer */
                                     "O"   /* scaler */
                                     "p"   /* guard */
                                     "p"   /* sync */
                                     ":StepConfig",
                                     keywords, &loss_obj, &cfg.micro_batches, &cfg.set_to_none, &cfg.max_grad_norm,
                                     &cfg.want_grad_norm, &optimizer, &scaler, &cfg.guard, &sync))
        return NULL;
    if (parse_loss(loss_obj, &cfg.loss) < 0)
        return NULL;
    if (!isfinite(cfg.max_grad_norm))
        return PyErr_Format(PyExc_ValueError, "max_grad_norm must be finite, got %g", cfg.max_grad_norm);
    if (scaler != Py_None && !gtpy_scaler_get(scaler))
        return NULL;
    cfg.deferred = !sync;
    StepConfigObject *self = (StepConfigObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->cfg = cfg;
    self->optimizer = optimizer == Py_None ? NULL : Py_NewRef(optimizer);
    self->scaler = scaler == Py_None ? NULL : Py_NewRef(scaler);
    return (PyObject *)self;
}

static int step_config_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((StepConfigObject *)op)->optimizer);
    Py_VISIT(((StepConfigObject *)op)->scaler);
    return 0;
}

static int step_config_clear(PyObject *op) {
    Py_CLEAR(((StepConfigObject *)op)->optimizer);
    Py_CLEAR(((StepConfigObject *)op)->scaler);
    return 0;
}

static void step_config_dealloc(PyObject *op) {
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    step_config_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

int gtpy_step_config_get(PyObject *module, PyObject *obj, gt_step_config *cfg, PyObject **optimizer,
                         PyObject **scaler) {
    PyObject *type = PyObject_GetAttrString(module, "StepConfig");
    int ok = type && PyObject_TypeCheck(obj, (PyTypeObject *)type);
    Py_XDECREF(type);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "config must be a gputrain._C.StepConfig, not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    StepConfigObject *self = (StepConfigObject *)obj;
    *cfg = self->cfg;
    *optimizer = self->optimizer;
    *scaler = self->scaler;
    return 0;
}

static PyType_Slot step_config_slots[] = {
    {Py_tp_new, step_config_new},
    {Py_tp_dealloc, step_config_dealloc},
    {Py_tp_traverse, step_config_traverse},
    {Py_tp_clear, step_config_clear},
    {Py_tp_doc, "StepConfig(loss, *, micro_batches=1, set_to_none=True, max_grad_norm=0.0, want_grad_norm=False, "
                "optimizer=None, scaler=None, guard=False, sync=True)\n--\n\n"
                "The checked settings of train_step, built once: loss is a loss function's _spec() "
                "(kind, label_smoothing, ignore_index); max_grad_norm must be finite (<= 0: no clipping). "
                "With guard, the update is skipped unless loss <= guard_loss and the gradient norm <= "
                "guard_grad_norm (train_step's). With sync=False (a device model without guard; clipping runs "
                "on the device) the step waits for nothing; with a scaler too, the update is deferred (the "
                "optimizer resolves it later, see ModelOptimizer.deferred_result)."},
    {0, NULL},
};

static PyType_Spec step_config_spec = {
    .name = "gputrain._C.StepConfig",
    .basicsize = sizeof(StepConfigObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = step_config_slots,
};

int gtpy_add_step_config(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &step_config_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "StepConfig", type);
    Py_DECREF(type);
    return rc;
}
