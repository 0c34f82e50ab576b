/* Declarations shared by the data loader's binding files (loader.c, loader_slot.c,
 * loader_sampler.c). */
#ifndef GTPY_LOADER_H
#define GTPY_LOADER_H

#include "py/gtpy.h"

#include "data/loader.h"
#include "core/tensor.h"
#include "data/transfer.h"

/* Owner of one caller reference to a delivered slot: NumPy views of the slot have it as
 * their base, so the slot is reused only after the last view is gone. Steals the reference. */
PyObject *gtpy_loader_slot_new(PyTypeObject *slot_type, gt_loader *loader, gt_slot *slot);

/* The loader and slot of a _LoaderSlot object; TypeError for anything else. */
int gtpy_loader_slot_unpack(PyObject *slot_type, PyObject *obj, gt_loader **loader, gt_slot **slot);

/* The C loader of a LoaderEngine (NULL with RuntimeError once shut down; TypeError for
 * anything else). */
gt_loader *gtpy_loader_engine_loader(PyObject *module, PyObject *engine);

/* Registers LoaderTransfer and _DeviceSlot (device copies of batches). */
int gtpy_add_loader_transfer(PyObject *module);

/* A step or forward input given as a DeviceArray (gputrain.data.transfer): its memory, held. */
typedef struct gtpy_device_input {
    PyObject *owner;          /* the _DeviceSlot holding the memory (a reference); NULL: not a device input */
    gt_transfer *transfer;    /* the owner's transfer */
    gt_device_batch *batch;   /* the owner's device batch; NULL for a copied array (complete already) */
} gtpy_device_input;

/* 0 with in->owner NULL when `obj` is not a DeviceArray. Otherwise checks it against `device`
 * (the model's) and the dtype (kind 'f': float32, 'i': int64; nothing is converted on the
 * device), fills `tensor` (shape, dtype, device, ptr) and `in`, and returns 1; or -1 with an
 * exception naming `arg_name`. */
int gtpy_device_input_get(PyObject *module, PyObject *obj, const char *arg_name, char kind, gt_device device,
                          gt_tensor *tensor, gtpy_device_input *in);

/* Work queued on `consumer` (a stream of the input's device; NULL: its default stream) from now
 * on runs after the copy that filled the input (begin); the work queued there so far is the last
 * that reads it, so the batch returns to the loader only after it (end). No-ops for a host input. */
gt_status gtpy_device_input_begin(const gtpy_device_input *in, gt_stream *consumer);
gt_status gtpy_device_input_end(const gtpy_device_input *in, gt_stream *consumer);

/* Drops the reference on the input's memory (the batch may return to the loader). */
void gtpy_device_input_clear(gtpy_device_input *in);

/* A tuple with one array per field of `arrays` (the dataset), each viewing the slot's rows
 * with the field's dtype and trailing shape (ragged fields: (rows, width, *item shape)),
 * based on `owner`. */
PyObject *gtpy_loader_slot_views(PyObject *owner, PyObject *arrays);

/* The gather fields of the dataset's arrays (a tuple of ndarrays, or (values, offsets, pad)
 * tuples for ragged rows), which all have *num_rows rows. A PyMem block, or NULL with an
 * exception naming the array. */
gt_field *gtpy_loader_describe_fields(PyObject *arrays, uint64_t *num_rows);

/* Registers the _LoaderSlot type (kept out of reach of Python constructors). */
int gtpy_add_loader_slot(PyObject *module);

/* Registers sampler_rows(), the order of a sampler as an int64 array. */
int gtpy_add_loader_sampler(PyObject *module);

/* Fills `sampler` over `num_rows` rows from an order description, the dict
 * {"kind": int, "base_length": int, "seed": int, "epoch": int, "indices": int64 array or None,
 *  "num_replicas": int, "rank": int, "drop_last": bool} built by gputrain.data. `indices_out`
 * receives a new reference to the index array (or NULL), which must outlive the sampler.
 * Raises (naming the argument) and returns -1 on bad input. */
int gtpy_parse_sampler(PyObject *module, PyObject *spec, uint64_t num_rows, gt_sampler *sampler,
                       PyArrayObject **indices_out);

#endif
