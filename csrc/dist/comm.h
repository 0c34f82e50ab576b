/* Collective communication between the ranks of a data-parallel job: a table of functions
 * (gt_comm_ops) that each host transport implements once (MPI: comm_mpi.c), and the
 * collectives built on it. Every wait has a deadline: a rank that died or stopped answering makes
 * the others fail with GT_ERR_TIMEOUT instead of hanging, and the communicator is then unusable.
 *
 * Layout: a buffer of n elements is cut into `size` chunks, chunk r = [n*r/size, n*(r+1)/size)
 * (gt_comm_chunk). Reductions sum in RANK ORDER ((x_0 + x_1) + x_2 ...), whatever rank does the
 * sum, so the result is deterministic and equal to a one-process gradient accumulation over the
 * ranks' micro-batches in rank order. */
#ifndef GT_DIST_COMM_H
#define GT_DIST_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_comm gt_comm;
typedef struct gt_comm_pending gt_comm_pending;  /* an exchange in flight (the transport's) */

/* A transport: point-to-point exchanges of host memory that every collective is made of. A
 * device model's collectives run on its device instead (dist/comm_device.h; on CUDA over NCCL,
 * cuda/comm_nccl.h), with this transport for what they exchange on the host (NCCL's id). */
typedef struct gt_comm_ops {
    /* Sends send_bytes[p] bytes from send[p] to every peer p != rank and receives recv_bytes[p]
     * bytes from every peer into recv[p] (NULL or 0 bytes: nothing with that peer), all at once;
     * returns when all completed, or GT_ERR_TIMEOUT at the communicator's deadline. */
    gt_status (*exchange)(gt_comm *comm, const void *const *send, const size_t *send_bytes,
                          void *const *recv, const size_t *recv_bytes);
    /* The same exchange as collective number `call` (its messages' tag), started without
     * waiting: *out is in flight until `test` says done. */
    gt_status (*start)(gt_comm *comm, uint64_t call, const void *const *send, const size_t *send_bytes,
                       void *const *recv, const size_t *recv_bytes, gt_comm_pending **out);
    /* Progresses `x` once without blocking; *done = 1 (and x is freed) once it completed, or
     * GT_ERR_TIMEOUT past the communicator's deadline counted from its start. */
    gt_status (*test)(gt_comm *comm, gt_comm_pending *x, int *done);
    void (*abandon)(gt_comm *comm, gt_comm_pending *x);  /* cancels and frees an unfinished x */
    void (*free)(gt_comm *comm);  /* releases the transport's state (not the processes' library) */
} gt_comm_ops;

struct gt_comm {
    const gt_comm_ops *ops;   /* the transport */
    void *impl;               /* the transport's state */
    int rank;                 /* this process, in [0, size) */
    int size;                 /* the number of ranks (world size) */
    double timeout_s;         /* the longest one collective may wait, seconds */
    int failed;               /* 1 after a timeout or transport error: every later call fails */
    uint64_t bytes_sent;      /* bytes this rank sent since creation (counter for benchmarks) */
    uint64_t calls;           /* collectives started (tags messages so stale ones never match) */
    size_t bucket_elems;      /* f32 elements per overlapped gradient bucket (gt_comm_overlap) */
    uint64_t buckets_early;   /* overlapped buckets started before the backward ended (counter) */
    float *scratch;           /* (size - 1, GT_COMM_BUCKET / size + 1) f32 received chunks */
    struct gt_comm_device *device;     /* the stream a device model's collectives run on (comm_device.h) */
    void *device_impl;                 /* a device backend's state for this communicator (NCCL's), or NULL */
    void (*device_impl_free)(void *impl);  /* releases device_impl; set with it */
    int device_failed;                 /* 1 once a collective queued on a device failed */
    gt_error_state device_failure;     /* that failure's message */
};

enum { GT_COMM_BUCKET = 1 << 20 };  /* f32 elements per all-reduce bucket (4 MiB) */

/* [*first, *first + *count) of chunk `r` of n elements split into `size` chunks. */
void gt_comm_chunk(size_t n, int size, int r, size_t *first, size_t *count);

/* Allocates the scratch of a communicator whose ops, impl, rank, size and timeout are set. */
gt_status gt_comm_init(gt_comm *comm);
void gt_comm_free(gt_comm *comm);  /* the transport, the scratch, the device state; comm itself is the caller's */

