/* The collectives of comm.h, made of the transport's exchanges (one per phase). */
#include "dist/comm.h"
#include "dist/comm_device.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { GT_COMM_MAX_RANKS = 1 << 16, GT_COMM_OVERLAP_BUCKET = 25 << 18 /* 25 MiB of f32, as DDP */,
       GT_COMM_MAX_BUCKETS = 8192 /* 2 collectives each: tags stay distinct in a transport's span */ };

void gt_comm_chunk(size_t n, int size, int r, size_t *first, size_t *count) {
    size_t begin = n / (size_t)size * (size_t)r + n % (size_t)size * (size_t)r / (size_t)size;
    size_t end = n / (size_t)size * (size_t)(r + 1) + n % (size_t)size * (size_t)(r + 1) / (size_t)size;
    *first = begin;
    *count = end - begin;
}

static size_t scratch_slot(const gt_comm *comm) { return GT_COMM_BUCKET / (size_t)comm->size + 1; }

gt_status gt_comm_init(gt_comm *comm) {
    if (comm->size < 1 || comm->size > GT_COMM_MAX_RANKS || comm->rank < 0 || comm->rank >= comm->size)
        return GT_FAIL(GT_ERR_VALUE, "rank %d of world size %d: need 0 <= rank < size <= %d", comm->rank,
                       comm->size, GT_COMM_MAX_RANKS);
    if (!(comm->timeout_s > 0.0))
        return GT_FAIL(GT_ERR_VALUE, "timeout must be > 0 seconds, got %g", comm->timeout_s);
    if (!comm->bucket_elems)
        comm->bucket_elems = GT_COMM_OVERLAP_BUCKET;
    size_t floats = (size_t)(comm->size - 1) * scratch_slot(comm);
    comm->scratch = floats ? malloc(floats * sizeof(float)) : NULL;
    if (floats && !comm->scratch)
        return GT_FAIL(GT_ERR_OOM, "communicator scratch: out of host memory (%zu bytes)", floats * sizeof(float));
    return GT_OK;
}

void gt_comm_free(gt_comm *comm) {
    gt_comm_device_free(comm);  /* its stream's collectives may use the transport and device_impl */
    if (comm->device_impl_free)
        comm->device_impl_free(comm->device_impl);
    if (comm->ops && comm->ops->free)
        comm->ops->free(comm);
    free(comm->scratch);
    comm->scratch = NULL;
    comm->device_impl = NULL;
    comm->device_impl_free = NULL;
    comm->impl = NULL;
}

/* Per-peer pointers and byte counts of one exchange (4 arrays of comm->size). */
typedef struct exchange_plan {
    const void **send;  /* (size) what goes to each peer */
    size_t *send_bytes; /* (size) its bytes; 0 for this rank */
    void **recv;        /* (size) where each peer's bytes go */
    size_t *recv_bytes; /* (size) their bytes; 0 for this rank */
} exchange_plan;

static gt_status plan_alloc(const gt_comm *comm, exchange_plan *p) {
    size_t n = (size_t)comm->size;
    p->send = calloc(n, sizeof *p->send);
    p->send_bytes = calloc(n, sizeof *p->send_bytes);
    p->recv = calloc(n, sizeof *p->recv);
    p->recv_bytes = calloc(n, sizeof *p->recv_bytes);
    if (p->send && p->send_bytes && p->recv && p->recv_bytes)
        return GT_OK;
    free(p->send), free(p->send_bytes), free(p->recv), free(p->recv_bytes);
    return GT_FAIL(GT_ERR_OOM, "communicator: out of host memory for %d peers", comm->size);
}

static void plan_free(exchange_plan *p) {
    free(p->send), free(p->send_bytes), free(p->recv), free(p->recv_bytes);
}

/* Runs the exchange of `p`, counting the bytes sent; a failure leaves the communicator failed. */
static gt_status run_exchange(gt_comm *comm, exchange_plan *p) {
    comm->calls++;
    gt_status status = comm->ops->exchange(comm, (const void *const *)p->send, p->send_bytes,
                                           (void *const *)p->recv, p->recv_bytes);
    if (status != GT_OK) {
        comm->failed = 1;
        return status;
    }
    for (int r = 0; r < comm->size; r++)
        comm->bytes_sent += p->send_bytes[r];
    return GT_OK;
}

static gt_status check_usable(const gt_comm *comm) {
    if (comm->failed)
        return GT_FAIL(GT_ERR_RUNTIME, "the communicator failed earlier (a rank timed out or died); "
                       "restart the job from its last checkpoint");
    return GT_OK;
}

