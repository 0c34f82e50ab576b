/* gputrain._C.ModelOptimizer: the fused AdamW/SGD (csrc/train/optim.h) over parameters of a
 * compiled model's own parameter and gradient arenas, on the model's device (cpu, cuda:N or
 * sim:N). gputrain.optim.AdamW/SGD build it when their Parameters live in device memory
 * (NumPy cannot view them): one descriptor per optimizer parameter, in the optimizer's order,
 * each naming its parameter by index into the model's parameter_layout(), with its group, so
 * groups, no-decay, LLRD and cpu_offload_fraction pack the same flat state space as
 * _C.Optimizer over the same Parameters on the CPU (hence the same bits). */
#include "py/args.h"
#include "py/optim_model.h"

#include "dist/comm.h"
#include "py/model.h"
#include "py/optim_py.h"

typedef struct {
    PyObject_HEAD
    gt_optimizer *opt;   /* the C optimizer; NULL only while being built */
    PyObject *model;     /* the _C.Model whose arenas opt points into (kept alive) */
    PyObject *models;    /* (model,): held busy by the calls that read or write its arenas */
    size_t *numels;      /* (num_params,) elements of each parameter, PyMem */
    size_t num_params;   /* parameters of the optimizer */
    size_t num_groups;   /* hyperparameter groups */
    int busy;            /* 1 while a training step uses it without the GIL (other calls raise) */
} ModelOptimizerObject;

static PyObject *module_of(PyObject *self) { return PyType_GetModuleByDef(Py_TYPE(self), &gtpy_module_def); }

static int parse_kind(const char *kind, const char *numerics, gt_optimizer_config *config) {
    int numerics_ok = strcmp(numerics, "exact") == 0 || strcmp(numerics, "fast") == 0;
    if (gtpy_optim_parse_kind(kind, &config->kind) < 0)
        return -1;
    if (!numerics_ok) {
        PyErr_Format(PyExc_ValueError, "numerics must be 'exact' or 'fast', got '%s'", numerics);
        return -1;
    }
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

/* An int entry `i` of a fast sequence in [0, limit), or -1 with IndexError naming `what`. */
static Py_ssize_t index_in(PyObject *seq, Py_ssize_t i, const char *what, Py_ssize_t limit) {
    Py_ssize_t value = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value >= limit) {
        PyErr_Format(PyExc_IndexError, "%s[%zd] = %zd is out of range (%zd)", what, i, value, limit);
        return -1;
    }
    return value;
}

/* The arguments that say which arena slices the optimizer updates (all fast sequences). */
typedef struct param_args {
    PyObject *indices;    /* parameter_layout() index of each parameter */
    PyObject *groups;     /* its group */
    PyObject *trainable;  /* its requires_grad: False leaves its gradient unset (never updated) */
} param_args;

/* [*offset, + *numel) cut to its part in the flat arena's elements [first, end) (a ZeRO-1 shard). */
static void cut_to_shard(size_t first, size_t end, size_t *offset, size_t *numel) {
    size_t lo = *offset < first ? first : *offset, hi = *offset + *numel > end ? end : *offset + *numel;
    *offset = lo < hi ? lo : first;
    *numel = lo < hi ? hi - lo : 0;
}

/* build_descs over `list`, the model's parameters in layout order; [first, first + count) is the
 * shard (the whole arena without ZeRO-1, where grads share the parameters' offsets). */
static int build_descs_in(ModelOptimizerObject *self, gt_model *model, PyObject *layout, const gt_param **list,
                          const param_args *a, size_t first, size_t count, gt_optim_param_desc *descs) {
    Py_ssize_t num_layout = PyList_GET_SIZE(layout);
    for (size_t i = 0; i < self->num_params; i++) {
        Py_ssize_t at = index_in(a->indices, (Py_ssize_t)i, "indices", num_layout);
        Py_ssize_t group = at < 0 ? -1 : index_in(a->groups, (Py_ssize_t)i, "groups", (Py_ssize_t)self->num_groups);
        int trainable = group < 0 ? -1 : PyObject_IsTrue(PySequence_Fast_GET_ITEM(a->trainable, (Py_ssize_t)i));
        size_t offset = 0;
        if (trainable < 0 || layout_entry(PyList_GET_ITEM(layout, at), (size_t)at, model->num_params, &offset,
                                          &self->numels[i]) < 0)
            return -1;
        size_t skip = offset;  /* elements of the parameter before its shard */
        cut_to_shard(first, first + count, &offset, &self->numels[i]);
        skip = offset - skip;
        const gt_param *param = list[at];
        float *grad = trainable && !param->frozen && self->numels[i] ? param->grad + skip : NULL;
        descs[i] = (gt_optim_param_desc){(float *)model->params.block.ptr + offset, grad, self->numels[i],
                                         (size_t)group};
    }
    return 0;
}

