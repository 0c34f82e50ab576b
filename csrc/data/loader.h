/* The loader engine: worker threads gather whole batches into slots of one accounted pool.
 *
 * Slots: depth + 2 are allocated when the loader is created (depth = num_workers x
 * prefetch_factor batches in flight; the caller holds one while the next is delivered, and a
 * device transfer (data/transfer.h) holds one once its submit returns); more are allocated only
 * when the caller keeps more batches alive, never by overwriting one (loader.c, initial_slots_of).
 * A slot is FREE, FILLING (a worker gathers into it), READY (gathered, not yet delivered)
 * or DELIVERED (referenced by the caller's views). It becomes FREE when its last reference
 * is released, so a batch the caller holds is never overwritten.
 *
 * Lifetime: the loader counts one reference for its owner, one per slot reference held by the
 * caller and one per worker thread still running; gt_loader_release() drops the owner's and the
 * memory (and the hooks' context, through hooks.release) goes with the last one. A worker that
 * does not stop within gt_loader_shutdown_within()'s bound (stuck in a hook) is detached: it
 * keeps the loader alive, drops its batch when the hook returns, and frees what is left if it
 * is the last holder.
 *
 * Threads: all waits are on one mutex and two condition variables; no lock is held while
 * gathering or inside a hook. With num_workers == 0 the caller gathers in gt_loader_next(). */
#ifndef GT_DATA_LOADER_H
#define GT_DATA_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "data/gather.h"
#include "data/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_loader gt_loader;

typedef enum gt_slot_state {
    GT_SLOT_FREE = 0,       /* holds nothing; may be filled */
    GT_SLOT_FILLING = 1,    /* a batch is being gathered into it */
    GT_SLOT_READY = 2,      /* gathered, waiting for delivery */
    GT_SLOT_DELIVERED = 3,  /* handed to the caller; FREE once its references are released */
} gt_slot_state;

typedef struct gt_slot {
    gt_block block;         /* the batch: field f's rows at fields[f].slot_offset */
    gt_slot_state state;    /* see gt_slot_state */
    size_t refs;            /* references: the pipeline's until delivery, then the caller's */
    size_t batch;           /* index of the batch in its epoch */
    size_t rows;            /* rows gathered (<= max_batch_rows) */
    size_t *widths;         /* (num_fields,) items per row of ragged fields in this batch */
    uint64_t generation;    /* the epoch run that claimed it */
    void *user;             /* object attached by the batch_gathered hook (opaque), or NULL */
} gt_slot;

/* Callbacks into the layer above (the bindings), all called with no loader lock held. */
typedef struct gt_loader_hooks {
    void *ctx;  /* passed back to every hook */
    /* In each worker thread before its first batch; a failure ends the epoch with it. */
    gt_status (*worker_start)(void *ctx, size_t worker);
    /* In each worker thread as it exits, after its last hook call. */
    void (*worker_stop)(void *ctx, size_t worker);
    /* In the worker after a gather; may set slot->user. A failure ends the epoch with it. */
    gt_status (*batch_gathered)(void *ctx, gt_loader *loader, gt_slot *slot);
    /* Drops a slot->user that will never be delivered (epoch cancelled or loader released). */
    void (*release_user)(void *ctx, void *user);
    /* Frees ctx when the loader is destroyed (the last reference, possibly a detached worker's),
     * or when gt_loader_create fails: the loader owns ctx from gt_loader_create on. */
    void (*release)(void *ctx);
} gt_loader_hooks;

typedef struct gt_loader_config {
    const gt_field *fields;   /* (num_fields,) the dataset's arrays; outlive the loader's threads */
    size_t num_fields;        /* arrays per sample */
    size_t max_batch_rows;    /* rows a slot can hold */
    size_t num_workers;       /* worker threads; 0 gathers in the calling thread */
    size_t prefetch_factor;   /* batches in flight per worker */
    int in_order;             /* 1: deliver batches in index order; 0: as they complete */
    int pin_memory;           /* 1: slots from the pinned pool (pageable fallback is counted) */
    gt_loader_hooks hooks;    /* optional callbacks; NULL members are skipped */
} gt_loader_config;

