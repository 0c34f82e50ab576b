/* gputrain._C.CudaEvent: a CUDA event on one device, recorded on a CudaStream to wait for
 * or to time the work queued before it. */
#include "py/cuda_py.h"

typedef struct {
    PyObject_HEAD
    gt_cuda_event *event;  /* the CUDA event; NULL only if construction failed */
    int timing;            /* 1 when elapsed_time() can read it */
} EventObject;

static PyObject *event_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"device", "timing", NULL};
    PyObject *device_obj = NULL;
    int timing = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Op:CudaEvent", keywords, &device_obj, &timing))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    int device = 0;
    if (!module || (device_obj && gtpy_arg_small_int(device_obj, "device", 0, GT_MAX_CUDA_DEVICES - 1,
                                               &device) < 0))
        return NULL;
#ifdef GT_WITH_CUDA
    EventObject *self = (EventObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->timing = timing;
    gt_status status = gt_cuda_event_create(device, timing, &self->event);
    if (status != GT_OK) {
        Py_DECREF(self);
        return gtpy_raise(module, status);
    }
    return (PyObject *)self;
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static void event_dealloc(PyObject *op) {
    PyTypeObject *type = Py_TYPE(op);
#ifdef GT_WITH_CUDA
    gt_cuda_event_destroy(((EventObject *)op)->event);
#endif
    type->tp_free(op);
    Py_DECREF(type);
}

gt_cuda_event *gtpy_cuda_event_of(PyObject *module, PyObject *obj, const char *arg_name) {
    PyObject *event_type = PyObject_GetAttrString(module, "CudaEvent");
    if (!event_type)
        return NULL;
    int is_event = PyObject_TypeCheck(obj, (PyTypeObject *)event_type);
    Py_DECREF(event_type);
    if (!is_event) {
        PyErr_Format(PyExc_TypeError, "%s must be a gputrain CudaEvent, not %.100s", arg_name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((EventObject *)obj)->event;
}

static PyObject *event_record(PyObject *op, PyObject *stream_obj) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_cuda_stream *stream = gtpy_cuda_stream_of(module, stream_obj, "stream");
    if (!stream)
        return NULL;
    gt_status status = gt_cuda_event_record(((EventObject *)op)->event, stream);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *event_synchronize(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_cuda_event *event = ((EventObject *)op)->event;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_cuda_event_synchronize(event);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *event_query(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module)
        return NULL;
#ifdef GT_WITH_CUDA
    int done = 0;
    gt_status status = gt_cuda_event_query(((EventObject *)op)->event, &done);
    return status == GT_OK ? PyBool_FromLong(done) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *event_elapsed_time(PyObject *op, PyObject *end_obj) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_cuda_event *end = gtpy_cuda_event_of(module, end_obj, "end");
    if (!end)
        return NULL;
    float ms = 0.0f;
    gt_status status = gt_cuda_event_elapsed_ms(((EventObject *)op)->event, end, &ms);
    return status == GT_OK ? PyFloat_FromDouble(ms) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *event_get_timing(PyObject *op, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(((EventObject *)op)->timing);
}

static PyMethodDef event_methods[] = {
    {"record", event_record, METH_O,
     "record(stream)\n--\n\nCapture the work queued on a CudaStream of the same device so far."},
    {"synchronize", event_synchronize, METH_NOARGS, "Wait until the recorded work has finished."},
    {"query", event_query, METH_NOARGS, "True when the recorded work has finished (never blocks)."},
    {"elapsed_time", event_elapsed_time, METH_O,
     "elapsed_time(end)\n--\n\nMilliseconds from this event to a later one (both timing events)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef event_getset[] = {
    {"timing", event_get_timing, NULL, "True when elapsed_time() can read this event.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot event_slots[] = {
    {Py_tp_new, event_new},
    {Py_tp_dealloc, event_dealloc},
    {Py_tp_methods, event_methods},
    {Py_tp_getset, event_getset},
    {Py_tp_doc, "CudaEvent(device=0, timing=True)\n--\n\nA CUDA event on one device."},
    {0, NULL},
};

static PyType_Spec event_spec = {
    .name = "gputrain._C.CudaEvent",
    .basicsize = sizeof(EventObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = event_slots,
};

int gtpy_add_cuda_event(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &event_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "CudaEvent", type);
    Py_DECREF(type);
    return rc;
}
