/* Bindings of copies and fills on gputrain.Buffer objects: host<->device and
 * device<->device, synchronous or queued on a CudaStream (which then keeps both Buffers
 * alive until it is seen idle). */
#include "py/cuda_py.h"

/* Direction of a copy between two Buffers, and the device that runs it. */
typedef struct copy_plan {
    gt_cuda_copy_kind kind;  /* host->device, device->host, same device, or between devices */
    int device;              /* CUDA ordinal made current for the copy */
} copy_plan;

static int plan_copy(const gtpy_buffer_view *dst, const gtpy_buffer_view *src, copy_plan *out) {
    int dst_cuda = dst->device.kind == GT_DEVICE_CUDA;
    int src_cuda = src->device.kind == GT_DEVICE_CUDA;
    if (!dst_cuda && !src_cuda) {
        PyErr_SetString(PyExc_ValueError,
                        "dst, src: at least one must be a CUDA buffer (copy host memory with NumPy)");
        return -1;
    }
    if (dst_cuda && src_cuda)
        out->kind = dst->device.index == src->device.index ? GT_COPY_DEVICE_TO_DEVICE : GT_COPY_DEFAULT;
    else
        out->kind = dst_cuda ? GT_COPY_HOST_TO_DEVICE : GT_COPY_DEVICE_TO_HOST;
    out->device = dst_cuda ? dst->device.index : src->device.index;
    return 0;
}

/* Reads the optional nbytes argument (None -> `fallback`) and checks it fits `limit`. */
static int parse_nbytes(PyObject *obj, size_t fallback, size_t limit, size_t *out) {
    if (obj == Py_None) {
        *out = fallback;
    } else if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "nbytes must be an int or None, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    } else {
        long long value = PyLong_AsLongLong(obj);
        if (value == -1 && PyErr_Occurred())
            return -1;
        if (value < 0) {
            PyErr_Format(PyExc_ValueError, "nbytes must be >= 0, got %lld", value);
            return -1;
        }
        *out = (size_t)value;
    }
    if (*out > limit) {
        PyErr_Format(PyExc_ValueError, "nbytes: %zu bytes do not fit (the smaller buffer has %zu bytes)", *out,
                     limit);
        return -1;
    }
    return 0;
}

#ifdef GT_WITH_CUDA
/* The stream argument (None -> NULL); it must belong to the device that runs the work. */
static int parse_stream(PyObject *module, PyObject *obj, int device, gt_cuda_stream **out) {
    *out = NULL;
    if (obj == Py_None)
        return 0;
    *out = gtpy_cuda_stream_of(module, obj, "stream");
    if (!*out)
        return -1;
    if (gt_cuda_stream_device(*out) != device) {
        PyErr_Format(PyExc_ValueError, "stream belongs to cuda:%d but the copy runs on cuda:%d",
                     gt_cuda_stream_device(*out), device);
        return -1;
    }
    return 0;
}
#endif

static PyObject *cuda_copy(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dst", "src", "nbytes", "stream", NULL};
    PyObject *dst_obj = NULL, *src_obj = NULL, *nbytes_obj = Py_None, *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:cuda_copy", keywords, &dst_obj, &src_obj,
                                     &nbytes_obj, &stream_obj))
        return NULL;
    gtpy_buffer_view dst, src;
    copy_plan plan;
    size_t nbytes = 0;
    if (gtpy_buffer_view_of(module, dst_obj, "dst", &dst) < 0 ||
        gtpy_buffer_view_of(module, src_obj, "src", &src) < 0 ||
        parse_nbytes(nbytes_obj, src.bytes, dst.bytes < src.bytes ? dst.bytes : src.bytes, &nbytes) < 0 ||
        plan_copy(&dst, &src, &plan) < 0)
        return NULL;
#ifdef GT_WITH_CUDA
    gt_cuda_stream *stream = NULL;
    if (parse_stream(module, stream_obj, plan.device, &stream) < 0)
        return NULL;
    if (stream && (gtpy_cuda_stream_keep(stream_obj, dst_obj) < 0 ||
                   gtpy_cuda_stream_keep(stream_obj, src_obj) < 0))
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = stream ? gt_cuda_memcpy_async(dst.ptr, src.ptr, nbytes, plan.kind, stream)
                    : gt_cuda_memcpy(dst.ptr, src.ptr, nbytes, plan.kind, plan.device);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyObject *cuda_memset(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dst", "value", "nbytes", "stream", NULL};
    PyObject *dst_obj = NULL, *value_obj = NULL, *nbytes_obj = Py_None, *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:cuda_memset", keywords, &dst_obj,
                                     &value_obj, &nbytes_obj, &stream_obj))
        return NULL;
    gtpy_buffer_view dst;
    int value = 0;
    size_t nbytes = 0;
    if (gtpy_buffer_view_of(module, dst_obj, "dst", &dst) < 0 ||
        gtpy_arg_small_int(value_obj, "value", 0, 255, &value) < 0 ||
        parse_nbytes(nbytes_obj, dst.bytes, dst.bytes, &nbytes) < 0)
        return NULL;
    if (dst.device.kind != GT_DEVICE_CUDA)
        return PyErr_Format(PyExc_ValueError, "dst must be a CUDA buffer (fill host memory with NumPy)");
#ifdef GT_WITH_CUDA
    gt_cuda_stream *stream = NULL;
    if (parse_stream(module, stream_obj, dst.device.index, &stream) < 0)
        return NULL;
    if (stream && gtpy_cuda_stream_keep(stream_obj, dst_obj) < 0)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = stream ? gt_cuda_memset_async(dst.ptr, value, nbytes, stream)
                    : gt_cuda_memset(dst.ptr, value, nbytes, dst.device.index);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
#else
    return gtpy_cuda_not_compiled(module);
#endif
}

static PyMethodDef cuda_copy_methods[] = {
    {"cuda_copy", (PyCFunction)(void (*)(void))cuda_copy, METH_VARARGS | METH_KEYWORDS,
     "cuda_copy(dst, src, nbytes=None, stream=None)\n--\n\n"
     "Copy nbytes (default: all of src) between Buffers, at least one on a CUDA device.\n"
     "With a CudaStream the copy is queued and both Buffers stay alive until the stream is idle."},
    {"cuda_memset", (PyCFunction)(void (*)(void))cuda_memset, METH_VARARGS | METH_KEYWORDS,
     "cuda_memset(dst, value, nbytes=None, stream=None)\n--\n\n"
     "Set nbytes (default: all) of a CUDA Buffer to the byte value."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_cuda_copy(PyObject *module) { return PyModule_AddFunctions(module, cuda_copy_methods); }
