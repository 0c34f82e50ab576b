/* _C_testing.optimizer_on_device / grad_sumsq_on_device: the C optimizer and the gradient norm on
 * any device ('cpu' or 'cuda:N') over device copies of NumPy arrays, so tests can compare the
 * CUDA kernels and the CUDA offload pipeline with the CPU bit for bit. The parameters and each
 * step's gradients are packed into one block each (as a model's arenas are). */
#include "py/optim_py.h"
#include "py_testing/testing.h"

#include "core/alloc.h"
#include "core/copy_stream.h"

typedef struct device_run {
    gt_optimizer_config config;   /* kind, numerics, device, offload */
    gt_optim_hparams hparams;     /* the one group */
    float grad_coef;              /* passed to every step */
    float *params;                /* (total,) host: initial values in, final values out */
    const float *grads;           /* (steps, total) host gradients, one row per step */
    size_t *sizes;                /* (num_params,) elements of each parameter */
    size_t num_params;            /* parameters */
    size_t total;                 /* elements */
    size_t steps;                 /* optimizer steps */
} device_run;

static gt_status create_over(const device_run *run, const gt_block *params, const gt_block *grads,
                             gt_optimizer **opt) {
    gt_optim_param_desc *descs = calloc(run->num_params ? run->num_params : 1, sizeof *descs);
    if (!descs)
        return GT_FAIL(GT_ERR_OOM, "out of host memory");
    size_t offset = 0;
    for (size_t i = 0; i < run->num_params; i++) {
        descs[i] = (gt_optim_param_desc){(float *)params->ptr + offset, (float *)grads->ptr + offset,
                                         run->sizes[i], 0};
        offset += run->sizes[i];
    }
    gt_status status = gt_optimizer_create(&run->config, &run->hparams, 1, descs, run->num_params, opt);
    free(descs);
    return status;
}

/* With the device blocks allocated: copy in, step, wait for the device, copy out. */
static gt_status steps_on(const device_run *run, gt_block *params, gt_block *grads) {
    gt_device device = run->config.device;
    size_t bytes = run->total * sizeof(float);
    gt_optimizer *opt = NULL;
    GT_TRY(gt_memcpy_blocking(device, params->ptr, run->params, bytes));
    GT_TRY(create_over(run, params, grads, &opt));
    gt_status status = GT_OK;
    for (size_t s = 0; status == GT_OK && s < run->steps; s++) {
        status = gt_optimizer_synchronize(opt);  /* the previous step still reads the gradients */
        if (status == GT_OK)
            status = gt_memcpy_blocking(device, grads->ptr, run->grads + s * run->total, bytes);
        if (status == GT_OK)
            status = gt_optimizer_step(opt, run->grad_coef);
    }
    if (status == GT_OK)
        status = gt_optimizer_synchronize(opt);
    gt_optimizer_destroy(opt);
    return status == GT_OK ? gt_memcpy_blocking(device, run->params, params->ptr, bytes) : status;
}

static gt_status run_on_device(const device_run *run) {
    gt_block params = {0}, grads = {0};
    gt_status status = gt_block_alloc(run->config.device, run->total * sizeof(float), &params);
    if (status == GT_OK)
        status = gt_block_alloc(run->config.device, run->total * sizeof(float), &grads);
    if (status == GT_OK)
        status = steps_on(run, &params, &grads);
    gt_block_free(&grads);
    gt_block_free(&params);
    return status;
}

static int parse_names(const char *kind, const char *numerics, gt_optimizer_config *config) {
    int numerics_ok = strcmp(numerics, "exact") == 0 || strcmp(numerics, "fast") == 0;
    if (gtpy_optim_parse_kind(kind, &config->kind) < 0)  /* "adamw8bit": min_8bit_size 0, every parameter 8-bit */
        return -1;
    if (!numerics_ok) {
        PyErr_Format(PyExc_ValueError, "numerics must be 'exact' or 'fast', got %s", numerics);
        return -1;
    }
    config->numerics = strcmp(numerics, "fast") == 0 ? GT_NUMERICS_FAST : GT_NUMERICS_EXACT;
    return 0;
}

