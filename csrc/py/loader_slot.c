/* gputrain._C._LoaderSlot: the owner of one delivered batch slot. Every NumPy array of the
 * batch has it as its base; when the last one dies the slot goes back to the loader. */
#include "py/loader.h"

typedef struct {
    PyObject_HEAD
    gt_loader *loader;   /* the loader the slot belongs to (kept alive by the reference) */
    gt_slot *slot;       /* the slot; one caller reference is held for it */
} SlotObject;

PyObject *gtpy_loader_slot_new(PyTypeObject *slot_type, gt_loader *loader, gt_slot *slot) {
    SlotObject *self = PyObject_New(SlotObject, slot_type);
    if (!self) {
        gt_loader_slot_release(loader, slot);
        return NULL;
    }
    self->loader = loader;
    self->slot = slot;
    return (PyObject *)self;
}

int gtpy_loader_slot_unpack(PyObject *slot_type, PyObject *obj, gt_loader **loader, gt_slot **slot) {
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)slot_type)) {
        PyErr_Format(PyExc_TypeError, "batch: expected the base of a DataLoader batch (_LoaderSlot), not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *loader = ((SlotObject *)obj)->loader;
    *slot = ((SlotObject *)obj)->slot;
    return 0;
}

static void slot_dealloc(PyObject *op) {
    SlotObject *self = (SlotObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    gt_loader_slot_release(self->loader, self->slot);
    PyObject_Free(op);
    Py_DECREF(type);
}

/* One array viewing field `f` of the slot: shaped like `like` with the batch's rows, or for a
 * ragged field (`like` = (values, offsets, pad)) as (rows, width, *item shape). */
static PyObject *field_view(PyObject *owner, PyObject *like, size_t f) {
    SlotObject *self = (SlotObject *)owner;
    int ragged = PyTuple_Check(like);
    PyArrayObject *array = (PyArrayObject *)(ragged ? PyTuple_GET_ITEM(like, 0) : like);
    int ndim = PyArray_NDIM(array) + ragged;
    if (ndim > NPY_MAXDIMS)
        return PyErr_Format(PyExc_ValueError, "data: ragged array %zu has too many dimensions", f);
    npy_intp dims[NPY_MAXDIMS];
    dims[0] = (npy_intp)self->slot->rows;
    if (ragged)
        dims[1] = (npy_intp)gt_loader_slot_width(self->slot, f);
    memcpy(dims + 1 + ragged, PyArray_DIMS(array) + 1, (size_t)(PyArray_NDIM(array) - 1) * sizeof *dims);
    PyArray_Descr *descr = PyArray_DESCR(array);
    Py_INCREF(descr);
    PyObject *view = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, dims, NULL,
                                          gt_loader_slot_field(self->loader, self->slot, f),
                                          NPY_ARRAY_CARRAY, NULL);
    if (!view)
        return NULL;
    if (PyArray_SetBaseObject((PyArrayObject *)view, Py_NewRef(owner)) < 0) {
        Py_DECREF(view);
        return NULL;
    }
    return view;
}

PyObject *gtpy_loader_slot_views(PyObject *owner, PyObject *arrays) {
    Py_ssize_t n = PyTuple_GET_SIZE(arrays);
    PyObject *views = PyTuple_New(n);
    if (!views)
        return NULL;
    for (Py_ssize_t f = 0; f < n; f++) {
        PyObject *view = field_view(owner, PyTuple_GET_ITEM(arrays, f), (size_t)f);
        if (!view) {
            Py_DECREF(views);
            return NULL;
        }
        PyTuple_SET_ITEM(views, f, view);
    }
    return views;
}

static PyObject *slot_get_rows(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromSize_t(((SlotObject *)op)->slot->rows);
}

static PyObject *slot_get_pinned(PyObject *op, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(((SlotObject *)op)->slot->block.pinned);
}

static PyObject *slot_get_address(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromVoidPtr(((SlotObject *)op)->slot->block.ptr);
}

static PyGetSetDef slot_getset[] = {
    {"rows", slot_get_rows, NULL, "Rows of the batch in the slot.", NULL},
    {"pinned", slot_get_pinned, NULL, "True when the slot is page-locked memory.", NULL},
    {"address", slot_get_address, NULL, "Start address of the slot as an int.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot slot_slots[] = {
    {Py_tp_dealloc, slot_dealloc},
    {Py_tp_getset, slot_getset},
    {Py_tp_doc, "The memory of one delivered batch; the base object of its arrays."},
    {0, NULL},
};

static PyType_Spec slot_spec = {
    .name = "gputrain._C._LoaderSlot",
    .basicsize = sizeof(SlotObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = slot_slots,
};

int gtpy_add_loader_slot(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &slot_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "_LoaderSlot", type);
    Py_DECREF(type);
    return rc;
}
