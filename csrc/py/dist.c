/* gputrain._C.Communicator: the collectives of csrc/dist/comm.h over an MPI library that mpi4py
 * loaded, or over TCP sockets (Communicator.over_tcp), on NumPy arrays, without the GIL;
 * gputrain.distributed builds it. */
#include "py/dist.h"

#include "dist/comm_mpi.h"
#include "dist/comm_tcp.h"
#include "dist/params.h"
#include "py/model.h"

typedef struct {
    PyObject_HEAD
    gt_comm comm;  /* the communicator; comm.ops NULL once closed */
    int busy;      /* 1 while a call (or a training step) uses it without the GIL */
} CommObject;

static PyObject *module_of(PyObject *self) { return PyType_GetModuleByDef(Py_TYPE(self), &gtpy_module_def); }

static PyObject *comm_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"library", "comm", "byte_type", "handle_bytes", "status_bytes", "rank", "size",
                               "timeout", NULL};
    gt_mpi_handles h = {0};
    long long comm = 0, byte_type = 0;
    int rank = 0, size = 0;
    double timeout = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sLLiiiid:Communicator", keywords, &h.library, &comm, &byte_type,
                                     &h.handle_bytes, &h.status_bytes, &rank, &size, &timeout))
        return NULL;
    h.comm = comm, h.byte_type = byte_type;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    if (!module)
        return NULL;
    CommObject *self = (CommObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    gt_status status = gt_comm_mpi_create(&h, rank, size, timeout, &self->comm);
    if (status != GT_OK) {
        Py_DECREF(self);
        return gtpy_raise(module, status);
    }
    return (PyObject *)self;
}

/* The file descriptors of `fds` (a list of `size` ints); NULL with an exception. */
static int *fds_arg(PyObject *fds, int size) {
    if (!PyList_Check(fds) || PyList_GET_SIZE(fds) != size) {
        PyErr_Format(PyExc_ValueError, "fds must be a list of one socket per rank (%d), got %.100s", size,
                     Py_TYPE(fds)->tp_name);
        return NULL;
    }
    int *out = PyMem_Calloc((size_t)size, sizeof *out);
    if (!out)
        return (int *)PyErr_NoMemory();
    for (int p = 0; p < size; p++) {
        long fd = PyLong_AsLong(PyList_GET_ITEM(fds, p));
        if (fd == -1 && PyErr_Occurred()) {
            PyMem_Free(out);
            return NULL;
        }
        out[p] = fd < INT_MIN || fd > INT_MAX ? -1 : (int)fd;
    }
    return out;
}

/* Communicator.over_tcp(fds, rank, size, timeout): over connected sockets, owned once it returned. */
static PyObject *comm_over_tcp(PyObject *type_obj, PyObject *args) {
    PyTypeObject *type = (PyTypeObject *)type_obj;
    PyObject *fds_obj;
    int rank = 0, size = 0;
    double timeout = 0.0;
    if (!PyArg_ParseTuple(args, "Oiid:over_tcp", &fds_obj, &rank, &size, &timeout))
        return NULL;
    if (size < 1 || rank < 0 || rank >= size)
        return PyErr_Format(PyExc_ValueError, "rank %d of world size %d: need 0 <= rank < size", rank, size);
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    int *fds = module ? fds_arg(fds_obj, size) : NULL;
    if (!fds)
        return NULL;
    CommObject *self = (CommObject *)type->tp_alloc(type, 0);
    gt_status status = self ? gt_comm_tcp_create(fds, rank, size, timeout, &self->comm) : GT_OK;
    PyMem_Free(fds);
    if (!self)
        return NULL;
    if (status != GT_OK) {
        Py_DECREF(self);
        return gtpy_raise(module, status);
    }
    return (PyObject *)self;
}

static void comm_dealloc(PyObject *op) {
    CommObject *self = (CommObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    gt_comm_free(&self->comm);
    self->comm.ops = NULL;
    type->tp_free(op);
    Py_DECREF(type);
}

static int is_comm(PyObject *obj) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(obj), &gtpy_module_def);
    if (!module) {
        PyErr_Clear();
        return 0;
    }
    PyObject *type = PyObject_GetAttrString(module, "Communicator");
    int same = type == (PyObject *)Py_TYPE(obj);
    Py_XDECREF(type);
    PyErr_Clear();
    return same;
}

