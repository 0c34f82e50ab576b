/* The device interface: what nn/, train/ and data/ need from a device (CUDA, the simulated
 * device "sim", or the CPU), as one table of functions per device kind. The CPU's table
 * (sim/cpu_table.c) is over host memory: its copies are memcpy, its streams and events do
 * nothing (the work is done when it is queued), and its kernels run on the calling thread.
 *
 * Conventions of every function below:
 *  - `index` is the device ordinal (cuda:N, sim:N); functions that take one make it current.
 *  - A stream is an ordered queue of work on one device. The stream NULL is the device's
 *    default stream: a stream gputrain creates per device (CUDA: non-blocking, never CUDA's
 *    legacy default stream; sim: a worker thread); blocking copies and fills run in its
 *    order, and the work of other streams is ordered against it only through events.
 *  - Pointers are device pointers unless the name says host; a copy takes any mix of device
 *    and host memory (the direction follows from the pointers).
 *  - Kernels (adamw ... scaler_unscale_check, grad_sumsq_async, loss_accumulate, grad_clip,
 *    scaler_update, adamw_table, sgd_table, count_update) queue their
 *    work on `stream` and return after the launch, except grad_sumsq, whose result is a host
 *    value: it waits for the stream.
 * The backends register their tables at module start-up (gt_device_backend_install), so the
 * core never includes a backend's headers (the layering of DESIGN.md). */
#ifndef GT_DEVICE_BACKEND_H
#define GT_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/adamw.h"
#include "core/adamw8bit.h"
#include "core/device.h"
#include "core/scaler_rules.h"
#include "core/sgd.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gt_backend;  /* ops/ops.h */
struct gt_comm;     /* dist/comm.h */

typedef struct gt_stream gt_stream;  /* a backend's stream (layout private to the backend) */
typedef struct gt_event gt_event;    /* a backend's event (layout private to the backend) */

/* Where a deferred update (train/optim.h's gt_optimizer_step_deferred) finds its constants and
 * whether it runs, all in device memory, so that nothing of it is decided on the host: the run's
 * constants for the update applied when the device's count of updates is c are
 * entries[(c % ring) * stride] (gt_adamw_scalars or gt_sgd_scalars), and *found_inf != 0 (the
 * step's inf flag) skips the update. */
typedef struct gt_update_table {
    const void *entries;    /* this run's constants for count 0 mod ring; (ring, stride) scalars */
    size_t stride;          /* scalars per ring slot (one per parameter group) */
    uint32_t ring;          /* ring slots, > 0 */
    const uint64_t *count;  /* updates applied so far (device) */
    const int *found_inf;   /* the step's inf flag (device) */
} gt_update_table;

