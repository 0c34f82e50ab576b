/* The CPU as a backend of the device table (core/device_backend.h): its memory is the host's,
 * its copies are memcpy at once, its streams and events are tokens whose work is done when it is
 * queued, and its kernels run the same CPU loops as sim's workers (train/optim_cpu.c,
 * train/grad_norm.c, train/scaler.c, core/loss_mean.h) on the calling thread, with OpenMP over
 * the elements of the element-wise ones, so a model on the cpu takes the device path of nn/ and
 * train/ with the bits of the loops it ran before. It sits next to sim's table because both run
 * those loops: sim queues them, the CPU runs them at once. */
#include "sim/cpu_table.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/loss_mean.h"
#include "dist/comm.h"
#include "dist/comm_device.h"
#include "ops/cpu_ops.h"
#include "train/grad_norm.h"
#include "train/optim8_cpu.h"
#include "train/optim_cpu.h"
#include "train/scaler.h"

enum {
    PARALLEL_MIN = 32768,  /* elements below which an update stays on one thread */
    SHARE_ALIGN = 16,      /* thread shares start on multiples of this many elements */
};

/* The one stream and the one event the CPU hands out: tokens, as their work is done at once. */
static char stream_token, event_token;

static int device_count(void) { return 1; }

static gt_status host_malloc(int index, size_t bytes, void **out) {
    (void)index;
    *out = NULL;
    if (posix_memalign(out, 64, bytes ? bytes : 1) != 0) {
        *out = NULL;
        return GT_FAIL(GT_ERR_OOM, "cpu: out of host memory for %zu bytes", bytes);
    }
    return GT_OK;
}

static void host_free(int index, void *ptr) {
    (void)index;
    free(ptr);
}

static gt_status mem_get_info(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_bytes <= 0)
        return GT_FAIL(GT_ERR_OS, "cannot read the size of physical memory");
    *total_bytes = (size_t)pages * (size_t)page_bytes;
    *free_bytes = avail > 0 ? (size_t)avail * (size_t)page_bytes : 0;
    return GT_OK;
}

static gt_status copy(int index, void *dst, const void *src, size_t bytes) {
    (void)index;
    if (bytes && (!dst || !src))
        return GT_FAIL(GT_ERR_VALUE, "copy: NULL pointer for %zu bytes", bytes);
    if (bytes && dst != src)
        memmove(dst, src, bytes);
    return GT_OK;
}

static gt_status fill(int index, void *dst, int value, size_t bytes) {
    (void)index;
    if (bytes && !dst)
        return GT_FAIL(GT_ERR_VALUE, "memset: NULL pointer for %zu bytes", bytes);
    if (bytes)
        memset(dst, value, bytes);
    return GT_OK;
}

static gt_status copy_async(int index, gt_stream *stream, void *dst, const void *src, size_t bytes) {
    (void)stream;
    return copy(index, dst, src, bytes);
}

/* A released buffer of host memory is not poisoned: nothing runs later that could still read it. */
static gt_status poison(int index, gt_stream *stream, void *ptr, size_t bytes) {
    (void)index, (void)stream, (void)ptr, (void)bytes;
    return GT_OK;
}

static gt_status stream_create(int index, gt_stream **out) {
    (void)index;
    *out = (gt_stream *)&stream_token;
    return GT_OK;
}

static void stream_destroy(int index, gt_stream *stream) { (void)index, (void)stream; }

static gt_status stream_synchronize(int index, gt_stream *stream) {
    (void)index, (void)stream;
    return GT_OK;
}

static gt_status stream_wait_event(int index, gt_stream *stream, gt_event *event) {
    (void)index, (void)stream, (void)event;
    return GT_OK;
}

static gt_status event_create(int index, gt_event **out) {
    (void)index;
    *out = (gt_event *)&event_token;
    return GT_OK;
}

static void event_destroy(int index, gt_event *event) { (void)index, (void)event; }

static gt_status event_record(int index, gt_event *event, gt_stream *stream) {
    (void)index, (void)event, (void)stream;
    return GT_OK;
}

static gt_status event_query(int index, gt_event *event, int *done) {
    (void)index, (void)event;
    *done = 1;
    return GT_OK;
}

static gt_status event_synchronize(int index, gt_event *event) {
    (void)index, (void)event;
    return GT_OK;
}

static void *stream_native(gt_stream *stream) {
    (void)stream;
    return NULL;
}

static gt_status stream_from_native(int index, uintptr_t handle, const char *arg_name, gt_stream **out) {
    (void)index;
    *out = NULL;
    if (handle == 1 || handle == 2)
        return GT_OK;
    return GT_FAIL(GT_ERR_VALUE, "%s: the cpu has no stream %#llx", arg_name, (unsigned long long)handle);
}

