/* gputrain._C.LoaderEngine: the C loader (csrc/data/loader.h) behind gputrain.DataLoader.
 * It keeps the dataset arrays alive for the worker threads, runs the optional worker hooks
 * with the GIL, and hands out each batch as NumPy views of its slot (zero-copy).
 *
 * Shutdown never waits without end for a worker stuck in a Python hook (a transform that does
 * not return): dropping the engine waits GTPY_LOADER_DETACH_S, shutdown() until Ctrl-C, then the
 * worker is detached. What the hooks use (engine_hooks) belongs to the C loader, which a
 * detached worker keeps alive; the engine then hands its references to it. */
#include "py/loader.h"

#include <math.h>
#include <time.h>

/* Seconds a dropped engine waits for its workers to stop before detaching those still running. */
#define GTPY_LOADER_DETACH_S 0.25

/* What the worker hooks read: the loader's hooks context, freed with the loader (by
 * hooks_release, possibly in the last detached worker, after the engine object is gone). */
typedef struct engine_hooks {
    PyObject *arrays;           /* tuple of the dataset's arrays (the engine's; see owns_refs) */
    PyObject *slot_type;        /* gputrain._C._LoaderSlot (likewise) */
    PyObject *worker_start;     /* callable(worker_id) -> None or an error object, or NULL */
    PyObject *worker_transform; /* callable(batch_id, arrays) -> result, or NULL */
    int owns_refs;              /* 0: the four above are borrowed from the engine object (its
                                   GC sees them); 1: references of their own, taken when the
                                   engine detached a worker that may still call them */
    PyObject *worker_error;     /* error object of a failed worker_start (owned), or NULL */
    int python_in_workers;      /* 1 when a hook calls Python from the worker threads */
    PyGILState_STATE *worker_gil;    /* (num_workers,) GIL state each worker keeps while alive */
    PyThreadState **worker_tstate;   /* (num_workers,) thread state each worker keeps while alive */
} engine_hooks;

typedef struct {
    PyObject_HEAD
    gt_loader *loader;          /* the engine; NULL once released */
    engine_hooks *hooks;        /* the loader's hooks context; NULL once released */
    PyObject *arrays;           /* tuple of the dataset's arrays, one per field */
    PyObject *slot_type;        /* gputrain._C._LoaderSlot */
    PyObject *worker_start;     /* callable(worker_id) -> None or an error object, or NULL */
    PyObject *worker_transform; /* callable(batch_id, arrays) -> result, or NULL */
    uint64_t num_rows;          /* samples in the dataset (first dimension of every array) */
    gt_loader_stats last_stats; /* the engine's counters when it was released */
} EngineObject;

/* ---- hooks, called from worker threads without the GIL ----------------------------- */

/* 1 once the interpreter is finalizing or gone: a detached worker must not touch Python then
 * (its thread state may be freed); what it holds is left to the process's exit. */
static int python_gone(void) { return !Py_IsInitialized(); }

/* The exception being raised, normalised, as an object to hand to the caller. */
static PyObject *fetch_exception(void) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value && traceback)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value ? value : Py_NewRef(Py_None);
}

/* Gives the worker a Python thread state for its whole life (so threading.local values set by
 * worker_init_fn persist), runs worker_start in it, then releases the GIL. */
static gt_status hook_worker_start(void *ctx, size_t worker) {
    engine_hooks *self = ctx;
    if (!self->python_in_workers)
        return GT_OK;
    PyGILState_STATE gil = PyGILState_Ensure();
    gt_status status = GT_OK;
    if (self->worker_start) {
        PyObject *result = PyObject_CallFunction(self->worker_start, "n", (Py_ssize_t)worker);
        if (!result)
            result = fetch_exception();
        if (result != Py_None) {
            if (!self->worker_error)
                self->worker_error = Py_NewRef(result);
            status = GT_FAIL(GT_ERR_RUNTIME, "worker_init_fn failed in worker %zu", worker);
        }
        Py_DECREF(result);
    }
    self->worker_gil[worker] = gil;
    self->worker_tstate[worker] = PyEval_SaveThread();
    return status;
}

/* Drops the thread state worker_start gave the worker. */
static void hook_worker_stop(void *ctx, size_t worker) {
    engine_hooks *self = ctx;
    if (!self->python_in_workers || python_gone())
        return;
    PyEval_RestoreThread(self->worker_tstate[worker]);
    PyGILState_Release(self->worker_gil[worker]);
}

