/* Model lifetime: parameter layout (one f32 arena each for parameters and gradients, packed in
 * state_dict order; the gradient arena holds the trainable parameters only, gt_model_set_frozen;
 * in f16/bf16 mode a half copy holds all but the lookup tables that no GEMM reads, GT_KIND_LOOKUP),
 * activation planning and allocation, forward, loss and backward.
 *
 * A model runs its device's op table (core/device_backend.h: cpu, cuda:N, sim:N) on the
 * device's default stream, so its work is ordered with the optimizer's and with blocking copies;
 * its arenas are the device's memory (the host's own on the cpu, where the copies below are
 * memcpy and the queued work is done at once).
 * On a device whose memory is not the host's, parameters are initialised in a host staging
 * buffer and copied over; host inputs and targets
 * are copied (queued on the stream, so the host memory must stay valid until the caller's next
 * wait) into device pieces of the loss region that the plan reserves (whether the input is on
 * the host or, a DeviceArray, read where it is: one plan for both); the per-row losses are
 * summed in row order on the device into the step record (core/loss_mean.h), as on the CPU. */
#include "nn/model.h"

#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/cast.h"
#include "core/copy_stream.h"
#include "nn/head_loss.h"
#include "nn/init.h"
#include "nn/kind.h"
#include "nn/plan.h"
#include "nn/rdrop.h"

/* 1 when the host reads and writes the model's memory directly (the cpu's table). */
static int host_memory(const gt_model *model) { return model->device->host_memory; }

/* dst = src (bytes) between host memory and the model's memory, in the model's stream order. */
static gt_status model_memcpy(gt_model *model, void *dst, const void *src, size_t bytes) {
    return model->device->memcpy(model->backend.device.index, dst, src, bytes);
}

/* Queues dst = src (bytes) from host memory into the model's memory on its stream; `src` must
 * stay valid until the stream has run it (on the cpu it is copied at once). */
static gt_status model_copy_in(gt_model *model, void *dst, const void *src, size_t bytes) {
    return model->device->memcpy_async(model->backend.device.index, NULL, dst, src, bytes);
}

/* Gives `param` (its shape set by its kind's params hook) its element count and its offset in
 * the arenas (pass 1). The count, the running offset and their f32 bytes are checked (`layer`
 * names the layer). */
static gt_status set_param(gt_param *param, size_t *offset, const char *layer) {
    char what[160];
    snprintf(what, sizeof what, "parameters of %s", layer);
    size_t numel = 1, end = 0, bytes = 0;
    for (int i = 0; i < param->ndim; i++)
        GT_TRY(gt_size_mul(numel, (size_t)param->shape[i], what, &numel));
    GT_TRY(gt_size_add(*offset, numel, what, &end));
    GT_TRY(gt_size_mul(end, sizeof(float), what, &bytes));
    GT_TRY(gt_size_align(bytes, what, &bytes));
    param->offset = *offset;
    param->numel = numel;
    param->frozen = 0;
    *offset = end;
    return GT_OK;
}

/* The arenas that hold some parameters only, each laid out by layout_subset. */
typedef enum param_subset {
    GRADIENTS,   /* the gradient arena: the trainable parameters (gt_model_set_frozen) */
    HALF_COPY,   /* the half copy: the parameters mark_lowp marked */
} param_subset;

/* Gives every parameter in `subset` its offset in that arena (grad_offset or lowp_offset; others
 * none), in state_dict order; a later use of a module takes its first use's parameters again
 * (their flags and offsets). */
static void layout_subset(gt_layer *layer, param_subset subset, size_t *offset) {
    if (layer->tied) {
        layer->weight = layer->tied->weight;
        layer->bias = layer->tied->bias;
        return;
    }
    gt_param *params[2] = {&layer->weight, &layer->bias};
    for (int i = 0; i < 2; i++) {
        gt_param *p = params[i];
        int in_subset = subset == GRADIENTS ? p->numel && !p->frozen : p->has_lowp;
        size_t *at = subset == GRADIENTS ? &p->grad_offset : &p->lowp_offset;
        *at = in_subset ? *offset : 0;
        if (in_subset)
            *offset += p->numel;  /* at most num_params: checked by the layout */
    }
    for (size_t i = 0; i < layer->num_children; i++)
        layout_subset(&layer->children[i], subset, offset);
}

/* Gives every parameter its shape (the kind's params hook) and offset (pass 1) in state_dict
 * order; a later use of a module takes its first use's (laid out before it, in this same
 * pre-order walk). */
static gt_status layout_layer(gt_layer *layer, size_t *offset) {
    if (layer->tied) {
        layer->weight = layer->tied->weight;
        layer->bias = layer->tied->bias;
        return GT_OK;
    }
    const gt_layer_type *type = gt_layer_type_of(layer->kind);
    if (type->params) {
        char name[128];
        snprintf(name, sizeof name, "%s", type->title);
        if (type->describe)
            type->describe(layer, name, sizeof name);
        GT_TRY(type->params(layer));
        if (layer->weight.ndim)
            GT_TRY(set_param(&layer->weight, offset, name));
        if (layer->bias.ndim)
            GT_TRY(set_param(&layer->bias, offset, name));
    }
    for (size_t i = 0; i < layer->num_children; i++)
        GT_TRY(layout_layer(&layer->children[i], offset));
    return GT_OK;
}

/* Marks the parameters that have a half copy: all but the tables of lookup kinds (GT_KIND_LOOKUP,
 * read in f32), unless a later use that is no lookup reads the table as its weight (an LM head
 * tied to the tokens: the first use, earlier in this pre-order walk, is marked again). */
static void mark_lowp(gt_layer *layer) {
    int lookup = (gt_layer_type_of(layer->kind)->flags & GT_KIND_LOOKUP) != 0;
    if (layer->tied && !lookup)
        ((gt_param *)&layer->tied->weight)->has_lowp = 1;
    if (!layer->tied) {
        layer->weight.has_lowp = layer->weight.numel && !lookup;
        layer->bias.has_lowp = layer->bias.numel != 0;
    }
    for (size_t i = 0; i < layer->num_children; i++)
        mark_lowp(&layer->children[i]);
}

/* Bytes from the start of the buffer arena to a BatchNorm2d's num_batches_tracked: after its
 * (C,) running mean and variance, 8-aligned. */
static size_t count_offset(const gt_layer *layer) {
    size_t end = layer->buffer_offset + 2 * (size_t)layer->in_features * sizeof(float);
    return (end + sizeof(int64_t) - 1) / sizeof(int64_t) * sizeof(int64_t);
}

/* Gives every BatchNorm2d with running statistics its place in the buffer arena, in state_dict
 * order: running_mean (C,) f32, running_var (C,) f32, num_batches_tracked int64. A later use of
 * a module shares its first use's buffers. */
static gt_status layout_buffers(gt_layer *layer, size_t *offset) {
    if (layer->tied) {
        layer->buffer_offset = layer->tied->buffer_offset;
        return GT_OK;
    }
    for (size_t i = 0; i < layer->num_children; i++)
        GT_TRY(layout_buffers(&layer->children[i], offset));
    if (!layer->track_running_stats)
        return GT_OK;
    const char *what = "the running statistics of a BatchNorm2d";
    size_t stats = 0, end = 0;  /* end: the bytes with room for the count's alignment */
    GT_TRY(gt_size_mul((size_t)layer->in_features, 2 * sizeof(float), what, &stats));
    GT_TRY(gt_size_add(*offset, stats + 2 * sizeof(int64_t), what, &end));
    layer->buffer_offset = *offset;
    *offset = count_offset(layer) + sizeof(int64_t);
    return GT_OK;
}

