/* Philox4x32-10 counter-based random numbers (Salmon et al., "Parallel Random Numbers: As Easy
 * as 1, 2, 3", SC11; constants and round structure of Random123's philox.h), shared by the CPU
 * backend and CUDA kernels (DESIGN.md principles 3 and 4). A draw is a pure function of
 * (seed, streams, index): no state, so any thread can compute any element in any order.
 *
 * Integer outputs and the uniform helpers are bit-identical on every backend. gt_box_muller uses
 * logf/sqrtf/cosf/sinf, whose last bit may differ between the host libm and CUDA's. */
#ifndef GT_PHILOX_H
#define GT_PHILOX_H

#include <math.h>
#include <stdint.h>

#include "core/hd.h"

#define GT_PHILOX_M0 0xD2511F53u  /* round multipliers */
#define GT_PHILOX_M1 0xCD9E8D57u
#define GT_PHILOX_W0 0x9E3779B9u  /* key schedule increments (golden ratio, sqrt(3) - 1) */
#define GT_PHILOX_W1 0xBB67AE85u

/* One Philox S-box round on the counter `x` with round key (k0, k1). */
GT_HD void gt_philox_round(uint32_t x[4], uint32_t k0, uint32_t k1) {
    uint64_t product0 = (uint64_t)GT_PHILOX_M0 * x[0];
    uint64_t product1 = (uint64_t)GT_PHILOX_M1 * x[2];
    uint32_t hi0 = (uint32_t)(product0 >> 32), lo0 = (uint32_t)product0;
    uint32_t hi1 = (uint32_t)(product1 >> 32), lo1 = (uint32_t)product1;
    uint32_t x1 = x[1], x3 = x[3];
    x[0] = hi1 ^ x1 ^ k0;
    x[1] = lo1;
    x[2] = hi0 ^ x3 ^ k1;
    x[3] = lo0;
}

/* Philox4x32 with 10 rounds: out = bijection_key(counter). Passes Random123's kat_vectors. */
GT_HD void gt_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t x[4] = {counter[0], counter[1], counter[2], counter[3]};
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        gt_philox_round(x, k0, k1);
        k0 += GT_PHILOX_W0;
        k1 += GT_PHILOX_W1;
    }
    out[0] = x[0];
    out[1] = x[1];
    out[2] = x[2];
    out[3] = x[3];
}

/* Four random words for element `index` of stream (stream_a, stream_b) under `seed`:
 * key = {seed low 32, seed high 32}, counter = {index low 32, index high 32, stream_a, stream_b}.
 * Dropout uses stream_a = layer, stream_b = step; the data loader uses its own streams. */
GT_HD void gt_philox_random4(uint64_t seed, uint32_t stream_a, uint32_t stream_b, uint64_t index,
                             uint32_t out[4]) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t counter[4] = {(uint32_t)index, (uint32_t)(index >> 32), stream_a, stream_b};
    gt_philox4x32_10(counter, key, out);
}

/* Uniform in [0, 1) from the top 24 bits of x: (x >> 8) * 2^-24, exact in fp32. */
GT_HD float gt_uint32_to_uniform(uint32_t x) {
    return (float)(x >> 8) * 5.9604644775390625e-8f;
}

/* Uniform in (0, 1] from the top 24 bits of x: ((x >> 8) + 1) * 2^-24 (safe for logf). */
GT_HD float gt_uint32_to_uniform_open(uint32_t x) {
    return (float)((x >> 8) + 1u) * 5.9604644775390625e-8f;
}

/* Two independent standard normals from two random words (Box-Muller):
 * r = sqrt(-2 ln u1) with u1 in (0, 1], theta = 2 pi u2 with u2 in [0, 1). |z| <= sqrt(48 ln 2) ~ 5.77. */
GT_HD void gt_box_muller(uint32_t a, uint32_t b, float *z0, float *z1) {
    float radius = sqrtf(-2.0f * logf(gt_uint32_to_uniform_open(a)));
    float theta = 6.28318530717958647692f * gt_uint32_to_uniform(b);
    *z0 = radius * cosf(theta);
    *z1 = radius * sinf(theta);
}

#endif
