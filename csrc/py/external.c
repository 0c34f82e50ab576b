/* Inputs read where they lie (py/external.h): DeviceArrays, DLPack and the CUDA array interface. */
#include "py/dlpack_take.h"

#include <stdlib.h>
#include <string.h>

/* ---- arrays kept alive until the device work reading them has run ------------------------ */

typedef struct gtpy_held {
    gt_device device;  /* where the work reading it runs */
    gt_event *done;    /* recorded after that work */
    PyObject *keep;    /* what keeps the array's memory alive (a reference) */
} gtpy_held;

struct gtpy_held_list {
    gtpy_held *items;  /* (count,) */
    size_t count;      /* arrays held */
    size_t capacity;   /* entries of `items` */
};

/* Drops entry i (its event first): the list may change while `keep` is released (its deleter
 * may run Python code), so the entry leaves the list before. */
static void held_drop(struct gtpy_held_list *held, size_t i) {
    gtpy_held item = held->items[i];
    held->items[i] = held->items[--held->count];
    const gt_device_backend *dev = gt_device_backend_of(item.device);
    if (dev)
        dev->event_destroy(item.device.index, item.done);
    Py_DECREF(item.keep);
}

/* Releases every held array whose event has completed (`wait`: waits for each first). */
static void held_release(struct gtpy_held_list *held, int wait) {
    for (size_t i = 0; held && i < held->count;) {
        gtpy_held *item = &held->items[i];
        const gt_device_backend *dev = gt_device_backend_of(item->device);
        int done = 1;
        gt_status status = !dev ? GT_OK
                           : wait ? dev->event_synchronize(item->device.index, item->done)
                                  : dev->event_query(item->device.index, item->done, &done);
        if (status != GT_OK)
            gt_clear_error();  /* a failed reader's error is its own to report: the array goes */
        if (done)
            held_drop(held, i);
        else
            i++;
    }
}

int gtpy_held_traverse(struct gtpy_held_list *held, visitproc visit, void *arg) {
    for (size_t i = 0; held && i < held->count; i++)
        Py_VISIT(held->items[i].keep);
    return 0;
}

void gtpy_held_free(struct gtpy_held_list **held) {
    struct gtpy_held_list *list = *held;
    if (!list)
        return;
    held_release(list, 1);
    *held = NULL;
    free(list->items);
    free(list);
}

/* Keeps `keep` (the reference passes) until `done` has completed; without memory for the entry,
 * waits for it instead. */
static void held_add(PyObject *module, gt_device device, gt_event *done, PyObject *keep) {
    gtpy_state *state = gtpy_state_of(module);
    struct gtpy_held_list *held = state->held;
    if (!held && (held = state->held = calloc(1, sizeof *held)) == NULL)
        goto wait;
    held_release(held, 0);
    if (held->count == held->capacity) {
        size_t capacity = held->capacity ? 2 * held->capacity : 8;
        gtpy_held *items = realloc(held->items, capacity * sizeof *items);
        if (!items)
            goto wait;
        held->items = items;
        held->capacity = capacity;
    }
    held->items[held->count++] = (gtpy_held){device, done, keep};
    return;
wait:;
    const gt_device_backend *dev = gt_device_backend_of(device);
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = dev->event_synchronize(device.index, done);
    Py_END_ALLOW_THREADS
    if (status != GT_OK)
        gt_clear_error();
    dev->event_destroy(device.index, done);
    Py_DECREF(keep);
}

/* ---- checks shared by DLPack and the array interface ----------------------------------- */

static const char *kind_dtype(char kind) { return kind == 'f' ? "float32" : "int64"; }

/* Refuses memory on `have` for a model on `want`: 0, or -1 with ValueError. */
static int same_device(gt_device have, gt_device want, const char *arg_name, const char *what) {
    if (have.kind == want.kind && have.index == want.index)
        return 0;
    char have_name[32], want_name[32];
    gt_device_name(have, have_name, sizeof have_name);
    gt_device_name(want, want_name, sizeof want_name);
    PyErr_Format(PyExc_ValueError, "%s: %s on %s, but the model is on %s; move the array to %s first", arg_name,
                 what, have_name, want_name, want_name);
    return -1;
}

