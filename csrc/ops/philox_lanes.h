/* Philox4x32-10 groups of a dropout key drawn PHILOX_LANES at a time, for the CPU kernels that
 * draw dropout multipliers (cpu_dropout.c, cpu_attention.c): core/philox.h's rounds on arrays of
 * lanes, which vectorise, where a group at a time does not. */
#ifndef GT_PHILOX_LANES_H
#define GT_PHILOX_LANES_H

#include <stddef.h>
#include <stdint.h>

#include "core/dropout.h"
#include "core/philox.h"
#include "ops/cpu_kernels.h"
#include "ops/ops.h"

enum { PHILOX_LANES = 16 };  /* Philox groups drawn side by side, one a vector lane */

/* words[j][l] = word j of the key's Philox group group0 + l, for l < PHILOX_LANES: the rounds of
 * gt_philox4x32_10 (core/philox.h) on arrays of lanes, so that they vectorise; the same bits. The
 * words are held in 64-bit lanes, whose products by the 32-bit multipliers are exact (GCC does not
 * vectorise a 32 x 32 -> 64-bit product's high half from 32-bit lanes). */
GT_INLINE void philox_lanes(const gt_dropout_key *key, uint64_t group0, uint32_t words[4][PHILOX_LANES]) {
    uint64_t x0[PHILOX_LANES], x1[PHILOX_LANES], x2[PHILOX_LANES], x3[PHILOX_LANES];
    for (size_t l = 0; l < PHILOX_LANES; l++) {  /* counter = {index low, index high, layer, step} */
        x0[l] = (uint32_t)(group0 + l);
        x1[l] = (uint32_t)((group0 + l) >> 32);
        x2[l] = key->layer;
        x3[l] = key->step;
    }
    uint64_t k0 = (uint32_t)key->seed, k1 = (uint32_t)(key->seed >> 32);
    for (int round = 0; round < 10; round++) {
#pragma GCC unroll 1  /* unrolled whole, the lanes were not vectorised (GCC 12) */
        for (size_t l = 0; l < PHILOX_LANES; l++) {
            uint64_t product0 = GT_PHILOX_M0 * x0[l], product1 = GT_PHILOX_M1 * x2[l];
            uint64_t next0 = (product1 >> 32) ^ x1[l] ^ k0, next2 = (product0 >> 32) ^ x3[l] ^ k1;
            x1[l] = product1 & 0xFFFFFFFFu;
            x3[l] = product0 & 0xFFFFFFFFu;
            x0[l] = next0;
            x2[l] = next2;
        }
        k0 = (k0 + GT_PHILOX_W0) & 0xFFFFFFFFu;
        k1 = (k1 + GT_PHILOX_W1) & 0xFFFFFFFFu;
    }
    for (size_t l = 0; l < PHILOX_LANES; l++) {
        words[0][l] = (uint32_t)x0[l];
        words[1][l] = (uint32_t)x1[l];
        words[2][l] = (uint32_t)x2[l];
        words[3][l] = (uint32_t)x3[l];
    }
}

#endif
