/* gputrain._C.EMA: the exponential moving average of parameter arrays (csrc/train/ema.h), or
 * of parameters of a model on a device (slices of its parameter arena, which NumPy cannot
 * view). gputrain.optim.EMA wraps it. */
#include "py/args.h"

#include "py/model.h"
#include "train/ema.h"

typedef struct {
    PyObject_HEAD
    gt_ema *ema;       /* the C shadow; NULL only while being built */
    PyObject *params;  /* tuple of the parameter arrays, or of parameter_layout() indices of `models[0]` */
    PyObject *models;  /* tuple of the _C.Models whose arenas params view (held while updating) */
    size_t *numels;    /* (len(params),) elements of each parameter, PyMem */
    int busy;          /* 1 while a call uses the shadow without the GIL (other calls raise) */
} EmaObject;

static PyObject *module_of(PyObject *self) { return PyType_GetModuleByDef(Py_TYPE(self), &gtpy_module_def); }

static int check_param(PyObject *obj, Py_ssize_t index) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_FLOAT32) {
        PyErr_Format(PyExc_TypeError, "params[%zd] must be a float32 NumPy array", index);
        return -1;
    }
    if (!PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) || !PyArray_ISWRITEABLE((PyArrayObject *)obj)) {
        PyErr_Format(PyExc_ValueError, "params[%zd] must be a C-contiguous, writeable array", index);
        return -1;
    }
    return 0;
}

/* Pointers and sizes of NumPy parameter arrays (on the cpu). */
static int array_params(EmaObject *self, float **pointers) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->params); i++) {
        PyObject *p = PyTuple_GET_ITEM(self->params, i);
        if (check_param(p, i) < 0)
            return -1;
        pointers[i] = (float *)PyArray_DATA((PyArrayObject *)p);
        self->numels[i] = (size_t)PyArray_SIZE((PyArrayObject *)p);
    }
    return 0;
}

/* Pointers and sizes of the parameters of `model` named by parameter_layout() index. */
static int model_params(EmaObject *self, gt_model *model, PyObject *model_obj, float **pointers) {
    gt_status checked = gt_model_check_values(model, "an EMA of the model");
    if (checked != GT_OK)
        return gtpy_raise_int(PyType_GetModuleByDef(Py_TYPE((PyObject *)self), &gtpy_module_def), checked);
    PyObject *layout = PyObject_CallMethod(model_obj, "parameter_layout", NULL);
    if (!layout)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(self->params); i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(self->params, i)), offset = 0;
        PyObject *shape = NULL;
        if (at == -1 && PyErr_Occurred())
            rc = -1;
        else if (at < 0 || at >= PyList_GET_SIZE(layout))
            rc = (PyErr_Format(PyExc_IndexError, "params[%zd] = %zd is not a parameter index of the model (%zd)", i,
                               at, PyList_GET_SIZE(layout)), -1);
        else if (!PyArg_ParseTuple(PyList_GET_ITEM(layout, at), "nO!", &offset, &PyTuple_Type, &shape))
            rc = -1;
        size_t count = 1;
        for (Py_ssize_t d = 0; rc == 0 && d < PyTuple_GET_SIZE(shape); d++)
            count *= (size_t)PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (rc == 0) {
            pointers[i] = (float *)model->params.block.ptr + offset;
            self->numels[i] = count;
        }
    }
    Py_DECREF(layout);
    return rc;
}

static int create_core(EmaObject *self, PyObject *module, PyObject *model_obj, int on_host) {
    Py_ssize_t n = PyTuple_GET_SIZE(self->params);
    float **pointers = PyMem_Calloc(n ? n : 1, sizeof *pointers);
    self->numels = PyMem_Calloc(n ? n : 1, sizeof *self->numels);
    gt_model *model = model_obj == Py_None ? NULL : gtpy_model_get(module, model_obj, "model");
    int rc = -1;
    if (!pointers || !self->numels)
        PyErr_NoMemory();
    else if ((model_obj == Py_None || model) &&
             (model ? model_params(self, model, model_obj, pointers) : array_params(self, pointers)) == 0) {
        gt_device device = model ? model->backend.device : gt_cpu_device();
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = gt_ema_create(device, on_host, NULL, pointers, self->numels, (size_t)n, &self->ema);
        Py_END_ALLOW_THREADS
        rc = status == GT_OK ? 0 : gtpy_raise_int(module, status);
    }
    PyMem_Free(pointers);
    return rc;
}

static PyObject *ema_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"params", "on_host", "model", NULL};
    PyObject *params = NULL, *model = Py_None;
    int on_host = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$pO:EMA", keywords, &params, &on_host, &model))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module)
        return NULL;
    EmaObject *self = (EmaObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->params = PySequence_Tuple(params);
    if (self->params)
        self->models = model == Py_None ? gtpy_model_owners(self->params) : PyTuple_Pack(1, model);
    if (!self->models || create_core(self, module, model, on_host) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int ema_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((EmaObject *)op)->params);
    Py_VISIT(((EmaObject *)op)->models);
    return 0;
}

static int ema_clear(PyObject *op) {
    Py_CLEAR(((EmaObject *)op)->params);
    Py_CLEAR(((EmaObject *)op)->models);
    return 0;
}