/* params: 1-D float32 (writeable); grads: 2-D float32 (steps, params.size); sizes sum to it. */
static int parse_arrays(PyObject *params, PyObject *grads, PyObject *sizes, device_run *run) {
    if (!PyArray_Check(params) || PyArray_TYPE((PyArrayObject *)params) != NPY_FLOAT32 ||
        PyArray_NDIM((PyArrayObject *)params) != 1 || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)params) ||
        !PyArray_ISWRITEABLE((PyArrayObject *)params)) {
        PyErr_SetString(PyExc_TypeError, "params must be a writeable, contiguous 1-D float32 array");
        return -1;
    }
    run->params = PyArray_DATA((PyArrayObject *)params);
    run->total = (size_t)PyArray_SIZE((PyArrayObject *)params);
    if (!PyArray_Check(grads) || PyArray_TYPE((PyArrayObject *)grads) != NPY_FLOAT32 ||
        PyArray_NDIM((PyArrayObject *)grads) != 2 || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)grads) ||
        (size_t)PyArray_DIM((PyArrayObject *)grads, 1) != run->total) {
        PyErr_Format(PyExc_ValueError, "grads must be a contiguous float32 array of shape (steps, %zu)", run->total);
        return -1;
    }
    run->grads = PyArray_DATA((PyArrayObject *)grads);
    run->steps = (size_t)PyArray_DIM((PyArrayObject *)grads, 0);
    run->num_params = (size_t)PySequence_Fast_GET_SIZE(sizes);
    run->sizes = PyMem_Calloc(run->num_params ? run->num_params : 1, sizeof *run->sizes);
    if (!run->sizes) {
        PyErr_NoMemory();
        return -1;
    }
    size_t sum = 0;
    for (size_t i = 0; i < run->num_params; i++) {
        Py_ssize_t n = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(sizes, (Py_ssize_t)i));
        if (n < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "sizes[%zu] must be >= 0", i);
            return -1;
        }
        run->sizes[i] = (size_t)n;
        sum += (size_t)n;
    }
    if (sum != run->total) {
        PyErr_Format(PyExc_ValueError, "sizes add up to %zu, params has %zu elements", sum, run->total);
        return -1;
    }
    return 0;
}

static PyObject *optimizer_on_device(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"kind", "device", "params", "sizes", "grads", "hparams", "numerics",
                               "cpu_offload_fraction", "grad_coef", "offload_chunk_numel", NULL};
    const char *kind = NULL, *numerics = "exact";
    PyObject *device_obj, *params, *sizes_obj, *grads, *hparams;
    device_run run = {.grad_coef = 1.0f};
    Py_ssize_t chunk = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOOOOO!|$sdfn:optimizer_on_device", keywords, &kind,
                                     &device_obj, &params, &sizes_obj, &grads, &PyDict_Type, &hparams, &numerics,
                                     &run.config.cpu_offload_fraction, &run.grad_coef, &chunk))
        return NULL;
    run.config.offload_chunk_numel = chunk > 0 ? (size_t)chunk : 0;
    PyObject *sizes = PySequence_Fast(sizes_obj, "sizes must be a sequence of ints");
    int ok = sizes && parse_names(kind, numerics, &run.config) == 0 &&
             gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &run.config.device) == 0 &&
             gtpy_optim_parse_hparams(hparams, &run.hparams) == 0 && parse_arrays(params, grads, sizes, &run) == 0;
    PyObject *result = NULL;
    if (ok) {
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = run_on_device(&run);
        Py_END_ALLOW_THREADS
        result = status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
    }
    PyMem_Free(run.sizes);
    Py_XDECREF(sizes);
    return result;
}

static gt_status sumsq_on_device(gt_device device, const float *host, size_t n, double *out) {
    gt_block block = {0};
    *out = 0.0;
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_block_alloc(device, n * sizeof(float), &block));
    gt_status status = gt_memcpy_blocking(device, block.ptr, host, n * sizeof(float));
    if (status == GT_OK)
        status = gt_grad_sumsq_on(device, NULL, block.ptr, n, out);
    gt_block_free(&block);
    return status;
}

static PyObject *grad_sumsq_on_device(PyObject *module, PyObject *args) {
    PyObject *x_obj, *device_obj;
    if (!PyArg_ParseTuple(args, "OO:grad_sumsq_on_device", &x_obj, &device_obj))
        return NULL;
    gt_device device;
    if (gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &device) < 0)
        return NULL;
    PyArrayObject *x = (PyArrayObject *)PyArray_FROM_OTF(x_obj, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
    if (!x)
        return NULL;
    double out = 0.0;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = sumsq_on_device(device, PyArray_DATA(x), (size_t)PyArray_SIZE(x), &out);
    Py_END_ALLOW_THREADS
    Py_DECREF(x);
    return status == GT_OK ? PyFloat_FromDouble(out) : gtpy_raise(module, status);
}

/* A run of deferred steps (gt_optimizer_step_deferred): every step's gradients and inf flag are
 * copied to the device first; each step hands its flag to the host as its result. Once `lag` are
 * unresolved the host waits for the oldest step (the optimizer's event recorded after it, so later
 * steps' work may still be queued), resolves it from the flag it read back, as TrainStep does
 * from a step's record, and gives each call the lrs of lr_schedule (one per update number) from
 * the resolved updates on. */