/* Each rank's buf chunk `rank`: acc = x_0 + x_1 + ... in rank order, x_rank the own chunk, the
 * peers' in `scratch` slots of `slot` f32. */
static void sum_rank_order(const gt_comm *comm, float *mine, size_t count, const float *scratch, size_t slot) {
    for (size_t i = 0; i < count; i++) {
        float acc = 0.0f;
        for (int p = 0; p < comm->size; p++) {
            float x = p == comm->rank ? mine[i] : scratch[(size_t)(p - (p > comm->rank)) * slot + i];
            acc = p == 0 ? x : acc + x;
        }
        mine[i] = acc;
    }
}

/* The exchange of a reduce-scatter of buf (n f32): chunk r to rank r, this rank's chunks from
 * every peer into `scratch` ((size - 1) slots of `slot` f32). */
static void plan_reduce_scatter(const gt_comm *comm, float *buf, size_t n, float *scratch, size_t slot,
                                exchange_plan *p) {
    size_t mine_first, mine_count;
    gt_comm_chunk(n, comm->size, comm->rank, &mine_first, &mine_count);
    for (int r = 0; r < comm->size; r++) {
        if (r == comm->rank)
            continue;
        size_t first, count;
        gt_comm_chunk(n, comm->size, r, &first, &count);
        p->send[r] = buf + first;
        p->send_bytes[r] = count * sizeof(float);
        p->recv[r] = scratch + (size_t)(r - (r > comm->rank)) * slot;
        p->recv_bytes[r] = mine_count * sizeof(float);
    }
}

/* After the reduce-scatter exchange: buf's chunk `rank` becomes the rank-order sum. */
static void finish_reduce_scatter(const gt_comm *comm, float *buf, size_t n, const float *scratch, size_t slot) {
    size_t mine_first, mine_count;
    gt_comm_chunk(n, comm->size, comm->rank, &mine_first, &mine_count);
    sum_rank_order(comm, buf + mine_first, mine_count, scratch, slot);
}

gt_status gt_comm_reduce_scatter_f32(gt_comm *comm, float *buf, size_t n) {
    GT_TRY(check_usable(comm));
    if (n > GT_COMM_BUCKET)
        return GT_FAIL(GT_ERR_VALUE, "reduce_scatter: at most %d elements per call, got %zu", GT_COMM_BUCKET, n);
    if (comm->size == 1)
        return GT_OK;
    exchange_plan p;
    GT_TRY(plan_alloc(comm, &p));
    plan_reduce_scatter(comm, buf, n, comm->scratch, scratch_slot(comm), &p);
    gt_status status = run_exchange(comm, &p);
    plan_free(&p);
    if (status == GT_OK)
        finish_reduce_scatter(comm, buf, n, comm->scratch, scratch_slot(comm));
    return status;
}

/* [*first, *first + *count) of piece k (of `slot` elements) of rank r's chunk of n. */
static void shard_piece(size_t n, int size, int r, size_t k, size_t slot, size_t *first, size_t *count) {
    size_t chunk_first, chunk_count;
    gt_comm_chunk(n, size, r, &chunk_first, &chunk_count);
    size_t skip = k * slot < chunk_count ? k * slot : chunk_count;
    *first = chunk_first + skip;
    *count = chunk_count - skip < slot ? chunk_count - skip : slot;
}

/* Piece k of the sharded reduce-scatter: every peer's piece k of its chunk to it, the own
 * piece k of every peer into scratch, then summed in rank order. */
static gt_status reduce_scatter_piece(gt_comm *comm, float *buf, size_t n, size_t k, exchange_plan *p) {
    size_t slot = scratch_slot(comm), mine_first, mine_count;
    shard_piece(n, comm->size, comm->rank, k, slot, &mine_first, &mine_count);
    for (int r = 0; r < comm->size; r++) {
        if (r == comm->rank)
            continue;
        size_t first, count;
        shard_piece(n, comm->size, r, k, slot, &first, &count);
        p->send[r] = buf + first;
        p->send_bytes[r] = count * sizeof(float);
        p->recv[r] = comm->scratch + (size_t)(r - (r > comm->rank)) * slot;
        p->recv_bytes[r] = mine_count * sizeof(float);
    }
    GT_TRY(run_exchange(comm, p));
    sum_rank_order(comm, buf + mine_first, mine_count, comm->scratch, slot);
    return GT_OK;
}

gt_status gt_comm_reduce_scatter_shards_f32(gt_comm *comm, float *buf, size_t n) {
    GT_TRY(check_usable(comm));
    if (comm->size == 1)
        return GT_OK;
    size_t slot = scratch_slot(comm), largest = n / (size_t)comm->size + 1;  /* the same on every rank */
    exchange_plan p;
    GT_TRY(plan_alloc(comm, &p));
    gt_status status = GT_OK;
    for (size_t k = 0; status == GT_OK && k * slot < largest; k++)
        status = reduce_scatter_piece(comm, buf, n, k, &p);
    plan_free(&p);
    return status;
}