/* Runs worker_transform on the gathered batch; its result is delivered instead of the views. */
static gt_status hook_batch_gathered(void *ctx, gt_loader *loader, gt_slot *slot) {
    engine_hooks *self = ctx;
    if (!self->worker_transform)
        return GT_OK;
    if (python_gone())
        return GT_FAIL(GT_ERR_RUNTIME, "DataLoader: the interpreter is shutting down");
    PyGILState_STATE gil = PyGILState_Ensure();
    gt_loader_slot_retain(loader, slot);
    PyObject *owner = gtpy_loader_slot_new((PyTypeObject *)self->slot_type, loader, slot);
    PyObject *views = owner ? gtpy_loader_slot_views(owner, self->arrays) : NULL;
    Py_XDECREF(owner);
    PyObject *result = views ? PyObject_CallFunction(self->worker_transform, "nO",
                                                     (Py_ssize_t)slot->batch, views)
                             : NULL;
    Py_XDECREF(views);
    slot->user = result ? result : fetch_exception();
    PyGILState_Release(gil);
    return GT_OK;
}

static void hook_release_user(void *ctx, void *user) {
    (void)ctx;
    if (python_gone())
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF((PyObject *)user);
    PyGILState_Release(gil);
}

static void hooks_free(engine_hooks *hooks) {
    PyMem_RawFree(hooks->worker_gil);
    PyMem_RawFree(hooks->worker_tstate);
    PyMem_RawFree(hooks);
}

