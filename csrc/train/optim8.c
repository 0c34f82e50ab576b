/* The state of 8-bit AdamW (train/optim8.h): layout, allocation, the per-parameter update and
 * the copies of a parameter's state to and from the host. */
#include "train/optim8.h"

#include <stdlib.h>
#include <string.h>

#include "core/copy_stream.h"

static const char *const field_names[GT_OPTIM8_FIELD_COUNT] = {"state1", "state2", "absmax1", "absmax2",
                                                              "exp_avg", "exp_avg_sq"};

/* Bytes per element of each field. */
static const size_t field_size[GT_OPTIM8_FIELD_COUNT] = {1, 1, sizeof(float), sizeof(float), sizeof(float),
                                                         sizeof(float)};

const char *gt_optim8_field_name(gt_optim8_field field) {
    return (int)field >= 0 && field < GT_OPTIM8_FIELD_COUNT ? field_names[field] : "?";
}

static size_t blocks_of(size_t numel) { return (numel + GT_ADAMW8_BLOCK - 1) / GT_ADAMW8_BLOCK; }

/* The place of parameters [first, last) in their side (params may be NULL) and the side's
 * element count of each field. */
static void layout(const size_t *numels, size_t first, size_t last, size_t min_8bit_size, gt_optim8_param *params,
                   size_t count[GT_OPTIM8_FIELD_COUNT]) {
    memset(count, 0, GT_OPTIM8_FIELD_COUNT * sizeof *count);
    for (size_t i = first; i < last; i++) {
        size_t n = numels[i];
        int is_8bit = n >= min_8bit_size && n > 0;
        gt_optim8_param p = {n, is_8bit, is_8bit ? count[GT_OPTIM8_STATE1] : count[GT_OPTIM8_EXP_AVG],
                             count[GT_OPTIM8_ABSMAX1]};
        if (params)
            params[i] = p;
        if (is_8bit) {
            count[GT_OPTIM8_STATE1] += n, count[GT_OPTIM8_STATE2] += n;
            count[GT_OPTIM8_ABSMAX1] += blocks_of(n), count[GT_OPTIM8_ABSMAX2] += blocks_of(n);
        } else {
            count[GT_OPTIM8_EXP_AVG] += n, count[GT_OPTIM8_EXP_AVG_SQ] += n;
        }
    }
}

static size_t arena_bytes(const size_t count[GT_OPTIM8_FIELD_COUNT]) {
    size_t total = 0;
    for (int f = 0; f < GT_OPTIM8_FIELD_COUNT; f++)
        total += gt_align_up(gt_size_mul_sat(count[f], field_size[f]));
    return total;
}

size_t gt_optim8_host_first(const size_t *numels, size_t num_params, double cpu_offload_fraction) {
    double total = 0.0;
    for (size_t i = 0; i < num_params; i++)
        total += (double)numels[i];
    double target = (1.0 - cpu_offload_fraction) * total, start = 0.0, best_distance = total + 1.0;
    size_t best = num_params;
    for (size_t i = 0; i <= num_params; i++) {  /* boundary i: parameters [i, n) offloaded */
        double distance = start > target ? start - target : target - start;
        if (distance < best_distance)
            best = i, best_distance = distance;
        start += i < num_params ? (double)numels[i] : 0.0;
    }
    return cpu_offload_fraction == 0.0 ? num_params : best;
}

/* Elements per staging chunk: `chunk_numel` rounded down to whole blocks (at least one), and no
 * more than the largest offloaded parameter needs. */
static size_t staging_chunk(const size_t *numels, size_t num_params, size_t host_first, size_t chunk_numel) {
    size_t largest = 0;
    for (size_t i = host_first; i < num_params; i++)
        largest = numels[i] > largest ? numels[i] : largest;
    size_t chunk = chunk_numel / GT_ADAMW8_BLOCK * GT_ADAMW8_BLOCK, needed = blocks_of(largest) * GT_ADAMW8_BLOCK;
    chunk = chunk ? chunk : GT_ADAMW8_BLOCK;
    return needed && needed < chunk ? needed : chunk;
}

static size_t staging_bytes(size_t chunk) { return gt_size_mul_sat(chunk, 4 * sizeof(float)); }

void gt_optim8_plan(const size_t *numels, size_t num_params, size_t min_8bit_size, size_t host_first,
                    size_t chunk_numel, size_t *device_bytes, size_t *host_bytes) {
    size_t count[GT_OPTIM8_FIELD_COUNT];
    layout(numels, 0, host_first, min_8bit_size, NULL, count);
    *device_bytes = arena_bytes(count);
    layout(numels, host_first, num_params, min_8bit_size, NULL, count);
    size_t chunk = staging_chunk(numels, num_params, host_first, chunk_numel);
    *host_bytes = host_first < num_params ? gt_block_reserved_bytes(arena_bytes(count)) +
                                                gt_block_reserved_bytes(staging_bytes(chunk))
                                          : 0;
}

