// CUDA device query and memory: the hooks behind core/alloc.c for cuda:N and pinned memory.
#include <cuda_runtime.h>

#include <cstdio>
#include <mutex>

#include "core/device.h"
#include "cuda_backend.h"
#include "cuda_internal.cuh"

namespace {

std::once_flag probe_once;
int usable_devices = 0;             // devices found by the first probe
char unavailable_reason[512] = "";  // why usable_devices is 0

// Says why cudaGetDeviceCount failed, in the user's terms.
void describe_probe_failure(cudaError_t err) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (err == cudaErrorInsufficientDriver && driver == 0)
        snprintf(unavailable_reason, sizeof unavailable_reason, "no NVIDIA driver (%s)",
                 cudaGetErrorName(err));
    else if (err == cudaErrorInsufficientDriver)
        snprintf(unavailable_reason, sizeof unavailable_reason,
                 "the NVIDIA driver supports CUDA %d.%d, but gputrain was built with the CUDA "
                 "%d.%d runtime, which needs a driver for CUDA %d.0 or newer: update the driver, "
                 "or rebuild gputrain with a CUDA %d toolkit (CUDA_HOME=... pip install .) (%s)",
                 driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10,
                 runtime / 1000, driver / 1000, cudaGetErrorName(err));
    else if (err == cudaErrorNoDevice)
        snprintf(unavailable_reason, sizeof unavailable_reason, "no CUDA device (%s)",
                 cudaGetErrorName(err));
    else
        snprintf(unavailable_reason, sizeof unavailable_reason, "%s (%s)", cudaGetErrorString(err),
                 cudaGetErrorName(err));
}

void probe_devices() {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        describe_probe_failure(err);
        cudaGetLastError();  // clear the sticky-free error state
        return;
    }
    usable_devices = count < GT_MAX_CUDA_DEVICES ? count : GT_MAX_CUDA_DEVICES;
    if (usable_devices == 0)
        snprintf(unavailable_reason, sizeof unavailable_reason, "no CUDA device");
}

int device_count() {
    std::call_once(probe_once, probe_devices);
    return usable_devices;
}

gt_status device_malloc(int index, size_t bytes, void **out) {
    GT_CUDA_TRY(cudaSetDevice(index), "cudaSetDevice");
    GT_CUDA_TRY(cudaMalloc(out, bytes), "cudaMalloc");
    return GT_OK;
}

void device_free(int index, void *ptr) {
    cudaSetDevice(index);
    cudaFree(ptr);
}

gt_status host_alloc_pinned(size_t bytes, void **out) {
    if (device_count() == 0)
        return gt_set_error(GT_ERR_CUDA, __FILE__, __LINE__, "cannot pin memory: %s", unavailable_reason);
    GT_CUDA_TRY(cudaHostAlloc(out, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return GT_OK;
}

void host_free_pinned(void *ptr) { cudaFreeHost(ptr); }

gt_status mem_get_info(int index, size_t *free_bytes, size_t *total_bytes) {
    GT_CUDA_TRY(cudaSetDevice(index), "cudaSetDevice");
    GT_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
    return GT_OK;
}

}  // namespace

gt_status gt_cuda_error(cudaError_t err, const char *what, const char *file, int line) {
    cudaGetLastError();
    gt_status code = err == cudaErrorMemoryAllocation ? GT_ERR_OOM : GT_ERR_CUDA;
    return gt_set_error(code, file, line, "%s failed: %s (%s)", what, cudaGetErrorString(err),
                        cudaGetErrorName(err));
}

gt_status gt_cuda_require_available(void) {
    if (device_count() == 0)
        return GT_FAIL(GT_ERR_CUDA, "CUDA is not available: %s", unavailable_reason);
    return GT_OK;
}

gt_status gt_cuda_require_device(int index, const char *arg_name) {
    if (index < 0)
        return GT_FAIL(GT_ERR_VALUE, "%s: CUDA device index must be >= 0, got %d", arg_name, index);
    GT_TRY(gt_cuda_require_available());
    int count = device_count();
    if (index >= count)
        return GT_FAIL(GT_ERR_VALUE, "%s: CUDA device %d does not exist (%d device%s)", arg_name,
                       index, count, count == 1 ? "" : "s");
    GT_CUDA_TRY(cudaSetDevice(index), "cudaSetDevice");
    return GT_OK;
}

extern "C" void gt_cuda_install_hooks(void) {
    gt_cuda.device_count = device_count;
    gt_cuda.device_malloc = device_malloc;
    gt_cuda.device_free = device_free;
    gt_cuda.host_alloc_pinned = host_alloc_pinned;
    gt_cuda.host_free_pinned = host_free_pinned;
    gt_cuda.mem_get_info = mem_get_info;
    gt_cuda_install_device_backend();
}

extern "C" const char *gt_cuda_unavailable_reason(void) {
    device_count();
    return unavailable_reason;
}

extern "C" int gt_cuda_runtime_version(void) {
    int version = 0;
    cudaRuntimeGetVersion(&version);
    return version;
}

extern "C" int gt_cuda_driver_version(void) {
    int version = 0;
    if (cudaDriverGetVersion(&version) != cudaSuccess)
        cudaGetLastError();
    return version;
}
