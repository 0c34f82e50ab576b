// Device selection, device-wide synchronisation and the properties of a device.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "cuda_backend.h"
#include "cuda_internal.cuh"

extern "C" gt_status gt_cuda_get_device_properties(int index, gt_cuda_device_props *out) {
    GT_TRY(gt_cuda_require_device(index, "index"));
    cudaDeviceProp prop;
    GT_CUDA_TRY(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->total_memory = prop.totalGlobalMem;
    out->major = prop.major;
    out->minor = prop.minor;
    out->multiprocessor_count = prop.multiProcessorCount;
    out->max_threads_per_block = prop.maxThreadsPerBlock;
    out->warp_size = prop.warpSize;
    out->shared_memory_per_block = prop.sharedMemPerBlockOptin;
    out->l2_cache_bytes = (size_t)prop.l2CacheSize;
    return GT_OK;
}

extern "C" gt_status gt_cuda_set_device(int index) {
    return gt_cuda_require_device(index, "index");
}

extern "C" gt_status gt_cuda_get_device(int *out) {
    GT_TRY(gt_cuda_require_available());
    GT_CUDA_TRY(cudaGetDevice(out), "cudaGetDevice");
    return GT_OK;
}

extern "C" gt_status gt_cuda_device_synchronize(int index) {
    GT_TRY(gt_cuda_require_device(index, "index"));
    GT_CUDA_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return GT_OK;
}
