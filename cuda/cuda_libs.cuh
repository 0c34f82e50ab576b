// The CUDA libraries the backend calls through tables of function pointers, filled by
// gt_cuda_lib_load (cuda_libs.cu) with dlsym when a library is first needed: nothing links
// cuBLAS(Lt), cuDNN or NCCL, so `import gputrain` maps none of them, and a process that loads
// another copy first (PyTorch's) keeps it. Each table's fields are typed from the headers'
// own prototypes (decltype(&f)), so a signature cannot drift from the header compiled against.
//
// Call sites write `gt_cublas.cublasCreate(...)`; the caller must have loaded the library
// (gt_cuda_lib_load) before, which every entry point that can reach a call does.
#ifndef GT_CUDA_LIBS_CUH
#define GT_CUDA_LIBS_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

#include "cuda_backend.h"

// Every function of each library the backend calls. The names go through the headers' macros
// (cublasCreate is cublasCreate_v2), so the field and the symbol read are the real ones.
#define GT_CUBLASLT_FUNCTIONS(X)                 \
    X(cublasLtGetVersion)                        \
    X(cublasLtCreate)                            \
    X(cublasLtDestroy)                           \
    X(cublasLtMatmul)                            \
    X(cublasLtMatmulAlgoGetHeuristic)            \
    X(cublasLtMatmulDescCreate)                  \
    X(cublasLtMatmulDescDestroy)                 \
    X(cublasLtMatmulDescSetAttribute)            \
    X(cublasLtMatmulPreferenceCreate)            \
    X(cublasLtMatmulPreferenceDestroy)           \
    X(cublasLtMatmulPreferenceSetAttribute)      \
    X(cublasLtMatrixLayoutCreate)                \
    X(cublasLtMatrixLayoutDestroy)               \
    X(cublasLtMatrixLayoutSetAttribute)

#define GT_CUBLAS_FUNCTIONS(X)                   \
    X(cublasGetProperty)                         \
    X(cublasCreate)                              \
    X(cublasDestroy)                             \
    X(cublasSetStream)                           \
    X(cublasSetMathMode)                         \
    X(cublasGetMathMode)                         \
    X(cublasGetStatusString)                     \
    X(cublasGetStatusName)

#define GT_CUDNN_FUNCTIONS(X)                        \
    X(cudnnGetVersion)                               \
    X(cudnnGetErrorString)                           \
    X(cudnnCreate)                                   \
    X(cudnnDestroy)                                  \
    X(cudnnSetStream)                                \
    X(cudnnCreateTensorDescriptor)                   \
    X(cudnnDestroyTensorDescriptor)                  \
    X(cudnnSetTensor4dDescriptor)                    \
    X(cudnnCreateFilterDescriptor)                   \
    X(cudnnDestroyFilterDescriptor)                  \
    X(cudnnSetFilter4dDescriptor)                    \
    X(cudnnCreateConvolutionDescriptor)              \
    X(cudnnDestroyConvolutionDescriptor)             \
    X(cudnnSetConvolution2dDescriptor)               \
    X(cudnnSetConvolutionGroupCount)                 \
    X(cudnnSetConvolutionMathType)                   \
    X(cudnnGetConvolutionForwardAlgorithm_v7)        \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7)   \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) \
    X(cudnnFindConvolutionForwardAlgorithm)          \
    X(cudnnFindConvolutionBackwardDataAlgorithm)     \
    X(cudnnFindConvolutionBackwardFilterAlgorithm)   \
    X(cudnnConvolutionForward)                       \
    X(cudnnConvolutionBackwardData)                  \
    X(cudnnConvolutionBackwardFilter)

#define GT_NCCL_FUNCTIONS(X)   \
    X(ncclGetVersion)          \
    X(ncclGetErrorString)      \
    X(ncclGetUniqueId)         \
    X(ncclCommInitRank)        \
    X(ncclCommDestroy)         \
    X(ncclCommAbort)           \
    X(ncclCommGetAsyncError)   \
    X(ncclGroupStart)          \
    X(ncclGroupEnd)            \
    X(ncclSend)                \
    X(ncclRecv)                \
    X(ncclBroadcast)

#define GT_CUDA_LIB_FIELD(name) decltype(&::name) name;  // a pointer typed by the header's prototype

struct gt_cublaslt_table { GT_CUBLASLT_FUNCTIONS(GT_CUDA_LIB_FIELD) };
// cublasGemmStridedBatchedEx has a static inline C++ overload (a cudaDataType compute type)
// beside the exported function, so decltype cannot name it: its type is written out, and the
// static_assert in cuda_libs.cu stops the build if the header's exported prototype ever differs.
using gt_pfn_cublasGemmStridedBatchedEx = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *, const void *,
    cudaDataType, int, long long int, const void *, cudaDataType, int, long long int, const void *, void *,
    cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);

struct gt_cublas_table {
    GT_CUBLAS_FUNCTIONS(GT_CUDA_LIB_FIELD)
    gt_pfn_cublasGemmStridedBatchedEx cublasGemmStridedBatchedEx;
};
struct gt_cudnn_table { GT_CUDNN_FUNCTIONS(GT_CUDA_LIB_FIELD) };
struct gt_nccl_table { GT_NCCL_FUNCTIONS(GT_CUDA_LIB_FIELD) };

// Process-wide (a dlopen'ed library is): valid once gt_cuda_lib_load of that library succeeded.
extern gt_cublaslt_table gt_cublaslt;
extern gt_cublas_table gt_cublas;
extern gt_cudnn_table gt_cudnn;
extern gt_nccl_table gt_nccl;

#endif
