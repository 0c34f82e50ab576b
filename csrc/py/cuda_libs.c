/* The CUDA libraries the backend opens when first needed (cuda/cuda_libs.cu): the resolver that
 * asks the Python layer (gputrain._cuda_libs, which asks NVIDIA's cuda.pathfinder) which copy to
 * open, and `cuda_libraries(load)`, which reports (and, asked to, loads) them without a device. */
#include "py/cuda_py.h"

#include <stdio.h>
#include <string.h>

#ifdef GT_WITH_CUDA
/* Copies str(exc) of the pending exception into `why` and clears it. */
static void take_error(char *why, size_t why_size) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
#else
    PyObject *type = NULL, *value = NULL, *traceback = NULL;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
#endif
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
    snprintf(why, why_size, "%s", utf8 ? utf8 : "the Python resolver failed");
    PyErr_Clear();
    Py_XDECREF(text);
    Py_XDECREF(value);
}

/* gt_cuda_lib_resolver: gputrain._cuda_libs.find(name, soname) under the GIL (taken from any
 * thread; the loader holds none of its locks while calling this). */
static int resolve_with_python(const char *name, const char *soname, char *path, size_t path_size,
                               char *why, size_t why_size) {
    if (!Py_IsInitialized()) {
        snprintf(why, why_size, "the Python interpreter is not running");
        return -1;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    PyObject *finder = PyImport_ImportModule("gputrain._cuda_libs");
    PyObject *found = finder ? PyObject_CallMethod(finder, "find", "ss", name, soname) : NULL;
    const char *utf8 = found && PyUnicode_Check(found) ? PyUnicode_AsUTF8(found) : NULL;
    if (utf8 && strlen(utf8) < path_size) {
        snprintf(path, path_size, "%s", utf8);
        rc = 0;
    } else if (PyErr_Occurred()) {
        take_error(why, why_size);
    } else {
        snprintf(why, why_size, "gputrain._cuda_libs.find returned no usable path");
    }
    Py_XDECREF(found);
    Py_XDECREF(finder);
    PyGILState_Release(gil);
    return rc;
}

/* {"soname", "path", "loaded", "version", "min_version", "built_with"} of one library. */
static PyObject *info_dict(const gt_cuda_lib_info *info) {
    return Py_BuildValue("{s:s, s:s, s:O, s:l, s:l, s:l}", "soname", info->soname, "path", info->path, "loaded",
                         info->loaded ? Py_True : Py_False, "version", info->version, "min_version",
                         info->min_version, "built_with", info->built_with);
}
#endif

static PyObject *cuda_libraries(PyObject *module, PyObject *arg) {
    if (!PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "load must be a bool, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
#ifdef GT_WITH_CUDA
    PyObject *out = PyDict_New();
    for (int lib = 0; out && lib < GT_CUDA_LIB_COUNT; lib++) {
        gt_status status = GT_OK;
        if (arg == Py_True) {
            Py_BEGIN_ALLOW_THREADS
            status = gt_cuda_lib_load((gt_cuda_lib)lib);
            Py_END_ALLOW_THREADS
        }
        gt_cuda_lib_info info;
        if (status == GT_OK)
            status = gt_cuda_lib_get_info((gt_cuda_lib)lib, &info);
        if (status != GT_OK) {
            Py_DECREF(out);
            return gtpy_raise(module, status);
        }
        PyObject *item = info_dict(&info);
        if (!item || PyDict_SetItemString(out, info.name, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyMethodDef cuda_libs_methods[] = {
    {"cuda_libraries", cuda_libraries, METH_O,
     "cuda_libraries(load)\n--\n\nThe CUDA libraries opened when first needed (cuBLASLt, cuBLAS, cuDNN, NCCL): "
     "per name, soname, path, loaded, version, min_version and built_with; with load=True each is loaded "
     "first (CudaError if one cannot be). Needs no GPU."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_cuda_libs(PyObject *module) {
#ifdef GT_WITH_CUDA
    gt_cuda_set_lib_resolver(resolve_with_python);
#endif
    return PyModule_AddFunctions(module, cuda_libs_methods);
}
