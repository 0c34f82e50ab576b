/* Step and forward inputs read where they lie: gputrain's DeviceArrays (py/loader.h), and the
 * arrays of other libraries through DLPack (__dlpack__/__dlpack_device__, unversioned and
 * versioned 1.x capsules) or the CUDA array interface (v2/v3), e.g. CuPy arrays and PyTorch CUDA
 * tensors. Nothing is converted on a device: float32 inputs, int64 class indices or ids, and
 * C-contiguous memory of the model's own device.
 *
 * Ordering: a DLPack producer is asked for the array with the consumer's stream (stream=), so it
 * makes that stream wait for its work; a v3 CUDA array interface names its producer's stream,
 * which the consumer waits for through an event (gtpy_array_input_begin). Lifetime: the
 * producer's object (or the taken capsule) is kept alive until an event recorded after the last
 * work reading it has completed (gtpy_array_input_end); it is released at a later input's
 * conversion or when the module is freed, never by a host wait.
 *
 * The simulated device ("sim:N") has no DLPack device type or array interface of its own: its
 * arrays use DLPack's kDLExtDev with device_id N, and `__sim_array_interface__`, a dict of the
 * CUDA array interface's layout (v3) with sim stream handles, read by the same code. */
#ifndef GTPY_EXTERNAL_H
#define GTPY_EXTERNAL_H

#include "py/loader.h"

#include "core/device_backend.h"

/* One input read on the device (neither field set: a host input). */
typedef struct gtpy_array_input {
    gtpy_device_input array;  /* a DeviceArray's batch (array.owner NULL otherwise) */
    PyObject *module;         /* gputrain._C (borrowed), whose state keeps `keep` after the step */
    PyObject *keep;           /* another library's array: what keeps its memory alive, or NULL */
    gt_device device;         /* where `keep`'s memory lies (the model's device) */
    gt_stream *producer;      /* the stream its data is produced on (array interface v3), or NULL */
    int wait_producer;        /* 1 when the consumer must wait for `producer` */
    gt_event *done;           /* recorded after the last work reading it (created with `keep`) */
    int recorded;             /* 1 once `done` was recorded */
} gtpy_array_input;

/* 0 when `obj` is a host input (the caller converts it, see gtpy_dlpack_host_array). Otherwise
 * checks it against `device` (the model's) and the dtype (kind 'f': float32, 'i': int64), fills
 * `tensor` (shape, dtype, device, ptr) and `in`, and returns 1; or -1 with an exception naming
 * `arg_name`, with nothing taken from the object. `consumer` is the stream that will read it
 * (NULL: the device's default stream). */
int gtpy_array_input_get(PyObject *module, PyObject *obj, const char *arg_name, char kind, gt_device device,
                         gt_stream *consumer, gt_tensor *tensor, gtpy_array_input *in);

/* Work queued on `consumer` from now on runs after the input's data was produced (begin); the work
 * queued there so far is the last that reads it (end). No GIL needed; no-ops for a host input. */
gt_status gtpy_array_input_begin(const gtpy_array_input *in, gt_stream *consumer);
gt_status gtpy_array_input_end(gtpy_array_input *in, gt_stream *consumer);

/* Drops the input (GIL held): another library's array stays alive until `done` has completed. */
void gtpy_array_input_clear(gtpy_array_input *in);

/* A host input given through DLPack (a producer on kDLCPU or kDLCUDAHost, e.g. a PyTorch CPU
 * tensor) as a NumPy array viewing its memory, which it keeps alive; `obj` itself (a new
 * reference) for anything else; NULL with an exception naming `arg_name`. */
PyObject *gtpy_dlpack_host_array(PyObject *obj, const char *arg_name);

/* A DLPack capsule exporting the C-contiguous array at `data` on `device` (cuda or sim) that
 * `owner` keeps alive: a new "dltensor_versioned" capsule (`versioned`) or "dltensor" one, whose
 * tensor holds a reference to `owner` until the consumer calls its deleter; then
 * `done(owner, consumer)` runs first (GIL held) when `done` is not NULL. */
PyObject *gtpy_dlpack_export(PyObject *owner, void *data, gt_device device, int ndim, const int64_t *shape,
                             PyArray_Descr *dtype, int versioned, gt_stream *consumer,
                             void (*done)(PyObject *owner, gt_stream *consumer));

/* Releases every kept array whose readers have run (GIL held). */
void gtpy_held_release_ready(PyObject *module);

/* The held list of a module state (module.c's traverse and free). */
struct gtpy_held_list;
int gtpy_held_traverse(struct gtpy_held_list *held, visitproc visit, void *arg);
void gtpy_held_free(struct gtpy_held_list **held);

#endif
