/* gputrain._C.Scaler: the C state (struct gt_scaler) behind gputrain.amp.GradScaler, which
 * subclasses it in Python. The fused training step reaches the same struct through
 * gtpy_scaler_get(). Also the read-bandwidth baseline of the unscale benchmark. */
#include "py/args.h"

#include "train/scaler.h"

#ifdef GT_WITH_CUDA
#include "scaler_cuda.h"
#endif

typedef struct {
    PyObject_HEAD
    gt_scaler state;  /* scale, tracker, factors and counters; shared with the fused step */
    int busy;         /* 1 while a training step uses it without the GIL: every call that reads what
                         the step writes (scale, tracker, counters) or changes anything raises */
} ScalerObject;

static void scaler_dealloc(PyObject *op) {
    PyTypeObject *type = Py_TYPE(op);
    type->tp_free(op);
    Py_DECREF(type);
}

gt_scaler *gtpy_scaler_get(PyObject *obj) {
    PyObject *mro = Py_TYPE(obj)->tp_mro;
    for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (PyType_GetSlot(base, Py_tp_dealloc) == (void *)scaler_dealloc)
            return &((ScalerObject *)obj)->state;
    }
    PyErr_Format(PyExc_TypeError, "scaler must be a gputrain.amp.GradScaler, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
}

gt_scaler *gtpy_scaler_enter(PyObject *obj) {
    ScalerObject *self = (ScalerObject *)obj;
    return gtpy_enter(&self->busy, "GradScaler") == 0 ? &self->state : NULL;
}

void gtpy_scaler_leave(PyObject *obj) { ((ScalerObject *)obj)->busy = 0; }

/* 0, or -1 with RuntimeError while a training step in another thread uses the scaler. Called
 * (with the GIL) before the state is read or written, with no Python code between the check and
 * the last access: the step thread writes the state without the GIL. */
static int check_idle(PyObject *self) {
    if (!((ScalerObject *)self)->busy)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the GradScaler is in use by another thread");
    return -1;
}

/* Raises the exception for a failed status through the module that defined `self`'s type. */
static PyObject *scaler_raise(PyObject *self, gt_status status) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &gtpy_module_def);
    return module ? gtpy_raise(module, status) : NULL;
}

static int scaler_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"init_scale", "growth_factor", "backoff_factor", "growth_interval",
                               "enabled", "min_scale", NULL};
    PyObject *init_obj = NULL, *growth_obj = NULL, *backoff_obj = NULL, *interval_obj = NULL;
    PyObject *min_scale_obj = Py_None;
    int enabled = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOOOp$O:Scaler", keywords, &init_obj, &growth_obj,
                                     &backoff_obj, &interval_obj, &enabled, &min_scale_obj))
        return -1;
    double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5, min_scale = 0.0;
    long long growth_interval = 2000;
    if (gtpy_arg_real(init_obj, "init_scale", &init_scale) < 0 ||
        gtpy_arg_real(growth_obj, "growth_factor", &growth_factor) < 0 ||
        gtpy_arg_real(backoff_obj, "backoff_factor", &backoff_factor) < 0 ||
        gtpy_arg_int(interval_obj, "growth_interval", 1, INT32_MAX, &growth_interval) < 0 ||
        gtpy_arg_real(min_scale_obj == Py_None ? NULL : min_scale_obj, "min_scale", &min_scale) < 0)
        return -1;
    if (min_scale_obj != Py_None && !(min_scale > 0.0)) {
        PyErr_Format(PyExc_ValueError, "min_scale must be > 0 or None, got %R", min_scale_obj);
        return -1;
    }
    if (check_idle(self) < 0)  /* __init__ again on a scaler a step holds */
        return -1;
    gt_status status = gt_scaler_init(&((ScalerObject *)self)->state, init_scale, growth_factor,
                                      backoff_factor, growth_interval, min_scale, enabled);
    if (status != GT_OK) {
        scaler_raise(self, status);
        return -1;
    }
    return 0;
}

