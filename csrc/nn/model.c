/* Model lifetime: parameter layout (one f32 arena each for parameters and gradients, packed in
 * state_dict order), activation planning and allocation, forward, loss and backward.
 *
 * A model on cuda:N runs the CUDA op table (on the legacy default stream, so its kernels are
 * ordered with the optimizer's and with blocking copies); its arenas are device memory.
 * Parameters are initialised in a host staging buffer and copied over; host inputs and targets
 * are copied into device pieces of the loss region that the plan reserves; per-row losses are
 * read back and summed on the host in row order, as on the CPU. */
#include "nn/model.h"

#include <string.h>

#include "core/cast.h"
#include "nn/init.h"
#include "nn/plan.h"
#ifdef GT_WITH_CUDA
#include "ops_cuda.h"
#endif

enum { GT_LOSS_CHUNK = 1024 };  /* per-row losses read back from a device per copy */

static int on_cuda(const gt_model *model) { return model->backend.device.kind == GT_DEVICE_CUDA; }

/* dst = src (bytes) between host memory and the model's memory, in the model's stream order. */
static gt_status model_memcpy(gt_model *model, void *dst, const void *src, size_t bytes) {
#ifdef GT_WITH_CUDA
    if (on_cuda(model))
        return gt_cuda_backend_memcpy(&model->backend, dst, src, bytes);
#endif
    if (bytes > 0)
        memcpy(dst, src, bytes);
    return GT_OK;
}

static void set_param(gt_param *param, size_t *offset, int ndim, int64_t d0, int64_t d1) {
    param->offset = *offset;
    param->ndim = ndim;
    param->shape[0] = d0;
    param->shape[1] = ndim == 2 ? d1 : 0;
    param->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    *offset += param->numel;
}

/* Gives every parameter its offset (pass 1) in state_dict order. */
static void layout_layer(gt_layer *layer, size_t *offset) {
    switch (layer->kind) {
    case GT_LAYER_LINEAR:
        set_param(&layer->weight, offset, 2, layer->out_features, layer->in_features);
        if (layer->has_bias)
            set_param(&layer->bias, offset, 1, layer->out_features, 0);
        break;
    case GT_LAYER_LAYERNORM:
        set_param(&layer->weight, offset, 1, layer->in_features, 0);
        if (layer->has_bias)
            set_param(&layer->bias, offset, 1, layer->in_features, 0);
        break;
    case GT_LAYER_EMBEDDING:
        set_param(&layer->weight, offset, 2, layer->num_embeddings, layer->embedding_dim);
        break;
    default:
        for (size_t i = 0; i < layer->num_children; i++)
            layout_layer(&layer->children[i], offset);
    }
}

static void point_param(gt_param *param, gt_model *model) {
    if (param->numel == 0)
        return;
    param->data = (float *)model->params.block.ptr + param->offset;
    param->grad = (float *)model->grads.block.ptr + param->offset;
    param->lowp = model->lowp_params.block.ptr
                      ? (char *)model->lowp_params.block.ptr + param->offset * gt_dtype_size(model->dt)
                      : NULL;
}

/* Points every parameter into the arenas (pass 2). */
static void point_layer(gt_layer *layer, gt_model *model) {
    point_param(&layer->weight, model);
    point_param(&layer->bias, model);
    for (size_t i = 0; i < layer->num_children; i++)
        point_layer(&layer->children[i], model);
}

static gt_status create_lowp(gt_model *model) {
    gt_arena_destroy(&model->lowp_params);
    if (model->dt != GT_F32 && model->num_params > 0)
        GT_TRY(gt_arena_create(&model->lowp_params, model->backend.device,
                               gt_align_up(model->num_params * gt_dtype_size(model->dt))));
    point_layer(&model->root, model);
    return gt_model_refresh_lowp(model);
}

/* The op table of `device`: CUDA's for cuda:N (with its backend state), else the CPU's. */
static gt_status init_backend(gt_model *model, gt_device device) {
    model->backend.ops = gt_cpu_ops();
    model->backend.device = device;
    if (device.kind != GT_DEVICE_CUDA)
        return GT_OK;
#ifdef GT_WITH_CUDA
    return gt_cuda_backend_init(&model->backend, device.index, NULL);
#else
    return GT_FAIL(GT_ERR_CUDA, "device: 'cuda:%d' needs the CUDA backend, which was not compiled in",
                   device.index);
#endif
}

