#include "core/alloc.h"

#include "core/device_backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gt_pool {
    gt_mem_stats stats;     /* accounting of this pool */
    pthread_mutex_t lock;   /* guards stats */
} gt_pool;

static gt_pool cpu_pool = {.stats.limit = GT_NO_LIMIT, .lock = PTHREAD_MUTEX_INITIALIZER};
static gt_pool pinned_pool = {.stats.limit = GT_NO_LIMIT, .lock = PTHREAD_MUTEX_INITIALIZER};
static gt_pool device_pools[GT_DEVICE_SIM + 1][GT_MAX_CUDA_DEVICES];  /* by kind, then index */
static pthread_once_t device_pools_once = PTHREAD_ONCE_INIT;

static void init_device_pools(void) {
    for (int k = 0; k <= GT_DEVICE_SIM; k++)
        for (int i = 0; i < GT_MAX_CUDA_DEVICES; i++) {
            device_pools[k][i].stats.limit = GT_NO_LIMIT;
            pthread_mutex_init(&device_pools[k][i].lock, NULL);
        }
}

/* The pool of an accelerator: its backend must be in this build and know the index. */
static gt_status device_pool_of(gt_device device, gt_pool **out) {
    const gt_device_backend *table = gt_device_backend_of(device);
    if (device.index < 0 || device.index >= GT_MAX_CUDA_DEVICES || !table ||
        device.index >= table->device_count()) {
        char name[32];
        gt_device_name(device, name, sizeof name);
        return GT_FAIL(GT_ERR_RUNTIME, "device '%s' is not available", name);
    }
    pthread_once(&device_pools_once, init_device_pools);
    *out = &device_pools[device.kind][device.index];
    return GT_OK;
}

/* fork() copies only the forking thread: the host pools' locks are taken around it, so a
 * DataLoader worker forked while another thread allocated can still allocate. */
static void lock_host_pools(void) {
    pthread_mutex_lock(&cpu_pool.lock);
    pthread_mutex_lock(&pinned_pool.lock);
}

static void unlock_host_pools(void) {
    pthread_mutex_unlock(&pinned_pool.lock);
    pthread_mutex_unlock(&cpu_pool.lock);
}

static void lock_host_pools_around_fork(void) { pthread_atfork(lock_host_pools, unlock_host_pools, unlock_host_pools); }

static gt_status pool_of(gt_device device, gt_pool **out) {
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_once, lock_host_pools_around_fork);
    if (device.kind == GT_DEVICE_CPU) {
        *out = &cpu_pool;
        return GT_OK;
    }
    if (device.kind == GT_DEVICE_PINNED) {
        *out = &pinned_pool;
        return GT_OK;
    }
    if (gt_device_is_accelerator(device))
        return device_pool_of(device, out);
    return GT_FAIL(GT_ERR_VALUE, "unknown device kind %d", (int)device.kind);
}

/* Writes a byte count as "1.50 GiB (1610612736 bytes)". */
static void format_bytes(char *buf, size_t buf_bytes, size_t bytes) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        unit++;
    }
    snprintf(buf, buf_bytes, "%.2f %s (%zu bytes)", value, units[unit], bytes);
}

static gt_status refuse_over_limit(gt_device device, gt_pool *pool, size_t bytes) {
    char name[32], want[64], used[64], limit[64];
    gt_device_name(device, name, sizeof name);
    format_bytes(want, sizeof want, bytes);
    format_bytes(used, sizeof used, pool->stats.reserved);
    format_bytes(limit, sizeof limit, pool->stats.limit);
    pool->stats.num_ooms++;
    return GT_FAIL(GT_ERR_OOM,
                   "%s out of memory: tried to allocate %s; %s already reserved; limit %s. Use a "
                   "smaller batch or gradient checkpointing, free other gputrain objects, or raise "
                   "the limit (gputrain.set_memory_limit)", name, want, used, limit);
}