typedef struct deferred_run {
    const int *found_inf;        /* (steps,) host flags: 1 skips that step's update */
    const double *lr_schedule;   /* (lr_len,) lr of update number u, or NULL: the group's lr */
    size_t lr_len;               /* entries of lr_schedule */
    size_t lag;                  /* steps left unresolved at most, in [1, GT_OPTIM_RING] */
    size_t resolved;             /* steps resolved so far */
    size_t applied;              /* updates among them */
    int64_t num_steps;           /* the optimizer's num_steps at the end */
} deferred_run;

/* Waits for the oldest step and resolves it from the inf flag the device handed back. */
static gt_status resolve_oldest(gt_optimizer *opt, deferred_run *d) {
    int found_inf = 0, done = 0;
    GT_TRY(gt_optimizer_deferred_result(opt, 1, &found_inf, &done));
    d->resolved++;
    d->applied += (size_t)!found_inf;
    return gt_optimizer_resolve(opt, !found_inf);
}

/* Step s: its gradients (row s of the device block), the lrs from the resolved updates on. */
static gt_status deferred_step(const device_run *run, deferred_run *d, gt_optimizer *opt, float *grads,
                               const int *flags, size_t s) {
    double lrs[GT_OPTIM_RING];
    size_t offset = 0;
    for (size_t i = 0; i < run->num_params; i++) {
        GT_TRY(gt_optimizer_set_grad(opt, i, grads + s * run->total + offset));
        offset += run->sizes[i];
    }
    while (gt_optimizer_pending(opt) >= d->lag)  /* a resolved step has run: its table source is free */
        GT_TRY(resolve_oldest(opt, d));
    for (size_t j = 0; d->lr_schedule && j < GT_OPTIM_RING; j++) {
        if (d->applied + j >= d->lr_len)
            return GT_FAIL(GT_ERR_VALUE, "lr_schedule: needs %zu entries", d->applied + j + 1);
        lrs[j] = d->lr_schedule[d->applied + j];
    }
    return gt_optimizer_step_deferred(opt, flags + s, d->lr_schedule ? lrs : NULL, flags + s, sizeof *flags);
}

static gt_status deferred_steps_on(const device_run *run, deferred_run *d, gt_block *params, gt_block *grads,
                                   gt_block *flags) {
    gt_device device = run->config.device;
    gt_optimizer *opt = NULL;
    GT_TRY(gt_memcpy_blocking(device, params->ptr, run->params, run->total * sizeof(float)));
    GT_TRY(gt_memcpy_blocking(device, grads->ptr, run->grads, run->steps * run->total * sizeof(float)));
    GT_TRY(gt_memcpy_blocking(device, flags->ptr, d->found_inf, run->steps * sizeof(int)));
    GT_TRY(create_over(run, params, grads, &opt));
    gt_status status = GT_OK;
    for (size_t s = 0; status == GT_OK && s < run->steps; s++)
        status = deferred_step(run, d, opt, grads->ptr, flags->ptr, s);
    while (status == GT_OK && gt_optimizer_pending(opt) > 0)
        status = resolve_oldest(opt, d);
    d->num_steps = gt_optimizer_num_steps(opt);
    gt_optimizer_destroy(opt);
    return status == GT_OK ? gt_memcpy_blocking(device, run->params, params->ptr, run->total * sizeof(float))
                           : status;
}

static gt_status run_deferred(const device_run *run, deferred_run *d) {
    gt_block params = {0}, grads = {0}, flags = {0};
    gt_device device = run->config.device;
    if (!gt_device_is_accelerator(device))
        return GT_FAIL(GT_ERR_VALUE, "device: deferred steps run on an accelerator (cuda:N or sim:N)");
    gt_status status = gt_block_alloc(device, run->total * sizeof(float), &params);
    if (status == GT_OK)
        status = gt_block_alloc(device, (run->steps ? run->steps : 1) * run->total * sizeof(float), &grads);
    if (status == GT_OK)
        status = gt_block_alloc(device, (run->steps ? run->steps : 1) * sizeof(int), &flags);
    if (status == GT_OK)
        status = deferred_steps_on(run, d, &params, &grads, &flags);
    gt_block_free(&flags);
    gt_block_free(&grads);
    gt_block_free(&params);
    return status;
}

