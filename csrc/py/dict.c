/* Building result dicts in the bindings: set a key to a new reference, failing cleanly. */
#include "py/gtpy.h"

int gtpy_dict_put(PyObject *dict, const char *key, PyObject *value) {
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return rc;
}

int gtpy_dict_put_size(PyObject *dict, const char *key, size_t value) {
    return gtpy_dict_put(dict, key, PyLong_FromSize_t(value));
}
