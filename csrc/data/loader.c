#include "data/loader.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { GT_LOADER_MESSAGE_BYTES = 1024 };

typedef struct gt_worker {
    gt_loader *loader;   /* the loader it gathers for */
    size_t id;           /* 0 .. num_workers - 1 */
    int64_t *rows;       /* (max_batch_rows,) row indices of the batch being gathered */
    pthread_t thread;    /* the thread, valid when started */
    int started;         /* 1 once pthread_create succeeded */
    int exited;          /* 1 once the thread is past its last use of the loader but its
                            reference (lock held) */
    int detached;        /* 1 when shutdown detached it instead of joining (it was in a hook) */
} gt_worker;

struct gt_loader {
    gt_field *fields;             /* (num_fields,) copy of the configuration's table */
    size_t num_fields;            /* arrays per sample */
    size_t max_batch_rows;        /* rows a slot holds */
    size_t slot_bytes;            /* bytes of one slot */
    size_t num_workers;           /* worker threads */
    size_t depth;                 /* batches claimed and not yet delivered, at most */
    int in_order;                 /* deliver in batch order */
    gt_device slot_device;        /* pool of the slots: cpu or pinned */
    gt_loader_hooks hooks;        /* callbacks into the bindings */

    pthread_mutex_t lock;         /* guards every field below */
    pthread_cond_t work_cv;       /* workers: a batch can be claimed, or stop */
    pthread_cond_t ready_cv;      /* caller: a batch is ready, a gather finished, or failure */

    gt_slot **slots;              /* (num_slots,) each slot allocated on its own */
    size_t num_slots;             /* slots allocated */
    size_t slots_capacity;        /* entries of `slots` */
    size_t initial_slots;         /* slots allocated at creation */

    gt_batch_plan plan;           /* the epoch; its arrays point into the blocks below */
    gt_block plan_indices;        /* copy of plan.sampler.indices */
    gt_block plan_offsets;        /* copy of plan.batch_offsets */
    size_t *done;                 /* (num_done,) sorted batches to skip, malloc'd */
    size_t num_done;              /* entries of `done` */
    uint64_t generation;          /* bumped by each epoch start: older claims are stale */
    int running;                  /* 1 while an epoch is active */
    size_t next_claim;            /* next batch a worker may claim */
    size_t claim_cursor;          /* entries of `done` passed by next_claim */
    size_t next_deliver;          /* next batch to deliver in order */
    size_t deliver_cursor;        /* entries of `done` passed by next_deliver */
    size_t remaining;             /* batches of the epoch not yet delivered */
    size_t in_flight;             /* claimed in this generation, not yet delivered */
    size_t filling;               /* slots being gathered, any generation */
    gt_status failure;            /* first failure of the epoch, GT_OK if none */
    int broken;                   /* 1 once a worker failed to start: failures outlive epochs */
    char failure_message[GT_LOADER_MESSAGE_BYTES]; /* its message */

    int stop;                     /* 1 once the workers were asked to stop */
    int joining;                  /* 1 once a thread began joining them */
    int joined;                   /* 1 once the workers are joined or detached */
    size_t live_workers;          /* worker threads started and not exited; each holds a ref */
    int released;                 /* 1 once the owner dropped its reference */
    gt_worker *workers;           /* (num_workers,) */
    gt_block rows_block;          /* the row-index buffers below: caller's, then each worker's */
    int64_t *caller_rows;         /* (max_batch_rows,) row indices when gathering in the caller */
    int caller_gathering;         /* 1 while a caller gathers into caller_rows: callers of
                                     gt_loader_next in other threads wait their turn */

    size_t refs;                  /* the owner's (until released) + caller slot references +
                                     running worker threads */
    size_t batches_gathered;      /* statistics since creation */
    size_t bytes_gathered;        /* bytes copied into slots since creation */
};

static void destroy(gt_loader *l);
static struct timespec deadline_after(double seconds);

/* ---- slots ------------------------------------------------------------------------------ */

/* Bytes requested for a slot of `slot_bytes` (a block is never empty). */
static size_t slot_request(size_t slot_bytes) { return slot_bytes ? slot_bytes : 1; }

