/* Bindings of the planners: what the optimizer, the EMA and the loader will take from the
 * allocator, computed by the C code that later allocates it, before
 * anything is allocated (gputrain.memory_plan puts them together with the model's plan). */
#include "py/gtpy.h"

#include "data/loader.h"
#include "data/transfer.h"
#include "py/loader.h"
#include "py/optim_py.h"
#include "train/ema.h"
#include "train/optim.h"

static PyObject *device_name(gt_device device) {
    char name[32];
    gt_device_name(device, name, sizeof name);
    return PyUnicode_FromString(name);
}

/* The sum of a sequence of element counts, each an int >= 0; -1 with an exception naming `numels`. */
static int sum_numels(PyObject *module, PyObject *numels_obj, size_t *total) {
    PyObject *seq = PySequence_Fast(numels_obj, "numels must be a sequence of ints");
    if (!seq)
        return -1;
    *total = 0;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t n = PyLong_Check(item) && !PyBool_Check(item) ? PyLong_AsSsize_t(item) : -1;
        if (n < 0) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "numels[%zd] must be an int >= 0 and < 2**63, got %R", i, item);
            }
            rc = -1;
        } else if (gt_size_add(*total, (size_t)n, "numels", total) != GT_OK) {
            rc = gtpy_raise_int(module, GT_ERR_OOM);
        }
    }
    Py_DECREF(seq);
    return rc;
}

/* The element counts (checked by sum_numels) as a new array (PyMem_Free it). */
static int numels_array(PyObject *numels_obj, size_t **out, size_t *count) {
    PyObject *seq = PySequence_Fast(numels_obj, "numels must be a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    *out = PyMem_Calloc(n ? (size_t)n : 1, sizeof **out);
    *count = (size_t)n;
    for (Py_ssize_t i = 0; *out && i < n; i++)
        (*out)[i] = (size_t)PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int parse_optim_kind(const char *kind, gt_optim_kind *out) { return gtpy_optim_parse_kind(kind, out); }

static PyObject *optimizer_memory_to_dict(gt_device device, const gt_optimizer_memory *m) {
    PyObject *d = PyDict_New();
    if (!d || gtpy_dict_put(d, "device", device_name(device)) < 0 ||
        gtpy_dict_put_size(d, "device_bytes", m->device_bytes) < 0 ||
        gtpy_dict_put_size(d, "pinned_bytes", m->host_bytes) < 0 ||
        gtpy_dict_put_size(d, "device_numel", m->device_numel) < 0 ||
        gtpy_dict_put_size(d, "host_numel", m->host_numel) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *optimizer_plan(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"kind", "numels", "hparams", "device", "cpu_offload_fraction",
                               "offload_chunk_numel", "zero_shards", "min_8bit_size", NULL};
    const char *kind = NULL;
    PyObject *numels_obj, *hparams_obj, *device_obj = Py_None;
    double fraction = 0.0;
    Py_ssize_t chunk = 0, min_8bit_size = GT_ADAMW8_MIN_SIZE;
    int shards = 1;  // ZeRO-1: numels are one rank's shard of this many (a shard never defers its update)
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOO|$Odnin:optimizer_plan", keywords, &kind, &numels_obj,
                                     &hparams_obj, &device_obj, &fraction, &chunk, &shards, &min_8bit_size))
        return NULL;
    if (min_8bit_size < 0)
        return PyErr_Format(PyExc_ValueError, "min_8bit_size must be >= 0, got %zd", min_8bit_size);
    gt_optimizer_config config = {.cpu_offload_fraction = fraction, .offload_chunk_numel = (size_t)chunk,
                                  .zero_size = shards > 1 ? shards : 0, .min_8bit_size = (size_t)min_8bit_size};
    size_t total = 0;
    if (chunk < 0)
        return PyErr_Format(PyExc_ValueError, "offload_chunk_numel must be >= 0, got %zd", chunk);
    if (shards < 1)
        return PyErr_Format(PyExc_ValueError, "zero_shards must be >= 1, got %d", shards);
    if (parse_optim_kind(kind, &config.kind) < 0 ||
        gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &config.device) < 0 ||
        sum_numels(module, numels_obj, &total) < 0)
        return NULL;
    PyObject *hparams = PySequence_Fast(hparams_obj, "hparams must be a sequence of dicts");
    if (!hparams)
        return NULL;
    Py_ssize_t num_groups = PySequence_Fast_GET_SIZE(hparams);
    gt_optim_hparams *groups = PyMem_Calloc(num_groups ? (size_t)num_groups : 1, sizeof *groups);
    int rc = groups ? gtpy_optim_parse_all_hparams(hparams, groups) : (PyErr_NoMemory(), -1);
    gt_optimizer_memory memory;
    PyObject *result = NULL;
    size_t *numels = NULL, num_params = 0;
    if (rc == 0)
        rc = numels_array(numels_obj, &numels, &num_params);
    if (rc == 0) {
        gt_status status = gt_optimizer_plan_params(&config, groups, (size_t)num_groups, numels, num_params, &memory);
        result = status == GT_OK ? optimizer_memory_to_dict(config.device, &memory) : gtpy_raise(module, status);
    }
    PyMem_Free(groups);
    PyMem_Free(numels);
    Py_DECREF(hparams);
    return result;
}