/* The shape (1 to GT_MAX_DIMS dimensions, none negative) into `tensor` on `device`; `strides` in
 * elements (NULL: C-contiguous) must be those of a C-contiguous array. 0, or -1 with ValueError. */
static int check_layout(int ndim, const int64_t *shape, const int64_t *strides, const char *arg_name, char kind,
                        gt_device device, gt_tensor *tensor) {
    if (ndim < 1 || ndim > GT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: expected 1 to %d dimensions, got %d", arg_name, GT_MAX_DIMS, ndim);
        return -1;
    }
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: negative extent %lld in dimension %d", arg_name,
                         (long long)shape[i], i);
            return -1;
        }
        if (strides && shape[i] > 1 && strides[i] != expect) {
            PyErr_Format(PyExc_ValueError, "%s: stride %lld elements in dimension %d, where a C-contiguous array has "
                         "%lld; nothing is copied on the device: pass a contiguous array (e.g. .contiguous() or "
                         "cupy.ascontiguousarray)", arg_name, (long long)strides[i], i, (long long)expect);
            return -1;
        }
        expect *= shape[i] ? shape[i] : 1;
    }
    gt_tensor_make(tensor, NULL, kind == 'f' ? GT_F32 : GT_I64, ndim, shape, device);
    return 0;
}

/* A Python int for the consumer's stream in the protocols' convention (1: the default stream). */
static PyObject *stream_handle(const gt_device_backend *dev, gt_stream *consumer) {
    void *native = dev->stream_native(consumer);
    return native ? PyLong_FromVoidPtr(native) : PyLong_FromLong(1);
}

/* ---- DLPack ---------------------------------------------------------------------------- */

/* The gputrain device of a DLPack device, or -1 kind for host memory (cpu, CUDA pinned). */
static int dlpack_to_device(DLDevice d, const char *arg_name, gt_device *out) {
    switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost: out->kind = GT_DEVICE_CPU; break;
    case kDLCUDA:
    case kDLCUDAManaged: out->kind = GT_DEVICE_CUDA; break;
    case kDLExtDev: out->kind = GT_DEVICE_SIM; break;
    default:
        PyErr_Format(PyExc_ValueError, "%s: a DLPack array on device type %d, which gputrain cannot read "
                     "(cpu, cuda and sim only)", arg_name, (int)d.device_type);
        return -1;
    }
    out->index = out->kind == GT_DEVICE_CPU ? 0 : d.device_id;
    return 0;
}

/* The tensor against the announced device and the kind: 0, or -1 with an exception. */
static int dlpack_check(const DLTensor *t, DLDevice announced, const char *arg_name, char kind, gt_device device,
                        gt_tensor *tensor) {
    if (t->device.device_type != announced.device_type || t->device.device_id != announced.device_id) {
        PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor lies on device (%d, %d), not on (%d, %d) as "
                     "__dlpack_device__() said", arg_name, (int)t->device.device_type, (int)t->device.device_id,
                     (int)announced.device_type, (int)announced.device_id);
        return -1;
    }
    DLDataType want = kind == 'f' ? (DLDataType){kDLFloat, 32, 1} : (DLDataType){kDLInt, 64, 1};
    if (t->dtype.code != want.code || t->dtype.bits != want.bits || t->dtype.lanes != want.lanes) {
        char name[32];
        gtpy_dlpack_dtype_name(t->dtype, name, sizeof name);
        PyErr_Format(PyExc_TypeError, "%s: expected a DLPack array of %s (nothing is converted on the device), got "
                     "%s", arg_name, kind_dtype(kind), name);
        return -1;
    }
    if (t->ndim > 0 && !t->shape) {
        PyErr_Format(PyExc_ValueError, "%s: a DLPack tensor of %d dimensions without a shape", arg_name, (int)t->ndim);
        return -1;
    }
    if (check_layout(t->ndim, t->shape, t->strides, arg_name, kind, device, tensor) < 0)
        return -1;
    if (!t->data && gt_tensor_numel(tensor) > 0) {
        PyErr_Format(PyExc_ValueError, "%s: a DLPack tensor without data", arg_name);
        return -1;
    }
    tensor->ptr = (char *)t->data + t->byte_offset;
    return 0;
}

