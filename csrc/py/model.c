/* gputrain._C.Model: a compiled layer tree with its arenas. Built from a nested spec of tuples
 * by python/gputrain/nn/module.py; parameters and gradients are exposed as NumPy views of the
 * arenas (the views keep the Model alive). */
#include "py/gtpy.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

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

static int parse_activation(const char *name, gt_activation *out) {
    static const struct { const char *name; gt_activation act; } table[] = {
        {"relu", GT_ACT_RELU}, {"gelu", GT_ACT_GELU_ERF}, {"gelu_tanh", GT_ACT_GELU_TANH},
        {"tanh", GT_ACT_TANH}, {"silu", GT_ACT_SILU},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(name, table[i].name) == 0) {
            *out = table[i].act;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "model spec: unknown activation '%s'", name);
    return -1;
}

/* Records `layer` (Linear, LayerNorm, Embedding or Conv2d) as the first use of the next module with
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
    *layer = (gt_layer){.kind = first->kind, .in_features = first->in_features, .out_features = first->out_features,
                        .has_bias = first->has_bias, .eps = first->eps, .num_embeddings = first->num_embeddings,
                        .embedding_dim = first->embedding_dim, .groups = first->groups, .momentum = first->momentum,
                        .track_running_stats = first->track_running_stats, .tied = first};
    memcpy(layer->kernel, first->kernel, sizeof layer->kernel);
    memcpy(layer->stride, first->stride, sizeof layer->stride);
    memcpy(layer->padding, first->padding, sizeof layer->padding);
    memcpy(layer->dilation, first->dilation, sizeof layer->dilation);
    ctx->last[index]->grad_accumulates = 1;
    ctx->last[index] = layer;
    return 0;
}

/* ("tied_linear", index): a Linear without bias whose (out, in) weight is the (num, dim) table of
 * the index-th module with parameters, an Embedding (an LM head tied to the token embedding). As
 * with ("tied", index), the use before it now adds its gradients, so they are summed. */
static int parse_tied_linear(PyObject *spec, gt_layer *layer, spec_parse *ctx) {
    const char *kind = NULL;
    Py_ssize_t index = 0;
    if (!PyArg_ParseTuple(spec, "sn", &kind, &index))
        return -1;
    if (index < 0 || (size_t)index >= ctx->count || ctx->first[index]->kind != GT_LAYER_EMBEDDING)
        return spec_error("a tied Linear must name an earlier Embedding", spec);
    const gt_layer *table = ctx->first[index];
    *layer = (gt_layer){.kind = GT_LAYER_LINEAR, .in_features = table->embedding_dim,
                        .out_features = table->num_embeddings, .tied = table};
    ctx->last[index]->grad_accumulates = 1;
    ctx->last[index] = layer;
    return 0;
}

/* ("conv2d", in, out, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups, bias): every size in
 * [1, INT_MAX] (padding in [0, INT_MAX]), channels divisible by groups. */
static int parse_conv2d(PyObject *spec, gt_layer *layer, spec_parse *ctx) {
    const char *kind = NULL;
    long long in, out, groups, v[8];
    int bias = 0;
    if (!PyArg_ParseTuple(spec, "sLL(LL)(LL)(LL)(LL)Lp", &kind, &in, &out, &v[0], &v[1], &v[2], &v[3],
                          &v[4], &v[5], &v[6], &v[7], &groups, &bias))
        return -1;
    int ok = in >= 1 && out >= 1 && groups >= 1 && in <= INT_MAX && out <= INT_MAX && groups <= INT_MAX;
    for (int i = 0; i < 8; i++)
        ok = ok && v[i] >= (i == 4 || i == 5 ? 0 : 1) && v[i] <= INT_MAX;
    if (!ok || in % groups || out % groups)
        return spec_error("Conv2d needs channels divisible by groups and sizes in [1, 2**31 - 1] "
                          "(padding from 0)", spec);
    *layer = (gt_layer){.kind = GT_LAYER_CONV2D, .in_features = in, .out_features = out,
                        .groups = groups, .has_bias = bias, .kernel = {v[0], v[1]},
                        .stride = {v[2], v[3]}, .padding = {v[4], v[5]}, .dilation = {v[6], v[7]}};
    return register_params(layer, ctx);
}