static gt_status slot_new(gt_loader *l, gt_slot **out) {
    if (l->num_slots == l->slots_capacity) {
        size_t capacity = l->slots_capacity ? 2 * l->slots_capacity : 8;
        gt_slot **grown = realloc(l->slots, capacity * sizeof *grown);
        if (!grown)
            return GT_FAIL(GT_ERR_OOM, "loader: no memory for %zu slot entries", capacity);
        l->slots = grown;
        l->slots_capacity = capacity;
    }
    gt_slot *slot = calloc(1, sizeof *slot);
    size_t *widths = calloc(l->num_fields ? l->num_fields : 1, sizeof *widths);
    if (!slot || !widths) {
        free(slot);
        free(widths);
        return GT_FAIL(GT_ERR_OOM, "loader: no memory for a slot");
    }
    gt_status status = gt_block_alloc(l->slot_device, slot_request(l->slot_bytes), &slot->block);
    if (status != GT_OK) {
        free(slot);
        free(widths);
        return status;
    }
    slot->widths = widths;
    l->slots[l->num_slots++] = slot;
    *out = slot;
    return GT_OK;
}

/* A FREE slot, allocating one more when none is (lock held): only when the caller keeps more than
 * the 2 delivered slots initial_slots_of counts. */
static gt_status slot_take(gt_loader *l, gt_slot **out) {
    for (size_t i = 0; i < l->num_slots; i++) {
        if (l->slots[i]->state == GT_SLOT_FREE) {
            *out = l->slots[i];
            return GT_OK;
        }
    }
    return slot_new(l, out);
}

/* Drops one reference (lock held); the slot becomes FREE with the last. */
static void slot_unref_locked(gt_loader *l, gt_slot *slot) {
    if (--slot->refs > 0)
        return;
    slot->state = GT_SLOT_FREE;
    if (l->released)
        gt_block_free(&slot->block);
    pthread_cond_broadcast(&l->work_cv);
}

/* ---- the epoch's bookkeeping (lock held) ---------------------------------------------- */

/* The first batch >= b not in `done`, moving `cursor` past the entries below it. */
static size_t skip_done(const gt_loader *l, size_t *cursor, size_t b) {
    while (*cursor < l->num_done && l->done[*cursor] < b)
        (*cursor)++;
    while (*cursor < l->num_done && l->done[*cursor] == b) {
        b++;
        (*cursor)++;
    }
    return b;
}

static int can_claim(const gt_loader *l) {
    return l->running && l->failure == GT_OK && l->in_flight < l->depth &&
           l->next_claim < l->plan.num_batches;
}

/* Claims the next batch into a slot. */
static gt_status claim(gt_loader *l, gt_slot **out) {
    gt_slot *slot;
    GT_TRY(slot_take(l, &slot));
    slot->state = GT_SLOT_FILLING;
    slot->refs = 1;
    slot->batch = l->next_claim;
    slot->generation = l->generation;
    slot->user = NULL;
    l->next_claim = skip_done(l, &l->claim_cursor, l->next_claim + 1);
    l->in_flight++;
    l->filling++;
    *out = slot;
    return GT_OK;
}

/* Keeps the first failure of the epoch with this thread's message, and wakes everyone. */
static void record_failure(gt_loader *l, gt_status status) {
    if (l->failure == GT_OK) {
        l->failure = status;
        snprintf(l->failure_message, sizeof l->failure_message, "%s", gt_error_message());
    }
    pthread_cond_broadcast(&l->ready_cv);
    pthread_cond_broadcast(&l->work_cv);
}

/* Gathers a claimed batch (no lock held): the plan cannot change while `filling` > 0.
 * Returns the bytes written. */
static size_t gather(gt_loader *l, gt_slot *slot, int64_t *rows) {
    slot->rows = gt_batch_plan_rows(&l->plan, slot->batch, rows);
    return gt_gather_rows(l->fields, l->num_fields, rows, slot->rows, (char *)slot->block.ptr,
                          slot->widths);
}

/* Drops a slot's undelivered batch; unlocks around the hook that releases its user object. */
static void discard(gt_loader *l, gt_slot *slot) {
    void *user = slot->user;
    slot->user = NULL;
    slot->state = GT_SLOT_DELIVERED;  /* out of every search while unlocked */
    if (user && l->hooks.release_user) {
        pthread_mutex_unlock(&l->lock);
        l->hooks.release_user(l->hooks.ctx, user);
        pthread_mutex_lock(&l->lock);
    }
    slot_unref_locked(l, slot);
}