gt_comm *gtpy_comm_enter(PyObject *obj) {
    if (!is_comm(obj)) {
        PyErr_Format(PyExc_TypeError, "comm must be a gputrain._C.Communicator or None, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    CommObject *self = (CommObject *)obj;
    if (!self->comm.ops) {
        PyErr_SetString(PyExc_RuntimeError, "comm: the communicator was closed (gputrain.distributed.destroy())");
        return NULL;
    }
    return gtpy_enter(&self->busy, "communicator") == 0 ? &self->comm : NULL;
}

void gtpy_comm_leave(PyObject *obj) { ((CommObject *)obj)->busy = 0; }

/* The data of `obj` for a collective: a C-contiguous, writeable array (of float32 if `f32`). */
static PyArrayObject *buffer_arg(PyObject *obj, int f32) {
    if (!PyArray_Check(obj) || (f32 && PyArray_TYPE((PyArrayObject *)obj) != NPY_FLOAT32)) {
        PyErr_Format(PyExc_TypeError, "array must be a %sNumPy array, not %.100s", f32 ? "float32 " : "",
                     PyArray_Check(obj) ? "another dtype" : Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *array = (PyArrayObject *)obj;
    if (!PyArray_IS_C_CONTIGUOUS(array) || !PyArray_ISWRITEABLE(array)) {
        PyErr_SetString(PyExc_ValueError, "array must be C-contiguous and writeable (it is updated in place)");
        return NULL;
    }
    return array;
}

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_BARRIER };

static gt_status run_op(gt_comm *comm, int op, PyArrayObject *array, int root) {
    void *data = array ? PyArray_DATA(array) : NULL;
    size_t n = array ? (size_t)PyArray_SIZE(array) : 0;
    switch (op) {
    case OP_ALLREDUCE:
        return gt_comm_allreduce_sum_f32(comm, data, n);
    case OP_REDUCE_SCATTER:
        return gt_comm_reduce_scatter_f32(comm, data, n);
    case OP_ALLGATHER:
        return gt_comm_allgather(comm, data, n, (size_t)PyArray_ITEMSIZE(array));
    case OP_BROADCAST:
        return gt_comm_broadcast(comm, data, (size_t)PyArray_NBYTES(array), root);
    default:
        return gt_comm_barrier(comm);
    }
}

/* Runs collective `op` without the GIL, the communicator held busy. */
static PyObject *collective(PyObject *self, int op, PyObject *obj, int root) {
    PyArrayObject *array = obj ? buffer_arg(obj, op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER) : NULL;
    if (obj && !array)
        return NULL;
    gt_comm *comm = gtpy_comm_enter(self);
    if (!comm)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = run_op(comm, op, array, root);
    Py_END_ALLOW_THREADS
    gtpy_comm_leave(self);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module_of(self), status);
}

static PyObject *comm_allreduce(PyObject *self, PyObject *array) { return collective(self, OP_ALLREDUCE, array, 0); }
static PyObject *comm_reduce_scatter(PyObject *self, PyObject *array) {
    return collective(self, OP_REDUCE_SCATTER, array, 0);
}
static PyObject *comm_allgather(PyObject *self, PyObject *array) { return collective(self, OP_ALLGATHER, array, 0); }
static PyObject *comm_barrier(PyObject *self, PyObject *unused) {
    (void)unused;
    return collective(self, OP_BARRIER, NULL, 0);
}

static PyObject *comm_broadcast(PyObject *self, PyObject *args) {
    PyObject *array;
    int root;
    if (!PyArg_ParseTuple(args, "Oi:broadcast", &array, &root))
        return NULL;
    return collective(self, OP_BROADCAST, array, root);
}

/* Every rank's parameters of `model` become rank root's (dist/params.h), without the GIL. */
static PyObject *comm_broadcast_parameters(PyObject *self, PyObject *args) {
    PyObject *model_obj, *module = module_of(self);
    int root;
    if (!module || !PyArg_ParseTuple(args, "Oi:broadcast_parameters", &model_obj, &root) ||
        !gtpy_model_get(module, model_obj, "model"))
        return NULL;
    gt_model *model = gtpy_model_enter(model_obj);
    if (!model)
        return NULL;
    gt_comm *comm = gtpy_comm_enter(self);
    if (!comm) {
        gtpy_model_leave(model_obj);
        return NULL;
    }
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_dist_broadcast_params(comm, model, root);
    Py_END_ALLOW_THREADS
    gtpy_comm_leave(self);
    gtpy_model_leave(model_obj);
    return status == GT_OK ? Py_NewRef(Py_None) : gtpy_raise(module, status);
}

static PyObject *comm_close(PyObject *op, PyObject *unused) {
    (void)unused;
    CommObject *self = (CommObject *)op;
    if (gtpy_enter(&self->busy, "communicator") < 0)
        return NULL;
    gt_comm_free(&self->comm);
    self->comm.ops = NULL;
    self->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *get_rank(PyObject *op, void *unused) { return (void)unused, PyLong_FromLong(((CommObject *)op)->comm.rank); }
static PyObject *get_size(PyObject *op, void *unused) { return (void)unused, PyLong_FromLong(((CommObject *)op)->comm.size); }
static PyObject *get_timeout(PyObject *op, void *unused) {
    return (void)unused, PyFloat_FromDouble(((CommObject *)op)->comm.timeout_s);
}
static PyObject *get_bytes_sent(PyObject *op, void *unused) {
    return (void)unused, PyLong_FromUnsignedLongLong(((CommObject *)op)->comm.bytes_sent);
}
static PyObject *get_buckets_early(PyObject *op, void *unused) {
    return (void)unused, PyLong_FromUnsignedLongLong(((CommObject *)op)->comm.buckets_early);
}
static PyObject *get_bucket_bytes(PyObject *op, void *unused) {
    return (void)unused, PyLong_FromSize_t(((CommObject *)op)->comm.bucket_elems * sizeof(float));
}

/* bucket_bytes: a whole number of f32 elements, at least one; not while a step uses it. */
static int set_bucket_bytes(PyObject *op, PyObject *value, void *unused) {
    (void)unused;
    CommObject *self = (CommObject *)op;
    if (!value || !PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "bucket_bytes must be an int");
        return -1;
    }
    long long bytes = PyLong_AsLongLong(value);
    if (bytes == -1 && PyErr_Occurred())
        return -1;
    if (bytes < (long long)sizeof(float) || bytes % (long long)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "bucket_bytes must be a positive multiple of 4 (float32), got %lld", bytes);
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "bucket_bytes: the communicator is in use");
        return -1;
    }
    self->comm.bucket_elems = (size_t)bytes / sizeof(float);
    return 0;
}