/* The loader is destroyed: drops what the hooks context holds (any thread, GIL or not). */
static void hooks_release(void *ctx) {
    engine_hooks *hooks = ctx;
    if (python_gone()) {
        hooks_free(hooks);
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    if (hooks->owns_refs) {
        Py_XDECREF(hooks->arrays);
        Py_XDECREF(hooks->slot_type);
        Py_XDECREF(hooks->worker_start);
        Py_XDECREF(hooks->worker_transform);
    }
    Py_CLEAR(hooks->worker_error);
    PyGILState_Release(gil);
    hooks_free(hooks);
}

/* The engine object lets go of the loader while a detached worker may still call the hooks:
 * they keep the objects they call alive from now on (GIL held). */
static void hooks_take_refs(engine_hooks *hooks) {
    Py_XINCREF(hooks->arrays);
    Py_XINCREF(hooks->slot_type);
    Py_XINCREF(hooks->worker_start);
    Py_XINCREF(hooks->worker_transform);
    hooks->owns_refs = 1;
}

/* ---- construction ------------------------------------------------------------------ */

static int optional_callable(PyObject *obj, const char *name, PyObject **out) {
    *out = NULL;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (!PyCallable_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be callable or None, not %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = Py_NewRef(obj);
    return 0;
}

typedef struct engine_args {
    PyObject *arrays;            /* sequence of the dataset's arrays */
    Py_ssize_t max_batch_rows;   /* rows per slot */
    Py_ssize_t num_workers;      /* worker threads */
    Py_ssize_t prefetch_factor;  /* batches in flight per worker */
    int in_order;                /* deliver in batch order */
    int pin_memory;              /* slots in pinned memory */
    PyObject *worker_start;      /* optional hook */
    PyObject *worker_transform;  /* optional hook */
} engine_args;

static int check_counts(const engine_args *a) {
    if (a->max_batch_rows < 1) {
        PyErr_Format(PyExc_ValueError, "max_batch_rows must be >= 1, got %zd", a->max_batch_rows);
        return -1;
    }
    if (a->num_workers < 0) {
        PyErr_SetString(PyExc_ValueError, "num_workers option should be non-negative; "
                        "use num_workers=0 to disable multiprocessing.");
        return -1;
    }
    if (a->prefetch_factor < (a->num_workers > 0 ? 1 : 0)) {
        PyErr_Format(PyExc_ValueError, "prefetch_factor must be >= 1 with workers, got %zd",
                     a->prefetch_factor);
        return -1;
    }
    return 0;
}

/* The hooks context for the engine's members, with per-worker thread-state slots (needed
 * when a hook calls Python in the workers); NULL with an exception set. */
static engine_hooks *new_hooks(EngineObject *self, const engine_args *a) {
    size_t n = a->num_workers > 0 ? (size_t)a->num_workers : 1;
    engine_hooks *hooks = PyMem_RawCalloc(1, sizeof *hooks);
    if (hooks) {
        hooks->worker_gil = PyMem_RawCalloc(n, sizeof *hooks->worker_gil);
        hooks->worker_tstate = PyMem_RawCalloc(n, sizeof *hooks->worker_tstate);
    }
    if (!hooks || !hooks->worker_gil || !hooks->worker_tstate) {
        if (hooks)
            hooks_free(hooks);
        PyErr_NoMemory();
        return NULL;
    }
    hooks->arrays = self->arrays;
    hooks->slot_type = self->slot_type;
    hooks->worker_start = self->worker_start;
    hooks->worker_transform = self->worker_transform;
    hooks->python_in_workers = self->worker_start || self->worker_transform;
    return hooks;
}

/* Creates the C loader once the Python members are in place (hooks read them). */
static int create_loader(EngineObject *self, PyObject *module, const engine_args *a,
                         const gt_field *fields) {
    engine_hooks *hooks = new_hooks(self, a);
    if (!hooks)
        return -1;
    gt_loader_config config = {
        .fields = fields, .num_fields = (size_t)PyTuple_GET_SIZE(self->arrays),
        .max_batch_rows = (size_t)a->max_batch_rows, .num_workers = (size_t)a->num_workers,
        .prefetch_factor = (size_t)a->prefetch_factor, .in_order = a->in_order,
        .pin_memory = a->pin_memory,
        .hooks = {.ctx = hooks, .worker_start = hook_worker_start, .worker_stop = hook_worker_stop,
                  .batch_gathered = hook_batch_gathered, .release_user = hook_release_user,
                  .release = hooks_release},
    };
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_loader_create(&config, &self->loader);  /* owns hooks from here, even failing */
    Py_END_ALLOW_THREADS
    if (status != GT_OK)
        return gtpy_raise_int(module, status);
    self->hooks = hooks;
    return 0;
}

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"arrays", "max_batch_rows", "num_workers", "prefetch_factor",
                               "in_order", "pin_memory", "worker_start", "worker_transform", NULL};
    engine_args a = {.in_order = 1, .worker_start = Py_None, .worker_transform = Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Onnn|ppOO:LoaderEngine", keywords, &a.arrays,
                                     &a.max_batch_rows, &a.num_workers, &a.prefetch_factor,
                                     &a.in_order, &a.pin_memory, &a.worker_start,
                                     &a.worker_transform))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module || check_counts(&a) < 0)
        return NULL;
    EngineObject *self = (EngineObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    gt_field *fields = NULL;
    self->arrays = PySequence_Tuple(a.arrays);
    self->slot_type = self->arrays ? PyObject_GetAttrString(module, "_LoaderSlot") : NULL;
    if (!self->slot_type || optional_callable(a.worker_start, "worker_start", &self->worker_start) < 0 ||
        optional_callable(a.worker_transform, "worker_transform", &self->worker_transform) < 0 ||
        !(fields = gtpy_loader_describe_fields(self->arrays, &self->num_rows)) ||
        create_loader(self, module, &a, fields) < 0) {
        PyMem_Free(fields);
        Py_DECREF(self);
        return NULL;
    }
    PyMem_Free(fields);
    return (PyObject *)self;
}

/* Stops the workers (the GIL released: they may be waiting for it), waiting `seconds` at most
 * (< 0: without limit) before detaching those still in a hook, and drops the engine. */
static void engine_release(EngineObject *self, double seconds) {
    gt_loader *loader = self->loader;
    engine_hooks *hooks = self->hooks;
    if (!loader)
        return;
    self->loader = NULL;
    self->hooks = NULL;
    gt_loader_stats last;
    size_t detached;
    Py_BEGIN_ALLOW_THREADS
    detached = gt_loader_shutdown_within(loader, seconds);
    gt_loader_get_stats(loader, &last);
    Py_END_ALLOW_THREADS
    if (detached > 0)  /* they may still call the hooks after this object is gone */
        hooks_take_refs(hooks);
    Py_BEGIN_ALLOW_THREADS
    gt_loader_release(loader);
    Py_END_ALLOW_THREADS
    self->last_stats = last;
}

static int engine_traverse(PyObject *op, visitproc visit, void *arg) {
    EngineObject *self = (EngineObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->arrays);
    Py_VISIT(self->slot_type);
    Py_VISIT(self->worker_start);
    Py_VISIT(self->worker_transform);
    if (self->hooks)  /* owned by the loader, which this object owns until released */
        Py_VISIT(self->hooks->worker_error);
    return 0;
}