/* Ends the epoch in progress: waits for in-flight gathers, drops undelivered batches. Once the
 * workers are joined or detached, a detached worker's gather (at most one each) is not waited
 * for: it is dropped when its hook returns, as its generation is stale. */
static void cancel_locked(gt_loader *l) {
    l->generation++;
    l->running = 0;
    while (l->filling > (l->joined ? l->live_workers : 0))
        pthread_cond_wait(&l->ready_cv, &l->lock);
    for (;;) {
        gt_slot *ready = NULL;
        for (size_t i = 0; i < l->num_slots && !ready; i++)
            if (l->slots[i]->state == GT_SLOT_READY)
                ready = l->slots[i];
        if (!ready)
            break;
        discard(l, ready);
    }
    l->in_flight = 0;
}

/* ---- workers ---------------------------------------------------------------------------- */

/* Marks a gathered slot READY, or drops it when its epoch was cancelled meanwhile. `filling`
 * drops last: a cancel waiting for it then finds a dropped slot FREE (discard unlocks around the
 * release_user hook), so the next epoch's claims never meet a slot still being dropped. */
static void finish_gather(gt_loader *l, gt_slot *slot, size_t bytes, gt_status status) {
    if (status != GT_OK)
        record_failure(l, status);
    if (slot->generation != l->generation || status != GT_OK) {
        if (slot->generation == l->generation)
            l->in_flight--;
        discard(l, slot);
    } else {
        slot->state = GT_SLOT_READY;
        l->batches_gathered++;
        l->bytes_gathered += bytes;
    }
    l->filling--;
    pthread_cond_broadcast(&l->ready_cv);
}

static void *worker_main(void *arg) {
    gt_worker *w = arg;
    gt_loader *l = w->loader;
    gt_status started = l->hooks.worker_start ? l->hooks.worker_start(l->hooks.ctx, w->id) : GT_OK;
    pthread_mutex_lock(&l->lock);
    if (started != GT_OK) {  /* this worker never gathers; every epoch reports the failure */
        l->broken = 1;
        record_failure(l, started);
    }
    while (started == GT_OK) {
        while (!l->stop && !can_claim(l))
            pthread_cond_wait(&l->work_cv, &l->lock);
        if (l->stop)
            break;
        gt_slot *slot;
        gt_status status = claim(l, &slot);
        if (status != GT_OK) {
            record_failure(l, status);
            continue;
        }
        pthread_mutex_unlock(&l->lock);
        size_t bytes = gather(l, slot, w->rows);
        status = l->hooks.batch_gathered ? l->hooks.batch_gathered(l->hooks.ctx, l, slot) : GT_OK;
        pthread_mutex_lock(&l->lock);
        finish_gather(l, slot, bytes, status);
    }
    pthread_mutex_unlock(&l->lock);
    if (l->hooks.worker_stop)
        l->hooks.worker_stop(l->hooks.ctx, w->id);
    pthread_mutex_lock(&l->lock);
    w->exited = 1;
    l->live_workers--;
    pthread_cond_broadcast(&l->ready_cv);
    int last = --l->refs == 0;  /* detached, and the owner and the slots are gone */
    pthread_mutex_unlock(&l->lock);
    if (last)
        destroy(l);
    return NULL;
}

/* Starts the workers with every signal blocked, so signals reach the Python main thread.
 * Each running worker holds a reference to the loader (taken here, dropped as it exits). */
static gt_status start_workers(gt_loader *l) {
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    gt_status status = GT_OK;
    for (size_t i = 0; i < l->num_workers && status == GT_OK; i++) {
        gt_worker *w = &l->workers[i];
        pthread_mutex_lock(&l->lock);
        l->refs++;
        l->live_workers++;
        pthread_mutex_unlock(&l->lock);
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            pthread_mutex_lock(&l->lock);
            l->refs--;
            l->live_workers--;
            pthread_mutex_unlock(&l->lock);
            status = GT_FAIL(GT_ERR_OS, "num_workers: starting worker thread %zu failed: %s", i,
                             strerror(rc));
        } else {
            w->started = 1;
        }
    }
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return status;
}

