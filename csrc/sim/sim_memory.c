#include "sim/sim_memory.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "sim/sim_stream.h"

enum { QUARANTINE_BLOCKS = 256, POISON_BYTE = 0xFF };

typedef struct quarantine {
    pthread_mutex_t lock;                 /* guards the fields below */
    void *blocks[QUARANTINE_BLOCKS];      /* freed blocks, oldest at `first` */
    size_t sizes[QUARANTINE_BLOCKS];      /* their usable bytes */
    size_t first;                         /* index of the oldest block */
    size_t count;                         /* blocks held */
    size_t bytes;                         /* sum of `sizes` */
} quarantine;

static quarantine held = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Releases the oldest blocks until one more of `bytes` fits; the caller holds the lock. */
static void make_room(size_t bytes) {
    while (held.count > 0 && (held.count == QUARANTINE_BLOCKS || held.bytes + bytes > GT_SIM_QUARANTINE_BYTES)) {
        free(held.blocks[held.first]);
        held.bytes -= held.sizes[held.first];
        held.first = (held.first + 1) % QUARANTINE_BLOCKS;
        held.count--;
    }
}

static void quarantine_add(void *ptr, size_t bytes) {
    pthread_mutex_lock(&held.lock);
    make_room(bytes);
    size_t slot = (held.first + held.count) % QUARANTINE_BLOCKS;
    held.blocks[slot] = ptr;
    held.sizes[slot] = bytes;
    held.count++;
    held.bytes += bytes;
    pthread_mutex_unlock(&held.lock);
}

/* The live allocations of every sim device, so that a pointer's device can be told (as
 * cudaPointerGetAttributes does). */
typedef struct live_list {
    pthread_mutex_t lock;   /* guards the fields below */
    uintptr_t *start;       /* (count,) first byte of each allocation */
    size_t *bytes;          /* (count,) its length */
    int *device;            /* (count,) its sim ordinal */
    size_t count;           /* allocations live */
    size_t capacity;        /* entries of the three arrays */
} live_list;

static live_list live = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Grows the arrays to hold one more entry; the caller holds the lock. 0, or -1 without memory. */
static int live_reserve(void) {
    if (live.count < live.capacity)
        return 0;
    size_t capacity = live.capacity ? 2 * live.capacity : 64;
    uintptr_t *start = realloc(live.start, capacity * sizeof *start);
    if (start)
        live.start = start;
    size_t *bytes = start ? realloc(live.bytes, capacity * sizeof *bytes) : NULL;
    if (bytes)
        live.bytes = bytes;
    int *device = bytes ? realloc(live.device, capacity * sizeof *device) : NULL;
    if (!device)
        return -1;
    live.device = device;
    live.capacity = capacity;
    return 0;
}

static int live_add(int index, void *ptr, size_t bytes) {
    pthread_mutex_lock(&live.lock);
    int rc = live_reserve();
    if (rc == 0) {
        live.start[live.count] = (uintptr_t)ptr;
        live.bytes[live.count] = bytes;
        live.device[live.count++] = index;
    }
    pthread_mutex_unlock(&live.lock);
    return rc;
}

static void live_remove(void *ptr) {
    pthread_mutex_lock(&live.lock);
    for (size_t i = 0; i < live.count; i++)
        if (live.start[i] == (uintptr_t)ptr) {
            live.count--;
            live.start[i] = live.start[live.count];
            live.bytes[i] = live.bytes[live.count];
            live.device[i] = live.device[live.count];
            break;
        }
    pthread_mutex_unlock(&live.lock);
}

gt_status gt_sim_pointer_device(const void *ptr, int *index) {
    *index = -1;
    pthread_mutex_lock(&live.lock);
    for (size_t i = 0; i < live.count && *index < 0; i++)
        if ((uintptr_t)ptr - live.start[i] < live.bytes[i])
            *index = live.device[i];
    pthread_mutex_unlock(&live.lock);
    return GT_OK;
}

gt_status gt_sim_malloc(int index, size_t bytes, void **out) {
    *out = NULL;
    if (index < 0 || index >= GT_SIM_DEVICES)
        return GT_FAIL(GT_ERR_VALUE, "device: 'sim:%d' does not exist", index);
    void *ptr = aligned_alloc(GT_ALIGN, gt_align_up(bytes));
    if (ptr && live_add(index, ptr, gt_align_up(bytes)) != 0) {
        free(ptr);
        ptr = NULL;
    }
    if (!ptr)
        return GT_FAIL(GT_ERR_OOM, "sim:%d: the host refused %zu bytes", index, bytes);
    memset(ptr, POISON_BYTE, gt_align_up(bytes));
    *out = ptr;
    return GT_OK;
}

void gt_sim_free(int index, void *ptr) {
    if (!ptr)
        return;
    live_remove(ptr);
    gt_sim_device_synchronize(index);
    size_t bytes = malloc_usable_size(ptr);
    memset(ptr, POISON_BYTE, bytes);
    if (bytes > GT_SIM_QUARANTINE_BYTES)
        free(ptr);
    else
        quarantine_add(ptr, bytes);
}

typedef struct poison_job {
    void *ptr;      /* start of the dead bytes */
    size_t bytes;   /* their length */
} poison_job;

static gt_status run_poison(void *args) {
    poison_job *j = args;
    memset(j->ptr, POISON_BYTE, j->bytes);
    return GT_OK;
}

gt_status gt_sim_poison(int index, gt_stream *stream, void *ptr, size_t bytes) {
    poison_job job = {ptr, bytes};
    return ptr && bytes ? gt_sim_enqueue(index, stream, run_poison, &job, sizeof job) : GT_OK;
}

gt_status gt_sim_mem_get_info(int index, size_t *free_bytes, size_t *total_bytes) {
    if (index < 0 || index >= GT_SIM_DEVICES)
        return GT_FAIL(GT_ERR_VALUE, "device: 'sim:%d' does not exist", index);
    long pages = sysconf(_SC_PHYS_PAGES), available = sysconf(_SC_AVPHYS_PAGES);
    long page_bytes = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || available < 0 || page_bytes <= 0)
        return GT_FAIL(GT_ERR_OS, "cannot read the size of physical memory");
    *total_bytes = (size_t)pages * (size_t)page_bytes;
    *free_bytes = (size_t)available * (size_t)page_bytes;
    return GT_OK;
}
