#include "train/offload.h"

#include <string.h>

/* A position in the spans: span index and element within it. */
typedef struct chunk_cursor {
    size_t span;  /* index into the spans */
    size_t pos;   /* element within the span */
} chunk_cursor;

/* One staging buffer's worth of elements: `len` elements of the spans from `start` on, across
 * span boundaries (so many small spans, e.g. the biases of a no-decay group, share one chunk
 * and one wait), at staging[0..len) in order. */
typedef struct chunk {
    chunk_cursor start;  /* first element */
    size_t len;          /* elements, <= chunk_numel */
} chunk;

/* A run of a chunk inside one span: `len` elements at `pos` of span `span`, staged at `at`. */
typedef struct piece {
    size_t span;  /* index into the spans */
    size_t pos;   /* first element within the span */
    size_t len;   /* elements */
    size_t at;    /* first element within the staging buffer */
} piece;

/* Elements per staging chunk: the requested chunk, at most the offloaded elements. */
static size_t chunk_of(size_t numel, size_t chunk_numel) {
    return chunk_numel < numel ? chunk_numel : numel;
}

size_t gt_offload_host_bytes(size_t numel, size_t num_slots, size_t chunk_numel) {
    return gt_align_up(numel * sizeof(float)) * (1 + num_slots) +
           2 * gt_align_up(chunk_of(numel, chunk_numel) * sizeof(float));
}

static size_t slot_count(const int has_slot[GT_SLOT_COUNT]) {
    size_t count = 0;
    for (int s = 0; s < GT_SLOT_COUNT; s++)
        count += has_slot[s] != 0;
    return count;
}

/* Carves master, slots and staging out of the host arena; the state starts at zero. */
static gt_status carve_host(gt_offload *off, const int has_slot[GT_SLOT_COUNT]) {
    size_t bytes = off->numel * sizeof(float);
    void *piece = NULL;
    GT_TRY(gt_arena_take(&off->host, bytes, &piece));
    off->master = piece;
    for (int s = 0; s < GT_SLOT_COUNT; s++) {
        if (!has_slot[s])
            continue;
        GT_TRY(gt_arena_take(&off->host, bytes, &piece));
        memset(piece, 0, bytes);
        off->slot[s] = piece;
    }
    for (int b = 0; b < 2; b++) {
        GT_TRY(gt_arena_take(&off->host, off->chunk_numel * sizeof(float), &piece));
        off->staging[b] = piece;
    }
    return GT_OK;
}

gt_status gt_offload_create(gt_offload *off, gt_device device, gt_stream *compute_stream, size_t base,
                            size_t numel, size_t chunk_numel, const int has_slot[GT_SLOT_COUNT]) {
    memset(off, 0, sizeof *off);
    if (numel == 0 || chunk_numel == 0)
        return GT_FAIL(GT_ERR_VALUE, "cpu_offload_fraction: nothing to offload (%zu elements)", numel);
    off->base = base;
    off->numel = numel;
    off->chunk_numel = chunk_of(numel, chunk_numel);
    size_t bytes = gt_offload_host_bytes(numel, slot_count(has_slot), chunk_numel);
    GT_TRY(gt_arena_create(&off->host, gt_pinned_device(), bytes));
    gt_status status = carve_host(off, has_slot);
    if (status == GT_OK)
        status = gt_copy_stream_create(device, compute_stream, &off->stream);
    if (status != GT_OK)
        gt_offload_destroy(off);
    return status;
}

void gt_offload_destroy(gt_offload *off) {
    gt_copy_stream_destroy(off->stream);
    gt_arena_destroy(&off->host);
    memset(off, 0, sizeof *off);
}

gt_status gt_offload_fetch_params(gt_offload *off, gt_device device, const float *param,
                                  size_t offset, size_t n) {
    if (offset < off->base || offset - off->base > off->numel || n > off->numel - (offset - off->base))
        return GT_FAIL(GT_ERR_INDEX, "offload: elements [%zu, %zu) outside the offloaded range", offset,
                       offset + n);
    return gt_memcpy_blocking(device, off->master + (offset - off->base), param, n * sizeof(float));
}

/* Moves past spans that have no elements left at the cursor. */
static void skip_done(const gt_offload_span *spans, size_t num_spans, chunk_cursor *cursor) {
    while (cursor->span < num_spans && cursor->pos >= spans[cursor->span].numel) {
        cursor->span++;
        cursor->pos = 0;
    }
}

/* The next chunk of up to chunk_numel elements from the cursor (0 when none is left). */
static int next_chunk(const gt_offload_span *spans, size_t num_spans, size_t chunk_numel,
                      chunk_cursor *cursor, chunk *out) {
    skip_done(spans, num_spans, cursor);
    if (cursor->span == num_spans)
        return 0;
    *out = (chunk){*cursor, 0};
    while (cursor->span < num_spans && out->len < chunk_numel) {
        size_t left = spans[cursor->span].numel - cursor->pos, room = chunk_numel - out->len;
        size_t take = left < room ? left : room;
        out->len += take;
        cursor->pos += take;
        skip_done(spans, num_spans, cursor);
    }
    return 1;
}