/* ---- creation and destruction -------------------------------------------------------- */

static void destroy(gt_loader *l) {
    for (size_t i = 0; i < l->num_slots; i++) {
        gt_block_free(&l->slots[i]->block);
        free(l->slots[i]->widths);
        free(l->slots[i]);
    }
    free(l->slots);
    gt_block_free(&l->plan_indices);
    gt_block_free(&l->plan_offsets);
    free(l->done);
    free(l->workers);
    gt_block_free(&l->rows_block);
    free(l->fields);
    pthread_cond_destroy(&l->work_cv);
    pthread_cond_destroy(&l->ready_cv);
    pthread_mutex_destroy(&l->lock);
    gt_loader_hooks hooks = l->hooks;
    free(l);
    if (hooks.release)
        hooks.release(hooks.ctx);
}

static gt_status init_sync(gt_loader *l) {
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return GT_FAIL(GT_ERR_OS, "loader: pthread_condattr_init failed");
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&l->lock, NULL) | pthread_cond_init(&l->work_cv, NULL) |
             pthread_cond_init(&l->ready_cv, &attr);
    pthread_condattr_destroy(&attr);
    return rc ? GT_FAIL(GT_ERR_OS, "loader: initialising its mutex/condition variables failed")
              : GT_OK;
}

/* Bytes of one (max_batch_rows,) int64 row-index buffer (*stride, GT_ALIGN-rounded) and of the
 * block that holds the caller's and every worker's (*total). */
static gt_status rows_bytes(const gt_loader_config *c, size_t *stride, size_t *total) {
    GT_TRY(gt_size_mul(c->max_batch_rows ? c->max_batch_rows : 1, sizeof(int64_t), "max_batch_rows", stride));
    GT_TRY(gt_size_align(*stride, "max_batch_rows", stride));
    return gt_size_mul(*stride, gt_size_add_sat(c->num_workers, 1), "max_batch_rows", total);
}

/* Allocates the tables and scratch buffers sized by the configuration. */
static gt_status init_tables(gt_loader *l, const gt_loader_config *c) {
    size_t stride = 0, total = 0;
    GT_TRY(rows_bytes(c, &stride, &total));
    l->fields = malloc((c->num_fields ? c->num_fields : 1) * sizeof *l->fields);
    l->workers = calloc(c->num_workers ? c->num_workers : 1, sizeof *l->workers);
    if (!l->fields || !l->workers)
        return GT_FAIL(GT_ERR_OOM, "loader: no memory for its tables");
    GT_TRY(gt_block_alloc(gt_cpu_device(), total, &l->rows_block));
    l->caller_rows = l->rows_block.ptr;
    memcpy(l->fields, c->fields, c->num_fields * sizeof *l->fields);
    for (size_t i = 0; i < c->num_workers; i++)
        l->workers[i] = (gt_worker){.loader = l, .id = i,
                                    .rows = (int64_t *)((char *)l->rows_block.ptr + (i + 1) * stride)};
    GT_TRY(gt_fields_layout(l->fields, l->num_fields, c->max_batch_rows, &l->slot_bytes));
    for (size_t i = 0; i < l->initial_slots; i++) {
        gt_slot *slot;
        GT_TRY(slot_new(l, &slot));
    }
    return GT_OK;
}

static gt_status check_config(const gt_loader_config *c) {
    if (c->num_workers > 0 && c->prefetch_factor == 0)
        return GT_FAIL(GT_ERR_VALUE, "prefetch_factor must be >= 1 with worker threads, got 0");
    return GT_OK;
}

static gt_device slot_pool_of(const gt_loader_config *c) {
    return c->pin_memory ? gt_pinned_device() : gt_cpu_device();
}

/* Slots made at creation, and all a loader ever has while its caller references at most 2
 * delivered slots. The bound: a slot is FREE, claimed (FILLING or READY: at most depth =
 * num_workers * prefetch_factor, as a worker claims only while in_flight < depth, and a cancelled
 * epoch's claims are all dropped before the next epoch's begin, see finish_gather) or delivered and
 * referenced (at most 2); a claim thus finds at most depth - 1 + 2 of depth + 2 slots taken. A
 * `for` loop over host batches references 2 (the batch in hand while the next is delivered); a
 * device loader's caller references the one delivered until it submits it, and its transfer 1 once
 * a submit returns (transfer.c's reclaim_all), 2 as well. A caller that keeps more host batches
 * alive makes slot_take allocate more (counted by the allocator, never planned). */
