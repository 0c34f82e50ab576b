/* gputrain._C.Communicator (csrc/py/dist.c): a gt_comm for Python and for the training step. */
#ifndef GTPY_DIST_H
#define GTPY_DIST_H

#include "py/gtpy.h"
#include "dist/comm.h"

int gtpy_add_dist(PyObject *module);

/* The communicator of a _C.Communicator, marked busy (NULL with TypeError/RuntimeError): the
 * step holds it while it runs without the GIL. gtpy_comm_leave releases it. */
gt_comm *gtpy_comm_enter(PyObject *obj);
void gtpy_comm_leave(PyObject *obj);

#endif
