/* The bindings' one parser of scalar arguments (args.h). */
#include "py/args.h"

int gtpy_arg_int(PyObject *obj, const char *name, long long low, long long high, long long *out) {
    if (!obj)
        return 0;
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (overflow || value < low || value > high) {
        PyErr_Format(PyExc_ValueError, "%s must be in %lld..%lld, got %R", name, low, high, obj);
        return -1;
    }
    *out = value;
    return 0;
}

int gtpy_arg_small_int(PyObject *obj, const char *name, int low, int high, int *out) {
    long long value = *out;
    if (gtpy_arg_int(obj, name, low, high, &value) < 0)
        return -1;
    *out = (int)value;
    return 0;
}

int gtpy_arg_real(PyObject *obj, const char *name, double *out) {
    if (!obj)
        return 0;
    double value = PyFloat_AsDouble(obj);
    if (value == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a real number, not %.100s", name, Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    *out = value;
    return 0;
}

int gtpy_check_param_index(Py_ssize_t index, size_t count) {
    if (index >= 0 && (size_t)index < count)
        return 0;
    PyErr_Format(PyExc_IndexError, "parameter index %zd out of range (%zu parameters)", index, count);
    return -1;
}
