/* Bindings of build facts and run-time settings: info, threads, SIMD level, CUDA presence. */
#include "py/args.h"

#include "core/simd.h"
#include "core/threads.h"
#include "ops/cpu_blas.h"

#ifndef GT_VERSION
#define GT_VERSION "0.0.0"
#endif
#ifndef GT_BUILD_FLAGS
#define GT_BUILD_FLAGS ""
#endif

/* How f16/bf16 GEMMs run on this CPU (gputrain.info()["cpu_half_gemm"]). */
static const char *half_gemm_path(void) {
    if (gt_blas_native(GT_BF16, GT_F32, 1.0f))
        return "bf16: native in the CPU library (bf16 products, f32 accumulation); f16: widened "
               "exactly to f32, f32 GEMM, output rounded once";
    return "f16/bf16: widened exactly to f32, f32 GEMM, output rounded once";
}

/* The precisions whose GEMMs run natively in the CPU library here (the others are widened to
 * f32): ("fp32",) or ("fp32", "bf16"). gputrain.info()["cpu_native_gemm"]. */
static PyObject *native_gemm_precisions(void) {
    if (gt_blas_native(GT_BF16, GT_F32, 1.0f))
        return Py_BuildValue("(ss)", "fp32", "bf16");
    return Py_BuildValue("(s)", "fp32");
}

static PyObject *build_info(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
#ifdef GT_WITH_CUDA
    const int cuda_compiled = 1;
#else
    const int cuda_compiled = 0;
#endif
    if (gtpy_dict_put(d, "version", PyUnicode_FromString(GT_VERSION)) < 0 ||
        gtpy_dict_put(d, "cuda_compiled", PyBool_FromLong(cuda_compiled)) < 0 ||
        gtpy_dict_put(d, "cuda_device_count", PyLong_FromLong(gt_cuda_device_count())) < 0 ||
        gtpy_dict_put(d, "simd", PyUnicode_FromString(gt_simd_name(gt_simd_level()))) < 0 ||
        gtpy_dict_put(d, "simd_supported", PyUnicode_FromString(gt_simd_name(gt_simd_supported()))) < 0 ||
        gtpy_dict_put(d, "avx512_bf16", PyBool_FromLong(gt_cpu_has_avx512_bf16())) < 0 ||
        gtpy_dict_put(d, "blas", PyUnicode_FromString(gt_blas_name())) < 0 ||
        gtpy_dict_put(d, "blas_config", PyUnicode_FromString(gt_blas_config())) < 0 ||
        gtpy_dict_put(d, "blas_kernel", PyUnicode_FromString(gt_blas_kernel())) < 0 ||
        gtpy_dict_put(d, "cpu_half_gemm", PyUnicode_FromString(half_gemm_path())) < 0 ||
        gtpy_dict_put(d, "cpu_native_gemm", native_gemm_precisions()) < 0 ||
        gtpy_dict_put(d, "num_threads", PyLong_FromLong(gt_get_num_threads())) < 0 ||
        gtpy_dict_put(d, "cpu_count", PyLong_FromLong(gt_cpu_count())) < 0 ||
        gtpy_dict_put(d, "openmp", PyLong_FromLong(_OPENMP)) < 0 ||
        gtpy_dict_put(d, "compiler", PyUnicode_FromString("gcc " __VERSION__)) < 0 ||
        gtpy_dict_put(d, "compile_flags", PyUnicode_FromString(GT_BUILD_FLAGS)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *set_num_threads(PyObject *module, PyObject *arg) {
    int n = 0;
    if (gtpy_arg_small_int(arg, "num_threads", 1, 4096, &n) < 0)
        return NULL;
    gt_status status = gt_set_num_threads(n);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
}

static PyObject *get_num_threads(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(gt_get_num_threads());
}

static PyObject *set_simd_level(PyObject *module, PyObject *arg) {
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (!name)
        return PyErr_Occurred() ? NULL
                                : PyErr_Format(PyExc_TypeError, "level must be a str, not %.100s",
                                               Py_TYPE(arg)->tp_name);
    for (int level = GT_SIMD_SCALAR; level <= GT_SIMD_AVX512; level++) {
        if (strcmp(name, gt_simd_name((gt_simd)level)) == 0) {
            gt_status status = gt_set_simd_level((gt_simd)level);
            return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
        }
    }
    return PyErr_Format(PyExc_ValueError, "level must be 'scalar', 'avx2' or 'avx512', got %R", arg);
}

static PyObject *cuda_device_count(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(gt_cuda_device_count());
}

static PyMethodDef runtime_methods[] = {
    {"build_info", build_info, METH_NOARGS, "Facts about this build and machine as a dict."},
    {"set_num_threads", set_num_threads, METH_O, "Threads for parallel loops and the BLAS."},
    {"get_num_threads", get_num_threads, METH_NOARGS, "Threads used by parallel loops."},
    {"set_simd_level", set_simd_level, METH_O, "Lower the SIMD level ('scalar', 'avx2', 'avx512')."},
    {"cuda_device_count", cuda_device_count, METH_NOARGS, "Usable CUDA devices (0 without a driver)."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_runtime(PyObject *module) { return PyModule_AddFunctions(module, runtime_methods); }
