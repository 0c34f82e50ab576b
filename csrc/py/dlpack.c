/* DLPack capsules (py/dlpack.h): taking another library's tensor (the consumer's side of the
 * protocol) and exporting gputrain's device memory (the producer's side). */
#include "py/dlpack_take.h"

#include <string.h>

/* ---- taking a tensor ------------------------------------------------------------------ */

static const char *const CAPSULE = "dltensor", *const CAPSULE_V = "dltensor_versioned";
static const char *const USED = "used_dltensor", *const USED_V = "used_dltensor_versioned";
static const char *const KEEP = "gputrain.dltensor", *const KEEP_V = "gputrain.dltensor_versioned";

/* Replaces the pending exception of a producer's method with BufferError naming the argument
 * (the original is its __cause__). */
static void producer_failed(PyObject *obj, const char *arg_name, const char *method) {
    PyObject *type, *cause, *traceback;
    PyErr_Fetch(&type, &cause, &traceback);
    PyErr_NormalizeException(&type, &cause, &traceback);
    if (traceback)
        PyException_SetTraceback(cause, traceback);
    PyErr_Format(PyExc_BufferError, "%s: %.100s.%s() failed: %S", arg_name, Py_TYPE(obj)->tp_name, method, cause);
    PyObject *error_type, *error, *error_traceback;
    PyErr_Fetch(&error_type, &error, &error_traceback);
    PyErr_NormalizeException(&error_type, &error, &error_traceback);
    PyException_SetCause(error, cause);  /* steals `cause` */
    PyErr_Restore(error_type, error, error_traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
}

int gtpy_dlpack_device(PyObject *obj, const char *arg_name, DLDevice *out) {
    PyObject *device = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (!device) {
        producer_failed(obj, arg_name, "__dlpack_device__");
        return -1;
    }
    int type = 0, id = 0;
    int ok = PyTuple_Check(device) && PyArg_ParseTuple(device, "ii", &type, &id);
    Py_DECREF(device);
    if (!ok) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: __dlpack_device__() must return a (device_type, device_id) tuple of ints",
                     arg_name);
        return -1;
    }
    *out = (DLDevice){type, id};
    return 0;
}

/* obj.__dlpack__(stream=..., max_version=(1, 1)), or without max_version for a producer that
 * does not take it (DLPack before 1.0); `stream` NULL: not passed. A new reference or NULL. */
static PyObject *call_dlpack(PyObject *obj, PyObject *stream, const char *arg_name) {
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    PyObject *kwargs = method ? PyDict_New() : NULL, *capsule = NULL;
    if (kwargs && (!stream || PyDict_SetItemString(kwargs, "stream", stream) == 0)) {
        PyObject *version = Py_BuildValue("(ii)", GTPY_DLPACK_MAJOR, GTPY_DLPACK_MINOR);
        if (version && PyDict_SetItemString(kwargs, "max_version", version) == 0) {
            capsule = PyObject_VectorcallDict(method, NULL, 0, kwargs);
        }
        Py_XDECREF(version);
    }
    Py_XDECREF(method);
    Py_XDECREF(kwargs);
    if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {  /* a pre-1.0 producer */
        PyErr_Clear();
        capsule = stream ? PyObject_CallMethod(obj, "__dlpack__", "O", stream)
                         : PyObject_CallMethod(obj, "__dlpack__", NULL);
    }
    if (!capsule)
        producer_failed(obj, arg_name, "__dlpack__");
    return capsule;
}