static size_t initial_slots_of(const gt_loader_config *c) { return c->num_workers * c->prefetch_factor + 2; }

gt_status gt_loader_plan(const gt_loader_config *c, gt_loader_memory *out) {
    memset(out, 0, sizeof *out);
    GT_TRY(check_config(c));
    gt_field *fields = malloc((c->num_fields ? c->num_fields : 1) * sizeof *fields);
    if (!fields)
        return GT_FAIL(GT_ERR_OOM, "loader: no memory for its field table");
    memcpy(fields, c->fields, c->num_fields * sizeof *fields);
    size_t slot_bytes = 0;
    gt_status status = gt_fields_layout(fields, c->num_fields, c->max_batch_rows, &slot_bytes);
    free(fields);
    GT_TRY(status);
    size_t stride = 0, rows = 0, depth = 0;
    GT_TRY(rows_bytes(c, &stride, &rows));
    GT_TRY(gt_size_mul(c->num_workers, c->prefetch_factor, "num_workers * prefetch_factor", &depth));
    GT_TRY(gt_size_add(depth, 2, "num_workers * prefetch_factor", &depth));  /* initial_slots_of fits */
    out->pool = slot_pool_of(c);
    out->num_slots = initial_slots_of(c);
    out->slot_bytes = slot_request(slot_bytes);
    out->index_bytes = gt_block_reserved_bytes(rows);
    return gt_size_mul(out->num_slots, gt_block_reserved_bytes(out->slot_bytes), "loader slots", &out->bytes);
}

gt_status gt_loader_create(const gt_loader_config *c, gt_loader **out) {
    gt_status status = check_config(c);
    gt_loader *l = status == GT_OK ? calloc(1, sizeof *l) : NULL;
    if (status == GT_OK && !l)
        status = GT_FAIL(GT_ERR_OOM, "loader: no memory for its state");
    if (status != GT_OK) {
        if (c->hooks.release)
            c->hooks.release(c->hooks.ctx);
        return status;
    }
    l->num_fields = c->num_fields;
    l->max_batch_rows = c->max_batch_rows;
    l->num_workers = c->num_workers;
    l->depth = c->num_workers * c->prefetch_factor;
    l->in_order = c->in_order;
    l->slot_device = slot_pool_of(c);
    l->hooks = c->hooks;
    l->initial_slots = initial_slots_of(c);
    l->refs = 1;
    status = init_sync(l);
    if (status != GT_OK) {
        free(l);
        if (c->hooks.release)
            c->hooks.release(c->hooks.ctx);
        return status;
    }
    status = init_tables(l, c);
    if (status == GT_OK)
        status = start_workers(l);
    if (status != GT_OK) {
        gt_loader_release(l);
        return status;
    }
    *out = l;
    return GT_OK;
}

void gt_loader_request_stop(gt_loader *l) {
    pthread_mutex_lock(&l->lock);
    l->stop = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_cond_broadcast(&l->ready_cv);
    pthread_mutex_unlock(&l->lock);
}

/* Waits until no worker thread runs, for at most `seconds` (< 0: without limit), lock held.
 * Returns 1 when none runs. */
static int wait_stopped_locked(gt_loader *l, double seconds) {
    struct timespec deadline = deadline_after(seconds > 0 ? seconds : 0);
    while (l->live_workers > 0) {
        if (seconds < 0)
            pthread_cond_wait(&l->ready_cv, &l->lock);
        else if (pthread_cond_timedwait(&l->ready_cv, &l->lock, &deadline) == ETIMEDOUT)
            break;
    }
    return l->live_workers == 0;
}

int gt_loader_wait_stopped(gt_loader *l, double seconds) {
    pthread_mutex_lock(&l->lock);
    int stopped = wait_stopped_locked(l, seconds);
    pthread_mutex_unlock(&l->lock);
    return stopped;
}

