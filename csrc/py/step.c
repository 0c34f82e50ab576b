/* gputrain._C.train_step: the binding of the one-call training step (csrc/train/step.c). */
#include "py/gtpy.h"

#include <math.h>
#include <signal.h>
#include <string.h>

#include "py/dist.h"
#include "py/external.h"
#include "py/model.h"
#include "py/optim_model.h"
#include "py/step_config.h"
#include "train/step.h"

/* The optimizer core (_C.Optimizer or _C.ModelOptimizer, a new reference) of `obj` for
 * `model`: a ModelOptimizer (parameters in device memory) must update this model; a host
 * optimizer (over NumPy arrays, on the CPU) cannot update a model on an accelerator. */
static PyObject *resolve_optimizer(PyObject *obj, PyObject *model_obj, const gt_model *model) {
    PyObject *core = NULL;
    int found = gtpy_model_optimizer_resolve(obj, model_obj, &core);
    if (found != 0)
        return found < 0 ? NULL : core;
    if (gt_device_is_accelerator(model->backend.device)) {
        char device[32];
        gt_device_name(model->backend.device, device, sizeof device);
        return PyErr_Format(PyExc_ValueError, "optimizer: the model is on %s but this optimizer's parameters "
                            "are host (cpu) arrays of another model; build it over this model's parameters()",
                            device);
    }
    return gtpy_optimizer_core(obj);
}

static PyObject *step_result(const gt_step_result *r) {
    return Py_BuildValue("{s:d,s:d,s:O,s:O,s:d}", "loss", r->loss, "grad_norm", r->grad_norm, "skipped",
                         r->skipped ? Py_True : Py_False, "outlier", r->outlier ? Py_True : Py_False, "scale",
                         (double)r->scale);
}

/* ---- one step at a time per object: the objects a step uses are held busy while it runs ---- */

typedef struct step_objects {
    PyObject *model;      /* the _C.Model (borrowed: the arguments keep it alive) */
    PyObject *optimizer;  /* the optimizer core, a new reference (a concurrent add_param_group
                             replaces the Python optimizer's core; this one stays alive), or NULL */
    PyObject *scaler;     /* the GradScaler (borrowed), or NULL */
    PyObject *comm;       /* the _C.Communicator (borrowed), or NULL */
} step_objects;

/* Marks every object busy, all or none, with no Python code in between (the GIL is held):
 * a call in another thread that uses one of them raises "in use by another thread". */
static int enter_all(const step_objects *o, gt_step_config *cfg) {
    if (!gtpy_model_enter(o->model))
        return -1;
    if (o->optimizer && !(cfg->optimizer = gtpy_optimizer_enter(o->optimizer))) {
        gtpy_model_leave(o->model);
        return -1;
    }
    if (o->scaler && !(cfg->scaler = gtpy_scaler_enter(o->scaler))) {
        if (o->optimizer)
            gtpy_optimizer_leave(o->optimizer);
        gtpy_model_leave(o->model);
        return -1;
    }
    if (o->comm && !(cfg->comm = gtpy_comm_enter(o->comm))) {
        if (o->scaler)
            gtpy_scaler_leave(o->scaler);
        if (o->optimizer)
            gtpy_optimizer_leave(o->optimizer);
        gtpy_model_leave(o->model);
        return -1;
    }
    return 0;
}

static void leave_all(const step_objects *o) {
    if (o->comm)
        gtpy_comm_leave(o->comm);
    if (o->scaler)
        gtpy_scaler_leave(o->scaler);
    if (o->optimizer)
        gtpy_optimizer_leave(o->optimizer);
    gtpy_model_leave(o->model);
}

/* ---- Ctrl-C during a step: a C SIGINT handler beside Python's, on the main thread only ---- */

/* The ident of the interpreter's main thread, where Python runs its signal handlers (set when
 * the module is loaded; the interpreter is the only one: multiple interpreters are refused). */
static unsigned long main_thread_ident;

#ifdef SA_SIGINFO
static struct sigaction python_sigint;  /* Python's handler, chained to and restored after the step */

/* Records the request for the step to poll, then runs Python's handler, which sets the flag
 * that raises KeyboardInterrupt once the step returns and the GIL is back. */
static void on_sigint(int signum, siginfo_t *info, void *context) {
    gt_interrupt_request();
    if (python_sigint.sa_flags & SA_SIGINFO)
        python_sigint.sa_sigaction(signum, info, context);
    else
        python_sigint.sa_handler(signum);
}

