/* Bindings of the CUDA backend's module-level functions: availability, versions, device
 * properties and selection, synchronisation, TF32, and copies/fills between Buffers.
 * Every function exists in a CPU-only build and raises gputrain.CudaError there. */
#include "py/cuda_py.h"

#ifdef GT_WITH_CUDA
#include "ops_cuda.h"
#endif

#include <limits.h>
#include <stdint.h>

static const char not_compiled_message[] =
    "CUDA was not compiled in: gputrain was built without nvcc (or with GPUTRAIN_CUDA=0)";

PyObject *gtpy_cuda_not_compiled(PyObject *module) {
    PyErr_SetString(gtpy_state_of(module)->cuda_error, not_compiled_message);
    return NULL;
}

/* Reads an int attribute of a Buffer (address, nbytes) as a size_t. */
static int buffer_size_attr(PyObject *obj, const char *name, size_t *out) {
    PyObject *value = PyObject_GetAttrString(obj, name);
    if (!value)
        return -1;
    *out = PyLong_AsSize_t(value);
    Py_DECREF(value);
    return *out == (size_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* Reads a Buffer's device name back into a gt_device. */
static int buffer_device_attr(PyObject *module, PyObject *obj, const char *arg_name,
                              gt_device *out) {
    PyObject *name = PyObject_GetAttrString(obj, "device");
    if (!name)
        return -1;
    int rc = gtpy_parse_device(module, name, arg_name, gt_cpu_device(), out);
    Py_DECREF(name);
    return rc;
}

int gtpy_buffer_view_of(PyObject *module, PyObject *obj, const char *arg_name,
                        gtpy_buffer_view *out) {
    PyObject *buffer_type = PyObject_GetAttrString(module, "Buffer");
    if (!buffer_type)
        return -1;
    int is_buffer = PyObject_TypeCheck(obj, (PyTypeObject *)buffer_type);
    Py_DECREF(buffer_type);
    if (!is_buffer) {
        PyErr_Format(PyExc_TypeError, "%s must be a gputrain.Buffer, not %.100s", arg_name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    size_t address = 0;
    if (buffer_size_attr(obj, "address", &address) < 0 ||
        buffer_size_attr(obj, "nbytes", &out->bytes) < 0 ||
        buffer_device_attr(module, obj, arg_name, &out->device) < 0)
        return -1;
    out->ptr = (void *)(uintptr_t)address;
    return 0;
}

static PyObject *cuda_unavailable_reason(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    return PyUnicode_FromString(gt_cuda_unavailable_reason());
#else
    return PyUnicode_FromString(not_compiled_message);
#endif
}

static PyObject *cuda_runtime_version(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    return PyLong_FromLong(gt_cuda_runtime_version());
#else
    return PyLong_FromLong(0);
#endif
}

static PyObject *cuda_driver_version(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    return PyLong_FromLong(gt_cuda_driver_version());
#else
    return PyLong_FromLong(0);
#endif
}

#ifdef GT_WITH_CUDA
static PyObject *props_to_dict(const gt_cuda_device_props *p) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (gtpy_dict_put(d, "name", PyUnicode_FromString(p->name)) < 0 ||
        gtpy_dict_put(d, "total_memory", PyLong_FromSize_t(p->total_memory)) < 0 ||
        gtpy_dict_put(d, "major", PyLong_FromLong(p->major)) < 0 ||
        gtpy_dict_put(d, "minor", PyLong_FromLong(p->minor)) < 0 ||
        gtpy_dict_put(d, "multi_processor_count", PyLong_FromLong(p->multiprocessor_count)) < 0 ||
        gtpy_dict_put(d, "max_threads_per_block", PyLong_FromLong(p->max_threads_per_block)) < 0 ||
        gtpy_dict_put(d, "warp_size", PyLong_FromLong(p->warp_size)) < 0 ||
        gtpy_dict_put(d, "shared_memory_per_block", PyLong_FromSize_t(p->shared_memory_per_block)) < 0 ||
        gtpy_dict_put(d, "l2_cache_bytes", PyLong_FromSize_t(p->l2_cache_bytes)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}
#endif

static PyObject *cuda_get_device_properties(PyObject *module, PyObject *arg) {
    int index = 0;
    if (gtpy_arg_small_int(arg, "index", 0, INT_MAX, &index) < 0)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_cuda_device_props props;
    gt_status status = gt_cuda_get_device_properties(index, &props);
    return status == GT_OK ? props_to_dict(&props) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cuda_synchronize(PyObject *module, PyObject *arg) {
    int index = 0;
    if (gtpy_arg_small_int(arg, "index", 0, INT_MAX, &index) < 0)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_cuda_device_synchronize(index);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cuda_set_device(PyObject *module, PyObject *arg) {
    int index = 0;
    if (gtpy_arg_small_int(arg, "index", 0, INT_MAX, &index) < 0)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_status status = gt_cuda_set_device(index);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cuda_current_device(PyObject *module, PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    int index = 0;
    gt_status status = gt_cuda_get_device(&index);
    return status == GT_OK ? PyLong_FromLong(index) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cuda_set_tf32(PyObject *module, PyObject *arg) {
    if (!PyBool_Check(arg))
        return PyErr_Format(PyExc_TypeError, "enabled must be a bool, not %.100s",
                            Py_TYPE(arg)->tp_name);
#ifdef GT_WITH_CUDA
    gt_status status = gt_cuda_set_tf32(arg == Py_True);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cuda_tf32_enabled(PyObject *module, PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    return PyBool_FromLong(gt_cuda_tf32_enabled());
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cuda_cublas_tf32(PyObject *module, PyObject *arg) {
    int index = 0;
    if (gtpy_arg_small_int(arg, "index", 0, INT_MAX, &index) < 0)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_cuda_context *context = NULL;
    int tf32 = 0;
    gt_status status = gt_cuda_context_get(index, &context);
    if (status == GT_OK)
        status = gt_cuda_context_cublas_tf32(context, &tf32);
    return status == GT_OK ? PyBool_FromLong(tf32) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cudnn_version(PyObject *module, PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    size_t version = 0;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS  /* the first call loads cuDNN (the resolver takes the GIL itself) */
    status = gt_cuda_cudnn_version(&version);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? PyLong_FromSize_t(version) : gtpy_raise(module, status);
#else
    return PyLong_FromLong(0);
#endif
}

static PyObject *cudnn_set_flags(PyObject *module, PyObject *args) {
    PyObject *benchmark = NULL, *deterministic = NULL;
    if (!PyArg_ParseTuple(args, "O!O!:cudnn_set_flags", &PyBool_Type, &benchmark, &PyBool_Type, &deterministic))
        return NULL;
#ifdef GT_WITH_CUDA
    gt_status status = gt_cuda_cudnn_set_flags(benchmark == Py_True, deterministic == Py_True);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cudnn_flags(PyObject *module, PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    int benchmark = 0, deterministic = 0;
    gt_cuda_cudnn_flags(&benchmark, &deterministic);
    return Py_BuildValue("(NN)", PyBool_FromLong(benchmark), PyBool_FromLong(deterministic));
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cudnn_cached_choices(PyObject *module, PyObject *Py_UNUSED(ignored)) {
#ifdef GT_WITH_CUDA
    return PyLong_FromSize_t(gt_cuda_cudnn_cached_choices());
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyMethodDef cuda_methods[] = {
    {"cuda_unavailable_reason", cuda_unavailable_reason, METH_NOARGS,
     "Why no CUDA device can be used ('' when one can)."},
    {"cuda_runtime_version", cuda_runtime_version, METH_NOARGS,
     "The CUDA runtime version linked in, e.g. 13000 (0 without CUDA)."},
    {"cuda_driver_version", cuda_driver_version, METH_NOARGS,
     "The CUDA version the driver supports, e.g. 13000 (0 without a driver)."},
    {"cuda_get_device_properties", cuda_get_device_properties, METH_O,
     "cuda_get_device_properties(index)\n--\n\nName, memory, compute capability and SMs of a device as a dict."},
    {"cuda_synchronize", cuda_synchronize, METH_O,
     "cuda_synchronize(index)\n--\n\nWait for all work queued on a device."},
    {"cuda_set_device", cuda_set_device, METH_O,
     "cuda_set_device(index)\n--\n\nMake a device current on the calling thread."},
    {"cuda_current_device", cuda_current_device, METH_NOARGS,
     "The device current on the calling thread."},
    {"cuda_set_tf32", cuda_set_tf32, METH_O,
     "cuda_set_tf32(enabled)\n--\n\nAllow TF32 tensor cores for fp32 GEMMs and convolutions."},
    {"cuda_tf32_enabled", cuda_tf32_enabled, METH_NOARGS, "Whether TF32 is allowed."},
    {"cuda_cublas_tf32", cuda_cublas_tf32, METH_O,
     "cuda_cublas_tf32(index)\n--\n\nWhether the device's cuBLAS handle is in TF32 math mode."},
    {"cudnn_version", cudnn_version, METH_NOARGS,
     "cuDNN's version as cudnnGetVersion() gives it, e.g. 91900, loading cuDNN on first use "
     "(CudaError when it cannot be loaded; 0 without CUDA)."},
    {"cudnn_set_flags", cudnn_set_flags, METH_VARARGS,
     "cudnn_set_flags(benchmark, deterministic)\n--\n\nHow conv2d algorithms are chosen from now on."},
    {"cudnn_flags", cudnn_flags, METH_NOARGS, "(benchmark, deterministic) as set."},
    {"cudnn_cached_choices", cudnn_cached_choices, METH_NOARGS,
     "How many conv2d algorithm choices cuDNN's per-shape cache holds."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_cuda(PyObject *module) {
    if (gtpy_add_cuda_libs(module) < 0)
        return -1;
    return PyModule_AddFunctions(module, cuda_methods);
}