/* One descriptor per optimizer parameter, pointing into the model's arenas; with config->zero_size
 * > 0, at the part of it in shard zero_rank of the arena (gt_comm_chunk's, as gputrain.optim.zero). */
static int build_descs(ModelOptimizerObject *self, gt_model *model, PyObject *layout, const param_args *a,
                       const gt_optimizer_config *config, gt_optim_param_desc *descs) {
    gt_status checked = gt_model_check_values(model, "an optimizer over the model");
    if (checked != GT_OK)
        return gtpy_raise_int(PyType_GetModuleByDef(Py_TYPE((PyObject *)self), &gtpy_module_def), checked);
    Py_ssize_t num_layout = PyList_GET_SIZE(layout);
    size_t first = 0, count = model->num_params;
    if (config->zero_size > 0 && model->num_grads != model->num_params) {
        PyErr_SetString(PyExc_ValueError, "zero_stage=1: the model has frozen parameters (requires_grad=False), "
                        "whose gradient arena is not laid out as its parameters; ZeRO-1 shards both alike: "
                        "unfreeze them or leave zero_stage at 0");
        return -1;
    }
    if (config->zero_size > 0)
        gt_comm_chunk(model->num_params, config->zero_size, config->zero_rank, &first, &count);
    const gt_param **list = PyMem_Calloc((size_t)num_layout ? (size_t)num_layout : 1, sizeof *list);
    if (!list) {
        PyErr_NoMemory();
        return -1;
    }
    if (gt_model_list_params(model, list, (size_t)num_layout) != (size_t)num_layout) {
        PyMem_Free(list);
        PyErr_SetString(PyExc_RuntimeError, "model: parameter_layout() does not match its parameters");
        return -1;
    }
    int rc = build_descs_in(self, model, layout, list, a, first, count, descs);
    PyMem_Free(list);
    return rc;
}

static int create_core(ModelOptimizerObject *self, PyObject *module, gt_optimizer_config *config,
                       const param_args *a, PyObject *hparams) {
    gt_model *model = gtpy_model_get(module, self->model, "model");
    PyObject *layout = model ? PyObject_CallMethod(self->model, "parameter_layout", NULL) : NULL;
    if (!layout)
        return -1;
    int rc = -1;
    self->numels = PyMem_Calloc(self->num_params ? self->num_params : 1, sizeof *self->numels);
    gt_optim_param_desc *descs = PyMem_Calloc(self->num_params ? self->num_params : 1, sizeof *descs);
    gt_optim_hparams *hp = PyMem_Calloc(self->num_groups ? self->num_groups : 1, sizeof *hp);
    if (!PyList_Check(layout))
        PyErr_SetString(PyExc_TypeError, "model.parameter_layout() must return a list");
    else if (!self->numels || !descs || !hp)
        PyErr_NoMemory();
    else if (build_descs(self, model, layout, a, config, descs) == 0 && gtpy_optim_parse_all_hparams(hparams, hp) == 0) {
        config->device = model->backend.device;
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = gt_optimizer_create(config, hp, self->num_groups, descs, self->num_params, &self->opt);
        Py_END_ALLOW_THREADS
        rc = status == GT_OK ? 0 : gtpy_raise_int(module, status);
    }
    PyMem_Free(hp);
    PyMem_Free(descs);
    Py_DECREF(layout);
    return rc;
}

/* Fast sequences of the per-parameter arguments, all of one length (self->num_params). */
static int parse_params(ModelOptimizerObject *self, PyObject *indices, PyObject *groups, PyObject *trainable,
                        param_args *a) {
    a->indices = PySequence_Fast(indices, "indices must be a sequence of ints");
    a->groups = a->indices ? PySequence_Fast(groups, "groups must be a sequence of ints") : NULL;
    a->trainable = a->groups ? PySequence_Fast(trainable, "trainable must be a sequence of bools") : NULL;
    if (!a->trainable)
        return -1;
    self->num_params = (size_t)PySequence_Fast_GET_SIZE(a->indices);
    if (PySequence_Fast_GET_SIZE(a->groups) != (Py_ssize_t)self->num_params ||
        PySequence_Fast_GET_SIZE(a->trainable) != (Py_ssize_t)self->num_params) {
        PyErr_Format(PyExc_ValueError, "groups and trainable must have one entry per parameter (%zu)",
                     self->num_params);
        return -1;
    }
    return 0;
}