typedef struct gt_loader_stats {
    size_t num_slots;          /* slots allocated now */
    size_t initial_slots;      /* slots allocated at creation */
    size_t slot_bytes;         /* bytes of one slot */
    size_t slots_pinned;       /* slots in page-locked memory */
    size_t batches_gathered;   /* batches gathered since creation */
    size_t bytes_gathered;     /* bytes copied into slots since creation */
    size_t num_workers;        /* worker threads running */
} gt_loader_stats;

/* Copies the field table, allocates the initial slots and starts the worker threads. Takes
 * ownership of config->hooks.ctx (released through hooks.release, also when it fails). */
gt_status gt_loader_create(const gt_loader_config *config, gt_loader **out);

/* The slots gt_loader_create(config) allocates, before it runs. */
typedef struct gt_loader_memory {
    gt_device pool;     /* where the slots are: cpu, or pinned with pin_memory */
    size_t num_slots;   /* slots allocated at creation: num_workers * prefetch_factor + 2 */
    size_t slot_bytes;  /* bytes requested for one slot */
    size_t bytes;       /* what the allocator reserves for all of them */
    size_t index_bytes; /* what it reserves in the cpu pool for the row-index buffers of the
                           caller and the workers, (max_batch_rows,) int64 each */
} gt_loader_memory;

gt_status gt_loader_plan(const gt_loader_config *config, gt_loader_memory *out);

/* Starts an epoch of `plan` (copied, index arrays included), cancelling any epoch in progress:
 * undelivered batches are dropped after in-flight gathers finish. Batches below `start_batch`
 * and the (sorted, >= start_batch) batches in `done` are skipped without being gathered. */
gt_status gt_loader_start_epoch(gt_loader *loader, const gt_batch_plan *plan, size_t start_batch,
                                const size_t *done, size_t num_done);

/* Waits for the next batch (gathering it here when num_workers == 0). On success *out is the
 * slot with one reference for the caller, or NULL when the epoch has no batch left.
 * timeout_seconds <= 0 waits without limit; running out fails with GT_ERR_TIMEOUT. */
gt_status gt_loader_next(gt_loader *loader, double timeout_seconds, gt_slot **out);

/* Adds / drops a caller reference to a slot (a view of it is created / destroyed). Dropping
 * the last one frees the slot for reuse, and may free the loader after gt_loader_release. */
void gt_loader_slot_retain(gt_loader *loader, gt_slot *slot);
void gt_loader_slot_release(gt_loader *loader, gt_slot *slot);

/* Start of field `field`'s rows in a slot. */
char *gt_loader_slot_field(const gt_loader *loader, const gt_slot *slot, size_t field);

/* Items per row of ragged field `field` in the slot's batch (0 for a fixed field). */
size_t gt_loader_slot_width(const gt_slot *slot, size_t field);

/* Fields per sample, and where field `field` starts inside every slot. */
size_t gt_loader_num_fields(const gt_loader *loader);
size_t gt_loader_field_offset(const gt_loader *loader, size_t field);

/* Bytes the slot's batch fills in field `field`. */
size_t gt_loader_slot_field_bytes(const gt_loader *loader, const gt_slot *slot, size_t field);

/* Asks the workers to stop after their current batch and returns at once; waiting callers
 * return NULL. gt_loader_shutdown() (or gt_loader_release()) joins them later. */
void gt_loader_request_stop(gt_loader *loader);

/* Stops and joins the worker threads, dropping undelivered batches (idempotent). */
void gt_loader_shutdown(gt_loader *loader);

/* As gt_loader_shutdown, but waits at most `seconds` (< 0: without limit) for the workers to
 * stop; those still running then (inside a hook) are detached instead of joined. Returns the
 * number detached. Later shutdowns and the release return at once. */
size_t gt_loader_shutdown_within(gt_loader *loader, double seconds);

/* Waits up to `seconds` for every worker thread to have exited (after a stop request);
 * returns 1 when none is running. For a caller that waits in slices (to handle signals). */
int gt_loader_wait_stopped(gt_loader *loader, double seconds);

/* Shuts down and drops the owner's reference; memory goes when no slot is referenced. */
void gt_loader_release(gt_loader *loader);

/* Adds / drops a reference that keeps the memory (not the threads) alive, for a caller using
 * the loader while another thread may release it. */
void gt_loader_retain(gt_loader *loader);
void gt_loader_unref(gt_loader *loader);

void gt_loader_get_stats(gt_loader *loader, gt_loader_stats *out);

#ifdef __cplusplus
}
#endif
#endif
