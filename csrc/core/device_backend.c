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
        t->backend_release = name##_backend_release;                                                         \
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

/* 1 for CUDA, whose softmax_xent, mse and embedding ops read a count, a sum or the first bad id
 * back to check and scale (sim's report a bad target or id at the stream's next wait). */
static int cuda_kind(const gt_backend *be) { return be->device.kind == GT_DEVICE_CUDA; }

#define GT_COUNTED_OP(op, waits, params, ...)                                                                 \
    static gt_status counted_##op params {                                                                  \
        gt_backend real = op_begin(be, waits);                                                               \
        return real.ops->op(&real, __VA_ARGS__);                                                             \
    }

GT_COUNTED_OP(gemm, 0, (gt_backend *be, const gt_gemm_args *a), a)
GT_COUNTED_OP(bias_add, 0, (gt_backend *be, void *out, const float *bias, int64_t rows, int64_t cols, gt_dtype dt),
              out, bias, rows, cols, dt)
GT_COUNTED_OP(bias_backward, 0, (gt_backend *be, float *dbias, const void *dout, int64_t rows, int64_t cols,
                                 gt_dtype dt, int accumulate), dbias, dout, rows, cols, dt, accumulate)
GT_COUNTED_OP(activation_forward, 0, (gt_backend *be, void *out, const void *in, int64_t n, gt_activation act,
                                      gt_dtype dt), out, in, n, act, dt)
GT_COUNTED_OP(activation_backward, 0, (gt_backend *be, void *din, const void *dout, const void *in, int64_t n,
                                       gt_activation act, gt_dtype dt), din, dout, in, n, act, dt)
GT_COUNTED_OP(dropout_forward, 0, (gt_backend *be, void *out, const void *in, int64_t n, double p,
                                   gt_dropout_key key, gt_dtype dt), out, in, n, p, key, dt)
GT_COUNTED_OP(dropout_backward, 0, (gt_backend *be, void *din, const void *dout, int64_t n, double p,
                                    gt_dropout_key key, gt_dtype dt), din, dout, n, p, key, dt)
GT_COUNTED_OP(add, 0, (gt_backend *be, void *out, const void *a, const void *b, int64_t n, gt_dtype dt),
              out, a, b, n, dt)
GT_COUNTED_OP(layernorm_forward, 0, (gt_backend *be, void *out, float *mean, float *rstd, const void *in,
                                     const float *weight, const float *bias, int64_t rows, int64_t cols, float eps,
                                     gt_dtype dt), out, mean, rstd, in, weight, bias, rows, cols, eps, dt)
GT_COUNTED_OP(layernorm_backward, 0, (gt_backend *be, void *din, float *dweight, float *dbias, const void *dout,
                                      const void *in, const float *weight, const float *mean, const float *rstd,
                                      int64_t rows, int64_t cols, gt_dtype dt, int accumulate),
              din, dweight, dbias, dout, in, weight, mean, rstd, rows, cols, dt, accumulate)
GT_COUNTED_OP(embedding_forward, cuda_kind(be), (gt_backend *be, void *out, const int64_t *ids, const float *table, int64_t n,
                                     int64_t num, int64_t dim, gt_dtype dt), out, ids, table, n, num, dim, dt)
GT_COUNTED_OP(embedding_backward, cuda_kind(be), (gt_backend *be, float *dtable, const void *dout, const int64_t *ids,
                                      int64_t n, int64_t num, int64_t dim, gt_dtype dt, int accumulate),
              dtable, dout, ids, n, num, dim, dt, accumulate)
GT_COUNTED_OP(softmax_xent, cuda_kind(be), (gt_backend *be, float *losses, int64_t *count, void *dlogits,
                                            const void *logits, const int64_t *targets, int64_t rows,
                                            int64_t classes, float label_smoothing, int64_t ignore_index,
                                            float dloss_scale, gt_dtype dt),
              losses, count, dlogits, logits, targets, rows, classes, label_smoothing, ignore_index, dloss_scale, dt)
GT_COUNTED_OP(mse, cuda_kind(be), (gt_backend *be, float *loss, void *dpred, const void *pred, const float *target,
                                   int64_t n, float dloss_scale, gt_dtype dt), loss, dpred, pred, target, n,
              dloss_scale, dt)
GT_COUNTED_OP(sum_squares, 1, (gt_backend *be, double *out, const float *x, int64_t n), out, x, n)
GT_COUNTED_OP(cast, 0, (gt_backend *be, void *dst, gt_dtype dst_dt, const void *src, gt_dtype src_dt, int64_t n),
              dst, dst_dt, src, src_dt, n)
GT_COUNTED_OP(copy, 0, (gt_backend *be, void *dst, const void *src, size_t bytes), dst, src, bytes)
GT_COUNTED_OP(zero, 0, (gt_backend *be, void *dst, size_t bytes), dst, bytes)
GT_COUNTED_OP(attention_forward, 0, (gt_backend *be, const gt_attention_args *a), a)
GT_COUNTED_OP(attention_backward, 0, (gt_backend *be, const gt_attention_args *a), a)

/* The counting copy of `ops` (the queries that launch nothing pass through). */
static void wrap_ops(gt_ops *t, const gt_ops *ops) {
    *t = *ops;
    t->gemm = counted_gemm;
    t->bias_add = counted_bias_add;
    t->bias_backward = counted_bias_backward;
    t->activation_forward = counted_activation_forward;
    t->activation_backward = counted_activation_backward;
    t->dropout_forward = counted_dropout_forward;
    t->dropout_backward = counted_dropout_backward;
    t->add = counted_add;
    t->layernorm_forward = counted_layernorm_forward;
    t->layernorm_backward = counted_layernorm_backward;
    t->embedding_forward = counted_embedding_forward;
    t->embedding_backward = counted_embedding_backward;
    t->softmax_xent = counted_softmax_xent;
    t->mse = counted_mse;
    t->sum_squares = counted_sum_squares;
    t->cast = counted_cast;
    t->copy = counted_copy;
    t->zero = counted_zero;
    t->attention_forward = ops->attention_forward ? counted_attention_forward : NULL;
    t->attention_backward = ops->attention_backward ? counted_attention_backward : NULL;
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
    return GT_FAIL(cuda ? GT_ERR_CUDA : GT_ERR_RUNTIME,
                   "%s: '%s' needs the %s backend, which was not compiled into this build of gputrain",
                   arg_name, name, cuda ? "CUDA" : "sim");
}
