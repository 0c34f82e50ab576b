#include "data/sampler.h"

#include "core/philox.h"

enum {
    GT_FEISTEL_ROUNDS = 6,           /* half-updates: each half is mixed three times */
    GT_SHUFFLE_STREAM = 0x53u << 24, /* Philox stream tag of permutation rounds ('S') */
    GT_DRAW_STREAM = 0x52u << 24,    /* Philox stream tag of draws with replacement ('R') */
};

/* 64 random bits for (seed, epoch, tag, counter). */
static uint64_t philox_u64(uint64_t seed, uint64_t epoch, uint32_t tag, uint64_t counter) {
    uint32_t out[4];
    uint32_t stream_b = tag | (((uint32_t)(epoch >> 32) & 0xFFFFu) << 8);
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

/* One keyed bijection of [0, 2^bits): the high part (hi_bits) and the low part (bits - hi_bits)
 * are alternately XORed with a Philox function of the other part and the round number. */
static uint64_t feistel(uint64_t seed, uint64_t epoch, uint32_t pass, unsigned bits,
                        uint64_t x) {
    unsigned lo_bits = bits / 2, hi_bits = bits - lo_bits;
    uint64_t lo_mask = (UINT64_C(1) << lo_bits) - 1;
    uint64_t hi_mask = hi_bits == 64 ? UINT64_MAX : (UINT64_C(1) << hi_bits) - 1;
    uint64_t hi = x >> lo_bits, lo = x & lo_mask;
    for (uint32_t round = 0; round < GT_FEISTEL_ROUNDS; round++) {
        uint32_t tag = GT_SHUFFLE_STREAM | round;
        if (round % 2 == 0)
            hi ^= philox_u64(seed, epoch, tag, lo | ((uint64_t)pass << 32)) & hi_mask;
        else
            lo ^= philox_u64(seed, epoch, tag, hi | ((uint64_t)pass << 32)) & lo_mask;
    }
    return (hi << lo_bits) | lo;
}

uint64_t gt_permute_index(uint64_t seed, uint64_t epoch, uint32_t pass, uint64_t n,
                          uint64_t position) {
    if (n < 2)
        return 0;
    unsigned bits = bits_for(n);
    uint64_t x = position;
    do {  /* cycle-walking: the domain is below 2n, so under two steps are expected */
        x = feistel(seed, epoch, pass, bits, x);
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
        uint64_t bits = philox_u64(s->seed, s->epoch, GT_DRAW_STREAM, q);
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
    for (size_t p = start; p < end; p++)
        rows[p - start] = (int64_t)gt_sampler_row(&plan->sampler, p);
    return end - start;
}