typedef struct gt_device_backend {
    const char *name;  /* "cuda", "sim" or "cpu" */

    /* ---- memory: the allocator's pools call these (core/alloc.c) ---- */
    int (*device_count)(void);                                        /* usable devices; 0: none */
    gt_status (*malloc)(int index, size_t bytes, void **out);         /* GT_ERR_OOM when refused */
    void (*free)(int index, void *ptr);                               /* after the device's work */
    gt_status (*mem_get_info)(int index, size_t *free_bytes, size_t *total_bytes);

    /* ---- copies and fills ---- */
    /* dst = src (bytes), ordered after the default stream's work; returns when done. */
    gt_status (*memcpy)(int index, void *dst, const void *src, size_t bytes);
    /* Sets bytes of device memory to the byte `value`, ordered as memcpy; returns when done. */
    gt_status (*memset)(int index, void *dst, int value, size_t bytes);
    /* Queues dst = src (bytes) on `stream`; host memory must stay valid until it has run. */
    gt_status (*memcpy_async)(int index, gt_stream *stream, void *dst, const void *src, size_t bytes);
    /* The contents of `bytes` at `ptr` are dead once the work queued on `stream` so far has run
     * (a released buffer): sim queues a fill with 0xFF (NaN as floats) there, so a reader not
     * ordered before the release sees poison; CUDA does nothing. */
    gt_status (*poison)(int index, gt_stream *stream, void *ptr, size_t bytes);

    /* ---- streams and events ---- */
    gt_status (*stream_create)(int index, gt_stream **out);           /* not the default stream */
    void (*stream_destroy)(int index, gt_stream *stream);             /* waits for it; NULL ignored */
    gt_status (*stream_synchronize)(int index, gt_stream *stream);    /* blocks until it is idle */
    /* Later work on `stream` waits until `event`'s last record has completed (host not blocked). */
    gt_status (*stream_wait_event)(int index, gt_stream *stream, gt_event *event);
    gt_status (*event_create)(int index, gt_event **out);
    void (*event_destroy)(int index, gt_event *event);                /* NULL ignored */
    /* Captures the work queued on `stream` so far; the event completes when that work has. */
    gt_status (*event_record)(int index, gt_event *event, gt_stream *stream);
    gt_status (*event_query)(int index, gt_event *event, int *done);  /* 1: completed or unrecorded */
    gt_status (*event_synchronize)(int index, gt_event *event);       /* blocks until completed */
    /* The native handle behind a stream (CUDA: the cudaStream_t), for consumers outside gputrain. */
    void *(*stream_native)(gt_stream *stream);

    /* ---- the training step's kernels, with the element math of core/ ---- */
    gt_status (*adamw)(int index, gt_stream *stream, gt_numerics numerics, const gt_adamw_scalars *s,
                       float *p, const float *g, float *m, float *v, float *v_max, size_t n);
    gt_status (*sgd)(int index, gt_stream *stream, const gt_sgd_scalars *s, float *p, const float *g,
                     float *buf, size_t n);
    gt_status (*ema)(int index, gt_stream *stream, float *ema, const float *p, float weight, size_t n);
    gt_status (*ema_swap)(int index, gt_stream *stream, float *ema, float *p, size_t n);
    /* *out (host) = sum of x[i]^2 in core/sumsq_order.h's order; waits for the result. */
    gt_status (*grad_sumsq)(int index, gt_stream *stream, const float *x, size_t n, double *out);
    /* grad *= 1 / scale of *scaler, *found_inf = 1 if an element was not finite (all three
     * device pointers; *found_inf is otherwise left as it was). */
    gt_status (*scaler_unscale_check)(int index, gt_stream *stream, const gt_scaler *scaler,
                                      float *grad, size_t n, int *found_inf);

    /* ---- the op table (ops/ops.h) ---- */
    /* Fills `be` with the device's op table queueing on `stream`; release it with backend_release. */
    gt_status (*backend_init)(struct gt_backend *be, int index, gt_stream *stream);
    void (*backend_release)(struct gt_backend *be);  /* waits for its stream; impl NULL ignored */
    size_t backend_scratch_bytes;  /* device bytes backend_init allocates for itself (the plan counts them) */

    /* ---- arrays of other libraries (DLPack, the CUDA array interface) ---- */
    /* The stream behind a handle another library gave, in those protocols' convention: 1 the
     * default stream (CUDA: the legacy one), 2 the per-thread default stream, otherwise what
     * stream_native returned for a live stream. GT_ERR_VALUE naming `arg_name` for 0 and for a
     * handle the backend knows is none (sim checks its streams; CUDA cannot). */
    gt_status (*stream_from_native)(int index, uintptr_t handle, const char *arg_name, gt_stream **out);
    /* *index = the ordinal of the device of this kind whose memory holds `ptr`; -1 when `ptr` is
     * not device memory of this kind (host, pinned or unknown memory). */
    gt_status (*pointer_device)(const void *ptr, int *index);

    /* ---- the training step's bookkeeping on the device (nothing waits) ---- */
    /* *out (device) = sum of x[i]^2 in core/sumsq_order.h's order, the same bits as grad_sumsq;
     * totals: (GT_SUMSQ_MAX_CHUNKS,) device doubles of scratch. */
    gt_status (*grad_sumsq_async)(int index, gt_stream *stream, const float *x, size_t n, double *out,
                                  double *totals);
    /* *loss_sum (device double) += gt_loss_mean(values, rows, count) (core/loss_mean.h); values
     * (rows,) and count (or NULL for an MSE's mean) are device memory. */
    gt_status (*loss_accumulate)(int index, gt_stream *stream, const float *values, int64_t rows,
                                 const int64_t *count, double *loss_sum);
    /* grad[0..n) *= min(1, max_norm / (sqrt(*sumsq) + 1e-6)) in fp32 (core/clip_rules.h; nothing is
     * written when that is 1), *sumsq a device double: clipping decided on the device, no wait. */
    gt_status (*grad_clip)(int index, gt_stream *stream, float *grad, size_t n, const double *sumsq,
                           double max_norm);
    /* The scaler's end-of-step update (growth/backoff, core/scaler_rules.h) of *scaler from
     * *found_inf, both device memory; a disabled scaler is left as it is. */
    gt_status (*scaler_update)(int index, gt_stream *stream, gt_scaler *scaler, const int *found_inf);

    /* ---- collectives over comm's ranks, queued on `stream` like kernels (nothing waits) ---- */
    /* buf (n elements of dtype GT_F32 or GT_F64, device memory) becomes the sum of every rank's buf
     * in rank order ((x_0 + x_1) + x_2 ..., dist/comm.h), the bits of the host's all-reduce. A rank
     * that does not answer within comm's timeout fails the collective: the stream's next wait
     * returns it (sticky) and comm is failed. */
    gt_status (*allreduce_sum)(int index, gt_stream *stream, struct gt_comm *comm, gt_dtype dtype, void *buf,
                               size_t n);
    /* buf (bytes of device memory) becomes rank `root`'s on every rank, with the same failures. */
    gt_status (*broadcast)(int index, gt_stream *stream, struct gt_comm *comm, void *buf, size_t bytes, int root);
    /* buf (n f32 of device memory) cut into comm->size chunks (gt_comm_chunk): chunk r becomes rank
     * r's on every rank (ZeRO-1's updated shards to every rank), with the same failures. */
    gt_status (*allgather)(int index, gt_stream *stream, struct gt_comm *comm, float *buf, size_t n);

    /* ---- the deferred update: constants and the skip read on the device (nothing waits) ---- */
    /* adamw / sgd above with the scalars `t` points at for the device's count; nothing is written
     * when *t->found_inf. */
    gt_status (*adamw_table)(int index, gt_stream *stream, gt_numerics numerics, const gt_update_table *t,
                             float *p, const float *g, float *m, float *v, float *v_max, size_t n);
    gt_status (*sgd_table)(int index, gt_stream *stream, const gt_update_table *t, float *p, const float *g,
                           float *buf, size_t n);
    /* *count += 1 unless *found_inf (both device memory): the update count the tables index by. */
    gt_status (*count_update)(int index, gt_stream *stream, uint64_t *count, const int *found_inf);

    /* 1 when the device's memory is the host's own (the cpu): the host may read and write it
     * directly, and a host input needs no copy in; 0 for an accelerator (cuda, sim). */
    int host_memory;

    /* 8-bit AdamW over one parameter of n elements (ops/adamw8bit_hd.h; blocks start at p[0]):
     * c1, c2 (n,) codes and absmax1, absmax2 (ceil(n / GT_ADAMW8_BLOCK),) updated in place. */
    gt_status (*adamw8bit)(int index, gt_stream *stream, const gt_adamw8_scalars *s, float *p, const float *g,
                           uint8_t *c1, uint8_t *c2, float *absmax1, float *absmax2, size_t n);
} gt_device_backend;

