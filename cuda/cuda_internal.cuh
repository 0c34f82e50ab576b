// Shared by the backend's .cu files only (C++): turning CUDA errors into gt_status, the
// device check every entry point starts with, and the layouts of the opaque stream and
// event handles that cuda_backend.h declares.
#ifndef GT_CUDA_INTERNAL_CUH
#define GT_CUDA_INTERNAL_CUH

#include <cuda_runtime.h>

#include "cuda_backend.h"

// Records "<what> failed: <cudaGetErrorString> (<cudaGetErrorName>)" at file:line, clears
// the runtime's last-error state, and returns GT_ERR_OOM for cudaErrorMemoryAllocation and
// GT_ERR_CUDA for every other error.
gt_status gt_cuda_error(cudaError_t err, const char *what, const char *file, int line);

// Registers the backend's table of core/device_backend.h (device_table.cu).
extern "C" void gt_cuda_install_device_backend(void);

// Fails with GT_ERR_CUDA "CUDA is not available: <reason>" without a usable device.
gt_status gt_cuda_require_available(void);

// Fails unless `index` names a usable device, then makes it current on this thread:
// GT_ERR_VALUE for index < 0, GT_ERR_CUDA "CUDA is not available: <reason>" without a
// device or driver, GT_ERR_VALUE for an index past the last device. `arg_name` is the
// argument the caller's message names.
gt_status gt_cuda_require_device(int index, const char *arg_name);

// Returns from the calling function with a gt_status when `call` does not succeed;
// `what` names the CUDA call in the message.
#define GT_CUDA_TRY(call, what)                                        \
    do {                                                               \
        cudaError_t gt_cuda_err_ = (call);                             \
        if (gt_cuda_err_ != cudaSuccess)                               \
            return gt_cuda_error(gt_cuda_err_, (what), __FILE__, __LINE__); \
    } while (0)

struct gt_cuda_stream {
    cudaStream_t stream;  // a non-blocking stream created on `device`
    int device;           // CUDA ordinal the stream belongs to
};

struct gt_cuda_event {
    cudaEvent_t event;  // created on `device`
    int device;         // CUDA ordinal the event belongs to
    int timing;         // 1 when elapsed times can be read, 0 for a sync-only event
};

#endif