static void ema_dealloc(PyObject *op) {
    EmaObject *self = (EmaObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    gt_ema_destroy(self->ema);
    self->ema = NULL;
    PyMem_Free(self->numels);
    self->numels = NULL;
    ema_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *finish(PyObject *op, gt_status status) {
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(op), status);
}

/* Marks the shadow busy, and with `models` the models whose parameters the call reads or
 * writes (a training step of one of them in another thread then raises, and the other way
 * round). 0, or -1 with RuntimeError. */
static int enter(EmaObject *self, int models) {
    if (gtpy_enter(&self->busy, "EMA") < 0)
        return -1;
    if (models && gtpy_models_enter(self->models) < 0) {
        self->busy = 0;
        return -1;
    }
    return 0;
}

static void leave(EmaObject *self, int models) {
    if (models)
        gtpy_models_leave(self->models);
    self->busy = 0;
}

/* One pass over the shadow and the parameters without the GIL. */
static PyObject *run_pass(PyObject *op, gt_status (*pass)(gt_ema *ema, double decay), double decay) {
    EmaObject *self = (EmaObject *)op;
    if (enter(self, 1) < 0)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = pass(self->ema, decay);
    Py_END_ALLOW_THREADS
    leave(self, 1);
    return finish(op, status);
}

static gt_status update_pass(gt_ema *ema, double decay) { return gt_ema_update(ema, decay); }
static gt_status swap_pass(gt_ema *ema, double decay) { return gt_ema_swap(ema); }
static gt_status copy_pass(gt_ema *ema, double decay) { return gt_ema_copy_to_params(ema); }

static PyObject *ema_update(PyObject *op, PyObject *arg) {
    double decay = PyFloat_AsDouble(arg);
    if (decay == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(decay >= 0.0 && decay <= 1.0))
        return PyErr_Format(PyExc_ValueError, "decay must be in [0, 1], got %R", arg);
    return run_pass(op, update_pass, decay);
}

static PyObject *ema_swap(PyObject *op, PyObject *Py_UNUSED(ignored)) { return run_pass(op, swap_pass, 0.0); }

static PyObject *ema_copy_to_params(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    return run_pass(op, copy_pass, 0.0);
}

static PyObject *ema_get(PyObject *op, PyObject *arg) {
    EmaObject *self = (EmaObject *)op;
    Py_ssize_t index = PyLong_AsSsize_t(arg);
    if ((index == -1 && PyErr_Occurred()) ||
        gtpy_check_param_index(index, (size_t)PyTuple_GET_SIZE(self->params)) < 0)
        return NULL;
    npy_intp numel = (npy_intp)self->numels[index];
    PyObject *out = PyArray_SimpleNew(1, &numel, NPY_FLOAT32);
    if (!out || enter(self, 0) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    gt_status status = gt_ema_read(self->ema, (size_t)index, (float *)PyArray_DATA((PyArrayObject *)out));
    leave(self, 0);
    if (status != GT_OK) {
        Py_DECREF(out);
        return gtpy_raise(module_of(op), status);
    }
    return out;
}

static PyObject *ema_set(PyObject *op, PyObject *args) {
    EmaObject *self = (EmaObject *)op;
    Py_ssize_t index = 0;
    PyObject *value = NULL;
    if (!PyArg_ParseTuple(args, "nO:set", &index, &value) ||
        gtpy_check_param_index(index, (size_t)PyTuple_GET_SIZE(self->params)) < 0)
        return NULL;
    PyArrayObject *array = (PyArrayObject *)PyArray_FROM_OTF(value, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
    if (!array)
        return NULL;
    if ((size_t)PyArray_SIZE(array) != self->numels[index]) {
        PyErr_Format(PyExc_ValueError, "shadow %zd has %zu elements, got %zd", index, self->numels[index],
                     (Py_ssize_t)PyArray_SIZE(array));
        Py_DECREF(array);
        return NULL;
    }
    if (enter(self, 0) < 0) {
        Py_DECREF(array);
        return NULL;
    }
    gt_status status = gt_ema_write(self->ema, (size_t)index, (const float *)PyArray_DATA(array));
    leave(self, 0);
    Py_DECREF(array);
    return finish(op, status);
}

static PyObject *ema_get_nbytes(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromSize_t(gt_ema_bytes(((EmaObject *)op)->ema));
}

static PyMethodDef ema_methods[] = {
    {"update", ema_update, METH_O, "update(decay)\n--\n\nshadow = lerp(shadow, param, 1 - decay)."},
    {"swap", ema_swap, METH_NOARGS, "Exchange the shadow and the parameters."},
    {"copy_to_params", ema_copy_to_params, METH_NOARGS, "Copy the shadow into the parameters."},
    {"get", ema_get, METH_O, "get(index)\n--\n\nA copy of parameter index's shadow."},
    {"set", ema_set, METH_VARARGS, "set(index, array)\n--\n\nReplace parameter index's shadow."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ema_getset[] = {
    {"nbytes", ema_get_nbytes, NULL, "Bytes of the shadow arena.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ema_slots[] = {
    {Py_tp_new, ema_new},
    {Py_tp_dealloc, ema_dealloc},
    {Py_tp_traverse, ema_traverse},
    {Py_tp_clear, ema_clear},
    {Py_tp_methods, ema_methods},
    {Py_tp_getset, ema_getset},
    {Py_tp_doc, "EMA(params, *, on_host=False, model=None)\n--\n\nA shadow (moving average) of float32 "
                "parameter arrays, or with `model` of its parameters parameter_layout()[i] for i in params (on "
                "the model's device), beside them or, with on_host, in pinned host memory."},
    {0, NULL},
};

static PyType_Spec ema_spec = {
    .name = "gputrain._C.EMA",
    .basicsize = sizeof(EmaObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = ema_slots,
};

int gtpy_add_ema(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &ema_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "EMA", type);
    Py_DECREF(type);
    return rc;
}