/* Marks the workers still running as detached (lock held); returns how many. */
static size_t mark_detached_locked(gt_loader *l) {
    size_t count = 0;
    for (size_t i = 0; l->workers && i < l->num_workers; i++) {
        gt_worker *w = &l->workers[i];
        w->detached = w->started && !w->exited;
        count += (size_t)w->detached;
    }
    return count;
}

size_t gt_loader_shutdown_within(gt_loader *l, double seconds) {
    pthread_mutex_lock(&l->lock);
    if (l->joining) {  /* another thread is joining, or did */
        while (!l->joined)
            pthread_cond_wait(&l->ready_cv, &l->lock);
        pthread_mutex_unlock(&l->lock);
        return 0;
    }
    l->joining = 1;
    l->stop = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_cond_broadcast(&l->ready_cv);
    wait_stopped_locked(l, seconds);
    size_t detached = mark_detached_locked(l);
    pthread_mutex_unlock(&l->lock);
    /* The owner's reference is held until this returns, so a detached worker that exits now
     * cannot free l->workers under this loop. */
    for (size_t i = 0; l->workers && i < l->num_workers; i++) {
        gt_worker *w = &l->workers[i];
        if (w->started && w->detached)
            pthread_detach(w->thread);
        else if (w->started)
            pthread_join(w->thread, NULL);
    }
    pthread_mutex_lock(&l->lock);
    l->joined = 1;
    cancel_locked(l);
    pthread_cond_broadcast(&l->ready_cv);
    pthread_mutex_unlock(&l->lock);
    return detached;
}

void gt_loader_shutdown(gt_loader *l) { gt_loader_shutdown_within(l, -1.0); }

void gt_loader_release(gt_loader *l) {
    gt_loader_shutdown(l);
    pthread_mutex_lock(&l->lock);
    l->released = 1;
    for (size_t i = 0; i < l->num_slots; i++)  /* held slots go when their views do */
        if (l->slots[i]->state == GT_SLOT_FREE)
            gt_block_free(&l->slots[i]->block);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&l->lock);
    if (last)
        destroy(l);
}

/* ---- epochs ------------------------------------------------------------------------------ */

/* Copies `count` int64 values into an accounted block (emptied when count is 0). */
static gt_status copy_int64(const int64_t *values, size_t count, gt_block *out) {
    *out = (gt_block){0};
    if (count == 0)
        return GT_OK;
    GT_TRY(gt_block_alloc(gt_cpu_device(), count * sizeof(int64_t), out));
    memcpy(out->ptr, values, count * sizeof(int64_t));
    return GT_OK;
}

/* Owned copies of the plan's arrays and of `done`, made before taking the lock. */
typedef struct epoch_copy {
    gt_batch_plan plan;   /* the plan, pointing into the blocks below */
    gt_block indices;     /* copy of plan.sampler.indices */
    gt_block offsets;     /* copy of plan.batch_offsets */
    size_t *done;         /* copy of the skipped batches, malloc'd */
} epoch_copy;

static gt_status copy_epoch(const gt_batch_plan *plan, const size_t *done, size_t num_done,
                            epoch_copy *out) {
    *out = (epoch_copy){.plan = *plan};
    const gt_sampler *s = &plan->sampler;
    gt_status status = copy_int64(s->kind == GT_ORDER_ARRAY ? s->indices : NULL,
                                  s->kind == GT_ORDER_ARRAY ? (size_t)s->base_length : 0,
                                  &out->indices);
    if (status == GT_OK && plan->batch_offsets)
        status = copy_int64(plan->batch_offsets, plan->num_batches + 1, &out->offsets);
    if (status == GT_OK && num_done > 0) {
        out->done = malloc(num_done * sizeof *done);
        if (out->done)
            memcpy(out->done, done, num_done * sizeof *done);
        else
            status = GT_FAIL(GT_ERR_OOM, "loader: no memory for %zu skipped batches", num_done);
    }
    if (status != GT_OK) {
        gt_block_free(&out->indices);
        gt_block_free(&out->offsets);
        return status;
    }
    out->plan.sampler.indices = out->indices.ptr;
    out->plan.batch_offsets = out->offsets.ptr;
    return GT_OK;
}

