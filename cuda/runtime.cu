// CUDA device query and memory: the hooks behind core/alloc.c for cuda:N and pinned memory.
#include <cuda_runtime.h>

#include <mutex>

#include "cuda_backend.h"
#include "core/device.h"

namespace {

std::once_flag probe_once;
int usable_devices = 0;             // devices found by the first probe
char unavailable_reason[256] = "";  // why usable_devices is 0

void probe_devices() {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        const char *why = err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice
                              ? "no NVIDIA driver or no CUDA device"
                              : cudaGetErrorString(err);
        snprintf(unavailable_reason, sizeof unavailable_reason, "%s (%s)", why, cudaGetErrorName(err));
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

gt_status cuda_fail(cudaError_t err, const char *what) {
    cudaGetLastError();
    gt_status code = err == cudaErrorMemoryAllocation ? GT_ERR_OOM : GT_ERR_CUDA;
    return gt_set_error(code, __FILE__, __LINE__, "%s failed: %s (%s)", what, cudaGetErrorString(err),
                        cudaGetErrorName(err));
}

gt_status device_malloc(int index, size_t bytes, void **out) {
    cudaError_t err = cudaSetDevice(index);
    if (err == cudaSuccess)
        err = cudaMalloc(out, bytes);
    return err == cudaSuccess ? GT_OK : cuda_fail(err, "cudaMalloc");
}

void device_free(int index, void *ptr) {
    cudaSetDevice(index);
    cudaFree(ptr);
}

gt_status host_alloc_pinned(size_t bytes, void **out) {
    if (device_count() == 0)
        return gt_set_error(GT_ERR_CUDA, __FILE__, __LINE__, "cannot pin memory: %s", unavailable_reason);
    cudaError_t err = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    return err == cudaSuccess ? GT_OK : cuda_fail(err, "cudaHostAlloc");
}

void host_free_pinned(void *ptr) { cudaFreeHost(ptr); }

gt_status mem_get_info(int index, size_t *free_bytes, size_t *total_bytes) {
    cudaError_t err = cudaSetDevice(index);
    if (err == cudaSuccess)
        err = cudaMemGetInfo(free_bytes, total_bytes);
    return err == cudaSuccess ? GT_OK : cuda_fail(err, "cudaMemGetInfo");
}

}  // namespace

extern "C" void gt_cuda_install_hooks(void) {
    gt_cuda.device_count = device_count;
    gt_cuda.device_malloc = device_malloc;
    gt_cuda.device_free = device_free;
    gt_cuda.host_alloc_pinned = host_alloc_pinned;
    gt_cuda.host_free_pinned = host_free_pinned;
    gt_cuda.mem_get_info = mem_get_info;
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