static gt_status refuse_by_system(gt_device device, gt_pool *pool, size_t bytes) {
    char name[32], want[64];
    gt_device_name(device, name, sizeof name);
    format_bytes(want, sizeof want, bytes);
    pthread_mutex_lock(&pool->lock);
    pool->stats.num_ooms++;
    pthread_mutex_unlock(&pool->lock);
    return GT_FAIL(GT_ERR_OOM, "%s out of memory: the system refused %s; use a smaller batch or "
                   "model, or free memory", name, want);
}

/* Reserves the bytes in the pool's books; refuses when over the limit. */
static gt_status pool_reserve(gt_device device, gt_pool *pool, size_t bytes) {
    size_t rounded = gt_block_reserved_bytes(bytes);
    gt_status status = GT_OK;
    pthread_mutex_lock(&pool->lock);
    gt_mem_stats *s = &pool->stats;
    if (rounded > s->limit || s->reserved > s->limit - rounded) {
        status = refuse_over_limit(device, pool, bytes);
    } else {
        s->allocated += bytes;
        s->reserved += rounded;
        s->num_allocs++;
        s->active_blocks++;
        if (s->allocated > s->peak_allocated)
            s->peak_allocated = s->allocated;
        if (s->reserved > s->peak_reserved)
            s->peak_reserved = s->reserved;
    }
    pthread_mutex_unlock(&pool->lock);
    return status;
}

/* Takes a reservation back out of the books (after a free, or a failed system allocation). */
static void pool_release(gt_pool *pool, size_t bytes, int count_as_free) {
    pthread_mutex_lock(&pool->lock);
    pool->stats.allocated -= bytes;
    pool->stats.reserved -= gt_block_reserved_bytes(bytes);
    pool->stats.active_blocks--;
    if (count_as_free)
        pool->stats.num_frees++;
    else
        pool->stats.num_allocs--;
    pthread_mutex_unlock(&pool->lock);
}

static void *host_aligned_alloc(size_t bytes) {
    return aligned_alloc(GT_ALIGN, gt_align_up(bytes));
}

/* Asks the system (or CUDA) for the memory of a reserved block. */
static gt_status system_alloc(gt_device device, gt_pool *pool, size_t bytes, gt_block *out) {
    out->pinned = 0;
    switch (device.kind) {
    case GT_DEVICE_CPU:
        out->ptr = host_aligned_alloc(bytes);
        break;
    case GT_DEVICE_PINNED:
        if (gt_cuda.host_alloc_pinned && gt_cuda.host_alloc_pinned(gt_align_up(bytes), &out->ptr) == GT_OK) {
            out->pinned = 1;
            break;
        }
        gt_clear_error();
        out->ptr = host_aligned_alloc(bytes);
        pthread_mutex_lock(&pool->lock);
        pool->stats.num_pin_fallbacks++;
        pthread_mutex_unlock(&pool->lock);
        break;
    default: {
        const gt_device_backend *table = gt_device_backend_of(device);  /* checked by pool_of */
        gt_status status = table->malloc(device.index, gt_align_up(bytes), &out->ptr);
        if (status != GT_OK && status != GT_ERR_OOM)
            return status;
        if (status == GT_ERR_OOM)
            out->ptr = NULL;
        break;
    }
    }
    return out->ptr ? GT_OK : refuse_by_system(device, pool, bytes);
}

gt_status gt_block_alloc(gt_device device, size_t bytes, gt_block *out) {
    memset(out, 0, sizeof *out);
    if (bytes == 0)
        return GT_FAIL(GT_ERR_VALUE, "cannot allocate a block of 0 bytes");
    GT_TRY(gt_size_check(bytes, "allocation"));
    gt_pool *pool = NULL;
    GT_TRY(pool_of(device, &pool));
    GT_TRY(pool_reserve(device, pool, bytes));
    gt_status status = system_alloc(device, pool, bytes, out);
    if (status != GT_OK) {
        pool_release(pool, bytes, 0);
        memset(out, 0, sizeof *out);
        return status;
    }
    out->bytes = bytes;
    out->device = device;
    return GT_OK;
}

