/* Which dataset rows a loader reads, and in which batches (DESIGN.md principle 3).
 * Every order is a pure function of (seed, epoch, position): a batch's rows are computed in
 * O(batch) from its index alone, so any worker can gather any batch, the sequence does not
 * depend on num_workers or prefetch_factor, and a resume skips batches without reading them.
 * Shuffling is a keyed bijection (an alternating Feistel network whose round function is
 * Philox4x32-10, csrc/data/permute.h) on [0, 2^bits) with cycle-walking down to [0, n). */
#ifndef GT_DATA_SAMPLER_H
#define GT_DATA_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gt_order_kind {
    GT_ORDER_SEQUENTIAL = 0,   /* position p -> row p mod num_rows */
    GT_ORDER_PERMUTED = 1,     /* a keyed permutation of [0, num_rows), a fresh one per pass */
    GT_ORDER_REPLACEMENT = 2,  /* independent uniform draws from [0, num_rows) */
    GT_ORDER_ARRAY = 3,        /* rows listed in `indices` */
} gt_order_kind;

typedef struct gt_sampler {
    gt_order_kind kind;        /* how a base position maps to a row */
    uint64_t num_rows;         /* rows in the dataset: every row index is below it */
    uint64_t base_length;      /* positions of the unsharded order */
    uint64_t seed;             /* Philox key of PERMUTED and REPLACEMENT */
    uint64_t epoch;            /* Philox stream: each epoch has its own order */
    const int64_t *indices;    /* (base_length,) rows of an ARRAY order; NULL otherwise */
    uint64_t num_replicas;     /* shards the order is dealt to (DistributedSampler); 1 = none */
    uint64_t rank;             /* this shard, in [0, num_replicas) */
    uint64_t length;           /* positions this shard yields */
} gt_sampler;

/* An unsharded order of `base_length` positions over `num_rows` rows. For PERMUTED,
 * base_length > num_rows concatenates fresh permutations (RandomSampler's num_samples). */
gt_status gt_sampler_init(gt_sampler *s, gt_order_kind kind, uint64_t num_rows,
                          uint64_t base_length, uint64_t seed, uint64_t epoch,
                          const int64_t *indices);

/* Deals the order to `num_replicas` shards as DistributedSampler does: padded by wrapping
 * around to a multiple of num_replicas, or truncated to one when `drop_last`. */
gt_status gt_sampler_shard(gt_sampler *s, uint64_t num_replicas, uint64_t rank, int drop_last);

/* Row at `position` (< s->length) of the shard. */
uint64_t gt_sampler_row(const gt_sampler *s, uint64_t position);

/* rows[p - start] = gt_sampler_row(s, p) for p in [start, end), permutations in SIMD lanes. */
void gt_sampler_rows(const gt_sampler *s, uint64_t start, uint64_t end, int64_t *rows);

/* Position of `position` in the permutation of [0, n) keyed by (seed, epoch, pass). */
uint64_t gt_permute_index(uint64_t seed, uint64_t epoch, uint32_t pass, uint64_t n,
                          uint64_t position);

typedef struct gt_batch_plan {
    gt_sampler sampler;            /* the positions batched */
    size_t batch_size;             /* positions per batch; 0 when batch_offsets is used */
    const int64_t *batch_offsets;  /* (num_batches + 1,) first position of each batch, or NULL */
    size_t num_batches;            /* batches in one epoch */
    size_t max_batch_rows;         /* rows of the largest batch: the size of a slot */
} gt_batch_plan;

/* Batches of `batch_size` consecutive positions; the last partial one dropped if asked. */
gt_status gt_batch_plan_uniform(gt_batch_plan *plan, const gt_sampler *sampler,
                                size_t batch_size, int drop_last);

/* Batches given by `offsets` (non-decreasing, offsets[0] = 0, offsets[num_batches] =
 * sampler->length); used for a batch_sampler's lists. Empty batches are refused. */
gt_status gt_batch_plan_offsets(gt_batch_plan *plan, const gt_sampler *sampler,
                                const int64_t *offsets, size_t num_batches);

/* Writes the rows of batch `batch` (< num_batches) to `rows`; returns how many. */
size_t gt_batch_plan_rows(const gt_batch_plan *plan, size_t batch, int64_t *rows);

#ifdef __cplusplus
}
#endif
#endif