static gt_status pointer_device(const void *ptr, int *index) {
    (void)ptr;
    *index = -1;  /* host memory is no device's memory */
    return GT_OK;
}

/* Thread t's share [bound(t), bound(t+1)) of n elements, on SHARE_ALIGN boundaries. */
static size_t share_bound(size_t n, size_t t, size_t threads) {
    if (t >= threads)
        return n;
    size_t bound = (size_t)((double)n * (double)t / (double)threads);
    bound -= bound % SHARE_ALIGN;
    return bound < n ? bound : n;
}

static gt_status adamw(int index, gt_stream *stream, gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                       const float *g, float *m, float *v, float *v_max, size_t n) {
    (void)index, (void)stream;
#pragma omp parallel if (n >= PARALLEL_MIN)
    {
        size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = share_bound(n, t, threads), hi = share_bound(n, t + 1, threads);
        if (lo < hi)
            gt_adamw_cpu(numerics, s, p + lo, g + lo, m + lo, v + lo, v_max ? v_max + lo : NULL, hi - lo);
    }
    return GT_OK;
}

static gt_status adamw8bit(int index, gt_stream *stream, const gt_adamw8_scalars *s, float *p, const float *g,
                           uint8_t *c1, uint8_t *c2, float *absmax1, float *absmax2, size_t n) {
    (void)index, (void)stream;
    gt_adamw8bit_cpu(s, p, g, c1, c2, absmax1, absmax2, n);
    return GT_OK;
}

static gt_status sgd(int index, gt_stream *stream, const gt_sgd_scalars *s, float *p, const float *g, float *buf,
                     size_t n) {
    (void)index, (void)stream;
#pragma omp parallel if (n >= PARALLEL_MIN)
    {
        size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = share_bound(n, t, threads), hi = share_bound(n, t + 1, threads);
        if (lo < hi)
            gt_sgd_cpu(s, p + lo, g + lo, buf ? buf + lo : NULL, hi - lo);
    }
    return GT_OK;
}

static gt_status ema(int index, gt_stream *stream, float *shadow, const float *p, float weight, size_t n) {
    (void)index, (void)stream;
#pragma omp parallel if (n >= PARALLEL_MIN)
    {
        size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = share_bound(n, t, threads), hi = share_bound(n, t + 1, threads);
        if (lo < hi)
            gt_ema_cpu(shadow + lo, p + lo, weight, hi - lo);
    }
    return GT_OK;
}

static gt_status ema_swap(int index, gt_stream *stream, float *shadow, float *p, size_t n) {
    (void)index, (void)stream;
#pragma omp parallel for if (n >= PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        float kept = shadow[i];
        shadow[i] = p[i];
        p[i] = kept;
    }
    return GT_OK;
}

static gt_status grad_sumsq(int index, gt_stream *stream, const float *x, size_t n, double *out) {
    (void)index, (void)stream;
    *out = 0.0;
    return n ? gt_grad_sumsq(x, n, out) : GT_OK;
}

static gt_status grad_sumsq_async(int index, gt_stream *stream, const float *x, size_t n, double *out,
                                  double *totals) {
    (void)totals;
    return grad_sumsq(index, stream, x, n, out);
}

static gt_status unscale_check(int index, gt_stream *stream, const gt_scaler *scaler, float *grad, size_t n,
                               int *found_inf) {
    (void)index, (void)stream;
    return n ? gt_scaler_unscale_check(scaler, grad, n, found_inf) : GT_OK;
}

static gt_status loss_accumulate(int index, gt_stream *stream, const float *values, int64_t rows,
                                 const int64_t *count, double *loss_sum) {
    (void)index, (void)stream;
    *loss_sum += gt_loss_mean(values, rows, count);
    return GT_OK;
}

static gt_status grad_clip(int index, gt_stream *stream, float *grad, size_t n, const double *sumsq,
                           double max_norm) {
    (void)index, (void)stream;
    return n ? gt_grad_clip(grad, n, sumsq, max_norm) : GT_OK;
}

static gt_status scaler_update(int index, gt_stream *stream, gt_scaler *scaler, const int *found_inf) {
    (void)index, (void)stream;
    gt_scaler_update(scaler, *found_inf);
    return GT_OK;
}

/* The scalars of table `t` for the count now. */
static const void *table_entry(const gt_update_table *t, size_t scalar_bytes) {
    return (const char *)t->entries + (size_t)(*t->count % t->ring) * t->stride * scalar_bytes;
}

