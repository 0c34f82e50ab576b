#include "data/permute.h"

#include "core/philox.h"
#include "core/simd.h"

#if GT_SIMD_X86
#define GT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define GT_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

enum {
    GT_FEISTEL_ROUNDS = 6,           /* half-updates on domains above 2^16: each half mixed 3 times */
    GT_FEISTEL_ROUNDS_SMALL = 12,    /* on domains up to 2^16, where 6 leave a measurable bias */
    GT_FEISTEL_SMALL_BITS = 16,      /* domains of at most this many bits count as small */
    GT_SHUFFLE_STREAM = 0x53u << 24, /* Philox stream tag of permutation rounds ('S') */
    GT_PERMUTE_CHUNK = 64,           /* positions per SIMD pass (stack buffers) */
};

unsigned gt_feistel_rounds(unsigned bits) {
    return bits <= GT_FEISTEL_SMALL_BITS ? GT_FEISTEL_ROUNDS_SMALL : GT_FEISTEL_ROUNDS;
}

/* Philox stream word of a round: the tag, 16 more bits of the epoch, the round number. */
static uint32_t round_stream(uint64_t epoch, uint32_t round) {
    return GT_SHUFFLE_STREAM | (((uint32_t)(epoch >> 32) & 0xFFFFu) << 8) | round;
}

/* The round function: the low word of Philox4x32-10 at counter {half, pass, epoch, stream}. */
static inline uint32_t round_word(uint64_t seed, uint64_t epoch, uint32_t round, uint32_t half,
                                  uint32_t pass) {
    uint32_t out[4];
    gt_philox_random4(seed, (uint32_t)epoch, round_stream(epoch, round),
                      (uint64_t)half | ((uint64_t)pass << 32), out);
    return out[0];
}

uint64_t gt_feistel(uint64_t seed, uint64_t epoch, uint32_t pass, unsigned bits, uint64_t x) {
    unsigned lo_bits = bits / 2, hi_bits = bits - lo_bits;  /* both <= 32 */
    uint32_t lo_mask = (uint32_t)((UINT64_C(1) << lo_bits) - 1);
    uint32_t hi_mask = (uint32_t)((UINT64_C(1) << hi_bits) - 1);
    uint32_t hi = (uint32_t)(x >> lo_bits), lo = (uint32_t)x & lo_mask;
    unsigned rounds = gt_feistel_rounds(bits);
    for (uint32_t round = 0; round < rounds; round++) {
        if (round % 2 == 0)
            hi ^= round_word(seed, epoch, round, lo, pass) & hi_mask;
        else
            lo ^= round_word(seed, epoch, round, hi, pass) & lo_mask;
    }
    return ((uint64_t)hi << lo_bits) | lo;
}

/* One network pass over `count` (<= GT_PERMUTE_CHUNK) positions, written so that the loops
 * over positions vectorise: `hi`/`lo` hold the halves, updated in place. */
#define GT_DEFINE_FEISTEL_LANES(name, attributes)                                               \
    attributes static void name(uint64_t seed, uint64_t epoch, unsigned bits,                  \
                                const uint32_t *passes, uint32_t *hi, uint32_t *lo,            \
                                size_t count) {                                                \
        unsigned lo_bits = bits / 2, hi_bits = bits - lo_bits;                                 \
        uint32_t lo_mask = (uint32_t)((UINT64_C(1) << lo_bits) - 1);                           \
        uint32_t hi_mask = (uint32_t)((UINT64_C(1) << hi_bits) - 1);                           \
        const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};                      \
        unsigned rounds = gt_feistel_rounds(bits);                                             \
        for (uint32_t round = 0; round < rounds; round++) {                                    \
            uint32_t stream = round_stream(epoch, round);                                      \
            uint32_t *target = round % 2 == 0 ? hi : lo;                                       \
            const uint32_t *source = round % 2 == 0 ? lo : hi;                                 \
            uint32_t mask = round % 2 == 0 ? hi_mask : lo_mask;                                \
            for (size_t k = 0; k < count; k++) {                                               \
                uint32_t counter[4] = {source[k], passes[k], (uint32_t)epoch, stream}, out[4]; \
                gt_philox4x32_10(counter, key, out);                                           \
                target[k] ^= out[0] & mask;                                                    \
            }                                                                                  \
        }                                                                                      \
    }

#if GT_SIMD_X86
GT_DEFINE_FEISTEL_LANES(feistel_lanes_avx512, GT_AVX512)
GT_DEFINE_FEISTEL_LANES(feistel_lanes_avx2, GT_AVX2)
#endif
GT_DEFINE_FEISTEL_LANES(feistel_lanes_scalar, )

typedef void (*feistel_lanes_fn)(uint64_t, uint64_t, unsigned, const uint32_t *, uint32_t *,
                                 uint32_t *, size_t);

static feistel_lanes_fn lanes_for_level(void) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512: return feistel_lanes_avx512;
    case GT_SIMD_AVX2: return feistel_lanes_avx2;
    case GT_SIMD_SCALAR: break;
    }
#endif
    return feistel_lanes_scalar;
}

/* Bits needed to write every value below n (n >= 2). */
static unsigned bits_for(uint64_t n) {
    unsigned bits = 0;
    while (bits < 64 && (n - 1) >> bits)
        bits++;
    return bits;
}

void gt_permute_batch(uint64_t seed, uint64_t epoch, uint64_t n, const uint32_t *passes,
                      const uint64_t *positions, int64_t *rows, size_t count) {
    unsigned bits = bits_for(n), lo_bits = bits / 2;
    feistel_lanes_fn lanes = lanes_for_level();
    uint32_t hi[GT_PERMUTE_CHUNK], lo[GT_PERMUTE_CHUNK];
    for (size_t start = 0; start < count; start += GT_PERMUTE_CHUNK) {
        size_t chunk = count - start < GT_PERMUTE_CHUNK ? count - start : GT_PERMUTE_CHUNK;
        for (size_t k = 0; k < chunk; k++) {
            hi[k] = (uint32_t)(positions[start + k] >> lo_bits);
            lo[k] = (uint32_t)(positions[start + k] & ((UINT64_C(1) << lo_bits) - 1));
        }
        lanes(seed, epoch, bits, passes + start, hi, lo, chunk);
        for (size_t k = 0; k < chunk; k++) {
            uint64_t x = ((uint64_t)hi[k] << lo_bits) | lo[k];
            while (x >= n)  /* cycle-walking, rare: the domain is below 2n */
                x = gt_feistel(seed, epoch, passes[start + k], bits, x);
            rows[start + k] = (int64_t)x;
        }
    }
}
