/* The keyed permutation of csrc/data/sampler.h evaluated for many positions at once: the
 * Philox round function runs across positions in SIMD lanes (AVX-512 / AVX2 / scalar, chosen
 * by gt_simd_level()); every level returns exactly gt_permute_index()'s rows. */
#ifndef GT_DATA_PERMUTE_H
#define GT_DATA_PERMUTE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Half-updates of the Feistel network on a domain of `bits` bits. */
unsigned gt_feistel_rounds(unsigned bits);

/* One pass of the network (no cycle-walking) on x < 2^bits, keyed by (seed, epoch, pass). */
uint64_t gt_feistel(uint64_t seed, uint64_t epoch, uint32_t pass, unsigned bits, uint64_t x);

/* rows[k] = gt_permute_index(seed, epoch, passes[k], n, positions[k]) for k < count
 * (positions[k] < n, n >= 2). */
void gt_permute_batch(uint64_t seed, uint64_t epoch, uint64_t n, const uint32_t *passes,
                      const uint64_t *positions, int64_t *rows, size_t count);

#ifdef __cplusplus
}
#endif
#endif
