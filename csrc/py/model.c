/* gputrain._C.Model: a compiled layer tree with its arenas. Built from a nested spec of tuples
 * by python/gputrain/nn/module.py; parameters and gradients are exposed as NumPy views of the
 * arenas (the views keep the Model alive). */
#include "py/gtpy.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "nn/kind.h"
#include "nn/model.h"
#include "py/model.h"
#include "py/external.h"

static int spec_error(const char *message, PyObject *spec) {
    PyErr_Format(PyExc_ValueError, "model spec: %s (got %R)", message, spec);
    return -1;
}

/* What parsing a spec tree carries from one layer to the next (pre-order). */
typedef struct spec_parse {
    uint32_t next_dropout_id;  /* Dropout ids handed out so far */
    gt_layer **first;          /* (count,) first use of every module with parameters, by index */
    gt_layer **last;           /* (count,) its latest use so far (the first in backward) */
    size_t count;              /* modules with parameters seen so far */
    size_t capacity;           /* length of the first and last arrays */
} spec_parse;

static void spec_parse_free(spec_parse *ctx) {
    free(ctx->first);
    free(ctx->last);
}

static int parse_layer(PyObject *spec, gt_layer *layer, spec_parse *ctx);

/* ("sequential", [specs]) or ("residual", [specs]): the children of a container. */
static int parse_children(PyObject *list, gt_layer *layer, spec_parse *ctx) {
    if (!PyList_Check(list))
        return spec_error("container children must be a list", list);
    Py_ssize_t n = PyList_GET_SIZE(list);
    layer->children = calloc((size_t)(n ? n : 1), sizeof(gt_layer));
    if (!layer->children) {
        PyErr_NoMemory();
        return -1;
    }
    layer->num_children = (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_layer(PyList_GET_ITEM(list, i), &layer->children[i], ctx) < 0)
            return -1;
    return 0;
}

/* Records `layer` (of a kind with GT_KIND_PARAMS) as the first use of the next module with
 * parameters; ("tied", index) specs refer to it by that index. */
static int register_params(gt_layer *layer, spec_parse *ctx) {
    if (ctx->count == ctx->capacity) {
        size_t capacity = ctx->capacity ? 2 * ctx->capacity : 16;
        gt_layer **first = realloc(ctx->first, capacity * sizeof *first);
        if (first)
            ctx->first = first;
        gt_layer **last = first ? realloc(ctx->last, capacity * sizeof *last) : NULL;
        if (!last) {
            PyErr_NoMemory();
            return -1;
        }
        ctx->last = last;
        ctx->capacity = capacity;
    }
    ctx->first[ctx->count] = ctx->last[ctx->count] = layer;
    ctx->count++;
    return 0;
}

/* ("tied", index): another use of the index-th module with parameters. It shares that module's
 * parameters; the use before it now adds its gradients (this one runs before it in backward). */
static int parse_tied(PyObject *spec, gt_layer *layer, spec_parse *ctx) {
    const char *kind = NULL;
    Py_ssize_t index = 0;
    if (!PyArg_ParseTuple(spec, "sn", &kind, &index))
        return -1;
    if (index < 0 || (size_t)index >= ctx->count)
        return spec_error("a tied layer must name an earlier layer with parameters", spec);
    const gt_layer *first = ctx->first[index];
    *layer = *first;  /* its kind and hyper-parameters (a leaf: no children, nothing planned yet) */
    layer->tied = first;
    layer->grad_accumulates = 0;
    ctx->last[index]->grad_accumulates = 1;
    ctx->last[index] = layer;
    return 0;
}

/* ("tied_linear", index): a Linear without bias whose (out, in) weight is the (num, dim) table of
 * the index-th module with parameters, an Embedding or a TokenEmbedding (an LM head tied to the
 * token embedding; a TokenEmbedding's token-type rows after its num rows are not part of it; a
 * table held frozen in f16/bf16 is read as stored, one in 4 bits is refused). As with
 * ("tied", index), the use before it now adds its gradients, so they are summed. */
static int parse_tied_linear(PyObject *spec, gt_layer *layer, spec_parse *ctx) {
    const char *kind = NULL;
    Py_ssize_t index = 0;
    if (!PyArg_ParseTuple(spec, "sn", &kind, &index))
        return -1;
    if (index < 0 || (size_t)index >= ctx->count ||
        (ctx->first[index]->kind != GT_LAYER_EMBEDDING && ctx->first[index]->kind != GT_LAYER_TOKENS))
        return spec_error("a tied Linear must name an earlier Embedding or TokenEmbedding", spec);
    const gt_layer *table = ctx->first[index];
    if (table->kind == GT_LAYER_TOKENS && gt_tokens_table_dtype(table) == GT_U8)
        return spec_error("a tied Linear cannot read a TokenEmbedding table held in 4 bits", spec);
    *layer = (gt_layer){.kind = GT_LAYER_LINEAR, .in_features = table->embedding_dim,
                        .out_features = table->num_embeddings, .tied = table};
    ctx->last[index]->grad_accumulates = 1;
    ctx->last[index] = layer;
    return 0;
}

/* ---- The generic parser: a spec ("kind", args...) read by the kind's row (nn/kind.h) ---- */

/* Raises `exc` with "model spec: <Kind> <argument> <what> (got <spec>)". */
static int arg_error(PyObject *exc, const gt_layer_type *type, const gt_layer_arg *arg, PyObject *spec,
                     const char *what) {
    PyErr_Format(exc, "model spec: %s %s %s (got %R)", type->title, arg->name, what, spec);
    return -1;
}

/* An int item in [arg->min, arg->max]. */
static int parse_int(PyObject *item, const gt_layer_type *type, const gt_layer_arg *arg, PyObject *spec,
                     int64_t *out) {
    char what[96];
    if (!PyIndex_Check(item)) {
        snprintf(what, sizeof what, "must be an int, not %s", Py_TYPE(item)->tp_name);
        return arg_error(PyExc_TypeError, type, arg, spec, what);
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        return arg_error(PyExc_ValueError, type, arg, spec, "does not fit an int64");
    if ((double)value < arg->min)
        snprintf(what, sizeof what, "must be at least %.0f, got %lld", arg->min, value);
    else if ((double)value > arg->max)
        snprintf(what, sizeof what, "must be at most %.0f, got %lld", arg->max, value);
    else {
        *out = value;
        return 0;
    }
    return arg_error(PyExc_ValueError, type, arg, spec, what);
}

/* A real item in the argument's range (NaN never is). */
static int parse_real(PyObject *item, const gt_layer_type *type, const gt_layer_arg *arg, PyObject *spec,
                      double *out) {
    char what[128];
    double value = PyFloat_AsDouble(item);
    if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        snprintf(what, sizeof what, "must be a real number, not %s", Py_TYPE(item)->tp_name);
        return arg_error(PyExc_TypeError, type, arg, spec, what);
    }
    int above = arg->min_exclusive ? value > arg->min : value >= arg->min;
    if (above && value <= arg->max) {
        *out = value;
        return 0;
    }
    snprintf(what, sizeof what, "must be in %c%g, %g], got %g", arg->min_exclusive ? '(' : '[', arg->min,
             arg->max, value);
    return arg_error(PyExc_ValueError, type, arg, spec, what);
}

