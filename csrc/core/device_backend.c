#include "core/device_backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ops/ops.h"

enum { GT_DEVICE_KINDS = 4 };  /* cpu, pinned, cuda, sim */

enum { SYNCS, LAUNCHES, H2D, D2H, D2D, ALLOCS, FREES, COUNTERS };  /* gt_device_counters' fields */

enum { MAX_BLOCKS = 4096 };  /* device allocations tracked per kind (to classify copies); copies
                                touching an allocation beyond them count as host memory */

/* The backends' own tables and the counting copies handed out, by device kind; set at start-up. */
static const gt_device_backend *real[GT_DEVICE_KINDS];
static gt_device_backend counted[GT_DEVICE_KINDS];
static _Atomic(const gt_device_backend *) tables[GT_DEVICE_KINDS];

/* (kind, ordinal, field) counts since the last reset. */
static _Atomic uint64_t counts[GT_DEVICE_KINDS][GT_MAX_CUDA_DEVICES][COUNTERS];

/* The live device allocations of each kind, so that a copy's direction follows from its pointers. */
typedef struct live_blocks {
    uintptr_t start[MAX_BLOCKS];  /* (count,) first byte of each allocation */
    size_t bytes[MAX_BLOCKS];     /* (count,) its length */
    size_t count;                 /* allocations tracked */
} live_blocks;

static live_blocks live[GT_DEVICE_KINDS];
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

static void add(int kind, int index, int field, uint64_t amount) {
    if (index >= 0 && index < GT_MAX_CUDA_DEVICES)
        atomic_fetch_add(&counts[kind][index][field], amount);
}

static void track(int kind, void *ptr, size_t bytes) {
    pthread_mutex_lock(&live_lock);
    live_blocks *l = &live[kind];
    if (l->count < MAX_BLOCKS) {
        l->start[l->count] = (uintptr_t)ptr;
        l->bytes[l->count++] = bytes;
    }
    pthread_mutex_unlock(&live_lock);
}

static void untrack(int kind, void *ptr) {
    pthread_mutex_lock(&live_lock);
    live_blocks *l = &live[kind];
    for (size_t i = 0; i < l->count; i++)
        if (l->start[i] == (uintptr_t)ptr) {
            l->start[i] = l->start[--l->count];
            l->bytes[i] = l->bytes[l->count];
            break;
        }
    pthread_mutex_unlock(&live_lock);
}

/* 1 when `ptr` lies in a live device allocation of `kind`. */
static int on_device(int kind, const void *ptr) {
    int found = 0;
    pthread_mutex_lock(&live_lock);
    const live_blocks *l = &live[kind];
    for (size_t i = 0; i < l->count && !found; i++)
        found = (uintptr_t)ptr - l->start[i] < l->bytes[i];
    pthread_mutex_unlock(&live_lock);
    return found;
}

static void count_copy(int kind, int index, void *dst, const void *src, size_t bytes) {
    int from = on_device(kind, src), to = on_device(kind, dst);
    add(kind, index, from && to ? D2D : from ? D2H : H2D, bytes);  /* host to host counts as H2D */
}

