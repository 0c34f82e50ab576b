/* The offloaded share of an optimizer (ZeRO-Offload with a partial ratio): the fp32 master copy
 * and the state of a contiguous range of the optimizer's flat element space live in one pinned
 * host arena and are updated by CPU threads. Each step streams the range's gradients
 * device->host in chunks through two pinned staging buffers, updates a chunk while the next is
 * in flight, and streams the updated master values host->device behind it, all on a copy
 * stream separate from the device's compute. */
#ifndef GT_OFFLOAD_H
#define GT_OFFLOAD_H

#include <stddef.h>

#include "core/alloc.h"
#include "core/copy_stream.h"
#include "train/optim.h"

typedef struct gt_offload {
    size_t base;                   /* first element of the flat space that is offloaded */
    size_t numel;                  /* offloaded elements: [base, base + numel) */
    size_t chunk_numel;            /* elements per staging chunk (<= numel) */
    gt_arena host;                 /* pinned pool: master | state slots | staging[0] | staging[1] */
    float *master;                 /* (numel,) fp32 master copy of the offloaded parameters */
    float *slot[GT_SLOT_COUNT];    /* (numel,) each; NULL for slots the optimizer does not keep */
    float *staging[2];             /* (chunk_numel,) each: gradient chunks arriving from the device */
    gt_copy_stream *stream;        /* the copies, in order, beside the CPU update */
    int staged;                    /* chunks gt_offload_prefetch put in staging[0..staged) for the next step */
} gt_offload;

/* A run of offloaded elements to update this step (device pointers). */
typedef struct gt_offload_span {
    float *param;        /* (numel,) device parameters: receive the updated master values */
    const float *grad;   /* (numel,) device gradients: streamed to the host */
    size_t offset;       /* flat element of param[0] (>= base) */
    size_t numel;        /* elements */
    size_t tag;          /* caller's index of the span, passed back to the update */
} gt_offload_span;

/* Updates n elements on the host: master[0..n) with the gradient chunk `grad`, state at element
 * `state_index` of the offloaded slots. */
typedef void (*gt_offload_update_fn)(void *ctx, size_t tag, float *master, const float *grad,
                                     size_t state_index, size_t n);

/* Bytes of the host arena gt_offload_create requests for `numel` (> 0) offloaded elements with
 * `num_slots` state slots and staging chunks of `chunk_numel` (> 0; at most numel are used). */
size_t gt_offload_host_bytes(size_t numel, size_t num_slots, size_t chunk_numel);

/* Allocates the host arena (zeroed state) and the copy stream; `has_slot[s]` says which
 * slots exist. numel must be > 0. */
gt_status gt_offload_create(gt_offload *off, gt_device device, gt_stream *compute_stream, size_t base,
                            size_t numel, size_t chunk_numel, const int has_slot[GT_SLOT_COUNT]);

void gt_offload_destroy(gt_offload *off);

/* Copies n device parameters starting at flat element `offset` into the master copy. */
gt_status gt_offload_fetch_params(gt_offload *off, gt_device device, const float *param,
                                  size_t offset, size_t n);

/* Makes the copies of the next gt_offload_step wait for the device work queued so far (the
 * backward that wrote the gradients). Call it before queueing the device's own share of the
 * update, so the copies do not wait for that share too. */
gt_status gt_offload_begin(gt_offload *off);

/* Queues the gradient copies of the first two chunks of the spans into the staging buffers on
 * the compute stream, behind the backward, so that the step's one wait for that stream (its
 * record read) also covers them; the next gt_offload_step over the same spans starts from
 * them. gt_offload_unstage forgets them (a step that skipped its update). */
gt_status gt_offload_prefetch(gt_offload *off, const gt_offload_span *spans, size_t num_spans);
void gt_offload_unstage(gt_offload *off);

/* Runs the chunked pipeline over the spans (in order; a chunk fills its staging buffer across
 * span boundaries, one wait per chunk not staged by gt_offload_prefetch) and makes the
 * compute stream's later work wait for its copies back (an event; the cpu waits for them). */
gt_status gt_offload_step(gt_offload *off, const gt_offload_span *spans, size_t num_spans,
                          gt_offload_update_fn update, void *ctx);

#endif
