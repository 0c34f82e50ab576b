/* The state of an 8-bit AdamW parameter (csrc/train/optim8.h) as Python sees it: get_state and
 * set_state of _C.Optimizer and _C.ModelOptimizer hand over bitsandbytes' fields ("state1",
 * "state2": uint8 codes; "absmax1", "absmax2": float32 per block) for a parameter kept in 8 bits,
 * or "exp_avg", "exp_avg_sq" (float32) for one kept in 32. */
#include "py/args.h"

#include <string.h>

#include "train/optim.h"
#include "train/optim8.h"
#include "py/optim_py.h"

/* The array type of a field. */
static int field_type(gt_optim8_field f) { return f <= GT_OPTIM8_STATE2 ? NPY_UINT8 : NPY_FLOAT32; }

/* Settles the queued updates before a blocking copy of the state (the device's stream). */
static gt_status settle(gt_optimizer *opt) { return gt_optimizer_synchronize(opt); }

int gtpy_optim_parse_kind(const char *kind, gt_optim_kind *out) {
    if (strcmp(kind, "adamw") == 0)
        *out = GT_OPTIM_ADAMW;
    else if (strcmp(kind, "sgd") == 0)
        *out = GT_OPTIM_SGD;
    else if (strcmp(kind, "adamw8bit") == 0)
        *out = GT_OPTIM_ADAMW8BIT;
    else {
        PyErr_Format(PyExc_ValueError, "kind must be 'adamw', 'sgd' or 'adamw8bit', got '%s'", kind);
        return -1;
    }
    return 0;
}

PyObject *gtpy_optim8_read_state(PyObject *module, gt_optimizer *opt, size_t index) {
    gt_optim8 *state = gt_optimizer_state8(opt);
    int64_t step = 0;
    gt_status status = gt_optimizer_get_param_step(opt, index, &step);
    if (status == GT_OK)
        status = settle(opt);
    if (status != GT_OK)
        return gtpy_raise(module, status);
    PyObject *dict = PyDict_New(), *step_obj = PyLong_FromLongLong(step);
    int ok = dict && step_obj && PyDict_SetItemString(dict, "step", step_obj) == 0;
    Py_XDECREF(step_obj);
    int is_8bit = state->params[index].is_8bit;
    for (int f = 0; ok && f < GT_OPTIM8_FIELD_COUNT; f++) {
        if ((f <= GT_OPTIM8_ABSMAX2) != is_8bit)
            continue;
        npy_intp n = (npy_intp)gt_optim8_field_numel(state, index, (gt_optim8_field)f);
        PyObject *array = PyArray_SimpleNew(1, &n, field_type((gt_optim8_field)f));
        ok = array != NULL;
        if (ok) {
            status = gt_optim8_transfer(state, index, (gt_optim8_field)f, PyArray_DATA((PyArrayObject *)array), 0);
            ok = status == GT_OK ? PyDict_SetItemString(dict, gt_optim8_field_name((gt_optim8_field)f), array) == 0
                                 : gtpy_raise_int(module, status) == 0;
        }
        Py_XDECREF(array);
    }
    if (!ok)
        Py_CLEAR(dict);
    return dict;
}

/* arrays[f] from slots[name of f] (absent or None: NULL), checked for this parameter's format
 * and size; nothing written. */
static int read_fields(gt_optim8 *state, Py_ssize_t index, PyObject *slots, PyArrayObject *arrays[]) {
    int is_8bit = state->params[index].is_8bit;
    for (int f = 0; f < GT_OPTIM8_FIELD_COUNT; f++) {
        const char *name = gt_optim8_field_name((gt_optim8_field)f);
        PyObject *value = PyDict_GetItemString(slots, name);
        if (!value || value == Py_None)
            continue;
        if ((f <= GT_OPTIM8_ABSMAX2) != is_8bit) {
            PyErr_Format(PyExc_ValueError, "state '%s' of parameter %zd: the parameter keeps %s state", name, index,
                         is_8bit ? "8-bit (state1, state2, absmax1, absmax2)" : "32-bit (exp_avg, exp_avg_sq)");
            return -1;
        }
        arrays[f] = (PyArrayObject *)PyArray_FROM_OTF(value, field_type((gt_optim8_field)f), NPY_ARRAY_IN_ARRAY);
        if (!arrays[f])
            return -1;
        npy_intp expected = (npy_intp)gt_optim8_field_numel(state, (size_t)index, (gt_optim8_field)f);
        if (PyArray_SIZE(arrays[f]) != expected) {
            PyErr_Format(PyExc_ValueError, "state '%s' of parameter %zd has %zd elements, expected %zd", name, index,
                         (Py_ssize_t)PyArray_SIZE(arrays[f]), (Py_ssize_t)expected);
            return -1;
        }
    }
    return 0;
}

PyObject *gtpy_optim8_write_state(PyObject *module, gt_optimizer *opt, Py_ssize_t index, Py_ssize_t step,
                                  PyObject *slots) {
    gt_optim8 *state = gt_optimizer_state8(opt);
    if (step < 0)
        return PyErr_Format(PyExc_ValueError, "step must be >= 0, got %zd", step);
    PyArrayObject *arrays[GT_OPTIM8_FIELD_COUNT] = {NULL};
    PyObject *result = NULL;
    if (read_fields(state, index, slots, arrays) == 0) {
        gt_status status = gt_optimizer_set_param_step(opt, (size_t)index, step);
        if (status == GT_OK)
            status = settle(opt);
        for (int f = 0; f < GT_OPTIM8_FIELD_COUNT && status == GT_OK; f++)
            if (arrays[f])
                status = gt_optim8_transfer(state, (size_t)index, (gt_optim8_field)f, PyArray_DATA(arrays[f]), 1);
        result = status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
    }
    for (int f = 0; f < GT_OPTIM8_FIELD_COUNT; f++)
        Py_XDECREF(arrays[f]);
    return result;
}