/* found_inf: one flag per row of grads; lr_schedule: None or 1-D float64. */
static int parse_deferred(PyObject *found_inf, PyObject *schedule, Py_ssize_t lag, const device_run *run,
                          PyArrayObject **flags, PyArrayObject **lrs, deferred_run *d) {
    *flags = (PyArrayObject *)PyArray_FROM_OTF(found_inf, NPY_INT, NPY_ARRAY_IN_ARRAY);
    if (!*flags)
        return -1;
    if (PyArray_NDIM(*flags) != 1 || (size_t)PyArray_SIZE(*flags) != run->steps) {
        PyErr_Format(PyExc_ValueError, "found_inf must hold one flag per step (%zu)", run->steps);
        return -1;
    }
    if (lag < 1 || lag > GT_OPTIM_RING) {
        PyErr_Format(PyExc_ValueError, "lag must be in [1, %d], got %zd", GT_OPTIM_RING, lag);
        return -1;
    }
    d->found_inf = PyArray_DATA(*flags);
    d->lag = (size_t)lag;
    if (schedule == Py_None)
        return 0;
    *lrs = (PyArrayObject *)PyArray_FROM_OTF(schedule, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY);
    if (!*lrs)
        return -1;
    d->lr_schedule = PyArray_DATA(*lrs);
    d->lr_len = (size_t)PyArray_SIZE(*lrs);
    return 0;
}

static PyObject *optimizer_deferred_on_device(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"kind", "device", "params", "sizes", "grads", "hparams", "found_inf", "numerics",
                               "lr_schedule", "lag", NULL};
    const char *kind = NULL, *numerics = "exact";
    PyObject *device_obj, *params, *sizes_obj, *grads, *hparams, *found_inf, *schedule = Py_None;
    Py_ssize_t lag = GT_OPTIM_RING - 1;
    device_run run = {.grad_coef = 1.0f};
    deferred_run d = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOOOOO!O|$sOn:optimizer_deferred_on_device", keywords, &kind,
                                     &device_obj, &params, &sizes_obj, &grads, &PyDict_Type, &hparams, &found_inf,
                                     &numerics, &schedule, &lag))
        return NULL;
    PyObject *sizes = PySequence_Fast(sizes_obj, "sizes must be a sequence of ints");
    PyArrayObject *flags = NULL, *lrs = NULL;
    int ok = sizes && parse_names(kind, numerics, &run.config) == 0 &&
             gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &run.config.device) == 0 &&
             gtpy_optim_parse_hparams(hparams, &run.hparams) == 0 && parse_arrays(params, grads, sizes, &run) == 0 &&
             parse_deferred(found_inf, schedule, lag, &run, &flags, &lrs, &d) == 0;
    PyObject *result = NULL;
    if (ok) {
        gt_status status;
        Py_BEGIN_ALLOW_THREADS
        status = run_deferred(&run, &d);
        Py_END_ALLOW_THREADS
        result = status == GT_OK ? PyLong_FromLongLong(d.num_steps) : gtpy_raise(module, status);
    }
    PyMem_Free(run.sizes);
    Py_XDECREF(flags);
    Py_XDECREF(lrs);
    Py_XDECREF(sizes);
    return result;
}

static PyMethodDef optim_device_functions[] = {
    {"optimizer_deferred_on_device", (PyCFunction)(void (*)(void))optimizer_deferred_on_device,
     METH_VARARGS | METH_KEYWORDS,
     "optimizer_deferred_on_device(kind, device, params, sizes, grads, hparams, found_inf, *, numerics='exact', "
     "lr_schedule=None, lag=GT_OPTIM_RING - 1)\n--\n\n"
     "Run grads.shape[0] deferred steps of the C optimizer (the update skipped on the device where "
     "found_inf is 1; lr of update number u = lr_schedule[u]), resolving them `lag` steps late; write "
     "the result back into params and return the optimizer's num_steps."},
    {"optimizer_on_device", (PyCFunction)(void (*)(void))optimizer_on_device, METH_VARARGS | METH_KEYWORDS,
     "optimizer_on_device(kind, device, params, sizes, grads, hparams, *, numerics='exact', "
     "cpu_offload_fraction=0.0, grad_coef=1.0, offload_chunk_numel=0)\n--\n\n"
     "Run grads.shape[0] steps of the C optimizer on a device over a packed copy of params "
     "(split by sizes), then write the result back into params."},
    {"grad_sumsq_on_device", grad_sumsq_on_device, METH_VARARGS,
     "grad_sumsq_on_device(x, device)\n--\n\nThe deterministic sum of squares computed on a device."},
    {NULL, NULL, 0, NULL},
};

int gtpy_add_optim_device(PyObject *module) { return PyModule_AddFunctions(module, optim_device_functions); }
