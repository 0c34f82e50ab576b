// The per-device library context (cuBLAS and cuBLASLt handles, the libraries loaded first), the table of shared
// contexts, and the TF32 switch. The table is the only process-wide state; its mutex
// guards the contexts and the TF32 choice.
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>

#include "core/device.h"
#include "cuda_backend.h"
#include "cuda_internal.cuh"
#include "cuda_libs.cuh"

namespace {

struct context_table {
    std::mutex lock;                                 // guards every field below
    gt_cuda_context *contexts[GT_MAX_CUDA_DEVICES];  // shared context per device; NULL until first use
    int tf32;                                        // TF32 choice for new contexts (0 or 1)
};

context_table table;

gt_status cublas_error(cublasStatus_t status, const char *what, int line) {
    return gt_set_error(GT_ERR_CUDA, __FILE__, line, "%s failed: %s (%s)", what,
                        gt_cublas.cublasGetStatusString(status), gt_cublas.cublasGetStatusName(status));
}

gt_status create_handles(gt_cuda_context *context) {
    cublasStatus_t blas = gt_cublas.cublasCreate(&context->cublas);
    if (blas != CUBLAS_STATUS_SUCCESS)
        return cublas_error(blas, "cublasCreate", __LINE__);
    blas = gt_cublaslt.cublasLtCreate(&context->cublaslt);
    if (blas != CUBLAS_STATUS_SUCCESS)
        return cublas_error(blas, "cublasLtCreate", __LINE__);
    return GT_OK;
}

// Creates a context whose TF32 mode is `tf32` (needs no lock: it touches no table field).
gt_status create_context(int device, int tf32, gt_cuda_context **out) {
    *out = NULL;
    GT_TRY(gt_cuda_require_device(device, "device"));
    GT_TRY(gt_cuda_lib_load(GT_CUDA_LIB_CUBLAS));  // and cuBLASLt; at once when already loaded
    gt_cuda_context *context = (gt_cuda_context *)calloc(1, sizeof *context);
    if (!context)
        return GT_FAIL(GT_ERR_OOM, "out of host memory for a CUDA context");
    context->device = device;
    gt_status status = create_handles(context);
    if (status == GT_OK)
        status = gt_cuda_context_set_tf32(context, tf32);
    if (status != GT_OK) {
        gt_cuda_context_free(context);
        return status;
    }
    *out = context;
    return GT_OK;
}

}  // namespace

extern "C" gt_status gt_cuda_context_create(int device, gt_cuda_context **out) {
    int tf32 = gt_cuda_tf32_enabled();
    return create_context(device, tf32, out);
}

extern "C" void gt_cuda_context_free(gt_cuda_context *context) {
    if (!context)
        return;
    cudaSetDevice(context->device);
    if (context->cublaslt)
        gt_cublaslt.cublasLtDestroy(context->cublaslt);
    if (context->cublas)
        gt_cublas.cublasDestroy(context->cublas);
    if (context->cudnn)
        gt_cudnn.cudnnDestroy(context->cudnn);
    cudaGetLastError();
    free(context);
}

extern "C" gt_status gt_cuda_context_get(int device, gt_cuda_context **out) {
    *out = NULL;
    GT_TRY(gt_cuda_require_device(device, "device"));
    // Loaded before the lock: the loader may wait for the Python layer (the GIL) to find it.
    GT_TRY(gt_cuda_lib_load(GT_CUDA_LIB_CUBLAS));
    std::lock_guard<std::mutex> guard(table.lock);
    if (!table.contexts[device])
        GT_TRY(create_context(device, table.tf32, &table.contexts[device]));
    *out = table.contexts[device];
    return GT_OK;
}

extern "C" void gt_cuda_context_free_all(void) {
    std::lock_guard<std::mutex> guard(table.lock);
    for (gt_cuda_context *&context : table.contexts) {
        gt_cuda_context_free(context);
        context = NULL;
    }
}

extern "C" gt_status gt_cuda_set_tf32(int enabled) {
    if (enabled != 0 && enabled != 1)
        return GT_FAIL(GT_ERR_VALUE, "enabled: must be 0 or 1, got %d", enabled);
    std::lock_guard<std::mutex> guard(table.lock);
    table.tf32 = enabled;
    for (gt_cuda_context *context : table.contexts)
        if (context)
            GT_TRY(gt_cuda_context_set_tf32(context, enabled));
    return GT_OK;
}

extern "C" int gt_cuda_tf32_enabled(void) {
    std::lock_guard<std::mutex> guard(table.lock);
    return table.tf32;
}

extern "C" gt_status gt_cuda_context_set_tf32(gt_cuda_context *context, int enabled) {
    if (!context)
        return GT_FAIL(GT_ERR_VALUE, "context: must not be NULL");
    if (enabled != 0 && enabled != 1)
        return GT_FAIL(GT_ERR_VALUE, "enabled: must be 0 or 1, got %d", enabled);
    cublasStatus_t status = gt_cublas.cublasSetMathMode(
        context->cublas, enabled ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (status != CUBLAS_STATUS_SUCCESS)
        return cublas_error(status, "cublasSetMathMode", __LINE__);
    context->tf32 = enabled;
    return GT_OK;
}

extern "C" gt_status gt_cuda_context_cublas_tf32(gt_cuda_context *context, int *tf32) {
    if (!context)
        return GT_FAIL(GT_ERR_VALUE, "context: must not be NULL");
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
    cublasStatus_t status = gt_cublas.cublasGetMathMode(context->cublas, &mode);
    if (status != CUBLAS_STATUS_SUCCESS)
        return cublas_error(status, "cublasGetMathMode", __LINE__);
    int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    *tf32 = base == CUBLAS_TF32_TENSOR_OP_MATH;
    return GT_OK;
}
