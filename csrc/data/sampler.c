#include "data/sampler.h"

#include "core/philox.h"

#include "data/permute.h"

enum {
    GT_DRAW_STREAM = 0x52u << 24,  /* Philox stream tag of draws with replacement ('R') */
    GT_ROWS_CHUNK = 64,            /* positions permuted per gt_permute_batch call */
};

/* 64 random bits for draw `counter` of (seed, epoch). */
static uint64_t draw_u64(uint64_t seed, uint64_t epoch, uint64_t counter) {
    uint32_t out[4];
    uint32_t stream_b = GT_DRAW_STREAM | (((uint32_t)(epoch >> 32) & 0xFFFFu) << 8);
    gt_philox_random4(seed, (uint32_t)epoch, stream_b, counter, out);
    return (uint64_t)out[0] | ((uint64_t)out[1] << 32);
}

/* Bits needed to write every value below n (n >= 2). */
static unsigned bits_for(uint64_t n) {
    unsigned bits = 0;
    while (bits < 64 && (n - 1) >> bits)
        bits++;
    return bits;
}

uint64_t gt_permute_index(uint64_t seed, uint64_t epoch, uint32_t pass, uint64_t n,
                          uint64_t position) {
    if (n < 2)
        return 0;
    unsigned bits = bits_for(n);
    uint64_t x = position;
    do {  /* cycle-walking: the domain is below 2n, so under two steps are expected */
        x = gt_feistel(seed, epoch, pass, bits, x);
    } while (x >= n);
    return x;
}

gt_status gt_sampler_init(gt_sampler *s, gt_order_kind kind, uint64_t num_rows,
                          uint64_t base_length, uint64_t seed, uint64_t epoch,
                          const int64_t *indices) {
    if ((unsigned)kind > GT_ORDER_ARRAY)
        return GT_FAIL(GT_ERR_VALUE, "kind: unknown sampling order %d", (int)kind);
    if (kind != GT_ORDER_ARRAY && kind != GT_ORDER_SEQUENTIAL && num_rows == 0 && base_length > 0)
        return GT_FAIL(GT_ERR_VALUE, "num_samples: %llu positions drawn from an empty dataset",
                       (unsigned long long)base_length);
    if (kind == GT_ORDER_PERMUTED && num_rows > 0 && base_length > 0 &&
        (base_length - 1) / num_rows > UINT32_MAX)
        return GT_FAIL(GT_ERR_VALUE, "num_samples: more than 2^32 passes over the dataset");
    if (kind == GT_ORDER_SEQUENTIAL && base_length > num_rows)
        return GT_FAIL(GT_ERR_VALUE, "num_samples: %llu positions of a sequential order over %llu rows",
                       (unsigned long long)base_length, (unsigned long long)num_rows);
    if (kind == GT_ORDER_ARRAY) {
        for (uint64_t p = 0; p < base_length; p++)
            if (indices[p] < 0 || (uint64_t)indices[p] >= num_rows)
                return GT_FAIL(GT_ERR_INDEX, "sampler: index %lld out of range for %llu samples",
                               (long long)indices[p], (unsigned long long)num_rows);
    }
    *s = (gt_sampler){.kind = kind, .num_rows = num_rows, .base_length = base_length,
                      .seed = seed, .epoch = epoch, .indices = indices, .num_replicas = 1,
                      .rank = 0, .length = base_length};
    return GT_OK;
}

gt_status gt_sampler_shard(gt_sampler *s, uint64_t num_replicas, uint64_t rank, int drop_last) {
    if (num_replicas == 0)
        return GT_FAIL(GT_ERR_VALUE, "num_replicas must be >= 1, got 0");
    if (rank >= num_replicas)
        return GT_FAIL(GT_ERR_VALUE, "Invalid rank %llu, rank should be in the interval [0, %llu]",
                       (unsigned long long)rank, (unsigned long long)(num_replicas - 1));
    uint64_t n = s->base_length;
    uint64_t per_rank = drop_last ? n / num_replicas : n / num_replicas + (n % num_replicas != 0);
    s->num_replicas = num_replicas;
    s->rank = rank;
    s->length = per_rank;
    return GT_OK;
}

