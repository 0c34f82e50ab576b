/* gputrain._C_testing: bindings that only tests and benchmarks use (single ops on NumPy arrays, the
 * optimizer over device copies of arrays, the Philox generator), kept out of gputrain._C. The extension links its own copy of the core (the
 * objects of _C but module.c; its module.c is csrc/py_testing/module.c), so its device state
 * (the sim device's counters, memory statistics) is its own: it registers _C's memory functions
 * (device_counters, memory_stats, ...) too, which read it. `import gputrain` never imports it. */
#ifndef GTPY_TESTING_H
#define GTPY_TESTING_H

#include "py/gtpy.h"

/* Registration functions, one per file, called from the testing module's exec slot. */
int gtpy_add_run_op(PyObject *module);    /* run_op.c: one op of a backend's table */
int gtpy_add_cnn_ops(PyObject *module);   /* ops_cnn.c: BatchNorm2d and 2-D pooling */
int gtpy_add_philox(PyObject *module);    /* philox.c: Philox4x32-10 and its distributions */
int gtpy_add_op_copy(PyObject *module);   /* op_copy.c: the table's copy and zero */
int gtpy_add_optim_device(PyObject *module);  /* optim_device.c: the optimizer over device copies */

#endif
