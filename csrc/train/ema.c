#include "train/ema.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/copy_stream.h"
#include "train/optim_cpu.h"

#include "core/device_backend.h"

enum {
    STAGING_NUMEL = 1 << 20, /* host-shadow staging chunk for device parameters, elements */
};

/* Parameters adjacent in memory, averaged as one run. */
typedef struct ema_run {
    float *param;       /* (numel,) on the device */
    float *shadow;      /* (numel,) in the shadow arena */
    size_t numel;       /* elements */
    size_t work_begin;  /* elements of the earlier runs */
} ema_run;

struct gt_ema {
    gt_device device;        /* where the parameters live */
    const gt_device_backend *dev; /* the device's interface (the cpu's too) */
    int on_host;             /* 1: the shadow is in pinned host memory */
    gt_stream *compute_stream; /* accelerator: the stream the kernels are queued on (NULL: default) */
    gt_arena arena;          /* shadow (total,) [+ staging (staging_numel,)] */
    float *shadow;           /* (total,) parameters packed in order */
    float *staging;          /* (staging_numel,) pinned; only for a host shadow of device parameters */
    size_t staging_numel;    /* elements of `staging` (0 without) */
    size_t total;            /* elements of all parameters */
    size_t num_params;       /* parameters */
    size_t *offsets;         /* (num_params,) first shadow element of each parameter */
    size_t *numels;          /* (num_params,) elements of each parameter */
    ema_run *runs;           /* (num_runs,) */
    size_t num_runs;         /* merged runs */
    gt_event *staged;        /* host shadow whose parameters fit the staging: recorded after their copy */
    int pending;             /* 1: staging holds parameters whose average (pending_weight) is still to do */
    float pending_weight;    /* f32(1 - decay) of the pending update */
};

/* Waits for the compute stream before blocking copies touch device memory. */
static gt_status settle(const gt_ema *ema) {
    return ema->dev->stream_synchronize(ema->device.index, ema->compute_stream);
}

static gt_status build_runs(gt_ema *ema, float *const *params) {
    size_t offset = 0;
    for (size_t i = 0; i < ema->num_params; i++) {
        ema->offsets[i] = offset;
        if (ema->numels[i] == 0)
            continue;
        ema_run *last = ema->num_runs ? &ema->runs[ema->num_runs - 1] : NULL;
        if (last && last->param + last->numel == params[i]) {
            last->numel += ema->numels[i];
        } else {
            ema->runs[ema->num_runs++] = (ema_run){params[i], ema->shadow + offset, ema->numels[i], offset};
        }
        offset += ema->numels[i];
    }
    return GT_OK;
}

static gt_status allocate(gt_ema *ema, size_t num_params) {
    ema->offsets = calloc(num_params ? num_params : 1, sizeof *ema->offsets);
    ema->numels = calloc(num_params ? num_params : 1, sizeof *ema->numels);
    ema->runs = calloc(num_params ? num_params : 1, sizeof *ema->runs);
    if (!ema->offsets || !ema->numels || !ema->runs)
        return GT_FAIL(GT_ERR_OOM, "ema: out of host memory for %zu parameters", num_params);
    ema->num_params = num_params;
    return GT_OK;
}

/* Elements of the staging buffer: only a host shadow of parameters in device memory (not the
 * host's) streams through one. */
static size_t staging_numel_of(gt_device device, int on_host, size_t total) {
    const gt_device_backend *dev = gt_device_backend_of(device);
    if (!on_host || !dev || dev->host_memory)
        return 0;
    return total < STAGING_NUMEL ? total : STAGING_NUMEL;
}

static gt_device pool_of(gt_device device, int on_host) { return on_host ? gt_pinned_device() : device; }

/* Bytes of the arena: the shadow, then the staging buffer. */
static size_t arena_request(size_t total, size_t staging_numel) {
    return gt_align_up(total * sizeof(float)) + gt_align_up(staging_numel * sizeof(float));
}

gt_status gt_ema_plan(gt_device device, int on_host, size_t total_numel, gt_device *pool, size_t *bytes) {
    if (device.kind == GT_DEVICE_PINNED)
        return GT_FAIL(GT_ERR_VALUE, "device: parameters must be on 'cpu', 'cuda:N' or 'sim:N', not 'pinned'");
    GT_TRY(gt_size_check(gt_size_mul_sat(total_numel, 2 * sizeof(float)), "params"));
    *pool = pool_of(device, on_host);
    *bytes = gt_block_reserved_bytes(arena_request(total_numel, staging_numel_of(device, on_host, total_numel)));
    return GT_OK;
}