/* The counting wrappers of one kind K (its functions call real[K]'s). */
#define GT_COUNTING_WRAPPERS(name, K)                                                                        \
    static gt_status name##_malloc(int i, size_t bytes, void **out) {                                       \
        gt_status status = real[K]->malloc(i, bytes, out);                                                   \
        if (status == GT_OK) {                                                                               \
            add(K, i, ALLOCS, 1);                                                                            \
            track(K, *out, bytes);                                                                           \
        }                                                                                                    \
        return status;                                                                                       \
    }                                                                                                        \
    static void name##_free(int i, void *ptr) {                                                             \
        if (ptr) {                                                                                           \
            add(K, i, FREES, 1);                                                                             \
            untrack(K, ptr);                                                                                 \
        }                                                                                                    \
        real[K]->free(i, ptr);                                                                               \
    }                                                                                                        \
    static gt_status name##_memcpy(int i, void *dst, const void *src, size_t bytes) {                       \
        add(K, i, SYNCS, 1);                                                                                 \
        count_copy(K, i, dst, src, bytes);                                                                   \
        return real[K]->memcpy(i, dst, src, bytes);                                                          \
    }                                                                                                        \
    static gt_status name##_memset(int i, void *dst, int value, size_t bytes) {                             \
        add(K, i, SYNCS, 1);                                                                                 \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->memset(i, dst, value, bytes);                                                        \
    }                                                                                                        \
    static gt_status name##_memcpy_async(int i, gt_stream *s, void *dst, const void *src, size_t bytes) {   \
        add(K, i, LAUNCHES, 1);                                                                              \
        count_copy(K, i, dst, src, bytes);                                                                   \
        return real[K]->memcpy_async(i, s, dst, src, bytes);                                                 \
    }                                                                                                        \
    static gt_status name##_poison(int i, gt_stream *s, void *ptr, size_t bytes) {                          \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->poison(i, s, ptr, bytes);                                                            \
    }                                                                                                        \
    static gt_status name##_stream_synchronize(int i, gt_stream *s) {                                       \
        add(K, i, SYNCS, 1);                                                                                 \
        return real[K]->stream_synchronize(i, s);                                                            \
    }                                                                                                        \
    static gt_status name##_event_synchronize(int i, gt_event *e) {                                         \
        add(K, i, SYNCS, 1);                                                                                 \
        return real[K]->event_synchronize(i, e);                                                             \
    }                                                                                                        \
    static gt_status name##_adamw(int i, gt_stream *s, gt_numerics numerics, const gt_adamw_scalars *a,     \
                                  float *p, const float *g, float *m, float *v, float *v_max, size_t n) {   \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->adamw(i, s, numerics, a, p, g, m, v, v_max, n);                                      \
    }                                                                                                        \
    static gt_status name##_sgd(int i, gt_stream *s, const gt_sgd_scalars *a, float *p, const float *g,     \
                                float *buf, size_t n) {                                                      \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->sgd(i, s, a, p, g, buf, n);                                                          \
    }                                                                                                        \
    static gt_status name##_ema(int i, gt_stream *s, float *ema, const float *p, float weight, size_t n) {   \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->ema(i, s, ema, p, weight, n);                                                        \
    }                                                                                                        \
    static gt_status name##_ema_swap(int i, gt_stream *s, float *ema, float *p, size_t n) {                 \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->ema_swap(i, s, ema, p, n);                                                           \
    }                                                                                                        \
    static gt_status name##_grad_sumsq(int i, gt_stream *s, const float *x, size_t n, double *out) {        \
        add(K, i, LAUNCHES, 1);                                                                              \
        add(K, i, SYNCS, 1);                                                                                 \
        return real[K]->grad_sumsq(i, s, x, n, out);                                                         \
    }                                                                                                        \
    static gt_status name##_unscale_check(int i, gt_stream *s, const gt_scaler *scaler, float *grad,        \
                                          size_t n, int *found_inf) {                                        \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->scaler_unscale_check(i, s, scaler, grad, n, found_inf);                              \
    }                                                                                                        \
    static gt_status name##_grad_sumsq_async(int i, gt_stream *s, const float *x, size_t n, double *out,    \
                                             double *totals) {                                               \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->grad_sumsq_async(i, s, x, n, out, totals);                                           \
    }                                                                                                        \
    static gt_status name##_loss_accumulate(int i, gt_stream *s, const float *values, int64_t rows,         \
                                            const int64_t *count, double *loss_sum) {                       \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->loss_accumulate(i, s, values, rows, count, loss_sum);                                \
    }                                                                                                        \
    static gt_status name##_grad_clip(int i, gt_stream *s, float *grad, size_t n, const double *sumsq,      \
                                      double max_norm) {                                                     \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->grad_clip(i, s, grad, n, sumsq, max_norm);                                           \
    }                                                                                                        \
    static gt_status name##_scaler_update(int i, gt_stream *s, gt_scaler *scaler, const int *found_inf) {   \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->scaler_update(i, s, scaler, found_inf);                                              \
    }                                                                                                        \
    static gt_status name##_allreduce_sum(int i, gt_stream *s, struct gt_comm *comm, gt_dtype dtype, void *buf, \
                                          size_t n) {                                                       \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->allreduce_sum(i, s, comm, dtype, buf, n);                                            \
    }                                                                                                        \
    static gt_status name##_broadcast(int i, gt_stream *s, struct gt_comm *comm, void *buf, size_t bytes,    \
                                      int root) {                                                            \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->broadcast(i, s, comm, buf, bytes, root);                                             \
    }                                                                                                        \
    static gt_status name##_allgather(int i, gt_stream *s, struct gt_comm *comm, float *buf, size_t n) {    \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->allgather(i, s, comm, buf, n);                                                       \
    }                                                                                                        \
    static gt_status name##_adamw_table(int i, gt_stream *s, gt_numerics numerics, const gt_update_table *t, \
                                        float *p, const float *g, float *m, float *v, float *v_max, size_t n) { \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->adamw_table(i, s, numerics, t, p, g, m, v, v_max, n);                                \
    }                                                                                                        \
    static gt_status name##_sgd_table(int i, gt_stream *s, const gt_update_table *t, float *p, const float *g, \
                                      float *buf, size_t n) {                                                \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->sgd_table(i, s, t, p, g, buf, n);                                                    \
    }                                                                                                        \
    static gt_status name##_count_update(int i, gt_stream *s, uint64_t *count, const int *found_inf) {      \
        add(K, i, LAUNCHES, 1);                                                                              \
        return real[K]->count_update(i, s, count, found_inf);                                                \
    }                                                                                                        \
    static gt_status name##_backend_init(gt_backend *be, int i, gt_stream *s) {                             \
        return init_counted(K, be, i, s);                                                                    \
    }                                                                                                        \
    static void name##_backend_release(gt_backend *be) { release_counted(K, be); }                          \
    static void name##_wrap(gt_device_backend *t) {                                                         \
        t->malloc = name##_malloc;                                                                           \
        t->free = name##_free;                                                                               \
        t->memcpy = name##_memcpy;                                                                           \
        t->memset = name##_memset;                                                                           \
        t->memcpy_async = name##_memcpy_async;                                                               \
        t->poison = name##_poison;                                                                           \
        t->stream_synchronize = name##_stream_synchronize;                                                   \
        t->event_synchronize = name##_event_synchronize;                                                     \
        t->adamw = name##_adamw;                                                                             \
        t->sgd = name##_sgd;                                                                                 \
        t->ema = name##_ema;                                                                                 \
        t->ema_swap = name##_ema_swap;                                                                       \
        t->grad_sumsq = name##_grad_sumsq;                                                                   \
        t->scaler_unscale_check = name##_unscale_check;                                                      \
        t->backend_init = name##_backend_init;                                                               \
        t->grad_sumsq_async = name##_grad_sumsq_async;                                                       \
        t->loss_accumulate = name##_loss_accumulate;                                                         \
        t->grad_clip = name##_grad_clip;                                                                     \
        t->scaler_update = name##_scaler_update;                                                             \
        t->allreduce_sum = name##_allreduce_sum;                                                             \
        t->broadcast = name##_broadcast;                                                                     \
        t->allgather = name##_allgather;                                                                     \
        t->backend_release = name##_backend_release;                                                         \
        t->adamw_table = name##_adamw_table;                                                                 \
        t->sgd_table = name##_sgd_table;                                                                     \
        t->count_update = name##_count_update;                                                               \
    }


