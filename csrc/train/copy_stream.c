#include "train/copy_stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef GT_WITH_CUDA
#include "cuda_backend.h"
#include "optim_cuda.h"
#endif

enum { COPY_QUEUE = 16 };  /* jobs the cpu worker can hold before a caller waits */

typedef struct copy_job {
    void *dst;        /* destination */
    const void *src;  /* source */
    size_t bytes;     /* length */
} copy_job;

struct gt_copy_stream {
    gt_device device;               /* cpu: worker thread; cuda:N: a CUDA stream */
    void *cuda;                     /* cuda/optim.cu copy-stream handle (cuda:N only) */
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

gt_status gt_copy_stream_create(gt_device device, void *compute_stream, gt_copy_stream **out) {
    *out = NULL;
    if (device.kind == GT_DEVICE_PINNED)
        return GT_FAIL(GT_ERR_VALUE, "device: a copy stream needs 'cpu' or 'cuda:N', not 'pinned'");
    gt_copy_stream *s = calloc(1, sizeof *s);
    if (!s)
        return GT_FAIL(GT_ERR_OOM, "copy stream: out of host memory");
    s->device = device;
    gt_status status;
#ifdef GT_WITH_CUDA
    if (device.kind == GT_DEVICE_CUDA)
        status = gt_cuda_offload_stream_create(device.index, compute_stream, &s->cuda);
    else
#endif
        status = device.kind == GT_DEVICE_CPU
                     ? create_cpu(s)
                     : GT_FAIL(GT_ERR_RUNTIME, "device: this build has no CUDA backend");
    if (status != GT_OK) {
        free(s);
        return status;
    }
    *out = s;
    return GT_OK;
}

void gt_copy_stream_destroy(gt_copy_stream *s) {
    if (!s)
        return;
#ifdef GT_WITH_CUDA
    if (s->device.kind == GT_DEVICE_CUDA) {
        gt_cuda_offload_stream_destroy(s->cuda);
        free(s);
        return;
    }
#endif
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
#ifdef GT_WITH_CUDA
    if (s->device.kind == GT_DEVICE_CUDA)
        return gt_cuda_offload_copy(s->cuda, dst, src, bytes);
#endif
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
#ifdef GT_WITH_CUDA
    if (s->device.kind == GT_DEVICE_CUDA)
        return gt_cuda_offload_after_compute(s->cuda);
#endif
    return GT_OK;
}

gt_status gt_copy_stream_record(gt_copy_stream *s, uint64_t *ticket) {
#ifdef GT_WITH_CUDA
    if (s->device.kind == GT_DEVICE_CUDA)
        return gt_cuda_offload_record(s->cuda, ticket);
#endif
    pthread_mutex_lock(&s->lock);
    *ticket = s->queued;
    pthread_mutex_unlock(&s->lock);
    return GT_OK;
}

gt_status gt_copy_stream_wait(gt_copy_stream *s, uint64_t ticket) {
#ifdef GT_WITH_CUDA
    if (s->device.kind == GT_DEVICE_CUDA)
        return gt_cuda_offload_wait(s->cuda, ticket);
#endif
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
#ifdef GT_WITH_CUDA
    if (device.kind == GT_DEVICE_CUDA)
        return gt_cuda_memcpy(dst, src, bytes, GT_COPY_DEFAULT, device.index);
#endif
    if (device.kind == GT_DEVICE_CUDA)
        return GT_FAIL(GT_ERR_RUNTIME, "device: this build has no CUDA backend");
    memcpy(dst, src, bytes);
    return GT_OK;
}