static PyObject *pool_and_bytes(gt_device pool, size_t bytes) {
    PyObject *d = PyDict_New();
    if (!d || gtpy_dict_put(d, "pool", device_name(pool)) < 0 || gtpy_dict_put_size(d, "bytes", bytes) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *ema_plan(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"numels", "device", "on_host", NULL};
    PyObject *numels_obj, *device_obj = Py_None;
    int on_host = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$Op:ema_plan", keywords, &numels_obj, &device_obj, &on_host))
        return NULL;
    gt_device device, pool;
    size_t total = 0, bytes = 0;
    if (gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &device) < 0 ||
        sum_numels(module, numels_obj, &total) < 0)
        return NULL;
    gt_status status = gt_ema_plan(device, on_host, total, &pool, &bytes);
    return status == GT_OK ? pool_and_bytes(pool, bytes) : gtpy_raise(module, status);
}

static PyObject *loader_memory_to_dict(const gt_loader_memory *m, gt_device device, size_t batch_bytes,
                                       size_t device_bytes) {
    PyObject *d = pool_and_bytes(m->pool, m->bytes);
    if (d && (gtpy_dict_put_size(d, "num_slots", m->num_slots) < 0 ||
              gtpy_dict_put_size(d, "slot_bytes", m->slot_bytes) < 0 ||
              gtpy_dict_put_size(d, "index_bytes", m->index_bytes) < 0 ||
              gtpy_dict_put(d, "device_pool", device_bytes ? device_name(device) : Py_NewRef(Py_None)) < 0 ||
              gtpy_dict_put_size(d, "device_batches", device_bytes ? GT_TRANSFER_PLANNED_BATCHES : 0) < 0 ||
              gtpy_dict_put_size(d, "device_batch_bytes", batch_bytes) < 0 ||
              gtpy_dict_put_size(d, "device_bytes", device_bytes) < 0))
        Py_CLEAR(d);
    return d;
}

/* loader_plan(...): the host slots and, with `device` an accelerator (the loader's device=),
 * the device batches its transfer keeps in flight (csrc/data/transfer.h). */
static PyObject *loader_plan(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"arrays", "max_batch_rows", "num_workers", "prefetch_factor", "pin_memory",
                               "device", NULL};
    PyObject *arrays_obj, *device_obj = Py_None;
    Py_ssize_t max_rows, workers, prefetch;
    int pin_memory = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Onnn|p$O:loader_plan", keywords, &arrays_obj, &max_rows,
                                     &workers, &prefetch, &pin_memory, &device_obj))
        return NULL;
    if (max_rows < 1 || workers < 0 || prefetch < 0)
        return PyErr_Format(PyExc_ValueError, "loader_plan: max_batch_rows must be >= 1 and num_workers, "
                            "prefetch_factor >= 0, got %zd, %zd, %zd", max_rows, workers, prefetch);
    gt_device device;
    if (gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &device) < 0)
        return NULL;
    PyObject *arrays = PySequence_Tuple(arrays_obj);
    uint64_t rows = 0;
    gt_field *fields = arrays ? gtpy_loader_describe_fields(arrays, &rows) : NULL;
    PyObject *result = NULL;
    if (fields) {
        gt_loader_config config = {.fields = fields, .num_fields = (size_t)PyTuple_GET_SIZE(arrays),
                                   .max_batch_rows = (size_t)max_rows, .num_workers = (size_t)workers,
                                   .prefetch_factor = (size_t)prefetch, .pin_memory = pin_memory};
        gt_loader_memory memory;
        size_t batch_bytes = 0, device_bytes = 0;
        gt_status status = gt_loader_plan(&config, &memory);
        if (status == GT_OK)
            status = gt_transfer_plan(device, memory.slot_bytes, &batch_bytes, &device_bytes);
        result = status == GT_OK ? loader_memory_to_dict(&memory, device, batch_bytes, device_bytes)
                                 : gtpy_raise(module, status);
    }
    PyMem_Free(fields);
    Py_XDECREF(arrays);
    return result;
}

static PyMethodDef memory_plan_methods[] = {
    {"optimizer_plan", (PyCFunction)(void (*)(void))optimizer_plan, METH_VARARGS | METH_KEYWORDS,
     "optimizer_plan(kind, numels, hparams, *, device='cpu', cpu_offload_fraction=0.0, offload_chunk_numel=0,\n"
     "               zero_shards=1, min_8bit_size=4096)\n--\n\n"
     "Bytes an Optimizer of these parameter sizes and groups will reserve, on the device and pinned\n"
     "(zero_shards > 1: numels are one rank's ZeRO-1 shard)."},
    {"ema_plan", (PyCFunction)(void (*)(void))ema_plan, METH_VARARGS | METH_KEYWORDS,
     "ema_plan(numels, *, device='cpu', on_host=False)\n--\n\nThe pool and bytes an EMA's shadow will reserve."},
    {"loader_plan", (PyCFunction)(void (*)(void))loader_plan, METH_VARARGS | METH_KEYWORDS,
     "loader_plan(arrays, max_batch_rows, num_workers, prefetch_factor, pin_memory=False, *, device=None)\n--\n\n"
     "The pool, slots and bytes a LoaderEngine of these arguments will reserve, and with device an\n"
     "accelerator, the device batches its transfer (DataLoader(device=...)) keeps in flight."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_memory_plan(PyObject *module) { return PyModule_AddFunctions(module, memory_plan_methods); }
