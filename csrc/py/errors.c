/* From gt_status to Python exceptions (DESIGN.md principle 5). */
#include "py/gtpy.h"

static PyObject *exception_for(PyObject *module, gt_status status) {
    gtpy_state *state = gtpy_state_of(module);
    switch (status) {
    case GT_ERR_VALUE: return PyExc_ValueError;
    case GT_ERR_TYPE: return PyExc_TypeError;
    case GT_ERR_INDEX: return PyExc_IndexError;
    case GT_ERR_OOM: return state->out_of_memory_error;
    case GT_ERR_CUDA: return state->cuda_error;
    case GT_ERR_OS: return PyExc_OSError;
    case GT_ERR_TIMEOUT: return PyExc_TimeoutError;
    case GT_ERR_INTERRUPTED: return PyExc_KeyboardInterrupt;
    case GT_ERR_RUNTIME:
    case GT_OK: break;
    }
    return PyExc_RuntimeError;
}

PyObject *gtpy_raise(PyObject *module, gt_status status) {
    if (!PyErr_Occurred())
        PyErr_SetString(exception_for(module, status), gt_error_message());
    gt_clear_error();
    return NULL;
}

int gtpy_raise_int(PyObject *module, gt_status status) {
    gtpy_raise(module, status);
    return -1;
}

int gtpy_enter(int *busy, const char *what) {
    if (*busy) {
        PyErr_Format(PyExc_RuntimeError, "the %s is in use by another thread", what);
        return -1;
    }
    *busy = 1;
    return 0;
}

int gtpy_parse_device(PyObject *module, PyObject *obj, const char *arg_name, gt_device fallback,
                      gt_device *out) {
    if (obj == NULL || obj == Py_None) {
        *out = fallback;
        return 0;
    }
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str such as 'cpu' or 'cuda:0', not %.100s",
                     arg_name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *text = PyUnicode_AsUTF8(obj);
    if (!text)
        return -1;
    gt_status status = gt_device_parse(text, arg_name, out);
    return status == GT_OK ? 0 : gtpy_raise_int(module, status);
}

static PyObject *set_debug(PyObject *module, PyObject *arg) {
    if (!PyBool_Check(arg))
        return PyErr_Format(PyExc_TypeError, "enabled must be a bool, not %.100s", Py_TYPE(arg)->tp_name);
    gt_set_debug(arg == Py_True);
    Py_RETURN_NONE;
}

static PyObject *get_debug(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(gt_debug_enabled());
}

static PyMethodDef error_methods[] = {
    {"set_debug", set_debug, METH_O,
     "set_debug(enabled)\n--\n\nAppend the C file:line of the failure to error messages (process-wide)."},
    {"get_debug", get_debug, METH_NOARGS,
     "get_debug()\n--\n\nTrue when error messages end with the C file:line (set_debug or GPUTRAIN_DEBUG)."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_errors(PyObject *module) { return PyModule_AddFunctions(module, error_methods); }