/* Checks that `obj` is a float32, C-contiguous, aligned, writeable NumPy array. */
static int check_grad_array(PyObject *obj, Py_ssize_t index) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_FLOAT32 ||
        !PyArray_ISNOTSWAPPED((PyArrayObject *)obj)) {
        PyErr_Format(PyExc_TypeError, "arrays[%zd] must be a float32 NumPy array, not %.100s%s%R",
                     index, Py_TYPE(obj)->tp_name, PyArray_Check(obj) ? " of dtype " : "",
                     PyArray_Check(obj) ? (PyObject *)PyArray_DESCR((PyArrayObject *)obj) : Py_None);
        return -1;
    }
    PyArrayObject *array = (PyArrayObject *)obj;
    if (!PyArray_IS_C_CONTIGUOUS(array) || !PyArray_ISALIGNED(array) || !PyArray_ISWRITEABLE(array)) {
        PyErr_Format(PyExc_ValueError,
                     "arrays[%zd] must be C-contiguous, aligned and writeable (it is unscaled in place)",
                     index);
        return -1;
    }
    return 0;
}

/* Unscales every array in place in one pass each, without the GIL; returns 1 on NaN/±Inf. */
static PyObject *scaler_unscale(PyObject *self, PyObject *arrays) {
    if (!PyList_Check(arrays) && !PyTuple_Check(arrays))
        return PyErr_Format(PyExc_TypeError, "arrays must be a list or tuple of float32 arrays, not %.100s",
                            Py_TYPE(arrays)->tp_name);
    PyObject *items = PySequence_Fast(arrays, "arrays must be a list or tuple");
    if (!items)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (check_grad_array(PySequence_Fast_GET_ITEM(items, i), i) < 0) {
            Py_DECREF(items);
            return NULL;
        }
    }
    if (check_idle(self) < 0) {
        Py_DECREF(items);
        return NULL;
    }
    const gt_scaler state = ((ScalerObject *)self)->state;
    int found_inf = 0;
    gt_status status = GT_OK;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && status == GT_OK; i++) {
        PyArrayObject *array = (PyArrayObject *)PySequence_Fast_GET_ITEM(items, i);
        status = gt_scaler_unscale_check(&state, (float *)PyArray_DATA(array),
                                         (size_t)PyArray_SIZE(array), &found_inf);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(items);
    return status == GT_OK ? PyBool_FromLong(found_inf) : scaler_raise(self, status);
}

static PyObject *scaler_update(PyObject *self, PyObject *found_inf_obj) {
    int found_inf = PyObject_IsTrue(found_inf_obj);
    if (found_inf < 0 || check_idle(self) < 0)
        return NULL;
    gt_scaler_update(&((ScalerObject *)self)->state, found_inf);
    Py_RETURN_NONE;
}

static PyObject *scaler_set_scale(PyObject *self, PyObject *args) {
    double new_scale = 0.0;
    int found_inf = 0;
    if (!PyArg_ParseTuple(args, "dp:_set_scale", &new_scale, &found_inf) || check_idle(self) < 0)
        return NULL;
    gt_status status = gt_scaler_set_scale(&((ScalerObject *)self)->state, new_scale, found_inf);
    return status == GT_OK ? Py_NewRef(Py_None) : scaler_raise(self, status);
}

/* Sets any of the scale, the factors, the interval, the tracker and the counters at once:
 * every value is checked before any is stored (load_state_dict, set_*, unpickling). The
 * arguments are read first (that may run Python code, and other threads); the state is read
 * and written only after check_idle, with no Python code in between (a step started or run by
 * that code is neither raced with nor undone). */
static PyObject *scaler_configure(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                               "growth_tracker", "skipped_steps", "consecutive_skipped_steps", NULL};
    PyObject *scale = NULL, *growth = NULL, *backoff = NULL, *interval = NULL, *tracker = NULL;
    PyObject *skipped = NULL, *consecutive = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOOO:_configure", keywords, &scale, &growth,
                                     &backoff, &interval, &tracker, &skipped, &consecutive))
        return NULL;
    double scale_value = 0.0, growth_value = 0.0, backoff_value = 0.0;
    long long interval_value = 0, tracker_value = 0, skipped_value = 0, consecutive_value = 0;
    if (gtpy_arg_real(scale, "scale", &scale_value) < 0 ||
        gtpy_arg_real(growth, "growth_factor", &growth_value) < 0 ||
        gtpy_arg_real(backoff, "backoff_factor", &backoff_value) < 0 ||
        gtpy_arg_int(interval, "growth_interval", 1, INT32_MAX, &interval_value) < 0 ||
        gtpy_arg_int(tracker, "_growth_tracker", INT32_MIN, INT32_MAX, &tracker_value) < 0 ||
        gtpy_arg_int(skipped, "skipped_steps", 0, INT64_MAX, &skipped_value) < 0 ||
        gtpy_arg_int(consecutive, "consecutive_skipped_steps", 0, INT64_MAX, &consecutive_value) < 0 ||
        check_idle(self) < 0)
        return NULL;
    gt_scaler next = ((ScalerObject *)self)->state;
    if (scale)
        next.scale = (float)scale_value;
    if (growth)
        next.growth_factor = growth_value;
    if (backoff)
        next.backoff_factor = backoff_value;
    if (interval)
        next.growth_interval = (int32_t)interval_value;
    if (tracker)
        next.growth_tracker = (int32_t)tracker_value;
    if (skipped)
        next.skipped_steps = skipped_value;
    if (consecutive)
        next.consecutive_skipped_steps = consecutive_value;
    gt_status status = gt_scaler_validate(&next);
    if (status != GT_OK)
        return scaler_raise(self, status);
    ((ScalerObject *)self)->state = next;
    Py_RETURN_NONE;
}