/* A DLPack producer's device array: 1 with in->keep set, or -1 (the producer's capsule untaken). */
static int dlpack_input(PyObject *obj, DLDevice announced, const char *arg_name, char kind,
                        const gt_device_backend *dev, gt_device device, gt_stream *consumer, gt_tensor *tensor,
                        gtpy_array_input *in) {
    PyObject *stream = stream_handle(dev, consumer);
    gtpy_dlpack d;
    int rc = stream ? gtpy_dlpack_get(obj, stream, arg_name, &d) : -1;
    Py_XDECREF(stream);
    if (rc < 0)
        return -1;
    if (dlpack_check(d.tensor, announced, arg_name, kind, device, tensor) == 0)
        in->keep = gtpy_dlpack_take(&d);
    gtpy_dlpack_drop(&d);
    return in->keep ? 1 : -1;
}

/* ---- the array interface --------------------------------------------------------------- */

/* The interface dict's tuple `key` of ints into `out` (at most GT_MAX_DIMS + 1 entries read). */
static int int_tuple(PyObject *value, const char *arg_name, const char *attr, const char *key, int *n, int64_t *out) {
    *n = PyTuple_Check(value) ? (int)PyTuple_GET_SIZE(value) : -1;
    for (int i = 0; *n >= 0 && i < *n && i <= GT_MAX_DIMS; i++) {
        out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(value, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            *n = -1;
        }
    }
    if (*n < 0)
        PyErr_Format(PyExc_TypeError, "%s: %s['%s'] must be a tuple of ints", arg_name, attr, key);
    return *n < 0 ? -1 : 0;
}

/* The dtype of the interface's typestr against the kind: 0, or -1 with TypeError. */
static int check_typestr(PyObject *typestr, const char *arg_name, const char *attr, char kind) {
    PyArray_Descr *descr = NULL;
    if (!PyUnicode_Check(typestr) || !PyArray_DescrConverter(typestr, &descr)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s['typestr'] must be a NumPy type string such as '<f4'", arg_name, attr);
        return -1;
    }
    int ok = descr->type_num == (kind == 'f' ? NPY_FLOAT32 : NPY_INT64) && PyArray_ISNBO(descr->byteorder);
    Py_DECREF(descr);
    if (!ok)
        PyErr_Format(PyExc_TypeError, "%s: expected an array of %s (nothing is converted on the device), got "
                     "typestr %R", arg_name, kind_dtype(kind), typestr);
    return ok ? 0 : -1;
}

/* interface[key], or NULL when absent or None (a borrowed reference). */
static PyObject *item(PyObject *dict, const char *key) {
    PyObject *value = PyDict_GetItemString(dict, key);
    return value == Py_None ? NULL : value;
}

/* The pointer `data` lies in memory of `device` (when there are elements): 0, or -1 with ValueError. */
static int check_pointer(PyObject *module, const gt_device_backend *dev, const void *data, const gt_tensor *tensor,
                         const char *arg_name, const char *attr) {
    int index = -1;
    if (gt_tensor_numel(tensor) == 0)
        return 0;
    gt_status status = dev->pointer_device(data, &index);
    if (status != GT_OK) {
        gtpy_raise_int(module, status);
        return -1;
    }
    if (index == tensor->device.index)
        return 0;
    char want[32];
    gt_device_name(tensor->device, want, sizeof want);
    if (index < 0)
        PyErr_Format(PyExc_ValueError, "%s: %s['data'] %p is not %s device memory, but the model is on %s", arg_name,
                     attr, data, dev->name, want);
    else
        PyErr_Format(PyExc_ValueError, "%s: %s['data'] lies on %s:%d, but the model is on %s; move the array to "
                     "%s first", arg_name, attr, dev->name, index, want, want);
    return -1;
}

/* The producer's stream of a v3 interface into `in`: 0, or -1 with an exception. */
static int interface_stream(PyObject *dict, long version, const gt_device_backend *dev, gt_device device,
                            const char *arg_name, gtpy_array_input *in) {
    PyObject *stream = version >= 3 ? item(dict, "stream") : NULL;
    if (!stream)
        return 0;  /* v2, or None: the data is ready */
    uintptr_t handle = (uintptr_t)PyLong_AsVoidPtr(stream);
    if (PyErr_Occurred())
        return -1;
    gt_status status = dev->stream_from_native(device.index, handle, arg_name, &in->producer);
    if (status != GT_OK)
        return gtpy_raise_int(in->module, status);
    in->wait_producer = 1;
    return 0;
}

