/* gputrain._C.Optimizer: the fused AdamW/SGD (csrc/train/optim.h) over NumPy parameter
 * arrays, and the gradient-norm functions. The Python classes in gputrain.optim wrap it. */
#include "py/args.h"

#include "core/alloc.h"
#include "train/grad_norm.h"
#include "train/optim.h"
#include "train/optim_cpu.h"
#include "py/model.h"
#include "py/optim_model.h"
#include "py/optim_py.h"

typedef struct {
    PyObject_HEAD
    gt_optimizer *opt;        /* the C optimizer; NULL only while being built */
    PyObject *params;         /* tuple of the parameter arrays (kept alive: opt points into them) */
    PyObject *default_grads;  /* tuple of gradient arrays or None, the pointers steps fall back to */
    PyObject *models;         /* tuple of the _C.Models whose arenas params view (held busy by steps) */
    int busy;                 /* 1 while a call (its own step, a training step) uses it without the
                                 GIL: every other call raises "in use by another thread" */
} OptimizerObject;

static const char *const slot_names[GT_SLOT_COUNT] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                                      "momentum_buffer"};

static PyObject *module_of(PyObject *self) { return PyType_GetModuleByDef(Py_TYPE(self), &gtpy_module_def); }

/* ------------------------------------------------------------ argument parsing ---- */

/* A float32, C-contiguous array of `numel` elements (writeable when asked), or -1. */
static int check_array(PyObject *obj, const char *what, Py_ssize_t index, Py_ssize_t numel, int writeable) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] must be a NumPy array, not %.100s", what, index,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *array = (PyArrayObject *)obj;
    if (PyArray_TYPE(array) != NPY_FLOAT32) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] must be float32, got %S", what, index, PyArray_DESCR(array));
        return -1;
    }
    if (!PyArray_IS_C_CONTIGUOUS(array) || (writeable && !PyArray_ISWRITEABLE(array))) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] must be a C-contiguous%s array", what, index,
                     writeable ? ", writeable" : "");
        return -1;
    }
    if (numel >= 0 && PyArray_SIZE(array) != numel) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] has %zd elements, expected %zd", what, index,
                     (Py_ssize_t)PyArray_SIZE(array), numel);
        return -1;
    }
    return 0;
}

static int get_double(PyObject *dict, const char *key, double fallback, double *out) {
    PyObject *value = PyDict_GetItemString(dict, key);
    if (!value) {
        *out = fallback;
        return 0;
    }
    *out = PyFloat_AsDouble(value);
    if (*out == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s must be a number, not %.100s", key, Py_TYPE(value)->tp_name);
        return -1;
    }
    return 0;
}

static int get_bool(PyObject *dict, const char *key, int *out) {
    PyObject *value = PyDict_GetItemString(dict, key);
    *out = value ? PyObject_IsTrue(value) : 0;
    return *out < 0 ? -1 : 0;
}

static int get_betas(PyObject *dict, gt_optim_hparams *hp) {
    PyObject *betas = PyDict_GetItemString(dict, "betas");
    hp->beta1 = 0.9;
    hp->beta2 = 0.999;
    if (!betas)
        return 0;
    PyObject *seq = PySequence_Fast(betas, "betas must be a pair of floats");
    if (!seq)
        return -1;
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(seq) != 2)
        PyErr_Format(PyExc_ValueError, "betas must have 2 elements, got %zd", PySequence_Fast_GET_SIZE(seq));
    else if (!((hp->beta1 = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, 0))) == -1.0 && PyErr_Occurred()) &&
             !((hp->beta2 = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, 1))) == -1.0 && PyErr_Occurred()))
        rc = 0;
    Py_DECREF(seq);
    return rc;
}

int gtpy_optim_parse_hparams(PyObject *dict, gt_optim_hparams *hp) {
    if (!PyDict_Check(dict)) {
        PyErr_Format(PyExc_TypeError, "hyperparameters must be a dict, not %.100s", Py_TYPE(dict)->tp_name);
        return -1;
    }
    memset(hp, 0, sizeof *hp);
    if (get_double(dict, "lr", 1e-3, &hp->lr) < 0 || get_double(dict, "weight_decay", 0.0, &hp->weight_decay) < 0 ||
        get_double(dict, "eps", 1e-8, &hp->eps) < 0 || get_double(dict, "momentum", 0.0, &hp->momentum) < 0 ||
        get_double(dict, "dampening", 0.0, &hp->dampening) < 0 || get_betas(dict, hp) < 0 ||
        get_bool(dict, "amsgrad", &hp->amsgrad) < 0 || get_bool(dict, "nesterov", &hp->nesterov) < 0 ||
        get_bool(dict, "maximize", &hp->maximize) < 0)
        return -1;
    return 0;
}