gt_status gt_model_create(gt_model *model, gt_layer root, gt_device device, gt_dtype dt,
                          uint64_t seed) {
    memset(model, 0, sizeof *model);
    model->root = root;
    model->dt = dt;
    model->seed = seed;
    model->training = 1;
    if (dt != GT_F32 && dt != GT_F16 && dt != GT_BF16)
        return GT_FAIL(GT_ERR_VALUE, "precision must be f32, f16 or bf16, got %s", gt_dtype_name(dt));
    GT_TRY(init_backend(model, device));
    layout_layer(&model->root, &model->num_params);
    size_t bytes = gt_align_up(model->num_params * sizeof(float));
    GT_TRY(gt_arena_create(&model->params, device, model->num_params ? bytes : 0));
    GT_TRY(gt_arena_create(&model->grads, device, model->num_params ? bytes : 0));
    if (model->num_params)
        GT_TRY(model->backend.ops->zero(&model->backend, model->grads.block.ptr, bytes));
    point_layer(&model->root, model);
    return gt_model_init_params(model, seed);
}

void gt_model_destroy(gt_model *model) {
#ifdef GT_WITH_CUDA
    gt_cuda_backend_release(&model->backend);
#endif
    gt_arena_destroy(&model->activations);
    gt_arena_destroy(&model->lowp_params);
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
    model->seed = seed;
    if (on_cuda(model) && model->num_params > 0)
        GT_TRY(init_params_staged(model, seed));
    else
        gt_init_layer_tree(&model->root, seed);
    return create_lowp(model);
}

gt_status gt_model_refresh_lowp(gt_model *model) {
    if (!model->lowp_params.block.ptr)
        return GT_OK;
    return model->backend.ops->cast(&model->backend, model->lowp_params.block.ptr, model->dt,
                                    model->params.block.ptr, GT_F32, (int64_t)model->num_params);
}

gt_status gt_model_set_dtype(gt_model *model, gt_dtype dt) {
    if (dt != GT_F32 && dt != GT_F16 && dt != GT_BF16)
        return GT_FAIL(GT_ERR_VALUE, "precision must be f32, f16 or bf16, got %s", gt_dtype_name(dt));
    if (dt == model->dt)
        return GT_OK;
    model->dt = dt;
    model->planned = 0;
    gt_arena_destroy(&model->activations);
    return create_lowp(model);
}

/* One walk over the layers, counting (base NULL) or placing buffers; fills `plan`. */
static gt_status walk_plan(gt_model *model, const gt_tensor *input, int checkpointing,
                           gt_dtype dt, char *base, gt_model_plan *plan) {
    gt_plan_walk walk = {.ops = model->backend.ops, .dt = dt, .checkpointing = checkpointing};
    if (base)
        walk.recompute_base = base + plan->activation_bytes;
    gt_plan_cursor main_region = {base, 0};
    gt_tensor in = *input;
    in.ptr = NULL;
    GT_TRY(gt_plan_layer(&walk, &model->root, &in, -1, 0, &main_region));
    const gt_tensor *out = &model->root.out;
    plan->activation_bytes = main_region.used;
    plan->recompute_bytes = gt_align_up(walk.recompute_bytes);
    plan->nesting_levels = walk.levels;
    size_t scratch_each = gt_align_up(walk.max_activation_bytes);
    plan->scratch_bytes = scratch_each * 2 * (size_t)walk.levels;
    size_t cast_bytes = dt != GT_F32 && input->dtype != GT_I64 ? gt_align_up(gt_tensor_numel(input) * gt_dtype_size(dt)) : 0;
    size_t dout_bytes = gt_align_up(gt_tensor_bytes(out));
    size_t loss_rows = (size_t)gt_rows_of(out);
    size_t losses_bytes = gt_align_up(loss_rows * sizeof(float));
    int copies_input = on_cuda(model) && input->device.kind != GT_DEVICE_CUDA;
    size_t input_bytes = copies_input ? gt_align_up(gt_tensor_bytes(input)) : 0;
    size_t label_bytes = loss_rows * sizeof(int64_t), value_bytes = gt_tensor_numel(out) * sizeof(float);
    size_t targets_bytes = copies_input ? gt_align_up(label_bytes > value_bytes ? label_bytes : value_bytes) : 0;
    plan->loss_bytes = cast_bytes + dout_bytes + losses_bytes + input_bytes + targets_bytes;
    plan->workspace_bytes = gt_align_up(walk.workspace_bytes);
    plan->param_bytes = model->num_params * sizeof(float);
    plan->grad_bytes = plan->param_bytes;
    plan->lowp_param_bytes = dt == GT_F32 ? 0 : model->num_params * gt_dtype_size(dt);
    plan->total_bytes = plan->param_bytes + plan->grad_bytes + plan->lowp_param_bytes +
                        plan->activation_bytes + plan->recompute_bytes + plan->scratch_bytes +
                        plan->loss_bytes + plan->workspace_bytes;
    if (!base)
        return GT_OK;
    char *cursor = base + plan->activation_bytes + plan->recompute_bytes;
    for (int level = 0; level < walk.levels; level++)
        for (int k = 0; k < 2; k++, cursor += scratch_each)
            model->scratch[level][k] = cursor;
    model->input_cast = cast_bytes ? cursor : NULL;
    model->dout = cursor + cast_bytes;
    model->losses = (float *)(cursor + cast_bytes + dout_bytes);
    char *io = cursor + cast_bytes + dout_bytes + losses_bytes;
    model->input_device = input_bytes ? io : NULL;
    model->targets_device = targets_bytes ? io + input_bytes : NULL;
    model->backend.workspace = plan->workspace_bytes ? cursor + plan->loss_bytes : NULL;
    model->backend.workspace_bytes = plan->workspace_bytes;
    return GT_OK;
}