/* The array interface dict `dict` (attribute `attr`) of a device array: 1 with in->keep set, or -1. */
static int interface_input(PyObject *obj, PyObject *dict, const char *attr, const char *arg_name, char kind,
                           const gt_device_backend *dev, gt_device device, gt_tensor *tensor, gtpy_array_input *in) {
    if (!PyDict_Check(dict)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a dict", arg_name, attr);
        return -1;
    }
    PyObject *version = item(dict, "version"), *shape = item(dict, "shape"), *typestr = item(dict, "typestr");
    PyObject *data = item(dict, "data"), *strides = item(dict, "strides");
    long v = version ? PyLong_AsLong(version) : -1;
    if (v < 0 || v > 3 || !shape || !typestr || !data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s needs 'version' (0 to 3), 'shape', 'typestr' and 'data' (ptr, "
                     "read_only)", arg_name, attr);
        return -1;
    }
    if (item(dict, "mask")) {
        PyErr_Format(PyExc_ValueError, "%s: a masked array (%s['mask']) cannot be read", arg_name, attr);
        return -1;
    }
    int ndim = 0, n_strides = 0;
    int64_t dims[GT_MAX_DIMS + 1], steps[GT_MAX_DIMS + 1];
    if (int_tuple(shape, arg_name, attr, "shape", &ndim, dims) < 0 || check_typestr(typestr, arg_name, attr, kind) < 0 ||
        (strides && int_tuple(strides, arg_name, attr, "strides", &n_strides, steps) < 0))
        return -1;
    if (strides && n_strides != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %s['strides'] has %d entries for %d dimensions", arg_name, attr,
                     n_strides, ndim);
        return -1;
    }
    int64_t item_bytes = kind == 'f' ? 4 : 8;
    for (int i = 0; strides && i < ndim && i <= GT_MAX_DIMS; i++)  /* bytes to elements; a part: refused */
        steps[i] = steps[i] % item_bytes ? -1 : steps[i] / item_bytes;
    void *ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (PyErr_Occurred() || check_layout(ndim, dims, strides ? steps : NULL, arg_name, kind, device, tensor) < 0 ||
        check_pointer(in->module, dev, ptr, tensor, arg_name, attr) < 0 || interface_stream(dict, v, dev, device, arg_name, in) < 0)
        return -1;
    tensor->ptr = ptr;
    in->keep = Py_NewRef(obj);
    return 1;
}

/* ---- an input on the device -------------------------------------------------------------- */