/* A side's arena in `device`'s pool (pinned: host memory), its fields zeroed. */
static gt_status create_side(gt_optim8_side *side, gt_device device) {
    GT_TRY(gt_arena_create(&side->arena, device, arena_bytes(side->count)));
    const gt_device_backend *dev = gt_device_backend_of(device);
    for (int f = 0; f < GT_OPTIM8_FIELD_COUNT; f++) {
        size_t bytes = side->count[f] * field_size[f];
        if (bytes == 0)
            continue;
        GT_TRY(gt_arena_take(&side->arena, bytes, &side->field[f]));
        if (dev)
            GT_TRY(dev->memset(device.index, side->field[f], 0, bytes));
        else
            memset(side->field[f], 0, bytes);
    }
    return GT_OK;
}

/* The offloaded side: its arena, the staging buffers and the copy stream. */
static gt_status create_host_side(gt_optim8 *out, gt_stream *compute_stream, const size_t *numels,
                                  size_t chunk_numel) {
    if (out->host_first == out->num_params)
        return GT_OK;
    GT_TRY(create_side(&out->on_host, gt_pinned_device()));
    out->chunk_numel = staging_chunk(numels, out->num_params, out->host_first, chunk_numel);
    GT_TRY(gt_block_alloc(gt_pinned_device(), staging_bytes(out->chunk_numel), &out->staging));
    return gt_copy_stream_create(out->device, compute_stream, &out->copies);
}

gt_status gt_optim8_create(gt_optim8 *out, gt_device device, gt_stream *compute_stream, const size_t *numels,
                           size_t num_params, size_t min_8bit_size, size_t host_first, size_t chunk_numel) {
    memset(out, 0, sizeof *out);
    out->device = device;
    out->on_device.arena.block.device = device;
    out->params = calloc(num_params ? num_params : 1, sizeof *out->params);
    if (!out->params)
        return GT_FAIL(GT_ERR_OOM, "optimizer: out of host memory for %zu parameters", num_params);
    out->num_params = num_params;
    out->host_first = host_first < num_params ? host_first : num_params;
    layout(numels, 0, out->host_first, min_8bit_size, out->params, out->on_device.count);
    layout(numels, out->host_first, num_params, min_8bit_size, out->params, out->on_host.count);
    GT_TRY(create_side(&out->on_device, device));
    return create_host_side(out, compute_stream, numels, chunk_numel);
}

void gt_optim8_destroy(gt_optim8 *state) {
    gt_copy_stream_destroy(state->copies);  /* waits for its copies */
    gt_block_free(&state->staging);
    gt_arena_destroy(&state->on_host.arena);
    gt_arena_destroy(&state->on_device.arena);
    free(state->params);
    memset(state, 0, sizeof *state);
}

static const gt_optim8_side *side_of(const gt_optim8 *state, size_t index) {
    return index < state->host_first ? &state->on_device : &state->on_host;
}

/* Elements [first, first + n) of parameter `index` (first on a block boundary): `param` and `grad`
 * point at them, in memory that `dev`'s kernels read (its queue: `stream`). */
static gt_status update_run(const gt_optim8 *state, const gt_device_backend *dev, int dev_index, gt_stream *stream,
                            size_t index, const gt_adamw8_scalars *s, float *param, const float *grad,
                            size_t first, size_t n) {
    const gt_optim8_param *p = &state->params[index];
    void *const *field = side_of(state, index)->field;
    if (!p->is_8bit)
        return dev->adamw(dev_index, stream, GT_NUMERICS_EXACT, &s->a, param, grad,
                          (float *)field[GT_OPTIM8_EXP_AVG] + p->offset + first,
                          (float *)field[GT_OPTIM8_EXP_AVG_SQ] + p->offset + first, NULL, n);
    return dev->adamw8bit(dev_index, stream, s, param, grad, (uint8_t *)field[GT_OPTIM8_STATE1] + p->offset + first,
                          (uint8_t *)field[GT_OPTIM8_STATE2] + p->offset + first,
                          (float *)field[GT_OPTIM8_ABSMAX1] + p->block + first / GT_ADAMW8_BLOCK,
                          (float *)field[GT_OPTIM8_ABSMAX2] + p->block + first / GT_ADAMW8_BLOCK, n);
}

/* Staging buffer k: (values, gradient) of chunk_numel elements each. */
static float *staged(const gt_optim8 *state, int k, int gradient) {
    return (float *)state->staging.ptr + (size_t)(2 * k + gradient) * state->chunk_numel;
}

