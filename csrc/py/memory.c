/* Bindings of the allocator's accounting: limits, fractions, statistics. */
#include "py/gtpy.h"

#include "core/alloc.h"
#include "core/device_backend.h"

static int parse_device_kw(PyObject *module, PyObject *device_obj, gt_device *device) {
    return gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), device);
}

static PyObject *set_memory_limit(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"limit", "device", NULL};
    PyObject *limit_obj = NULL, *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:set_memory_limit", keywords, &limit_obj,
                                     &device_obj))
        return NULL;
    gt_device device;
    if (parse_device_kw(module, device_obj, &device) < 0)
        return NULL;
    size_t limit = GT_NO_LIMIT;
    if (limit_obj != Py_None) {
        if (!PyLong_Check(limit_obj) || PyBool_Check(limit_obj))
            return PyErr_Format(PyExc_TypeError, "limit must be an int number of bytes or None, not %.100s",
                                Py_TYPE(limit_obj)->tp_name);
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(limit_obj, &overflow);
        if (value == -1 && PyErr_Occurred())
            return NULL;
        if (overflow || value < 0)
            return PyErr_Format(PyExc_ValueError, "limit must be >= 0 and < 2**63 bytes, got %R", limit_obj);
        limit = (size_t)value;
    }
    gt_status status = gt_mem_set_limit(device, limit);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
}

static PyObject *set_memory_fraction(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"fraction", "device", NULL};
    double fraction = 0.0;
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "d|O:set_memory_fraction", keywords, &fraction,
                                     &device_obj))
        return NULL;
    gt_device device;
    if (parse_device_kw(module, device_obj, &device) < 0)
        return NULL;
    if (!(fraction > 0.0 && fraction <= 1.0))
        return PyErr_Format(PyExc_ValueError, "fraction must be in (0, 1], got %R",
                            PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : Py_None);
    gt_status status = gt_mem_set_fraction(device, fraction);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
}

/* A byte count, or None for GT_NO_LIMIT. */
static int put_size(PyObject *dict, const char *key, size_t value) {
    return gtpy_dict_put(dict, key, value == GT_NO_LIMIT ? Py_NewRef(Py_None) : PyLong_FromSize_t(value));
}

static PyObject *stats_to_dict(const gt_mem_stats *s) {
    PyObject *dict = PyDict_New();
    if (!dict)
        return NULL;
    if (put_size(dict, "allocated_bytes", s->allocated) < 0 ||
        put_size(dict, "reserved_bytes", s->reserved) < 0 ||
        put_size(dict, "peak_allocated_bytes", s->peak_allocated) < 0 ||
        put_size(dict, "peak_reserved_bytes", s->peak_reserved) < 0 ||
        put_size(dict, "limit_bytes", s->limit) < 0 || put_size(dict, "num_allocs", s->num_allocs) < 0 ||
        put_size(dict, "num_frees", s->num_frees) < 0 || put_size(dict, "num_ooms", s->num_ooms) < 0 ||
        put_size(dict, "num_pin_fallbacks", s->num_pin_fallbacks) < 0 ||
        put_size(dict, "active_blocks", s->active_blocks) < 0) {
        Py_DECREF(dict);
        return NULL;
    }
    return dict;
}

static PyObject *memory_stats(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"device", NULL};
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:memory_stats", keywords, &device_obj))
        return NULL;
    gt_device device;
    if (parse_device_kw(module, device_obj, &device) < 0)
        return NULL;
    gt_mem_stats stats;
    gt_status status = gt_mem_get_stats(device, &stats);
    return status == GT_OK ? stats_to_dict(&stats) : gtpy_raise(module, status);
}

static PyObject *reset_peak_memory_stats(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"device", NULL};
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:reset_peak_memory_stats", keywords,
                                     &device_obj))
        return NULL;
    gt_device device;
    if (parse_device_kw(module, device_obj, &device) < 0)
        return NULL;
    gt_status status = gt_mem_reset_peak(device);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
}

/* device_counters(device, reset=False): the device interface's counters as a dict of ints. */
static PyObject *device_counters(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"device", "reset", NULL};
    PyObject *device_obj;
    int reset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p:device_counters", keywords, &device_obj, &reset))
        return NULL;
    gt_device device;
    if (parse_device_kw(module, device_obj, &device) < 0)
        return NULL;
    if (!gt_device_is_accelerator(device))
        return PyErr_Format(PyExc_ValueError, "device: counters are kept for accelerators ('cuda:N', 'sim:N'), got %R",
                            device_obj);
    gt_device_counters c;
    gt_device_counters_get(device, &c);
    if (reset)
        gt_device_counters_reset(device);
    return Py_BuildValue("{sKsKsKsKsKsKsK}", "syncs", c.syncs, "launches", c.launches, "h2d_bytes", c.h2d_bytes,
                         "d2h_bytes", c.d2h_bytes, "d2d_bytes", c.d2d_bytes, "allocs", c.allocs, "frees", c.frees);
}

static PyMethodDef memory_methods[] = {
    {"device_counters", (PyCFunction)(void (*)(void))device_counters, METH_VARARGS | METH_KEYWORDS,
     "device_counters(device, reset=False)\n--\n\nWhat gputrain asked of an accelerator since the last reset: "
     "host syncs, launches, H2D/D2H/D2D bytes, allocations and frees; reset=True zeroes them after reading."},
    {"set_memory_limit", (PyCFunction)(void (*)(void))set_memory_limit, METH_VARARGS | METH_KEYWORDS,
     "set_memory_limit(limit, device='cpu')\n--\n\nCap the bytes gputrain may reserve on a device (None removes the cap)."},
    {"set_memory_fraction", (PyCFunction)(void (*)(void))set_memory_fraction,
     METH_VARARGS | METH_KEYWORDS,
     "set_memory_fraction(fraction, device='cpu')\n--\n\nCap reserved bytes at a fraction of the device's memory."},
    {"memory_stats", (PyCFunction)(void (*)(void))memory_stats, METH_VARARGS | METH_KEYWORDS,
     "memory_stats(device='cpu')\n--\n\nThe allocator's statistics for a device as a dict of ints."},
    {"reset_peak_memory_stats", (PyCFunction)(void (*)(void))reset_peak_memory_stats,
     METH_VARARGS | METH_KEYWORDS,
     "reset_peak_memory_stats(device='cpu')\n--\n\nReset the peak statistics to the current values."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_memory(PyObject *module) { return PyModule_AddFunctions(module, memory_methods); }
