/* Private to the CUDA binding files (cuda.c, cuda_stream.c, cuda_event.c): the pieces they
 * share. The CUDA calls themselves stay under #ifdef GT_WITH_CUDA in those files; in a
 * CPU-only build every entry point raises gputrain.CudaError saying CUDA was not compiled in. */
#ifndef GTPY_CUDA_PY_H
#define GTPY_CUDA_PY_H

#include "py/args.h"

#include "cuda_backend.h"

/* What the CUDA bindings need to know about a gputrain._C.Buffer. */
typedef struct gtpy_buffer_view {
    void *ptr;         /* start of the buffer's memory */
    size_t bytes;      /* size of the buffer in bytes */
    gt_device device;  /* cpu, pinned or cuda:N */
} gtpy_buffer_view;

/* Adds cuda_libraries and installs the CUDA library resolver (cuda_libs.c); 0 or -1. */
int gtpy_add_cuda_libs(PyObject *module);

/* Raises gputrain.CudaError "CUDA was not compiled in ..." and returns NULL. */
PyObject *gtpy_cuda_not_compiled(PyObject *module);

/* Reads a Buffer argument; raises TypeError naming `arg_name` for anything else. */
int gtpy_buffer_view_of(PyObject *module, PyObject *obj, const char *arg_name,
                        gtpy_buffer_view *out);


/* The stream behind a CudaStream argument; NULL with TypeError/ValueError set otherwise. */
gt_cuda_stream *gtpy_cuda_stream_of(PyObject *module, PyObject *obj, const char *arg_name);

/* Keeps `obj` alive until the CudaStream `stream` is next seen idle (synchronize, or a query
 * that finds it done), so that async work never outlives the memory it reads or writes. */
int gtpy_cuda_stream_keep(PyObject *stream, PyObject *obj);

/* The event behind a CudaEvent argument; NULL with TypeError/ValueError set otherwise. */
gt_cuda_event *gtpy_cuda_event_of(PyObject *module, PyObject *obj, const char *arg_name);

#endif
