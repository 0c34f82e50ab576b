/* gputrain._C.LoaderTransfer: copies delivered batches to an accelerator (cuda:N, sim:N) (csrc/data/transfer.h),
 * and gputrain._C._DeviceSlot: the owner of one device batch (or of one copied array), which
 * keeps its transfer alive and hands the device memory back when it dies. */
#include "py/loader.h"
#include "py/external.h"

#include "data/transfer.h"

typedef struct {
    PyObject_HEAD
    gt_transfer *transfer;   /* the copies; destroyed with the object */
    PyObject *slot_type;     /* gputrain._C._LoaderSlot */
    PyObject *device_type;   /* gputrain._C._DeviceSlot */
    gt_loader *loader;       /* the engine's loader (the transfer holds a reference to it) */
} TransferObject;

typedef struct {
    PyObject_HEAD
    PyObject *owner;         /* the LoaderTransfer (kept alive while this batch lives) */
    gt_device_batch *batch;  /* the device batch, or NULL for a copied array */
    gt_block block;          /* a copied array's device memory (batch == NULL) */
} DeviceSlotObject;

static gt_transfer *transfer_of(PyObject *op) { return ((TransferObject *)op)->transfer; }

static PyObject *device_slot_new(TransferObject *owner, gt_device_batch *batch, gt_block block) {
    DeviceSlotObject *self = PyObject_GC_New(DeviceSlotObject, (PyTypeObject *)owner->device_type);
    if (!self) {
        if (batch)
            gt_transfer_release(owner->transfer, batch);
        gt_block_free(&block);
        return NULL;
    }
    self->owner = Py_NewRef((PyObject *)owner);
    self->batch = batch;
    self->block = block;
    PyObject_GC_Track((PyObject *)self);
    return (PyObject *)self;
}

static int device_slot_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((DeviceSlotObject *)op)->owner);
    return 0;
}

static void device_slot_dealloc(PyObject *op) {
    DeviceSlotObject *self = (DeviceSlotObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    if (self->batch)
        gt_transfer_release(transfer_of(self->owner), self->batch);
    gt_block_free(&self->block);
    Py_DECREF(self->owner);
    PyObject_GC_Del(op);
    Py_DECREF(type);
}

static char *device_start(DeviceSlotObject *self) {
    return (char *)(self->batch ? self->batch->block.ptr : self->block.ptr);
}

static size_t device_bytes(DeviceSlotObject *self) {
    return self->batch ? self->batch->block.bytes : self->block.bytes;
}

static PyObject *raise_status(PyObject *obj, gt_status status) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(obj), &gtpy_module_def);
    return module ? gtpy_raise(module, status) : NULL;
}

/* The device wait runs without the GIL; handing the host slot back, which a submit on another
 * thread also does (to every batch), runs with it: done without it, both could see the slot still
 * held and hand it back twice. */
static PyObject *device_slot_wait(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    DeviceSlotObject *self = (DeviceSlotObject *)op;
    gt_status status = GT_OK;
    if (self->batch) {
        Py_BEGIN_ALLOW_THREADS
        status = gt_transfer_wait(transfer_of(self->owner), self->batch);
        Py_END_ALLOW_THREADS
        if (status == GT_OK)
            status = gt_transfer_reclaim(transfer_of(self->owner), self->batch);
    }
    return status == GT_OK ? Py_NewRef(Py_None) : raise_status(op, status);
}

/* copy_to(offset, out): fills the C-contiguous writeable array `out` from device offset `offset`. */
static PyObject *device_slot_copy_to(PyObject *op, PyObject *args) {
    DeviceSlotObject *self = (DeviceSlotObject *)op;
    Py_ssize_t offset;
    PyArrayObject *out;
    if (!PyArg_ParseTuple(args, "nO!:copy_to", &offset, &PyArray_Type, &out))
        return NULL;
    size_t bytes = (size_t)PyArray_NBYTES(out);
    if (!PyArray_ISCARRAY(out) || offset < 0 || (size_t)offset + bytes > device_bytes(self))
        return PyErr_Format(PyExc_ValueError, "out: needs a C-contiguous writeable array within the batch");
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_transfer_to_host(transfer_of(self->owner), PyArray_DATA(out), device_start(self) + offset, bytes);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? Py_NewRef(Py_None) : raise_status(op, status);
}

