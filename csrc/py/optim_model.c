/* gputrain._C.ModelOptimizer: the fused AdamW/SGD (csrc/train/optim.h) over a compiled
 * model's own parameter and gradient arenas, on the model's device (cpu or cuda:N), with one
 * parameter descriptor per model parameter (parameter_layout order). It is how a model on
 * CUDA, whose arenas NumPy cannot view, gets an optimizer for the one-call training step. */
#include "py/optim_model.h"

#include "py/model.h"
#include "py/optim_py.h"

typedef struct {
    PyObject_HEAD
    gt_optimizer *opt;   /* the C optimizer; NULL only while being built */
    PyObject *model;     /* the _C.Model whose arenas opt points into (kept alive) */
    size_t *numels;      /* (num_params,) elements of each parameter, PyMem */
    size_t num_params;   /* parameters of the model */
    int busy;            /* 1 while a training step uses it without the GIL (other calls raise) */
} ModelOptimizerObject;

static const char *const slot_names[GT_SLOT_COUNT] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                                      "momentum_buffer"};

static PyObject *module_of(PyObject *self) { return PyType_GetModuleByDef(Py_TYPE(self), &gtpy_module_def); }

static int parse_kind(const char *kind, const char *numerics, gt_optimizer_config *config) {
    int kind_ok = strcmp(kind, "adamw") == 0 || strcmp(kind, "sgd") == 0;
    int numerics_ok = strcmp(numerics, "exact") == 0 || strcmp(numerics, "fast") == 0;
    if (!kind_ok || !numerics_ok) {
        PyErr_Format(PyExc_ValueError, "kind must be 'adamw' or 'sgd' and numerics 'exact' or 'fast', got '%s', '%s'",
                     kind, numerics);
        return -1;
    }
    config->kind = strcmp(kind, "sgd") == 0 ? GT_OPTIM_SGD : GT_OPTIM_ADAMW;
    config->numerics = strcmp(numerics, "fast") == 0 ? GT_NUMERICS_FAST : GT_NUMERICS_EXACT;
    return 0;
}

/* numel of one (offset, shape) entry of parameter_layout(), checked to lie inside the arena. */
static int layout_entry(PyObject *entry, size_t index, size_t arena_numel, size_t *offset, size_t *numel) {
    Py_ssize_t start = 0;
    PyObject *shape = NULL;
    if (!PyArg_ParseTuple(entry, "nO!", &start, &PyTuple_Type, &shape))
        return -1;
    size_t count = 1;
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); d++) {
        Py_ssize_t extent = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (extent < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "parameter_layout()[%zu]: negative extent", index);
            return -1;
        }
        count *= (size_t)extent;
    }
    if (start < 0 || (size_t)start > arena_numel || count > arena_numel - (size_t)start) {
        PyErr_Format(PyExc_ValueError, "parameter_layout()[%zu] lies outside the %zu-element arena", index,
                     arena_numel);
        return -1;
    }
    *offset = (size_t)start;
    *numel = count;
    return 0;
}

/* One descriptor per model parameter, pointing into the model's parameter and gradient arenas. */
static int build_descs(ModelOptimizerObject *self, gt_model *model, PyObject *layout, gt_optim_param_desc *descs) {
    for (size_t i = 0; i < self->num_params; i++) {
        size_t offset = 0;
        if (layout_entry(PyList_GET_ITEM(layout, (Py_ssize_t)i), i, model->num_params, &offset,
                         &self->numels[i]) < 0)
            return -1;
        descs[i] = (gt_optim_param_desc){(float *)model->params.block.ptr + offset,
                                         (float *)model->grads.block.ptr + offset, self->numels[i], 0};
    }
    return 0;
}

static int create_core(ModelOptimizerObject *self, PyObject *module, gt_optimizer_config *config,
                       const gt_optim_hparams *hparams) {
    gt_model *model = gtpy_model_get(module, self->model, "model");
    PyObject *layout = model ? PyObject_CallMethod(self->model, "parameter_layout", NULL) : NULL;
    if (!layout)
        return -1;
    int rc = -1;
    gt_optim_param_desc *descs = NULL;
    self->num_params = PyList_Check(layout) ? (size_t)PyList_GET_SIZE(layout) : 0;
    self->numels = PyMem_Calloc(self->num_params ? self->num_params : 1, sizeof *self->numels);
    descs = PyMem_Calloc(self->num_params ? self->num_params : 1, sizeof *descs);
    if (!PyList_Check(layout))
        PyErr_SetString(PyExc_TypeError, "model.parameter_layout() must return a list");
    else if (!self->numels || !descs)
        PyErr_NoMemory();
    else if (build_descs(self, model, layout, descs) == 0) {
        config->device = model->backend.device;
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = gt_optimizer_create(config, hparams, 1, descs, self->num_params, &self->opt);
        Py_END_ALLOW_THREADS
        rc = status == GT_OK ? 0 : gtpy_raise_int(module, status);
    }
    PyMem_Free(descs);
    Py_DECREF(layout);
    return rc;
}