/* The state for a getter of what a step writes (scale, tracker, counters), or NULL with
 * RuntimeError while a step in another thread holds the scaler. The factors, the interval, the
 * floor and `enabled` only change through calls that check_idle refuses then: read freely. */
static const gt_scaler *idle_state(PyObject *self) {
    return check_idle(self) == 0 ? &((ScalerObject *)self)->state : NULL;
}

static PyObject *get_scale(PyObject *self, void *Py_UNUSED(closure)) {
    const gt_scaler *state = idle_state(self);
    return state ? PyFloat_FromDouble(state->scale) : NULL;
}

static PyObject *get_inv_scale(PyObject *self, void *Py_UNUSED(closure)) {
    const gt_scaler *state = idle_state(self);
    return state ? PyFloat_FromDouble(gt_scaler_inv_scale(state)) : NULL;
}

static PyObject *get_growth_tracker(PyObject *self, void *Py_UNUSED(closure)) {
    const gt_scaler *state = idle_state(self);
    return state ? PyLong_FromLong(state->growth_tracker) : NULL;
}

static PyObject *get_growth_factor(PyObject *self, void *Py_UNUSED(closure)) {
    return PyFloat_FromDouble(((ScalerObject *)self)->state.growth_factor);
}

static PyObject *get_backoff_factor(PyObject *self, void *Py_UNUSED(closure)) {
    return PyFloat_FromDouble(((ScalerObject *)self)->state.backoff_factor);
}

static PyObject *get_growth_interval(PyObject *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLong(((ScalerObject *)self)->state.growth_interval);
}

static PyObject *get_min_scale(PyObject *self, void *Py_UNUSED(closure)) {
    float min_scale = ((ScalerObject *)self)->state.min_scale;
    return min_scale > 0.0f ? PyFloat_FromDouble(min_scale) : Py_NewRef(Py_None);
}

static PyObject *get_enabled(PyObject *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(((ScalerObject *)self)->state.enabled);
}

static PyObject *get_skipped_steps(PyObject *self, void *Py_UNUSED(closure)) {
    const gt_scaler *state = idle_state(self);
    return state ? PyLong_FromLongLong(state->skipped_steps) : NULL;
}

static PyObject *get_consecutive_skipped_steps(PyObject *self, void *Py_UNUSED(closure)) {
    const gt_scaler *state = idle_state(self);
    return state ? PyLong_FromLongLong(state->consecutive_skipped_steps) : NULL;
}

