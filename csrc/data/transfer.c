#include "data/transfer.h"

#include <stdlib.h>

#include "core/device_backend.h"

struct gt_transfer {
    gt_loader *loader;          /* whose slots are copied; one reference held */
    gt_device device;           /* where the device batches live */
    const gt_device_backend *dev; /* that device's interface */
    size_t slot_bytes;          /* bytes of a slot, and of a device batch */
    gt_stream *stream;          /* the copy stream */
    gt_device_batch **batches;  /* (num_batches,) each allocated on its own */
    size_t num_batches;         /* device batches allocated */
    size_t capacity;            /* entries of `batches` */
};

static size_t batch_request(size_t slot_bytes) { return slot_bytes ? slot_bytes : 1; }

gt_status gt_transfer_plan(gt_device device, size_t slot_bytes, size_t *batch_bytes, size_t *bytes) {
    *batch_bytes = *bytes = 0;
    if (!gt_device_is_accelerator(device))
        return GT_OK;
    *batch_bytes = batch_request(slot_bytes);
    return gt_size_mul(GT_TRANSFER_PLANNED_BATCHES, gt_block_reserved_bytes(*batch_bytes), "device batches", bytes);
}

gt_status gt_transfer_create(gt_loader *loader, gt_device device, size_t slot_bytes, gt_transfer **out) {
    const gt_device_backend *dev = NULL;
    GT_TRY(gt_device_backend_get(device, "device", &dev));
    gt_transfer *t = calloc(1, sizeof *t);
    if (!t)
        return GT_FAIL(GT_ERR_OOM, "device: no memory for the transfer state");
    t->dev = dev;
    gt_status status = dev->stream_create(device.index, &t->stream);
    if (status != GT_OK) {
        free(t);
        return status;
    }
    t->loader = loader;
    t->device = device;
    t->slot_bytes = batch_request(slot_bytes);
    gt_loader_retain(loader);
    *out = t;
    return GT_OK;
}

/* Hands the host slot back once the copy from it has finished (`wait` blocks for it). */
static gt_status reclaim_host(gt_transfer *t, gt_device_batch *b, int wait) {
    if (!b->host)
        return GT_OK;
    int done = 1;
    if (wait)
        GT_TRY(t->dev->event_synchronize(t->device.index, b->copied));
    else
        GT_TRY(t->dev->event_query(t->device.index, b->copied, &done));
    if (done) {
        gt_loader_slot_release(t->loader, b->host);
        b->host = NULL;
    }
    return GT_OK;
}

static gt_status new_batch(gt_transfer *t, gt_device_batch **out) {
    if (t->num_batches == t->capacity) {
        size_t capacity = t->capacity ? 2 * t->capacity : 8;
        gt_device_batch **grown = realloc(t->batches, capacity * sizeof *grown);
        if (!grown)
            return GT_FAIL(GT_ERR_OOM, "device: no memory for %zu batch entries", capacity);
        t->batches = grown;
        t->capacity = capacity;
    }
    gt_device_batch *b = calloc(1, sizeof *b);
    if (!b)
        return GT_FAIL(GT_ERR_OOM, "device: no memory for a device batch");
    gt_status status = gt_block_alloc(t->device, t->slot_bytes, &b->block);
    if (status == GT_OK)
        status = t->dev->event_create(t->device.index, &b->copied);
    if (status == GT_OK)
        status = t->dev->event_create(t->device.index, &b->consumed);
    if (status != GT_OK) {
        t->dev->event_destroy(t->device.index, b->copied);
        t->dev->event_destroy(t->device.index, b->consumed);
        gt_block_free(&b->block);
        free(b);
        return status;
    }
    t->batches[t->num_batches++] = b;
    *out = b;
    return GT_OK;
}

/* Hands back the host slot of every device batch, waiting for a copy still running (the copy
 * stream runs them in order: at most the one the previous submit queued, which the caller reads
 * next anyway). Every submit starts here, so once it returns the transfer holds one host slot,
 * the one it just queued, however the copy stream lags and however many device batches the
 * caller keeps: that is the "+ 1 held by the transfer" of the loader's slot bound (loader.c,
 * initial_slots_of). Handing slots back lazily instead (when a later submit saw the copy done)
 * let a lagging copy stream keep 3 slots here, and the loader allocate 2 beyond its plan. */
static gt_status reclaim_all(gt_transfer *t) {
    for (size_t i = 0; i < t->num_batches; i++) {
        GT_TRY(reclaim_host(t, t->batches[i], 0));  /* a copy that is done costs no host wait */
        GT_TRY(reclaim_host(t, t->batches[i], 1));
    }
    return GT_OK;
}

/* A device batch the caller does not hold, with no host slot (all were handed back). */
static gt_status free_batch(gt_transfer *t, gt_device_batch **out) {
    GT_TRY(reclaim_all(t));
    for (size_t i = 0; i < t->num_batches; i++) {
        if (!t->batches[i]->in_use) {
            *out = t->batches[i];
            return GT_OK;
        }
    }
    return new_batch(t, out);
}