static int check_offload(double fraction, Py_ssize_t chunk) {
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
        PyErr_Format(PyExc_ValueError, "cpu_offload_fraction must be in [0, 1], got %g", fraction);
        return -1;
    }
    if (chunk < 0) {
        PyErr_Format(PyExc_ValueError, "offload_chunk_numel must be >= 0, got %zd", chunk);
        return -1;
    }
    return 0;
}

static PyObject *model_optimizer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"kind", "model", "indices", "groups", "hparams", "trainable", "numerics",
                               "cpu_offload_fraction", "offload_chunk_numel", "zero_size", "zero_rank",
                               "min_8bit_size", NULL};
    const char *kind = NULL, *numerics = "exact";
    PyObject *model_obj, *indices, *groups, *hparams_obj, *trainable;
    gt_optimizer_config config = {.compute_stream = NULL};
    Py_ssize_t chunk = 0, min_8bit_size = GT_ADAMW8_MIN_SIZE;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOOOOO|$sdniin:ModelOptimizer", keywords, &kind, &model_obj,
                                     &indices, &groups, &hparams_obj, &trainable, &numerics,
                                     &config.cpu_offload_fraction, &chunk, &config.zero_size, &config.zero_rank,
                                     &min_8bit_size))
        return NULL;
    if (min_8bit_size < 0)
        return PyErr_Format(PyExc_ValueError, "min_8bit_size must be >= 0, got %zd", min_8bit_size);
    config.min_8bit_size = (size_t)min_8bit_size;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module || parse_kind(kind, numerics, &config) < 0 || check_offload(config.cpu_offload_fraction, chunk) < 0)
        return NULL;
    config.offload_chunk_numel = (size_t)chunk;
    ModelOptimizerObject *self = (ModelOptimizerObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->model = Py_NewRef(model_obj);
    param_args a = {NULL, NULL, NULL};
    PyObject *hparams = PySequence_Fast(hparams_obj, "hparams must be a sequence of dicts");
    int ok = hparams && (self->models = PyTuple_Pack(1, model_obj)) &&
             parse_params(self, indices, groups, trainable, &a) == 0;
    if (ok)
        self->num_groups = (size_t)PySequence_Fast_GET_SIZE(hparams);
    ok = ok && create_core(self, module, &config, &a, hparams) == 0;
    Py_XDECREF(a.indices);
    Py_XDECREF(a.groups);
    Py_XDECREF(a.trainable);
    Py_XDECREF(hparams);
    if (!ok) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int model_optimizer_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((ModelOptimizerObject *)op)->model);
    Py_VISIT(((ModelOptimizerObject *)op)->models);
    return 0;
}

static int model_optimizer_clear(PyObject *op) {
    Py_CLEAR(((ModelOptimizerObject *)op)->model);
    Py_CLEAR(((ModelOptimizerObject *)op)->models);
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

/* Marks the optimizer busy, and with `models` its model too (its arenas are read or written
 * without the GIL: a training step in another thread then raises). 0, or -1 with RuntimeError. */
static int enter(ModelOptimizerObject *self, int models) {
    if (gtpy_enter(&self->busy, "optimizer") < 0)
        return -1;
    if (models && gtpy_models_enter(self->models) < 0) {
        self->busy = 0;
        return -1;
    }
    return 0;
}

static void leave(ModelOptimizerObject *self, int models) {
    if (models)
        gtpy_models_leave(self->models);
    self->busy = 0;
}

static PyObject *model_optimizer_set_hparams(PyObject *op, PyObject *args) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    Py_ssize_t group = 0;
    PyObject *dict = NULL;
    gt_optim_hparams hp;
    if (!PyArg_ParseTuple(args, "nO:set_hparams", &group, &dict) || gtpy_optim_parse_hparams(dict, &hp) < 0)
        return NULL;
    if (group < 0 || (size_t)group >= self->num_groups)
        return PyErr_Format(PyExc_IndexError, "group %zd out of range (%zu groups)", group, self->num_groups);
    if (enter(self, 0) < 0)
        return NULL;
    gt_status status = gt_optimizer_set_hparams(self->opt, (size_t)group, &hp);
    leave(self, 0);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

static PyObject *model_optimizer_get_state(PyObject *op, PyObject *arg) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    Py_ssize_t index = PyLong_AsSsize_t(arg);
    if ((index == -1 && PyErr_Occurred()) || gtpy_check_param_index(index, self->num_params) < 0)
        return NULL;
    if (enter(self, 0) < 0)  /* not read half-updated by a step */
        return NULL;
    PyObject *dict = gtpy_optim_read_state(module_of(op), self->opt, (size_t)index, (npy_intp)self->numels[index]);
    leave(self, 0);
    return dict;
}