static int parse_kind(PyObject *module, const char *kind, const char *numerics, gt_optimizer_config *config) {
    if (gtpy_optim_parse_kind(kind, &config->kind) < 0)
        return -1;
    if (strcmp(numerics, "exact") == 0)
        config->numerics = GT_NUMERICS_EXACT;
    else if (strcmp(numerics, "fast") == 0)
        config->numerics = GT_NUMERICS_FAST;
    else {
        PyErr_Format(PyExc_ValueError, "numerics must be 'exact' or 'fast', got '%s'", numerics);
        return -1;
    }
    return 0;
}

/* Gradient pointers from a sequence of arrays or None matching the parameters. */
static int gather_grads(OptimizerObject *self, PyObject *grads, float **out) {
    Py_ssize_t n = PyTuple_GET_SIZE(self->params);
    if (PySequence_Fast_GET_SIZE(grads) != n) {
        PyErr_Format(PyExc_ValueError, "grads has %zd entries, expected one per parameter (%zd)",
                     PySequence_Fast_GET_SIZE(grads), n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *g = PySequence_Fast_GET_ITEM(grads, i);
        PyArrayObject *p = (PyArrayObject *)PyTuple_GET_ITEM(self->params, i);
        out[i] = NULL;
        if (g == Py_None)
            continue;
        if (check_array(g, "grads", i, PyArray_SIZE(p), 0) < 0)
            return -1;
        out[i] = (float *)PyArray_DATA((PyArrayObject *)g);
    }
    return 0;
}

/* ------------------------------------------------------------ construction -------- */

static int build_descs(PyObject *params, PyObject *groups, PyObject *grads, Py_ssize_t num_groups,
                       gt_optim_param_desc *descs) {
    Py_ssize_t n = PyTuple_GET_SIZE(params);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyTuple_GET_ITEM(params, i), *g = PyTuple_GET_ITEM(grads, i);
        if (check_array(p, "params", i, -1, 1) < 0)
            return -1;
        Py_ssize_t numel = PyArray_SIZE((PyArrayObject *)p);
        if (g != Py_None && check_array(g, "grads", i, numel, 0) < 0)
            return -1;
        Py_ssize_t group = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(groups, i));
        if (group == -1 && PyErr_Occurred())
            return -1;
        if (group < 0 || group >= num_groups) {
            PyErr_Format(PyExc_IndexError, "groups[%zd] = %zd is out of range (%zd groups)", i, group, num_groups);
            return -1;
        }
        descs[i] = (gt_optim_param_desc){(float *)PyArray_DATA((PyArrayObject *)p),
                                         g == Py_None ? NULL : (float *)PyArray_DATA((PyArrayObject *)g),
                                         (size_t)numel, (size_t)group};
    }
    return 0;
}

int gtpy_optim_parse_all_hparams(PyObject *hparams, gt_optim_hparams *out) {
    for (Py_ssize_t g = 0; g < PySequence_Fast_GET_SIZE(hparams); g++)
        if (gtpy_optim_parse_hparams(PySequence_Fast_GET_ITEM(hparams, g), &out[g]) < 0)
            return -1;
    return 0;
}

/* Creates the C optimizer from parsed Python sequences (all fast sequences/tuples). */
static int create_core(OptimizerObject *self, PyObject *module, gt_optimizer_config *config,
                       PyObject *groups, PyObject *hparams) {
    Py_ssize_t n = PyTuple_GET_SIZE(self->params), num_groups = PySequence_Fast_GET_SIZE(hparams);
    if (PySequence_Fast_GET_SIZE(groups) != n || PyTuple_GET_SIZE(self->default_grads) != n) {
        PyErr_Format(PyExc_ValueError, "groups and grads must have one entry per parameter (%zd)", n);
        return -1;
    }
    gt_optim_param_desc *descs = PyMem_Calloc(n ? n : 1, sizeof *descs);
    gt_optim_hparams *hp = PyMem_Calloc(num_groups ? num_groups : 1, sizeof *hp);
    int rc = -1;
    if (!descs || !hp)
        PyErr_NoMemory();
    else if (build_descs(self->params, groups, self->default_grads, num_groups, descs) == 0 &&
             gtpy_optim_parse_all_hparams(hparams, hp) == 0) {
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = gt_optimizer_create(config, hp, (size_t)num_groups, descs, (size_t)n, &self->opt);
        Py_END_ALLOW_THREADS
        rc = status == GT_OK ? 0 : gtpy_raise_int(module, status);
    }
    PyMem_Free(descs);
    PyMem_Free(hp);
    return rc;
}

