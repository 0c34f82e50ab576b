/* gputrain._C_testing: multi-phase initialisation of the test-only bindings (testing.h). It
 * defines what csrc/py/module.c defines for _C (the NumPy API table, gtpy_module_def,
 * gtpy_state_of), since it links _C's other objects; its exception types are _C's own. */
#define GTPY_IMPORTS_NUMPY
#include "sim/cpu_table.h"
#include "sim/sim.h"
#include "py_testing/testing.h"
#include "py/external.h"

#include "core/threads.h"
#include "ops/cpu_blas.h"

#ifdef GT_WITH_CUDA
#include "cuda_backend.h"
#endif

gtpy_state *gtpy_state_of(PyObject *module) { return (gtpy_state *)PyModule_GetState(module); }

/* gputrain._C's exception `name` into *slot (a new reference). */
static int take_exception(PyObject *core, const char *name, PyObject **slot) {
    *slot = PyObject_GetAttrString(core, name);
    return *slot ? 0 : -1;
}

typedef int (*registration)(PyObject *module);

static const registration registrations[] = {
    gtpy_add_run_op,
    gtpy_add_cnn_ops,
    gtpy_add_philox,
    gtpy_add_op_copy,
    gtpy_add_optim_device,
    gtpy_add_memory,  /* csrc/py/memory.c: the counters and statistics of this module's copy */
};

static int module_exec(PyObject *module) {
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    gtpy_state *state = gtpy_state_of(module);
    PyObject *core = PyImport_ImportModule("gputrain._C");
    int rc = core ? 0 : -1;
    if (rc == 0)
        rc = take_exception(core, "OutOfMemoryError", &state->out_of_memory_error);
    if (rc == 0)
        rc = take_exception(core, "CudaError", &state->cuda_error);
    Py_XDECREF(core);
    if (rc < 0)
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
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

PyModuleDef gtpy_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gputrain._C_testing",
    .m_doc = "Test-only bindings of gputrain's core (single ops, Philox); not imported by gputrain.",
    .m_size = sizeof(gtpy_state),
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C_testing(void) { return PyModuleDef_Init(&gtpy_module_def); }