/* The deleter of an exported batch: the copy stream's later work waits for the consumer's. */
static void exported_done(PyObject *owner, gt_stream *consumer) {
    DeviceSlotObject *self = (DeviceSlotObject *)owner;
    if (self->batch)
        gt_transfer_wait_for(transfer_of(self->owner), consumer);
}

/* dlpack(offset, shape, dtype, stream, versioned): a DLPack capsule of the C-contiguous array
 * at device offset `offset`, read by the consumer's `stream` (a native handle in DLPack's
 * convention; -1: the consumer orders its work itself), which waits for the copy into it. */
static PyObject *device_slot_dlpack(PyObject *op, PyObject *args) {
    DeviceSlotObject *self = (DeviceSlotObject *)op;
    Py_ssize_t offset;
    PyObject *shape_obj, *stream_obj;
    PyArray_Descr *dtype;
    int versioned;
    if (!PyArg_ParseTuple(args, "nO!O!Op:dlpack", &offset, &PyTuple_Type, &shape_obj, &PyArrayDescr_Type, &dtype,
                          &stream_obj, &versioned))
        return NULL;
    int ndim = (int)PyTuple_GET_SIZE(shape_obj);
    int64_t shape[GT_MAX_DIMS];
    size_t bytes = (size_t)PyDataType_ELSIZE(dtype);
    for (int i = 0; i < ndim && i < GT_MAX_DIMS; i++) {
        shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape_obj, i));
        bytes *= shape[i] > 0 ? (size_t)shape[i] : 0;
    }
    if (PyErr_Occurred())
        return NULL;
    if (ndim < 1 || ndim > GT_MAX_DIMS || offset < 0 || (size_t)offset > device_bytes(self) ||
        bytes > device_bytes(self) - (size_t)offset)
        return PyErr_Format(PyExc_BufferError, "dlpack: the array lies outside its device batch");
    long long handle = PyLong_AsLongLong(stream_obj);
    if (handle == -1 && PyErr_Occurred())
        return NULL;
    gt_transfer *transfer = transfer_of(self->owner);
    gt_device device = gt_transfer_device(transfer);
    const gt_device_backend *dev = gt_device_backend_of(device);
    gt_stream *consumer = NULL;
    gt_status status = GT_OK;
    if (handle != -1) {
        status = dev->stream_from_native(device.index, (uintptr_t)handle, "stream", &consumer);
        if (status == GT_OK && self->batch)
            status = gt_transfer_consume_begin(transfer, self->batch, consumer);
    }
    if (status != GT_OK)
        return raise_status(op, status);
    return gtpy_dlpack_export(op, device_start(self) + offset, device, ndim, shape, dtype, versioned, consumer,
                              handle != -1 ? exported_done : NULL);
}

static PyObject *device_slot_get_address(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromVoidPtr(device_start((DeviceSlotObject *)op));
}

