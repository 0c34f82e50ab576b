/* Bindings of core/philox.h: the raw Philox4x32-10 bijection and bulk draws of words, uniforms
 * and normals for a (seed, stream_a, stream_b) stream, so tests and Python code see exactly the
 * numbers the C and CUDA kernels use. */
#include "py_testing/testing.h"

#include "core/philox.h"

/* Converts an int in [0, max] to uint64, naming `arg_name` in errors. */
static int parse_unsigned(PyObject *obj, const char *arg_name, uint64_t max, uint64_t *out) {
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", arg_name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long value = PyLong_AsUnsignedLongLong(obj);
    if ((value == (unsigned long long)-1 && PyErr_Occurred()) || value > max) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be in 0..%llu, got %R", arg_name, (unsigned long long)max,
                     obj);
        return -1;
    }
    *out = value;
    return 0;
}

/* Reads a sequence of exactly `n` uint32 values. */
static int parse_words(PyObject *obj, const char *arg_name, size_t n, uint32_t *out) {
    PyObject *seq = PySequence_Fast(obj, "");
    if (!seq || (size_t)PySequence_Fast_GET_SIZE(seq) != n) {
        Py_XDECREF(seq);
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a sequence of %zu uint32 values", arg_name, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t word;
        if (parse_unsigned(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i), arg_name, UINT32_MAX, &word) < 0) {
            Py_DECREF(seq);
            return -1;
        }
        out[i] = (uint32_t)word;
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *philox4x32_10(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"counter", "key", NULL};
    PyObject *counter_obj, *key_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:philox4x32_10", keywords, &counter_obj, &key_obj))
        return NULL;
    uint32_t counter[4], key[2], out[4];
    if (parse_words(counter_obj, "counter", 4, counter) < 0 || parse_words(key_obj, "key", 2, key) < 0)
        return NULL;
    gt_philox4x32_10(counter, key, out);
    return Py_BuildValue("(kkkk)", (unsigned long)out[0], (unsigned long)out[1], (unsigned long)out[2],
                         (unsigned long)out[3]);
}

typedef enum draw_kind { DRAW_UINT32, DRAW_UNIFORM, DRAW_UNIFORM_OPEN, DRAW_NORMAL } draw_kind;

/* A stream position: (seed, stream_a, stream_b), indices [start, start + count). */
typedef struct draw_request {
    uint64_t seed;      /* Philox key */
    uint32_t stream_a;  /* counter word 2 */
    uint32_t stream_b;  /* counter word 3 */
    uint64_t start;     /* first index (counter words 0-1) */
    size_t count;       /* number of indices; each gives 4 values */
} draw_request;

static void fill(const draw_request *r, draw_kind kind, void *data) {
    uint32_t *words = (uint32_t *)data;
    float *values = (float *)data;
    for (size_t i = 0; i < r->count; i++) {
        uint32_t w[4];
        gt_philox_random4(r->seed, r->stream_a, r->stream_b, r->start + i, w);
        for (size_t j = 0; j < 4; j++) {
            if (kind == DRAW_UINT32)
                words[4 * i + j] = w[j];
            else if (kind == DRAW_UNIFORM)
                values[4 * i + j] = gt_uint32_to_uniform(w[j]);
            else if (kind == DRAW_UNIFORM_OPEN)
                values[4 * i + j] = gt_uint32_to_uniform_open(w[j]);
        }
        if (kind == DRAW_NORMAL) {
            gt_box_muller(w[0], w[1], &values[4 * i], &values[4 * i + 1]);
            gt_box_muller(w[2], w[3], &values[4 * i + 2], &values[4 * i + 3]);
        }
    }
}

static PyObject *draw(PyObject *args, PyObject *kwargs, const char *format, draw_kind kind) {
    static char *keywords[] = {"seed", "stream_a", "stream_b", "start", "count", NULL};
    PyObject *objs[5];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &objs[0], &objs[1], &objs[2], &objs[3],
                                     &objs[4]))
        return NULL;
    uint64_t seed, a, b, start, count;
    if (parse_unsigned(objs[0], "seed", UINT64_MAX, &seed) < 0 ||
        parse_unsigned(objs[1], "stream_a", UINT32_MAX, &a) < 0 ||
        parse_unsigned(objs[2], "stream_b", UINT32_MAX, &b) < 0 ||
        parse_unsigned(objs[3], "start", UINT64_MAX, &start) < 0 ||
        parse_unsigned(objs[4], "count", (uint64_t)1 << 32, &count) < 0)
        return NULL;
    if (count > UINT64_MAX - start)
        return PyErr_Format(PyExc_ValueError, "start + count must not exceed 2**64, got %R + %R", objs[3],
                            objs[4]);
    npy_intp dims[2] = {(npy_intp)count, 4};
    PyObject *result = PyArray_SimpleNew(2, dims, kind == DRAW_UINT32 ? NPY_UINT32 : NPY_FLOAT);
    if (!result)
        return NULL;
    draw_request request = {seed, (uint32_t)a, (uint32_t)b, start, (size_t)count};
    Py_BEGIN_ALLOW_THREADS
    fill(&request, kind, PyArray_DATA((PyArrayObject *)result));
    Py_END_ALLOW_THREADS
    return result;
}

static PyObject *philox_uint32(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwargs) {
    return draw(args, kwargs, "OOOOO:philox_uint32", DRAW_UINT32);
}

static PyObject *philox_uniform(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwargs) {
    return draw(args, kwargs, "OOOOO:philox_uniform", DRAW_UNIFORM);
}

static PyObject *philox_uniform_open(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwargs) {
    return draw(args, kwargs, "OOOOO:philox_uniform_open", DRAW_UNIFORM_OPEN);
}

static PyObject *philox_normal(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwargs) {
    return draw(args, kwargs, "OOOOO:philox_normal", DRAW_NORMAL);
}

#define DRAW_SIGNATURE "(seed, stream_a, stream_b, start, count)\n--\n\n"

static PyMethodDef philox_methods[] = {
    {"philox4x32_10", (PyCFunction)(void (*)(void))philox4x32_10, METH_VARARGS | METH_KEYWORDS,
     "philox4x32_10(counter, key)\n--\n\nThe Philox4x32-10 bijection of 4 counter words under 2 key words."},
    {"philox_uint32", (PyCFunction)(void (*)(void))philox_uint32, METH_VARARGS | METH_KEYWORDS,
     "philox_uint32" DRAW_SIGNATURE "Words of indices start..start+count-1 as a (count, 4) uint32 array."},
    {"philox_uniform", (PyCFunction)(void (*)(void))philox_uniform, METH_VARARGS | METH_KEYWORDS,
     "philox_uniform" DRAW_SIGNATURE "Uniforms in [0, 1) with 24 random bits, (count, 4) float32."},
    {"philox_uniform_open", (PyCFunction)(void (*)(void))philox_uniform_open, METH_VARARGS | METH_KEYWORDS,
     "philox_uniform_open" DRAW_SIGNATURE "Uniforms in (0, 1] with 24 random bits, (count, 4) float32."},
    {"philox_normal", (PyCFunction)(void (*)(void))philox_normal, METH_VARARGS | METH_KEYWORDS,
     "philox_normal" DRAW_SIGNATURE "Box-Muller standard normals of word pairs, (count, 4) float32."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_philox(PyObject *module) { return PyModule_AddFunctions(module, philox_methods); }