/* 1 when Ctrl-C would raise KeyboardInterrupt in this thread: the main thread, with Python's
 * default SIGINT handler (a custom handler may not raise, so the step must not be abandoned). */
static int interrupt_raises(void) {
    if (PyThread_get_thread_ident() != main_thread_ident)
        return 0;
    PyObject *signal = PyImport_ImportModule("_signal");  /* built in: no Python code (and no
                                                             pending signal's handler) runs */
    PyObject *handler = signal ? PyObject_CallMethod(signal, "getsignal", "i", SIGINT) : NULL;
    PyObject *fallback = signal ? PyObject_GetAttrString(signal, "default_int_handler") : NULL;
    int raises = handler && fallback && handler == fallback;
    Py_XDECREF(signal);
    Py_XDECREF(handler);
    Py_XDECREF(fallback);
    PyErr_Clear();  /* anything odd: the step is just not interruptible */
    return raises;
}

/* Installs on_sigint in front of Python's handler; returns 1 when installed, 0 when not, -1
 * with KeyboardInterrupt for a Ctrl-C that came before (nothing done yet). */
static int interrupt_begin(void) {
    if (!interrupt_raises())
        return 0;
    struct sigaction ours, previous;
    if (sigaction(SIGINT, NULL, &previous) != 0 || previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN)
        return 0;
    python_sigint = previous;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigint;
    ours.sa_mask = previous.sa_mask;
    ours.sa_flags = (previous.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    gt_interrupt_clear();
    if (sigaction(SIGINT, &ours, NULL) != 0)
        return 0;
    if (PyErr_CheckSignals() == 0)  /* from here on a Ctrl-C also sets the step's request */
        return 1;
    sigaction(SIGINT, &python_sigint, NULL);
    return -1;
}

static void interrupt_end(int installed) {
    if (installed)
        sigaction(SIGINT, &python_sigint, NULL);
}
#else
static int interrupt_begin(void) { return 0; }
static void interrupt_end(int installed) { (void)installed; }
#endif

/* The step without the GIL; an interrupted one raises Python's KeyboardInterrupt. */
static gt_status run_step(gt_model *model, const gt_tensor *x, const gt_tensor *y, const gt_step_config *cfg,
                          gt_step_result *result) {
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_train_step(model, x, y, cfg, result);
    Py_END_ALLOW_THREADS
    if (status == GT_ERR_INTERRUPTED && PyErr_CheckSignals() < 0)
        gt_clear_error();
    return status;
}

/* One input of the step: a host array (converted when the step runs) or an array on the device. */
typedef struct step_input {
    PyArrayObject *given;       /* the checked host array (a reference), or NULL */
    gtpy_array_input device;    /* a DeviceArray's memory, or another library's array (neither: a host input) */
    gt_tensor tensor;           /* shape and dtype; ptr set once the data is known */
} step_input;

/* Checks `obj` (an array on the model's device, or anything NumPy converts): 0, or -1 with an
 * exception naming `arg_name`. Device arrays are read by the step's stream (the device's default
 * stream, NULL). */
static int parse_input(PyObject *module, PyObject *obj, const char *arg_name, char kind, const gt_model *model,
                       step_input *in) {
    in->given = NULL;
    int rc = gtpy_array_input_get(module, obj, arg_name, kind, model->backend.device, NULL, &in->tensor, &in->device);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    in->given = gtpy_input_array(obj, arg_name, kind, &in->tensor);
    return in->given ? 0 : -1;
}

static void clear_input(step_input *in) {
    Py_CLEAR(in->given);
    gtpy_array_input_clear(&in->device);
}

/* The host data of an input (a new reference; sets tensor.ptr), or Py_None for a device input. */
static PyObject *input_data(PyObject *module, step_input *in, const char *arg_name, char kind) {
    if (!in->given)
        return Py_NewRef(Py_None);
    return (PyObject *)gtpy_input_data(module, in->given, arg_name, kind, &in->tensor);
}

/* The step, ordered after the work producing its device inputs; they return to their owners (the
 * loader, another library) only after the step's work (queued on its device's default stream, NULL). */
static gt_status run_ordered(gt_model *model, step_input *x, step_input *y, const gt_step_config *cfg,
                             gt_step_result *result) {
    gt_status status = gtpy_array_input_begin(&x->device, NULL);
    if (status == GT_OK)
        status = gtpy_array_input_begin(&y->device, NULL);
    if (status != GT_OK)
        return status;
    status = run_step(model, &x->tensor, &y->tensor, cfg, result);
    gt_status x_end = gtpy_array_input_end(&x->device, NULL), y_end = gtpy_array_input_end(&y->device, NULL);
    if (status == GT_OK)
        status = x_end != GT_OK ? x_end : y_end;
    return status;
}

/* Prepares the plan, copies the host inputs and runs the step, with every object held busy. */
static PyObject *prepare_and_run(PyObject *module, gt_model *model, step_input *x, step_input *y,
                                 const gt_step_config *cfg) {
    char x_kind = gtpy_model_takes_ids(model) ? 'i' : 'f', y_kind = cfg->loss.kind == GT_LOSS_MSE ? 'f' : 'i';
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_train_step_prepare(model, &x->tensor, &y->tensor, cfg);  /* shapes checked before any copy */
    Py_END_ALLOW_THREADS
    if (status != GT_OK)
        return gtpy_raise(module, status);
    PyObject *x_data = input_data(module, x, "x", x_kind), *y_data = NULL;
    if (x_data)
        y_data = input_data(module, y, "y", y_kind);
    gt_step_result result;
    if (y_data)
        status = run_ordered(model, x, y, cfg, &result);
    Py_XDECREF(x_data);
    Py_XDECREF(y_data);
    if (!y_data)
        return NULL;
    if (status == GT_OK)
        return step_result(&result);
    return PyErr_Occurred() ? NULL : gtpy_raise(module, status);
}

/* prepare_and_run, abandoned early on a Ctrl-C when that raises KeyboardInterrupt (the main
 * thread with Python's default handler): the handler is in place from before the plan. */
static PyObject *step_held(PyObject *module, gt_model *model, step_input *x, step_input *y, gt_step_config *cfg) {
    int installed = interrupt_begin();
    if (installed < 0)
        return NULL;
    cfg->interruptible = installed;
    PyObject *result = prepare_and_run(module, model, x, y, cfg);
    interrupt_end(installed);
    return result;
}

/* Resolves the optimizer's core (optimizer_obj, scaler_obj: NULL for none) and holds the objects
 * with no Python code in between (a concurrent add_param_group then either came first or is
 * refused), then runs the step. */
static PyObject *step_with(PyObject *module, gt_model *model, PyObject *model_obj, PyObject *optimizer_obj,
                           PyObject *scaler_obj, PyObject *comm_obj, step_input *x, step_input *y,
                           gt_step_config *cfg) {
    step_objects objects = {.model = model_obj, .scaler = scaler_obj, .comm = comm_obj == Py_None ? NULL : comm_obj};
    if (optimizer_obj && !(objects.optimizer = resolve_optimizer(optimizer_obj, model_obj, model)))
        return NULL;
    PyObject *result = NULL;
    if (enter_all(&objects, cfg) == 0) {
        result = step_held(module, model, x, y, cfg);
        leave_all(&objects);
    }
    Py_XDECREF(objects.optimizer);
    return result;
}

/* train_step once its arguments are parsed: the model, the inputs, then the step. */
static PyObject *train_step_with(PyObject *module, PyObject *model_obj, PyObject *x_obj, PyObject *y_obj,
                                 PyObject *optimizer_obj, PyObject *scaler_obj, PyObject *comm_obj,
                                 gt_step_config *cfg) {
    gt_model *model = gtpy_model_get(module, model_obj, "model");
    if (!model)
        return NULL;
    step_input x = {0}, y = {0};  /* inputs checked first: converting them may run Python code */
    char x_kind = gtpy_model_takes_ids(model) ? 'i' : 'f', y_kind = cfg->loss.kind == GT_LOSS_MSE ? 'f' : 'i';
    PyObject *result = NULL;
    if (parse_input(module, x_obj, "x", x_kind, model, &x) == 0 && parse_input(module, y_obj, "y", y_kind, model, &y) == 0) {
        if (cfg->deferred && (x.given || y.given))  /* the device would read them after the call */
            PyErr_Format(PyExc_ValueError, "%s: sync=False takes DeviceArrays on the model's device (DataLoader("
                         "device=...)): the step returns before the device has read its inputs", x.given ? "x" : "y");
        else
            result = step_with(module, model, model_obj, optimizer_obj, scaler_obj, comm_obj, &x, &y, cfg);
    }
    clear_input(&x);
    clear_input(&y);
    return result;
}

/* train_step(config, model, x, y, *, record, guard_loss, guard_grad_norm, comm, lrs): the checked
 * settings of `config` (a StepConfig) and what changes from call to call. */
static PyObject *train_step(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {
        "config",           /* a StepConfig */
        "model",            /* the _C.Model */
        "x",                /* the batch's inputs */
        "y",                /* its targets */
        "record",           /* sync=False: the step record (0 or 1) it writes */
        "guard_loss",       /* with guard: the largest loss that updates */
        "guard_grad_norm",  /* with guard: the largest gradient norm that updates */
        "comm",             /* a Communicator (data parallelism), or None */
        "lrs",              /* sync=False with a scaler: (8, groups) lr of the next updates, or None */
        NULL,
    };
    PyObject *config_obj, *model_obj, *x_obj, *y_obj, *comm_obj = Py_None, *lrs_obj = Py_None;
    int record = 0;
    double guard_loss = INFINITY, guard_grad_norm = INFINITY;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|$iddOO:train_step", keywords, &config_obj, &model_obj,
                                     &x_obj, &y_obj, &record, &guard_loss, &guard_grad_norm, &comm_obj, &lrs_obj))
        return NULL;
    if (isnan(guard_loss) || isnan(guard_grad_norm))
        return PyErr_Format(PyExc_ValueError, "%s must be a number or +inf, not NaN",
                            isnan(guard_loss) ? "guard_loss" : "guard_grad_norm");
    gt_step_config cfg;
    PyObject *optimizer_obj, *scaler_obj;
    if (gtpy_step_config_get(module, config_obj, &cfg, &optimizer_obj, &scaler_obj) < 0)
        return NULL;
    cfg.record = record;
    cfg.guard_loss = guard_loss;
    cfg.guard_grad_norm = guard_grad_norm;
    PyArrayObject *lrs = lrs_obj == Py_None ? NULL
                         : (PyArrayObject *)PyArray_FROM_OTF(lrs_obj, NPY_FLOAT64, NPY_ARRAY_IN_ARRAY);
    if (lrs_obj != Py_None && !lrs)
        return NULL;
    if (lrs) {
        cfg.lrs = PyArray_DATA(lrs);
        cfg.lrs_len = (size_t)PyArray_SIZE(lrs);
    }
    PyObject *result = train_step_with(module, model_obj, x_obj, y_obj, optimizer_obj, scaler_obj, comm_obj, &cfg);
    Py_XDECREF(lrs);
    return result;
}