/* ("batchnorm2d", num_features, eps, momentum (< 0: cumulative average), affine, track). */
static int parse_batchnorm(PyObject *spec, gt_layer *layer, spec_parse *ctx) {
    const char *kind = NULL;
    long long features = 0;
    double eps = 0.0, momentum = 0.0;
    int affine = 0, track = 0;
    if (!PyArg_ParseTuple(spec, "sLddpp", &kind, &features, &eps, &momentum, &affine, &track))
        return -1;
    if (features <= 0 || features > INT32_MAX || !(eps > 0.0) || !(momentum <= 1.0))
        return spec_error("BatchNorm2d needs num_features in [1, 2**31), a positive eps and momentum <= 1", spec);
    *layer = (gt_layer){.kind = GT_LAYER_BATCHNORM2D, .in_features = features, .eps = (float)eps,
                        .momentum = momentum < 0.0 ? -1.0 : momentum, .has_bias = affine,
                        .track_running_stats = track};
    return register_params(layer, ctx);
}

/* ("pool2d", "max" | "avg" | "adaptive_avg", (kh, kw), (sh, sw), (ph, pw), (dh, dw), ceil_mode,
 * count_include_pad); adaptive: (kh, kw) is the output size, the rest unused. */
static int parse_pool(PyObject *spec, gt_layer *layer) {
    const char *kind = NULL, *name = NULL;
    long long v[8] = {0};
    int ceil_mode = 0, include_pad = 0;
    if (!PyArg_ParseTuple(spec, "ss(LL)(LL)(LL)(LL)pp", &kind, &name, &v[0], &v[1], &v[2], &v[3], &v[4],
                          &v[5], &v[6], &v[7], &ceil_mode, &include_pad))
        return -1;
    gt_pool_kind pool = strcmp(name, "max") == 0 ? GT_POOL_MAX
                        : strcmp(name, "avg") == 0 ? GT_POOL_AVG : GT_POOL_ADAPTIVE_AVG;
    if (pool == GT_POOL_ADAPTIVE_AVG && strcmp(name, "adaptive_avg") != 0)
        return spec_error("unknown pooling", spec);
    for (int i = 0; i < 8; i++)
        if (v[i] < (i >= 4 && i < 6 ? 0 : 1) || v[i] > INT32_MAX)
            return spec_error("pooling sizes must be in [1, 2**31) (padding in [0, 2**31))", spec);
    *layer = (gt_layer){.kind = GT_LAYER_POOL2D, .ceil_mode = ceil_mode};
    gt_pool2d_args *a = &layer->pool2d;
    a->kind = pool;
    a->count_include_pad = include_pad;
    if (pool == GT_POOL_ADAPTIVE_AVG) {
        a->out_h = v[0];
        a->out_w = v[1];
        return 0;
    }
    for (int d = 0; d < 2; d++) {
        a->kernel[d] = v[d];
        a->stride[d] = v[2 + d];
        a->padding[d] = v[4 + d];
        a->dilation[d] = v[6 + d];
    }
    return 0;
}

