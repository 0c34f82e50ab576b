#include "data/transfer.h"

#include <stdlib.h>

#ifdef GT_WITH_CUDA
#include "cuda_backend.h"

struct gt_transfer {
    gt_loader *loader;          /* whose slots are copied; one reference held */
    int device;                 /* CUDA ordinal of the device batches */
    size_t slot_bytes;          /* bytes of a slot, and of a device batch */
    gt_cuda_stream *stream;     /* the copy stream */
    gt_device_batch **batches;  /* (num_batches,) each allocated on its own */
    size_t num_batches;         /* device batches allocated */
    size_t capacity;            /* entries of `batches` */
};

gt_status gt_transfer_create(gt_loader *loader, int device, size_t slot_bytes, gt_transfer **out) {
    gt_transfer *t = calloc(1, sizeof *t);
    if (!t)
        return GT_FAIL(GT_ERR_OOM, "device: no memory for the transfer state");
    gt_status status = gt_cuda_stream_create(device, &t->stream);
    if (status != GT_OK) {
        free(t);
        return status;
    }
    t->loader = loader;
    t->device = device;
    t->slot_bytes = slot_bytes ? slot_bytes : 1;
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
        GT_TRY(gt_cuda_event_synchronize(b->copied));
    else
        GT_TRY(gt_cuda_event_query(b->copied, &done));
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
    gt_status status = gt_block_alloc(gt_cuda_device(t->device), t->slot_bytes, &b->block);
    if (status == GT_OK)
        status = gt_cuda_event_create(t->device, 0, &b->copied);
    if (status != GT_OK) {
        gt_block_free(&b->block);
        free(b);
        return status;
    }
    t->batches[t->num_batches++] = b;
    *out = b;
    return GT_OK;
}

/* A device batch the caller does not hold, preferring one whose last copy has finished. */
static gt_status free_batch(gt_transfer *t, gt_device_batch **out) {
    gt_device_batch *pending = NULL;
    for (size_t i = 0; i < t->num_batches; i++) {
        gt_device_batch *b = t->batches[i];
        GT_TRY(reclaim_host(t, b, 0));
        if (!b->in_use && !b->host) {
            *out = b;
            return GT_OK;
        }
        if (!b->in_use && !pending)
            pending = b;
    }
    if (!pending)
        return new_batch(t, out);
    GT_TRY(reclaim_host(t, pending, 1));
    *out = pending;
    return GT_OK;
}

gt_status gt_transfer_submit(gt_transfer *t, gt_slot *slot, gt_device_batch **out) {
    gt_device_batch *b = NULL;
    gt_status status = free_batch(t, &b);
    for (size_t f = 0; status == GT_OK && f < gt_loader_num_fields(t->loader); f++) {
        size_t offset = gt_loader_field_offset(t->loader, f);
        size_t bytes = gt_loader_slot_field_bytes(t->loader, slot, f);
        if (bytes > 0)
            status = gt_cuda_memcpy_async((char *)b->block.ptr + offset, (char *)slot->block.ptr + offset,
                                          bytes, GT_COPY_HOST_TO_DEVICE, t->stream);
    }
    if (status == GT_OK)
        status = gt_cuda_event_record(b->copied, t->stream);
    if (status != GT_OK) {
        gt_cuda_stream_synchronize(t->stream);  /* nothing may still read the slot */
        gt_loader_slot_release(t->loader, slot);
        return status;
    }
    b->host = slot;
    b->in_use = 1;
    *out = b;
    return GT_OK;
}

gt_status gt_transfer_wait(gt_transfer *t, gt_device_batch *b) {
    return reclaim_host(t, b, 1);
}

void gt_transfer_release(gt_transfer *t, gt_device_batch *b) {
    (void)t;
    b->in_use = 0;
}

void *gt_transfer_native_stream(const gt_transfer *t) { return gt_cuda_stream_native(t->stream); }

gt_status gt_transfer_copy_bytes(gt_transfer *t, const void *src, size_t bytes, gt_block *out) {
    GT_TRY(gt_block_alloc(gt_cuda_device(t->device), bytes ? bytes : 1, out));
    gt_status status = gt_cuda_memcpy(out->ptr, src, bytes, GT_COPY_HOST_TO_DEVICE, t->device);
    if (status != GT_OK)
        gt_block_free(out);
    return status;
}

gt_status gt_transfer_to_host(gt_transfer *t, void *dst, const void *src, size_t bytes) {
    GT_TRY(gt_cuda_stream_synchronize(t->stream));
    return gt_cuda_memcpy(dst, src, bytes, GT_COPY_DEVICE_TO_HOST, t->device);
}

void gt_transfer_destroy(gt_transfer *t) {
    gt_cuda_stream_synchronize(t->stream);
    for (size_t i = 0; i < t->num_batches; i++) {
        gt_device_batch *b = t->batches[i];
        if (b->host)
            gt_loader_slot_release(t->loader, b->host);
        gt_cuda_event_destroy(b->copied);
        gt_block_free(&b->block);
        free(b);
    }
    free(t->batches);
    gt_cuda_stream_destroy(t->stream);
    gt_loader_unref(t->loader);
    free(t);
}

#else /* a build without CUDA */

static gt_status not_compiled(void) {
    return GT_FAIL(GT_ERR_CUDA, "device: CUDA was not compiled into this build of gputrain");
}

gt_status gt_transfer_create(gt_loader *loader, int device, size_t slot_bytes, gt_transfer **out) {
    (void)loader, (void)device, (void)slot_bytes, (void)out;
    return not_compiled();
}

gt_status gt_transfer_submit(gt_transfer *t, gt_slot *slot, gt_device_batch **out) {
    (void)t, (void)slot, (void)out;
    return not_compiled();
}

gt_status gt_transfer_wait(gt_transfer *t, gt_device_batch *b) {
    (void)t, (void)b;
    return not_compiled();
}

void gt_transfer_release(gt_transfer *t, gt_device_batch *b) { (void)t, (void)b; }

void *gt_transfer_native_stream(const gt_transfer *t) {
    (void)t;
    return NULL;
}

gt_status gt_transfer_copy_bytes(gt_transfer *t, const void *src, size_t bytes, gt_block *out) {
    (void)t, (void)src, (void)bytes, (void)out;
    return not_compiled();
}

gt_status gt_transfer_to_host(gt_transfer *t, void *dst, const void *src, size_t bytes) {
    (void)t, (void)dst, (void)src, (void)bytes;
    return not_compiled();
}

void gt_transfer_destroy(gt_transfer *t) { (void)t; }

#endif