static PyObject *model_optimizer_set_state(PyObject *op, PyObject *args) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    Py_ssize_t index = 0, step = 0;
    PyObject *slots = NULL;
    if (!PyArg_ParseTuple(args, "nnO!:set_state", &index, &step, &PyDict_Type, &slots) ||
        gtpy_check_param_index(index, self->num_params) < 0)
        return NULL;
    if (enter(self, 0) < 0)  /* not under a step running in another thread */
        return NULL;
    PyObject *result = gtpy_optim_write_state(module_of(op), self->opt, index, step, slots,
                                              (npy_intp)self->numels[index]);
    leave(self, 0);
    return result;
}

/* One update of every trainable parameter with the model's gradients (none when they are not
 * valid: after zero_grad(set_to_none=True), as with None gradients on the CPU), each element
 * multiplied by grad_coef; the model's half copy follows. */
static gt_status step_pass(gt_model *model, gt_optimizer *opt, float coef) {
    if (!model->grads_valid)
        return GT_OK;
    GT_TRY(gt_optimizer_step(opt, coef));
    return gt_model_refresh_trainable_lowp(model);
}

static PyObject *model_optimizer_step(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"grad_coef", NULL};
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    float coef = 1.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$f:step", keywords, &coef))
        return NULL;
    gt_model *model = gtpy_model_get(module_of(op), self->model, "model");
    if (!model || enter(self, 1) < 0)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = step_pass(model, self->opt, coef);
    Py_END_ALLOW_THREADS
    leave(self, 1);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

static gt_status norm_pass(const gt_model *model, const gt_optimizer *opt, double *out) {
    *out = 0.0;
    return model->grads_valid ? gt_optimizer_grad_norm(opt, out) : GT_OK;
}

static PyObject *model_optimizer_grad_norm(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    gt_model *model = gtpy_model_get(module_of(op), self->model, "model");
    if (!model || enter(self, 1) < 0)
        return NULL;
    double norm = 0.0;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = norm_pass(model, self->opt, &norm);
    Py_END_ALLOW_THREADS
    leave(self, 1);
    return status == GT_OK ? PyFloat_FromDouble(norm) : gtpy_raise(module_of(op), status);
}

static PyObject *model_optimizer_reload_params(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    if (enter(self, 1) < 0)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_optimizer_reload_params(self->opt);
    Py_END_ALLOW_THREADS
    leave(self, 1);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

/* The oldest deferred step's record (waiting for it with `wait`): a dict, or None when not done. */
static PyObject *model_optimizer_deferred_result(PyObject *op, PyObject *args) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    int wait = 0, done = 0;
    if (!PyArg_ParseTuple(args, "p:deferred_result", &wait) || enter(self, 0) < 0)
        return NULL;
    gt_step_record head;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_optimizer_deferred_result(self->opt, wait, &head, &done);
    Py_END_ALLOW_THREADS
    leave(self, 0);
    if (status != GT_OK)
        return gtpy_raise(module_of(op), status);
    if (!done)
        return Py_NewRef(Py_None);
    return Py_BuildValue("{s:d,s:d,s:O}", "loss_sum", head.loss_sum, "grad_sumsq", head.grad_sumsq, "found_inf",
                         head.found_inf ? Py_True : Py_False);
}

static PyObject *model_optimizer_resolve(PyObject *op, PyObject *args) {
    ModelOptimizerObject *self = (ModelOptimizerObject *)op;
    int applied = 0;
    if (!PyArg_ParseTuple(args, "p:resolve", &applied) || enter(self, 0) < 0)
        return NULL;
    gt_status status = gt_optimizer_resolve(self->opt, applied);
    leave(self, 0);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

static PyObject *model_optimizer_get_pending(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromSize_t(gt_optimizer_pending(((ModelOptimizerObject *)op)->opt));
}

static PyObject *model_optimizer_memory(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    gt_optimizer_memory m;
    gt_optimizer_get_memory(((ModelOptimizerObject *)op)->opt, &m);
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "device_bytes", (Py_ssize_t)m.device_bytes, "host_bytes",
                         (Py_ssize_t)m.host_bytes, "device_numel", (Py_ssize_t)m.device_numel, "host_numel",
                         (Py_ssize_t)m.host_numel);
}

