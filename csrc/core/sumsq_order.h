/* The fixed summation order of a deterministic float64 sum of squares, shared by the CPU
 * (csrc/train/grad_norm.c) and CUDA (cuda/optim.cu) so both give the same bits whatever the
 * thread count: split [0, n) into chunks of gt_sumsq_chunk_len(n) elements; in each chunk,
 * lane l (0..15) adds x[i]^2 in float64 for the chunk-relative indices i = l (mod 16) in
 * increasing order; the 16 lanes fold pairwise (l += l+8, then +4, +2, +1); the chunk totals
 * are added in chunk order. Squares of floats are exact in float64: only the additions round. */
#ifndef GT_SUMSQ_ORDER_H
#define GT_SUMSQ_ORDER_H

#include <stddef.h>

enum {
    GT_SUMSQ_LANES = 16,        /* interleaved float64 accumulators per chunk */
    GT_SUMSQ_MAX_CHUNKS = 1024, /* chunk totals kept at most (on the stack) */
    GT_SUMSQ_MIN_CHUNK = 65536, /* elements per chunk at least */
};

/* Elements per chunk for n values: max(GT_SUMSQ_MIN_CHUNK, ceil(n / GT_SUMSQ_MAX_CHUNKS)). */
static inline size_t gt_sumsq_chunk_len(size_t n) {
    size_t len = (n + GT_SUMSQ_MAX_CHUNKS - 1) / GT_SUMSQ_MAX_CHUNKS;
    return len < GT_SUMSQ_MIN_CHUNK ? (size_t)GT_SUMSQ_MIN_CHUNK : len;
}

#endif