static int parse_layer(PyObject *spec, gt_layer *layer, spec_parse *ctx) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0)))
        return spec_error("each layer must be a tuple starting with its kind", spec);
    const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    long long a = 0, b = 0;
    int flag = 0;
    double real = 0.0;
    const char *name = NULL;
    PyObject *list = NULL;
    if (strcmp(kind, "linear") == 0) {
        if (!PyArg_ParseTuple(spec, "sLLp", &kind, &a, &b, &flag))
            return -1;
        if (a <= 0 || b <= 0)
            return spec_error("Linear sizes must be positive", spec);
        *layer = (gt_layer){.kind = GT_LAYER_LINEAR, .in_features = a, .out_features = b, .has_bias = flag};
        return register_params(layer, ctx);
    } else if (strcmp(kind, "activation") == 0) {
        if (!PyArg_ParseTuple(spec, "ss", &kind, &name))
            return -1;
        *layer = (gt_layer){.kind = GT_LAYER_ACTIVATION};
        return parse_activation(name, &layer->activation);
    } else if (strcmp(kind, "dropout") == 0) {
        if (!PyArg_ParseTuple(spec, "sd", &kind, &real))
            return -1;
        if (!(real >= 0.0 && real <= 1.0))
            return spec_error("Dropout p must be in [0, 1]", spec);
        *layer = (gt_layer){.kind = GT_LAYER_DROPOUT, .p = real, .dropout_id = ctx->next_dropout_id++};
    } else if (strcmp(kind, "layernorm") == 0) {
        if (!PyArg_ParseTuple(spec, "sLdp", &kind, &a, &real, &flag))
            return -1;
        if (a <= 0 || !(real > 0.0))
            return spec_error("LayerNorm needs a positive size and eps", spec);
        *layer = (gt_layer){.kind = GT_LAYER_LAYERNORM, .in_features = a, .eps = (float)real, .has_bias = flag};
        return register_params(layer, ctx);
    } else if (strcmp(kind, "embedding") == 0) {
        if (!PyArg_ParseTuple(spec, "sLL", &kind, &a, &b))
            return -1;
        if (a <= 0 || b <= 0)
            return spec_error("Embedding sizes must be positive", spec);
        *layer = (gt_layer){.kind = GT_LAYER_EMBEDDING, .num_embeddings = a, .embedding_dim = b};
        return register_params(layer, ctx);
    } else if (strcmp(kind, "attention") == 0) {
        if (!PyArg_ParseTuple(spec, "sLLdp", &kind, &a, &b, &real, &flag))
            return -1;
        if (a <= 0 || b <= 0 || a % b != 0)
            return spec_error("Attention needs embed_dim divisible by a positive num_heads", spec);
        if (!(real >= 0.0 && real <= 1.0))
            return spec_error("Attention dropout must be in [0, 1]", spec);
        *layer = (gt_layer){.kind = GT_LAYER_ATTENTION, .in_features = a, .num_heads = b, .p = real,
                            .causal = flag, .dropout_id = ctx->next_dropout_id++};
    } else if (strcmp(kind, "tokens") == 0) {
        long long types = 0;
        if (!PyArg_ParseTuple(spec, "sLLLp", &kind, &a, &b, &types, &flag))
            return -1;
        if (a <= 0 || b <= 0 || types < 0)
            return spec_error("TokenEmbedding needs positive sizes and type_vocab_size >= 0", spec);
        *layer = (gt_layer){.kind = GT_LAYER_TOKENS, .num_embeddings = a, .embedding_dim = b,
                            .type_vocab = types, .has_mask = flag};
        return register_params(layer, ctx);
    } else if (strcmp(kind, "position") == 0) {
        if (!PyArg_ParseTuple(spec, "sLL", &kind, &a, &b))
            return -1;
        if (a <= 0 || b <= 0)
            return spec_error("PositionEmbedding sizes must be positive", spec);
        *layer = (gt_layer){.kind = GT_LAYER_POSITION, .num_embeddings = a, .embedding_dim = b};
        return register_params(layer, ctx);
    } else if (strcmp(kind, "pool") == 0) {
        if (!PyArg_ParseTuple(spec, "ss", &kind, &name))
            return -1;
        if (strcmp(name, "cls") != 0 && strcmp(name, "mean") != 0)
            return spec_error("pooling must be 'cls' or 'mean'", spec);
        *layer = (gt_layer){.kind = GT_LAYER_POOL, .pool = name[0] == 'c' ? GT_POOL_FIRST : GT_POOL_MEAN};
    } else if (strcmp(kind, "conv2d") == 0) {
        return parse_conv2d(spec, layer, ctx);
    } else if (strcmp(kind, "batchnorm2d") == 0) {
        return parse_batchnorm(spec, layer, ctx);
    } else if (strcmp(kind, "pool2d") == 0) {
        return parse_pool(spec, layer);
    } else if (strcmp(kind, "tied") == 0) {
        return parse_tied(spec, layer, ctx);
    } else if (strcmp(kind, "tied_linear") == 0) {
        return parse_tied_linear(spec, layer, ctx);
    } else if (strcmp(kind, "flatten") == 0) {
        *layer = (gt_layer){.kind = GT_LAYER_FLATTEN};
    } else if (strcmp(kind, "sequential") == 0 || strcmp(kind, "residual") == 0) {
        if (!PyArg_ParseTuple(spec, "sO", &kind, &list))
            return -1;
        int residual = kind[0] == 'r';
        *layer = (gt_layer){.kind = residual ? GT_LAYER_RESIDUAL : GT_LAYER_SEQUENTIAL};
        if (!residual)
            return parse_children(list, layer, ctx);
        layer->children = calloc(1, sizeof(gt_layer));
        if (!layer->children) {
            PyErr_NoMemory();
            return -1;
        }
        layer->num_children = 1;
        layer->children[0].kind = GT_LAYER_SEQUENTIAL;
        return parse_children(list, &layer->children[0], ctx);
    } else {
        PyErr_Format(PyExc_ValueError, "model spec: unknown layer kind '%s'", kind);
        return -1;
    }
    return 0;
}

static void model_dealloc(PyObject *op) {
    ModelObject *self = (ModelObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    if (self->created)
        gt_model_destroy(&self->model);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *model_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"spec", "seed", "device", "precision", NULL};
    PyObject *spec = NULL, *device_obj = Py_None;
    unsigned long long seed = 0;
    const char *precision = "f32";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OK|Os:Model", keywords, &spec, &seed,
                                     &device_obj, &precision))
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
    status = gt_model_create(&self->model, root, device, dt, (uint64_t)seed);
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
    size_t n = self->model.num_params;
    static float empty[1];
    float *params = n ? self->model.params.block.ptr : empty;
    float *grads = n ? self->model.grads.block.ptr : empty;
    PyObject *p = float_view(op, params, n);
    PyObject *g = p ? float_view(op, grads, n) : NULL;
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