void gt_block_free(gt_block *block) {
    if (!block->ptr)
        return;
    gt_pool *pool = NULL;
    if (pool_of(block->device, &pool) != GT_OK)
        return;
    if (gt_device_is_accelerator(block->device))
        gt_device_backend_of(block->device)->free(block->device.index, block->ptr);
    else if (block->pinned)
        gt_cuda.host_free_pinned(block->ptr);
    else
        free(block->ptr);
    pool_release(pool, block->bytes, 1);
    memset(block, 0, sizeof *block);
}

gt_status gt_mem_get_stats(gt_device device, gt_mem_stats *out) {
    gt_pool *pool = NULL;
    GT_TRY(pool_of(device, &pool));
    pthread_mutex_lock(&pool->lock);
    *out = pool->stats;
    pthread_mutex_unlock(&pool->lock);
    return GT_OK;
}

gt_status gt_mem_set_limit(gt_device device, size_t limit) {
    gt_pool *pool = NULL;
    GT_TRY(pool_of(device, &pool));
    pthread_mutex_lock(&pool->lock);
    pool->stats.limit = limit;
    pthread_mutex_unlock(&pool->lock);
    return GT_OK;
}

gt_status gt_mem_set_fraction(gt_device device, double fraction) {
    if (!(fraction > 0.0 && fraction <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "fraction must be in (0, 1], got %g", fraction);
    size_t total = 0;
    GT_TRY(gt_device_total_memory(device, &total));
    return gt_mem_set_limit(device, (size_t)((double)total * fraction));
}

gt_status gt_mem_reset_peak(gt_device device) {
    gt_pool *pool = NULL;
    GT_TRY(pool_of(device, &pool));
    pthread_mutex_lock(&pool->lock);
    pool->stats.peak_allocated = pool->stats.allocated;
    pool->stats.peak_reserved = pool->stats.reserved;
    pthread_mutex_unlock(&pool->lock);
    return GT_OK;
}

gt_status gt_size_check(size_t bytes, const char *what) {
    if (bytes <= GT_MAX_BYTES)
        return GT_OK;
    return GT_FAIL(GT_ERR_OOM,
                   "%s: the size overflows (more than %zu bytes, beyond any address space); "
                   "use smaller sizes", what, GT_MAX_BYTES);
}

gt_status gt_size_mul(size_t a, size_t b, const char *what, size_t *out) {
    size_t product = gt_size_mul_sat(a, b);
    GT_TRY(gt_size_check(product, what));
    *out = product;
    return GT_OK;
}

gt_status gt_size_add(size_t a, size_t b, const char *what, size_t *out) {
    size_t sum = gt_size_add_sat(a, b);
    GT_TRY(gt_size_check(sum, what));
    *out = sum;
    return GT_OK;
}

gt_status gt_size_align(size_t a, const char *what, size_t *out) {
    size_t aligned = gt_align_up(a);
    GT_TRY(gt_size_check(aligned, what));
    *out = aligned;
    return GT_OK;
}

gt_status gt_arena_create(gt_arena *arena, gt_device device, size_t bytes) {
    memset(arena, 0, sizeof *arena);
    arena->block.device = device;
    if (bytes == 0)
        return GT_OK;
    return gt_block_alloc(device, bytes, &arena->block);
}

gt_status gt_arena_take(gt_arena *arena, size_t bytes, void **out) {
    size_t rounded = gt_align_up(bytes);
    if (rounded > arena->block.bytes - arena->used || (bytes > 0 && !arena->block.ptr))
        return GT_FAIL(GT_ERR_RUNTIME,
                       "arena plan exceeded: %zu bytes requested, %zu of %zu bytes used", bytes,
                       arena->used, arena->block.bytes);
    *out = (char *)arena->block.ptr + arena->used;
    arena->used += rounded;
    return GT_OK;
}

void gt_arena_destroy(gt_arena *arena) {
    gt_block_free(&arena->block);
    arena->used = 0;
}