/* A name of arg->names: its value. */
static int parse_enum(PyObject *item, const gt_layer_type *type, const gt_layer_arg *arg, PyObject *spec,
                      int *out) {
    const char *name = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
    if (!name) {
        if (PyErr_Occurred())
            return -1;
        return arg_error(PyExc_TypeError, type, arg, spec, "must be a str");
    }
    char what[256] = "must be one of";
    for (const gt_enum_name *e = arg->names; e->name; e++) {
        if (strcmp(e->name, name) == 0) {
            *out = e->value;
            return 0;
        }
        size_t used = strlen(what);
        snprintf(what + used, sizeof what - used, "%s '%s'", e == arg->names ? "" : ",", e->name);
    }
    return arg_error(PyExc_ValueError, type, arg, spec, what);
}

/* Two ints, each in the argument's range. */
static int parse_pair(PyObject *item, const gt_layer_type *type, const gt_layer_arg *arg, PyObject *spec,
                      int64_t out[2]) {
    if (!PySequence_Check(item) || PyUnicode_Check(item) || PySequence_Size(item) != 2) {
        PyErr_Clear();
        return arg_error(PyExc_TypeError, type, arg, spec, "must be a pair of ints");
    }
    for (Py_ssize_t i = 0; i < 2; i++) {
        PyObject *value = PySequence_GetItem(item, i);
        int rc = value ? parse_int(value, type, arg, spec, &out[i]) : -1;
        Py_XDECREF(value);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* ("residual", [specs]): one Sequential child holding the specs, the block. */
static int parse_block(PyObject *list, gt_layer *layer, spec_parse *ctx) {
    layer->children = calloc(1, sizeof(gt_layer));
    if (!layer->children) {
        PyErr_NoMemory();
        return -1;
    }
    layer->num_children = 1;
    layer->children[0].kind = GT_LAYER_SEQUENTIAL;
    return parse_children(list, &layer->children[0], ctx);
}

/* One item of a spec, stored where the argument says (memcpy: a field of the layer or of the
 * kind's own struct in its config bytes). */
static int parse_arg(PyObject *item, const gt_layer_type *type, const gt_layer_arg *arg, gt_layer *layer,
                     spec_parse *ctx, PyObject *spec) {
    char *at = (char *)layer + arg->offset;
    int64_t ints[2] = {0, 0};
    double real = 0.0;
    float single = 0.0f;
    int value = 0, rc = 0;
    switch (arg->type) {
    case GT_ARG_INT: rc = parse_int(item, type, arg, spec, &ints[0]); memcpy(at, ints, sizeof(int64_t)); break;
    case GT_ARG_INT_PAIR: rc = parse_pair(item, type, arg, spec, ints); memcpy(at, ints, sizeof ints); break;
    case GT_ARG_DOUBLE: rc = parse_real(item, type, arg, spec, &real); memcpy(at, &real, sizeof real); break;
    case GT_ARG_FLOAT:
        rc = parse_real(item, type, arg, spec, &real);
        single = (float)real;
        memcpy(at, &single, sizeof single);
        break;
    case GT_ARG_BOOL: rc = value = PyObject_IsTrue(item); memcpy(at, &value, sizeof value); break;
    case GT_ARG_ENUM: rc = parse_enum(item, type, arg, spec, &value); memcpy(at, &value, sizeof value); break;
    case GT_ARG_LAYERS: rc = parse_children(item, layer, ctx); break;
    case GT_ARG_BLOCK: rc = parse_block(item, layer, ctx); break;
    }
    return rc < 0 ? -1 : 0;
}

/* "takes 3 arguments (in_features, out_features, bias) after its kind, got 2". */
static int count_error(const gt_layer_type *type, Py_ssize_t given, PyObject *spec) {
    char names[256] = "";
    for (size_t i = 0; i < type->num_args; i++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", type->args[i].name);
    }
    PyErr_Format(PyExc_TypeError, "model spec: %s takes %zu argument%s (%s) after its kind, got %zd (got %R)",
                 type->title, type->num_args, type->num_args == 1 ? "" : "s", names, given, spec);
    return -1;
}

/* A spec of a kind of the table: its arguments in order, then the row's rules between them. */
static int parse_kind(PyObject *spec, gt_layer_kind kind, gt_layer *layer, spec_parse *ctx) {
    const gt_layer_type *type = gt_layer_type_of(kind);
    Py_ssize_t given = PyTuple_GET_SIZE(spec) - 1;
    if ((size_t)given != type->num_args)
        return count_error(type, given, spec);
    *layer = (gt_layer){.kind = kind};
    for (size_t i = 0; i < type->num_args; i++)
        if (parse_arg(PyTuple_GET_ITEM(spec, (Py_ssize_t)i + 1), type, &type->args[i], layer, ctx, spec) < 0)
            return -1;
    if (type->check && type->check(layer) != GT_OK) {
        PyErr_Format(PyExc_ValueError, "model spec: %s (got %R)", gt_error_message(), spec);
        return -1;
    }
    if (type->flags & GT_KIND_DROPOUT_ID)
        layer->dropout_id = ctx->next_dropout_id++;
    return type->flags & GT_KIND_PARAMS ? register_params(layer, ctx) : 0;
}

/* Specs that name an earlier module instead of a kind. */
static const struct {
    const char *name;                                          /* first item of the spec */
    int (*parse)(PyObject *spec, gt_layer *layer, spec_parse *ctx); /* reads the rest */
} references[] = {{"tied", parse_tied}, {"tied_linear", parse_tied_linear}};

static int parse_layer(PyObject *spec, gt_layer *layer, spec_parse *ctx) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0)))
        return spec_error("each layer must be a tuple starting with its kind", spec);
    const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    if (!name)
        return -1;
    for (size_t i = 0; i < sizeof references / sizeof references[0]; i++)
        if (strcmp(name, references[i].name) == 0)
            return references[i].parse(spec, layer, ctx);
    gt_layer_kind kind;
    if (!gt_layer_kind_named(name, &kind)) {
        PyErr_Format(PyExc_ValueError, "model spec: unknown layer kind '%s'", name);
        return -1;
    }
    return parse_kind(spec, kind, layer, ctx);
}

/* What a gradient view's base holds: an arena it frees once it owns it (retired). */
typedef struct grads_keep {
    gt_arena arena;  /* a retired gradient arena, once owned */
    int owned;       /* 1 when `arena` is this keeper's to free */
} grads_keep;

static const char grads_keep_name[] = "gputrain._C.gradients";

static void grads_keep_free(PyObject *capsule) {
    grads_keep *keep = PyCapsule_GetPointer(capsule, grads_keep_name);
    if (keep && keep->owned)
        gt_arena_destroy(&keep->arena);
    PyMem_RawFree(keep);
}

/* The keeper of the model's current gradient arena (borrowed; made on first use), or NULL with
 * an exception. */
static PyObject *grads_keeper(ModelObject *self) {
    if (self->grads_keeper)
        return self->grads_keeper;
    grads_keep *keep = PyMem_RawCalloc(1, sizeof *keep);
    if (!keep)
        return PyErr_NoMemory();
    self->grads_keeper = PyCapsule_New(keep, grads_keep_name, grads_keep_free);
    if (!self->grads_keeper)
        PyMem_RawFree(keep);
    return self->grads_keeper;
}

/* Hands `arena`, no longer the model's, to the keeper of its views (freed with the last of
 * them; at once when there is none), and empties *arena. */
static void retire_grads(ModelObject *self, gt_arena *arena) {
    if (self->grads_keeper) {
        grads_keep *keep = PyCapsule_GetPointer(self->grads_keeper, grads_keep_name);
        keep->arena = *arena;
        keep->owned = 1;
        Py_CLEAR(self->grads_keeper);
    } else {
        gt_arena_destroy(arena);
    }
    memset(arena, 0, sizeof *arena);
}

