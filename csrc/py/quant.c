/* Bindings of the blockwise quantization ops (ops.h quantize_blockwise / dequantize_blockwise) for
 * python/gputrain/quant/ (which checks arguments for the user and holds the codebooks):
 *     quantize_blockwise(x, dt, bounds, order, blocksize, bits, device='cpu') -> (codes, absmax)
 *     dequantize_blockwise(codes, absmax, code, n, blocksize, bits, dt, device='cpu') -> out
 * Half arrays are their uint16 bit patterns (float16 also accepted for 'f16'). device 'cpu' runs
 * the CPU op on the arrays; 'sim:N' or 'cuda:N' copies them to that device, runs its op table's
 * entry, and copies the results back. */
#include "py/gtpy.h"

#include <string.h>

#include "core/alloc.h"
#include "core/device_backend.h"
#include "ops/ops.h"

enum { QUANT_BUFFERS = 5 };

/* Host buffers of one call and their device copies: the first `inputs` are read, the rest written. */
typedef struct quant_call {
    void *host[QUANT_BUFFERS];     /* host pointers (arrays' data) */
    size_t bytes[QUANT_BUFFERS];   /* their sizes */
    void *ptr[QUANT_BUFFERS];      /* what the op gets: host or device pointers */
    gt_block blocks[QUANT_BUFFERS]; /* device copies (empty on the CPU) */
    int count, inputs;             /* buffers, and how many of them are inputs */
    int quantize;                  /* 1: quantize_blockwise, 0: dequantize_blockwise */
    int64_t n, blocksize;          /* elements and block size */
    int bits;                      /* 4 or 8 */
    gt_dtype dt;                   /* dtype of the values */
} quant_call;

static gt_status run_op(gt_backend *be, quant_call *c) {
    void **p = c->ptr;
    if (!be->ops->quantize_blockwise || !be->ops->dequantize_blockwise)
        return GT_FAIL(GT_ERR_RUNTIME, "device: backend '%s' has no blockwise quantization", be->ops->name);
    /* buffers: quantize (x, bounds, order | codes, absmax); dequantize (codes, absmax, code | out) */
    if (c->quantize)
        return be->ops->quantize_blockwise(be, p[3], p[4], p[0], c->n, c->blocksize, p[1], p[2], c->bits, c->dt);
    return be->ops->dequantize_blockwise(be, p[3], p[0], p[1], p[2], c->n, c->blocksize, c->bits, c->dt);
}

static gt_status run_device_on(const gt_device_backend *dev, gt_backend *be, quant_call *c) {
    for (int k = 0; k < c->count; k++) {
        GT_TRY(gt_block_alloc(be->device, c->bytes[k] + 1, &c->blocks[k]));
        c->ptr[k] = c->blocks[k].ptr;
        if (k < c->inputs)
            GT_TRY(dev->memcpy(be->device.index, c->ptr[k], c->host[k], c->bytes[k]));
    }
    GT_TRY(run_op(be, c));
    GT_TRY(dev->stream_synchronize(be->device.index, NULL));
    for (int k = c->inputs; k < c->count; k++)
        GT_TRY(dev->memcpy(be->device.index, c->host[k], c->ptr[k], c->bytes[k]));
    return GT_OK;
}

/* Runs the call on the CPU (in place) or on an accelerator through copies. */
static gt_status run_call(gt_device device, quant_call *c) {
    if (!gt_device_is_accelerator(device)) {
        gt_backend be = {gt_cpu_ops(), gt_cpu_device(), NULL, 0, NULL};
        memcpy(c->ptr, c->host, sizeof c->ptr);
        return run_op(&be, c);
    }
    const gt_device_backend *dev = NULL;
    GT_TRY(gt_device_backend_get(device, "device", &dev));
    gt_backend be;
    GT_TRY(dev->backend_init(&be, device.index, NULL));
    gt_status status = run_device_on(dev, &be, c);
    dev->backend_release(&be);
    for (int k = 0; k < c->count; k++)
        gt_block_free(&c->blocks[k]);
    return status;
}