static int append_buffer(PyObject *list, size_t offset, PyObject *shape, const char *dtype) {
    PyObject *item = shape ? Py_BuildValue("(nNs)", (Py_ssize_t)offset, shape, dtype) : NULL;
    int rc = item ? PyList_Append(list, item) : -1;
    Py_XDECREF(item);
    return rc;
}

/* (byte offset, shape, dtype) of every buffer in state_dict order (a shared module's once). */
static int collect_buffers(PyObject *list, const gt_layer *layer) {
    if (layer->tied)
        return 0;
    for (size_t i = 0; i < layer->num_children; i++)
        if (collect_buffers(list, &layer->children[i]) < 0)
            return -1;
    if (layer->kind != GT_LAYER_BATCHNORM2D || !layer->track_running_stats)
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
    while (layer->kind == GT_LAYER_SEQUENTIAL || layer->kind == GT_LAYER_RESIDUAL) {
        if (layer->num_children == 0)
            return NULL;
        layer = &layer->children[0];
    }
    return layer;
}

int gtpy_model_takes_ids(const gt_model *model) {
    const gt_layer *leaf = first_leaf(&model->root);
    return leaf && (leaf->kind == GT_LAYER_EMBEDDING || leaf->kind == GT_LAYER_TOKENS);
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
    status = gt_model_prepare(model, input);
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
    status = gt_model_prepare(&self->model, &input);  /* the shape is checked before any copy */
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
        put_size(d, "total", plan->total_bytes) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
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
        put_size(d, "gradients", plan->param_arena_bytes) < 0 ||
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
    PyObject *shape_obj = NULL;
    int checkpointing = 0;
    const char *precision = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &shape_obj, &checkpointing, &precision))
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
    return plan_with(op, args, kwargs, "O|ps:plan", plan_to_dict);
}

static PyObject *arena_plan(PyObject *op, PyObject *args, PyObject *kwargs) {
    return plan_with(op, args, kwargs, "O|ps:arena_plan", arenas_to_dict);
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

/* A new (num_params,) float32 array read by `read` (parameters or gradients). */
static PyObject *read_flat(PyObject *op, gt_status (*read)(gt_model *, float *)) {
    ModelObject *self = (ModelObject *)op;
    npy_intp dims[1] = {(npy_intp)self->model.num_params};
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
    return read_flat(op, gt_model_read_parameters);
}

static PyObject *read_gradients(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    return read_flat(op, gt_model_read_gradients);
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
static PyObject *get_checkpointing(PyObject *op, void *c) { return PyBool_FromLong(((ModelObject *)op)->model.checkpointing); }
static PyObject *get_grads_valid(PyObject *op, void *c) { return PyBool_FromLong(((ModelObject *)op)->model.grads_valid); }
static PyObject *get_step(PyObject *op, void *c) { return PyLong_FromUnsignedLong(((ModelObject *)op)->model.step); }
static PyObject *get_seed(PyObject *op, void *c) { return PyLong_FromUnsignedLongLong(((ModelObject *)op)->model.seed); }
static PyObject *get_num_parameters(PyObject *op, void *c) { return PyLong_FromSize_t(((ModelObject *)op)->model.num_params); }
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
    if (set_flag(value, "checkpointing", &flag) < 0)
        return -1;
    if (flag != self->model.checkpointing)
        self->model.planned = 0;  /* the activation layout changes */
    self->model.checkpointing = flag;
    return 0;
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
static int set_precision(PyObject *op, PyObject *value, void *c) { return exclusive_set(op, value, put_precision); }

static PyObject *get_busy(PyObject *op, void *c) { return PyBool_FromLong(((ModelObject *)op)->busy); }

static PyMethodDef model_methods[] = {
    {"parameter_arrays", model_parameter_arrays, METH_NOARGS, "(parameters, gradients) as flat float32 views."},
    {"parameter_layout", model_parameter_layout, METH_NOARGS, "[(offset, shape)] in state_dict order."},
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
    {"checkpointing", get_checkpointing, set_checkpointing, "Residual blocks recompute in backward.", NULL},
    {"grads_valid", get_grads_valid, set_grads_valid, "False after zero_grad(set_to_none=True).", NULL},
    {"step", get_step, set_step, "Optimizer steps taken (keys dropout masks).", NULL},
    {"precision", get_precision, set_precision, "Activation precision: 'f32', 'f16' or 'bf16'.", NULL},
    {"num_parameters", get_num_parameters, NULL, "Number of f32 parameters.", NULL},
    {"device", get_device, NULL, "Where the arenas live and the ops run: 'cpu' or 'cuda:N'.", NULL},
    {"seed", get_seed, NULL, "The initialisation and dropout seed.", NULL},
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