/* The exchange of an all-gather: this rank's chunk to every peer, theirs into place. */
static void plan_allgather(const gt_comm *comm, void *buf, size_t n, size_t elem_bytes, exchange_plan *p) {
    size_t mine_first, mine_count;
    gt_comm_chunk(n, comm->size, comm->rank, &mine_first, &mine_count);
    for (int r = 0; r < comm->size; r++) {
        if (r == comm->rank)
            continue;
        size_t first, count;
        gt_comm_chunk(n, comm->size, r, &first, &count);
        p->send[r] = (char *)buf + mine_first * elem_bytes;
        p->send_bytes[r] = mine_count * elem_bytes;
        p->recv[r] = (char *)buf + first * elem_bytes;
        p->recv_bytes[r] = count * elem_bytes;
    }
}

gt_status gt_comm_allgather(gt_comm *comm, void *buf, size_t n, size_t elem_bytes) {
    GT_TRY(check_usable(comm));
    if (comm->size == 1)
        return GT_OK;
    exchange_plan p;
    GT_TRY(plan_alloc(comm, &p));
    plan_allgather(comm, buf, n, elem_bytes, &p);
    gt_status status = run_exchange(comm, &p);
    plan_free(&p);
    return status;
}

gt_status gt_comm_allreduce_sum_f32(gt_comm *comm, float *buf, size_t n) {
    for (size_t first = 0; first < n; first += GT_COMM_BUCKET) {
        size_t count = n - first < GT_COMM_BUCKET ? n - first : GT_COMM_BUCKET;
        GT_TRY(gt_comm_reduce_scatter_f32(comm, buf + first, count));
        GT_TRY(gt_comm_allgather(comm, buf + first, count, sizeof(float)));
    }
    return check_usable(comm);
}

gt_status gt_comm_broadcast(gt_comm *comm, void *buf, size_t bytes, int root) {
    GT_TRY(check_usable(comm));
    if (root < 0 || root >= comm->size)
        return GT_FAIL(GT_ERR_VALUE, "root must be in [0, %d), got %d", comm->size, root);
    if (comm->size == 1)
        return GT_OK;
    exchange_plan p;
    GT_TRY(plan_alloc(comm, &p));
    for (int r = 0; r < comm->size; r++) {
        if (comm->rank == root && r != root) {
            p.send[r] = buf;
            p.send_bytes[r] = bytes;
        }
    }
    if (comm->rank != root) {
        p.recv[root] = buf;
        p.recv_bytes[root] = bytes;
    }
    gt_status status = run_exchange(comm, &p);
    plan_free(&p);
    return status;
}

gt_status gt_comm_barrier(gt_comm *comm) {
    double unused;
    return gt_comm_sum_f64(comm, 0.0, &unused);
}

gt_status gt_comm_sum_f64(gt_comm *comm, double value, double *out) {
    double *all = calloc((size_t)comm->size, sizeof *all);
    if (!all)
        return GT_FAIL(GT_ERR_OOM, "communicator: out of host memory for %d peers", comm->size);
    all[comm->rank] = value;
    gt_status status = gt_comm_allgather(comm, all, (size_t)comm->size, sizeof *all);
    if (status == GT_OK) {
        double sum = all[0];
        for (int r = 1; r < comm->size; r++)
            sum += all[r];
        *out = sum;
    }
    free(all);
    return status;
}

/* ---- overlapped all-reduce ---- */

static size_t bucket_slot(const gt_comm *comm, const gt_comm_bucket *b) { return b->count / (size_t)comm->size + 1; }