/* Points the running statistics of every BatchNorm2d into the buffer arena at `base`. */
static void point_buffers(gt_layer *layer, char *base) {
    for (size_t i = 0; i < layer->num_children; i++)
        point_buffers(&layer->children[i], base);
    if (!layer->track_running_stats)
        return;
    layer->running_mean = (float *)(base + layer->buffer_offset);
    layer->running_var = layer->running_mean + layer->in_features;
    layer->num_batches_tracked = (int64_t *)(base + count_offset(layer));
}

/* Running means 0, variances 1 and counts 0 (PyTorch's reset_running_stats) in host memory. */
static void reset_buffers(const gt_layer *layer, char *host, const char *base) {
    for (size_t i = 0; i < layer->num_children; i++)
        reset_buffers(&layer->children[i], host, base);
    if (!layer->track_running_stats || layer->tied)
        return;
    size_t c = (size_t)layer->in_features;
    float *mean = (float *)(host + ((const char *)layer->running_mean - base));
    int64_t *count = (int64_t *)(host + ((const char *)layer->num_batches_tracked - base));
    for (size_t i = 0; i < c; i++) {
        mean[i] = 0.0f;
        mean[c + i] = 1.0f;
    }
    *count = 0;
}

/* Gives every layer with frozen buffers (a quantized weight) its place after the running
 * statistics, in state_dict order; a later use of a module shares its first use's. */
static gt_status layout_frozen(gt_layer *layer, size_t *offset) {
    if (layer->tied) {
        layer->frozen_offset = layer->tied->frozen_offset;
        return GT_OK;
    }
    for (size_t i = 0; i < layer->num_children; i++)
        GT_TRY(layout_frozen(&layer->children[i], offset));
    size_t bytes = gt_layer_frozen_bytes(layer);
    if (bytes == 0)
        return GT_OK;
    GT_TRY(gt_size_align(*offset, "the frozen weights of the model", offset));
    layer->frozen_offset = *offset;
    return gt_size_add(*offset, bytes, "the frozen weights of the model", offset);
}

/* Points every layer with frozen buffers into the buffer arena at `base`. */
static void point_frozen(gt_layer *layer, char *base) {
    for (size_t i = 0; i < layer->num_children; i++)
        point_frozen(&layer->children[i], base);
    layer->frozen = gt_layer_frozen_bytes(layer) ? base + layer->frozen_offset : NULL;
}

/* Bytes the model requests for its buffer arena: the buffers and, after them, the copy of the
 * running statistics a training step restores when it fails (0 without buffers). */
static size_t buffer_arena_request(const gt_model *model) {
    return gt_align_up(model->buffer_bytes) + gt_align_up(model->stat_bytes);  /* checked by the layout */
}

/* The buffer arena's layout: every buffer's offset, buffer_bytes and stat_bytes, checked. */
static gt_status layout_buffer_arena(gt_model *model) {
    GT_TRY(layout_buffers(&model->root, &model->buffer_bytes));
    model->stat_bytes = model->buffer_bytes;
    GT_TRY(layout_frozen(&model->root, &model->buffer_bytes));
    size_t request = 0;  /* buffer_arena_request's sum, checked */
    GT_TRY(gt_size_align(model->buffer_bytes, "the buffers of the model", &request));
    GT_TRY(gt_size_add(request, model->stat_bytes + GT_ALIGN, "the buffers of the model", &request));
    return gt_size_check(request, "the buffers of the model");
}

/* The buffer arena: laid out, allocated, pointed at and reset (staged on the host). */
static gt_status create_buffers(gt_model *model) {
    GT_TRY(layout_buffer_arena(model));
    GT_TRY(gt_arena_create(&model->buffers, model->backend.device, buffer_arena_request(model)));
    if (model->buffer_bytes == 0)
        return GT_OK;
    point_buffers(&model->root, model->buffers.block.ptr);
    point_frozen(&model->root, model->buffers.block.ptr);
    gt_block staging = {0};
    GT_TRY(gt_block_alloc(gt_cpu_device(), model->buffer_bytes, &staging));
    memset(staging.ptr, 0, model->buffer_bytes);
    reset_buffers(&model->root, staging.ptr, model->buffers.block.ptr);
    gt_status status = model_memcpy(model, model->buffers.block.ptr, staging.ptr, model->buffer_bytes);
    gt_block_free(&staging);
    return status;
}

static void point_param(gt_param *param, gt_model *model) {
    if (param->numel == 0)
        return;
    param->data = (float *)model->params.block.ptr + param->offset;
    param->grad = param->frozen ? NULL : (float *)model->grads.block.ptr + param->grad_offset;
    param->lowp = model->lowp_params.block.ptr && param->has_lowp
                      ? (char *)model->lowp_params.block.ptr + param->lowp_offset * gt_dtype_size(model->dt)
                      : NULL;
}

/* Points every parameter into the arenas (pass 2). */
static void point_layer(gt_layer *layer, gt_model *model) {
    point_param(&layer->weight, model);
    point_param(&layer->bias, model);
    for (size_t i = 0; i < layer->num_children; i++)
        point_layer(&layer->children[i], model);
}

/* Bytes the model requests for its parameter arena. */
static size_t param_arena_request(const gt_model *model) {
    return gt_align_up(model->num_params * sizeof(float));  /* checked by the layout */
}

/* Bytes of a gradient arena for `num_grads` f32 elements (at most num_params: checked). */
static size_t grad_arena_request(size_t num_grads) { return gt_align_up(num_grads * sizeof(float)); }

/* Bytes the model requests for its half copy in `dt` (0: no arena, in f32). */
static size_t lowp_arena_request(const gt_model *model, gt_dtype dt) {
    if (dt == GT_F32 || model->num_lowp == 0)
        return 0;
    return gt_align_up(model->num_lowp * gt_dtype_size(dt));
}

/* Bytes of the block the backend allocates for itself when the model is created. */
static size_t backend_request(const gt_model *model) { return model->device->backend_scratch_bytes; }

/* Bytes of the training step's scratch block, allocated with the model. */
static size_t step_scratch_request(const gt_model *model) {
    (void)model;
    return GT_MODEL_STEP_SCRATCH_BYTES;
}

/* Parameter elements [start, end) of the parameter arena whose half copies are adjacent too. */
typedef struct param_run {
    size_t start;       /* first element in the parameter arena */
    size_t end;         /* one past the last */
    size_t lowp_start;  /* the first's element in the half copy */
} param_run;

/* Casts `run` of the f32 master into the half copy at `lowp` in `dt` (nothing for an empty run). */
static gt_status cast_run(gt_model *model, char *lowp, gt_dtype dt, const param_run *run) {
    if (run->end == run->start)
        return GT_OK;
    return model->backend.ops->cast(&model->backend, lowp + run->lowp_start * gt_dtype_size(dt), dt,
                                    (const float *)model->params.block.ptr + run->start, GT_F32,
                                    (int64_t)(run->end - run->start));
}

/* Casts the half-copied parameters of `layer`'s tree (the trainable ones only: `trainable_only`; a
 * later use of a module: its first use's), extending `run` while they are adjacent in both arenas
 * and casting it where they are not. */