static size_t region_bytes(const gt_model_plan *plan) {
    return plan->activation_bytes + plan->recompute_bytes + plan->scratch_bytes + plan->loss_bytes +
           plan->workspace_bytes;
}

gt_status gt_model_compute_plan(gt_model *model, const gt_tensor *input, int checkpointing,
                                gt_dtype dt, gt_model_plan *out) {
    memset(out, 0, sizeof *out);
    gt_status status = walk_plan(model, input, checkpointing, dt, NULL, out);
    if (model->planned) {  /* the counting walk cleared the placed pointers: place them again */
        gt_model_plan current = model->plan;
        GT_TRY(walk_plan(model, &model->planned_input, model->checkpointing, model->dt,
                         model->activations.block.ptr, &current));
    }
    return status;
}

static int same_shape(const gt_tensor *a, const gt_tensor *b) {
    return a->ndim == b->ndim && a->dtype == b->dtype &&
           memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

gt_status gt_model_prepare(gt_model *model, const gt_tensor *input) {
    if (model->planned && same_shape(input, &model->planned_input))
        return GT_OK;
    model->planned = 0;
    gt_arena_destroy(&model->activations);
    gt_model_plan plan;
    memset(&plan, 0, sizeof plan);
    GT_TRY(walk_plan(model, input, model->checkpointing, model->dt, NULL, &plan));
    GT_TRY(gt_arena_create(&model->activations, model->backend.device, region_bytes(&plan)));
    char *base = model->activations.block.ptr;
    GT_TRY(walk_plan(model, input, model->checkpointing, model->dt, base, &plan));
    model->plan = plan;
    model->planned_input = *input;
    model->planned_input.ptr = NULL;
    model->planned = 1;
    return GT_OK;
}

static gt_run make_run(gt_model *model, uint64_t micro, int accumulate) {
    gt_run run = {.backend = &model->backend, .dt = model->dt, .training = model->training,
                  .seed = model->seed, .step = model->step, .micro_offset = micro,
                  .accumulate = accumulate};
    memcpy(run.scratch, model->scratch, sizeof run.scratch);
    return run;
}

/* The input as the first layer reads it: copied to the device for a CUDA model given a host
 * input, and cast to the half format in f16/bf16 mode. */
static gt_status model_input(gt_model *model, const gt_tensor *input, const void **out) {
    const void *source = input->ptr;
    if (model->input_device) {
        GT_TRY(model_memcpy(model, model->input_device, input->ptr, gt_tensor_bytes(input)));
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
    return model->input_device ? model->input_device : input->ptr;
}

gt_status gt_model_forward(gt_model *model, const gt_tensor *input, uint64_t micro,
                           gt_tensor *output) {
    GT_TRY(gt_model_prepare(model, input));
    const void *in = NULL;
    GT_TRY(model_input(model, input, &in));
    gt_run run = make_run(model, micro, 0);
    GT_TRY(gt_sequential_forward(&model->root, in, &run));
    *output = model->root.out;
    return GT_OK;
}

static gt_status check_targets(const gt_tensor *out, const gt_loss *loss, const gt_tensor *targets) {
    if (loss->kind == GT_LOSS_CROSS_ENTROPY) {
        if (targets->dtype != GT_I64)
            return GT_FAIL(GT_ERR_TYPE, "targets: cross-entropy needs integer class labels");
        if ((int64_t)gt_tensor_numel(targets) != gt_rows_of(out))
            return GT_FAIL(GT_ERR_VALUE, "targets: expected %lld labels, got %zu",
                           (long long)gt_rows_of(out), gt_tensor_numel(targets));
        return GT_OK;
    }
    if (targets->dtype != GT_F32)
        return GT_FAIL(GT_ERR_TYPE, "targets: MSE needs float32 targets");
    if (gt_tensor_numel(targets) != gt_tensor_numel(out))
        return GT_FAIL(GT_ERR_VALUE, "targets: expected %zu values (the output's size), got %zu",
                       gt_tensor_numel(out), gt_tensor_numel(targets));
    return GT_OK;
}

/* The sum of the first `rows` per-row losses in row order (read back in chunks from a device). */
static gt_status sum_losses(gt_model *model, int64_t rows, double *out) {
    double sum = 0.0;
    if (!on_cuda(model)) {
        for (int64_t r = 0; r < rows; r++)
            sum += model->losses[r];
        *out = sum;
        return GT_OK;
    }
    float chunk[GT_LOSS_CHUNK];
    for (int64_t r = 0; r < rows; r += GT_LOSS_CHUNK) {
        size_t len = rows - r < GT_LOSS_CHUNK ? (size_t)(rows - r) : GT_LOSS_CHUNK;
        GT_TRY(model_memcpy(model, chunk, model->losses + r, len * sizeof(float)));
        for (size_t i = 0; i < len; i++)
            sum += chunk[i];
    }
    *out = sum;
    return GT_OK;
}

gt_status gt_model_loss(gt_model *model, const gt_loss *loss, const gt_tensor *targets,
                        float dloss_scale, int want_grad, double *loss_value, int64_t *count) {
    const gt_tensor *out = &model->root.out;
    GT_TRY(check_targets(out, loss, targets));
    const gt_ops *ops = model->backend.ops;
    void *dout = want_grad ? model->dout : NULL;
    const void *target_data = targets->ptr;
    if (model->targets_device && targets->device.kind != GT_DEVICE_CUDA) {
        GT_TRY(model_memcpy(model, model->targets_device, targets->ptr, gt_tensor_bytes(targets)));
        target_data = model->targets_device;
    }
    if (loss->kind == GT_LOSS_MSE) {
        float value = 0.0f;
        GT_TRY(ops->mse(&model->backend, &value, dout, out->ptr, target_data,
                        (int64_t)gt_tensor_numel(out), dloss_scale, model->dt));
        *loss_value = value;
        *count = (int64_t)gt_tensor_numel(out);
        return GT_OK;
    }
    int64_t rows = gt_rows_of(out), classes = out->shape[out->ndim - 1];
    GT_TRY(ops->softmax_xent(&model->backend, model->losses, count, dout, out->ptr, target_data,
                             rows, classes, loss->label_smoothing, loss->ignore_index, dloss_scale,
                             model->dt));
    double sum = 0.0;
    GT_TRY(sum_losses(model, rows, &sum));
    *loss_value = *count > 0 ? sum / (double)*count : 0.0;
    return GT_OK;
}

gt_status gt_model_backward(gt_model *model, const gt_tensor *input, uint64_t micro,
                            int accumulate) {
    if (!model->planned)
        return GT_FAIL(GT_ERR_RUNTIME, "backward called before forward");
    gt_run run = make_run(model, micro, accumulate);
    return gt_sequential_backward(&model->root, NULL, model->dout, forward_input(model, input), &run);
}

gt_status gt_model_read_parameters(gt_model *model, float *host) {
    return model_memcpy(model, host, model->params.block.ptr, model->num_params * sizeof(float));
}

gt_status gt_model_read_gradients(gt_model *model, float *host) {
    return model_memcpy(model, host, model->grads.block.ptr, model->num_params * sizeof(float));
}

gt_status gt_model_write_parameters(gt_model *model, const float *host) {
    GT_TRY(model_memcpy(model, model->params.block.ptr, host, model->num_params * sizeof(float)));
    return gt_model_refresh_lowp(model);
}

gt_status gt_model_zero_gradients(gt_model *model) {
    if (model->num_params == 0)
        return GT_OK;
    return model->backend.ops->zero(&model->backend, model->grads.block.ptr,
                                    model->num_params * sizeof(float));
}

gt_status gt_model_read_tensor(gt_model *model, const gt_tensor *t, float *host) {
    size_t n = gt_tensor_numel(t);
    if (!on_cuda(model))
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
