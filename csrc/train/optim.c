#include "train/optim.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clip_rules.h"
#include "core/copy_stream.h"
#include "train/grad_norm.h"
#include "train/offload.h"
#include "train/optim8.h"
#include "train/optim_cpu.h"


enum {
    PARALLEL_MIN = 32768,          /* elements below which a pass stays on one thread */
    SHARE_ALIGN = 16,              /* thread shares start on multiples of this many elements */
    DEFAULT_CHUNK = 1 << 20,       /* offload staging chunk, elements */
};

typedef struct optim_param {
    float *param;      /* (numel,) on the device */
    float *grad;       /* (numel,) on the device; NULL: skipped by steps */
    size_t numel;      /* elements */
    size_t group;      /* hyperparameter group index */
    size_t offset;     /* first element in the flat state space (params packed in order) */
    int64_t step;      /* updates applied so far */
} optim_param;

/* A maximal run of parameters updated together this step. */
typedef struct optim_segment {
    float *param;            /* (numel,) device parameters */
    const float *grad;       /* (numel,) device gradients */
    size_t offset;           /* flat element of param[0] */
    size_t numel;            /* elements */
    size_t group;            /* hyperparameter group of its parameters */
    union {
        gt_adamw_scalars adamw;  /* AdamW constants for this run's step count */
        gt_sgd_scalars sgd;      /* SGD constants for this run */
    } scalars;
} optim_segment;

struct gt_optimizer {
    gt_optimizer_config config;       /* kind, numerics, device, offload settings */
    const gt_device_backend *dev;     /* the device's interface (the cpu's too) */
    gt_optim_hparams *groups;         /* (num_groups,) hyperparameters */
    size_t num_groups;                /* groups */
    optim_param *params;              /* (num_params,) */
    size_t num_params;                /* parameters */
    size_t total_numel;               /* elements of all parameters */
    size_t device_numel;              /* flat elements [0, device_numel) have device state */
    int has_slot[GT_SLOT_COUNT];      /* which state slots exist */
    gt_arena device_arena;            /* the device share of the state */
    float *slot[GT_SLOT_COUNT];       /* (device_numel,) each, in device_arena; NULL if absent */
    gt_offload offload;               /* the host share; offload.numel == 0 when f = 0 */
    optim_segment *segments;          /* (2 * num_params + 2,) scratch: device runs, then host runs */
    gt_offload_span *spans;           /* (num_params + 1,) scratch: host runs for the offload */
    int64_t num_steps;                /* steps that updated at least one parameter */
    void *table;                      /* accelerator: (GT_OPTIM_RING, num_groups) scalars of deferred updates */
    uint64_t *update_count;           /* accelerator: deferred updates applied (device) */
    char *table_host;                 /* (GT_OPTIM_RING,) host sources of the table's copies, one per step in flight */
    gt_block results;                 /* pinned (GT_OPTIM_RING, GT_OPTIM_RESULT_BYTES): deferred step s's result
                                         in row s % GT_OPTIM_RING, once done[s % GT_OPTIM_RING] completed */
    size_t result_bytes[GT_OPTIM_RING]; /* bytes of each row's result (0: none) */
    gt_event *done[GT_OPTIM_RING];    /* recorded after deferred step s (its update and its result's copy) */
    int64_t *group_step;              /* (num_groups,) scratch: the step count of each group's parameters */
    uint64_t resolved_updates;        /* deferred updates known to have been applied */
    uint64_t deferred_calls;          /* deferred steps queued so far */
    size_t pending;                   /* deferred steps not yet resolved */
    gt_optim8 *state8;                /* AdamW8bit: its state (train/optim8.h); NULL for the other kinds */
};

/* ------------------------------------------------------------ validation ---------- */

gt_status gt_optim_hparams_check(gt_optim_kind kind, const gt_optim_hparams *hp) {
    if (!(hp->lr >= 0.0 && isfinite(hp->lr)))
        return GT_FAIL(GT_ERR_VALUE, "lr: invalid learning rate %g (must be finite and >= 0)", hp->lr);
    if (!(hp->weight_decay >= 0.0 && isfinite(hp->weight_decay)))
        return GT_FAIL(GT_ERR_VALUE, "weight_decay: invalid value %g (must be finite and >= 0)",
                       hp->weight_decay);
    if (kind == GT_OPTIM_ADAMW8BIT && hp->amsgrad)
        return GT_FAIL(GT_ERR_VALUE, "amsgrad: 8-bit AdamW has no AMSGrad (bitsandbytes' AdamW8bit neither)");
    if (kind == GT_OPTIM_ADAMW || kind == GT_OPTIM_ADAMW8BIT) {
        if (!(hp->beta1 >= 0.0 && hp->beta1 < 1.0))
            return GT_FAIL(GT_ERR_VALUE, "betas[0]: invalid beta %g (must be in [0, 1))", hp->beta1);
        if (!(hp->beta2 >= 0.0 && hp->beta2 < 1.0))
            return GT_FAIL(GT_ERR_VALUE, "betas[1]: invalid beta %g (must be in [0, 1))", hp->beta2);
        if (!(hp->eps > 0.0 && isfinite(hp->eps)))
            return GT_FAIL(GT_ERR_VALUE, "eps: invalid epsilon %g (must be finite and > 0)", hp->eps);
        return GT_OK;
    }
    if (kind != GT_OPTIM_SGD)
        return GT_FAIL(GT_ERR_VALUE, "kind: unknown optimizer kind %d", (int)kind);
    if (!(hp->momentum >= 0.0 && isfinite(hp->momentum)))
        return GT_FAIL(GT_ERR_VALUE, "momentum: invalid value %g (must be finite and >= 0)", hp->momentum);
    if (!isfinite(hp->dampening))
        return GT_FAIL(GT_ERR_VALUE, "dampening: invalid value %g (must be finite)", hp->dampening);
    if (hp->nesterov && (hp->momentum <= 0.0 || hp->dampening != 0.0))
        return GT_FAIL(GT_ERR_VALUE, "nesterov: Nesterov momentum requires a momentum and zero dampening");
    return GT_OK;
}

