#include "train/zero.h"

#include <stdlib.h>
#include <string.h>

#include "train/grad_norm.h"

/* Where this rank's shard cuts the chunks of core/sumsq_order.h. */
typedef struct shard_chunks {
    const float *x;   /* (n,) the values (only [first, end) is read) */
    size_t n;         /* elements of x */
    size_t first;     /* this rank's shard: [first, end) */
    size_t end;
    size_t len;       /* elements per chunk (gt_sumsq_chunk_len(n)) */
    double *row;      /* (chunks,) totals of the chunks whose last element is in the shard */
} shard_chunks;

static size_t chunk_end(const shard_chunks *s, size_t c) { return (c + 1) * s->len < s->n ? (c + 1) * s->len : s->n; }

/* lanes[(rel + i) % 16] += x[i]^2 in float64 for i in [0, n): a chunk's lane sums continued. */
static void add_lanes(double lanes[GT_SUMSQ_LANES], const float *x, size_t rel, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double value = (double)x[i];
        lanes[(rel + i) % GT_SUMSQ_LANES] += value * value;
    }
}

/* The chunk total of its 16 lane sums, folded pairwise (l += l+8, +4, +2, +1). */
static double fold_lanes(const double lanes[GT_SUMSQ_LANES]) {
    double folded[GT_SUMSQ_LANES];
    memcpy(folded, lanes, sizeof folded);
    for (size_t width = GT_SUMSQ_LANES / 2; width >= 1; width /= 2)
        for (size_t l = 0; l < width; l++)
            folded[l] += folded[l + width];
    return folded[0];
}

/* The chunks that lie whole inside the shard, summed by all threads. */
static void whole_chunks(const shard_chunks *s) {
    size_t c0 = (s->first + s->len - 1) / s->len, c1 = c0;
    while (c1 * s->len < s->end && chunk_end(s, c1) <= s->end)
        c1++;
#pragma omp parallel for schedule(static) if (c1 - c0 > 1)
    for (size_t c = c0; c < c1; c++)
        s->row[c] = gt_sumsq_chunk(s->x + c * s->len, chunk_end(s, c) - c * s->len);
}

/* The lane sums of the shard's last piece when it starts a chunk that goes on past the shard
 * (they go to the next rank); 0 when there is none. */
static int tail_lanes(const shard_chunks *s, double lanes[GT_SUMSQ_LANES]) {
    if (s->first == s->end)
        return 0;
    size_t c = (s->end - 1) / s->len;
    if (c * s->len < s->first || chunk_end(s, c) <= s->end)
        return 0;
    memset(lanes, 0, GT_SUMSQ_LANES * sizeof *lanes);
    add_lanes(lanes, s->x + c * s->len, 0, s->end - c * s->len);
    return 1;
}

/* This rank's turn in the chain: `carry` holds the lane sums the ranks before left unfinished
 * (their chunk goes on into this shard); the shard's head piece continues them, and carry
 * becomes what this rank leaves to the next. */
static void chain_turn(const shard_chunks *s, double carry[GT_SUMSQ_LANES]) {
    if (s->first == s->end)
        return;  /* an empty shard passes the carry on */
    double tail[GT_SUMSQ_LANES];
    int has_tail = tail_lanes(s, tail);
    if (s->first % s->len != 0) {
        size_t c = s->first / s->len, stop = chunk_end(s, c) < s->end ? chunk_end(s, c) : s->end;
        add_lanes(carry, s->x + s->first, s->first - c * s->len, stop - s->first);
        if (stop < chunk_end(s, c))
            return;  /* the shard ends inside this chunk: the carry goes on */
        s->row[c] = fold_lanes(carry);
    }
    if (has_tail)
        memcpy(carry, tail, sizeof tail);
    else
        memset(carry, 0, GT_SUMSQ_LANES * sizeof *carry);
}

/* The chain over the ranks, then every rank's row gathered in `rows` and summed. */
static gt_status chain_and_gather(gt_comm *comm, shard_chunks *s, double *rows, size_t chunks, double *out) {
    double carry[GT_SUMSQ_LANES] = {0};
    for (int k = 0; k < comm->size; k++) {
        if (k == comm->rank)
            chain_turn(s, carry);
        if (k < comm->size - 1)  /* rank k's carry, for rank k + 1 */
            GT_TRY(gt_comm_broadcast(comm, carry, sizeof carry, k));
    }
    GT_TRY(gt_comm_allgather(comm, rows, (size_t)comm->size * chunks, sizeof *rows));
    double sum = 0.0;
    for (size_t c = 0; c < chunks; c++) {
        double total = rows[c];  /* one rank's row holds it, the others 0: the sum is exact */
        for (int r = 1; r < comm->size; r++)
            total += rows[(size_t)r * chunks + c];
        sum += total;
    }
    *out = sum;
    return GT_OK;
}

gt_status gt_zero_sumsq(gt_comm *comm, const float *x, size_t n, double *out) {
    *out = 0.0;
    if (n == 0)
        return GT_OK;
    size_t len = gt_sumsq_chunk_len(n), chunks = (n + len - 1) / len;
    double *rows = calloc((size_t)comm->size * chunks, sizeof *rows);
    if (!rows)
        return GT_FAIL(GT_ERR_OOM, "zero: out of host memory for %d x %zu chunk totals", comm->size, chunks);
    size_t first, count;
    gt_comm_chunk(n, comm->size, comm->rank, &first, &count);
    shard_chunks s = {x, n, first, first + count, len, rows + (size_t)comm->rank * chunks};
    whole_chunks(&s);
    gt_status status = chain_and_gather(comm, &s, rows, chunks, out);
    free(rows);
    return status;
}

gt_status gt_zero_sums(gt_comm *comm, float *grads, size_t n, const gt_scaler *scaler, int want_norm,
                       int *found_inf, double *sumsq) {
    GT_TRY(gt_comm_reduce_scatter_shards_f32(comm, grads, n));
    size_t first, count;
    gt_comm_chunk(n, comm->size, comm->rank, &first, &count);
    *found_inf = 0;
    if (scaler) {
        int mine = 0;
        double any = 0.0;
        GT_TRY(gt_scaler_unscale_check(scaler, grads + first, count, &mine));
        GT_TRY(gt_comm_sum_f64(comm, (double)mine, &any));
        *found_inf = any > 0.0;
    }
    if (!*found_inf && want_norm)
        GT_TRY(gt_zero_sumsq(comm, grads, n, sumsq));
    return GT_OK;
}