static gt_status cast_tree(gt_model *model, const gt_layer *layer, char *lowp, gt_dtype dt, int trainable_only,
                           param_run *run) {
    if (layer->tied)
        return GT_OK;
    const gt_param *params[2] = {&layer->weight, &layer->bias};
    for (int i = 0; i < 2; i++) {
        const gt_param *p = params[i];
        if (!p->has_lowp || (trainable_only && p->frozen))
            continue;
        if (p->offset != run->end || p->lowp_offset != run->lowp_start + (run->end - run->start)) {
            GT_TRY(cast_run(model, lowp, dt, run));
            *run = (param_run){p->offset, p->offset, p->lowp_offset};
        }
        run->end = p->offset + p->numel;
    }
    for (size_t i = 0; i < layer->num_children; i++)
        GT_TRY(cast_tree(model, &layer->children[i], lowp, dt, trainable_only, run));
    return GT_OK;
}

/* Fills the half copy at `lowp` (in `dt`) from the f32 master: every parameter that has one, or
 * (trainable_only: after an optimizer step, when some are frozen) the trainable ones. */
static gt_status cast_halves(gt_model *model, char *lowp, gt_dtype dt, int trainable_only) {
    param_run run = {0, 0, 0};
    GT_TRY(cast_tree(model, &model->root, lowp, dt, trainable_only, &run));
    return cast_run(model, lowp, dt, &run);
}

/* A new half-precision copy of the parameters in `dt` (an empty arena for f32), filled from the
 * f32 master; the model is not touched, so a failure leaves it as it was. */
static gt_status build_lowp(gt_model *model, gt_dtype dt, gt_arena *out) {
    memset(out, 0, sizeof *out);
    out->block.device = model->backend.device;
    if (lowp_arena_request(model, dt) == 0)
        return GT_OK;
    GT_TRY(gt_arena_create(out, model->backend.device, lowp_arena_request(model, dt)));
    gt_status status = cast_halves(model, out->block.ptr, dt, 0);
    if (status != GT_OK)
        gt_arena_destroy(out);
    return status;
}

/* Makes `fresh` (from build_lowp) the model's half copy in `dt`, freeing the previous one. */
static void swap_lowp(gt_model *model, gt_dtype dt, gt_arena *fresh) {
    gt_arena_destroy(&model->lowp_params);
    model->lowp_params = *fresh;
    model->dt = dt;
    point_layer(&model->root, model);
}

/* The op table of `device` (with its backend state, on the default stream). */
static gt_status init_backend(gt_model *model, gt_device device) {
    model->backend.ops = gt_cpu_ops();
    model->backend.device = device;
    const gt_device_backend *table = NULL;
    GT_TRY(gt_device_backend_get(device, "device", &table));
    GT_TRY(table->backend_init(&model->backend, device.index, NULL));
    model->device = table;
    return GT_OK;
}

/* What gt_model_create and gt_model_create_plan_only share: the backend and the parameters' layout. */
static gt_status layout_model(gt_model *model, gt_layer root, gt_device device, gt_dtype dt, uint64_t seed) {
    memset(model, 0, sizeof *model);
    model->root = root;
    model->dt = dt;
    model->seed = seed;
    model->training = 1;
    if (dt != GT_F32 && dt != GT_F16 && dt != GT_BF16)
        return GT_FAIL(GT_ERR_VALUE, "precision must be f32, f16 or bf16, got %s", gt_dtype_name(dt));
    GT_TRY(init_backend(model, device));
    GT_TRY(layout_layer(&model->root, &model->num_params));  /* checks every size before anything is allocated */
    layout_subset(&model->root, GRADIENTS, &model->num_grads);  /* every parameter trainable */
    mark_lowp(&model->root);
    layout_subset(&model->root, HALF_COPY, &model->num_lowp);
    return GT_OK;
}

gt_status gt_model_create_plan_only(gt_model *model, gt_layer root, gt_device device, gt_dtype dt) {
    GT_TRY(layout_model(model, root, device, dt, 0));
    model->plan_only = 1;
    return layout_buffer_arena(model);
}

gt_status gt_model_check_values(const gt_model *model, const char *what) {
    if (model->plan_only)
        return GT_FAIL(GT_ERR_VALUE, "%s: this model was built for planning only (no parameter, gradient or "
                       "buffer memory was allocated); build it again outside planning to run or read it", what);
    return GT_OK;
}

gt_status gt_model_create(gt_model *model, gt_layer root, gt_device device, gt_dtype dt,
                          uint64_t seed) {
    GT_TRY(layout_model(model, root, device, dt, seed));
    GT_TRY(gt_block_alloc(device, step_scratch_request(model), &model->step_scratch));
    GT_TRY(gt_arena_create(&model->params, device, param_arena_request(model)));
    GT_TRY(gt_arena_create(&model->grads, device, grad_arena_request(model->num_grads)));
    if (model->num_grads)
        GT_TRY(model->backend.ops->zero(&model->backend, model->grads.block.ptr,
                                        grad_arena_request(model->num_grads)));
    point_layer(&model->root, model);
    GT_TRY(create_buffers(model));
    GT_TRY(gt_model_init_params(model, seed));
    gt_arena lowp;
    GT_TRY(build_lowp(model, dt, &lowp));
    swap_lowp(model, dt, &lowp);
    return GT_OK;
}

void gt_model_destroy(gt_model *model) {
    if (model->device)  /* NULL when the creation failed before the backend */
        model->device->backend_release(&model->backend);
    gt_block_free(&model->step_scratch);
    gt_copy_stream_destroy(model->offload_copies);  /* waits for its copies */
    gt_arena_destroy(&model->offload_host);
    gt_arena_destroy(&model->activations);
    gt_arena_destroy(&model->lowp_params);
    gt_arena_destroy(&model->buffers);
    gt_arena_destroy(&model->grads);
    gt_arena_destroy(&model->params);
    gt_layer_free_children(&model->root);
    memset(model, 0, sizeof *model);
}

/* Points every parameter's `data` at its offset in `base` (a host staging copy of the arena). */
static void point_data_at(gt_layer *layer, float *base) {
    if (layer->weight.numel)
        layer->weight.data = base + layer->weight.offset;
    if (layer->bias.numel)
        layer->bias.data = base + layer->bias.offset;
    for (size_t i = 0; i < layer->num_children; i++)
        point_data_at(&layer->children[i], base);
}

/* Initialises device parameters in host memory and copies them over. */
static gt_status init_params_staged(gt_model *model, uint64_t seed) {
    size_t bytes = model->num_params * sizeof(float);
    gt_block staging = {0};
    GT_TRY(gt_block_alloc(gt_cpu_device(), bytes, &staging));
    point_data_at(&model->root, staging.ptr);
    gt_init_layer_tree(&model->root, seed);
    point_layer(&model->root, model);
    gt_status status = model_memcpy(model, model->params.block.ptr, staging.ptr, bytes);
    gt_block_free(&staging);
    return status;
}

gt_status gt_model_init_params(gt_model *model, uint64_t seed) {
    GT_TRY(gt_model_check_values(model, "initialising the parameters"));
    if (!host_memory(model) && model->num_params > 0)
        GT_TRY(init_params_staged(model, seed));
    else
        gt_init_layer_tree(&model->root, seed);
    model->seed = seed;
    return gt_model_refresh_lowp(model);
}

gt_status gt_model_refresh_lowp(gt_model *model) {
    GT_TRY(gt_model_check_values(model, "the half copy of the parameters"));
    if (!model->lowp_params.block.ptr)
        return GT_OK;
    return cast_halves(model, model->lowp_params.block.ptr, model->dt, 0);
}