int gtpy_dlpack_get(PyObject *obj, PyObject *stream, const char *arg_name, gtpy_dlpack *out) {
    *out = (gtpy_dlpack){0};
    PyObject *capsule = call_dlpack(obj, stream, arg_name);
    if (!capsule)
        return -1;
    if (PyCapsule_IsValid(capsule, CAPSULE_V)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, CAPSULE_V);
        if (m->version.major != GTPY_DLPACK_MAJOR) {  /* its layout is unknown: not even read */
            DLPackVersion version = m->version;
            Py_DECREF(capsule);  /* its destructor frees the tensor (no exception set while it runs) */
            PyErr_Format(PyExc_BufferError, "%s: a DLPack %u.%u capsule; gputrain reads DLPack %d.x", arg_name,
                         version.major, version.minor, GTPY_DLPACK_MAJOR);
            return -1;
        }
        *out = (gtpy_dlpack){.tensor = &m->dl_tensor, .flags = m->flags, .capsule = capsule, .versioned = 1};
        return 0;
    }
    if (PyCapsule_IsValid(capsule, CAPSULE)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, CAPSULE);
        *out = (gtpy_dlpack){.tensor = &m->dl_tensor, .capsule = capsule};
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s: %.100s.__dlpack__() returned %.100s, not an unused DLPack capsule", arg_name,
                 Py_TYPE(obj)->tp_name, Py_TYPE(capsule)->tp_name);
    *out = (gtpy_dlpack){.capsule = capsule};
    gtpy_dlpack_drop(out);
    return -1;
}

/* Calls the deleter of a taken tensor once its keeper dies; the deleter may run Python code, so a
 * pending exception is kept aside. */