/* What gputrain asked of a device through its table since the last reset, counted by the table
 * that gt_device_backend_of returns (the same wrappers for every backend). */
typedef struct gt_device_counters {
    uint64_t syncs;      /* host waits: memcpy, memset, stream/event synchronize, grad_sumsq, and the
                            ops that wait for their stream (sum_squares; GT_OP_LIST's WAIT kind) */
    uint64_t launches;   /* work queued: async copies, fills, poison, the step's kernels and every
                            call of the op table (ops/ops.h) the backend hands out */
    uint64_t h2d_bytes;  /* bytes copied from host to device memory (blocking and queued copies) */
    uint64_t d2h_bytes;  /* bytes copied from device to host memory */
    uint64_t d2d_bytes;  /* bytes copied within device memory */
    uint64_t allocs;     /* device allocations (the table's malloc) */
    uint64_t frees;      /* device frees */
} gt_device_counters;

/* The counters of accelerator `device` (zeros for an ordinal beyond GT_MAX_CUDA_DEVICES). */
void gt_device_counters_get(gt_device device, gt_device_counters *out);

/* Sets the counters of `device` to zero. */
void gt_device_counters_reset(gt_device device);

/* Registers the table of a device kind: for an accelerator (GT_DEVICE_CUDA or GT_DEVICE_SIM)
 * the registered table is a copy whose functions count (gt_device_counters) and call `table`'s;
 * the CPU's (GT_DEVICE_CPU) is registered as it is (nothing of it is a launch or a wait). */
void gt_device_backend_install(gt_device_kind kind, const gt_device_backend *table);

/* The table of `device`'s kind; NULL for pinned and for a kind not compiled in. */
const gt_device_backend *gt_device_backend_of(gt_device device);

/* The table of `device`, or (naming `arg_name`) GT_ERR_CUDA for a CUDA device and
 * GT_ERR_RUNTIME otherwise when its backend is not in this build. */
gt_status gt_device_backend_get(gt_device device, const char *arg_name, const gt_device_backend **out);

#ifdef __cplusplus
}
#endif
#endif