static PyObject *get_failed(PyObject *op, void *unused) { return (void)unused, PyBool_FromLong(((CommObject *)op)->comm.failed); }
static PyObject *get_closed(PyObject *op, void *unused) { return (void)unused, PyBool_FromLong(!((CommObject *)op)->comm.ops); }

static PyGetSetDef comm_getset[] = {
    {"rank", get_rank, NULL, "this process's rank", NULL},
    {"size", get_size, NULL, "the number of ranks", NULL},
    {"timeout", get_timeout, NULL, "seconds a collective may wait before it fails", NULL},
    {"bytes_sent", get_bytes_sent, NULL, "bytes this rank has sent since creation", NULL},
    {"bucket_bytes", get_bucket_bytes, set_bucket_bytes,
     "bytes of float32 gradients per all-reduce bucket, started during the step's last backward", NULL},
    {"buckets_early", get_buckets_early, NULL,
     "gradient buckets whose all-reduce started before the backward's first layer ran (overlap)", NULL},
    {"failed", get_failed, NULL, "True after a timeout or transport error", NULL},
    {"closed", get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef comm_methods[] = {
    {"allreduce", comm_allreduce, METH_O,
     "allreduce(array)\n--\n\nIn place: the float32 array becomes the sum over ranks, in rank order."},
    {"reduce_scatter", comm_reduce_scatter, METH_O,
     "reduce_scatter(array)\n--\n\nIn place: chunk `rank` of the float32 array becomes the rank-order sum of "
     "every rank's chunk `rank` (at most 2**20 elements)."},
    {"allgather", comm_allgather, METH_O,
     "allgather(array)\n--\n\nIn place: every rank's chunk `rank` of the flat array goes to every rank."},
    {"broadcast", comm_broadcast, METH_VARARGS, "broadcast(array, root)\n--\n\nIn place: the array becomes root's."},
    {"broadcast_parameters", comm_broadcast_parameters, METH_VARARGS,
     "broadcast_parameters(model, root)\n--\n\nThe _C.Model's parameters become rank root's (on its device for a "
     "device model)."},
    {"barrier", comm_barrier, METH_NOARGS, "barrier()\n--\n\nReturns once every rank called it."},
    {"over_tcp", comm_over_tcp, METH_VARARGS | METH_CLASS,
     "over_tcp(fds, rank, size, timeout)\n--\n\nCollectives over connected sockets: fds[p] is the file descriptor "
     "of the socket to rank p (fds[rank] is ignored); once this returned, the communicator owns and closes them (the caller "
     "detaches its socket objects); when it raises they stay the caller's. Built by gputrain.distributed.init() from its TCP store."},
    {"close", comm_close, METH_NOARGS, "close()\n--\n\nReleases the communicator; later calls raise."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot comm_slots[] = {
    {Py_tp_new, comm_new},
    {Py_tp_dealloc, comm_dealloc},
    {Py_tp_methods, comm_methods},
    {Py_tp_getset, comm_getset},
    {Py_tp_doc, "Communicator(library, comm, byte_type, handle_bytes, status_bytes, rank, size, timeout)\n--\n\n"
                "Collectives over the loaded MPI library `library` (MPICH ABI) on MPI communicator `comm`; "
                "every call fails with TimeoutError after `timeout` seconds. Built by gputrain.distributed.init()."},
    {0, NULL},
};

static PyType_Spec comm_spec = {
    .name = "gputrain._C.Communicator",
    .basicsize = sizeof(CommObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = comm_slots,
};

int gtpy_add_dist(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &comm_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Communicator", type);
    Py_DECREF(type);
    return rc;
}