static PyObject *step_record(PyObject *module, PyObject *args) {
    PyObject *model_obj;
    int record, micro_batches, want_norm;
    if (!PyArg_ParseTuple(args, "Oiip:step_record", &model_obj, &record, &micro_batches, &want_norm))
        return NULL;
    gt_model *model = gtpy_model_get(module, model_obj, "model");
    if (!model)
        return NULL;
    gt_step_result result;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_step_read_record(model, record, micro_batches, want_norm, &result);
    Py_END_ALLOW_THREADS
    return status == GT_OK ? step_result(&result) : gtpy_raise(module, status);
}

static PyMethodDef step_methods[] = {
    {"train_step", (PyCFunction)(void (*)(void))train_step, METH_VARARGS | METH_KEYWORDS,
     "train_step(config, model, x, y, *, record=0, guard_loss=inf, guard_grad_norm=inf, comm=None, lrs=None)\n--\n\n"
     "One training step in C with the settings of `config` (a StepConfig); returns {'loss', 'grad_norm', "
     "'skipped', 'outlier', 'scale'}. With the config's guard, the update is skipped unless loss <= guard_loss "
     "and the gradient norm <= guard_grad_norm. With sync=False the step leaves its result in the model's step "
     "record `record` (0 or 1) for step_record. With comm (a Communicator), x and y are this rank's share of "
     "the batch and gradients and loss are summed over the ranks (data parallelism). With sync=False and a "
     "scaler, the update is deferred at lrs ((8, groups) lr of the next updates)."},
    {"step_record", step_record, METH_VARARGS,
     "step_record(model, record, micro_batches, want_norm)\n--\n\n"
     "The result of the sync=False step that wrote record `record` of a device model (waits for it)."},
    {NULL, NULL, 0, NULL},
};

/* main_thread_ident from threading.main_thread() (the module may be imported in another thread). */
static int find_main_thread(void) {
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *main_thread = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = main_thread ? PyObject_GetAttrString(main_thread, "ident") : NULL;
    main_thread_ident = ident ? PyLong_AsUnsignedLong(ident) : 0;
    Py_XDECREF(threading);
    Py_XDECREF(main_thread);
    Py_XDECREF(ident);
    return PyErr_Occurred() ? -1 : 0;
}

int gtpy_add_step(PyObject *module) {
    if (find_main_thread() < 0 || gtpy_add_step_config(module) < 0)
        return -1;
    return PyModule_AddFunctions(module, step_methods);
}