static PyObject *none_tuple(Py_ssize_t n) {
    PyObject *tuple = PyTuple_New(n);
    for (Py_ssize_t i = 0; tuple && i < n; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(Py_None));
    return tuple;
}

static PyObject *optimizer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"kind", "params", "groups", "hparams", "grads", "numerics",
                               "cpu_offload_fraction", "offload_chunk_numel", "zero_size", "zero_rank",
                               "min_8bit_size", NULL};
    const char *kind = NULL, *numerics = "exact";
    PyObject *params_obj, *groups_obj, *hparams_obj, *grads_obj = Py_None;
    gt_optimizer_config config = {.device = gt_cpu_device()};
    Py_ssize_t chunk = 0, min_8bit_size = GT_ADAMW8_MIN_SIZE;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOOO|$Osdniin:Optimizer", keywords, &kind, &params_obj,
                                     &groups_obj, &hparams_obj, &grads_obj, &numerics,
                                     &config.cpu_offload_fraction, &chunk, &config.zero_size, &config.zero_rank,
                                     &min_8bit_size))
        return NULL;
    if (min_8bit_size < 0)
        return PyErr_Format(PyExc_ValueError, "min_8bit_size must be >= 0, got %zd", min_8bit_size);
    config.min_8bit_size = (size_t)min_8bit_size;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module || parse_kind(module, kind, numerics, &config) < 0)
        return NULL;
    if (!(config.cpu_offload_fraction >= 0.0 && config.cpu_offload_fraction <= 1.0))
        return PyErr_Format(PyExc_ValueError, "cpu_offload_fraction must be in [0, 1], got %g",
                            config.cpu_offload_fraction);
    if (chunk < 0)
        return PyErr_Format(PyExc_ValueError, "offload_chunk_numel must be >= 0, got %zd", chunk);
    config.offload_chunk_numel = (size_t)chunk;
    OptimizerObject *self = (OptimizerObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    PyObject *groups = PySequence_Fast(groups_obj, "groups must be a sequence of ints");
    PyObject *hparams = groups ? PySequence_Fast(hparams_obj, "hparams must be a sequence of dicts") : NULL;
    self->params = hparams ? PySequence_Tuple(params_obj) : NULL;
    if (self->params)
        self->default_grads = grads_obj == Py_None ? none_tuple(PyTuple_GET_SIZE(self->params))
                                                   : PySequence_Tuple(grads_obj);
    int ok = self->default_grads && (self->models = gtpy_model_owners(self->params)) &&
             create_core(self, module, &config, groups, hparams) == 0;
    Py_XDECREF(groups);
    Py_XDECREF(hparams);
    if (!ok) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int optimizer_traverse(PyObject *op, visitproc visit, void *arg) {
    OptimizerObject *self = (OptimizerObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->params);
    Py_VISIT(self->default_grads);
    Py_VISIT(self->models);
    return 0;
}

static int optimizer_clear(PyObject *op) {
    OptimizerObject *self = (OptimizerObject *)op;
    Py_CLEAR(self->params);
    Py_CLEAR(self->default_grads);
    Py_CLEAR(self->models);
    return 0;
}

static void optimizer_dealloc(PyObject *op) {
    OptimizerObject *self = (OptimizerObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    gt_optimizer_destroy(self->opt);
    self->opt = NULL;
    optimizer_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

/* ------------------------------------------------------------ methods ------------- */

static int enter(OptimizerObject *self) { return gtpy_enter(&self->busy, "optimizer"); }

/* enter, and hold the models whose parameters the step updates (a training step of one of
 * them in another thread raises instead of racing with this update). */
static int enter_with_models(OptimizerObject *self) {
    if (enter(self) < 0)
        return -1;
    if (gtpy_models_enter(self->models) < 0) {
        self->busy = 0;
        return -1;
    }
    return 0;
}

static void leave_with_models(OptimizerObject *self) {
    gtpy_models_leave(self->models);
    self->busy = 0;
}

/* Points the C optimizer at `grads` (or the default gradients when NULL). */
static int point_grads(OptimizerObject *self, PyObject *grads) {
    PyObject *source = grads ? grads : self->default_grads;
    Py_ssize_t n = PyTuple_GET_SIZE(self->params);
    float **pointers = PyMem_Calloc(n ? n : 1, sizeof *pointers);
    if (!pointers) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = gather_grads(self, source, pointers);
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
        gt_optimizer_set_grad(self->opt, (size_t)i, pointers[i]);
    PyMem_Free(pointers);
    return rc;
}

typedef gt_status (*grad_call)(gt_optimizer *opt, float coef, double *out);

static gt_status call_step(gt_optimizer *opt, float coef, double *out) { return gt_optimizer_step(opt, coef); }

static gt_status call_norm(gt_optimizer *opt, float coef, double *out) { return gt_optimizer_grad_norm(opt, out); }

/* Runs `call` without the GIL with the gradients `grads_obj` (None: the defaults), then
 * restores the default gradient pointers. */
static int with_grads(OptimizerObject *self, PyObject *grads_obj, grad_call call, float coef, double *out) {
    PyObject *module = module_of((PyObject *)self);
    if (!module || enter_with_models(self) < 0)
        return -1;
    PyObject *grads = grads_obj == Py_None ? NULL : PySequence_Fast(grads_obj, "grads must be a sequence");
    int rc = -1;
    if ((grads || grads_obj == Py_None) && point_grads(self, grads) == 0) {
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = call(self->opt, coef, out);
        Py_END_ALLOW_THREADS
        rc = status == GT_OK ? 0 : gtpy_raise_int(module, status);
        if (grads && point_grads(self, NULL) < 0)
            rc = -1;
    }
    Py_XDECREF(grads);
    leave_with_models(self);
    return rc;
}

static PyObject *optimizer_step(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"grads", "grad_coef", NULL};
    PyObject *grads = Py_None;
    float coef = 1.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Of:step", keywords, &grads, &coef))
        return NULL;
    double unused = 0.0;
    if (with_grads((OptimizerObject *)op, grads, call_step, coef, &unused) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *optimizer_grad_norm(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"grads", NULL};
    PyObject *grads = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:grad_norm", keywords, &grads))
        return NULL;
    double norm = 0.0;
    if (with_grads((OptimizerObject *)op, grads, call_norm, 1.0f, &norm) < 0)
        return NULL;
    return PyFloat_FromDouble(norm);
}

static PyObject *optimizer_set_hparams(PyObject *op, PyObject *args) {
    OptimizerObject *self = (OptimizerObject *)op;
    Py_ssize_t group = 0;
    PyObject *dict = NULL;
    if (!PyArg_ParseTuple(args, "nO:set_hparams", &group, &dict))
        return NULL;
    gt_optim_hparams hp;
    if (gtpy_optim_parse_hparams(dict, &hp) < 0)
        return NULL;
    if (group < 0)
        return PyErr_Format(PyExc_IndexError, "group %zd out of range", group);
    if (enter(self) < 0)
        return NULL;
    gt_status status = gt_optimizer_set_hparams(self->opt, (size_t)group, &hp);
    self->busy = 0;
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

static int param_index(OptimizerObject *self, Py_ssize_t index, PyArrayObject **param) {
    if (gtpy_check_param_index(index, (size_t)PyTuple_GET_SIZE(self->params)) < 0)
        return -1;
    *param = (PyArrayObject *)PyTuple_GET_ITEM(self->params, index);
    return 0;
}

/* A state slot of parameter `index` as a new float32 host array of `numel` in `dict`. */
static int put_slot(PyObject *module, gt_optimizer *opt, PyObject *dict, size_t index, gt_optim_slot slot,
                    npy_intp numel) {
    PyObject *array = PyArray_SimpleNew(1, &numel, NPY_FLOAT32);
    if (!array)
        return -1;
    gt_status status = gt_optimizer_read_state(opt, index, slot, (float *)PyArray_DATA((PyArrayObject *)array));
    int rc = status == GT_OK ? PyDict_SetItemString(dict, slot_names[slot], array) : gtpy_raise_int(module, status);
    Py_DECREF(array);
    return rc;
}

PyObject *gtpy_optim_read_state(PyObject *module, gt_optimizer *opt, size_t index, npy_intp numel) {
    if (gt_optimizer_state8(opt))
        return gtpy_optim8_read_state(module, opt, index);
    int64_t step = 0;
    gt_optimizer_get_param_step(opt, index, &step);
    PyObject *dict = PyDict_New(), *step_obj = PyLong_FromLongLong(step);
    int ok = dict && step_obj && PyDict_SetItemString(dict, "step", step_obj) == 0;
    for (int s = 0; ok && s < GT_SLOT_COUNT; s++)
        if (gt_optimizer_has_slot(opt, (gt_optim_slot)s))
            ok = put_slot(module, opt, dict, index, (gt_optim_slot)s, numel) == 0;
    Py_XDECREF(step_obj);
    if (!ok)
        Py_CLEAR(dict);
    return dict;
}

static PyObject *get_state(PyObject *op, PyObject *arg) {
    OptimizerObject *self = (OptimizerObject *)op;
    PyArrayObject *param = NULL;
    Py_ssize_t index = PyLong_AsSsize_t(arg);
    if ((index == -1 && PyErr_Occurred()) || param_index(self, index, &param) < 0)
        return NULL;
    return gtpy_optim_read_state(module_of(op), self->opt, (size_t)index, PyArray_SIZE(param));
}

/* Converts the state arrays given in `slots` (name -> array; None or absent: not given) into
 * arrays[slot], checking each slot is kept and has `numel` elements; nothing is written. */
static int read_slots(const gt_optimizer *opt, Py_ssize_t index, PyObject *slots, npy_intp numel,
                      PyArrayObject *arrays[GT_SLOT_COUNT]) {
    for (int s = 0; s < GT_SLOT_COUNT; s++) {
        PyObject *value = PyDict_GetItemString(slots, slot_names[s]);
        if (!value || value == Py_None)
            continue;
        if (!gt_optimizer_has_slot(opt, (gt_optim_slot)s)) {
            PyErr_Format(PyExc_ValueError, "state '%s' is not kept by this optimizer", slot_names[s]);
            return -1;
        }
        arrays[s] = (PyArrayObject *)PyArray_FROM_OTF(value, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
        if (!arrays[s])
            return -1;
        if (PyArray_SIZE(arrays[s]) != numel) {
            PyErr_Format(PyExc_ValueError, "state '%s' of parameter %zd has %zd elements, expected %zd",
                         slot_names[s], index, (Py_ssize_t)PyArray_SIZE(arrays[s]), (Py_ssize_t)numel);
            return -1;
        }
    }
    return 0;
}

PyObject *gtpy_optim_write_state(PyObject *module, gt_optimizer *opt, Py_ssize_t index, Py_ssize_t step,
                                 PyObject *slots, npy_intp numel) {
    if (gt_optimizer_state8(opt))
        return gtpy_optim8_write_state(module, opt, index, step, slots);
    if (step < 0)
        return PyErr_Format(PyExc_ValueError, "step must be >= 0, got %zd", step);
    PyObject *result = NULL;
    PyArrayObject *arrays[GT_SLOT_COUNT] = {NULL};
    if (read_slots(opt, index, slots, numel, arrays) == 0) {
        gt_status status = gt_optimizer_set_param_step(opt, (size_t)index, step);
        for (int s = 0; s < GT_SLOT_COUNT && status == GT_OK; s++)
            if (arrays[s])
                status = gt_optimizer_write_state(opt, (size_t)index, (gt_optim_slot)s, PyArray_DATA(arrays[s]));
        result = status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
    }
    for (int s = 0; s < GT_SLOT_COUNT; s++)
        Py_XDECREF(arrays[s]);
    return result;
}

/* Sets a parameter's step and state arrays; every argument is checked before anything is
 * written, so a bad one leaves the parameter's state as it was. */
static PyObject *set_state(PyObject *op, PyObject *args) {
    OptimizerObject *self = (OptimizerObject *)op;
    Py_ssize_t index = 0, step = 0;
    PyObject *slots = NULL;
    PyArrayObject *param = NULL;
    if (!PyArg_ParseTuple(args, "nnO!:set_state", &index, &step, &PyDict_Type, &slots) ||
        param_index(self, index, &param) < 0)
        return NULL;
    return gtpy_optim_write_state(module_of(op), self->opt, index, step, slots, PyArray_SIZE(param));
}

static PyObject *reload_params(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    OptimizerObject *self = (OptimizerObject *)op;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_optimizer_reload_params(self->opt);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

/* call(op, arg) with the optimizer marked busy: its state is neither read half-updated nor
 * changed under a step running in another thread. */
static PyObject *exclusive(PyObject *op, PyObject *arg, PyObject *(*call)(PyObject *, PyObject *)) {
    OptimizerObject *self = (OptimizerObject *)op;
    if (enter(self) < 0)
        return NULL;
    PyObject *result = call(op, arg);
    self->busy = 0;
    return result;
}

static PyObject *optimizer_get_state(PyObject *op, PyObject *arg) { return exclusive(op, arg, get_state); }
static PyObject *optimizer_set_state(PyObject *op, PyObject *args) { return exclusive(op, args, set_state); }
static PyObject *optimizer_reload_params(PyObject *op, PyObject *arg) { return exclusive(op, arg, reload_params); }

static PyObject *optimizer_memory(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    gt_optimizer_memory m;
    gt_optimizer_get_memory(((OptimizerObject *)op)->opt, &m);
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "device_bytes", (Py_ssize_t)m.device_bytes, "host_bytes",
                         (Py_ssize_t)m.host_bytes, "device_numel", (Py_ssize_t)m.device_numel, "host_numel",
                         (Py_ssize_t)m.host_numel);
}

static PyObject *optimizer_get_num_steps(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(gt_optimizer_num_steps(((OptimizerObject *)op)->opt));
}

static PyMethodDef optimizer_methods[] = {
    {"step", (PyCFunction)(void (*)(void))optimizer_step, METH_VARARGS | METH_KEYWORDS,
     "step(grads=None, grad_coef=1.0)\n--\n\nOne fused update; grads: one array or None per parameter "
     "(None: the gradients given at construction). Each gradient element is multiplied by grad_coef."},
    {"grad_norm", (PyCFunction)(void (*)(void))optimizer_grad_norm, METH_VARARGS | METH_KEYWORDS,
     "grad_norm(grads=None)\n--\n\nDeterministic L2 norm of the gradients (float64)."},
    {"set_hparams", optimizer_set_hparams, METH_VARARGS,
     "set_hparams(group, dict)\n--\n\nReplace the hyperparameters of a group (PyTorch's keys)."},
    {"get_state", optimizer_get_state, METH_O,
     "get_state(index)\n--\n\nA parameter's state: {'step': int, slot name: float32 copy}."},
    {"set_state", optimizer_set_state, METH_VARARGS,
     "set_state(index, step, slots)\n--\n\nLoad a parameter's step count and state arrays."},
    {"reload_params", optimizer_reload_params, METH_NOARGS,
     "Re-read the offloaded parameters into the host master copy."},
    {"memory", optimizer_memory, METH_NOARGS, "Optimizer bytes and elements on the device and the host."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef optimizer_getset[] = {
    {"num_steps", optimizer_get_num_steps, NULL, "Steps that updated at least one parameter.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot optimizer_slots[] = {
    {Py_tp_new, optimizer_new},
    {Py_tp_dealloc, optimizer_dealloc},
    {Py_tp_traverse, optimizer_traverse},
    {Py_tp_clear, optimizer_clear},
    {Py_tp_methods, optimizer_methods},
    {Py_tp_getset, optimizer_getset},
    {Py_tp_doc, "Optimizer(kind, params, groups, hparams, *, grads=None, numerics='exact', "
                "cpu_offload_fraction=0.0, offload_chunk_numel=0, zero_size=0, zero_rank=0, "
                "min_8bit_size=4096)\n--\n\n"
                "The fused C AdamW ('adamw'), 8-bit AdamW ('adamw8bit': parameters of at least min_8bit_size "
                "elements keep 8-bit moments) or SGD ('sgd') over float32 parameter arrays. zero_size > 0: "
                "they are rank zero_rank's shard of a model's parameters (ZeRO-1), and a training step "
                "with this optimizer reduce-scatters the gradients and all-gathers the parameters."},
    {0, NULL},
};

static PyType_Spec optimizer_spec = {
    .name = "gputrain._C.Optimizer",
    .basicsize = sizeof(OptimizerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = optimizer_slots,
};

/* ------------------------------------------------------------ grad norm functions - */

static PyObject *norm_of(PyObject *module, PyObject *arg, gt_status (*fn)(const float *, size_t, double *)) {
    PyArrayObject *array = (PyArrayObject *)PyArray_FROM_OTF(arg, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
    if (!array)
        return NULL;
    double out = 0.0;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = fn((const float *)PyArray_DATA(array), (size_t)PyArray_SIZE(array), &out);
    Py_END_ALLOW_THREADS
    Py_DECREF(array);
    return status == GT_OK ? PyFloat_FromDouble(out) : gtpy_raise(module, status);
}

static PyObject *grad_sumsq(PyObject *module, PyObject *arg) { return norm_of(module, arg, gt_grad_sumsq); }

static PyObject *grad_absmax(PyObject *module, PyObject *arg) { return norm_of(module, arg, gt_grad_absmax); }

static PyObject *stream_triad(PyObject *module, PyObject *args) {
    PyObject *objs[3];
    float scalar = 0.0f;
    if (!PyArg_ParseTuple(args, "OOOf:stream_triad", &objs[0], &objs[1], &objs[2], &scalar))
        return NULL;
    const char *names[3] = {"a", "b", "c"};
    for (int k = 0; k < 3; k++)
        if (check_array(objs[k], names[k], 0, k ? PyArray_SIZE((PyArrayObject *)objs[0]) : -1, k == 0) < 0)
            return NULL;
    float *a = (float *)PyArray_DATA((PyArrayObject *)objs[0]);
    const float *b = (const float *)PyArray_DATA((PyArrayObject *)objs[1]);
    const float *c = (const float *)PyArray_DATA((PyArrayObject *)objs[2]);
    size_t n = (size_t)PyArray_SIZE((PyArrayObject *)objs[0]);
    Py_BEGIN_ALLOW_THREADS
    gt_triad_cpu(a, b, c, scalar, n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef optim_functions[] = {
    {"grad_sumsq", grad_sumsq, METH_O,
     "grad_sumsq(x)\n--\n\nDeterministic float64 sum of squares of a float32 array (thread-count independent)."},
    {"stream_triad", stream_triad, METH_VARARGS,
     "stream_triad(a, b, c, s)\n--\n\nSTREAM's triad a = b + s*c on float32 arrays (the bandwidth baseline)."},
    {"grad_absmax", grad_absmax, METH_O, "grad_absmax(x)\n--\n\nmax |x| of a float32 array (NaN if any is NaN)."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------ C accessor ---------- */

static int is_core(PyObject *obj) { return PyType_GetSlot(Py_TYPE(obj), Py_tp_dealloc) == (void *)optimizer_dealloc; }

PyObject *gtpy_optimizer_core(PyObject *obj) {
    if (is_core(obj))
        return Py_NewRef(obj);
    PyObject *pushed = PyObject_CallMethod(obj, "push_hyperparameters", NULL);
    if (!pushed) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "optimizer must be a gputrain.optim optimizer, not %.100s",
                         Py_TYPE(obj)->tp_name);
        }
        return NULL;
    }
    Py_DECREF(pushed);
    PyObject *core = PyObject_GetAttrString(obj, "_core");
    if (core && !is_core(core)) {
        PyErr_Format(PyExc_TypeError, "optimizer._core must be a gputrain._C.Optimizer, not %.100s",
                     Py_TYPE(core)->tp_name);
        Py_CLEAR(core);
    }
    return core;
}

gt_optimizer *gtpy_optimizer_enter(PyObject *core) {
    if (!is_core(core))
        return gtpy_model_optimizer_enter(core);
    OptimizerObject *self = (OptimizerObject *)core;
    return enter(self) == 0 ? self->opt : NULL;
}

void gtpy_optimizer_leave(PyObject *core) {
    if (is_core(core))
        ((OptimizerObject *)core)->busy = 0;
    else
        gtpy_model_optimizer_leave(core);
}

int gtpy_add_optim(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &optimizer_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Optimizer", type);
    Py_DECREF(type);
    return rc < 0 ? -1 : PyModule_AddFunctions(module, optim_functions);
}