static gt_status create_arena(gt_ema *ema) {
    ema->staging_numel = staging_numel_of(ema->device, ema->on_host, ema->total);
    size_t shadow_bytes = ema->total * sizeof(float), staging_bytes = ema->staging_numel * sizeof(float);
    GT_TRY(gt_arena_create(&ema->arena, pool_of(ema->device, ema->on_host),
                           arena_request(ema->total, ema->staging_numel)));
    void *piece = NULL;
    if (shadow_bytes) {
        GT_TRY(gt_arena_take(&ema->arena, shadow_bytes, &piece));
        ema->shadow = piece;
    }
    if (staging_bytes) {
        GT_TRY(gt_arena_take(&ema->arena, staging_bytes, &piece));
        ema->staging = piece;
    }
    return GT_OK;
}

static gt_status build(gt_ema *ema, float *const *params, const size_t *numels, size_t num_params) {
    GT_TRY(allocate(ema, num_params));
    for (size_t i = 0; i < num_params; i++) {
        if (numels[i] > 0 && !params[i])
            return GT_FAIL(GT_ERR_VALUE, "params[%zu]: NULL pointer", i);
        ema->numels[i] = numels[i];
        ema->total += numels[i];
    }
    GT_TRY(create_arena(ema));
    GT_TRY(build_runs(ema, params));
    if (ema->staging_numel && ema->staging_numel == ema->total)
        GT_TRY(ema->dev->event_create(ema->device.index, &ema->staged));
    for (size_t k = 0; k < ema->num_runs; k++)
        GT_TRY(gt_memcpy_blocking(ema->device, ema->runs[k].shadow, ema->runs[k].param,
                                  ema->runs[k].numel * sizeof(float)));
    return GT_OK;
}

gt_status gt_ema_create(gt_device device, int on_host, gt_stream *compute_stream, float *const *params,
                        const size_t *numels, size_t num_params, gt_ema **out) {
    *out = NULL;
    if (device.kind == GT_DEVICE_PINNED)
        return GT_FAIL(GT_ERR_VALUE, "device: parameters must be on 'cpu', 'cuda:N' or 'sim:N', not 'pinned'");
    gt_ema *ema = calloc(1, sizeof *ema);
    if (!ema)
        return GT_FAIL(GT_ERR_OOM, "ema: out of host memory");
    ema->device = device;
    ema->on_host = on_host != 0;
    ema->compute_stream = compute_stream;
    gt_status status = gt_device_backend_get(device, "device", &ema->dev);
    if (status == GT_OK)
        status = build(ema, params, numels, num_params);
    if (status != GT_OK) {
        gt_ema_destroy(ema);
        return status;
    }
    *out = ema;
    return GT_OK;
}

void gt_ema_destroy(gt_ema *ema) {
    if (!ema)
        return;
    if (ema->staged) {  /* a pending copy must land before its staging is freed */
        if (ema->pending)
            (void)ema->dev->event_synchronize(ema->device.index, ema->staged);
        ema->dev->event_destroy(ema->device.index, ema->staged);
    }
    gt_arena_destroy(&ema->arena);
    free(ema->offsets);
    free(ema->numels);
    free(ema->runs);
    free(ema);
}

size_t gt_ema_bytes(const gt_ema *ema) { return ema->arena.block.bytes; }

/* ------------------------------------------------------------ device passes ------- */

/* Waits for the copy of a pending update's parameters into the staging buffer: normally done
 * already (the next training step's wait covered it), so the query costs no wait. */
static gt_status wait_staged(const gt_ema *ema) {
    int done = 0;
    GT_TRY(ema->dev->event_query(ema->device.index, ema->staged, &done));
    return done ? GT_OK : ema->dev->event_synchronize(ema->device.index, ema->staged);
}

/* Averages the staged parameters of a pending update into the shadow. */
static gt_status finish_pending(gt_ema *ema) {
    if (!ema->pending)
        return GT_OK;
    GT_TRY(wait_staged(ema));
    for (size_t k = 0; k < ema->num_runs; k++) {
        const ema_run *run = &ema->runs[k];
        gt_ema_cpu(run->shadow, ema->staging + run->work_begin, ema->pending_weight, run->numel);
    }
    ema->pending = 0;
    return GT_OK;
}

/* Host shadow whose parameters all fit the staging buffer: the update finishes the previous
 * one, then only queues the parameters' copy into the staging on the compute stream (behind
 * the step that wrote them) and leaves their average for later (the next update, or whatever
 * reads or changes the shadow), so it never waits for the device itself. */