/* Row at position q of the unsharded order. */
static uint64_t base_row(const gt_sampler *s, uint64_t q) {
    switch (s->kind) {
    case GT_ORDER_SEQUENTIAL: return q;
    case GT_ORDER_PERMUTED:
        return gt_permute_index(s->seed, s->epoch, (uint32_t)(q / s->num_rows), s->num_rows,
                                q % s->num_rows);
    case GT_ORDER_REPLACEMENT: {
        uint64_t bits = draw_u64(s->seed, s->epoch, q);
        return (uint64_t)(((unsigned __int128)bits * s->num_rows) >> 64);
    }
    case GT_ORDER_ARRAY: return (uint64_t)s->indices[q];
    }
    return 0;
}

uint64_t gt_sampler_row(const gt_sampler *s, uint64_t position) {
    /* The shard's padding wraps around to the start of the order, as DistributedSampler's. */
    uint64_t global = s->rank + position * s->num_replicas;
    return base_row(s, global % s->base_length);
}

gt_status gt_batch_plan_uniform(gt_batch_plan *plan, const gt_sampler *sampler,
                                size_t batch_size, int drop_last) {
    if (batch_size == 0)
        return GT_FAIL(GT_ERR_VALUE, "batch_size should be a positive integer value, but got batch_size=0");
    size_t length = (size_t)sampler->length;
    size_t num_batches = drop_last ? length / batch_size : (length + batch_size - 1) / batch_size;
    *plan = (gt_batch_plan){.sampler = *sampler, .batch_size = batch_size,
                            .batch_offsets = NULL, .num_batches = num_batches,
                            .max_batch_rows = batch_size};
    return GT_OK;
}

gt_status gt_batch_plan_offsets(gt_batch_plan *plan, const gt_sampler *sampler,
                                const int64_t *offsets, size_t num_batches) {
    if (offsets[0] != 0 || (uint64_t)offsets[num_batches] != sampler->length)
        return GT_FAIL(GT_ERR_VALUE, "batch_sampler: batch offsets must span the %llu positions",
                       (unsigned long long)sampler->length);
    size_t max_rows = 0;
    for (size_t b = 0; b < num_batches; b++) {
        if (offsets[b + 1] <= offsets[b])
            return GT_FAIL(GT_ERR_VALUE, "batch_sampler: batch %zu is empty", b);
        size_t rows = (size_t)(offsets[b + 1] - offsets[b]);
        max_rows = rows > max_rows ? rows : max_rows;
    }
    *plan = (gt_batch_plan){.sampler = *sampler, .batch_size = 0, .batch_offsets = offsets,
                            .num_batches = num_batches, .max_batch_rows = max_rows};
    return GT_OK;
}

/* Rows of positions [start, end) of a PERMUTED order, the permutation run across SIMD lanes. */
static void permuted_rows(const gt_sampler *s, size_t start, size_t end, int64_t *rows) {
    uint32_t passes[GT_ROWS_CHUNK];
    uint64_t positions[GT_ROWS_CHUNK];
    for (size_t first = start; first < end; first += GT_ROWS_CHUNK) {
        size_t count = end - first < GT_ROWS_CHUNK ? end - first : GT_ROWS_CHUNK;
        for (size_t k = 0; k < count; k++) {
            uint64_t q = (s->rank + (first + k) * s->num_replicas) % s->base_length;
            passes[k] = (uint32_t)(q / s->num_rows);
            positions[k] = q % s->num_rows;
        }
        gt_permute_batch(s->seed, s->epoch, s->num_rows, passes, positions, rows + (first - start),
                         count);
    }
}

void gt_sampler_rows(const gt_sampler *s, uint64_t start, uint64_t end, int64_t *rows) {
    if (s->kind == GT_ORDER_PERMUTED && s->num_rows >= 2) {
        permuted_rows(s, (size_t)start, (size_t)end, rows);
        return;
    }
    for (uint64_t p = start; p < end; p++)
        rows[p - start] = (int64_t)gt_sampler_row(s, p);
}

size_t gt_batch_plan_rows(const gt_batch_plan *plan, size_t batch, int64_t *rows) {
    size_t start, end;
    if (plan->batch_offsets) {
        start = (size_t)plan->batch_offsets[batch];
        end = (size_t)plan->batch_offsets[batch + 1];
    } else {
        start = batch * plan->batch_size;
        end = start + plan->batch_size;
        if (end > plan->sampler.length)
            end = (size_t)plan->sampler.length;
    }
    gt_sampler_rows(&plan->sampler, start, end, rows);
    return end - start;
}