static gt_status check_epoch(const gt_loader *l, const gt_batch_plan *plan, size_t start_batch,
                             const size_t *done, size_t num_done) {
    if (plan->max_batch_rows > l->max_batch_rows)
        return GT_FAIL(GT_ERR_VALUE, "batch_size: batches of %zu rows exceed the %zu of a slot",
                       plan->max_batch_rows, l->max_batch_rows);
    if (start_batch > plan->num_batches)
        return GT_FAIL(GT_ERR_VALUE, "batches_yielded: %zu is beyond the %zu batches of an epoch",
                       start_batch, plan->num_batches);
    for (size_t i = 0; i < num_done; i++)
        if (done[i] < start_batch || done[i] >= plan->num_batches || (i > 0 && done[i] <= done[i - 1]))
            return GT_FAIL(GT_ERR_VALUE, "done: batch %zu is not a sorted batch in [%zu, %zu)",
                           done[i], start_batch, plan->num_batches);
    return GT_OK;
}

gt_status gt_loader_start_epoch(gt_loader *l, const gt_batch_plan *plan, size_t start_batch,
                                const size_t *done, size_t num_done) {
    GT_TRY(check_epoch(l, plan, start_batch, done, num_done));
    epoch_copy copy;
    GT_TRY(copy_epoch(plan, done, num_done, &copy));
    pthread_mutex_lock(&l->lock);
    if (l->stop) {
        pthread_mutex_unlock(&l->lock);
        gt_block_free(&copy.indices);
        gt_block_free(&copy.offsets);
        free(copy.done);
        return GT_FAIL(GT_ERR_RUNTIME, "loader: the loader was shut down");
    }
    cancel_locked(l);
    epoch_copy old = {.indices = l->plan_indices, .offsets = l->plan_offsets, .done = l->done};
    l->plan = copy.plan;
    l->plan_indices = copy.indices;
    l->plan_offsets = copy.offsets;
    l->done = copy.done;
    l->num_done = num_done;
    l->claim_cursor = l->deliver_cursor = 0;
    l->next_claim = skip_done(l, &l->claim_cursor, start_batch);
    l->next_deliver = skip_done(l, &l->deliver_cursor, start_batch);
    l->remaining = plan->num_batches - start_batch - num_done;
    if (!l->broken)
        l->failure = GT_OK;
    l->running = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->lock);
    gt_block_free(&old.indices);
    gt_block_free(&old.offsets);
    free(old.done);
    return GT_OK;
}

/* ---- delivery ---------------------------------------------------------------------------- */

/* The READY slot to deliver next: the next batch in order, or the lowest batch ready. */
static gt_slot *find_ready(const gt_loader *l) {
    gt_slot *best = NULL;
    for (size_t i = 0; i < l->num_slots; i++) {
        gt_slot *slot = l->slots[i];
        if (slot->state != GT_SLOT_READY || slot->generation != l->generation)
            continue;
        if (l->in_order ? slot->batch == l->next_deliver : (!best || slot->batch < best->batch))
            best = slot;
        if (l->in_order && best)
            break;
    }
    return best;
}

/* Hands a slot to the caller: its pipeline reference becomes the caller's. */
static void deliver(gt_loader *l, gt_slot *slot) {
    slot->state = GT_SLOT_DELIVERED;
    l->in_flight--;
    l->remaining--;
    l->refs++;
    if (l->in_order)
        l->next_deliver = skip_done(l, &l->deliver_cursor, l->next_deliver + 1);
    pthread_cond_broadcast(&l->work_cv);
}

/* Replays the failure of a worker on the calling thread (lock held). */
static gt_status replay_failure(const gt_loader *l) {
    return gt_set_error(l->failure, __FILE__, __LINE__, "%s", l->failure_message);
}

/* num_workers == 0: claims and gathers the next batch on the calling thread; callers in several
 * threads take turns (one caller_rows buffer, batches delivered in order). */