static void keep_destroy(PyObject *keep) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (PyCapsule_IsValid(keep, KEEP_V)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(keep, KEEP_V);
        if (m->deleter)
            m->deleter(m);
    } else {
        DLManagedTensor *m = PyCapsule_GetPointer(keep, KEEP);
        if (m && m->deleter)
            m->deleter(m);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

PyObject *gtpy_dlpack_take(gtpy_dlpack *d) {
    const char *name = d->versioned ? CAPSULE_V : CAPSULE;
    void *managed = PyCapsule_GetPointer(d->capsule, name);
    PyObject *keep = managed ? PyCapsule_New(managed, d->versioned ? KEEP_V : KEEP, keep_destroy) : NULL;
    if (!keep)
        return NULL;  /* the capsule is still the producer's: its destructor frees the tensor */
    if (PyCapsule_SetName(d->capsule, d->versioned ? USED_V : USED) < 0) {
        PyCapsule_SetDestructor(keep, NULL);
        Py_DECREF(keep);
        return NULL;
    }
    Py_CLEAR(d->capsule);
    return keep;
}

void gtpy_dlpack_drop(gtpy_dlpack *d) {
    if (!d->capsule)
        return;
    PyObject *type, *value, *traceback;  /* a producer's destructor may run Python code */
    PyErr_Fetch(&type, &value, &traceback);
    Py_CLEAR(d->capsule);
    PyErr_Restore(type, value, traceback);
}

/* ---- host tensors as NumPy arrays ----------------------------------------------------- */

/* The NumPy type number of a DLPack dtype, or -1. */
static int numpy_type(DLDataType t) {
    if (t.lanes != 1)
        return -1;
    switch (t.code) {
    case kDLFloat: return t.bits == 16 ? NPY_HALF : t.bits == 32 ? NPY_FLOAT32 : t.bits == 64 ? NPY_FLOAT64 : -1;
    case kDLInt:
        return t.bits == 8 ? NPY_INT8 : t.bits == 16 ? NPY_INT16 : t.bits == 32 ? NPY_INT32 : t.bits == 64 ? NPY_INT64 : -1;
    case kDLUInt:
        return t.bits == 8 ? NPY_UINT8 : t.bits == 16 ? NPY_UINT16 : t.bits == 32 ? NPY_UINT32
             : t.bits == 64 ? NPY_UINT64 : -1;
    case kDLBool: return t.bits == 8 ? NPY_BOOL : -1;
    default: return -1;
    }
}

void gtpy_dlpack_dtype_name(DLDataType t, char *buf, size_t bytes) {
    static const char *const names[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    const char *name = t.code < sizeof names / sizeof names[0] ? names[t.code] : "code";
    if (t.lanes == 1)
        snprintf(buf, bytes, "%s%u", name, (unsigned)t.bits);
    else
        snprintf(buf, bytes, "%s%ux%u", name, (unsigned)t.bits, (unsigned)t.lanes);
}

/* A NumPy array viewing the taken tensor of `d`, based on the object keeping it alive. */
static PyObject *host_view(gtpy_dlpack *d, const char *arg_name) {
    const DLTensor *t = d->tensor;
    int type = numpy_type(t->dtype);
    if (t->ndim > 0 && !t->shape)
        return PyErr_Format(PyExc_ValueError, "%s: a DLPack tensor of %d dimensions without a shape", arg_name,
                            (int)t->ndim);
    if (type < 0 || t->ndim < 0 || t->ndim > NPY_MAXDIMS) {
        char name[32];
        gtpy_dlpack_dtype_name(t->dtype, name, sizeof name);
        return PyErr_Format(PyExc_TypeError, "%s: a DLPack array of %s with %d dimensions has no NumPy equivalent",
                            arg_name, name, (int)t->ndim);
    }
    PyArray_Descr *descr = PyArray_DescrFromType(type);
    npy_intp dims[NPY_MAXDIMS], strides[NPY_MAXDIMS];
    for (int i = 0; i < t->ndim; i++) {
        dims[i] = (npy_intp)t->shape[i];
        strides[i] = t->strides ? (npy_intp)t->strides[i] * (npy_intp)PyDataType_ELSIZE(descr) : 0;
    }
    int flags = d->flags & DLPACK_FLAG_BITMASK_READ_ONLY ? 0 : NPY_ARRAY_WRITEABLE;
    PyObject *keep = gtpy_dlpack_take(d);
    if (!keep) {
        Py_DECREF(descr);
        return NULL;
    }
    PyObject *array = PyArray_NewFromDescr(&PyArray_Type, descr, t->ndim, dims, t->strides ? strides : NULL,
                                           (char *)t->data + t->byte_offset, flags, NULL);
    if (!array || PyArray_SetBaseObject((PyArrayObject *)array, keep) < 0) {
        if (!array)
            Py_DECREF(keep);
        Py_XDECREF(array);  /* SetBaseObject stole `keep` even when it failed */
        return NULL;
    }
    return array;
}

PyObject *gtpy_dlpack_host_array(PyObject *obj, const char *arg_name) {
    if (PyArray_Check(obj) || !PyObject_HasAttrString(obj, "__dlpack__") ||
        !PyObject_HasAttrString(obj, "__dlpack_device__"))
        return Py_NewRef(obj);
    DLDevice device;
    if (gtpy_dlpack_device(obj, arg_name, &device) < 0)
        return NULL;
    if (device.device_type != kDLCPU && device.device_type != kDLCUDAHost)
        return Py_NewRef(obj);  /* device memory: gtpy_array_input_get's (it was refused there) */
    gtpy_dlpack d;
    if (gtpy_dlpack_get(obj, NULL, arg_name, &d) < 0)
        return NULL;
    DLDevice lies = d.tensor->device;
    PyObject *array = NULL;
    if (lies.device_type != device.device_type || lies.device_id != device.device_id)
        PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor lies on device (%d, %d), not on (%d, %d) as "
                     "__dlpack_device__() said", arg_name, (int)lies.device_type, (int)lies.device_id,
                     (int)device.device_type, (int)device.device_id);
    else
        array = host_view(&d, arg_name);
    gtpy_dlpack_drop(&d);
    return array;
}

/* ---- exporting device memory ---------------------------------------------------------- */

typedef struct export_ctx {
    PyObject *owner;       /* keeps the memory alive (a reference) */
    gt_stream *consumer;   /* the stream the consumer reads on */
    void (*done)(PyObject *owner, gt_stream *consumer);  /* runs before the owner is dropped, or NULL */
    int64_t shape[GT_MAX_DIMS];  /* (ndim,) the tensor's shape */
    union {
        DLManagedTensor legacy;              /* for a "dltensor" capsule */
        DLManagedTensorVersioned versioned;  /* for a "dltensor_versioned" capsule */
    } managed;
} export_ctx;

/* The deleter, called once by the consumer on any thread. */
static void export_free(export_ctx *ctx) {
    if (!Py_IsInitialized())
        return;  /* the interpreter is gone: the memory went with it */
    PyGILState_STATE gil = PyGILState_Ensure();
    if (ctx->done)
        ctx->done(ctx->owner, ctx->consumer);
    Py_DECREF(ctx->owner);
    PyMem_RawFree(ctx);
    PyGILState_Release(gil);
}

static void delete_legacy(DLManagedTensor *m) { export_free(m->manager_ctx); }
static void delete_versioned(DLManagedTensorVersioned *m) { export_free(m->manager_ctx); }

/* The capsule's destructor: a capsule no consumer took still owns its tensor. */
static void capsule_destroy(PyObject *capsule) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (PyCapsule_IsValid(capsule, CAPSULE_V)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, CAPSULE_V);
        m->deleter(m);
    } else if (PyCapsule_IsValid(capsule, CAPSULE)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, CAPSULE);
        m->deleter(m);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