/* buf (n f32, the same n on every rank) becomes the rank-order sum of every rank's buf,
 * bucket by bucket (GT_COMM_BUCKET elements): a reduce-scatter then an all-gather, which sends
 * 2 (size - 1) / size x 4n bytes per rank, a ring's minimum. */
gt_status gt_comm_allreduce_sum_f32(gt_comm *comm, float *buf, size_t n);

/* Chunk `rank` of buf (n f32, at most GT_COMM_BUCKET) becomes the rank-order sum of every
 * rank's chunk `rank`; the other chunks are left as they were. */
gt_status gt_comm_reduce_scatter_f32(gt_comm *comm, float *buf, size_t n);

/* ZeRO's reduce-scatter over the whole of buf (n f32, any n): chunk `rank` of n split into
 * `size` chunks (gt_comm_chunk) becomes the rank-order sum of every rank's chunk `rank`, the
 * same sums as gt_comm_allreduce_sum_f32's there; the other chunks are left as they were.
 * Sent in pieces of at most GT_COMM_BUCKET / size + 1 elements per peer, (size - 1) / size x 4n
 * bytes per rank in all. gt_comm_allgather(buf, n, 4) is its other half. */
gt_status gt_comm_reduce_scatter_shards_f32(gt_comm *comm, float *buf, size_t n);

/* Every rank's chunk r of buf (n elements of elem_bytes) is sent to every other rank, so that
 * all ranks end with every chunk (chunk r from rank r). */
gt_status gt_comm_allgather(gt_comm *comm, void *buf, size_t n, size_t elem_bytes);

/* Overlapped all-reduce (gt_comm_overlap_*): buf (n f32) summed over the ranks in rank order,
 * like gt_comm_allreduce_sum_f32 and bit-identical to it, in buckets of `bucket` elements taken
 * from the END of buf (the order a backward pass finishes parameter gradients): bucket k is
 * [n - (k+1) bucket, n - k bucket) and is started as soon as its elements are final, while
 * the caller goes on computing; every exchange is progressed (MPI_Test) at each call. */
typedef struct gt_comm_bucket {
    size_t first, count;        /* its elements of buf */
    int phase;                  /* 0 not started, 1 reduce-scatter, 2 all-gather in flight, 3 summed */
    gt_comm_pending *pending;   /* the exchange in flight in phases 1 and 2 */
    float *scratch;             /* (size - 1, count / size + 1) f32 received chunks */
} gt_comm_bucket;

typedef struct gt_comm_overlap {
    gt_comm *comm;              /* the communicator */
    float *buf;                 /* (n,) f32 summed in place */
    size_t n;                   /* elements of buf */
    gt_comm_bucket *buckets;    /* (num_buckets) from the end of buf */
    size_t num_buckets;         /* ceil(n / bucket) */
    size_t started;             /* buckets started so far (they start in order) */
    uint64_t first_call;        /* bucket k's phase p is collective first_call + 2 k + p - 1 on every
                                   rank, whatever order the exchanges complete in */
} gt_comm_overlap;

/* Prepares the buckets (no communication); `bucket` >= 1 elements, enlarged so that there are
 * at most 8192 (each bucket's two exchanges get message tags of their own). */
gt_status gt_comm_overlap_begin(gt_comm *comm, float *buf, size_t n, size_t bucket, gt_comm_overlap *ov);
/* buf[final_from, n) is final: starts every bucket inside it, progresses those in flight. */
gt_status gt_comm_overlap_ready(gt_comm_overlap *ov, size_t final_from);
/* Starts the rest and waits for every bucket (GT_ERR_TIMEOUT at the deadline); frees ov. */
gt_status gt_comm_overlap_finish(gt_comm_overlap *ov);
/* Abandons the exchanges in flight after a failure; frees ov (the communicator is failed). */
void gt_comm_overlap_abandon(gt_comm_overlap *ov);

/* buf (bytes) on every rank becomes root's. */
gt_status gt_comm_broadcast(gt_comm *comm, void *buf, size_t bytes, int root);

/* Returns once every rank called it (or GT_ERR_TIMEOUT). */
gt_status gt_comm_barrier(gt_comm *comm);

/* The rank-order sum of every rank's `value` (f64), the same on every rank. */
gt_status gt_comm_sum_f64(gt_comm *comm, double value, double *out);

#ifdef __cplusplus
}
#endif
#endif
