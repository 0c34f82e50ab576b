/* The allocator: one accounted pool per device (cpu, pinned host, cuda:N).
 * Big buffers are blocks taken from a pool; an arena is one block that callers carve
 * into planned pieces (the llm.c pattern: sizes first, one allocation, pointers into it).
 * A pool's limit is enforced before any memory is requested from the system, so a refused
 * allocation changes no statistic other than num_ooms. */
#ifndef GT_ALLOC_H
#define GT_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GT_ALIGN = 64 };  /* bytes; every block and arena piece starts on this boundary */

#define GT_NO_LIMIT SIZE_MAX

typedef struct gt_mem_stats {
    size_t allocated;          /* bytes in live blocks, as requested */
    size_t reserved;           /* bytes in live blocks, rounded up to GT_ALIGN */
    size_t peak_allocated;     /* highest `allocated` since the last peak reset */
    size_t peak_reserved;      /* highest `reserved` since the last peak reset */
    size_t limit;              /* cap on `reserved` in bytes; GT_NO_LIMIT when unset */
    size_t num_allocs;         /* blocks handed out since start-up */
    size_t num_frees;          /* blocks returned since start-up */
    size_t num_ooms;           /* requests refused (over the limit or by the system) */
    size_t num_pin_fallbacks;  /* pinned requests served with pageable memory */
    size_t active_blocks;      /* blocks live now */
} gt_mem_stats;

typedef struct gt_block {
    void *ptr;          /* start of the memory, GT_ALIGN-aligned; NULL when empty */
    size_t bytes;       /* size as requested */
    gt_device device;   /* pool it was taken from */
    int pinned;         /* 1 when page-locked by CUDA, 0 for pageable memory */
} gt_block;

/* Takes `bytes` (> 0) from the pool of `device`. For GT_DEVICE_PINNED, memory is page-locked
 * when CUDA is present and falls back to aligned pageable memory otherwise (counted in
 * num_pin_fallbacks); it is accounted in the pinned pool either way. */
gt_status gt_block_alloc(gt_device device, size_t bytes, gt_block *out);

/* Returns a block to its pool; an empty block is ignored. Leaves `block` empty. */
void gt_block_free(gt_block *block);

/* A snapshot of a pool's statistics. */
gt_status gt_mem_get_stats(gt_device device, gt_mem_stats *out);

/* Sets the cap on reserved bytes (GT_NO_LIMIT removes it). */
gt_status gt_mem_set_limit(gt_device device, size_t limit);

/* Sets the cap to `fraction` (0 < f <= 1) of the device's total memory. */
gt_status gt_mem_set_fraction(gt_device device, double fraction);

/* Resets peak_allocated/peak_reserved to the current values. */
gt_status gt_mem_reset_peak(gt_device device);

/* The largest byte count of one buffer, as in C and NumPy (PTRDIFF_MAX): every element count
 * then fits an int64 and the sum of two checked sizes cannot wrap. */
#define GT_MAX_BYTES ((size_t)PTRDIFF_MAX)

/* Bytes an arena piece of `bytes` occupies (rounded up to GT_ALIGN); SIZE_MAX (never allocated)
 * when the rounding would wrap. */
static inline size_t gt_align_up(size_t bytes) {
    if (bytes > SIZE_MAX - (GT_ALIGN - 1))
        return SIZE_MAX;
    return (bytes + (GT_ALIGN - 1)) & ~(size_t)(GT_ALIGN - 1);
}

/* Bytes the allocator reserves (and counts in `reserved` and its peak) for a block of `bytes`:
 * what every memory plan reports, so that a plan's total is the pool's peak to the byte. 0 for
 * an empty arena (no block). */
static inline size_t gt_block_reserved_bytes(size_t bytes) {
    return bytes == 0 ? 0 : gt_align_up(bytes);
}

/* a * b, or SIZE_MAX when the product does not fit (for size functions that cannot fail: their
 * callers check the result against GT_MAX_BYTES). */
static inline size_t gt_size_mul_sat(size_t a, size_t b) {
    return a != 0 && b > SIZE_MAX / a ? SIZE_MAX : a * b;
}

/* a + b, or SIZE_MAX when the sum does not fit. */
static inline size_t gt_size_add_sat(size_t a, size_t b) {
    return b > SIZE_MAX - a ? SIZE_MAX : a + b;
}

/* Checked size arithmetic for plans: *out = a * b, a + b, or gt_align_up(a); GT_ERR_OOM naming
 * `what` when the result would exceed GT_MAX_BYTES (*out is then left unchanged). */
gt_status gt_size_mul(size_t a, size_t b, const char *what, size_t *out);
gt_status gt_size_add(size_t a, size_t b, const char *what, size_t *out);
gt_status gt_size_align(size_t a, const char *what, size_t *out);

/* GT_ERR_OOM naming `what` unless bytes <= GT_MAX_BYTES (e.g. a saturated size). */
gt_status gt_size_check(size_t bytes, const char *what);

typedef struct gt_arena {
    gt_block block;  /* the one allocation behind the arena */
    size_t used;     /* bytes handed out so far, each piece rounded to GT_ALIGN */
} gt_arena;

/* Allocates an arena of `bytes` (sum of gt_align_up of its pieces; 0 gives an empty arena). */
gt_status gt_arena_create(gt_arena *arena, gt_device device, size_t bytes);

/* Hands out the next `bytes` of the arena; fails with GT_ERR_RUNTIME if the plan was wrong. */
gt_status gt_arena_take(gt_arena *arena, size_t bytes, void **out);

void gt_arena_destroy(gt_arena *arena);

#ifdef __cplusplus
}
#endif
#endif