gt_status gt_transfer_submit(gt_transfer *t, gt_slot *slot, gt_device_batch **out) {
    gt_device_batch *b = NULL;
    gt_status status = free_batch(t, &b);
    for (size_t f = 0; status == GT_OK && f < gt_loader_num_fields(t->loader); f++) {
        size_t offset = gt_loader_field_offset(t->loader, f);
        size_t bytes = gt_loader_slot_field_bytes(t->loader, slot, f);
        if (bytes > 0)
            status = t->dev->memcpy_async(t->device.index, t->stream, (char *)b->block.ptr + offset,
                                          (char *)slot->block.ptr + offset, bytes);
    }
    if (status == GT_OK)
        status = t->dev->event_record(t->device.index, b->copied, t->stream);
    if (status != GT_OK) {
        t->dev->stream_synchronize(t->device.index, t->stream);  /* nothing may still read the slot */
        gt_loader_slot_release(t->loader, slot);
        return status;
    }
    b->host = slot;
    b->in_use = 1;
    b->consumer = 0;
    *out = b;
    return GT_OK;
}

gt_status gt_transfer_wait(gt_transfer *t, gt_device_batch *b) {
    return t->dev->event_synchronize(t->device.index, b->copied);
}

gt_status gt_transfer_reclaim(gt_transfer *t, gt_device_batch *b) {
    return reclaim_host(t, b, 0);
}

gt_status gt_transfer_consume_begin(gt_transfer *t, gt_device_batch *b, gt_stream *consumer) {
    return t->dev->stream_wait_event(t->device.index, consumer, b->copied);
}

gt_status gt_transfer_consume_end(gt_transfer *t, gt_device_batch *b, gt_stream *consumer) {
    GT_TRY(t->dev->event_record(t->device.index, b->consumed, consumer));
    b->consumer = 1;
    return GT_OK;
}

void gt_transfer_wait_for(gt_transfer *t, gt_stream *consumer) {
    gt_event *read = NULL;
    gt_status status = t->dev->event_create(t->device.index, &read);
    if (status == GT_OK)
        status = t->dev->event_record(t->device.index, read, consumer);
    if (status == GT_OK)
        status = t->dev->stream_wait_event(t->device.index, t->stream, read);
    t->dev->event_destroy(t->device.index, read);  /* a queued wait keeps its record */
    if (status != GT_OK) {
        gt_clear_error();
        if (t->dev->stream_synchronize(t->device.index, consumer) != GT_OK)
            gt_clear_error();  /* the consumer's error is its own to report */
    }
}

gt_device gt_transfer_device(const gt_transfer *t) { return t->device; }

/* The copy stream's later work (the poison, the next copy into the batch) waits for the
 * consumers; if the wait cannot be queued, the host waits instead. */
static void wait_for_consumers(gt_transfer *t, gt_device_batch *b) {
    if (!b->consumer)
        return;
    if (t->dev->stream_wait_event(t->device.index, t->stream, b->consumed) != GT_OK) {
        gt_clear_error();
        if (t->dev->event_synchronize(t->device.index, b->consumed) != GT_OK)
            gt_clear_error();  /* a failed consumer's error is its own to report */
    }
    b->consumer = 0;
}

void gt_transfer_release(gt_transfer *t, gt_device_batch *b) {
    wait_for_consumers(t, b);
    /* after the copy into the batch, before the next one; a diagnostic only, so a refusal is dropped */
    if (t->dev->poison(t->device.index, t->stream, b->block.ptr, b->block.bytes) != GT_OK)
        gt_clear_error();
    b->in_use = 0;
}

void *gt_transfer_native_stream(const gt_transfer *t) { return t->dev->stream_native(t->stream); }

gt_status gt_transfer_copy_bytes(gt_transfer *t, const void *src, size_t bytes, gt_block *out) {
    GT_TRY(gt_block_alloc(t->device, bytes ? bytes : 1, out));
    gt_status status = t->dev->memcpy(t->device.index, out->ptr, src, bytes);
    if (status != GT_OK)
        gt_block_free(out);
    return status;
}

gt_status gt_transfer_to_host(gt_transfer *t, void *dst, const void *src, size_t bytes) {
    GT_TRY(t->dev->stream_synchronize(t->device.index, t->stream));
    return t->dev->memcpy(t->device.index, dst, src, bytes);
}

void gt_transfer_destroy(gt_transfer *t) {
    t->dev->stream_synchronize(t->device.index, t->stream);
    for (size_t i = 0; i < t->num_batches; i++) {
        gt_device_batch *b = t->batches[i];
        if (b->host)
            gt_loader_slot_release(t->loader, b->host);
        t->dev->event_destroy(t->device.index, b->copied);
        t->dev->event_destroy(t->device.index, b->consumed);
        gt_block_free(&b->block);
        free(b);
    }
    free(t->batches);
    t->dev->stream_destroy(t->device.index, t->stream);
    gt_loader_unref(t->loader);
    free(t);
}