static gt_status next_in_caller(gt_loader *l, gt_slot **out) {
    gt_slot *slot = NULL;
    pthread_mutex_lock(&l->lock);
    while (l->caller_gathering)
        pthread_cond_wait(&l->ready_cv, &l->lock);
    gt_status status = l->failure;
    if (status != GT_OK)
        status = replay_failure(l);
    else if (l->running && l->remaining > 0 && !l->stop)
        status = claim(l, &slot);
    l->caller_gathering = slot != NULL;
    pthread_mutex_unlock(&l->lock);
    if (status != GT_OK || !slot) {
        *out = NULL;
        return status;
    }
    size_t bytes = gather(l, slot, l->caller_rows);
    pthread_mutex_lock(&l->lock);
    l->caller_gathering = 0;
    l->filling--;
    pthread_cond_broadcast(&l->ready_cv);  /* a concurrent shutdown waits for filling == 0 */
    l->batches_gathered++;
    l->bytes_gathered += bytes;
    deliver(l, slot);
    pthread_mutex_unlock(&l->lock);
    *out = slot;
    return GT_OK;
}

static struct timespec deadline_after(double seconds) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double whole = (double)(time_t)seconds;
    t.tv_sec += (time_t)seconds;
    t.tv_nsec += (long)((seconds - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

gt_status gt_loader_next(gt_loader *l, double timeout_seconds, gt_slot **out) {
    if (l->num_workers == 0)
        return next_in_caller(l, out);
    struct timespec deadline = deadline_after(timeout_seconds > 0 ? timeout_seconds : 0);
    gt_status status = GT_OK;
    *out = NULL;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        if (l->failure != GT_OK) {
            status = replay_failure(l);
            break;
        }
        if (!l->running || l->remaining == 0 || l->stop)
            break;
        gt_slot *slot = find_ready(l);
        if (slot) {
            deliver(l, slot);
            *out = slot;
            break;
        }
        if (timeout_seconds <= 0) {
            pthread_cond_wait(&l->ready_cv, &l->lock);
        } else if (pthread_cond_timedwait(&l->ready_cv, &l->lock, &deadline) == ETIMEDOUT) {
            status = GT_FAIL(GT_ERR_TIMEOUT, "DataLoader timed out after %g seconds", timeout_seconds);
            break;
        }
    }
    pthread_mutex_unlock(&l->lock);
    return status;
}

void gt_loader_retain(gt_loader *l) {
    pthread_mutex_lock(&l->lock);
    l->refs++;
    pthread_mutex_unlock(&l->lock);
}

void gt_loader_unref(gt_loader *l) {
    pthread_mutex_lock(&l->lock);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&l->lock);
    if (last)
        destroy(l);
}

void gt_loader_slot_retain(gt_loader *l, gt_slot *slot) {
    pthread_mutex_lock(&l->lock);
    slot->refs++;
    l->refs++;
    pthread_mutex_unlock(&l->lock);
}

void gt_loader_slot_release(gt_loader *l, gt_slot *slot) {
    pthread_mutex_lock(&l->lock);
    slot_unref_locked(l, slot);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&l->lock);
    if (last)
        destroy(l);
}

char *gt_loader_slot_field(const gt_loader *l, const gt_slot *slot, size_t field) {
    return (char *)slot->block.ptr + l->fields[field].slot_offset;
}

size_t gt_loader_slot_width(const gt_slot *slot, size_t field) { return slot->widths[field]; }

size_t gt_loader_num_fields(const gt_loader *l) { return l->num_fields; }

size_t gt_loader_field_offset(const gt_loader *l, size_t field) { return l->fields[field].slot_offset; }

size_t gt_loader_slot_field_bytes(const gt_loader *l, const gt_slot *slot, size_t field) {
    const gt_field *f = &l->fields[field];
    return f->offsets ? slot->rows * slot->widths[field] * f->item_bytes : slot->rows * f->row_bytes;
}

void gt_loader_get_stats(gt_loader *l, gt_loader_stats *out) {
    pthread_mutex_lock(&l->lock);
    *out = (gt_loader_stats){.num_slots = l->num_slots, .initial_slots = l->initial_slots,
                             .slot_bytes = l->slot_bytes, .batches_gathered = l->batches_gathered,
                             .bytes_gathered = l->bytes_gathered,
                             .num_workers = l->joined ? 0 : l->num_workers};
    for (size_t i = 0; i < l->num_slots; i++)
        out->slots_pinned += l->slots[i]->block.pinned;
    pthread_mutex_unlock(&l->lock);
}