static PyMethodDef device_slot_methods[] = {
    {"wait", device_slot_wait, METH_NOARGS, "Blocks until the copy into this batch is done."},
    {"copy_to", device_slot_copy_to, METH_VARARGS, "copy_to(offset, out): device bytes into a host array."},
    {"dlpack", device_slot_dlpack, METH_VARARGS,
     "dlpack(offset, shape, dtype, stream, versioned): a DLPack capsule of an array in the batch."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef device_slot_getset[] = {
    {"address", device_slot_get_address, NULL, "Device address of the batch as an int.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot device_slot_slots[] = {
    {Py_tp_dealloc, device_slot_dealloc},
    {Py_tp_traverse, device_slot_traverse},
    {Py_tp_methods, device_slot_methods},
    {Py_tp_getset, device_slot_getset},
    {Py_tp_doc, "Device memory of one delivered batch (or one copied array)."},
    {0, NULL},
};

static PyType_Spec device_slot_spec = {
    .name = "gputrain._C._DeviceSlot",
    .basicsize = sizeof(DeviceSlotObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION |
             Py_TPFLAGS_HAVE_GC,
    .slots = device_slot_slots,
};

/* ---- DeviceArray inputs of the step and of forward ------------------------------------ */

/* The _DeviceSlot behind a DeviceArray `obj` (a new reference), NULL when it is none (no error). */
static PyObject *device_owner(PyObject *module, PyObject *obj) {
    if (PyArray_Check(obj))
        return NULL;
    PyObject *owner = PyObject_GetAttrString(obj, "_owner");
    if (!owner) {
        PyErr_Clear();  /* not a DeviceArray: the caller converts it as a host input */
        return NULL;
    }
    PyObject *type = PyObject_GetAttrString(module, "_DeviceSlot");
    int match = type && Py_IS_TYPE(owner, (PyTypeObject *)type);
    Py_XDECREF(type);
    PyErr_Clear();
    if (!match)
        Py_CLEAR(owner);
    return owner;
}

/* The DeviceArray's shape into `dims` (1 to GT_MAX_DIMS dimensions): 0, or -1 with ValueError. */
static int device_array_shape(PyObject *obj, const char *arg_name, int *ndim, int64_t *dims) {
    PyObject *shape = PyObject_GetAttrString(obj, "shape");
    if (!shape)
        return -1;
    Py_ssize_t n = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
    int rc = n >= 1 && n <= GT_MAX_DIMS ? 0 : -1;
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        rc = dims[i] < 0 ? -1 : 0;
    }
    Py_DECREF(shape);
    if (rc < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: expected a DeviceArray of 1 to %d dimensions", arg_name, GT_MAX_DIMS);
    *ndim = (int)n;
    return rc;
}

/* The DeviceArray's dtype against kind 'f' (float32) or 'i' (int64): 0, or -1 with TypeError. */
static int device_array_dtype(PyObject *obj, const char *arg_name, char kind) {
    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    if (!dtype)
        return -1;
    int want = kind == 'f' ? NPY_FLOAT32 : NPY_INT64;
    int ok = PyArray_DescrCheck(dtype) && ((PyArray_Descr *)dtype)->type_num == want;
    if (!ok)
        PyErr_Format(PyExc_TypeError, "%s: expected a DeviceArray of %s (nothing is converted on the device), "
                     "got dtype %S", arg_name, kind == 'f' ? "float32" : "int64 class indices", dtype);
    Py_DECREF(dtype);
    return ok ? 0 : -1;
}

/* The device memory of the DeviceArray `obj` (owned by `slot`): its offset checked against the slot. */
static char *device_array_data(PyObject *obj, DeviceSlotObject *slot, const char *arg_name, size_t bytes) {
    PyObject *offset_obj = PyObject_GetAttrString(obj, "_offset");
    Py_ssize_t offset = offset_obj ? PyLong_AsSsize_t(offset_obj) : -1;
    Py_XDECREF(offset_obj);
    if (PyErr_Occurred())
        return NULL;
    if (offset < 0 || (size_t)offset > device_bytes(slot) || bytes > device_bytes(slot) - (size_t)offset) {
        PyErr_Format(PyExc_ValueError, "%s: the DeviceArray's %zu bytes at offset %zd lie outside its device "
                     "batch", arg_name, bytes, offset);
        return NULL;
    }
    return device_start(slot) + offset;
}

/* Refuses a DeviceArray on another device than the model's: 0, or -1 with ValueError. */
static int same_device(gt_device have, gt_device want, const char *arg_name) {
    if (have.kind == want.kind && have.index == want.index)
        return 0;
    char have_name[32], want_name[32];
    gt_device_name(have, have_name, sizeof have_name);
    gt_device_name(want, want_name, sizeof want_name);
    PyErr_Format(PyExc_ValueError, "%s: a DeviceArray on %s, but the model is on %s; load the batches with "
                 "DataLoader(device='%s')", arg_name, have_name, want_name, want_name);
    return -1;
}

int gtpy_device_input_get(PyObject *module, PyObject *obj, const char *arg_name, char kind, gt_device device,
                          gt_tensor *tensor, gtpy_device_input *in) {
    *in = (gtpy_device_input){0};
    PyObject *owner = device_owner(module, obj);
    if (!owner)
        return 0;
    DeviceSlotObject *slot = (DeviceSlotObject *)owner;
    gt_transfer *transfer = transfer_of(slot->owner);
    int ndim = 0;
    int64_t dims[GT_MAX_DIMS];
    char *data = NULL;
    if (same_device(gt_transfer_device(transfer), device, arg_name) == 0 &&
        device_array_dtype(obj, arg_name, kind) == 0 && device_array_shape(obj, arg_name, &ndim, dims) == 0) {
        gt_tensor_make(tensor, NULL, kind == 'f' ? GT_F32 : GT_I64, ndim, dims, device);
        data = device_array_data(obj, slot, arg_name, gt_tensor_bytes(tensor));
    }
    if (!data) {
        Py_DECREF(owner);
        return -1;
    }
    tensor->ptr = data;
    *in = (gtpy_device_input){.owner = owner, .transfer = transfer, .batch = slot->batch};
    return 1;
}

gt_status gtpy_device_input_begin(const gtpy_device_input *in, gt_stream *consumer) {
    return in->batch ? gt_transfer_consume_begin(in->transfer, in->batch, consumer) : GT_OK;
}

gt_status gtpy_device_input_end(const gtpy_device_input *in, gt_stream *consumer) {
    return in->batch ? gt_transfer_consume_end(in->transfer, in->batch, consumer) : GT_OK;
}

void gtpy_device_input_clear(gtpy_device_input *in) {
    Py_CLEAR(in->owner);
    in->transfer = NULL;
    in->batch = NULL;
}

/* ---- LoaderTransfer ------------------------------------------------------------------- */

/* `device`: a CUDA ordinal (int) or an accelerator's name ('cuda:N', 'sim:N'). */
static int parse_transfer_device(PyObject *module, PyObject *obj, gt_device *out) {
    if (PyLong_Check(obj)) {
        long index = PyLong_AsLong(obj);
        if (index == -1 && PyErr_Occurred())
            return -1;
        if (index < 0 || index >= GT_MAX_CUDA_DEVICES) {
            PyErr_Format(PyExc_ValueError, "device: CUDA ordinal %ld out of range", index);
            return -1;
        }
        *out = gt_cuda_device((int)index);
        return 0;
    }
    if (gtpy_parse_device(module, obj, "device", gt_cpu_device(), out) < 0)
        return -1;
    if (gt_device_is_accelerator(*out))
        return 0;
    PyErr_SetString(PyExc_ValueError, "device: batches are copied to an accelerator ('cuda:N' or 'sim:N')");
    return -1;
}

static PyObject *transfer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"engine", "device", NULL};
    PyObject *engine, *device_obj;
    gt_device device;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:LoaderTransfer", keywords, &engine, &device_obj))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module || parse_transfer_device(module, device_obj, &device) < 0)
        return NULL;
    gt_loader *loader = gtpy_loader_engine_loader(module, engine);
    if (!loader)
        return NULL;
    TransferObject *self = (TransferObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->loader = loader;
    self->slot_type = PyObject_GetAttrString(module, "_LoaderSlot");
    self->device_type = self->slot_type ? PyObject_GetAttrString(module, "_DeviceSlot") : NULL;
    if (!self->device_type) {
        Py_DECREF(self);
        return NULL;
    }
    gt_loader_stats stats;
    gt_loader_get_stats(loader, &stats);
    gt_status status = gt_transfer_create(loader, device, stats.slot_bytes, &self->transfer);
    if (status != GT_OK) {
        Py_DECREF(self);
        return gtpy_raise(module, status);
    }
    return (PyObject *)self;
}

static int transfer_traverse(PyObject *op, visitproc visit, void *arg) {
    TransferObject *self = (TransferObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->slot_type);
    Py_VISIT(self->device_type);
    return 0;
}

static int transfer_clear(PyObject *op) {
    TransferObject *self = (TransferObject *)op;
    Py_CLEAR(self->slot_type);
    Py_CLEAR(self->device_type);
    return 0;
}

static void transfer_dealloc(PyObject *op) {
    TransferObject *self = (TransferObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    gt_transfer *transfer = self->transfer;
    if (transfer) {  /* no device batch is alive: each holds a reference to this object */
        Py_BEGIN_ALLOW_THREADS
        gt_transfer_destroy(transfer);
        Py_END_ALLOW_THREADS
    }
    transfer_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

/* submit(batch_base): queues the copy of the slot behind a batch's arrays; a _DeviceSlot. */
static PyObject *transfer_submit(PyObject *op, PyObject *slot_obj) {
    TransferObject *self = (TransferObject *)op;
    gt_loader *loader;
    gt_slot *slot;
    if (gtpy_loader_slot_unpack(self->slot_type, slot_obj, &loader, &slot) < 0)
        return NULL;
    if (loader != self->loader)
        return PyErr_Format(PyExc_ValueError, "batch: comes from another loader than this transfer's");
    gt_loader_slot_retain(loader, slot);  /* the transfer's, until the copy is done */
    gt_device_batch *batch;
    gt_status status = gt_transfer_submit(self->transfer, slot, &batch);
    if (status != GT_OK)
        return raise_status(op, status);
    return device_slot_new(self, batch, (gt_block){0});
}

/* copy(array): a C-contiguous host array copied into its own device memory; a _DeviceSlot. */
static PyObject *transfer_copy(PyObject *op, PyObject *array_obj) {
    TransferObject *self = (TransferObject *)op;
    if (!PyArray_Check(array_obj) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)array_obj))
        return PyErr_Format(PyExc_TypeError, "array must be a C-contiguous numpy.ndarray");
    PyArrayObject *array = (PyArrayObject *)array_obj;
    gt_block block = {0};
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_transfer_copy_bytes(self->transfer, PyArray_DATA(array), (size_t)PyArray_NBYTES(array), &block);
    Py_END_ALLOW_THREADS
    if (status != GT_OK)
        return raise_status(op, status);
    return device_slot_new(self, NULL, block);
}

static PyObject *transfer_get_stream(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromVoidPtr(gt_transfer_native_stream(transfer_of(op)));
}

static PyMethodDef transfer_methods[] = {
    {"submit", transfer_submit, METH_O, "submit(batch.base) -> the batch's device copy (queued)."},
    {"copy", transfer_copy, METH_O, "copy(array) -> a device copy of a host array (synchronous)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef transfer_getset[] = {
    {"stream", transfer_get_stream, NULL, "The copy stream's native handle (CUDA: its cudaStream_t) as an int.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot transfer_slots[] = {
    {Py_tp_new, transfer_new},
    {Py_tp_dealloc, transfer_dealloc},
    {Py_tp_traverse, transfer_traverse},
    {Py_tp_clear, transfer_clear},
    {Py_tp_methods, transfer_methods},
    {Py_tp_getset, transfer_getset},
    {Py_tp_doc, "LoaderTransfer(engine, device)\n--\n\nCopies an engine's batches to `device` (a CUDA ordinal, 'cuda:N' or 'sim:N')."},
    {0, NULL},
};

static PyType_Spec transfer_spec = {
    .name = "gputrain._C.LoaderTransfer",
    .basicsize = sizeof(TransferObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = transfer_slots,
};

static int add_type(PyObject *module, PyType_Spec *spec, const char *name) {
    PyObject *type = PyType_FromModuleAndSpec(module, spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, type);
    Py_DECREF(type);
    return rc;
}

int gtpy_add_loader_transfer(PyObject *module) {
    if (add_type(module, &device_slot_spec, "_DeviceSlot") < 0)
        return -1;
    return add_type(module, &transfer_spec, "LoaderTransfer");
}