static gt_status deferred_update(gt_ema *ema, float weight) {
    GT_TRY(finish_pending(ema));
    for (size_t k = 0; k < ema->num_runs; k++) {
        const ema_run *run = &ema->runs[k];
        GT_TRY(ema->dev->memcpy_async(ema->device.index, ema->compute_stream, ema->staging + run->work_begin,
                                      run->param, run->numel * sizeof(float)));
    }
    GT_TRY(ema->dev->event_record(ema->device.index, ema->staged, ema->compute_stream));
    ema->pending = 1;
    ema->pending_weight = weight;
    return GT_OK;
}

/* Host shadow of device parameters: each chunk of parameters comes through the staging buffer. */
static gt_status staged_pass(gt_ema *ema, int swap, float weight) {
    if (ema->staged && !swap)
        return deferred_update(ema, weight);
    GT_TRY(finish_pending(ema));
    GT_TRY(settle(ema));
    for (size_t k = 0; k < ema->num_runs; k++) {
        const ema_run *run = &ema->runs[k];
        for (size_t first = 0; first < run->numel; first += ema->staging_numel) {
            size_t n = run->numel - first < ema->staging_numel ? run->numel - first : ema->staging_numel;
            size_t bytes = n * sizeof(float);
            GT_TRY(gt_memcpy_blocking(ema->device, ema->staging, run->param + first, bytes));
            if (swap) {
                GT_TRY(gt_memcpy_blocking(ema->device, run->param + first, run->shadow + first, bytes));
                memcpy(run->shadow + first, ema->staging, bytes);
            } else {
                gt_ema_cpu(run->shadow + first, ema->staging, weight, n);
            }
        }
    }
    return GT_OK;
}

/* The average (or, with `swap`, the exchange) of every run, by the device's kernels. */
static gt_status run(gt_ema *ema, int swap, float weight) {
    if (ema->staging_numel)
        return staged_pass(ema, swap, weight);
    for (size_t k = 0; k < ema->num_runs; k++) {
        const ema_run *run = &ema->runs[k];
        if (swap)
            GT_TRY(ema->dev->ema_swap(ema->device.index, ema->compute_stream, run->shadow, run->param, run->numel));
        else
            GT_TRY(ema->dev->ema(ema->device.index, ema->compute_stream, run->shadow, run->param, weight,
                                 run->numel));
    }
    return GT_OK;
}

gt_status gt_ema_update(gt_ema *ema, double decay) {
    if (!(decay >= 0.0 && decay <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "decay: must be in [0, 1], got %g", decay);
    return run(ema, 0, (float)(1.0 - decay));
}

gt_status gt_ema_swap(gt_ema *ema) { return run(ema, 1, 0.0f); }

gt_status gt_ema_copy_to_params(gt_ema *ema) {
    GT_TRY(finish_pending(ema));
    GT_TRY(settle(ema));
    for (size_t k = 0; k < ema->num_runs; k++)
        GT_TRY(gt_memcpy_blocking(ema->device, ema->runs[k].param, ema->runs[k].shadow,
                                  ema->runs[k].numel * sizeof(float)));
    return GT_OK;
}

static gt_status transfer(const gt_ema *ema, size_t index, float *host, int to_shadow) {
    if (index >= ema->num_params)
        return GT_FAIL(GT_ERR_INDEX, "index: parameter %zu out of range (%zu parameters)", index, ema->num_params);
    GT_TRY(settle(ema));
    float *shadow = ema->shadow + ema->offsets[index];
    size_t bytes = ema->numels[index] * sizeof(float);
    gt_device where = ema->on_host ? gt_cpu_device() : ema->device;
    return to_shadow ? gt_memcpy_blocking(where, shadow, host, bytes) : gt_memcpy_blocking(where, host, shadow, bytes);
}

gt_status gt_ema_read(const gt_ema *ema, size_t index, float *host) {
    GT_TRY(transfer(ema, index, host, 0));  /* its settle also waited for a pending copy */
    if (!ema->pending || ema->numels[index] == 0)
        return GT_OK;
    /* the shadow as the pending update leaves it: the same lerp */
    gt_ema_cpu(host, ema->staging + ema->offsets[index], ema->pending_weight, ema->numels[index]);
    return GT_OK;
}

gt_status gt_ema_write(gt_ema *ema, size_t index, const float *host) {
    GT_TRY(finish_pending(ema));
    return transfer(ema, index, (float *)host, 1);
}