/* A C-contiguous array of NumPy type `type` (any of `alt` too, if >= 0) with `count` elements. */
static PyArrayObject *checked(PyObject *obj, const char *name, int type, int alt, int64_t count) {
    if (!PyArray_Check(obj))
        return (PyArrayObject *)PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, not %.100s", name,
                                             Py_TYPE(obj)->tp_name);
    int t = PyArray_TYPE((PyArrayObject *)obj);
    if (t != type && t != alt)
        return (PyArrayObject *)PyErr_Format(PyExc_TypeError, "%s: dtype %R is not the one expected", name,
                                             (PyObject *)PyArray_DESCR((PyArrayObject *)obj));
    if (PyArray_SIZE((PyArrayObject *)obj) != count)
        return (PyArrayObject *)PyErr_Format(PyExc_ValueError, "%s: has %zd elements, expected %lld", name,
                                             (Py_ssize_t)PyArray_SIZE((PyArrayObject *)obj), (long long)count);
    return (PyArrayObject *)PyArray_FROM_OTF(obj, t, NPY_ARRAY_IN_ARRAY);
}

static int parse_common(PyObject *module, const char *dt_text, const char *device_text, int bits,
                        int64_t blocksize, gt_dtype *dt, gt_device *device) {
    if (bits != 4 && bits != 8) {
        PyErr_Format(PyExc_ValueError, "bits must be 4 or 8, got %d", bits);
        return -1;
    }
    if (blocksize <= 0 || (bits == 4 && blocksize % 2)) {
        PyErr_Format(PyExc_ValueError, "blocksize must be > 0 (and even with 4 bits), got %lld", (long long)blocksize);
        return -1;
    }
    if (gt_dtype_parse(dt_text, "dt", dt) != GT_OK || (*dt != GT_F32 && *dt != GT_F16 && *dt != GT_BF16)) {
        gt_clear_error();
        PyErr_Format(PyExc_ValueError, "dt must be 'f32', 'f16' or 'bf16', got '%s'", dt_text);
        return -1;
    }
    gt_status status = gt_device_parse(device_text, "device", device);
    return status == GT_OK ? 0 : gtpy_raise_int(module, status);
}

static int value_type(gt_dtype dt) { return dt == GT_F32 ? NPY_FLOAT : NPY_UINT16; }

/* Releases the arrays, runs nothing more; returns `result` (NULL on error). */
static PyObject *finish(PyObject *result, PyArrayObject **arrays, int count) {
    for (int k = 0; k < count; k++)
        Py_XDECREF(arrays[k]);
    return result;
}

static PyObject *dispatch(PyObject *module, gt_device device, quant_call *c, PyArrayObject **a) {
    for (int k = 0; k < c->count; k++) {
        c->host[k] = PyArray_DATA(a[k]);
        c->bytes[k] = (size_t)PyArray_NBYTES(a[k]);
    }
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = run_call(device, c);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
}