/* ---- the op table: every call of a device backend's op is a launch; the ops whose contract
 * (ops/ops.h, and the backend's own notes) makes them wait for their stream also count a sync ---- */

static const gt_ops *real_ops[GT_DEVICE_KINDS];  /* each kind's own op table, set by backend_init */
static gt_ops counted_ops[GT_DEVICE_KINDS];      /* the counting tables handed out */

/* Counts one op of `be` (and its wait when `waits`) and returns `be` with the kind's own table. */
static gt_backend op_begin(const gt_backend *be, int waits) {
    int kind = (int)be->device.kind;
    add(kind, be->device.index, LAUNCHES, 1);
    if (waits)
        add(kind, be->device.index, SYNCS, 1);
    gt_backend real = *be;
    real.ops = real_ops[kind];
    return real;
}

/* 1 when an op of `kind` waits for its stream (GT_OP_LIST's kinds: sum_squares, on every device;
 * the ops that check ids, targets or lengths on the device report a bad one at the stream's next
 * wait, on CUDA as on sim, and count as launches only). */
static int op_waits(gt_op_kind kind) { return kind == GT_OP_WAIT; }

/* counted_<op> for each op of GT_OP_LIST but the queries, which launch nothing and pass through. */
#define COUNTED_QUERY(kind, name, params)
#define COUNTED_LAUNCH(kind, name, params)                                                        \
    static gt_status counted_##name(gt_backend *be params(GT_OP_DECL_P, GT_OP_DECL_A)) {          \
        gt_backend real = op_begin(be, op_waits(GT_OP_##kind));                               \
        return real.ops->name(&real params(GT_OP_ARG, GT_OP_ARG));                                \
    }
#define COUNTED_OP(kind, name, params, skip) GT_OP_SELECT(kind, COUNTED_QUERY, COUNTED_LAUNCH)(kind, name, params)
GT_OP_LIST(COUNTED_OP)

/* The counting copy of `ops` (the queries pass through; an op a backend lacks stays NULL). */
#define WRAP_QUERY(name)
#define WRAP_LAUNCH(name) t->name = ops->name ? counted_##name : NULL;
#define WRAP_OP(kind, name, params, skip) GT_OP_SELECT(kind, WRAP_QUERY, WRAP_LAUNCH)(name)
static void wrap_ops(gt_ops *t, const gt_ops *ops) {
    *t = *ops;
    GT_OP_LIST(WRAP_OP)
}

/* backend_init of kind K hands out the counting op table; backend_release gives the backend its
 * own table back first (a backend may check which table it was given). */
static gt_status init_counted(int kind, gt_backend *be, int index, gt_stream *stream) {
    GT_TRY(real[kind]->backend_init(be, index, stream));
    static pthread_mutex_t ops_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&ops_lock);
    if (real_ops[kind] != be->ops) {
        wrap_ops(&counted_ops[kind], be->ops);
        real_ops[kind] = be->ops;
    }
    pthread_mutex_unlock(&ops_lock);
    be->ops = &counted_ops[kind];
    return GT_OK;
}