static PyObject *model_optimizer_get_num_steps(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(gt_optimizer_num_steps(((ModelOptimizerObject *)op)->opt));
}

static PyObject *model_optimizer_get_model(PyObject *op, void *Py_UNUSED(closure)) {
    return Py_NewRef(((ModelOptimizerObject *)op)->model);
}

static PyMethodDef model_optimizer_methods[] = {
    {"set_hparams", model_optimizer_set_hparams, METH_VARARGS,
     "set_hparams(group, dict)\n--\n\nReplace the hyperparameters of a group (PyTorch's keys)."},
    {"get_state", model_optimizer_get_state, METH_O,
     "get_state(index)\n--\n\nA parameter's state: {'step': int, slot name: float32 host copy}."},
    {"set_state", model_optimizer_set_state, METH_VARARGS,
     "set_state(index, step, slots)\n--\n\nLoad a parameter's step count and state arrays (host arrays)."},
    {"step", (PyCFunction)(void (*)(void))model_optimizer_step, METH_VARARGS | METH_KEYWORDS,
     "step(*, grad_coef=1.0)\n--\n\nOne fused update with the model's gradients (none while they are not valid)."},
    {"grad_norm", model_optimizer_grad_norm, METH_NOARGS,
     "grad_norm()\n--\n\nDeterministic L2 norm of the parameters' gradients (0.0 while they are not valid)."},
    {"reload_params", model_optimizer_reload_params, METH_NOARGS,
     "reload_params()\n--\n\nRe-read the offloaded parameters into the host master copy."},
    {"deferred_result", model_optimizer_deferred_result, METH_VARARGS,
     "deferred_result(wait)\n--\n\nThe oldest unresolved sync=False step's record {'loss_sum', 'grad_sumsq', "
     "'found_inf'} (wait: blocks until its work has run), or None when it has not run yet."},
    {"resolve", model_optimizer_resolve, METH_VARARGS,
     "resolve(applied)\n--\n\nResolves the oldest deferred step: its update ran (applied) or was skipped."},
    {"memory", model_optimizer_memory, METH_NOARGS, "Optimizer bytes and elements on the device and the host."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_optimizer_getset[] = {
    {"num_steps", model_optimizer_get_num_steps, NULL, "Steps that updated at least one parameter.", NULL},
    {"pending", model_optimizer_get_pending, NULL, "Deferred steps queued and not yet resolved.", NULL},
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
    {Py_tp_doc, "ModelOptimizer(kind, model, indices, groups, hparams, trainable, *, numerics='exact', "
                "cpu_offload_fraction=0.0, offload_chunk_numel=0, zero_size=0, zero_rank=0, "
                "min_8bit_size=4096)\n--\n\n"
                "The fused C AdamW ('adamw'), 8-bit AdamW ('adamw8bit') or SGD ('sgd') over slices of a "
                "_C.Model's parameter and "
                "gradient arenas on the model's device: parameter i is parameter_layout()[indices[i]], in "
                "group groups[i] (hparams[g]: its hyperparameters), updated when trainable[i]. zero_size > 0 "
                "(ZeRO-1): only each parameter's part in chunk zero_rank of the arena cut into zero_size "
                "chunks (get_state/set_state: that part)."},
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
 * new reference in *core). push_hyperparameters runs first: it may rebuild the core (the
 * model moved). */
static int find_core(PyObject *obj, ModelOptimizerObject **core) {
    if (is_model_optimizer(obj)) {
        *core = (ModelOptimizerObject *)Py_NewRef(obj);
        return 1;
    }
    PyObject *pushed = PyObject_CallMethod(obj, "push_hyperparameters", NULL);
    if (!pushed) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(pushed);
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
    return 1;
}

int gtpy_model_optimizer_resolve(PyObject *obj, PyObject *model_obj, PyObject **core_out) {
    ModelOptimizerObject *core = NULL;
    int found = find_core(obj, &core);
    if (found <= 0)
        return found;
    if (core->model != model_obj) {
        Py_DECREF(core);
        PyErr_SetString(PyExc_ValueError, "optimizer: its parameters belong to another model than the one this "
                                          "step trains (build it over this model's parameters())");
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