static int engine_clear(PyObject *op) {
    EngineObject *self = (EngineObject *)op;
    engine_release(self, GTPY_LOADER_DETACH_S);  /* workers use the members below until joined,
                                                     detached ones hold their own references */
    Py_CLEAR(self->arrays);
    Py_CLEAR(self->slot_type);
    Py_CLEAR(self->worker_start);
    Py_CLEAR(self->worker_transform);
    return 0;
}

static void engine_dealloc(PyObject *op) {
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    engine_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

/* ---- epochs and batches ------------------------------------------------------------- */

/* `done` as a sorted size_t array (PyMem), or NULL with *count = 0 for None/empty. */
static int parse_done(PyObject *obj, size_t **out, size_t *count) {
    *out = NULL;
    *count = 0;
    if (obj == Py_None)
        return 0;
    PyArrayObject *array = (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_INT64, NPY_ARRAY_IN_ARRAY);
    if (!array)
        return -1;
    size_t n = (size_t)PyArray_SIZE(array);
    const int64_t *values = PyArray_DATA(array);
    *out = PyMem_Malloc((n ? n : 1) * sizeof **out);
    for (size_t i = 0; *out && i < n; i++) {
        if (values[i] < 0) {
            PyErr_Format(PyExc_ValueError, "done: batch %lld is negative", (long long)values[i]);
            PyMem_Free(*out);
            *out = NULL;
            Py_DECREF(array);
            return -1;
        }
        (*out)[i] = (size_t)values[i];
    }
    Py_DECREF(array);
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    *count = n;
    return 0;
}

/* Batch boundaries of a batch_sampler (new reference to an int64 array), or NULL for None. */
static int parse_offsets(PyObject *obj, PyArrayObject **out, size_t *num_batches) {
    *out = NULL;
    if (obj == Py_None)
        return 0;
    *out = (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_INT64, NPY_ARRAY_IN_ARRAY);
    if (!*out)
        return -1;
    if (PyArray_NDIM(*out) != 1 || PyArray_DIM(*out, 0) < 1) {
        Py_CLEAR(*out);
        PyErr_SetString(PyExc_ValueError, "offsets must be a 1-D array of num_batches + 1 positions");
        return -1;
    }
    *num_batches = (size_t)PyArray_DIM(*out, 0) - 1;
    return 0;
}

static int check_open(EngineObject *self) {
    if (self->loader)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the loader engine was shut down");
    return -1;
}

static PyObject *engine_start_epoch(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"order", "batch_size", "drop_last", "offsets", "start_batch", "done", NULL};
    EngineObject *self = (EngineObject *)op;
    PyObject *spec, *offsets_obj = Py_None, *done_obj = Py_None;
    Py_ssize_t batch_size = 0, start_batch = 0;
    int drop_last = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|pOnO:start_epoch", keywords, &spec,
                                     &batch_size, &drop_last, &offsets_obj, &start_batch, &done_obj))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module || check_open(self) < 0)
        return NULL;
    if (start_batch < 0 || batch_size < 0)
        return PyErr_Format(PyExc_ValueError, "start_batch and batch_size must be >= 0");
    gt_sampler sampler;
    PyArrayObject *indices = NULL, *offsets = NULL;
    size_t *done = NULL, num_done = 0, num_batches = 0;
    if (gtpy_parse_sampler(module, spec, self->num_rows, &sampler, &indices) < 0)
        return NULL;
    PyObject *result = NULL;
    if (parse_offsets(offsets_obj, &offsets, &num_batches) < 0 || parse_done(done_obj, &done, &num_done) < 0)
        goto done;
    gt_batch_plan plan;
    gt_status status = offsets ? gt_batch_plan_offsets(&plan, &sampler, PyArray_DATA(offsets), num_batches)
                               : gt_batch_plan_uniform(&plan, &sampler, (size_t)batch_size, drop_last);
    if (status == GT_OK) {
        gt_loader *loader = self->loader;  /* kept alive while another thread may shut down */
        gt_loader_retain(loader);
        Py_BEGIN_ALLOW_THREADS
        status = gt_loader_start_epoch(loader, &plan, (size_t)start_batch, done, num_done);
        gt_loader_unref(loader);
        Py_END_ALLOW_THREADS
    }
    result = status == GT_OK ? PyLong_FromSize_t(plan.num_batches) : gtpy_raise(module, status);