/* Queues the copies of chunk c of a parameter (n elements) into staging buffer c % 2. */
static gt_status stage_chunk(gt_optim8 *state, const float *param, const float *grad, size_t n, size_t c,
                             uint64_t *ticket) {
    size_t first = c * state->chunk_numel, len = n - first < state->chunk_numel ? n - first : state->chunk_numel;
    int k = (int)(c % 2);
    GT_TRY(gt_copy_stream_d2h(state->copies, staged(state, k, 0), param + first, len * sizeof(float)));
    GT_TRY(gt_copy_stream_d2h(state->copies, staged(state, k, 1), grad + first, len * sizeof(float)));
    return gt_copy_stream_record(state->copies, ticket);
}

/* An offloaded parameter's update: chunk c + 1 is copied in while chunk c is updated on the cpu;
 * each updated chunk is copied back (behind it in the stream, before the buffer is filled again). */
static gt_status update_offloaded(gt_optim8 *state, size_t index, const gt_adamw8_scalars *s, float *param,
                                  const float *grad) {
    const gt_device_backend *cpu = gt_device_backend_of(gt_cpu_device());
    size_t n = state->params[index].numel, chunks = (n + state->chunk_numel - 1) / state->chunk_numel;
    uint64_t ticket[2] = {0, 0};
    GT_TRY(gt_copy_stream_after_compute(state->copies));  /* behind the backward that wrote the gradient */
    GT_TRY(stage_chunk(state, param, grad, n, 0, &ticket[0]));
    for (size_t c = 0; c < chunks; c++) {
        size_t first = c * state->chunk_numel, len = n - first < state->chunk_numel ? n - first : state->chunk_numel;
        int k = (int)(c % 2);
        if (c + 1 < chunks)
            GT_TRY(stage_chunk(state, param, grad, n, c + 1, &ticket[k ^ 1]));
        GT_TRY(gt_copy_stream_wait(state->copies, ticket[k]));
        GT_TRY(update_run(state, cpu, 0, NULL, index, s, staged(state, k, 0), staged(state, k, 1), first, len));
        GT_TRY(gt_copy_stream_h2d(state->copies, param + first, staged(state, k, 0), len * sizeof(float)));
    }
    return gt_copy_stream_before_compute(state->copies);  /* the device's next work reads the values */
}

gt_status gt_optim8_update(gt_optim8 *state, const gt_device_backend *dev, gt_stream *stream, size_t index,
                           const gt_adamw8_scalars *s, float *param, const float *grad) {
    const gt_optim8_param *p = &state->params[index];
    if (p->numel == 0)
        return GT_OK;
    if (index >= state->host_first)
        return update_offloaded(state, index, s, param, grad);
    return update_run(state, dev, state->device.index, stream, index, s, param, grad, 0, p->numel);
}

size_t gt_optim8_field_numel(const gt_optim8 *state, size_t index, gt_optim8_field field) {
    const gt_optim8_param *p = &state->params[index];
    int codes = field == GT_OPTIM8_STATE1 || field == GT_OPTIM8_STATE2;
    int absmax = field == GT_OPTIM8_ABSMAX1 || field == GT_OPTIM8_ABSMAX2;
    if (codes || absmax)
        return p->is_8bit ? (codes ? p->numel : blocks_of(p->numel)) : 0;
    return p->is_8bit ? 0 : p->numel;
}

gt_status gt_optim8_transfer(gt_optim8 *state, size_t index, gt_optim8_field field, void *host, int to_state) {
    if ((int)field < 0 || field >= GT_OPTIM8_FIELD_COUNT)
        return GT_FAIL(GT_ERR_VALUE, "field: unknown 8-bit AdamW state field %d", (int)field);
    if (index >= state->num_params)
        return GT_FAIL(GT_ERR_INDEX, "index: parameter %zu out of range (%zu parameters)", index, state->num_params);
    size_t n = gt_optim8_field_numel(state, index, field);
    if (n == 0)
        return state->params[index].numel == 0
                   ? GT_OK
                   : GT_FAIL(GT_ERR_VALUE, "%s: parameter %zu keeps %s state, without this field", field_names[field],
                             index, state->params[index].is_8bit ? "8-bit" : "32-bit");
    const gt_optim8_param *p = &state->params[index];
    size_t first = field == GT_OPTIM8_ABSMAX1 || field == GT_OPTIM8_ABSMAX2 ? p->block : p->offset;
    char *at = (char *)side_of(state, index)->field[field] + first * field_size[field];
    size_t bytes = n * field_size[field];
    gt_device where = index < state->host_first ? state->device : gt_pinned_device();
    if (state->copies)  /* the offloaded updates' copies are done */
        GT_TRY(gt_copy_stream_sync(state->copies));
    return to_state ? gt_memcpy_blocking(where, at, host, bytes) : gt_memcpy_blocking(where, host, at, bytes);
}