gt_status gt_model_refresh_trainable_lowp(gt_model *model) {
    GT_TRY(gt_model_check_values(model, "the half copy of the parameters"));
    if (!model->lowp_params.block.ptr)
        return GT_OK;
    return cast_halves(model, model->lowp_params.block.ptr, model->dt, model->num_grads != model->num_params);
}

gt_status gt_model_set_dtype(gt_model *model, gt_dtype dt) {
    if (dt != GT_F32 && dt != GT_F16 && dt != GT_BF16)
        return GT_FAIL(GT_ERR_VALUE, "precision must be f32, f16 or bf16, got %s", gt_dtype_name(dt));
    if (dt == model->dt)
        return GT_OK;
    if (model->plan_only) {  /* nothing is allocated: the plans follow the new precision */
        model->dt = dt;
        model->planned = 0;
        return GT_OK;
    }
    gt_arena lowp;  /* built before anything changes: a failure leaves the model as it was */
    GT_TRY(build_lowp(model, dt, &lowp));
    swap_lowp(model, dt, &lowp);
    model->planned = 0;  /* the activations are re-planned in the new precision */
    gt_arena_destroy(&model->activations);
    return GT_OK;
}

/* *total += gt_align_up(bytes), checked; *piece = the aligned bytes. */
static gt_status add_piece(size_t *total, size_t bytes, const char *what, size_t *piece) {
    GT_TRY(gt_size_align(bytes, what, piece));
    return gt_size_add(*total, *piece, what, total);
}

/* Bytes of the activation arena of a plan (a part of its checked total). */
static size_t region_bytes(const gt_model_plan *plan) {
    return plan->activation_bytes + plan->recompute_bytes + plan->scratch_bytes + plan->loss_bytes +
           plan->workspace_bytes;
}

/* Bytes of the buffers after the layers' activations, in the order walk_plan lays them out. */
typedef struct gt_tail_sizes {
    size_t scratch_each[GT_MAX_NESTING];  /* one backward ping-pong buffer of each nesting level */
    size_t cast;          /* the input cast to the half format (0 in f32 or for ids) */
    size_t dout;          /* the gradient of the loss w.r.t. the output */
    size_t losses;        /* per-row losses */
    size_t input;         /* device copy of a host input (device model), else 0 */
    size_t targets;       /* device copy of host targets (device model), else 0 */
    size_t head_logits;   /* a chunked head's (chunk, classes) logits (nn/head_loss.c), else 0 */
} gt_tail_sizes;

/* The sizes after the layers (walk done) and the plan's totals, every sum and product checked. */
static gt_status size_tail(gt_model *model, const gt_tensor *input, const gt_plan_walk *walk,
                           const char *what, gt_dtype dt, gt_tail_sizes *t, gt_model_plan *plan) {
    const gt_tensor *out = &model->root.out;
    size_t bytes = 0, scratch = 0, loss = 0, rows = (size_t)gt_rows_of(out);
    for (int level = 0; level < walk->levels; level++) {
        size_t pair = 0;
        GT_TRY(gt_size_align(walk->level_scratch_bytes[level], what, &t->scratch_each[level]));
        GT_TRY(gt_size_mul(t->scratch_each[level], 2, what, &pair));
        GT_TRY(gt_size_add(scratch, pair, what, &scratch));
    }
    gt_tensor cast = *input;
    cast.dtype = dt;
    GT_TRY(gt_tensor_checked_bytes(&cast, what, &bytes));
    GT_TRY(add_piece(&loss, dt != GT_F32 && input->dtype != GT_I64 ? bytes : 0, what, &t->cast));
    gt_tensor dout = *out;  /* a chunked head: the gradient of its input; else of the output */
    if (plan->head_chunk_rows)
        dout = model->root.children[model->root.num_children - 1].in_shape;
    dout.dtype = dt;
    GT_TRY(gt_tensor_checked_bytes(&dout, what, &bytes));
    GT_TRY(add_piece(&loss, bytes, what, &t->dout));
    GT_TRY(gt_size_mul(rows, sizeof(float), what, &bytes));
    GT_TRY(add_piece(&loss, bytes, what, &t->losses));
    int copies_input = !host_memory(model);  /* room for a host input's copy, used or not by a device input */
    GT_TRY(gt_tensor_checked_bytes(input, what, &bytes));
    GT_TRY(add_piece(&loss, copies_input ? bytes : 0, what, &t->input));
    size_t labels = 0, values = 0;
    GT_TRY(gt_size_mul(rows, sizeof(int64_t), what, &labels));
    GT_TRY(gt_size_mul(gt_tensor_numel(out), sizeof(float), what, &values));
    if (plan->head_chunk_rows)  /* cross-entropy only: labels */
        values = 0;
    GT_TRY(add_piece(&loss, copies_input ? (labels > values ? labels : values) : 0, what, &t->targets));
    bytes = 0;
    if (plan->head_chunk_rows) {  /* (chunk, classes) in dt */
        GT_TRY(gt_size_mul((size_t)plan->head_chunk_rows, (size_t)out->shape[out->ndim - 1], what, &bytes));
        GT_TRY(gt_size_mul(bytes, gt_dtype_size(dt), what, &bytes));
    }
    GT_TRY(add_piece(&loss, bytes, what, &t->head_logits));
    plan->scratch_bytes = scratch;
    plan->loss_bytes = loss;
    GT_TRY(gt_size_align(walk->recompute_bytes, what, &plan->recompute_bytes));
    GT_TRY(gt_size_align(walk->workspace_bytes, what, &plan->workspace_bytes));
    plan->param_bytes = model->num_params * sizeof(float);  /* checked by the layout */
    plan->grad_bytes = model->num_grads * sizeof(float);
    plan->lowp_param_bytes = dt == GT_F32 ? 0 : model->num_lowp * gt_dtype_size(dt);
    plan->buffer_bytes = buffer_arena_request(model);
    size_t total = 0;
    const size_t parts[] = {plan->param_bytes, plan->grad_bytes, plan->lowp_param_bytes, plan->buffer_bytes,
                            plan->activation_bytes, plan->recompute_bytes, plan->scratch_bytes,
                            plan->loss_bytes, plan->workspace_bytes};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        GT_TRY(gt_size_add(total, parts[i], what, &total));
    plan->total_bytes = total;
    plan->param_arena_bytes = gt_block_reserved_bytes(param_arena_request(model));
    plan->grad_arena_bytes = gt_block_reserved_bytes(grad_arena_request(model->num_grads));
    plan->lowp_arena_bytes = gt_block_reserved_bytes(lowp_arena_request(model, dt));
    plan->buffer_arena_bytes = gt_block_reserved_bytes(buffer_arena_request(model));
    plan->activation_arena_bytes = gt_block_reserved_bytes(region_bytes(plan));
    plan->backend_arena_bytes = gt_block_reserved_bytes(backend_request(model));
    plan->step_scratch_bytes = gt_block_reserved_bytes(step_scratch_request(model));
    return GT_OK;
}

/* Points the model's buffers after the layers' activations into the arena at `base`. */
static void place_tail(gt_model *model, char *base, int levels, const gt_tail_sizes *t,
                       const gt_model_plan *plan) {
    char *cursor = base + plan->activation_bytes + plan->recompute_bytes;
    for (int level = 0; level < levels; level++)
        for (int k = 0; k < 2; k++, cursor += t->scratch_each[level])
            model->scratch[level][k] = cursor;
    model->input_cast = t->cast ? cursor : NULL;
    model->dout = cursor + t->cast;
    model->losses = (float *)(cursor + t->cast + t->dout);
    char *io = cursor + t->cast + t->dout + t->losses;
    model->input_device = t->input ? io : NULL;
    model->targets_device = t->targets ? io + t->input : NULL;
    model->head_logits = t->head_logits ? io + t->input + t->targets : NULL;
    model->backend.workspace = plan->workspace_bytes ? cursor + plan->loss_bytes : NULL;
    model->backend.workspace_bytes = plan->workspace_bytes;
}