/* The piece of chunk `c` that starts `done` elements in, at cursor `at` (advanced past it). */
static piece next_piece(const gt_offload_span *spans, const chunk *c, size_t done, chunk_cursor *at) {
    while (at->pos >= spans[at->span].numel) {
        at->span++;
        at->pos = 0;
    }
    size_t left = spans[at->span].numel - at->pos, want = c->len - done;
    piece p = {at->span, at->pos, left < want ? left : want, done};
    at->pos += p.len;
    return p;
}

/* Queues the copies of chunk `c` into staging buffer `b`: on the copy stream, or on the
 * compute stream (`on_compute`, gt_offload_prefetch). */
static gt_status copy_chunk(gt_offload *off, const gt_offload_span *spans, const chunk *c, int b, int on_compute) {
    chunk_cursor at = c->start;
    for (size_t done = 0; done < c->len;) {
        piece p = next_piece(spans, c, done, &at);
        float *dst = off->staging[b] + p.at;
        const float *src = spans[p.span].grad + p.pos;
        size_t bytes = p.len * sizeof(float);
        GT_TRY(on_compute ? gt_copy_stream_d2h_on_compute(off->stream, dst, src, bytes)
                          : gt_copy_stream_d2h(off->stream, dst, src, bytes));
        done += p.len;
    }
    return GT_OK;
}

/* Queues the gradient copies of the next chunk (if any) into staging buffer `b`; a chunk
 * already there (`staged`, by gt_offload_prefetch) needs no copy and no wait. */
static gt_status issue_fetch(gt_offload *off, const gt_offload_span *spans, size_t num_spans,
                             chunk_cursor *cursor, int b, int staged, chunk *slot, int *have, uint64_t *ticket) {
    *have = next_chunk(spans, num_spans, off->chunk_numel, cursor, slot);
    *ticket = 0;
    if (!*have || staged)
        return GT_OK;
    GT_TRY(copy_chunk(off, spans, slot, b, 0));
    return gt_copy_stream_record(off->stream, ticket);
}

/* Updates the master copy and state of a staged chunk and queues its parameters' copies back. */
static gt_status apply_chunk(gt_offload *off, const gt_offload_span *spans, const chunk *c, const float *staged,
                             gt_offload_update_fn update, void *ctx) {
    chunk_cursor at = c->start;
    for (size_t done = 0; done < c->len;) {
        piece p = next_piece(spans, c, done, &at);
        const gt_offload_span *span = &spans[p.span];
        size_t state_index = span->offset + p.pos - off->base;
        update(ctx, span->tag, off->master + state_index, staged + p.at, state_index, p.len);
        GT_TRY(gt_copy_stream_h2d(off->stream, span->param + p.pos, off->master + state_index,
                                  p.len * sizeof(float)));
        done += p.len;
    }
    return GT_OK;
}

static gt_status pipeline(gt_offload *off, const gt_offload_span *spans, size_t num_spans,
                          gt_offload_update_fn update, void *ctx) {
    chunk_cursor cursor = {0, 0};
    chunk pending[2];
    int have[2] = {0, 0};
    uint64_t ticket[2] = {0, 0};
    int staged = off->staged;
    off->staged = 0;
    for (int b = 0; b < 2; b++)
        GT_TRY(issue_fetch(off, spans, num_spans, &cursor, b, b < staged, &pending[b], &have[b], &ticket[b]));
    for (int b = 0; have[b]; b ^= 1) {
        GT_TRY(gt_copy_stream_wait(off->stream, ticket[b]));
        GT_TRY(apply_chunk(off, spans, &pending[b], off->staging[b], update, ctx));
        GT_TRY(issue_fetch(off, spans, num_spans, &cursor, b, 0, &pending[b], &have[b], &ticket[b]));
    }
    return GT_OK;
}

gt_status gt_offload_begin(gt_offload *off) { return gt_copy_stream_after_compute(off->stream); }

static gt_status check_spans(const gt_offload *off, const gt_offload_span *spans, size_t num_spans) {
    for (size_t k = 0; k < num_spans; k++)
        if (spans[k].offset < off->base || spans[k].offset - off->base + spans[k].numel > off->numel)
            return GT_FAIL(GT_ERR_INDEX, "offload: span %zu outside the offloaded range", k);
    return GT_OK;
}

gt_status gt_offload_prefetch(gt_offload *off, const gt_offload_span *spans, size_t num_spans) {
    GT_TRY(check_spans(off, spans, num_spans));
    chunk_cursor cursor = {0, 0};
    chunk c;
    off->staged = 0;
    for (int b = 0; b < 2 && next_chunk(spans, num_spans, off->chunk_numel, &cursor, &c); b++) {
        GT_TRY(copy_chunk(off, spans, &c, b, 1));
        off->staged = b + 1;
    }
    return GT_OK;
}

void gt_offload_unstage(gt_offload *off) { off->staged = 0; }

gt_status gt_offload_step(gt_offload *off, const gt_offload_span *spans, size_t num_spans,
                          gt_offload_update_fn update, void *ctx) {
    gt_status status = check_spans(off, spans, num_spans);
    if (status != GT_OK) {
        off->staged = 0;
        return status;
    }
    status = pipeline(off, spans, num_spans, update, ctx);
    gt_status ordered = gt_copy_stream_before_compute(off->stream);
    return status != GT_OK ? status : ordered;
}