done:
    Py_XDECREF(indices);
    Py_XDECREF(offsets);
    PyMem_Free(done);
    return result;
}

static double monotonic_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits for a batch in slices of 0.1 s so that Ctrl-C (and other signals) are handled. */
static gt_status wait_next(gt_loader *loader, double timeout, gt_slot **slot) {
    double deadline = timeout > 0 ? monotonic_seconds() + timeout : INFINITY;
    for (;;) {
        double slice = fmin(0.1, deadline - monotonic_seconds());
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = gt_loader_next(loader, slice > 0 ? slice : 1e-6, slot);
        Py_END_ALLOW_THREADS
        if (status != GT_ERR_TIMEOUT)
            return status;
        if (monotonic_seconds() >= deadline)
            return GT_FAIL(GT_ERR_TIMEOUT, "DataLoader timed out after %g seconds", timeout);
        gt_clear_error();
        if (PyErr_CheckSignals() < 0)
            return GT_ERR_RUNTIME;  /* the signal handler's exception is set */
    }
}

/* (batch, result): the worker_transform result if it ran, else the tuple of views. */
static PyObject *deliver(EngineObject *self, gt_loader *loader, gt_slot *slot) {
    PyObject *batch = PyLong_FromSize_t(slot->batch);
    PyObject *result;
    if (slot->user) {
        result = slot->user;
        slot->user = NULL;
        gt_loader_slot_release(loader, slot);  /* the result's views hold their own */
    } else {
        PyObject *owner = gtpy_loader_slot_new((PyTypeObject *)self->slot_type, loader, slot);
        result = owner ? gtpy_loader_slot_views(owner, self->arrays) : NULL;
        Py_XDECREF(owner);
    }
    if (!batch || !result) {
        Py_XDECREF(batch);
        Py_XDECREF(result);
        return NULL;
    }
    return Py_BuildValue("(NN)", batch, result);
}

static PyObject *engine_next(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"timeout", NULL};
    EngineObject *self = (EngineObject *)op;
    double timeout = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|d:next", keywords, &timeout))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    if (!module || check_open(self) < 0)
        return NULL;
    gt_loader *loader = self->loader;  /* kept alive while another thread may shut down */
    engine_hooks *hooks = self->hooks; /* lives as long as the loader */
    gt_loader_retain(loader);
    gt_slot *slot = NULL;
    gt_status status = wait_next(loader, timeout, &slot);
    PyObject *result;
    if (status != GT_OK && PyErr_Occurred()) {
        result = NULL;
    } else if (status != GT_OK && hooks->worker_error) {  /* worker_start's error, for the caller */
        gt_clear_error();
        result = Py_BuildValue("(nO)", (Py_ssize_t)-1, hooks->worker_error);
    } else if (status != GT_OK) {
        result = gtpy_raise(module, status);
    } else {
        result = slot ? deliver(self, loader, slot) : Py_NewRef(Py_None);
    }
    gt_loader_unref(loader);
    return result;
}

static PyObject *engine_stop(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    EngineObject *self = (EngineObject *)op;
    if (self->loader)
        gt_loader_request_stop(self->loader);
    return Py_NewRef(Py_None);
}

/* shutdown(timeout=None): waits for the workers in slices of 0.1 s, so that Ctrl-C ends the
 * wait (the workers still running are then detached and KeyboardInterrupt raised). */
static PyObject *engine_shutdown(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"timeout", NULL};
    EngineObject *self = (EngineObject *)op;
    PyObject *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:shutdown", keywords, &timeout_obj))
        return NULL;
    double timeout = -1.0;
    if (timeout_obj != Py_None) {
        timeout = PyFloat_AsDouble(timeout_obj);
        if (timeout == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(timeout >= 0.0))
            return PyErr_Format(PyExc_ValueError, "timeout must be None or >= 0, got %R", timeout_obj);
    }
    gt_loader *loader = self->loader;
    if (loader && timeout < 0) {
        gt_loader_request_stop(loader);
        gt_loader_retain(loader);  /* another thread may release it while this one waits */
        int stopped = 0, interrupted = 0;
        while (!stopped && !interrupted) {
            Py_BEGIN_ALLOW_THREADS
            stopped = gt_loader_wait_stopped(loader, 0.1);
            Py_END_ALLOW_THREADS
            interrupted = !stopped && PyErr_CheckSignals() < 0;
        }
        gt_loader_unref(loader);
        if (interrupted) {
            engine_release(self, 0.0);
            return NULL;
        }
        timeout = 0.0;  /* none runs: joined at once */
    }
    engine_release(self, timeout);
    return Py_NewRef(Py_None);
}