/* The DLPack dtype of a NumPy dtype, or -1 with BufferError. */
static int dlpack_dtype(PyArray_Descr *dtype, DLDataType *out) {
    int bits = (int)PyDataType_ELSIZE(dtype) * 8;
    switch (dtype->kind) {
    case 'f': *out = (DLDataType){kDLFloat, (uint8_t)bits, 1}; return 0;
    case 'i': *out = (DLDataType){kDLInt, (uint8_t)bits, 1}; return 0;
    case 'u': *out = (DLDataType){kDLUInt, (uint8_t)bits, 1}; return 0;
    case 'b': *out = (DLDataType){kDLBool, 8, 1}; return 0;
    default:
        PyErr_Format(PyExc_BufferError, "a DeviceArray of dtype %S has no DLPack dtype", (PyObject *)dtype);
        return -1;
    }
}

PyObject *gtpy_dlpack_export(PyObject *owner, void *data, gt_device device, int ndim, const int64_t *shape,
                             PyArray_Descr *dtype, int versioned, gt_stream *consumer,
                             void (*done)(PyObject *owner, gt_stream *consumer)) {
    DLDataType type;
    if (dlpack_dtype(dtype, &type) < 0)
        return NULL;
    export_ctx *ctx = PyMem_RawCalloc(1, sizeof *ctx);
    if (!ctx)
        return PyErr_NoMemory();
    memcpy(ctx->shape, shape, (size_t)ndim * sizeof *shape);
    DLTensor tensor = {.data = data, .ndim = ndim, .dtype = type, .shape = ctx->shape, .strides = NULL,
                       .device = {device.kind == GT_DEVICE_CUDA ? kDLCUDA : kDLExtDev, device.index}};
    void *managed;
    if (versioned) {
        ctx->managed.versioned = (DLManagedTensorVersioned){
            .version = {GTPY_DLPACK_MAJOR, GTPY_DLPACK_MINOR}, .manager_ctx = ctx, .deleter = delete_versioned,
            .dl_tensor = tensor};
        managed = &ctx->managed.versioned;
    } else {
        ctx->managed.legacy = (DLManagedTensor){.dl_tensor = tensor, .manager_ctx = ctx, .deleter = delete_legacy};
        managed = &ctx->managed.legacy;
    }
    PyObject *capsule = PyCapsule_New(managed, versioned ? CAPSULE_V : CAPSULE, capsule_destroy);
    if (!capsule) {
        PyMem_RawFree(ctx);
        return NULL;
    }
    ctx->owner = Py_NewRef(owner);
    ctx->consumer = consumer;
    ctx->done = done;
    return capsule;
}