/* getattr(obj, name) into *out: 1, 0 when absent (no error), -1 with an exception. */
static int optional_attr(PyObject *obj, const char *name, PyObject **out) {
    *out = PyObject_GetAttrString(obj, name);
    if (*out)
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* The array interfaces, by the memory they describe. */
static const struct {
    const char *attr;         /* the attribute */
    gt_device_kind kind;      /* the memory it describes */
} INTERFACES[] = {{"__cuda_array_interface__", GT_DEVICE_CUDA}, {"__sim_array_interface__", GT_DEVICE_SIM}};

/* An object with an array interface: 1 (read), 0 (none), or -1 with an exception. */
static int try_interface(PyObject *obj, const char *arg_name, char kind, gt_device device, gt_tensor *tensor,
                         gtpy_array_input *in) {
    for (size_t i = 0; i < sizeof INTERFACES / sizeof INTERFACES[0]; i++) {
        PyObject *dict;
        int found = optional_attr(obj, INTERFACES[i].attr, &dict);
        if (found <= 0) {
            if (found < 0)
                return -1;
            continue;
        }
        const gt_device_backend *dev = NULL;
        int rc = -1;
        if (INTERFACES[i].kind != device.kind) {
            char want[32];
            gt_device_name(device, want, sizeof want);
            PyErr_Format(PyExc_ValueError, "%s: an array in %s device memory (%s), but the model is on %s", arg_name,
                         INTERFACES[i].kind == GT_DEVICE_CUDA ? "CUDA" : "sim", INTERFACES[i].attr, want);
        } else {
            gt_status status = gt_device_backend_get(device, arg_name, &dev);
            rc = status != GT_OK ? gtpy_raise_int(in->module, status)
                                 : interface_input(obj, dict, INTERFACES[i].attr, arg_name, kind, dev, device, tensor, in);
        }
        Py_DECREF(dict);
        return rc;
    }
    return 0;
}

/* A DLPack producer (both methods present): 1 (read), 0 (host memory or no DLPack), or -1. */
static int try_dlpack(PyObject *obj, const char *arg_name, char kind, gt_device device, gt_stream *consumer,
                      gt_tensor *tensor, gtpy_array_input *in) {
    if (!PyObject_HasAttrString(obj, "__dlpack__") || !PyObject_HasAttrString(obj, "__dlpack_device__"))
        return 0;
    DLDevice announced;
    gt_device have;
    if (gtpy_dlpack_device(obj, arg_name, &announced) < 0 || dlpack_to_device(announced, arg_name, &have) < 0)
        return -1;
    if (have.kind == GT_DEVICE_CPU)
        return 0;  /* host memory: converted as a host input (gtpy_dlpack_host_array) */
    const gt_device_backend *dev = NULL;
    if (same_device(have, device, arg_name, "a DLPack array") < 0)
        return -1;
    gt_status status = gt_device_backend_get(device, arg_name, &dev);
    if (status != GT_OK)
        return gtpy_raise_int(in->module, status);
    return dlpack_input(obj, announced, arg_name, kind, dev, device, consumer, tensor, in);
}

int gtpy_array_input_get(PyObject *module, PyObject *obj, const char *arg_name, char kind, gt_device device,
                         gt_stream *consumer, gt_tensor *tensor, gtpy_array_input *in) {
    *in = (gtpy_array_input){.module = module, .device = device};
    gtpy_held_release_ready(module);  /* the arrays earlier steps have finished reading */
    int rc = gtpy_device_input_get(module, obj, arg_name, kind, device, tensor, &in->array);
    if (rc != 0 || PyArray_Check(obj))
        return rc;
    rc = try_dlpack(obj, arg_name, kind, device, consumer, tensor, in);
    if (rc == 0)
        rc = try_interface(obj, arg_name, kind, device, tensor, in);
    if (rc <= 0)
        return rc;
    const gt_device_backend *dev = gt_device_backend_of(device);
    gt_status status = dev->event_create(device.index, &in->done);
    if (status != GT_OK) {
        Py_CLEAR(in->keep);
        return gtpy_raise_int(module, status);
    }
    return 1;
}

/* Work queued on `consumer` from now on waits for the work queued on `producer` so far. */
static gt_status wait_stream(const gt_device_backend *dev, int index, gt_stream *consumer, gt_stream *producer) {
    gt_event *ready = NULL;
    GT_TRY(dev->event_create(index, &ready));
    gt_status status = dev->event_record(index, ready, producer);
    if (status == GT_OK)
        status = dev->stream_wait_event(index, consumer, ready);
    dev->event_destroy(index, ready);  /* the queued wait keeps its record */
    return status;
}

gt_status gtpy_array_input_begin(const gtpy_array_input *in, gt_stream *consumer) {
    if (!in->keep)
        return gtpy_device_input_begin(&in->array, consumer);
    if (!in->wait_producer)
        return GT_OK;
    return wait_stream(gt_device_backend_of(in->device), in->device.index, consumer, in->producer);
}

gt_status gtpy_array_input_end(gtpy_array_input *in, gt_stream *consumer) {
    if (!in->keep)
        return gtpy_device_input_end(&in->array, consumer);
    const gt_device_backend *dev = gt_device_backend_of(in->device);
    GT_TRY(dev->event_record(in->device.index, in->done, consumer));
    in->recorded = 1;
    return GT_OK;
}

void gtpy_array_input_clear(gtpy_array_input *in) {
    gtpy_device_input_clear(&in->array);
    if (!in->keep)
        return;
    const gt_device_backend *dev = gt_device_backend_of(in->device);
    if (in->recorded) {
        held_add(in->module, in->device, in->done, in->keep);
    } else {  /* nothing was queued that reads it */
        dev->event_destroy(in->device.index, in->done);
        Py_DECREF(in->keep);
    }
    in->keep = NULL;
    in->done = NULL;
}

void gtpy_held_release_ready(PyObject *module) { held_release(gtpy_state_of(module)->held, 0); }