static PyObject *quantize_blockwise(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"x", "dt", "bounds", "order", "blocksize", "bits", "device", NULL};
    PyObject *x_obj, *bounds_obj, *order_obj;
    const char *dt_text, *device_text = "cpu";
    long long blocksize;
    int bits;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OsOOLi|s:quantize_blockwise", keywords, &x_obj, &dt_text,
                                     &bounds_obj, &order_obj, &blocksize, &bits, &device_text))
        return NULL;
    quant_call c = {.count = 5, .inputs = 3, .quantize = 1, .blocksize = blocksize, .bits = bits};
    gt_device device;
    if (parse_common(module, dt_text, device_text, bits, blocksize, &c.dt, &device) < 0)
        return NULL;
    if (!PyArray_Check(x_obj))
        return PyErr_Format(PyExc_TypeError, "x must be a numpy.ndarray, not %.100s", Py_TYPE(x_obj)->tp_name);
    c.n = PyArray_SIZE((PyArrayObject *)x_obj);
    int64_t blocks = (c.n + blocksize - 1) / blocksize, ncodes = bits == 8 ? c.n : (c.n + 1) / 2;
    PyArrayObject *a[5] = {NULL};
    npy_intp dims_codes = (npy_intp)ncodes, dims_absmax = (npy_intp)blocks;
    if (!(a[0] = checked(x_obj, "x", value_type(c.dt), c.dt == GT_F16 ? NPY_HALF : -1, c.n)) ||
        !(a[1] = checked(bounds_obj, "bounds", NPY_FLOAT, -1, (1 << bits) - 1)) ||
        !(a[2] = checked(order_obj, "order", NPY_UINT8, -1, 1 << bits)) ||
        !(a[3] = (PyArrayObject *)PyArray_SimpleNew(1, &dims_codes, NPY_UINT8)) ||
        !(a[4] = (PyArrayObject *)PyArray_SimpleNew(1, &dims_absmax, NPY_FLOAT)))
        return finish(NULL, a, 5);
    if (!dispatch(module, device, &c, a))
        return finish(NULL, a, 5);
    Py_DECREF(Py_None);
    return finish(PyTuple_Pack(2, a[3], a[4]), a, 5);
}

static PyObject *dequantize_blockwise(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"codes", "absmax", "code", "n", "blocksize", "bits", "dt", "device", NULL};
    PyObject *codes_obj, *absmax_obj, *code_obj;
    const char *dt_text, *device_text = "cpu";
    long long n, blocksize;
    int bits;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOLLis|s:dequantize_blockwise", keywords, &codes_obj,
                                     &absmax_obj, &code_obj, &n, &blocksize, &bits, &dt_text, &device_text))
        return NULL;
    quant_call c = {.count = 4, .inputs = 3, .quantize = 0, .n = n, .blocksize = blocksize, .bits = bits};
    gt_device device;
    if (parse_common(module, dt_text, device_text, bits, blocksize, &c.dt, &device) < 0)
        return NULL;
    if (n < 0)
        return PyErr_Format(PyExc_ValueError, "n must be >= 0, got %lld", n);
    PyArrayObject *a[4] = {NULL};
    npy_intp dims = (npy_intp)n;
    if (!(a[0] = checked(codes_obj, "codes", NPY_UINT8, -1, bits == 8 ? n : (n + 1) / 2)) ||
        !(a[1] = checked(absmax_obj, "absmax", NPY_FLOAT, -1, (n + blocksize - 1) / blocksize)) ||
        !(a[2] = checked(code_obj, "code", NPY_FLOAT, -1, 1 << bits)) ||
        !(a[3] = (PyArrayObject *)PyArray_SimpleNew(1, &dims, c.dt == GT_F16 ? NPY_HALF : value_type(c.dt))))
        return finish(NULL, a, 4);
    if (!dispatch(module, device, &c, a))
        return finish(NULL, a, 4);
    Py_DECREF(Py_None);
    return finish(Py_NewRef((PyObject *)a[3]), a, 4);
}

static PyMethodDef quant_methods[] = {
    {"quantize_blockwise", (PyCFunction)(void (*)(void))quantize_blockwise, METH_VARARGS | METH_KEYWORDS,
     "quantize_blockwise(x, dt, bounds, order, blocksize, bits, device='cpu')\n--\n\n"
     "bitsandbytes-format blockwise quantization (ops.h): returns (codes uint8, absmax float32)."},
    {"dequantize_blockwise", (PyCFunction)(void (*)(void))dequantize_blockwise, METH_VARARGS | METH_KEYWORDS,
     "dequantize_blockwise(codes, absmax, code, n, blocksize, bits, dt, device='cpu')\n--\n\n"
     "Inverse of quantize_blockwise: code[c] * absmax of the block, rounded once to dt."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_quant(PyObject *module) { return PyModule_AddFunctions(module, quant_methods); }