gt_status gt_comm_overlap_begin(gt_comm *comm, float *buf, size_t n, size_t bucket, gt_comm_overlap *ov) {
    GT_TRY(check_usable(comm));
    if (bucket < 1)
        return GT_FAIL(GT_ERR_VALUE, "bucket: must be >= 1 elements, got %zu", bucket);
    *ov = (gt_comm_overlap){.comm = comm, .buf = buf, .n = n};
    if (bucket < (n + GT_COMM_MAX_BUCKETS - 1) / GT_COMM_MAX_BUCKETS)  /* larger buckets, same sums */
        bucket = (n + GT_COMM_MAX_BUCKETS - 1) / GT_COMM_MAX_BUCKETS;
    size_t count = comm->size == 1 ? 0 : (n + bucket - 1) / bucket;
    ov->buckets = count ? calloc(count, sizeof *ov->buckets) : NULL;
    if (count && !ov->buckets)
        return GT_FAIL(GT_ERR_OOM, "communicator: out of host memory for %zu buckets", count);
    ov->num_buckets = count;
    ov->first_call = comm->calls + 1;
    comm->calls += 2 * count;
    for (size_t k = 0; k < count; k++) {
        gt_comm_bucket *b = &ov->buckets[k];
        size_t end = n - k * bucket;
        b->first = end > bucket ? end - bucket : 0;
        b->count = end - b->first;
        b->scratch = malloc((size_t)(comm->size - 1) * bucket_slot(comm, b) * sizeof(float));
        if (!b->scratch) {
            gt_comm_overlap_abandon(ov);
            return GT_FAIL(GT_ERR_OOM, "communicator: out of host memory for bucket scratch");
        }
    }
    return GT_OK;
}

/* Starts phase `phase` (1 reduce-scatter, 2 all-gather) of bucket b. */
static gt_status start_phase(gt_comm_overlap *ov, gt_comm_bucket *b, int phase) {
    gt_comm *comm = ov->comm;
    exchange_plan p;
    GT_TRY(plan_alloc(comm, &p));
    float *buf = ov->buf + b->first;
    if (phase == 1)
        plan_reduce_scatter(comm, buf, b->count, b->scratch, bucket_slot(comm, b), &p);
    else
        plan_allgather(comm, buf, b->count, sizeof(float), &p);
    uint64_t call = ov->first_call + 2 * (uint64_t)(b - ov->buckets) + (uint64_t)phase - 1;
    gt_status status = comm->ops->start(comm, call, (const void *const *)p.send, p.send_bytes, (void *const *)p.recv,
                                        p.recv_bytes, &b->pending);
    for (int r = 0; status == GT_OK && r < comm->size; r++)
        comm->bytes_sent += p.send_bytes[r];
    plan_free(&p);
    if (status != GT_OK)
        return status;
    b->phase = phase;
    return GT_OK;
}

/* Tests bucket b's exchange once; moves it to its next phase when done. */
static gt_status progress(gt_comm_overlap *ov, gt_comm_bucket *b) {
    if (b->phase != 1 && b->phase != 2)
        return GT_OK;
    int done = 0;
    GT_TRY(ov->comm->ops->test(ov->comm, b->pending, &done));
    if (!done)
        return GT_OK;
    b->pending = NULL;
    if (b->phase == 2) {
        b->phase = 3;
        return GT_OK;
    }
    finish_reduce_scatter(ov->comm, ov->buf + b->first, b->count, b->scratch, bucket_slot(ov->comm, b));
    return start_phase(ov, b, 2);
}

static gt_status overlap_ready(gt_comm_overlap *ov, size_t final_from) {
    for (size_t k = 0; k < ov->started; k++)
        GT_TRY(progress(ov, &ov->buckets[k]));
    while (ov->started < ov->num_buckets && ov->buckets[ov->started].first >= final_from)
        GT_TRY(start_phase(ov, &ov->buckets[ov->started++], 1));
    return GT_OK;
}

gt_status gt_comm_overlap_ready(gt_comm_overlap *ov, size_t final_from) {
    gt_status status = overlap_ready(ov, final_from);
    if (status != GT_OK)
        ov->comm->failed = 1;
    return status;
}

static gt_status overlap_finish(gt_comm_overlap *ov) {
    GT_TRY(overlap_ready(ov, 0));
    for (unsigned long polls = 0;; polls++) {
        int left = 0;
        for (size_t k = 0; k < ov->num_buckets; k++) {
            GT_TRY(progress(ov, &ov->buckets[k]));
            left |= ov->buckets[k].phase != 3;
        }
        if (!left)
            return GT_OK;
        if (polls > 1000)
            nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
    }
}

gt_status gt_comm_overlap_finish(gt_comm_overlap *ov) {
    size_t early = ov->started;
    gt_status status = overlap_finish(ov);
    if (status != GT_OK) {
        gt_comm_overlap_abandon(ov);
        return status;
    }
    ov->comm->buckets_early += early;
    gt_comm_overlap_abandon(ov);  /* nothing is in flight: only frees */
    return GT_OK;
}

void gt_comm_overlap_abandon(gt_comm_overlap *ov) {
    for (size_t k = 0; k < ov->num_buckets; k++) {
        gt_comm_bucket *b = &ov->buckets[k];
        if (b->pending) {
            ov->comm->ops->abandon(ov->comm, b->pending);
            ov->comm->failed = 1;
        }
        free(b->scratch);
    }
    free(ov->buckets);
    *ov = (gt_comm_overlap){0};
}
