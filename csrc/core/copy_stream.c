#include "core/copy_stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/device_backend.h"

enum {
    COPY_QUEUE = 16,   /* jobs the cpu worker can hold before a caller waits */
    TICKET_EVENTS = 8, /* device: events in the ring that marks tickets */
};

typedef struct copy_job {
    void *dst;        /* destination */
    const void *src;  /* source */
    size_t bytes;     /* length */
} copy_job;

/* The copy stream of an accelerator: a stream of its own, and events for the ordering. */
typedef struct device_copies {
    const gt_device_backend *table;     /* the device's interface */
    gt_stream *compute;                 /* the stream whose work the copies wait for (NULL: default) */
    gt_stream *copy;                    /* the copies' stream */
    gt_event *compute_done;             /* recorded on `compute` by after_compute */
    gt_event *copies_done;              /* recorded on `copy` by before_compute */
    gt_event *ring[TICKET_EVENTS];      /* ticket t is ring[t % TICKET_EVENTS] */
    uint64_t recorded;                  /* tickets handed out */
} device_copies;

struct gt_copy_stream {
    gt_device device;               /* cpu: worker thread; an accelerator: its streams */
    device_copies dev;              /* accelerator only */
    pthread_t worker;               /* cpu: thread running the queued memcpy calls */
    pthread_mutex_t lock;           /* cpu: guards the fields below */
    pthread_cond_t changed;         /* cpu: signalled when queued, done or stopping change */
    copy_job jobs[COPY_QUEUE];      /* cpu: ring of pending jobs, index = ticket % COPY_QUEUE */
    uint64_t queued;                /* cpu: jobs queued since creation */
    uint64_t done;                  /* cpu: jobs finished since creation */
    int stopping;                   /* cpu: 1 once destroy asked the worker to exit */
};

static void *worker_main(void *arg) {
    gt_copy_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->done == s->queued && !s->stopping)
            pthread_cond_wait(&s->changed, &s->lock);
        if (s->done == s->queued)
            break;
        copy_job job = s->jobs[s->done % COPY_QUEUE];
        pthread_mutex_unlock(&s->lock);
        memcpy(job.dst, job.src, job.bytes);
        pthread_mutex_lock(&s->lock);
        s->done++;
        pthread_cond_broadcast(&s->changed);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static gt_status create_cpu(gt_copy_stream *s) {
    if (pthread_mutex_init(&s->lock, NULL) != 0)
        return GT_FAIL(GT_ERR_OS, "copy stream: pthread_mutex_init failed");
    if (pthread_cond_init(&s->changed, NULL) != 0) {
        pthread_mutex_destroy(&s->lock);
        return GT_FAIL(GT_ERR_OS, "copy stream: pthread_cond_init failed");
    }
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        pthread_cond_destroy(&s->changed);
        pthread_mutex_destroy(&s->lock);
        return GT_FAIL(GT_ERR_OS, "copy stream: cannot start the copy thread");
    }
    return GT_OK;
}

static void destroy_device(gt_copy_stream *s) {
    device_copies *d = &s->dev;
    int index = s->device.index;
    d->table->stream_destroy(index, d->copy);  /* waits for the copies first */
    for (int k = 0; k < TICKET_EVENTS; k++)
        d->table->event_destroy(index, d->ring[k]);
    d->table->event_destroy(index, d->compute_done);
    d->table->event_destroy(index, d->copies_done);
}

static gt_status create_device(gt_copy_stream *s, gt_stream *compute_stream) {
    device_copies *d = &s->dev;
    int index = s->device.index;
    GT_TRY(gt_device_backend_get(s->device, "device", &d->table));
    d->compute = compute_stream;
    GT_TRY(d->table->stream_create(index, &d->copy));
    GT_TRY(d->table->event_create(index, &d->compute_done));
    GT_TRY(d->table->event_create(index, &d->copies_done));
    for (int k = 0; k < TICKET_EVENTS; k++)
        GT_TRY(d->table->event_create(index, &d->ring[k]));
    return GT_OK;
}

gt_status gt_copy_stream_create(gt_device device, gt_stream *compute_stream, gt_copy_stream **out) {
    *out = NULL;
    if (device.kind == GT_DEVICE_PINNED)
        return GT_FAIL(GT_ERR_VALUE, "device: a copy stream needs 'cpu' or an accelerator, not 'pinned'");
    gt_copy_stream *s = calloc(1, sizeof *s);
    if (!s)
        return GT_FAIL(GT_ERR_OOM, "copy stream: out of host memory");
    s->device = device;
    gt_status status = gt_device_is_accelerator(device) ? create_device(s, compute_stream) : create_cpu(s);
    if (status != GT_OK) {
        if (s->dev.table)
            destroy_device(s);
        free(s);
        return status;
    }
    *out = s;
    return GT_OK;
}

