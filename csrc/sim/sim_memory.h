/* The simulated device's memory: host memory that the allocator accounts in pools of its own
 * (core/alloc.c: one per sim:N, apart from the CPU's), reached by the model's code only through
 * the device interface's copies. Fresh and freed memory is poisoned (every byte 0xFF, a NaN as
 * f32/f16/bf16), so a read before the first write or after the free gives NaN instead of stale
 * numbers; freed blocks stay in a quarantine (up to GT_SIM_QUARANTINE_BYTES, oldest released
 * first), so a late reader sees the poison rather than memory reused for something else. */
#ifndef GT_SIM_MEMORY_H
#define GT_SIM_MEMORY_H

#include <stddef.h>

#include "core/device_backend.h"

#define GT_SIM_QUARANTINE_BYTES ((size_t)64 << 20)

gt_status gt_sim_malloc(int index, size_t bytes, void **out);

/* Waits for every stream of the device (as cudaFree does), poisons the block and quarantines it. */
void gt_sim_free(int index, void *ptr);

/* *index = the sim ordinal whose live allocation holds `ptr`, -1 for any other memory. */
gt_status gt_sim_pointer_device(const void *ptr, int *index);

/* Queues a fill of `bytes` at `ptr` with 0xFF on `stream` (NULL: the default stream). */
gt_status gt_sim_poison(int index, gt_stream *stream, void *ptr, size_t bytes);

/* Physical RAM of the host, as total and free (the pools' limits do the accounting). */
gt_status gt_sim_mem_get_info(int index, size_t *free_bytes, size_t *total_bytes);

#endif