/* What 8-bit AdamW does not take: its state is unsharded. */
static gt_status check_config8(const gt_optimizer_config *c) {
    if (c->kind != GT_OPTIM_ADAMW8BIT)
        return GT_OK;
    if (c->zero_size > 1)
        return GT_FAIL(GT_ERR_VALUE, "zero_size: 8-bit AdamW's state cannot be sharded with ZeRO-1");
    return GT_OK;
}

static gt_status check_config(const gt_optimizer_config *c) {
    if (c->kind != GT_OPTIM_ADAMW && c->kind != GT_OPTIM_SGD && c->kind != GT_OPTIM_ADAMW8BIT)
        return GT_FAIL(GT_ERR_VALUE, "kind: unknown optimizer kind %d", (int)c->kind);
    GT_TRY(check_config8(c));
    if (c->numerics != GT_NUMERICS_EXACT && c->numerics != GT_NUMERICS_FAST)
        return GT_FAIL(GT_ERR_VALUE, "numerics: unknown numerics %d", (int)c->numerics);
    if (!(c->cpu_offload_fraction >= 0.0 && c->cpu_offload_fraction <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "cpu_offload_fraction: must be in [0, 1], got %g",
                       c->cpu_offload_fraction);
    if (c->zero_size < 0 || (c->zero_size > 0 && (c->zero_rank < 0 || c->zero_rank >= c->zero_size)))
        return GT_FAIL(GT_ERR_VALUE, "zero_rank: must be in [0, %d) ranks, got %d", c->zero_size, c->zero_rank);
    if (c->device.kind == GT_DEVICE_PINNED)
        return GT_FAIL(GT_ERR_VALUE, "device: parameters must be on 'cpu' or 'cuda:N', not 'pinned'");
    const gt_device_backend *table = NULL;
    GT_TRY(gt_device_backend_get(c->device, "device", &table));
    if (c->device.index >= table->device_count()) {
        char name[32];
        gt_device_name(c->device, name, sizeof name);
        return GT_FAIL(GT_ERR_RUNTIME, "device: '%s' is not available", name);
    }
    return GT_OK;
}

static gt_status check_params(const gt_optim_param_desc *params, size_t num_params, size_t num_groups) {
    for (size_t i = 0; i < num_params; i++) {
        if (params[i].group >= num_groups)
            return GT_FAIL(GT_ERR_INDEX, "params[%zu]: group %zu out of range (%zu groups)", i,
                           params[i].group, num_groups);
        if (params[i].numel > 0 && !params[i].param)
            return GT_FAIL(GT_ERR_VALUE, "params[%zu]: NULL parameter pointer", i);
    }
    return GT_OK;
}

/* ------------------------------------------------------------ creation ------------ */

/* Which state slots an optimizer of `kind` with these groups keeps (has_slot zeroed first). */
static void slots_of(gt_optim_kind kind, const gt_optim_hparams *groups, size_t num_groups,
                     int has_slot[GT_SLOT_COUNT]) {
    memset(has_slot, 0, GT_SLOT_COUNT * sizeof *has_slot);
    for (size_t g = 0; g < num_groups && kind != GT_OPTIM_ADAMW8BIT; g++) {  /* 8-bit: train/optim8.h */
        if (kind == GT_OPTIM_ADAMW) {
            has_slot[GT_SLOT_EXP_AVG] = has_slot[GT_SLOT_EXP_AVG_SQ] = 1;
            has_slot[GT_SLOT_MAX_EXP_AVG_SQ] |= groups[g].amsgrad != 0;
        } else {
            has_slot[GT_SLOT_MOMENTUM] |= groups[g].momentum != 0.0;
        }
    }
}

static size_t count_slots(const int has_slot[GT_SLOT_COUNT]) {
    size_t count = 0;
    for (int s = 0; s < GT_SLOT_COUNT; s++)
        count += has_slot[s] != 0;
    return count;
}

static size_t slot_count(const gt_optimizer *opt) { return count_slots(opt->has_slot); }

/* Elements of the flat space whose state is on the device: all but round(f * total). 8-bit AdamW
 * offloads whole parameters instead (train/optim8.h): its flat space is all on the device. */
static size_t device_numel_of(const gt_optimizer_config *config, size_t total_numel) {
    if (config->kind == GT_OPTIM_ADAMW8BIT)
        return total_numel;
    double host = floor(config->cpu_offload_fraction * (double)total_numel + 0.5);
    size_t host_numel = host >= (double)total_numel ? total_numel : (size_t)host;
    return total_numel - host_numel;
}

/* Bytes of the device arena: one (device_numel,) f32 piece per slot. */
static size_t device_arena_request(size_t device_numel, size_t num_slots) {
    return gt_align_up(device_numel * sizeof(float)) * num_slots;
}

/* Bytes of one deferred update table: (GT_OPTIM_RING, num_groups) scalars of either kind. */
static size_t table_bytes(size_t num_groups) {
    size_t scalars = sizeof(gt_adamw_scalars) > sizeof(gt_sgd_scalars) ? sizeof(gt_adamw_scalars)
                                                                        : sizeof(gt_sgd_scalars);
    return GT_OPTIM_RING * num_groups * scalars;
}

/* 1 for an optimizer that may run deferred steps: on an accelerator, its whole state on the device
 * (no offload) and not a ZeRO-1 shard (deferred steps take no collectives). */
static int may_defer(const gt_optimizer_config *config) {
    return config->kind != GT_OPTIM_ADAMW8BIT &&  /* 8-bit AdamW: no update table (train/optim8.h) */
           gt_device_is_accelerator(config->device) && config->cpu_offload_fraction == 0.0 && config->zero_size == 0;
}

/* Bytes the arena of an optimizer that may defer adds: the update count, then the table. */
static size_t table_request(const gt_optimizer_config *config, size_t num_groups) {
    if (!may_defer(config))
        return 0;
    return gt_align_up(sizeof(uint64_t)) + gt_align_up(table_bytes(num_groups));
}

/* Pinned bytes of an optimizer that may defer: the ring of its steps' results. */
static size_t results_request(const gt_optimizer_config *config) {
    return may_defer(config) ? GT_OPTIM_RING * GT_OPTIM_RESULT_BYTES : 0;
}

/* Elements per offload staging chunk that the configuration asks for. */
static size_t chunk_request(const gt_optimizer_config *config) {
    return config->offload_chunk_numel ? config->offload_chunk_numel : DEFAULT_CHUNK;
}

/* An accelerator's count of deferred updates (zeroed) and their table, in the device arena. */
static gt_status create_table(gt_optimizer *opt) {
    if (!table_request(&opt->config, opt->num_groups))
        return GT_OK;
    GT_TRY(gt_arena_take(&opt->device_arena, sizeof(uint64_t), (void **)&opt->update_count));
    GT_TRY(gt_arena_take(&opt->device_arena, table_bytes(opt->num_groups), &opt->table));
    opt->table_host = calloc(GT_OPTIM_RING, table_bytes(opt->num_groups));
    if (!opt->table_host)
        return GT_FAIL(GT_ERR_OOM, "optimizer: out of host memory for its update table");
    GT_TRY(gt_block_alloc(gt_pinned_device(), results_request(&opt->config), &opt->results));
    for (int k = 0; k < GT_OPTIM_RING; k++)
        GT_TRY(opt->dev->event_create(opt->config.device.index, &opt->done[k]));
    return opt->dev->memset(opt->config.device.index, opt->update_count, 0, sizeof(uint64_t));
}

/* The device arena (state of [0, device_numel), then the deferred updates' table), zero-filled. */
static gt_status create_device_state(gt_optimizer *opt) {
    size_t bytes = opt->device_numel * sizeof(float);
    GT_TRY(gt_arena_create(&opt->device_arena, opt->config.device,
                           device_arena_request(opt->device_numel, slot_count(opt)) +
                               table_request(&opt->config, opt->num_groups)));
    for (int s = 0; s < GT_SLOT_COUNT; s++) {
        if (!opt->has_slot[s] || bytes == 0)
            continue;
        void *piece = NULL;
        GT_TRY(gt_arena_take(&opt->device_arena, bytes, &piece));
        opt->slot[s] = piece;
        GT_TRY(opt->dev->memset(opt->config.device.index, piece, 0, bytes));
    }
    return create_table(opt);
}

/* The host share: its arena, copy stream, and the master copy of the offloaded parameters. */
static gt_status create_offload(gt_optimizer *opt) {
    size_t host_numel = opt->total_numel - opt->device_numel;
    if (host_numel == 0)
        return GT_OK;
    GT_TRY(gt_offload_create(&opt->offload, opt->config.device, opt->config.compute_stream,
                             opt->device_numel, host_numel, chunk_request(&opt->config), opt->has_slot));
    return gt_optimizer_reload_params(opt);
}

static gt_status copy_params(gt_optimizer *opt, const gt_optim_param_desc *params) {
    size_t offset = 0;
    for (size_t i = 0; i < opt->num_params; i++) {
        opt->params[i] = (optim_param){params[i].param, params[i].grad, params[i].numel,
                                       params[i].group, offset, 0};
        if (params[i].numel > SIZE_MAX / sizeof(float) - offset)
            return GT_FAIL(GT_ERR_VALUE, "params: total size overflows");
        offset += params[i].numel;
    }
    opt->total_numel = offset;
    opt->device_numel = device_numel_of(&opt->config, offset);
    return GT_OK;
}

static gt_status allocate_tables(gt_optimizer *opt, size_t num_groups, size_t num_params) {
    opt->groups = calloc(num_groups ? num_groups : 1, sizeof *opt->groups);
    opt->params = calloc(num_params ? num_params : 1, sizeof *opt->params);
    opt->segments = calloc(2 * num_params + 2, sizeof *opt->segments);
    opt->spans = calloc(num_params + 1, sizeof *opt->spans);
    opt->group_step = calloc(num_groups ? num_groups : 1, sizeof *opt->group_step);
    if (!opt->groups || !opt->params || !opt->segments || !opt->spans || !opt->group_step)
        return GT_FAIL(GT_ERR_OOM, "optimizer: out of host memory for %zu parameters", num_params);
    opt->num_groups = num_groups;
    opt->num_params = num_params;
    return GT_OK;
}

/* AdamW8bit's state, in its own arena on the device. */
static gt_status create_state8(gt_optimizer *opt, const gt_optim_param_desc *params) {
    if (opt->config.kind != GT_OPTIM_ADAMW8BIT)
        return GT_OK;
    size_t *numels = calloc(opt->num_params ? opt->num_params : 1, sizeof *numels);
    opt->state8 = calloc(1, sizeof *opt->state8);
    if (!numels || !opt->state8) {
        free(numels);
        return GT_FAIL(GT_ERR_OOM, "optimizer: out of host memory for %zu parameters", opt->num_params);
    }
    for (size_t i = 0; i < opt->num_params; i++)
        numels[i] = params[i].numel;
    size_t host_first = gt_optim8_host_first(numels, opt->num_params, opt->config.cpu_offload_fraction);
    gt_status status = gt_optim8_create(opt->state8, opt->config.device, opt->config.compute_stream, numels,
                                        opt->num_params, opt->config.min_8bit_size, host_first,
                                        chunk_request(&opt->config));
    free(numels);
    return status;
}

static gt_status build(gt_optimizer *opt, const gt_optim_hparams *groups, size_t num_groups,
                       const gt_optim_param_desc *params, size_t num_params) {
    GT_TRY(allocate_tables(opt, num_groups, num_params));
    for (size_t g = 0; g < num_groups; g++)
        opt->groups[g] = groups[g];
    GT_TRY(copy_params(opt, params));
    slots_of(opt->config.kind, opt->groups, opt->num_groups, opt->has_slot);
    GT_TRY(create_device_state(opt));
    GT_TRY(create_state8(opt, params));
    return create_offload(opt);
}

/* The checks of the configuration and groups shared by gt_optimizer_create and _plan. */
static gt_status check_setup(const gt_optimizer_config *config, const gt_optim_hparams *groups,
                             size_t num_groups) {
    GT_TRY(check_config(config));
    if (num_groups == 0)
        return GT_FAIL(GT_ERR_VALUE, "groups: at least one parameter group is needed");
    for (size_t g = 0; g < num_groups; g++)
        GT_TRY(gt_optim_hparams_check(config->kind, &groups[g]));
    return GT_OK;
}

gt_status gt_optimizer_plan(const gt_optimizer_config *config, const gt_optim_hparams *groups,
                            size_t num_groups, size_t total_numel, gt_optimizer_memory *out) {
    memset(out, 0, sizeof *out);
    GT_TRY(check_setup(config, groups, num_groups));
    GT_TRY(gt_size_check(gt_size_mul_sat(total_numel, sizeof(float)), "params"));
    int has_slot[GT_SLOT_COUNT];
    slots_of(config->kind, groups, num_groups, has_slot);
    out->device_numel = device_numel_of(config, total_numel);
    out->host_numel = total_numel - out->device_numel;
    out->device_bytes = gt_block_reserved_bytes(device_arena_request(out->device_numel, count_slots(has_slot)) +
                                                table_request(config, num_groups));
    if (out->host_numel)
        out->host_bytes = gt_block_reserved_bytes(
            gt_offload_host_bytes(out->host_numel, count_slots(has_slot), chunk_request(config)));
    out->host_bytes += gt_block_reserved_bytes(results_request(config));
    return GT_OK;
}

gt_status gt_optimizer_plan_params(const gt_optimizer_config *config, const gt_optim_hparams *groups,
                                   size_t num_groups, const size_t *numels, size_t num_params,
                                   gt_optimizer_memory *out) {
    size_t total = 0;
    for (size_t i = 0; i < num_params; i++)
        total = numels[i] > SIZE_MAX - total ? SIZE_MAX : total + numels[i];
    GT_TRY(gt_optimizer_plan(config, groups, num_groups, total, out));
    if (config->kind == GT_OPTIM_ADAMW8BIT) {
        size_t host_first = gt_optim8_host_first(numels, num_params, config->cpu_offload_fraction);
        size_t device_bytes = 0, host_bytes = 0;
        gt_optim8_plan(numels, num_params, config->min_8bit_size, host_first, chunk_request(config), &device_bytes,
                       &host_bytes);
        GT_TRY(gt_size_check(device_bytes, "optimizer state"));
        GT_TRY(gt_size_check(host_bytes, "optimizer state offloaded"));
        out->device_bytes += gt_block_reserved_bytes(device_bytes);
        out->host_bytes += host_bytes;
        for (size_t i = host_first; i < num_params; i++)
            out->host_numel += numels[i];
        out->device_numel = total - out->host_numel;
    }
    return GT_OK;
}

struct gt_optim8 *gt_optimizer_state8(gt_optimizer *opt) { return opt->state8; }

gt_status gt_optimizer_create(const gt_optimizer_config *config, const gt_optim_hparams *groups,
                              size_t num_groups, const gt_optim_param_desc *params,
                              size_t num_params, gt_optimizer **out) {
    *out = NULL;
    GT_TRY(check_setup(config, groups, num_groups));
    GT_TRY(check_params(params, num_params, num_groups));
    gt_optimizer *opt = calloc(1, sizeof *opt);
    if (!opt)
        return GT_FAIL(GT_ERR_OOM, "optimizer: out of host memory");
    opt->config = *config;
    opt->dev = gt_device_backend_of(config->device);
    opt->device_arena.block.device = config->device;
    gt_status status = build(opt, groups, num_groups, params, num_params);
    if (status != GT_OK) {
        gt_optimizer_destroy(opt);
        return status;
    }
    *out = opt;
    return GT_OK;
}

void gt_optimizer_destroy(gt_optimizer *opt) {
    if (!opt)
        return;
    if (opt->offload.numel)
        gt_offload_destroy(&opt->offload);
    gt_arena_destroy(&opt->device_arena);
    if (opt->state8)
        gt_optim8_destroy(opt->state8);
    free(opt->state8);
    free(opt->groups);
    free(opt->params);
    free(opt->segments);
    free(opt->spans);
    free(opt->group_step);
    free(opt->table_host);
    gt_block_free(&opt->results);
    for (int k = 0; opt->dev && k < GT_OPTIM_RING; k++)
        opt->dev->event_destroy(opt->config.device.index, opt->done[k]);
    free(opt);
}

/* ------------------------------------------------------------ hyperparameters ----- */

gt_status gt_optimizer_set_hparams(gt_optimizer *opt, size_t group, const gt_optim_hparams *hp) {
    if (group >= opt->num_groups)
        return GT_FAIL(GT_ERR_INDEX, "group: index %zu out of range (%zu groups)", group, opt->num_groups);
    GT_TRY(gt_optim_hparams_check(opt->config.kind, hp));
    if (opt->config.kind == GT_OPTIM_ADAMW && hp->amsgrad && !opt->has_slot[GT_SLOT_MAX_EXP_AVG_SQ])
        return GT_FAIL(GT_ERR_VALUE, "amsgrad: cannot be turned on after the optimizer was created");
    if (opt->config.kind == GT_OPTIM_SGD && hp->momentum != 0.0 && !opt->has_slot[GT_SLOT_MOMENTUM])
        return GT_FAIL(GT_ERR_VALUE, "momentum: cannot be turned on after the optimizer was created "
                                     "with momentum 0 in every group");
    opt->groups[group] = *hp;
    return GT_OK;
}

gt_status gt_optimizer_get_hparams(const gt_optimizer *opt, size_t group, gt_optim_hparams *out) {
    if (group >= opt->num_groups)
        return GT_FAIL(GT_ERR_INDEX, "group: index %zu out of range (%zu groups)", group, opt->num_groups);
    *out = opt->groups[group];
    return GT_OK;
}

gt_status gt_optimizer_set_grad(gt_optimizer *opt, size_t index, float *grad) {
    if (index >= opt->num_params)
        return GT_FAIL(GT_ERR_INDEX, "index: parameter %zu out of range (%zu parameters)", index,
                       opt->num_params);
    opt->params[index].grad = grad;
    return GT_OK;
}

int64_t gt_optimizer_num_steps(const gt_optimizer *opt) { return opt->num_steps; }

size_t gt_optimizer_num_params(const gt_optimizer *opt) { return opt->num_params; }

int gt_optimizer_zero_size(const gt_optimizer *opt) { return opt->config.zero_size; }
int gt_optimizer_zero_rank(const gt_optimizer *opt) { return opt->config.zero_rank; }

int gt_optimizer_has_slot(const gt_optimizer *opt, gt_optim_slot slot) {
    return (int)slot >= 0 && slot < GT_SLOT_COUNT && opt->has_slot[slot];
}

void gt_optimizer_get_memory(const gt_optimizer *opt, gt_optimizer_memory *out) {
    const gt_optim8 *state8 = opt->state8;
    out->device_bytes = opt->device_arena.block.bytes + (state8 ? state8->on_device.arena.block.bytes : 0);
    out->host_bytes = opt->offload.host.block.bytes + gt_block_reserved_bytes(opt->results.bytes);
    out->device_numel = opt->device_numel;
    out->host_numel = opt->total_numel - opt->device_numel;
    if (!state8 || state8->host_first == opt->num_params)
        return;
    out->host_bytes += gt_block_reserved_bytes(state8->on_host.arena.block.bytes) +
                       gt_block_reserved_bytes(state8->staging.bytes);
    for (size_t i = state8->host_first; i < opt->num_params; i++)
        out->host_numel += opt->params[i].numel;
    out->device_numel = opt->total_numel - out->host_numel;
}

float gt_clip_coef(double max_norm, double norm) { return gt_clip_rule_coef(max_norm, norm); }

/* ------------------------------------------------------------ segments ------------ */

static int can_merge(const optim_param *prev, const optim_param *next) {
    return prev->group == next->group && prev->step == next->step &&
           prev->param + prev->numel == next->param && prev->grad + prev->numel == next->grad;
}

static void set_scalars(const gt_optimizer *opt, const optim_param *first, float grad_coef,
                        optim_segment *seg) {
    const gt_optim_hparams *hp = &opt->groups[first->group];
    if (opt->config.kind == GT_OPTIM_ADAMW)
        seg->scalars.adamw = gt_adamw_scalars_make(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                                                   first->step + 1, grad_coef, hp->maximize, hp->amsgrad);
    else
        seg->scalars.sgd = gt_sgd_scalars_make(hp->lr, hp->momentum, hp->dampening, hp->weight_decay,
                                               hp->nesterov, hp->maximize, first->step == 0, grad_coef);
}

/* Splits a run at the device/host boundary and appends its pieces to the two lists. */
static void place_run(gt_optimizer *opt, const optim_segment *run, size_t *num_device, size_t *num_host) {
    optim_segment *device_list = opt->segments, *host_list = opt->segments + opt->num_params + 1;
    size_t device_part = 0;
    if (run->offset < opt->device_numel)
        device_part = opt->device_numel - run->offset < run->numel ? opt->device_numel - run->offset : run->numel;
    if (device_part > 0) {
        device_list[*num_device] = *run;
        device_list[*num_device].numel = device_part;
        ++*num_device;
    }
    if (device_part < run->numel) {
        optim_segment *piece = &host_list[(*num_host)++];
        *piece = *run;
        piece->param += device_part;
        piece->grad += device_part;
        piece->offset += device_part;
        piece->numel -= device_part;
    }
}

/* Groups the parameters with gradients into maximal runs; returns the element count. */
static size_t build_segments(gt_optimizer *opt, float grad_coef, size_t *num_device, size_t *num_host) {
    *num_device = *num_host = 0;
    size_t total = 0;
    for (size_t i = 0; i < opt->num_params;) {
        const optim_param *first = &opt->params[i];
        if (!first->grad || first->numel == 0) {
            i++;
            continue;
        }
        optim_segment run = {.param = first->param, .grad = first->grad, .offset = first->offset,
                             .numel = first->numel, .group = first->group};
        size_t j = i + 1;
        for (; j < opt->num_params && opt->params[j].grad && can_merge(&opt->params[j - 1], &opt->params[j]); j++)
            run.numel += opt->params[j].numel;
        set_scalars(opt, first, grad_coef, &run);
        place_run(opt, &run, num_device, num_host);
        total += run.numel;
        i = j;
    }
    return total;
}

/* ------------------------------------------------------------ the update ---------- */

/* Updates n elements of a run whose state starts at element `state_index` of `slots`. */
static void update_run(const gt_optimizer *opt, const optim_segment *seg, float *param,
                       const float *grad, float *const slots[GT_SLOT_COUNT], size_t state_index, size_t n) {
    if (opt->config.kind == GT_OPTIM_ADAMW) {
        float *v_max = slots[GT_SLOT_MAX_EXP_AVG_SQ] ? slots[GT_SLOT_MAX_EXP_AVG_SQ] + state_index : NULL;
        gt_adamw_cpu(opt->config.numerics, &seg->scalars.adamw, param, grad,
                     slots[GT_SLOT_EXP_AVG] + state_index, slots[GT_SLOT_EXP_AVG_SQ] + state_index, v_max, n);
    } else {
        float *buf = slots[GT_SLOT_MOMENTUM] ? slots[GT_SLOT_MOMENTUM] + state_index : NULL;
        gt_sgd_cpu(&seg->scalars.sgd, param, grad, buf, n);
    }
}

/* Thread t's share [bound(t), bound(t+1)) of `total` elements, on SHARE_ALIGN boundaries. */
static size_t share_bound(size_t total, size_t t, size_t threads) {
    if (t >= threads)
        return total;
    size_t bound = (size_t)((double)total * (double)t / (double)threads);
    bound -= bound % SHARE_ALIGN;
    return bound < total ? bound : total;
}

/* The device share: one kernel per run, queued on the compute stream (the cpu's run at once,
 * each over all threads). */
static gt_status run_device_kernels(gt_optimizer *opt, size_t num_device) {
    int index = opt->config.device.index;
    gt_stream *stream = opt->config.compute_stream;
    for (size_t k = 0; k < num_device; k++) {
        const optim_segment *seg = &opt->segments[k];
        float *const *s = opt->slot;
        if (opt->config.kind == GT_OPTIM_ADAMW)
            GT_TRY(opt->dev->adamw(index, stream, opt->config.numerics, &seg->scalars.adamw, seg->param,
                                   seg->grad, s[GT_SLOT_EXP_AVG] + seg->offset, s[GT_SLOT_EXP_AVG_SQ] + seg->offset,
                                   s[GT_SLOT_MAX_EXP_AVG_SQ] ? s[GT_SLOT_MAX_EXP_AVG_SQ] + seg->offset : NULL,
                                   seg->numel));
        else
            GT_TRY(opt->dev->sgd(index, stream, &seg->scalars.sgd, seg->param, seg->grad,
                                 s[GT_SLOT_MOMENTUM] ? s[GT_SLOT_MOMENTUM] + seg->offset : NULL, seg->numel));
    }
    return GT_OK;
}

/* AdamW8bit: one kernel per parameter with a gradient (its blocks start at its first element), with
 * the constants of its own step count. */
static gt_status run_adamw8bit(gt_optimizer *opt, float grad_coef) {
    for (size_t i = 0; i < opt->num_params; i++) {
        const optim_param *p = &opt->params[i];
        if (!p->grad || p->numel == 0)
            continue;
        const gt_optim_hparams *hp = &opt->groups[p->group];
        gt_adamw8_scalars s = gt_adamw8_scalars_make(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                                                     p->step + 1, grad_coef, hp->maximize);
        GT_TRY(gt_optim8_update(opt->state8, opt->dev, opt->config.compute_stream, i, &s, p->param, p->grad));
    }
    return GT_OK;
}

typedef struct host_update_ctx {
    gt_optimizer *opt;            /* the optimizer */
    const optim_segment *host;    /* its host runs, indexed by span tag */
    int threads;                  /* OpenMP threads for the host update */
} host_update_ctx;

/* Threads for the host update: all of them when a GPU's copy engine moves the data; one fewer
 * on the CPU "device", whose copies run on a thread of their own and need a core. */
static int host_update_threads(const gt_optimizer *opt) {
    int threads = omp_get_max_threads();
    if (opt->dev->host_memory && threads > 1)
        threads--;
    return threads;
}

/* One staged chunk of the offloaded share, updated by all threads. */
static void update_host_chunk(void *ctx_ptr, size_t tag, float *master, const float *grad,
                              size_t state_index, size_t n) {
    host_update_ctx *ctx = ctx_ptr;
    const optim_segment *seg = &ctx->host[tag];
#pragma omp parallel if (n >= PARALLEL_MIN) num_threads(ctx->threads)
    {
        size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = share_bound(n, t, threads), hi = share_bound(n, t + 1, threads);
        if (lo < hi)
            update_run(ctx->opt, seg, master + lo, grad + lo, ctx->opt->offload.slot, state_index + lo, hi - lo);
    }
}

/* The spans of the host runs `host[0..num_host)`, in opt->spans. */
static void fill_spans(gt_optimizer *opt, const optim_segment *host, size_t num_host) {
    for (size_t k = 0; k < num_host; k++)
        opt->spans[k] = (gt_offload_span){host[k].param, host[k].grad, host[k].offset, host[k].numel, k};
}

static gt_status run_host(gt_optimizer *opt, size_t num_host) {
    const optim_segment *host = opt->segments + opt->num_params + 1;
    fill_spans(opt, host, num_host);
    host_update_ctx ctx = {opt, host, host_update_threads(opt)};
    return gt_offload_step(&opt->offload, opt->spans, num_host, update_host_chunk, &ctx);
}

gt_status gt_optimizer_prefetch(gt_optimizer *opt) {
    size_t num_device = 0, num_host = 0;
    if (!opt->offload.numel || build_segments(opt, 1.0f, &num_device, &num_host) == 0 || num_host == 0)
        return GT_OK;
    fill_spans(opt, opt->segments + opt->num_params + 1, num_host);
    return gt_offload_prefetch(&opt->offload, opt->spans, num_host);
}

void gt_optimizer_unstage(gt_optimizer *opt) {
    if (opt->offload.numel)
        gt_offload_unstage(&opt->offload);
}

static void advance_steps(gt_optimizer *opt) {
    for (size_t i = 0; i < opt->num_params; i++)
        if (opt->params[i].grad && opt->params[i].numel > 0)
            opt->params[i].step++;
}

/* The host's step counts lag the device's while deferred steps are unresolved. */
static gt_status check_resolved(const gt_optimizer *opt, const char *what) {
    if (opt->pending)
        return GT_FAIL(GT_ERR_VALUE, "%s: %zu deferred optimizer steps are not resolved yet (read their results "
                       "first)", what, opt->pending);
    return GT_OK;
}

gt_status gt_optimizer_step(gt_optimizer *opt, float grad_coef) {
    GT_TRY(check_resolved(opt, "optimizer"));
    size_t num_device = 0, num_host = 0;
    size_t total = build_segments(opt, grad_coef, &num_device, &num_host);
    if (total == 0)
        return GT_OK;
    if (num_host > 0)
        GT_TRY(gt_offload_begin(&opt->offload));
    GT_TRY(opt->state8 ? run_adamw8bit(opt, grad_coef) : run_device_kernels(opt, num_device));
    if (num_host > 0)
        GT_TRY(run_host(opt, num_host));
    advance_steps(opt);
    opt->num_steps++;
    return GT_OK;
}

/* Waits for the update kernels queued on the compute stream, so that blocking copies of device
 * memory see their results. */
static gt_status settle(const gt_optimizer *opt) {
    return opt->dev->stream_synchronize(opt->config.device.index, opt->config.compute_stream);
}

gt_status gt_optimizer_synchronize(const gt_optimizer *opt) { return settle(opt); }

/* ------------------------------------------------------------ norms --------------- */

gt_status gt_grad_sumsq_on(gt_device device, gt_stream *stream, const float *grad, size_t n, double *out) {
    const gt_device_backend *table = NULL;
    GT_TRY(gt_device_backend_get(device, "device", &table));
    return table->grad_sumsq(device.index, stream, grad, n, out);
}

gt_status gt_optimizer_grad_norm(const gt_optimizer *opt, double *out) {
    double total = 0.0;
    for (size_t i = 0; i < opt->num_params;) {
        const optim_param *first = &opt->params[i];
        size_t j = i + 1, n = first->numel;
        if (first->grad)
            for (; j < opt->num_params && opt->params[j].grad == first->grad + n; j++)
                n += opt->params[j].numel;
        if (first->grad && n > 0) {
            double sumsq = 0.0;
            GT_TRY(gt_grad_sumsq_on(opt->config.device, opt->config.compute_stream, first->grad, n, &sumsq));
            total += sumsq;
        }
        i = j;
    }
    *out = sqrt(total);
    return GT_OK;
}

/* ------------------------------------------------------------ state access -------- */

static gt_status check_index(const gt_optimizer *opt, size_t index) {
    if (index >= opt->num_params)
        return GT_FAIL(GT_ERR_INDEX, "index: parameter %zu out of range (%zu parameters)", index,
                       opt->num_params);
    return GT_OK;
}

gt_status gt_optimizer_get_param_step(const gt_optimizer *opt, size_t index, int64_t *out) {
    GT_TRY(check_index(opt, index));
    *out = opt->params[index].step;
    return GT_OK;
}

gt_status gt_optimizer_set_param_step(gt_optimizer *opt, size_t index, int64_t step) {
    GT_TRY(check_index(opt, index));
    GT_TRY(check_resolved(opt, "step"));
    if (step < 0)
        return GT_FAIL(GT_ERR_VALUE, "step: must be >= 0, got %lld", (long long)step);
    opt->params[index].step = step;
    return GT_OK;
}

/* Copies a parameter's slot between host memory and the state (device part, then host part). */
static gt_status transfer_state(const gt_optimizer *opt, size_t index, gt_optim_slot slot, float *host,
                                int to_state) {
    GT_TRY(check_index(opt, index));
    if (!gt_optimizer_has_slot(opt, slot))
        return GT_FAIL(GT_ERR_VALUE, "slot: this optimizer keeps no state slot %d", (int)slot);
    GT_TRY(settle(opt));
    const optim_param *p = &opt->params[index];
    size_t device_part = 0;
    if (p->offset < opt->device_numel)
        device_part = opt->device_numel - p->offset < p->numel ? opt->device_numel - p->offset : p->numel;
    float *device_state = device_part ? opt->slot[slot] + p->offset : NULL;
    size_t bytes = device_part * sizeof(float);
    GT_TRY(to_state ? gt_memcpy_blocking(opt->config.device, device_state, host, bytes)
                    : gt_memcpy_blocking(opt->config.device, host, device_state, bytes));
    if (device_part == p->numel)
        return GT_OK;
    float *host_state = opt->offload.slot[slot] + (p->offset + device_part - opt->offload.base);
    size_t host_bytes = (p->numel - device_part) * sizeof(float);
    if (to_state)
        memcpy(host_state, host + device_part, host_bytes);
    else
        memcpy(host + device_part, host_state, host_bytes);
    return GT_OK;
}

gt_status gt_optimizer_read_state(const gt_optimizer *opt, size_t index, gt_optim_slot slot, float *host) {
    return transfer_state(opt, index, slot, host, 0);
}

gt_status gt_optimizer_write_state(gt_optimizer *opt, size_t index, gt_optim_slot slot, const float *host) {
    return transfer_state(opt, index, slot, (float *)host, 1);
}

gt_status gt_optimizer_reload_params(gt_optimizer *opt) {
    size_t base = opt->device_numel;
    if (opt->total_numel == base)
        return GT_OK;
    GT_TRY(settle(opt));
    for (size_t i = 0; i < opt->num_params; i++) {
        const optim_param *p = &opt->params[i];
        if (p->offset + p->numel <= base || p->numel == 0)
            continue;
        size_t skip = p->offset < base ? base - p->offset : 0;
        GT_TRY(gt_offload_fetch_params(&opt->offload, opt->config.device, p->param + skip, p->offset + skip,
                                       p->numel - skip));
    }
    return GT_OK;
}

/* ------------------------------------------------------------ deferred updates ---- */

/* The step count shared by each group's parameters with a gradient (a group's table entry
 * serves all of them); GT_ERR_VALUE when two of a group differ. */
static gt_status find_group_steps(gt_optimizer *opt) {
    for (size_t g = 0; g < opt->num_groups; g++)
        opt->group_step[g] = -1;
    for (size_t i = 0; i < opt->num_params; i++) {
        const optim_param *p = &opt->params[i];
        int64_t *step = &opt->group_step[p->group];
        if (!p->grad || p->numel == 0)
            continue;
        if (*step >= 0 && *step != p->step)
            return GT_FAIL(GT_ERR_VALUE, "optimizer: parameters of group %zu have different step counts (%lld and "
                           "%lld); a deferred step needs one count per group", p->group, (long long)*step,
                           (long long)p->step);
        *step = p->step;
    }
    return GT_OK;
}

static gt_status check_deferred(const gt_optimizer *opt, const double *lrs) {
    if (opt->config.kind == GT_OPTIM_ADAMW8BIT)
        return GT_FAIL(GT_ERR_VALUE, "optimizer: 8-bit AdamW runs its update synchronously (no deferred step); use "
                       "TrainStep(sync=True) or no GradScaler");
    if (opt->config.cpu_offload_fraction != 0.0)
        return GT_FAIL(GT_ERR_VALUE, "cpu_offload_fraction: a deferred step needs the whole optimizer state on the "
                       "accelerator (cpu_offload_fraction=0)");
    if (opt->config.zero_size)
        return GT_FAIL(GT_ERR_VALUE, "optimizer: a deferred step takes no collectives; a ZeRO-1 shard cannot defer");
    if (!opt->table)
        return GT_FAIL(GT_ERR_VALUE, "optimizer: a deferred step needs an optimizer on an accelerator (cuda:N or "
                       "sim:N)");
    if (opt->pending >= GT_OPTIM_RING)
        return GT_FAIL(GT_ERR_VALUE, "optimizer: %zu deferred steps are unresolved; resolve one first (at most %d)",
                       opt->pending, GT_OPTIM_RING);
    for (size_t k = 0; lrs && k < GT_OPTIM_RING * opt->num_groups; k++)
        if (!(lrs[k] >= 0.0 && isfinite(lrs[k])))
            return GT_FAIL(GT_ERR_VALUE, "lrs[%zu][%zu]: invalid learning rate %g (must be finite and >= 0)",
                           k / opt->num_groups, k % opt->num_groups, lrs[k]);
    return GT_OK;
}

/* Group g's constants for the update `ahead` updates after the resolved ones, at `lr`. */
static void table_scalars(const gt_optimizer *opt, size_t g, int64_t ahead, double lr, void *out) {
    const gt_optim_hparams *hp = &opt->groups[g];
    int64_t done = (opt->group_step[g] < 0 ? 0 : opt->group_step[g]) + ahead;  /* updates before it */
    if (opt->config.kind == GT_OPTIM_ADAMW) {
        gt_adamw_scalars s = gt_adamw_scalars_make(lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, done + 1,
                                                   1.0f, hp->maximize, hp->amsgrad);
        memcpy(out, &s, sizeof s);
    } else {
        gt_sgd_scalars s = gt_sgd_scalars_make(lr, hp->momentum, hp->dampening, hp->weight_decay, hp->nesterov,
                                               hp->maximize, done == 0, 1.0f);
        memcpy(out, &s, sizeof s);
    }
}

/* The table for this call: slot (resolved + j) % ring holds the constants of the update j
 * updates after the resolved ones, for j < ring (the device's count is one of them). */
static char *fill_table(gt_optimizer *opt, const double *lrs, size_t scalar_bytes) {
    char *host = opt->table_host + (opt->deferred_calls % GT_OPTIM_RING) * table_bytes(opt->num_groups);
    for (size_t j = 0; j < GT_OPTIM_RING; j++) {
        size_t slot = (size_t)((opt->resolved_updates + j) % GT_OPTIM_RING);
        for (size_t g = 0; g < opt->num_groups; g++) {
            double lr = lrs ? lrs[j * opt->num_groups + g] : opt->groups[g].lr;
            table_scalars(opt, g, (int64_t)j, lr, host + (slot * opt->num_groups + g) * scalar_bytes);
        }
    }
    return host;
}

static gt_status launch_table_run(gt_optimizer *opt, const optim_segment *seg, const int *found_inf,
                                  size_t scalar_bytes) {
    int index = opt->config.device.index;
    gt_stream *stream = opt->config.compute_stream;
    float *const *s = opt->slot;
    gt_update_table t = {(const char *)opt->table + seg->group * scalar_bytes, opt->num_groups, GT_OPTIM_RING,
                         opt->update_count, found_inf};
    if (opt->config.kind == GT_OPTIM_ADAMW)
        return opt->dev->adamw_table(index, stream, opt->config.numerics, &t, seg->param, seg->grad,
                                     s[GT_SLOT_EXP_AVG] + seg->offset, s[GT_SLOT_EXP_AVG_SQ] + seg->offset,
                                     s[GT_SLOT_MAX_EXP_AVG_SQ] ? s[GT_SLOT_MAX_EXP_AVG_SQ] + seg->offset : NULL,
                                     seg->numel);
    return opt->dev->sgd_table(index, stream, &t, seg->param, seg->grad,
                               s[GT_SLOT_MOMENTUM] ? s[GT_SLOT_MOMENTUM] + seg->offset : NULL, seg->numel);
}

/* Queues the copy of the step's result into its pinned row, then the event the host waits for. */
static gt_status queue_result(gt_optimizer *opt, const void *result, size_t result_bytes) {
    size_t row = (size_t)(opt->deferred_calls % GT_OPTIM_RING);
    int index = opt->config.device.index;
    opt->result_bytes[row] = result_bytes;
    if (result_bytes)
        GT_TRY(opt->dev->memcpy_async(index, opt->config.compute_stream,
                                      (char *)opt->results.ptr + row * GT_OPTIM_RESULT_BYTES, result, result_bytes));
    return opt->dev->event_record(index, opt->done[row], opt->config.compute_stream);
}

gt_status gt_optimizer_check_deferred(gt_optimizer *opt, const double *lrs, size_t lrs_len) {
    if (lrs && lrs_len != GT_OPTIM_RING * opt->num_groups)
        return GT_FAIL(GT_ERR_VALUE, "lrs: expected (%d, %zu) learning rates, got %zu", GT_OPTIM_RING, opt->num_groups,
                       lrs_len);
    GT_TRY(check_deferred(opt, lrs));
    return find_group_steps(opt);
}

gt_status gt_optimizer_step_deferred(gt_optimizer *opt, const int *found_inf, const double *lrs,
                                     const void *result, size_t result_bytes) {
    if (result_bytes > GT_OPTIM_RESULT_BYTES)
        return GT_FAIL(GT_ERR_VALUE, "result_bytes: at most %d bytes of a deferred step's result, got %zu",
                       GT_OPTIM_RESULT_BYTES, result_bytes);
    GT_TRY(check_deferred(opt, lrs));
    GT_TRY(find_group_steps(opt));
    size_t num_device = 0, num_host = 0;
    build_segments(opt, 1.0f, &num_device, &num_host);
    size_t scalar_bytes = opt->config.kind == GT_OPTIM_ADAMW ? sizeof(gt_adamw_scalars) : sizeof(gt_sgd_scalars);
    int index = opt->config.device.index;
    char *host = fill_table(opt, lrs, scalar_bytes);
    GT_TRY(opt->dev->memcpy_async(index, opt->config.compute_stream, opt->table, host,
                                  GT_OPTIM_RING * opt->num_groups * scalar_bytes));
    for (size_t k = 0; k < num_device; k++)
        GT_TRY(launch_table_run(opt, &opt->segments[k], found_inf, scalar_bytes));
    GT_TRY(opt->dev->count_update(index, opt->config.compute_stream, opt->update_count, found_inf));
    GT_TRY(queue_result(opt, result, result_bytes));
    opt->deferred_calls++;
    opt->pending++;
    return GT_OK;
}

gt_status gt_optimizer_resolve(gt_optimizer *opt, int applied) {
    if (opt->pending == 0)
        return GT_FAIL(GT_ERR_VALUE, "optimizer: no deferred step to resolve");
    opt->pending--;
    if (!applied)
        return GT_OK;
    advance_steps(opt);
    opt->num_steps++;
    opt->resolved_updates++;
    return GT_OK;
}

size_t gt_optimizer_pending(const gt_optimizer *opt) { return opt->pending; }

gt_status gt_optimizer_deferred_result(gt_optimizer *opt, int wait, void *out, int *done) {
    *done = 0;
    if (opt->pending == 0)
        return GT_FAIL(GT_ERR_VALUE, "optimizer: no deferred step to read");
    size_t row = (size_t)((opt->deferred_calls - opt->pending) % GT_OPTIM_RING);
    int index = opt->config.device.index;
    if (wait)
        GT_TRY(opt->dev->event_synchronize(index, opt->done[row]));
    else
        GT_TRY(opt->dev->event_query(index, opt->done[row], done));
    if (wait)
        *done = 1;
    if (*done)
        memcpy(out, (char *)opt->results.ptr + row * GT_OPTIM_RESULT_BYTES, opt->result_bytes[row]);
    return GT_OK;
}