static void model_dealloc(PyObject *op) {
    ModelObject *self = (ModelObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    if (self->created && self->grads_keeper)  /* views of the gradients outlive the model */
        retire_grads(self, &self->model.grads);
    if (self->created)
        gt_model_destroy(&self->model);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *model_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"spec", "seed", "device", "precision", "plan_only", NULL};
    PyObject *spec = NULL, *device_obj = Py_None;
    unsigned long long seed = 0;
    const char *precision = "f32";
    int plan_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OK|Osp:Model", keywords, &spec, &seed,
                                     &device_obj, &precision, &plan_only))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &gtpy_module_def);
    gt_device device;
    gt_dtype dt;
    if (!module || gtpy_parse_device(module, device_obj, "device", gt_cpu_device(), &device) < 0)
        return NULL;
    gt_status status = gt_dtype_parse(precision, "precision", &dt);
    if (status != GT_OK)
        return gtpy_raise(module, status);
#ifdef GT_WITH_CUDA
    int supported = device.kind != GT_DEVICE_PINNED;
#else
    int supported = device.kind == GT_DEVICE_CPU || device.kind == GT_DEVICE_SIM;
#endif
    if (!supported)
        return PyErr_Format(PyExc_NotImplementedError,
                            "device: models run on 'cpu', 'cuda:N' or 'sim:N' in this build; '%s' is not supported",
                            PyUnicode_Check(device_obj) ? PyUnicode_AsUTF8(device_obj) : "?");
    gt_layer root = {.kind = GT_LAYER_SEQUENTIAL};
    spec_parse ctx = {0};
    int parsed = parse_children(spec, &root, &ctx);
    spec_parse_free(&ctx);
    if (parsed < 0) {
        gt_layer_free_children(&root);
        return NULL;
    }
    ModelObject *self = (ModelObject *)type->tp_alloc(type, 0);
    if (!self) {
        gt_layer_free_children(&root);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = plan_only ? gt_model_create_plan_only(&self->model, root, device, dt)
                       : gt_model_create(&self->model, root, device, dt, (uint64_t)seed);
    Py_END_ALLOW_THREADS
    self->created = 1;
    if (status != GT_OK) {
        Py_DECREF(self);
        return gtpy_raise(module, status);
    }
    return (PyObject *)self;
}

/* A 1-d float32 NumPy view of `count` floats at `data`, keeping `owner` alive. */
static PyObject *float_view(PyObject *owner, float *data, size_t count) {
    npy_intp dims[1] = {(npy_intp)count};
    PyObject *array = PyArray_SimpleNewFromData(1, dims, NPY_FLOAT32, data);
    if (!array)
        return NULL;
    if (PyArray_SetBaseObject((PyArrayObject *)array, Py_NewRef(owner)) < 0) {
        Py_DECREF(array);
        return NULL;
    }
    return array;
}

static PyObject *model_parameter_arrays(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    ModelObject *self = (ModelObject *)op;
    if (self->model.backend.device.kind != GT_DEVICE_CPU) {
        char name[32];
        gt_device_name(self->model.backend.device, name, sizeof name);
        return PyErr_Format(PyExc_RuntimeError,
                            "parameter_arrays: the parameters of this model live on '%s', where NumPy cannot "
                            "view them; copy them with read_parameters()/write_parameters()", name);
    }
    gt_status status = gt_model_check_values(&self->model, "parameter_arrays");
    if (status != GT_OK)
        return gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
    size_t n = self->model.num_params, m = self->model.num_grads;
    static float empty[1];
    float *params = n ? self->model.params.block.ptr : empty;
    float *grads = m ? self->model.grads.block.ptr : empty;
    PyObject *keeper = grads_keeper(self);
    PyObject *p = keeper ? float_view(op, params, n) : NULL;
    PyObject *g = p ? float_view(keeper, grads, m) : NULL;
    if (!g) {
        Py_XDECREF(p);
        return NULL;
    }
    return Py_BuildValue("(NN)", p, g);
}

static int append_param(PyObject *list, const gt_param *param) {
    PyObject *shape = PyTuple_New(param->ndim);
    for (int i = 0; shape && i < param->ndim; i++) {
        PyObject *dim = PyLong_FromLongLong((long long)param->shape[i]);
        if (!dim)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, i, dim);
    }
    PyObject *item = shape ? Py_BuildValue("(nN)", (Py_ssize_t)param->offset, shape) : NULL;
    if (!item)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static int collect_layout(PyObject *list, const gt_layer *layer) {
    if (layer->tied)  /* listed at its first use */
        return 0;
    if (layer->weight.numel && append_param(list, &layer->weight) < 0)
        return -1;
    if (layer->bias.numel && append_param(list, &layer->bias) < 0)
        return -1;
    for (size_t i = 0; i < layer->num_children; i++)
        if (collect_layout(list, &layer->children[i]) < 0)
            return -1;
    return 0;
}

static PyObject *model_parameter_layout(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    PyObject *list = PyList_New(0);
    if (list && collect_layout(list, &((ModelObject *)op)->model.root) < 0)
        Py_CLEAR(list);
    return list;
}

/* The parameters of a model in layout order (PyMem), *count of them; NULL with an exception. */
static const gt_param **param_list(const gt_model *model, size_t *count) {
    *count = gt_model_list_params(model, NULL, 0);
    const gt_param **list = PyMem_Calloc(*count ? *count : 1, sizeof *list);
    if (!list)
        return (const gt_param **)PyErr_NoMemory();
    gt_model_list_params(model, list, *count);
    return list;
}

static PyObject *model_gradient_layout(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    size_t n = 0;
    const gt_param **list = param_list(&((ModelObject *)op)->model, &n);
    PyObject *out = list ? PyList_New((Py_ssize_t)n) : NULL;
    for (size_t i = 0; out && i < n; i++) {
        PyObject *item = list[i]->frozen ? Py_NewRef(Py_None) : PyLong_FromSize_t(list[i]->grad_offset);
        if (!item)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    PyMem_Free(list);
    return out;
}

static PyObject *model_freezable(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    gt_model *model = &((ModelObject *)op)->model;
    size_t n = gt_model_list_params(model, NULL, 0);
    unsigned char *flags = PyMem_Calloc(n ? n : 1, 1);
    if (!flags)
        return PyErr_NoMemory();
    gt_status status = gt_model_freezable(model, flags, n);
    PyObject *out = status == GT_OK ? PyList_New((Py_ssize_t)n)
                                    : gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
    for (size_t i = 0; out && i < n; i++)
        PyList_SET_ITEM(out, (Py_ssize_t)i, PyBool_FromLong(flags[i]));
    PyMem_Free(flags);
    return out;
}

/* frozen[i] of a sequence of bools, one per parameter (PyMem), or NULL with an exception. */
static unsigned char *parse_frozen(PyObject *arg, size_t *count) {
    PyObject *seq = PySequence_Fast(arg, "frozen must be a sequence of bools");
    if (!seq)
        return NULL;
    *count = (size_t)PySequence_Fast_GET_SIZE(seq);
    unsigned char *flags = PyMem_Calloc(*count ? *count : 1, 1);
    if (!flags)
        PyErr_NoMemory();
    for (size_t i = 0; flags && i < *count; i++) {
        int value = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i));
        if (value < 0) {
            PyMem_Free(flags);
            flags = NULL;
        } else
            flags[i] = (unsigned char)value;
    }
    Py_DECREF(seq);
    return flags;
}

