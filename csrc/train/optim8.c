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

/* Each parameter's place (params may be NULL) and each field's element count. */
static void layout(const size_t *numels, size_t num_params, size_t min_8bit_size, gt_optim8_param *params,
                   size_t count[GT_OPTIM8_FIELD_COUNT]) {
    memset(count, 0, GT_OPTIM8_FIELD_COUNT * sizeof *count);
    for (size_t i = 0; i < num_params; i++) {
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

size_t gt_optim8_arena_bytes(const size_t *numels, size_t num_params, size_t min_8bit_size) {
    size_t count[GT_OPTIM8_FIELD_COUNT];
    layout(numels, num_params, min_8bit_size, NULL, count);
    return arena_bytes(count);
}

gt_status gt_optim8_create(gt_optim8 *out, gt_device device, const size_t *numels, size_t num_params,
                           size_t min_8bit_size) {
    memset(out, 0, sizeof *out);
    out->device = device;
    out->arena.block.device = device;
    out->params = calloc(num_params ? num_params : 1, sizeof *out->params);
    if (!out->params)
        return GT_FAIL(GT_ERR_OOM, "optimizer: out of host memory for %zu parameters", num_params);
    out->num_params = num_params;
    layout(numels, num_params, min_8bit_size, out->params, out->count);
    GT_TRY(gt_arena_create(&out->arena, device, arena_bytes(out->count)));
    const gt_device_backend *dev = gt_device_backend_of(device);
    for (int f = 0; f < GT_OPTIM8_FIELD_COUNT; f++) {
        size_t bytes = out->count[f] * field_size[f];
        if (bytes == 0)
            continue;
        GT_TRY(gt_arena_take(&out->arena, bytes, &out->field[f]));
        GT_TRY(dev->memset(device.index, out->field[f], 0, bytes));
    }
    return GT_OK;
}

void gt_optim8_destroy(gt_optim8 *state) {
    gt_arena_destroy(&state->arena);
    free(state->params);
    memset(state, 0, sizeof *state);
}

gt_status gt_optim8_update(gt_optim8 *state, const gt_device_backend *dev, gt_stream *stream, size_t index,
                           const gt_adamw8_scalars *s, float *param, const float *grad) {
    const gt_optim8_param *p = &state->params[index];
    int dev_index = state->device.index;
    if (p->numel == 0)
        return GT_OK;
    if (!p->is_8bit)
        return dev->adamw(dev_index, stream, GT_NUMERICS_EXACT, &s->a, param, grad,
                          (float *)state->field[GT_OPTIM8_EXP_AVG] + p->offset,
                          (float *)state->field[GT_OPTIM8_EXP_AVG_SQ] + p->offset, NULL, p->numel);
    return dev->adamw8bit(dev_index, stream, s, param, grad, (uint8_t *)state->field[GT_OPTIM8_STATE1] + p->offset,
                          (uint8_t *)state->field[GT_OPTIM8_STATE2] + p->offset,
                          (float *)state->field[GT_OPTIM8_ABSMAX1] + p->block,
                          (float *)state->field[GT_OPTIM8_ABSMAX2] + p->block, p->numel);
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
    char *at = (char *)state->field[field] + first * field_size[field];
    size_t bytes = n * field_size[field];
    return to_state ? gt_memcpy_blocking(state->device, at, host, bytes)
                    : gt_memcpy_blocking(state->device, host, at, bytes);
}
