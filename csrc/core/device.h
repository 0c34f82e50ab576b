/* Devices: the CPU (always), pinned host memory (an accounted pool of its own), and
 * CUDA devices when the extension was built with CUDA and a driver answers.
 * The CUDA backend installs its functions in gt_cuda_hooks at module start-up, so the
 * core never includes CUDA headers (the layering of DESIGN.md). */
#ifndef GT_DEVICE_H
#define GT_DEVICE_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GT_MAX_CUDA_DEVICES = 16 };

typedef enum gt_device_kind {
    GT_DEVICE_CPU = 0,     /* pageable host memory, CPU backend */
    GT_DEVICE_PINNED = 1,  /* page-locked host memory used for transfers */
    GT_DEVICE_CUDA = 2,    /* a CUDA device */
    GT_DEVICE_SIM = 3,     /* the simulated device: host memory with a GPU's semantics (csrc/sim/) */
} gt_device_kind;

typedef struct gt_device {
    gt_device_kind kind;   /* which kind of memory/compute */
    int index;             /* ordinal of cuda:N or sim:N; 0 for cpu and pinned */
} gt_device;

/* Functions the CUDA backend provides; all NULL when CUDA is absent. */
typedef struct gt_cuda_hooks {
    int (*device_count)(void);                                   /* 0 without driver/device */
    gt_status (*device_malloc)(int index, size_t bytes, void **out);
    void (*device_free)(int index, void *ptr);
    gt_status (*host_alloc_pinned)(size_t bytes, void **out);    /* cudaHostAlloc */
    void (*host_free_pinned)(void *ptr);
    gt_status (*mem_get_info)(int index, size_t *free_bytes, size_t *total_bytes);
} gt_cuda_hooks;

extern gt_cuda_hooks gt_cuda;

static inline gt_device gt_cpu_device(void) {
    gt_device d = {GT_DEVICE_CPU, 0};
    return d;
}

static inline gt_device gt_pinned_device(void) {
    gt_device d = {GT_DEVICE_PINNED, 0};
    return d;
}

static inline gt_device gt_cuda_device(int index) {
    gt_device d = {GT_DEVICE_CUDA, index};
    return d;
}

/* 1 for a device with memory of its own, reached through core/device_backend.h (cuda:N, sim:N). */
static inline int gt_device_is_accelerator(gt_device device) {
    return device.kind == GT_DEVICE_CUDA || device.kind == GT_DEVICE_SIM;
}

/* Number of usable CUDA devices (0 when not compiled in or no driver). */
int gt_cuda_device_count(void);

/* Parses "cpu", "pinned", "cuda", "cuda:N", "sim", "sim:N"; fails with GT_ERR_VALUE naming
 * `arg_name`. */
gt_status gt_device_parse(const char *text, const char *arg_name, gt_device *out);

/* Writes "cpu", "pinned", "cuda:N" or "sim:N" into `buf` (at least 16 bytes). */
void gt_device_name(gt_device device, char *buf, size_t buf_bytes);

/* Total memory of a device in bytes (physical RAM for cpu and pinned). */
gt_status gt_device_total_memory(gt_device device, size_t *out);

#ifdef __cplusplus
}
#endif
#endif