/* gt_plan_walk.fill: a blocking copy of host bytes into the model's memory. */
static gt_status fill_model(void *ctx, void *dst, const void *src, size_t bytes) {
    return model_memcpy(ctx, dst, src, bytes);
}

/* Plans the root's layers; with `chunk` rows per block (> 0) all but the head, then the head
 * without a buffer for its logits (nn/head_loss.c), noting the block's rows in the plan. */
static gt_status plan_root(gt_model *model, gt_plan_walk *walk, const gt_tensor *in, int64_t chunk,
                           gt_plan_cursor *region, gt_model_plan *plan) {
    plan->head_chunk_rows = 0;
    if (chunk <= 0)
        return gt_plan_layer(walk, &model->root, in, -1, 0, "", region);
    model->root.num_children--;  /* the head is planned apart */
    gt_status status = gt_plan_layer(walk, &model->root, in, -1, 0, "", region);
    model->root.num_children++;
    GT_TRY(status);
    int64_t rows = gt_rows_of(&model->root.out);
    plan->head_chunk_rows = rows < chunk ? (rows > 0 ? rows : 1) : chunk;
    return gt_head_plan(walk, model, plan->head_chunk_rows);
}

/* One walk over the layers, counting (base NULL) or placing buffers; fills `plan`. Errors name
 * the input as `input_name`. A counting walk clears the layers' placed pointers (see
 * restore_placement). */
static gt_status walk_plan(gt_model *model, const gt_tensor *input, int checkpointing, gt_dtype dt,
                           int64_t chunk, const char *input_name, char *base, gt_model_plan *plan) {
    gt_tensor in = *input;  /* inside the model, features are in dt (model_input casts them) */
    in.ptr = NULL;
    if (in.dtype != GT_I64)
        in.dtype = dt;
    gt_plan_walk walk = {.ops = model->backend.ops, .dt = dt, .checkpointing = checkpointing,
                         .input = &in, .input_name = input_name};
    char what[96];
    snprintf(what, sizeof what, "%s: the buffers for a batch of this shape", input_name);
    size_t bytes = 0;
    GT_TRY(gt_tensor_checked_bytes(input, what, &bytes));
    if (base) {
        walk.recompute_base = base + plan->activation_bytes;
        walk.offload_base = model->offload_host.block.ptr;
    }
    gt_plan_cursor main_region = {base, 0};
    walk.persistent = &main_region;
    walk.fill = base ? fill_model : NULL;
    walk.fill_ctx = model;
    GT_TRY(plan_root(model, &walk, &in, chunk, &main_region, plan));
    plan->activation_bytes = main_region.used;
    plan->offload_bytes = walk.offload_bytes;
    plan->nesting_levels = walk.levels;
    gt_tail_sizes tail = {0};
    GT_TRY(size_tail(model, input, &walk, what, dt, &tail, plan));
    if (base) {
        place_tail(model, base, walk.levels, &tail, plan);
        model->key_lengths = walk.key_lengths;
        model->key_starts = walk.key_starts;
        model->last_tokens = walk.last_tokens;
        model->has_positions = walk.has_positions;
        model->positions_offset = walk.positions_offset;
        model->positions_stride = walk.positions_stride;
    }
    return GT_OK;
}

/* Places the layers' buffers of the current plan again, after a counting walk cleared them. */
static gt_status restore_placement(gt_model *model) {
    if (!model->planned)
        return GT_OK;
    gt_model_plan current = model->plan;
    return walk_plan(model, &model->planned_input, model->checkpointing, model->dt, current.head_chunk_rows,
                     "x", model->activations.block.ptr, &current);
}

void gt_model_live_arenas(const gt_model *model, gt_model_arenas *out) {
    out->params = gt_block_reserved_bytes(model->params.block.bytes);
    out->grads = gt_block_reserved_bytes(model->grads.block.bytes);
    out->lowp = gt_block_reserved_bytes(model->lowp_params.block.bytes);
    out->buffers = gt_block_reserved_bytes(model->buffers.block.bytes);
    out->activations = gt_block_reserved_bytes(model->activations.block.bytes);
    out->backend = gt_block_reserved_bytes(backend_request(model));
    out->step_scratch = gt_block_reserved_bytes(model->step_scratch.bytes);
}

/* Rows per block of the LM head that the next plan wants: 0 (whole logits) while a forward
 * returns them, else loss_chunk_rows. */
static int64_t wanted_chunk(const gt_model *model) {
    return model->full_head ? 0 : model->loss_chunk_rows;
}

gt_status gt_model_compute_plan(gt_model *model, const gt_tensor *input, int checkpointing,
                                gt_dtype dt, gt_model_plan *out) {
    memset(out, 0, sizeof *out);
    gt_status status = walk_plan(model, input, checkpointing, dt, wanted_chunk(model), "shape", NULL, out);
    GT_TRY(restore_placement(model));
    return status;
}

