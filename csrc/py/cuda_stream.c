/* gputrain._C.CudaStream: a non-blocking CUDA stream on one device. Objects used by work
 * queued on it (Buffers of async copies) are kept alive until the stream is seen idle. */
#include "py/cuda_py.h"

typedef struct {
    PyObject_HEAD
    gt_cuda_stream *stream;  /* the CUDA stream; NULL only if construction failed */
    PyObject *pending;       /* list of objects that queued work uses; emptied when idle */
} StreamObject;

static PyObject *stream_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"device", NULL};
    PyObject *device_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:CudaStream", keywords, &device_obj))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    int device = 0;
    if (!module || (device_obj && gtpy_arg_small_int(device_obj, "device", 0, GT_MAX_CUDA_DEVICES - 1,
                                               &device) < 0))
        return NULL;
#ifdef GT_WITH_CUDA
    StreamObject *self = (StreamObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->pending = PyList_New(0);
    if (!self->pending) {
        Py_DECREF(self);
        return NULL;
    }
    gt_status status = gt_cuda_stream_create(device, &self->stream);
    if (status != GT_OK) {
        Py_DECREF(self);
        return gtpy_raise(module, status);
    }
    return (PyObject *)self;
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static int stream_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((StreamObject *)op)->pending);
    return 0;
}

static int stream_clear(PyObject *op) {
    Py_CLEAR(((StreamObject *)op)->pending);
    return 0;
}

static void stream_dealloc(PyObject *op) {
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
#ifdef GT_WITH_CUDA
    /* Waits for queued work before the objects it uses are released below. */
    gt_cuda_stream *stream = ((StreamObject *)op)->stream;
    if (stream) {
        Py_BEGIN_ALLOW_THREADS
        gt_cuda_stream_destroy(stream);
        Py_END_ALLOW_THREADS
    }
#endif
    stream_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

int gtpy_cuda_stream_keep(PyObject *stream, PyObject *obj) {
    PyObject *pending = ((StreamObject *)stream)->pending;
    if (!pending) {
        PyErr_SetString(PyExc_RuntimeError, "stream: is being destroyed");
        return -1;
    }
    return PyList_Append(pending, obj);
}

#ifdef GT_WITH_CUDA
/* Drops the references of finished work (the stream is idle). */
static int release_pending(StreamObject *self) {
    if (!self->pending)
        return 0;
    return PyList_SetSlice(self->pending, 0, PyList_GET_SIZE(self->pending), NULL);
}
#endif

gt_cuda_stream *gtpy_cuda_stream_of(PyObject *module, PyObject *obj, const char *arg_name) {
    PyObject *stream_type = PyObject_GetAttrString(module, "CudaStream");
    if (!stream_type)
        return NULL;
    int is_stream = PyObject_TypeCheck(obj, (PyTypeObject *)stream_type);
    Py_DECREF(stream_type);
    if (!is_stream) {
        PyErr_Format(PyExc_TypeError, "%s must be a gputrain CudaStream, not %.100s", arg_name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((StreamObject *)obj)->stream;
}

static PyObject *stream_synchronize(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module)
        return NULL;
#ifdef GT_WITH_CUDA
    StreamObject *self = (StreamObject *)op;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_cuda_stream_synchronize(self->stream);
    Py_END_ALLOW_THREADS
    if (status != GT_OK)
        return gtpy_raise(module, status);
    return release_pending(self) < 0 ? NULL : Py_NewRef(Py_None);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *stream_query(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module)
        return NULL;
#ifdef GT_WITH_CUDA
    StreamObject *self = (StreamObject *)op;
    int done = 0;
    gt_status status = gt_cuda_stream_query(self->stream, &done);
    if (status != GT_OK)
        return gtpy_raise(module, status);
    if (done && release_pending(self) < 0)
        return NULL;
    return PyBool_FromLong(done);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *stream_wait_event(PyObject *op, PyObject *event_obj) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_cuda_event *event = gtpy_cuda_event_of(module, event_obj, "event");
    if (!event)
        return NULL;
    gt_status status = gt_cuda_stream_wait_event(((StreamObject *)op)->stream, event);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *stream_get_device(PyObject *op, void *Py_UNUSED(closure)) {
#ifdef GT_WITH_CUDA
    return PyUnicode_FromFormat("cuda:%d", gt_cuda_stream_device(((StreamObject *)op)->stream));
#else
    return PyUnicode_FromString("cuda:0");
#endif
}

static PyObject *stream_get_num_pending(PyObject *op, void *Py_UNUSED(closure)) {
    PyObject *pending = ((StreamObject *)op)->pending;
    return PyLong_FromSsize_t(pending ? PyList_GET_SIZE(pending) : 0);
}

static PyMethodDef stream_methods[] = {
    {"synchronize", stream_synchronize, METH_NOARGS, "Wait until all queued work has finished."},
    {"query", stream_query, METH_NOARGS, "True when all queued work has finished (never blocks)."},
    {"wait_event", stream_wait_event, METH_O,
     "wait_event(event)\n--\n\nMake later work on this stream wait for a recorded CudaEvent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef stream_getset[] = {
    {"device", stream_get_device, NULL, "'cuda:N', the device the stream belongs to.", NULL},
    {"num_pending", stream_get_num_pending, NULL,
     "Objects kept alive for queued work (0 after synchronize()).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot stream_slots[] = {
    {Py_tp_new, stream_new},
    {Py_tp_dealloc, stream_dealloc},
    {Py_tp_traverse, stream_traverse},
    {Py_tp_clear, stream_clear},
    {Py_tp_methods, stream_methods},
    {Py_tp_getset, stream_getset},
    {Py_tp_doc, "CudaStream(device=0)\n--\n\nA non-blocking CUDA stream on one device."},
    {0, NULL},
};

static PyType_Spec stream_spec = {
    .name = "gputrain._C.CudaStream",
    .basicsize = sizeof(StreamObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = stream_slots,
};

int gtpy_add_cuda_stream(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &stream_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "CudaStream", type);
    Py_DECREF(type);
    return rc;
}