static void release_counted(int kind, gt_backend *be) {
    if (be->ops == &counted_ops[kind])
        be->ops = real_ops[kind];
    real[kind]->backend_release(be);
}

GT_COUNTING_WRAPPERS(cuda, GT_DEVICE_CUDA)
GT_COUNTING_WRAPPERS(sim, GT_DEVICE_SIM)

void gt_device_backend_install(gt_device_kind kind, const gt_device_backend *table) {
    if (kind == GT_DEVICE_CPU) {
        real[kind] = table;
        atomic_store(&tables[kind], table);
        return;
    }
    if (kind != GT_DEVICE_CUDA && kind != GT_DEVICE_SIM)
        return;
    real[kind] = table;
    counted[kind] = *table;
    if (kind == GT_DEVICE_CUDA)
        cuda_wrap(&counted[kind]);
    else
        sim_wrap(&counted[kind]);
    atomic_store(&tables[kind], &counted[kind]);
}

void gt_device_counters_get(gt_device device, gt_device_counters *out) {
    uint64_t v[COUNTERS] = {0};
    int ok = (device.kind == GT_DEVICE_CUDA || device.kind == GT_DEVICE_SIM) && device.index >= 0 &&
             device.index < GT_MAX_CUDA_DEVICES;
    for (int f = 0; ok && f < COUNTERS; f++)
        v[f] = atomic_load(&counts[device.kind][device.index][f]);
    *out = (gt_device_counters){.syncs = v[SYNCS], .launches = v[LAUNCHES], .h2d_bytes = v[H2D],
                                .d2h_bytes = v[D2H], .d2d_bytes = v[D2D], .allocs = v[ALLOCS], .frees = v[FREES]};
}

void gt_device_counters_reset(gt_device device) {
    if ((device.kind != GT_DEVICE_CUDA && device.kind != GT_DEVICE_SIM) || device.index < 0 ||
        device.index >= GT_MAX_CUDA_DEVICES)
        return;
    for (int f = 0; f < COUNTERS; f++)
        atomic_store(&counts[device.kind][device.index][f], 0);
}

const gt_device_backend *gt_device_backend_of(gt_device device) {
    if ((int)device.kind < 0 || (int)device.kind >= GT_DEVICE_KINDS)
        return NULL;
    return atomic_load(&tables[device.kind]);
}

gt_status gt_device_backend_get(gt_device device, const char *arg_name, const gt_device_backend **out) {
    *out = gt_device_backend_of(device);
    if (*out)
        return GT_OK;
    char name[32];
    gt_device_name(device, name, sizeof name);
    int cuda = device.kind == GT_DEVICE_CUDA;  /* a CudaError in Python */
    if (device.kind == GT_DEVICE_PINNED)
        return GT_FAIL(GT_ERR_VALUE, "%s: 'pinned' is host memory for transfers, not a device to compute on",
                       arg_name);
    return GT_FAIL(cuda ? GT_ERR_CUDA : GT_ERR_RUNTIME,
                   "%s: '%s' needs the %s backend, which was not compiled into this build of gputrain",
                   arg_name, name, cuda ? "CUDA" : device.kind == GT_DEVICE_CPU ? "cpu" : "sim");
}