static PyMethodDef scaler_methods[] = {
    {"_unscale", scaler_unscale, METH_O,
     "Unscale a list of float32 arrays in place; True if any held NaN/Inf."},
    {"_update", scaler_update, METH_O, "Dynamic scale update from the iteration's found_inf."},
    {"_set_scale", scaler_set_scale, METH_VARARGS,
     "Set the scale (update(new_scale)) and count found_inf in the skip counters."},
    {"_configure", (PyCFunction)(void (*)(void))scaler_configure, METH_VARARGS | METH_KEYWORDS,
     "Set scale/growth_factor/backoff_factor/growth_interval/growth_tracker, all checked first."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef scaler_getset[] = {
    {"_scale", get_scale, NULL, "The fp32 scale as a float.", NULL},
    {"_inv_scale", get_inv_scale, NULL, "float32(1 / float64(scale)); 1.0 when disabled.", NULL},
    {"_growth_tracker", get_growth_tracker, NULL, "Finite updates since the last growth/backoff.", NULL},
    {"_growth_factor", get_growth_factor, NULL, "Scale multiplier on growth.", NULL},
    {"_backoff_factor", get_backoff_factor, NULL, "Scale multiplier on backoff.", NULL},
    {"_growth_interval", get_growth_interval, NULL, "Finite updates per growth.", NULL},
    {"min_scale", get_min_scale, NULL, "Floor applied after a backoff (None: no floor).", NULL},
    {"_enabled", get_enabled, NULL, "False: every scaler operation is a no-op.", NULL},
    {"skipped_steps", get_skipped_steps, NULL, "Iterations whose step was skipped (inf/NaN found).", NULL},
    {"consecutive_skipped_steps", get_consecutive_skipped_steps, NULL,
     "Skipped iterations since the last finite one.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot scaler_slots[] = {
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, scaler_init},
    {Py_tp_dealloc, scaler_dealloc},
    {Py_tp_methods, scaler_methods},
    {Py_tp_getset, scaler_getset},
    {Py_tp_doc, "Scaler(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, "
                "growth_interval=2000, enabled=True, *, min_scale=None)\n--\n\n"
                "The C state of the dynamic loss scaler; use gputrain.amp.GradScaler."},
    {0, NULL},
};

static PyType_Spec scaler_spec = {
    .name = "gputrain._C.Scaler",
    .basicsize = sizeof(ScalerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = scaler_slots,
};

/* The benchmark baseline: sums a float32 array with the unscale pass's blocks and loads. */
static PyObject *scaler_read_baseline(PyObject *Py_UNUSED(module), PyObject *obj) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_FLOAT32 ||
        !PyArray_ISNOTSWAPPED((PyArrayObject *)obj) || !PyArray_ISCARRAY_RO((PyArrayObject *)obj))
        return PyErr_Format(PyExc_TypeError, "x must be a C-contiguous float32 NumPy array, not %.100s",
                            Py_TYPE(obj)->tp_name);
    PyArrayObject *array = (PyArrayObject *)obj;
    double sum;
    Py_BEGIN_ALLOW_THREADS
    sum = gt_scaler_read_baseline((const float *)PyArray_DATA(array), (size_t)PyArray_SIZE(array));
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(sum);
}

/* Runs the CUDA kernels on a copy of the scaler's state and of one array, writing both back:
 * the cuda-marked tests compare them with the CPU path bit for bit. */
static PyObject *scaler_cuda_run(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"scaler", "array", "update", "device", NULL};
    PyObject *scaler_obj = NULL, *array_obj = NULL;
    int update = 0, device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|pi:scaler_cuda_run", keywords, &scaler_obj,
                                     &array_obj, &update, &device))
        return NULL;
    if (!gtpy_scaler_get(scaler_obj) || check_grad_array(array_obj, 0) < 0)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_scaler *scaler = gtpy_scaler_enter(scaler_obj);  /* held: a step's update is not undone */
    if (!scaler)
        return NULL;
    PyArrayObject *array = (PyArrayObject *)array_obj;
    gt_scaler state = *scaler;
    int found_inf = 0;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_cuda_scaler_run_host(&state, (float *)PyArray_DATA(array), (size_t)PyArray_SIZE(array),
                                     &found_inf, update, device);
    Py_END_ALLOW_THREADS
    if (status == GT_OK)
        *scaler = state;
    gtpy_scaler_leave(scaler_obj);
    if (status != GT_OK)
        return gtpy_raise(module, status);
    return PyBool_FromLong(found_inf);
#else
    PyErr_SetString(gtpy_state_of(module)->cuda_error,
                    "CUDA was not compiled in: gputrain was built without nvcc (or with GPUTRAIN_CUDA=0)");
    return NULL;
#endif
}

static PyMethodDef scaler_functions[] = {
    {"scaler_cuda_run", (PyCFunction)(void (*)(void))scaler_cuda_run, METH_VARARGS | METH_KEYWORDS,
     "scaler_cuda_run(scaler, array, update=False, device=0)\n--\n\n"
     "Unscale + inf check (and the update) with the CUDA kernels on copies; True if NaN/Inf."},
    {"scaler_read_baseline", scaler_read_baseline, METH_O,
     "Sum a float32 array with the unscale pass's parallel vector loads (read bandwidth baseline)."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_scaler(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &scaler_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Scaler", type);
    Py_DECREF(type);
    if (rc < 0)
        return -1;
    return PyModule_AddFunctions(module, scaler_functions);
}