static int same_shape(const gt_tensor *a, const gt_tensor *b) {
    return a->ndim == b->ndim && a->dtype == b->dtype &&
           memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

/* 1 when the pool of the model's device would have room for `bytes` more once `held` (a block
 * of its own) were released. */
static int fits_after_release(const gt_model *model, const gt_arena *held, size_t bytes) {
    gt_mem_stats stats;
    if (!held->block.ptr)
        return 0;
    gt_error_state saved;  /* the refusal's message outlives this query */
    gt_error_save(GT_ERR_OOM, &saved);
    gt_status status = gt_mem_get_stats(model->backend.device, &stats);
    gt_error_restore(&saved);
    if (status != GT_OK)
        return 0;
    size_t after = stats.reserved - gt_align_up(held->block.bytes);
    return gt_align_up(bytes) <= stats.limit && after <= stats.limit - gt_align_up(bytes);
}

/* A new activation arena of `bytes` while the current one is kept, so that a failure changes
 * nothing. Only when that is refused and the pool would have room without the current arena is
 * the current one released first (the model is then unplanned until the swap or the restore). */
static gt_status allocate_activations(gt_model *model, size_t bytes, gt_arena *fresh) {
    gt_status status = gt_arena_create(fresh, model->backend.device, bytes);
    if (status != GT_ERR_OOM || !fits_after_release(model, &model->activations, bytes))
        return status;
    model->planned = 0;
    gt_arena_destroy(&model->activations);
    gt_clear_error();
    return gt_arena_create(fresh, model->backend.device, bytes);
}

/* After allocate_activations released the current arena and still failed: the arena of the
 * previous plan again, so the model is as it was (it stays unplanned, and re-plans on its next
 * forward, only if even that memory is refused). */
static void reinstate_activations(gt_model *model, const gt_model_plan *previous, int was_planned) {
    if (!was_planned || model->planned || model->activations.block.ptr)
        return;
    if (gt_arena_create(&model->activations, model->backend.device, region_bytes(previous)) != GT_OK)
        return;
    model->planned = 1;
}

/* Lays the counted `plan` for `input` out in the model's activation arena and makes it current. */
static gt_status adopt_plan(gt_model *model, const gt_tensor *input, gt_model_plan *plan) {
    model->planned = 0;
    GT_TRY(walk_plan(model, input, model->checkpointing, model->dt, plan->head_chunk_rows, "x",
                     model->activations.block.ptr, plan));
    model->plan = *plan;
    model->planned_input = *input;
    model->planned_input.ptr = NULL;
    model->planned = 1;
    return GT_OK;
}

/* The pinned host arena and the copy stream that a plan offloading `bytes` of checkpoints needs:
 * a larger arena replaces the current one (once the copies into it are done), which is kept when
 * the new one is refused. */
static gt_status prepare_offload(gt_model *model, size_t bytes) {
    if (bytes == 0)
        return GT_OK;
    if (!model->offload_copies)
        GT_TRY(gt_copy_stream_create(model->backend.device, NULL, &model->offload_copies));
    if (bytes <= model->offload_host.block.bytes)
        return GT_OK;
    gt_arena fresh = {0};
    GT_TRY(gt_arena_create(&fresh, gt_pinned_device(), bytes));
    gt_status status = gt_copy_stream_sync(model->offload_copies);
    if (status != GT_OK) {
        gt_arena_destroy(&fresh);
        return status;
    }
    gt_arena_destroy(&model->offload_host);
    model->offload_host = fresh;
    return GT_OK;
}

gt_status gt_model_prepare(gt_model *model, const gt_tensor *input) {
    GT_TRY(gt_model_check_values(model, "running the model"));
    if (model->planned && same_shape(input, &model->planned_input) &&
        (model->plan.head_chunk_rows > 0) == (wanted_chunk(model) > 0))
        return GT_OK;
    gt_model_plan plan, previous = model->plan;
    memset(&plan, 0, sizeof plan);
    int was_planned = model->planned;
    gt_arena fresh = {0};
    gt_status status = walk_plan(model, input, model->checkpointing, model->dt, wanted_chunk(model), "x", NULL, &plan);
    if (status == GT_OK)
        status = prepare_offload(model, plan.offload_bytes);
    if (status == GT_OK && model->activations.block.ptr && region_bytes(&plan) <= model->activations.block.bytes)
        return adopt_plan(model, input, &plan);  /* the arena it has holds it: nothing is allocated */
    if (status == GT_OK)
        status = allocate_activations(model, region_bytes(&plan), &fresh);
    if (status != GT_OK) {  /* keep the failure's message over any from the restore */
        gt_error_state saved;
        gt_error_save(status, &saved);
        reinstate_activations(model, &previous, was_planned);
        if (restore_placement(model) != GT_OK)
            model->planned = 0;
        return gt_error_restore(&saved);
    }
    gt_arena_destroy(&model->activations);
    model->activations = fresh;
    return adopt_plan(model, input, &plan);
}

gt_status gt_model_prepare_forward(gt_model *model, const gt_tensor *input) {
    model->full_head = 1;
    gt_status status = gt_model_prepare(model, input);
    model->full_head = 0;
    return status;
}

/* The run of a pass over the first layer's input `in` (the position ids are a channel of it). */
static gt_run make_run(gt_model *model, const void *in, uint64_t micro, int accumulate) {
    gt_run run = {.backend = &model->backend, .dt = model->dt, .training = model->training,
                  .seed = model->seed, .step = model->step, .micro_offset = micro,
                  .accumulate = accumulate, .key_lengths = model->key_lengths,
                  .key_starts = model->key_starts, .last_tokens = model->last_tokens,
                  .copies = model->offload_copies};
    if (model->has_positions) {
        run.positions = (const int64_t *)in + model->positions_offset;
        run.positions_stride = model->positions_stride;
    }
    memcpy(run.scratch, model->scratch, sizeof run.scratch);
    return run;
}

/* The device copy of `input` for a device model given a host input (planned so), else NULL. */
static void *input_copy(const gt_model *model, const gt_tensor *input) {
    return gt_device_is_accelerator(input->device) ? NULL : model->input_device;
}

/* The input as the first layer reads it: copied to the device for a device model given a host
 * input (a device input is read where it is), and cast to the half format in f16/bf16 mode. */
static gt_status model_input(gt_model *model, const gt_tensor *input, const void **out) {
    const void *source = input->ptr;
    if (input_copy(model, input)) {
        GT_TRY(model_copy_in(model, model->input_device, input->ptr, gt_tensor_bytes(input)));
        source = model->input_device;
    }
    *out = source;
    if (!model->input_cast)
        return GT_OK;
    *out = model->input_cast;
    return model->backend.ops->cast(&model->backend, model->input_cast, model->dt, source,
                                    input->dtype, (int64_t)gt_tensor_numel(input));
}

/* The input the forward on `input` fed the first layer (model_input's result). */
static const void *forward_input(const gt_model *model, const gt_tensor *input) {
    if (model->input_cast)
        return model->input_cast;
    return input_copy(model, input) ? model->input_device : input->ptr;
}

gt_status gt_model_forward_step(gt_model *model, const gt_tensor *input, uint64_t micro,
                                gt_tensor *output) {
    GT_TRY(gt_model_prepare(model, input));
    GT_TRY(gt_batchnorm2d_check_tree(&model->root, model->training));
    const void *in = NULL;
    GT_TRY(model_input(model, input, &in));
    gt_run run = make_run(model, in, micro, 0);
    if (model->plan.head_chunk_rows)  /* the head runs in the loss and the backward */
        GT_TRY(gt_head_forward_body(model, in, &run));
    else
        GT_TRY(gt_sequential_forward(&model->root, in, &run));
    *output = model->root.out;
    return GT_OK;
}

gt_status gt_model_forward(gt_model *model, const gt_tensor *input, uint64_t micro,
                           gt_tensor *output) {
    model->full_head = 1;  /* its result is the logits: planned whole */
    gt_status status = gt_model_forward_step(model, input, micro, output);
    model->full_head = 0;
    return status;
}

gt_status gt_model_set_loss_chunk_rows(gt_model *model, int64_t rows) {
    GT_TRY(gt_head_check_chunk_rows(model, rows));
    if (rows != model->loss_chunk_rows)
        model->planned = 0;  /* re-planned (in the arena it has when the plan fits) at the next forward */
    model->loss_chunk_rows = rows;
    return GT_OK;
}

gt_status gt_model_check_targets(const gt_model *model, const gt_loss *loss, const gt_tensor *targets) {
    const gt_tensor *out = &model->root.out;
    GT_TRY(gt_rdrop_check(loss, out));
    if (model->plan.head_chunk_rows && loss->kind != GT_LOSS_CROSS_ENTROPY)
        return GT_FAIL(GT_ERR_VALUE, "loss_chunk_rows: the chunked LM-head loss is a cross-entropy; set "
                       "loss_chunk_rows=0 for another loss");
    if (model->plan.head_chunk_rows && loss->rdrop_alpha > 0.0f)
        return GT_FAIL(GT_ERR_VALUE, "loss_chunk_rows: R-Drop's loss (rdrop_alpha) is not chunked; set "
                       "loss_chunk_rows=0 to train with R-Drop");
    if (loss->kind == GT_LOSS_CROSS_ENTROPY) {
        if (targets->dtype != GT_I64)
            return GT_FAIL(GT_ERR_TYPE, "y: cross-entropy targets are integer class labels, got %s",
                           gt_dtype_name(targets->dtype));
        if ((int64_t)gt_tensor_numel(targets) != gt_rows_of(out))
            return GT_FAIL(GT_ERR_VALUE, "y: expected %lld class labels (targets, one per output row), "
                           "got %zu", (long long)gt_rows_of(out), gt_tensor_numel(targets));
        return GT_OK;
    }
    if (targets->dtype != GT_F32)
        return GT_FAIL(GT_ERR_TYPE, "y: MSE targets are float32 values, got %s", gt_dtype_name(targets->dtype));
    if (gt_tensor_numel(targets) != gt_tensor_numel(out))
        return GT_FAIL(GT_ERR_VALUE, "y: expected %zu target values (the output's size), got %zu",
                       gt_tensor_numel(out), gt_tensor_numel(targets));
    return GT_OK;
}

/* Adds the mean of `values` (rows; count NULL: an MSE's mean) to *loss_sum, in the model's
 * memory, queued on its stream (the cpu's runs at once). */
static gt_status add_mean(gt_model *model, const float *values, int64_t rows, const int64_t *count,
                          double *loss_sum) {
    return model->device->loss_accumulate(model->backend.device.index, NULL, values, rows, count, loss_sum);
}

gt_status gt_model_loss(gt_model *model, const gt_loss *loss, const gt_tensor *targets,
                        const float *loss_scale, float dloss_divisor, double *loss_sum) {
    GT_TRY(gt_model_check_values(model, "computing the loss"));
    const gt_tensor *out = &model->root.out;
    GT_TRY(gt_model_check_targets(model, loss, targets));
    const gt_ops *ops = model->backend.ops;
    const void *target_data = targets->ptr;
    if (model->targets_device && !gt_device_is_accelerator(targets->device)) {
        GT_TRY(model_copy_in(model, model->targets_device, targets->ptr, gt_tensor_bytes(targets)));
        target_data = model->targets_device;
    }
    gt_step_record *results = (gt_step_record *)model->step_scratch.ptr + model->step_record;  /* the op's results */
    if (loss->kind == GT_LOSS_MSE) {
        GT_TRY(ops->mse(&model->backend, &results->mse, model->dout, out->ptr, target_data,
                        (int64_t)gt_tensor_numel(out), loss_scale, dloss_divisor, model->dt));
        return add_mean(model, &results->mse, 1, NULL, loss_sum);
    }
    int64_t rows = gt_rows_of(out), classes = out->shape[out->ndim - 1];
    if (model->plan.head_chunk_rows) {
        GT_TRY(gt_head_loss(model, loss, target_data, &results->count, loss_scale, dloss_divisor));
        return add_mean(model, model->losses, rows, &results->count, loss_sum);
    }
    if (loss->rdrop_alpha > 0.0f)
        GT_TRY(ops->softmax_xent_rdrop(&model->backend, model->losses, &results->count, model->dout, out->ptr,
                                       target_data, rows, classes, loss->label_smoothing, loss->ignore_index,
                                       loss->rdrop_alpha, loss_scale, dloss_divisor, model->dt));
    else
        GT_TRY(ops->softmax_xent(&model->backend, model->losses, &results->count, model->dout, out->ptr,
                                 target_data, rows, classes, loss->label_smoothing, loss->ignore_index,
                                 loss_scale, dloss_divisor, model->dt));
    return add_mean(model, model->losses, rows, &results->count, loss_sum);
}

gt_status gt_model_backward(gt_model *model, const gt_tensor *input, uint64_t micro,
                            int accumulate) {
    GT_TRY(gt_model_check_values(model, "running the backward"));
    if (!model->planned)
        return GT_FAIL(GT_ERR_RUNTIME, "backward called before forward");
    gt_run run = make_run(model, forward_input(model, input), micro, accumulate);
    if (model->plan.head_chunk_rows)
        return gt_head_backward(model, forward_input(model, input), &run);
    return gt_sequential_backward(&model->root, NULL, model->dout, forward_input(model, input), &run);
}

/* The end (f32 elements of the gradient arena) of the furthest parameter gradient that `layer`
 * or a layer inside it writes (shared parameters included; frozen ones have none), at least `end`. */
static size_t written_end(const gt_layer *layer, size_t end) {
    const gt_param *params[2] = {&layer->weight, &layer->bias};
    for (int i = 0; i < 2; i++)
        if (params[i]->numel && !params[i]->frozen && params[i]->grad_offset + params[i]->numel > end)
            end = params[i]->grad_offset + params[i]->numel;
    for (size_t c = 0; c < layer->num_children; c++)
        end = written_end(&layer->children[c], end);
    return end;
}

/* After top-level layer `child`'s backward: the layers before it still write below their
 * furthest gradient, so everything from there on is final. */
static gt_status top_layer_done(const gt_run *run, size_t child) {
    const gt_backward_hook *hook = run->hook_ctx;
    size_t end = 0;
    for (size_t c = 0; c < child; c++)
        end = written_end(&run->hooked->children[c], end);
    return hook->final(hook->ctx, end);
}

gt_status gt_model_backward_hooked(gt_model *model, const gt_tensor *input, uint64_t micro, int accumulate,
                                   const gt_backward_hook *hook) {
    GT_TRY(gt_model_check_values(model, "running the backward"));
    if (!model->planned)
        return GT_FAIL(GT_ERR_RUNTIME, "backward called before forward");
    gt_run run = make_run(model, forward_input(model, input), micro, accumulate);
    run.hooked = &model->root;
    run.child_done = top_layer_done;
    run.hook_ctx = (void *)hook;
    if (model->plan.head_chunk_rows)
        return gt_head_backward(model, forward_input(model, input), &run);
    return gt_sequential_backward(&model->root, NULL, model->dout, forward_input(model, input), &run);
}

gt_status gt_model_read_parameters(gt_model *model, float *host) {
    GT_TRY(gt_model_check_values(model, "reading the parameters"));
    return model_memcpy(model, host, model->params.block.ptr, model->num_params * sizeof(float));
}

gt_status gt_model_read_gradients(gt_model *model, float *host) {
    GT_TRY(gt_model_check_values(model, "reading the gradients"));
    return model_memcpy(model, host, model->grads.block.ptr, model->num_grads * sizeof(float));
}

gt_status gt_model_write_parameters(gt_model *model, const float *host) {
    GT_TRY(gt_model_check_values(model, "writing the parameters"));
    GT_TRY(model_memcpy(model, model->params.block.ptr, host, model->num_params * sizeof(float)));
    return gt_model_refresh_lowp(model);
}

gt_status gt_model_read_buffers(gt_model *model, void *host) {
    GT_TRY(gt_model_check_values(model, "reading the buffers"));
    return model_memcpy(model, host, model->buffers.block.ptr, model->buffer_bytes);
}

gt_status gt_model_write_buffers(gt_model *model, const void *host) {
    GT_TRY(gt_model_check_values(model, "writing the buffers"));
    return model_memcpy(model, model->buffers.block.ptr, host, model->buffer_bytes);
}

/* The step's copy of the buffers, after them in their arena. */
static void *buffer_backup(const gt_model *model) {
    return (char *)model->buffers.block.ptr + gt_align_up(model->buffer_bytes);
}

gt_status gt_model_save_buffers(gt_model *model) {
    GT_TRY(gt_model_check_values(model, "saving the buffers"));
    if (model->stat_bytes == 0)
        return GT_OK;
    return model->backend.ops->copy(&model->backend, buffer_backup(model), model->buffers.block.ptr,
                                    model->stat_bytes);
}

gt_status gt_model_restore_buffers(gt_model *model) {
    GT_TRY(gt_model_check_values(model, "restoring the buffers"));
    if (model->stat_bytes == 0)
        return GT_OK;
    return model->backend.ops->copy(&model->backend, model->buffers.block.ptr, buffer_backup(model),
                                    model->stat_bytes);
}

gt_status gt_model_zero_gradients(gt_model *model) {
    GT_TRY(gt_model_check_values(model, "zeroing the gradients"));
    if (model->num_grads == 0)
        return GT_OK;
    return model->backend.ops->zero(&model->backend, model->grads.block.ptr,
                                    model->num_grads * sizeof(float));
}

gt_status gt_model_read_tensor(gt_model *model, const gt_tensor *t, float *host) {
    GT_TRY(gt_model_check_values(model, "reading a tensor"));
    size_t n = gt_tensor_numel(t);
    if (host_memory(model))
        return model->backend.ops->cast(&model->backend, host, GT_F32, t->ptr, t->dtype, (int64_t)n);
    if (t->dtype == GT_F32)
        return model_memcpy(model, host, t->ptr, n * sizeof(float));
    gt_block staging = {0};  /* the half values, converted on the host (bit-exact RNE widening) */
    GT_TRY(gt_block_alloc(gt_cpu_device(), n * gt_dtype_size(t->dtype) + 1, &staging));
    gt_status status = model_memcpy(model, staging.ptr, t->ptr, n * gt_dtype_size(t->dtype));
    if (status == GT_OK)
        status = gt_cast(staging.ptr, t->dtype, host, GT_F32, n);
    gt_block_free(&staging);
    return status;
}

/* The parameters of `layer` and inside it in parameter_layout's order (a shared module's once):
 * the first `max` into out, *n counting them all. */
static void collect_params(const gt_layer *layer, const gt_param **out, size_t max, size_t *n) {
    if (layer->tied)
        return;
    const gt_param *params[2] = {&layer->weight, &layer->bias};
    for (int i = 0; i < 2; i++) {
        if (!params[i]->numel)
            continue;
        if (*n < max)
            out[*n] = params[i];
        (*n)++;
    }
    for (size_t i = 0; i < layer->num_children; i++)
        collect_params(&layer->children[i], out, max, n);
}

size_t gt_model_list_params(const gt_model *model, const gt_param **out, size_t max) {
    size_t n = 0;
    collect_params(&model->root, out, max, &n);
    return n;
}

int gt_layer_can_freeze(const gt_layer *layer) {
    return (gt_layer_type_of(layer->kind)->flags & GT_KIND_FREEZES) != 0;
}

/* Marks in refused[0:count) the parameters of `list` that a layer (any use of a module) of a kind
 * that cannot skip their gradient reads, with that kind's name in kinds[]. */
static void mark_refused(const gt_layer *layer, const gt_param **list, size_t count, const char **kinds) {
    const gt_param *params[2] = {&layer->weight, &layer->bias};
    for (int p = 0; p < 2 && !gt_layer_can_freeze(layer); p++)
        for (size_t i = 0; params[p]->numel && i < count; i++)
            if (list[i]->offset == params[p]->offset)
                kinds[i] = gt_layer_type_of(layer->kind)->title;
    for (size_t i = 0; i < layer->num_children; i++)
        mark_refused(&layer->children[i], list, count, kinds);
}

gt_status gt_model_freezable(const gt_model *model, unsigned char *out, size_t count) {
    const gt_param **list = calloc(count ? count : 1, sizeof *list);
    const char **kinds = calloc(count ? count : 1, sizeof *kinds);
    gt_status status = GT_OK;
    if (!list || !kinds)
        status = GT_FAIL(GT_ERR_OOM, "frozen: out of host memory for %zu parameters", count);
    else if (gt_model_list_params(model, list, count) != count)
        status = GT_FAIL(GT_ERR_VALUE, "frozen: expected %zu flags (one per parameter), got %zu",
                         gt_model_list_params(model, NULL, 0), count);
    if (status == GT_OK) {
        mark_refused(&model->root, list, count, kinds);
        for (size_t i = 0; i < count; i++)
            out[i] = kinds[i] == NULL;
    }
    free(kinds);
    free(list);
    return status;
}

/* Refuses a frozen flag on a parameter that a kind without GT_KIND_FREEZES reads; counts the
 * trainable elements into *num_grads. */
static gt_status check_frozen(const gt_model *model, const gt_param **list, const unsigned char *frozen,
                              size_t count, size_t *num_grads) {
    const char **kinds = calloc(count ? count : 1, sizeof *kinds);
    if (!kinds)
        return GT_FAIL(GT_ERR_OOM, "frozen: out of host memory for %zu parameters", count);
    mark_refused(&model->root, list, count, kinds);
    gt_status status = GT_OK;
    *num_grads = 0;
    for (size_t i = 0; i < count && status == GT_OK; i++) {
        if (frozen[i] && kinds[i])
            status = GT_FAIL(GT_ERR_VALUE, "frozen: parameter %zu is read by a %s, which cannot skip its gradient; "
                             "keep it trainable (requires_grad=True)", i, kinds[i]);
        if (!frozen[i])
            *num_grads += list[i]->numel;
    }
    free(kinds);
    return status;
}

/* A new zeroed gradient arena for `num_grads` elements holding the gradients of the parameters
 * trainable now and after (frozen: the new flags), at their new place. */
static gt_status build_grads(gt_model *model, const gt_param **list, const unsigned char *frozen,
                             size_t count, size_t num_grads, gt_arena *fresh) {
    GT_TRY(gt_arena_create(fresh, model->backend.device, grad_arena_request(num_grads)));
    gt_status status = num_grads ? model->backend.ops->zero(&model->backend, fresh->block.ptr,
                                                            grad_arena_request(num_grads)) : GT_OK;
    size_t at = 0;
    for (size_t i = 0; i < count && status == GT_OK; i++) {
        if (frozen[i])
            continue;
        if (!list[i]->frozen)
            status = model->backend.ops->copy(&model->backend, (float *)fresh->block.ptr + at, list[i]->grad,
                                              list[i]->numel * sizeof(float));
        at += list[i]->numel;
    }
    if (status != GT_OK)
        gt_arena_destroy(fresh);
    return status;
}

gt_status gt_model_set_frozen(gt_model *model, const unsigned char *frozen, size_t count, gt_arena *retired) {
    if (retired)
        memset(retired, 0, sizeof *retired);
    size_t n = gt_model_list_params(model, NULL, 0);
    if (count != n)
        return GT_FAIL(GT_ERR_VALUE, "frozen: expected %zu flags (one per parameter), got %zu", n, count);
    const gt_param **list = calloc(n ? n : 1, sizeof *list);
    if (!list)
        return GT_FAIL(GT_ERR_OOM, "frozen: out of host memory for %zu parameters", n);
    gt_model_list_params(model, list, n);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= (frozen[i] != 0) == (list[i]->frozen != 0);
    size_t num_grads = 0;
    gt_arena fresh = {0};
    gt_status status = check_frozen(model, list, frozen, n, &num_grads);
    if (status == GT_OK && !same && !model->plan_only)  /* a model built for planning has no arena */
        status = build_grads(model, list, frozen, n, num_grads, &fresh);
    if (status == GT_OK && !same) {  /* nothing fails from here on */
        for (size_t i = 0; i < n; i++)
            ((gt_param *)list[i])->frozen = frozen[i] != 0;
        model->num_grads = 0;
        layout_subset(&model->root, GRADIENTS, &model->num_grads);
        if (retired)
            *retired = model->grads;
        else
            gt_arena_destroy(&model->grads);
        model->grads = fresh;
        if (!model->plan_only)
            point_layer(&model->root, model);
        model->planned = 0;  /* the plan's gradient bytes change (re-planned in the arena it has) */
    }
    free(list);
    return status;
}