static PyObject *model_optimizer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"kind", "model", "hparams", "numerics", NULL};
    const char *kind = NULL, *numerics = "exact";
    PyObject *model_obj, *hparams_obj;
    gt_optimizer_config config = {.compute_stream = NULL};
    gt_optim_hparams hparams;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOO|$s:ModelOptimizer", keywords, &kind, &model_obj,
                                     &hparams_obj, &numerics))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module || parse_kind(kind, numerics, &config) < 0 || gtpy_optim_parse_hparams(hparams_obj, &hparams) < 0)
        return NULL;
    ModelOptimizerObject *self = (ModelOptimizerObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->model = Py_NewRef(model_obj);
    if (create_core(self, module, &config, &hparams) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int model_optimizer_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((ModelOptimizerObject *)op)->model);
    return 0;
}

static int model_optimizer_clear(PyObject *op) {
    Py_CLEAR(((ModelOptimizerObject *)op)->model);
    return 0;
}

static void model_optimizer_dealloc(PyObject *op) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    gt_optimizer_destroy(self->opt);
    self->opt = NULL;
    PyMem_Free(self->numels);
    self->numels = NULL;
    model_optimizer_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *model_optimizer_set_hparams(PyObject *op, PyObject *args) {
    Py_ssize_t group = 0;
    PyObject *dict = NULL;
    gt_optim_hparams hp;
    if (!PyArg_ParseTuple(args, "nO:set_hparams", &group, &dict) || gtpy_optim_parse_hparams(dict, &hp) < 0)
        return NULL;
    if (group != 0)
        return PyErr_Format(PyExc_IndexError, "group %zd out of range (1 group)", group);
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    if (gtpy_enter(&self->busy, "optimizer") < 0)
        return NULL;
    gt_status status = gt_optimizer_set_hparams(self->opt, 0, &hp);
    self->busy = 0;
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

/* A state slot of parameter `index` as a new float32 host array in `dict`. */
static int put_slot(ModelOptimizerObject *self, PyObject *dict, size_t index, gt_optim_slot slot) {
    npy_intp numel = (npy_intp)self->numels[index];
    PyObject *array = PyArray_SimpleNew(1, &numel, NPY_FLOAT32);
    if (!array)
        return -1;
    gt_status status = gt_optimizer_read_state(self->opt, index, slot, (float *)PyArray_DATA((PyArrayObject *)array));
    int rc = status == GT_OK ? PyDict_SetItemString(dict, slot_names[slot], array)
                             : gtpy_raise_int(module_of((PyObject *)self), status);
    Py_DECREF(array);
    return rc;
}

static PyObject *model_optimizer_get_state(PyObject *op, PyObject *arg) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    Py_ssize_t index = PyLong_AsSsize_t(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index < 0 || (size_t)index >= self->num_params)
        return PyErr_Format(PyExc_IndexError, "parameter index %zd out of range (%zu parameters)", index,
                            self->num_params);
    if (gtpy_enter(&self->busy, "optimizer") < 0)  /* not read half-updated by a step */
        return NULL;
    int64_t step = 0;
    gt_optimizer_get_param_step(self->opt, (size_t)index, &step);
    PyObject *dict = PyDict_New(), *step_obj = PyLong_FromLongLong(step);
    int ok = dict && step_obj && PyDict_SetItemString(dict, "step", step_obj) == 0;
    for (int s = 0; ok && s < GT_SLOT_COUNT; s++)
        if (gt_optimizer_has_slot(self->opt, (gt_optim_slot)s))
            ok = put_slot(self, dict, (size_t)index, (gt_optim_slot)s) == 0;
    self->busy = 0;
    Py_XDECREF(step_obj);
    if (!ok)
        Py_CLEAR(dict);
    return dict;
}

