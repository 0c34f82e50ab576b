/* One parser for the scalar arguments of the bindings (csrc/py/args.c): an int in a range and a real
 * number. Every error names the argument:
 *     TypeError  "<name> must be an int, not <type>"   (bool is not an int)
 *     ValueError "<name> must be in <low>..<high>, got <value>"
 *     TypeError  "<name> must be a real number, not <type>"
 * obj == NULL (an optional argument not given) leaves *out as it is and returns 0. */
#ifndef GTPY_ARGS_H
#define GTPY_ARGS_H

#include "py/gtpy.h"

/* An int in [low, high] into *out; -1 with an exception. */
int gtpy_arg_int(PyObject *obj, const char *name, long long low, long long high, long long *out);

/* The same into an int (low and high within int's range). */
int gtpy_arg_small_int(PyObject *obj, const char *name, int low, int high, int *out);

/* 0 when index is in [0, count); else -1 with IndexError "parameter index <index> out of range
 * (<count> parameters)" (the optimizers' and the EMA's get_state/set_state/get/set). */
int gtpy_check_param_index(Py_ssize_t index, size_t count);

/* A real number (anything float() takes without a string) into *out; -1 with an exception. */
int gtpy_arg_real(PyObject *obj, const char *name, double *out);

#endif