static gt_status adamw_table(int index, gt_stream *stream, gt_numerics numerics, const gt_update_table *t, float *p,
                             const float *g, float *m, float *v, float *v_max, size_t n) {
    if (*t->found_inf || n == 0)
        return GT_OK;
    return adamw(index, stream, numerics, table_entry(t, sizeof(gt_adamw_scalars)), p, g, m, v, v_max, n);
}

static gt_status sgd_table(int index, gt_stream *stream, const gt_update_table *t, float *p, const float *g,
                           float *buf, size_t n) {
    if (*t->found_inf || n == 0)
        return GT_OK;
    return sgd(index, stream, table_entry(t, sizeof(gt_sgd_scalars)), p, g, buf, n);
}

static gt_status count_update(int index, gt_stream *stream, uint64_t *count, const int *found_inf) {
    (void)index, (void)stream;
    if (!*found_inf)
        ++*count;
    return GT_OK;
}

/* buf (n f64) summed over the ranks in rank order, element by element (a loss sum: n is small). */
static gt_status sum_f64(gt_comm *comm, double *buf, size_t n) {
    for (size_t i = 0; i < n; i++)
        GT_TRY(gt_comm_sum_f64(comm, buf[i], &buf[i]));
    return GT_OK;
}

static gt_status allreduce_sum(int index, gt_stream *stream, struct gt_comm *comm, gt_dtype dtype, void *buf,
                               size_t n) {
    (void)index, (void)stream;
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: no communicator");
    if (dtype != GT_F32 && dtype != GT_F64)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: dtype must be float32 or float64, got dtype %d", (int)dtype);
    if (n && !buf)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: NULL buffer for %zu elements", n);
    gt_status status = dtype == GT_F32 ? gt_comm_allreduce_sum_f32(comm, buf, n) : sum_f64(comm, buf, n);
    return gt_comm_device_failed(comm, status);
}

static gt_status broadcast(int index, gt_stream *stream, struct gt_comm *comm, void *buf, size_t bytes, int root) {
    (void)index, (void)stream;
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "broadcast: no communicator");
    if (root < 0 || root >= comm->size)
        return GT_FAIL(GT_ERR_VALUE, "root must be in [0, %d), got %d", comm->size, root);
    if (bytes && !buf)
        return GT_FAIL(GT_ERR_VALUE, "broadcast: NULL buffer for %zu bytes", bytes);
    return gt_comm_device_failed(comm, gt_comm_broadcast(comm, buf, bytes, root));
}

static gt_status allgather(int index, gt_stream *stream, struct gt_comm *comm, float *buf, size_t n) {
    (void)index, (void)stream;
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "allgather: no communicator");
    if (n && !buf)
        return GT_FAIL(GT_ERR_VALUE, "allgather: NULL buffer for %zu elements", n);
    return gt_comm_device_failed(comm, gt_comm_allgather(comm, buf, n, sizeof(float)));
}

/* The CPU's op table over the calling thread; nothing to release. */
static gt_status backend_init(gt_backend *be, int index, gt_stream *stream) {
    (void)stream;
    if (index != 0)
        return GT_FAIL(GT_ERR_VALUE, "device: the cpu has no ordinal %d", index);
    *be = (gt_backend){0};
    be->ops = gt_cpu_ops();
    be->device = gt_cpu_device();
    return GT_OK;
}

static void backend_release(gt_backend *be) { be->impl = NULL; }

static const gt_device_backend cpu_table = {
    .name = "cpu",
    .host_memory = 1,
    .device_count = device_count,
    .malloc = host_malloc,
    .free = host_free,
    .mem_get_info = mem_get_info,
    .memcpy = copy,
    .memset = fill,
    .memcpy_async = copy_async,
    .poison = poison,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_synchronize = stream_synchronize,
    .stream_wait_event = stream_wait_event,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .event_query = event_query,
    .event_synchronize = event_synchronize,
    .stream_native = stream_native,
    .adamw = adamw,
    .sgd = sgd,
    .ema = ema,
    .ema_swap = ema_swap,
    .grad_sumsq = grad_sumsq,
    .scaler_unscale_check = unscale_check,
    .backend_init = backend_init,
    .backend_release = backend_release,
    .backend_scratch_bytes = 0,
    .stream_from_native = stream_from_native,
    .pointer_device = pointer_device,
    .grad_sumsq_async = grad_sumsq_async,
    .loss_accumulate = loss_accumulate,
    .grad_clip = grad_clip,
    .scaler_update = scaler_update,
    .allreduce_sum = allreduce_sum,
    .broadcast = broadcast,
    .allgather = allgather,
    .adamw_table = adamw_table,
    .sgd_table = sgd_table,
    .count_update = count_update,
    .adamw8bit = adamw8bit,
};

void gt_cpu_device_install(void) { gt_device_backend_install(GT_DEVICE_CPU, &cpu_table); }
