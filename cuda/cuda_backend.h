/* The C-callable surface of the CUDA backend (extern "C" wrappers around the runtime,
 * cuBLAS(Lt) and kernels). Included by C files only when built with GT_WITH_CUDA. */
#ifndef GT_CUDA_BACKEND_H
#define GT_CUDA_BACKEND_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills gt_cuda (core/device.h) with this backend's functions. Never fails: without a
 * driver or device, device_count() reports 0 and the backend stays unused. */
void gt_cuda_install_hooks(void);

/* Why CUDA is unavailable ("" when a device is usable), e.g. "no NVIDIA driver". */
const char *gt_cuda_unavailable_reason(void);

/* CUDA runtime version as an int (e.g. 13000), and the driver's (0 without a driver). */
int gt_cuda_runtime_version(void);
int gt_cuda_driver_version(void);

#ifdef __cplusplus
}
#endif
#endif