static PyObject *model_set_frozen(PyObject *op, PyObject *arg) {
    ModelObject *self = (ModelObject *)op;
    size_t count = 0;
    unsigned char *flags = parse_frozen(arg, &count);
    if (!flags)
        return NULL;
    if (!gtpy_model_enter(op)) {
        PyMem_Free(flags);
        return NULL;
    }
    gt_arena retired;
    gt_status status = gt_model_set_frozen(&self->model, flags, count, &retired);
    gtpy_model_leave(op);
    PyMem_Free(flags);
    if (status != GT_OK)
        return gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
    if (retired.block.ptr)  /* the arena changed: its views keep the old one */
        retire_grads(self, &retired);
    Py_RETURN_NONE;
}

static int append_buffer(PyObject *list, size_t offset, PyObject *shape, const char *dtype) {
    PyObject *item = shape ? Py_BuildValue("(nNs)", (Py_ssize_t)offset, shape, dtype) : NULL;
    int rc = item ? PyList_Append(list, item) : -1;
    Py_XDECREF(item);
    return rc;
}

/* A frozen piece's dtype as buffer_layout names it ("bfloat16": Python views it as ml_dtypes'
 * bfloat16, or as its uint16 bits without ml_dtypes). */
static const char *frozen_dtype_name(gt_dtype dtype) {
    switch (dtype) {
    case GT_U8: return "uint8";
    case GT_I8: return "int8";
    case GT_F16: return "float16";
    case GT_BF16: return "bfloat16";
    default: return "float32";
    }
}

/* The frozen buffers of a layer (a quantized or half weight, and its scales) as buffers. */
static int collect_frozen(PyObject *list, const gt_layer *layer) {
    gt_frozen_piece pieces[GT_MAX_FROZEN_PIECES];
    size_t count = gt_layer_type_of(layer->kind)->frozen(layer, pieces);
    for (size_t i = 0; i < count; i++) {
        const gt_frozen_piece *p = &pieces[i];
        const char *dtype = frozen_dtype_name(p->dtype);
        PyObject *shape = p->ndim == 1 ? Py_BuildValue("(L)", (long long)p->shape[0])
                                       : Py_BuildValue("(LL)", (long long)p->shape[0], (long long)p->shape[1]);
        if (append_buffer(list, layer->frozen_offset + p->offset, shape, dtype) < 0)
            return -1;
    }
    return 0;
}

/* (byte offset, shape, dtype) of every buffer in state_dict order (a shared module's once). */
static int collect_buffers(PyObject *list, const gt_layer *layer) {
    if (layer->tied)
        return 0;
    for (size_t i = 0; i < layer->num_children; i++)
        if (collect_buffers(list, &layer->children[i]) < 0)
            return -1;
    if (gt_layer_type_of(layer->kind)->frozen)
        return collect_frozen(list, layer);
    if (!layer->track_running_stats)
        return 0;
    size_t c = (size_t)layer->in_features, count = (size_t)((const char *)layer->num_batches_tracked -
                                                            (const char *)layer->running_mean);
    if (append_buffer(list, layer->buffer_offset, Py_BuildValue("(n)", (Py_ssize_t)c), "float32") < 0 ||
        append_buffer(list, layer->buffer_offset + c * sizeof(float), Py_BuildValue("(n)", (Py_ssize_t)c),
                      "float32") < 0)
        return -1;
    return append_buffer(list, layer->buffer_offset + count, PyTuple_New(0), "int64");
}

static PyObject *model_buffer_layout(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    PyObject *list = PyList_New(0);
    if (list && collect_buffers(list, &((ModelObject *)op)->model.root) < 0)
        Py_CLEAR(list);
    return list;
}

static PyObject *model_buffer_bytes(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    ModelObject *self = (ModelObject *)op;
    if (self->model.backend.device.kind != GT_DEVICE_CPU) {
        char name[32];
        gt_device_name(self->model.backend.device, name, sizeof name);
        return PyErr_Format(PyExc_RuntimeError, "buffer_bytes: the buffers of this model live on '%s', where "
                            "NumPy cannot view them; copy them with read_buffers()/write_buffers()", name);
    }
    gt_status status = gt_model_check_values(&self->model, "buffer_bytes");
    if (status != GT_OK)
        return gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
    static char empty[8];
    npy_intp dims[1] = {(npy_intp)self->model.buffer_bytes};
    PyObject *array = PyArray_SimpleNewFromData(1, dims, NPY_UINT8,
                                                self->model.buffer_bytes ? self->model.buffers.block.ptr : empty);
    if (array && PyArray_SetBaseObject((PyArrayObject *)array, Py_NewRef(op)) < 0)
        Py_CLEAR(array);
    return array;
}

static PyObject *read_buffers(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    ModelObject *self = (ModelObject *)op;
    npy_intp dims[1] = {(npy_intp)self->model.buffer_bytes};
    PyObject *array = PyArray_SimpleNew(1, dims, NPY_UINT8);
    if (!array)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_model_read_buffers(&self->model, PyArray_DATA((PyArrayObject *)array));
    Py_END_ALLOW_THREADS
    if (status != GT_OK) {
        Py_DECREF(array);
        return gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
    }
    return array;
}

static PyObject *write_buffers(PyObject *op, PyObject *arg) {
    ModelObject *self = (ModelObject *)op;
    PyArrayObject *array = (PyArrayObject *)PyArray_FROM_OTF(arg, NPY_UINT8, NPY_ARRAY_IN_ARRAY);
    if (!array)
        return NULL;
    if (PyArray_NDIM(array) != 1 || (size_t)PyArray_DIM(array, 0) != self->model.buffer_bytes) {
        PyErr_Format(PyExc_ValueError, "values: expected a 1-d array of %zu uint8 values (the buffer arena's bytes)",
                     self->model.buffer_bytes);
        Py_DECREF(array);
        return NULL;
    }
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_model_write_buffers(&self->model, PyArray_DATA(array));
    Py_END_ALLOW_THREADS
    Py_DECREF(array);
    return status == GT_OK ? Py_NewRef(Py_None)
                           : gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
}

static int all_finite(const float *x, size_t n) {
    int finite = 1;
    for (size_t i = 0; i < n; i++)
        finite &= isfinite(x[i]) != 0;
    return finite;
}

/* A list or other non-array input converted with NumPy's own dtype inference (never a forced
 * cast: float targets such as [0.7, 1.9] must not be truncated to class indices), or NULL. */
static PyArrayObject *convert_sequence(PyObject *obj, const char *arg_name, char kind) {
    PyArrayObject *array = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!array) {
        if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: expected a numeric array, got %.100s", arg_name,
                         Py_TYPE(obj)->tp_name);
        }
        return NULL;
    }
    int numeric = PyDataType_ISINTEGER(PyArray_DESCR(array)) ||
                  (kind == 'f' && (PyDataType_ISFLOAT(PyArray_DESCR(array)) || PyArray_ISBOOL(array)));
    if (!numeric) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %.100s holding %S", arg_name,
                     kind == 'f' ? "real numbers" : "integer class indices (not floats or bools)",
                     Py_TYPE(obj)->tp_name, (PyObject *)PyArray_DESCR(array));
        Py_DECREF(array);
        return NULL;
    }
    return array;
}

static PyArrayObject *input_array(PyObject *obj, const char *arg_name, char kind, gt_tensor *shape);

PyArrayObject *gtpy_input_array(PyObject *given, const char *arg_name, char kind, gt_tensor *shape) {
    PyObject *obj = gtpy_dlpack_host_array(given, arg_name);  /* a host DLPack producer: a NumPy view */
    PyArrayObject *array = obj ? input_array(obj, arg_name, kind, shape) : NULL;
    Py_XDECREF(obj);
    return array;
}