static PyObject *model_optimizer_set_state(PyObject *op, PyObject *args) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    Py_ssize_t index = 0, step = 0;
    PyObject *slots = NULL;
    if (!PyArg_ParseTuple(args, "nnO!:set_state", &index, &step, &PyDict_Type, &slots))
        return NULL;
    if (index < 0 || (size_t)index >= self->num_params)
        return PyErr_Format(PyExc_IndexError, "parameter index %zd out of range (%zu parameters)", index,
                            self->num_params);
    if (gtpy_enter(&self->busy, "optimizer") < 0)  /* not under a step running in another thread */
        return NULL;
    PyObject *result = gtpy_optim_write_state(module_of(op), self->opt, index, step, slots,
                                              (npy_intp)self->numels[index]);
    self->busy = 0;
    return result;
}

static PyObject *model_optimizer_get_num_steps(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(gt_optimizer_num_steps(((ModelOptimizerObject *)op)->opt));
}

static PyObject *model_optimizer_get_model(PyObject *op, void *Py_UNUSED(closure)) {
    return Py_NewRef(((ModelOptimizerObject *)op)->model);
}

static PyMethodDef model_optimizer_methods[] = {
    {"set_hparams", model_optimizer_set_hparams, METH_VARARGS,
     "set_hparams(group, dict)\n--\n\nReplace the hyperparameters of the (only) group 0 (PyTorch's keys)."},
    {"get_state", model_optimizer_get_state, METH_O,
     "get_state(index)\n--\n\nA parameter's state: {'step': int, slot name: float32 host copy}."},
    {"set_state", model_optimizer_set_state, METH_VARARGS,
     "set_state(index, step, slots)\n--\n\nLoad a parameter's step count and state arrays (host arrays)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_optimizer_getset[] = {
    {"num_steps", model_optimizer_get_num_steps, NULL, "Steps that updated at least one parameter.", NULL},
    {"model", model_optimizer_get_model, NULL, "The _C.Model whose arenas this optimizer updates.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot model_optimizer_slots[] = {
    {Py_tp_new, model_optimizer_new},
    {Py_tp_dealloc, model_optimizer_dealloc},
    {Py_tp_traverse, model_optimizer_traverse},
    {Py_tp_clear, model_optimizer_clear},
    {Py_tp_methods, model_optimizer_methods},
    {Py_tp_getset, model_optimizer_getset},
    {Py_tp_doc, "ModelOptimizer(kind, model, hparams, *, numerics='exact')\n--\n\n"
                "The fused C AdamW ('adamw') or SGD ('sgd') over a _C.Model's parameter and gradient "
                "arenas on the model's device; one hyperparameter group."},
    {0, NULL},
};

static PyType_Spec model_optimizer_spec = {
    .name = "gputrain._C.ModelOptimizer",
    .basicsize = sizeof(ModelOptimizerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = model_optimizer_slots,
};

static int is_model_optimizer(PyObject *obj) {
    return PyType_GetSlot(Py_TYPE(obj), Py_tp_dealloc) == (void *)model_optimizer_dealloc;
}

/* obj itself, or its `_core` after push_hyperparameters(), when that is a ModelOptimizer (a
 * new reference in *core). */
static int find_core(PyObject *obj, ModelOptimizerObject **core) {
    if (is_model_optimizer(obj)) {
        *core = (ModelOptimizerObject *)Py_NewRef(obj);
        return 1;
    }
    PyObject *inner = PyObject_GetAttrString(obj, "_core");
    if (!inner) {
        PyErr_Clear();
        return 0;
    }
    if (!is_model_optimizer(inner)) {
        Py_DECREF(inner);
        return 0;
    }
    *core = (ModelOptimizerObject *)inner;
    PyObject *pushed = PyObject_CallMethod(obj, "push_hyperparameters", NULL);
    Py_XDECREF(pushed);
    if (!pushed)
        Py_CLEAR(*core);
    return pushed ? 1 : -1;
}

int gtpy_model_optimizer_resolve(PyObject *obj, PyObject *model_obj, PyObject **core_out) {
    ModelOptimizerObject *core = NULL;
    int found = find_core(obj, &core);
    if (found <= 0)
        return found;
    if (core->model != model_obj) {
        Py_DECREF(core);
        PyErr_SetString(PyExc_ValueError, "optimizer: it was built for another model (for_model(model) "
                                          "binds the optimizer to that model's arenas)");
        return -1;
    }
    *core_out = (PyObject *)core;
    return 1;
}

gt_optimizer *gtpy_model_optimizer_enter(PyObject *core) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)core;
    return gtpy_enter(&self->busy, "optimizer") == 0 ? self->opt : NULL;
}

void gtpy_model_optimizer_leave(PyObject *core) { ((ModelOptimizerObject *)core)->busy = 0; }

int gtpy_add_optim_model(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &model_optimizer_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "ModelOptimizer", type);
    Py_DECREF(type);
    return rc;
}
