/* gputrain._C.Buffer: one accounted block of device, host or pinned memory.
 * Host buffers can be viewed as NumPy arrays; a view keeps its buffer alive. */
#include "py/gtpy.h"

#include "core/alloc.h"

typedef struct {
    PyObject_HEAD
    gt_block block;   /* the memory; freed when the Buffer is deallocated */
} BufferObject;

/* A positive byte count from an int (or an object with __index__); a count beyond any address
 * space is a ValueError naming `name`, not an OverflowError. */
static int parse_nbytes(PyObject *obj, const char *name, Py_ssize_t *out) {
    PyObject *index = PyNumber_Index(obj);
    if (!index)
        return -1;
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (overflow > 0 || value > PY_SSIZE_T_MAX) {
        PyErr_Format(PyExc_ValueError, "%s is too large: more than %zd bytes", name, PY_SSIZE_T_MAX);
        return -1;
    }
    if (overflow < 0 || value <= 0) {
        PyErr_Format(PyExc_ValueError, "%s must be > 0, got %S", name, obj);
        return -1;
    }
    *out = (Py_ssize_t)value;
    return 0;
}

static PyObject *buffer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"nbytes", "device", NULL};
    PyObject *nbytes_obj = NULL, *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:Buffer", keywords, &nbytes_obj, &device_obj))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module)
        return NULL;
    Py_ssize_t nbytes = 0;
    if (parse_nbytes(nbytes_obj, "nbytes", &nbytes) < 0)
        return NULL;
    gt_device device;
    if (gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &device) < 0)
        return NULL;
    BufferObject *self = (BufferObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_block_alloc(device, (size_t)nbytes, &self->block);
    Py_END_ALLOW_THREADS
    if (status != GT_OK) {
        Py_DECREF(self);
        return gtpy_raise(module, status);
    }
    return (PyObject *)self;
}

static void buffer_dealloc(PyObject *op) {
    BufferObject *self = (BufferObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    gt_block_free(&self->block);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *buffer_numpy(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    BufferObject *self = (BufferObject *)op;
    if (gt_device_is_accelerator(self->block.device))
        return PyErr_Format(PyExc_TypeError, "a CUDA or sim device buffer cannot be viewed as a NumPy array");
    npy_intp dims[1] = {(npy_intp)self->block.bytes};
    PyObject *array = PyArray_SimpleNewFromData(1, dims, NPY_UINT8, self->block.ptr);
    if (!array)
        return NULL;
    if (PyArray_SetBaseObject((PyArrayObject *)array, Py_NewRef(op)) < 0) {
        Py_DECREF(array);
        return NULL;
    }
    return array;
}

static PyObject *buffer_get_nbytes(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromSize_t(((BufferObject *)op)->block.bytes);
}

static PyObject *buffer_get_device(PyObject *op, void *Py_UNUSED(closure)) {
    char name[32];
    gt_device_name(((BufferObject *)op)->block.device, name, sizeof name);
    return PyUnicode_FromString(name);
}

static PyObject *buffer_get_pinned(PyObject *op, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(((BufferObject *)op)->block.pinned);
}

static PyObject *buffer_get_address(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromVoidPtr(((BufferObject *)op)->block.ptr);
}

static PyMethodDef buffer_methods[] = {
    {"numpy", buffer_numpy, METH_NOARGS, "A uint8 NumPy view of a host buffer (keeps it alive)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"nbytes", buffer_get_nbytes, NULL, "Size in bytes.", NULL},
    {"device", buffer_get_device, NULL, "'cpu', 'pinned' or 'cuda:N'.", NULL},
    {"pinned", buffer_get_pinned, NULL, "True when the host memory is page-locked.", NULL},
    {"address", buffer_get_address, NULL, "The start address as an int.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_tp_new, buffer_new},
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {Py_tp_doc, "Buffer(nbytes, device='cpu')\n--\n\nOne block from gputrain's accounted allocator."},
    {0, NULL},
};

static PyType_Spec buffer_spec = {
    .name = "gputrain._C.Buffer",
    .basicsize = sizeof(BufferObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = buffer_slots,
};

int gtpy_add_buffer(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &buffer_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Buffer", type);
    Py_DECREF(type);
    return rc;
}