static PyArrayObject *input_array(PyObject *obj, const char *arg_name, char kind, gt_tensor *shape) {
    PyArrayObject *array = NULL;
    if (PyArray_Check(obj)) {
        PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)obj);
        int ok = kind == 'f' ? descr->type_num == NPY_FLOAT32 : PyDataType_ISINTEGER(descr);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s: expected %s, got an array of dtype %S", arg_name,
                         kind == 'f' ? "a float32 array (convert with x.astype(np.float32))" : "an integer array",
                         (PyObject *)descr);
            return NULL;
        }
        array = (PyArrayObject *)Py_NewRef(obj);  /* any layout: copied when the data is read */
    } else if (!(array = convert_sequence(obj, arg_name, kind))) {
        return NULL;
    }
    int ndim = PyArray_NDIM(array);
    if (ndim < 1 || ndim > GT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: expected 1 to %d dimensions, got %d", arg_name, GT_MAX_DIMS, ndim);
        Py_DECREF(array);
        return NULL;
    }
    int64_t dims[GT_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        dims[i] = PyArray_DIM(array, i);
    gt_tensor_make(shape, NULL, kind == 'f' ? GT_F32 : GT_I64, ndim, dims, gt_cpu_device());
    return array;
}

/* Raises OutOfMemoryError for a failed copy of `arg_name` when NumPy ran out of memory. */
static void copy_failed(PyObject *module, PyArrayObject *array, const char *arg_name) {
    if (!PyErr_ExceptionMatches(PyExc_MemoryError))
        return;
    PyErr_Clear();
    PyErr_Format(gtpy_state_of(module)->out_of_memory_error,
                 "%s: out of memory for a C-contiguous copy of the array (%zd bytes); pass a smaller "
                 "or contiguous array", arg_name, (Py_ssize_t)PyArray_NBYTES(array));
}