void gt_copy_stream_destroy(gt_copy_stream *s) {
    if (!s)
        return;
    if (gt_device_is_accelerator(s->device)) {
        destroy_device(s);
        free(s);
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->worker, NULL);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static gt_status enqueue(gt_copy_stream *s, void *dst, const void *src, size_t bytes) {
    if (gt_device_is_accelerator(s->device))
        return s->dev.table->memcpy_async(s->device.index, s->dev.copy, dst, src, bytes);
    pthread_mutex_lock(&s->lock);
    while (s->queued - s->done == COPY_QUEUE)
        pthread_cond_wait(&s->changed, &s->lock);
    s->jobs[s->queued % COPY_QUEUE] = (copy_job){dst, src, bytes};
    s->queued++;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    return GT_OK;
}

gt_status gt_copy_stream_d2h(gt_copy_stream *s, void *host_dst, const void *device_src, size_t bytes) {
    return enqueue(s, host_dst, device_src, bytes);
}

gt_status gt_copy_stream_h2d(gt_copy_stream *s, void *device_dst, const void *host_src, size_t bytes) {
    return enqueue(s, device_dst, host_src, bytes);
}

gt_status gt_copy_stream_after_compute(gt_copy_stream *s) {
    if (!gt_device_is_accelerator(s->device))
        return GT_OK;
    device_copies *d = &s->dev;
    GT_TRY(d->table->event_record(s->device.index, d->compute_done, d->compute));
    return d->table->stream_wait_event(s->device.index, d->copy, d->compute_done);
}

gt_status gt_copy_stream_d2h_on_compute(gt_copy_stream *s, void *host_dst, const void *device_src, size_t bytes) {
    if (!gt_device_is_accelerator(s->device)) {
        memcpy(host_dst, device_src, bytes);
        return GT_OK;
    }
    return s->dev.table->memcpy_async(s->device.index, s->dev.compute, host_dst, device_src, bytes);
}

gt_status gt_copy_stream_before_compute(gt_copy_stream *s) {
    if (!gt_device_is_accelerator(s->device))
        return gt_copy_stream_sync(s);
    device_copies *d = &s->dev;
    GT_TRY(d->table->event_record(s->device.index, d->copies_done, d->copy));
    return d->table->stream_wait_event(s->device.index, d->compute, d->copies_done);
}

gt_status gt_copy_stream_record(gt_copy_stream *s, uint64_t *ticket) {
    if (gt_device_is_accelerator(s->device)) {
        device_copies *d = &s->dev;
        *ticket = ++d->recorded;
        return d->table->event_record(s->device.index, d->ring[*ticket % TICKET_EVENTS], d->copy);
    }
    pthread_mutex_lock(&s->lock);
    *ticket = s->queued;
    pthread_mutex_unlock(&s->lock);
    return GT_OK;
}

/* A ticket whose event was reused is covered by the latest one (the copies run in order). */
static gt_status wait_device(gt_copy_stream *s, uint64_t ticket) {
    device_copies *d = &s->dev;
    if (ticket == 0)
        return GT_OK;
    if (d->recorded - ticket >= (uint64_t)TICKET_EVENTS)
        ticket = d->recorded;
    return d->table->event_synchronize(s->device.index, d->ring[ticket % TICKET_EVENTS]);
}

gt_status gt_copy_stream_wait(gt_copy_stream *s, uint64_t ticket) {
    if (gt_device_is_accelerator(s->device))
        return wait_device(s, ticket);
    pthread_mutex_lock(&s->lock);
    while (s->done < ticket)
        pthread_cond_wait(&s->changed, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return GT_OK;
}

gt_status gt_copy_stream_sync(gt_copy_stream *s) {
    uint64_t ticket = 0;
    GT_TRY(gt_copy_stream_record(s, &ticket));
    return gt_copy_stream_wait(s, ticket);
}

gt_status gt_memcpy_blocking(gt_device device, void *dst, const void *src, size_t bytes) {
    if (bytes == 0)
        return GT_OK;
    if (gt_device_is_accelerator(device)) {
        const gt_device_backend *table = NULL;
        GT_TRY(gt_device_backend_get(device, "device", &table));
        return table->memcpy(device.index, dst, src, bytes);
    }
    memcpy(dst, src, bytes);
    return GT_OK;
}
