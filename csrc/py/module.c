/* gputrain._C: multi-phase initialisation, module state, and the exec slot that
 * registers every binding file (STYLE.md, "The binding layer"). */
#define GTPY_IMPORTS_NUMPY
#include "sim/cpu_table.h"
#include "sim/sim.h"
#include "py/gtpy.h"
#include "py/external.h"
#include "py/dist.h"

#include "core/threads.h"
#include "ops/cpu_blas.h"

#ifdef GT_WITH_CUDA
#include "cuda_backend.h"
#endif

gtpy_state *gtpy_state_of(PyObject *module) { return (gtpy_state *)PyModule_GetState(module); }

static int add_exception(PyObject *module, const char *name, const char *doc, PyObject *base,
                         PyObject **slot) {
    *slot = PyErr_NewExceptionWithDoc(name, doc, base, NULL);
    if (!*slot)
        return -1;
    return PyModule_AddObjectRef(module, strrchr(name, '.') + 1, *slot);
}

typedef int (*registration)(PyObject *module);

static const registration registrations[] = {
    gtpy_add_memory,
    gtpy_add_memory_plan,
    gtpy_add_runtime,
    gtpy_add_buffer,
    gtpy_add_model,
    gtpy_add_step,
    gtpy_add_cast,
    gtpy_add_quant,
    gtpy_add_cuda,
    gtpy_add_cuda_copy,
    gtpy_add_cuda_stream,
    gtpy_add_cuda_event,
    gtpy_add_scaler,
    gtpy_add_optim,
    gtpy_add_optim_model,
    gtpy_add_ema,
    gtpy_add_loader,
    gtpy_add_ops,
    gtpy_add_errors,
    gtpy_add_dist,
};

static int module_exec(PyObject *module) {
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    gtpy_state *state = gtpy_state_of(module);
    if (add_exception(module, "gputrain.OutOfMemoryError",
                      "A device's memory limit or the system refused an allocation.",
                      PyExc_MemoryError, &state->out_of_memory_error) < 0 ||
        add_exception(module, "gputrain.CudaError", "A CUDA runtime or library call failed.",
                      PyExc_RuntimeError, &state->cuda_error) < 0)
        return -1;
#ifdef GT_WITH_CUDA
    gt_cuda_install_hooks();
#endif
    gt_sim_install();
    gt_cpu_device_install();
    gt_blas_init();
    gt_threads_init();
    for (size_t i = 0; i < sizeof registrations / sizeof registrations[0]; i++)
        if (registrations[i](module) < 0)
            return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
    gtpy_state *state = gtpy_state_of(module);
    Py_VISIT(state->out_of_memory_error);
    Py_VISIT(state->cuda_error);
    return gtpy_held_traverse(state->held, visit, arg);
}

static int module_clear(PyObject *module) {
    gtpy_state *state = gtpy_state_of(module);
    Py_CLEAR(state->out_of_memory_error);
    Py_CLEAR(state->cuda_error);
    gtpy_held_free(&state->held);
    return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_multiple_interpreters
    /* One process-wide CUDA context and NumPy: one interpreter only. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

PyModuleDef gtpy_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gputrain._C",
    .m_doc = "The C and CUDA core of gputrain.",
    .m_size = sizeof(gtpy_state),
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&gtpy_module_def); }