static PyObject *engine_stats(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    EngineObject *self = (EngineObject *)op;
    gt_loader_stats s = self->last_stats;
    if (self->loader)
        gt_loader_get_stats(self->loader, &s);
    PyObject *d = PyDict_New();
    if (d && (gtpy_dict_put_size(d, "num_slots", s.num_slots) < 0 || gtpy_dict_put_size(d, "initial_slots", s.initial_slots) < 0 ||
              gtpy_dict_put_size(d, "slot_bytes", s.slot_bytes) < 0 || gtpy_dict_put_size(d, "slots_pinned", s.slots_pinned) < 0 ||
              gtpy_dict_put_size(d, "batches_gathered", s.batches_gathered) < 0 ||
              gtpy_dict_put_size(d, "bytes_gathered", s.bytes_gathered) < 0 ||
              gtpy_dict_put_size(d, "num_workers", s.num_workers) < 0))
        Py_CLEAR(d);
    return d;
}

static PyObject *engine_get_num_rows(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(((EngineObject *)op)->num_rows);
}

static PyObject *engine_get_closed(PyObject *op, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(((EngineObject *)op)->loader == NULL);
}

static PyMethodDef engine_methods[] = {
    {"start_epoch", (PyCFunction)(void (*)(void))engine_start_epoch, METH_VARARGS | METH_KEYWORDS,
     "start_epoch(order, batch_size, drop_last=False, offsets=None, start_batch=0, done=None)\n--\n\n"
     "Starts an epoch (cancelling the one in progress); returns its number of batches."},
    {"next", (PyCFunction)(void (*)(void))engine_next, METH_VARARGS | METH_KEYWORDS,
     "next(timeout=0.0)\n--\n\n(batch, arrays or worker result), or None at the end of the epoch."},
    {"stop", engine_stop, METH_NOARGS, "Asks the workers to stop after their current batch; does not wait."},
    {"shutdown", (PyCFunction)(void (*)(void))engine_shutdown, METH_VARARGS | METH_KEYWORDS,
     "shutdown(timeout=None)\n--\n\nStops the workers and frees unheld slots. Waits for them until\n"
     "Ctrl-C (timeout=None) or `timeout` seconds; those still in a hook then are detached."},
    {"stats", engine_stats, METH_NOARGS, "Slot and gather counters (final ones once shut down)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"num_rows", engine_get_num_rows, NULL, "Samples in the dataset.", NULL},
    {"closed", engine_get_closed, NULL, "True once shut down.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_new, engine_new},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_traverse, engine_traverse},
    {Py_tp_clear, engine_clear},
    {Py_tp_methods, engine_methods},
    {Py_tp_getset, engine_getset},
    {Py_tp_doc, "LoaderEngine(arrays, max_batch_rows, num_workers, prefetch_factor, in_order=True, "
                "pin_memory=False, worker_start=None, worker_transform=None)\n--\n\n"
                "Worker threads gathering batches of `arrays` into a ring of slots."},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    .name = "gputrain._C.LoaderEngine",
    .basicsize = sizeof(EngineObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = engine_slots,
};

gt_loader *gtpy_loader_engine_loader(PyObject *module, PyObject *engine) {
    PyObject *type = PyObject_GetAttrString(module, "LoaderEngine");
    if (!type)
        return NULL;
    int is_engine = PyObject_TypeCheck(engine, (PyTypeObject *)type);
    Py_DECREF(type);
    if (!is_engine) {
        PyErr_Format(PyExc_TypeError, "engine must be a LoaderEngine, not %.100s", Py_TYPE(engine)->tp_name);
        return NULL;
    }
    EngineObject *self = (EngineObject *)engine;
    return check_open(self) < 0 ? NULL : self->loader;
}

int gtpy_add_loader(PyObject *module) {
    if (gtpy_add_loader_slot(module) < 0 || gtpy_add_loader_sampler(module) < 0 ||
        gtpy_add_loader_transfer(module) < 0)
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &engine_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "LoaderEngine", type);
    Py_DECREF(type);
    return rc;
}