PyArrayObject *gtpy_input_data(PyObject *module, PyArrayObject *array, const char *arg_name, char kind,
                               gt_tensor *tensor) {
    PyArrayObject *data = (PyArrayObject *)PyArray_FROM_OTF((PyObject *)array, kind == 'f' ? NPY_FLOAT32 : NPY_INT64,
                                                            NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (!data) {
        copy_failed(module, array, arg_name);
        return NULL;
    }
    tensor->ptr = PyArray_DATA(data);
    if (kind == 'f' && !all_finite(PyArray_DATA(data), gt_tensor_numel(tensor))) {
        PyErr_Format(PyExc_ValueError, "%s contains NaN or infinite values", arg_name);
        Py_DECREF(data);
        return NULL;
    }
    return data;
}

static const gt_layer *first_leaf(const gt_layer *layer) {
    while (gt_layer_type_of(layer->kind)->flags & GT_KIND_CONTAINER) {
        if (layer->num_children == 0)
            return NULL;
        layer = &layer->children[0];
    }
    return layer;
}

int gtpy_model_takes_ids(const gt_model *model) {
    const gt_layer *leaf = first_leaf(&model->root);
    return leaf && (gt_layer_type_of(leaf->kind)->flags & GT_KIND_READS_IDS);
}

/* A new float32 array holding `t` (converted from its half format, copied from a device). */
static PyObject *tensor_to_numpy(PyObject *module, gt_model *model, const gt_tensor *t) {
    npy_intp dims[GT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        dims[i] = (npy_intp)t->shape[i];
    PyObject *array = PyArray_SimpleNew(t->ndim, dims, NPY_FLOAT32);
    if (!array)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_model_read_tensor(model, t, PyArray_DATA((PyArrayObject *)array));
    Py_END_ALLOW_THREADS
    if (status != GT_OK) {
        Py_DECREF(array);
        return gtpy_raise(module, status);
    }
    return array;
}

/* Forward on an array on the model's device: read where it is, after the work producing it; it
 * returns to its owner only after the forward's work (queued on the device's default stream, NULL). */
static PyObject *forward_device(PyObject *module, gt_model *model, gt_tensor *input, gtpy_array_input *in) {
    gt_status status;
    gt_tensor output;
    Py_BEGIN_ALLOW_THREADS
    status = gt_model_prepare_forward(model, input);
    if (status == GT_OK && (status = gtpy_array_input_begin(in, NULL)) == GT_OK) {
        status = gt_model_forward(model, input, 0, &output);
        gt_status end = gtpy_array_input_end(in, NULL);
        status = status == GT_OK ? end : status;
    }
    Py_END_ALLOW_THREADS
    return status == GT_OK ? tensor_to_numpy(module, model, &output) : gtpy_raise(module, status);
}

static PyObject *forward(PyObject *op, PyObject *arg) {
    ModelObject *self = (ModelObject *)op;
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    gt_tensor input, output;
    char kind = gtpy_model_takes_ids(&self->model) ? 'i' : 'f';
    gtpy_array_input in;
    int on_device = gtpy_array_input_get(module, arg, "x", kind, self->model.backend.device, NULL, &input, &in);
    if (on_device != 0) {
        PyObject *result = on_device > 0 ? forward_device(module, &self->model, &input, &in) : NULL;
        gtpy_array_input_clear(&in);
        return result;
    }
    PyArrayObject *given = gtpy_input_array(arg, "x", kind, &input);
    if (!given)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_model_prepare_forward(&self->model, &input);  /* the shape is checked before any copy */
    Py_END_ALLOW_THREADS
    PyArrayObject *x = status == GT_OK ? gtpy_input_data(module, given, "x", kind, &input) : NULL;
    Py_DECREF(given);
    if (!x)
        return status == GT_OK ? NULL : gtpy_raise(module, status);
    Py_BEGIN_ALLOW_THREADS
    status = gt_model_forward(&self->model, &input, 0, &output);
    Py_END_ALLOW_THREADS
    PyObject *result = status == GT_OK ? tensor_to_numpy(module, &self->model, &output) : gtpy_raise(module, status);
    Py_DECREF(x);
    return result;
}

static int put_size(PyObject *dict, const char *key, size_t value) {
    PyObject *number = PyLong_FromSize_t(value);
    int rc = number ? PyDict_SetItemString(dict, key, number) : -1;
    Py_XDECREF(number);
    return rc;
}

static PyObject *plan_to_dict(const gt_model_plan *plan) {
    PyObject *d = PyDict_New();
    if (!d || put_size(d, "parameters", plan->param_bytes) < 0 || put_size(d, "gradients", plan->grad_bytes) < 0 ||
        put_size(d, "half_parameters", plan->lowp_param_bytes) < 0 ||
        put_size(d, "buffers", plan->buffer_bytes) < 0 ||
        put_size(d, "activations", plan->activation_bytes) < 0 ||
        put_size(d, "recompute", plan->recompute_bytes) < 0 || put_size(d, "backward_scratch", plan->scratch_bytes) < 0 ||
        put_size(d, "loss_buffers", plan->loss_bytes) < 0 || put_size(d, "workspace", plan->workspace_bytes) < 0 ||
        put_size(d, "total", plan->total_bytes) < 0 || put_size(d, "checkpoint_offload", plan->offload_bytes) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

/* A checkpointing mode: False, True or "offload" (GT_CHECKPOINT_*). Returns -1 with an exception
 * naming `name` for anything else. */
static int parse_checkpointing(PyObject *value, const char *name, int *mode) {
    if (value && PyBool_Check(value)) {
        *mode = value == Py_True ? GT_CHECKPOINT_ON : GT_CHECKPOINT_OFF;
        return 0;
    }
    if (value && PyUnicode_Check(value) && PyUnicode_CompareWithASCIIString(value, "offload") == 0) {
        *mode = GT_CHECKPOINT_OFFLOAD;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s must be True, False or \"offload\", got %R", name, value ? value : Py_None);
    return -1;
}

/* The Python value of a checkpointing mode. */
static PyObject *checkpointing_value(int mode) {
    return mode == GT_CHECKPOINT_OFFLOAD ? PyUnicode_FromString("offload") : PyBool_FromLong(mode);
}

/* A shape: a sequence of 1 to GT_MAX_DIMS non-negative ints. Returns ndim, or -1 with an
 * exception naming the offending entry (OutOfMemoryError for a size beyond any memory). */
static int parse_shape(PyObject *module, PyObject *obj, int64_t *shape) {
    PyObject *seq = PySequence_Fast(obj, "shape must be a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t ndim = PySequence_Fast_GET_SIZE(seq);
    int rc = ndim >= 1 && ndim <= GT_MAX_DIMS ? (int)ndim : -1;
    if (rc < 0)
        PyErr_Format(PyExc_ValueError, "shape: expected 1 to %d dimensions, got %zd", GT_MAX_DIMS, ndim);
    for (Py_ssize_t i = 0; rc >= 0 && i < ndim; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *index = PyNumber_Index(item);
        int overflow = 0;
        long long value = index ? PyLong_AsLongLongAndOverflow(index, &overflow) : -1;
        Py_XDECREF(index);
        if (!index) {
            PyErr_Format(PyExc_TypeError, "shape[%zd] must be an int, not %.100s", i, Py_TYPE(item)->tp_name);
            rc = -1;
        } else if (overflow > 0 || (value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_Format(gtpy_state_of(module)->out_of_memory_error,
                         "shape[%zd]: %R is too large for any memory (more than 2**63 - 1)", i, item);
            rc = -1;
        } else if (overflow < 0 || value < 0) {
            PyErr_Format(PyExc_ValueError, "shape[%zd] must be >= 0, got %R", i, item);
            rc = -1;
        } else {
            shape[i] = value;
        }
    }
    Py_DECREF(seq);
    return rc;
}

/* What the allocator reserves for each arena of a plan (the Trainer's memory plan). */
static PyObject *arenas_to_dict(const gt_model_plan *plan) {
    PyObject *d = PyDict_New();
    if (!d || put_size(d, "parameters", plan->param_arena_bytes) < 0 ||
        put_size(d, "gradients", plan->grad_arena_bytes) < 0 ||
        put_size(d, "half_parameters", plan->lowp_arena_bytes) < 0 ||
        put_size(d, "buffers", plan->buffer_arena_bytes) < 0 ||
        put_size(d, "activations", plan->activation_arena_bytes) < 0 ||
        put_size(d, "backend_scratch", plan->backend_arena_bytes) < 0 ||
        put_size(d, "step_scratch", plan->step_scratch_bytes) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

/* plan() and arena_plan(): the plan for (shape, checkpointing=False, precision=None) as a dict. */
static PyObject *plan_with(PyObject *op, PyObject *args, PyObject *kwargs, const char *format,
                           PyObject *(*to_dict)(const gt_model_plan *)) {
    static char *keywords[] = {"shape", "checkpointing", "precision", NULL};
    ModelObject *self = (ModelObject *)op;
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    PyObject *shape_obj = NULL, *checkpointing_obj = Py_False;
    int checkpointing = GT_CHECKPOINT_OFF;
    const char *precision = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &shape_obj, &checkpointing_obj, &precision) ||
        parse_checkpointing(checkpointing_obj, "checkpointing", &checkpointing) < 0)
        return NULL;
    gt_dtype dt = self->model.dt;
    gt_status status = precision ? gt_dtype_parse(precision, "precision", &dt) : GT_OK;
    if (status != GT_OK)
        return gtpy_raise(module, status);
    int64_t shape[GT_MAX_DIMS];
    int ndim = parse_shape(module, shape_obj, shape);
    if (ndim < 0)
        return NULL;
    gt_tensor input;
    gt_dtype in_dt = gtpy_model_takes_ids(&self->model) ? GT_I64 : GT_F32;
    status = gt_tensor_make(&input, NULL, in_dt, ndim, shape, gt_cpu_device());
    gt_model_plan plan;
    if (status == GT_OK)
        status = gt_model_compute_plan(&self->model, &input, checkpointing, dt, &plan);
    return status == GT_OK ? to_dict(&plan) : gtpy_raise(module, status);
}

static PyObject *plan(PyObject *op, PyObject *args, PyObject *kwargs) {
    return plan_with(op, args, kwargs, "O|Os:plan", plan_to_dict);
}

static PyObject *arena_plan(PyObject *op, PyObject *args, PyObject *kwargs) {
    return plan_with(op, args, kwargs, "O|Os:arena_plan", arenas_to_dict);
}

static PyObject *init_parameters(PyObject *op, PyObject *arg) {
    ModelObject *self = (ModelObject *)op;
    unsigned long long seed = PyLong_AsUnsignedLongLong(arg);
    if (seed == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    gt_status status = gt_model_init_params(&self->model, (uint64_t)seed);
    return status == GT_OK ? Py_NewRef(Py_None)
                           : gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
}

/* A new (count,) float32 array read by `read` (parameters or gradients). */
static PyObject *read_flat(PyObject *op, gt_status (*read)(gt_model *, float *), size_t count) {
    ModelObject *self = (ModelObject *)op;
    npy_intp dims[1] = {(npy_intp)count};
    PyObject *array = PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (!array)
        return NULL;
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = read(&self->model, PyArray_DATA((PyArrayObject *)array));
    Py_END_ALLOW_THREADS
    if (status != GT_OK) {
        Py_DECREF(array);
        return gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
    }
    return array;
}

static PyObject *read_parameters(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    return read_flat(op, gt_model_read_parameters, ((ModelObject *)op)->model.num_params);
}

static PyObject *read_gradients(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    return read_flat(op, gt_model_read_gradients, ((ModelObject *)op)->model.num_grads);
}

static PyObject *write_parameters(PyObject *op, PyObject *arg) {
    ModelObject *self = (ModelObject *)op;
    PyArrayObject *array = (PyArrayObject *)PyArray_FROM_OTF(arg, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
    if (!array)
        return NULL;
    if (PyArray_NDIM(array) != 1 || (size_t)PyArray_DIM(array, 0) != self->model.num_params) {
        PyErr_Format(PyExc_ValueError, "values: expected a 1-d array of %zu float32 values (num_parameters)",
                     self->model.num_params);
        Py_DECREF(array);
        return NULL;
    }
    gt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = gt_model_write_parameters(&self->model, PyArray_DATA(array));
    Py_END_ALLOW_THREADS
    Py_DECREF(array);
    return status == GT_OK ? Py_NewRef(Py_None)
                           : gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
}

static PyObject *zero_gradients(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    gt_status status = gt_model_zero_gradients(&((ModelObject *)op)->model);
    return status == GT_OK ? Py_NewRef(Py_None)
                           : gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
}

static PyObject *refresh(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    gt_status status = gt_model_refresh_lowp(&((ModelObject *)op)->model);
    return status == GT_OK ? Py_NewRef(Py_None)
                           : gtpy_raise(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
}

static PyObject *get_training(PyObject *op, void *c) { return PyBool_FromLong(((ModelObject *)op)->model.training); }
static PyObject *get_checkpointing(PyObject *op, void *c) { return checkpointing_value(((ModelObject *)op)->model.checkpointing); }
static PyObject *get_grads_valid(PyObject *op, void *c) { return PyBool_FromLong(((ModelObject *)op)->model.grads_valid); }
static PyObject *get_step(PyObject *op, void *c) { return PyLong_FromUnsignedLong(((ModelObject *)op)->model.step); }
static PyObject *get_seed(PyObject *op, void *c) { return PyLong_FromUnsignedLongLong(((ModelObject *)op)->model.seed); }
static PyObject *get_num_parameters(PyObject *op, void *c) { return PyLong_FromSize_t(((ModelObject *)op)->model.num_params); }
static PyObject *get_num_gradients(PyObject *op, void *c) { return PyLong_FromSize_t(((ModelObject *)op)->model.num_grads); }
static PyObject *get_plan_only(PyObject *op, void *c) { return PyBool_FromLong(((ModelObject *)op)->model.plan_only); }
static PyObject *get_precision(PyObject *op, void *c) { return PyUnicode_FromString(gt_dtype_name(((ModelObject *)op)->model.dt)); }

static PyObject *get_device(PyObject *op, void *c) {
    char name[32];
    gt_device_name(((ModelObject *)op)->model.backend.device, name, sizeof name);
    return PyUnicode_FromString(name);
}

static PyObject *get_current_plan(PyObject *op, void *c) {
    ModelObject *self = (ModelObject *)op;
    return self->model.planned ? plan_to_dict(&self->model.plan) : Py_NewRef(Py_None);
}

static int set_flag(PyObject *value, const char *name, int *flag) {
    if (!value || !PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be a bool", name);
        return -1;
    }
    *flag = value == Py_True;
    return 0;
}

static int put_training(PyObject *op, PyObject *value) {
    return set_flag(value, "training", &((ModelObject *)op)->model.training);
}

static int put_grads_valid(PyObject *op, PyObject *value) {
    return set_flag(value, "grads_valid", &((ModelObject *)op)->model.grads_valid);
}

static int put_checkpointing(PyObject *op, PyObject *value) {
    ModelObject *self = (ModelObject *)op;
    int flag = 0;
    if (parse_checkpointing(value, "checkpointing", &flag) < 0)
        return -1;
    if (flag != self->model.checkpointing)
        self->model.planned = 0;  /* the activation layout changes */
    self->model.checkpointing = flag;
    return 0;
}

static PyObject *get_loss_chunk_rows(PyObject *op, void *c) {
    return PyLong_FromLongLong(((ModelObject *)op)->model.loss_chunk_rows);
}

static int put_loss_chunk_rows(PyObject *op, PyObject *value) {
    if (!value || !PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "loss_chunk_rows must be an int (0: off)");
        return -1;
    }
    long long rows = PyLong_AsLongLong(value);
    if (rows == -1 && PyErr_Occurred())
        return -1;
    gt_status status = gt_model_set_loss_chunk_rows(&((ModelObject *)op)->model, rows);
    return status == GT_OK ? 0 : gtpy_raise_int(PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def), status);
}

static int put_step(PyObject *op, PyObject *value) {
    unsigned long step = value ? PyLong_AsUnsignedLong(value) : (unsigned long)-1;
    if (step == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (step > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "step must fit in 32 bits");
        return -1;
    }
    ((ModelObject *)op)->model.step = (uint32_t)step;
    return 0;
}

static int put_precision(PyObject *op, PyObject *value) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(op), &gtpy_module_def);
    const char *name = value && PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
    if (!name) {
        PyErr_SetString(PyExc_TypeError, "precision must be a str ('f32', 'f16' or 'bf16')");
        return -1;
    }
    gt_dtype dt;
    gt_status status = gt_dtype_parse(name, "precision", &dt);
    if (status == GT_OK)
        status = gt_model_set_dtype(&((ModelObject *)op)->model, dt);
    return status == GT_OK ? 0 : gtpy_raise_int(module, status);
}


/* ---- every call that reads or changes the model's memory holds it (gtpy_model_enter) ---- */

typedef PyObject *(*model_call)(PyObject *op, PyObject *arg);

/* call(op, arg) with the model marked busy, so that a training step in another thread raises
 * instead of racing with it (and the other way round). */
static PyObject *exclusive(PyObject *op, PyObject *arg, model_call call) {
    if (!gtpy_model_enter(op))
        return NULL;
    PyObject *result = call(op, arg);
    gtpy_model_leave(op);
    return result;
}

static PyObject *model_forward(PyObject *op, PyObject *arg) { return exclusive(op, arg, forward); }
static PyObject *model_init_parameters(PyObject *op, PyObject *arg) { return exclusive(op, arg, init_parameters); }
static PyObject *model_read_parameters(PyObject *op, PyObject *arg) { return exclusive(op, arg, read_parameters); }
static PyObject *model_read_gradients(PyObject *op, PyObject *arg) { return exclusive(op, arg, read_gradients); }
static PyObject *model_write_parameters(PyObject *op, PyObject *arg) { return exclusive(op, arg, write_parameters); }
static PyObject *model_zero_gradients(PyObject *op, PyObject *arg) { return exclusive(op, arg, zero_gradients); }
static PyObject *model_refresh(PyObject *op, PyObject *arg) { return exclusive(op, arg, refresh); }
static PyObject *model_read_buffers(PyObject *op, PyObject *arg) { return exclusive(op, arg, read_buffers); }
static PyObject *model_write_buffers(PyObject *op, PyObject *arg) { return exclusive(op, arg, write_buffers); }

static PyObject *model_plan(PyObject *op, PyObject *args, PyObject *kwargs) {
    if (!gtpy_model_enter(op))  /* planning lays the layers out in place, then restores them */
        return NULL;
    PyObject *result = plan(op, args, kwargs);
    gtpy_model_leave(op);
    return result;
}

static PyObject *model_arena_plan(PyObject *op, PyObject *args, PyObject *kwargs) {
    if (!gtpy_model_enter(op))
        return NULL;
    PyObject *result = arena_plan(op, args, kwargs);
    gtpy_model_leave(op);
    return result;
}

static PyObject *model_live_arenas(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    if (!gtpy_model_enter(op))  /* a step in another thread may be re-planning the activations */
        return NULL;
    gt_model_arenas live;
    gt_model_live_arenas(&((ModelObject *)op)->model, &live);
    gtpy_model_leave(op);
    PyObject *d = PyDict_New();
    if (!d || put_size(d, "parameters", live.params) < 0 || put_size(d, "gradients", live.grads) < 0 ||
        put_size(d, "half_parameters", live.lowp) < 0 || put_size(d, "buffers", live.buffers) < 0 ||
        put_size(d, "activations", live.activations) < 0 ||
        put_size(d, "backend_scratch", live.backend) < 0 ||
        put_size(d, "step_scratch", live.step_scratch) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

typedef int (*model_setter)(PyObject *op, PyObject *value);

static int exclusive_set(PyObject *op, PyObject *value, model_setter put) {
    if (!gtpy_model_enter(op))
        return -1;
    int rc = put(op, value);
    gtpy_model_leave(op);
    return rc;
}

static int set_training(PyObject *op, PyObject *value, void *c) { return exclusive_set(op, value, put_training); }
static int set_grads_valid(PyObject *op, PyObject *value, void *c) { return exclusive_set(op, value, put_grads_valid); }
static int set_checkpointing(PyObject *op, PyObject *value, void *c) { return exclusive_set(op, value, put_checkpointing); }
static int set_step(PyObject *op, PyObject *value, void *c) { return exclusive_set(op, value, put_step); }
static int set_loss_chunk_rows(PyObject *op, PyObject *value, void *c) {
    return exclusive_set(op, value, put_loss_chunk_rows);
}
static int set_precision(PyObject *op, PyObject *value, void *c) { return exclusive_set(op, value, put_precision); }

static PyObject *get_busy(PyObject *op, void *c) { return PyBool_FromLong(((ModelObject *)op)->busy); }

static PyMethodDef model_methods[] = {
    {"parameter_arrays", model_parameter_arrays, METH_NOARGS, "(parameters, gradients) as flat float32 views."},
    {"parameter_layout", model_parameter_layout, METH_NOARGS, "[(offset, shape)] in state_dict order."},
    {"gradient_layout", model_gradient_layout, METH_NOARGS,
     "[offset in the gradient arena, or None when frozen] of each parameter, in state_dict order."},
    {"freezable", model_freezable, METH_NOARGS,
     "[bool] per parameter (state_dict order): True when every layer reading it can skip its gradient."},
    {"set_frozen", model_set_frozen, METH_O,
     "set_frozen(frozen)\n--\n\nFreeze parameters (one bool per parameter, state_dict order): no gradient, "
     "no weight-gradient work; the gradient arena is laid out again (kept gradients stay, new ones are zeros)."},
    {"forward", model_forward, METH_O, "Forward on x; returns a new float32 array."},
    {"plan", (PyCFunction)(void (*)(void))model_plan, METH_VARARGS | METH_KEYWORDS,
     "plan(shape, checkpointing=False, precision=None)\n--\n\nBytes of every region for an input shape."},
    {"arena_plan", (PyCFunction)(void (*)(void))model_arena_plan, METH_VARARGS | METH_KEYWORDS,
     "arena_plan(shape, checkpointing=False, precision=None)\n--\n\nBytes the allocator will reserve for "
     "each arena of the plan for an input shape."},
    {"live_arenas", model_live_arenas, METH_NOARGS, "Bytes the allocator reserves now for each arena."},
    {"init_parameters", model_init_parameters, METH_O, "Re-initialise the parameters from a seed."},
    {"refresh_half_parameters", model_refresh, METH_NOARGS, "Rebuild the half copy after writing parameters."},
    {"read_parameters", model_read_parameters, METH_NOARGS, "A float32 copy of the flat parameters (any device)."},
    {"read_gradients", model_read_gradients, METH_NOARGS, "A float32 copy of the flat gradients (any device)."},
    {"write_parameters", model_write_parameters, METH_O,
     "Write the flat parameters from a 1-d float32 array (any device); refreshes the half copy."},
    {"zero_gradients", model_zero_gradients, METH_NOARGS, "Write zeros into every gradient (any device)."},
    {"buffer_layout", model_buffer_layout, METH_NOARGS,
     "[(byte offset, shape, dtype)] of the buffers (running statistics) in state_dict order."},
    {"buffer_bytes", model_buffer_bytes, METH_NOARGS, "The buffer arena as a flat uint8 view (cpu models)."},
    {"read_buffers", model_read_buffers, METH_NOARGS, "A uint8 copy of the buffer arena (any device)."},
    {"write_buffers", model_write_buffers, METH_O, "Write the buffer arena from a 1-d uint8 array (any device)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"training", get_training, set_training, "Dropout active when True.", NULL},
    {"checkpointing", get_checkpointing, set_checkpointing,
     "False, True (units recompute their inside in backward) or \"offload\" (and keep their outputs in "
     "pinned host memory).", NULL},
    {"loss_chunk_rows", get_loss_chunk_rows, set_loss_chunk_rows,
     "Rows per block of the training step's LM head + cross-entropy (0: all rows' logits at once).", NULL},
    {"grads_valid", get_grads_valid, set_grads_valid, "False after zero_grad(set_to_none=True).", NULL},
    {"step", get_step, set_step, "Optimizer steps taken (keys dropout masks).", NULL},
    {"precision", get_precision, set_precision, "Activation precision: 'f32', 'f16' or 'bf16'.", NULL},
    {"num_parameters", get_num_parameters, NULL, "Number of f32 parameters.", NULL},
    {"num_gradients", get_num_gradients, NULL, "Number of f32 gradients: the trainable parameters' elements.", NULL},
    {"device", get_device, NULL, "Where the arenas live and the ops run: 'cpu' or 'cuda:N'.", NULL},
    {"seed", get_seed, NULL, "The initialisation and dropout seed.", NULL},
    {"plan_only", get_plan_only, NULL, "True for a model built for planning only (no arenas; it plans, never runs).", NULL},
    {"current_plan", get_current_plan, NULL, "Bytes of the allocated plan, or None.", NULL},
    {"busy", get_busy, NULL, "True while a call in some thread (e.g. a training step) holds the model.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot model_slots[] = {
    {Py_tp_new, model_new},
    {Py_tp_dealloc, model_dealloc},
    {Py_tp_methods, model_methods},
    {Py_tp_getset, model_getset},
    {Py_tp_doc, "Model(spec, seed, device='cpu', precision='f32')\n--\n\nA compiled layer tree."},
    {0, NULL},
};

static PyType_Spec model_spec = {
    .name = "gputrain._C.Model",
    .basicsize = sizeof(ModelObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = model_slots,
};

gt_model *gtpy_model_get(PyObject *module, PyObject *obj, const char *arg_name) {
    PyObject *type = PyObject_GetAttrString(module, "Model");
    int ok = type && PyObject_TypeCheck(obj, (PyTypeObject *)type);
    Py_XDECREF(type);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a gputrain._C.Model, not %.100s", arg_name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return &((ModelObject *)obj)->model;
}

static int is_model(PyObject *obj) { return PyType_GetSlot(Py_TYPE(obj), Py_tp_dealloc) == (void *)model_dealloc; }

gt_model *gtpy_model_enter(PyObject *obj) {
    ModelObject *self = (ModelObject *)obj;
    return gtpy_enter(&self->busy, "model") == 0 ? &self->model : NULL;
}

void gtpy_model_leave(PyObject *obj) { ((ModelObject *)obj)->busy = 0; }

/* The _C.Model at the end of an array's chain of bases, or NULL. */
static PyObject *owner_of(PyObject *obj) {
    while (obj && PyArray_Check(obj))
        obj = PyArray_BASE((PyArrayObject *)obj);
    return obj && is_model(obj) ? obj : NULL;
}

PyObject *gtpy_model_owners(PyObject *arrays) {
    PyObject *owners = PyList_New(0);
    for (Py_ssize_t i = 0; owners && i < PyTuple_GET_SIZE(arrays); i++) {
        PyObject *owner = owner_of(PyTuple_GET_ITEM(arrays, i));
        int known = owner ? PySequence_Contains(owners, owner) : 1;
        if (known < 0 || (!known && PyList_Append(owners, owner) < 0))
            Py_CLEAR(owners);
    }
    PyObject *tuple = owners ? PyList_AsTuple(owners) : NULL;
    Py_XDECREF(owners);
    return tuple;
}

int gtpy_models_enter(PyObject *models) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(models); i++) {
        if (!gtpy_model_enter(PyTuple_GET_ITEM(models, i))) {
            while (i-- > 0)
                gtpy_model_leave(PyTuple_GET_ITEM(models, i));
            return -1;
        }
    }
    return 0;
}

void gtpy_models_leave(PyObject *models) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(models); i++)
        gtpy_model_leave(PyTuple_GET_ITEM(models, i));
}

int gtpy_add_model(PyObject *module) {
    PyObject *type = PyType_FromModuleAndSpec(module, &model_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Model", type);
    Py_DECREF(type);
    return rc;
}
