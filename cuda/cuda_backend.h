/* The C-callable surface of the CUDA backend (extern "C" wrappers around the runtime,
 * cuBLAS(Lt) and kernels). Included by C files only when built with GT_WITH_CUDA.
 *
 * Conventions for every function below that returns a gt_status:
 *  - Arguments are checked first (GT_ERR_VALUE naming the argument).
 *  - Without a driver or device the function fails with GT_ERR_CUDA
 *    "CUDA is not available: <reason>" and calls nothing in cuBLAS (nor loads it).
 *  - A failing CUDA call gives "<call> failed: <cudaGetErrorString> (<cudaGetErrorName>)"
 *    as GT_ERR_CUDA, or GT_ERR_OOM when the runtime ran out of memory.
 *  - Device indices are CUDA ordinals; functions that take one make it current on the
 *    calling thread (cudaSetDevice is per thread). */
#ifndef GT_CUDA_BACKEND_H
#define GT_CUDA_BACKEND_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime.cu: probe, hooks, versions ---- */

/* Fills gt_cuda (core/device.h) with this backend's functions. Never fails: without a
 * driver or device, device_count() reports 0 and the backend stays unused. */
void gt_cuda_install_hooks(void);

/* Why CUDA is unavailable ("" when a device is usable), e.g. "no NVIDIA driver". */
const char *gt_cuda_unavailable_reason(void);

/* CUDA runtime version as an int (e.g. 13000), and the driver's (0 without a driver). */
int gt_cuda_runtime_version(void);
int gt_cuda_driver_version(void);

/* ---- device.cu: device selection and properties ---- */

typedef struct gt_cuda_device_props {
    char name[256];                /* product name, NUL-terminated */
    size_t total_memory;           /* bytes of device memory */
    int major;                     /* compute capability, major (8 for sm_80/86/89) */
    int minor;                     /* compute capability, minor */
    int multiprocessor_count;      /* streaming multiprocessors (SMs) */
    int max_threads_per_block;     /* threads one block may hold */
    int warp_size;                 /* threads per warp */
    size_t shared_memory_per_block;  /* bytes of shared memory a block may opt in to */
    size_t l2_cache_bytes;         /* bytes of L2 cache */
} gt_cuda_device_props;

/* Fills `out` with the properties of device `index`. */
gt_status gt_cuda_get_device_properties(int index, gt_cuda_device_props *out);

/* Makes device `index` current on the calling thread. */
gt_status gt_cuda_set_device(int index);

/* The device current on the calling thread (0 unless gt_cuda_set_device chose another). */
gt_status gt_cuda_get_device(int *out);

/* Waits until all work queued on device `index`, on every stream, has finished. */
gt_status gt_cuda_device_synchronize(int index);

/* ---- stream.cu: streams ---- */

/* A non-blocking CUDA stream bound to one device (layout private to cuda/). */
typedef struct gt_cuda_stream gt_cuda_stream;

/* A CUDA event bound to one device (layout private to cuda/; see event.cu below). */
typedef struct gt_cuda_event gt_cuda_event;

/* Creates a stream on device `device` (cudaStreamNonBlocking: it does not wait for the
 * legacy default stream). Free it with gt_cuda_stream_destroy. */
gt_status gt_cuda_stream_create(int device, gt_cuda_stream **out);

/* Waits for the stream's work, then destroys it. NULL is ignored. */
void gt_cuda_stream_destroy(gt_cuda_stream *stream);

/* The device the stream belongs to. */
int gt_cuda_stream_device(const gt_cuda_stream *stream);

/* The cudaStream_t behind the handle, for launching kernels from cuda/ code. */
void *gt_cuda_stream_native(const gt_cuda_stream *stream);

/* Blocks the calling thread until all work queued on the stream has finished. */
gt_status gt_cuda_stream_synchronize(gt_cuda_stream *stream);

/* Sets *done to 1 when all work queued on the stream has finished, 0 otherwise; never blocks. */
gt_status gt_cuda_stream_query(gt_cuda_stream *stream, int *done);

/* Makes later work on `stream` wait until `event` (recorded on any stream) has completed;
 * the host does not block. */
gt_status gt_cuda_stream_wait_event(gt_cuda_stream *stream, gt_cuda_event *event);

/* ---- event.cu: events ---- */

/* Creates an event on device `device`; timing = 1 allows gt_cuda_event_elapsed_ms,
 * timing = 0 makes a lighter sync-only event. Free it with gt_cuda_event_destroy. */
gt_status gt_cuda_event_create(int device, int timing, gt_cuda_event **out);

/* Destroys the event (pending work that records it is not waited for). NULL is ignored. */
void gt_cuda_event_destroy(gt_cuda_event *event);

/* Captures the work queued on `stream` so far; the event completes when that work has.
 * The stream must belong to the event's device. */
gt_status gt_cuda_event_record(gt_cuda_event *event, gt_cuda_stream *stream);

/* Blocks the calling thread until the event has completed. */
gt_status gt_cuda_event_synchronize(gt_cuda_event *event);

/* Sets *done to 1 when the event has completed (or was never recorded), 0 otherwise. */
gt_status gt_cuda_event_query(gt_cuda_event *event, int *done);

/* Milliseconds between two completed timing events: *ms = time(end) - time(start). */
gt_status gt_cuda_event_elapsed_ms(gt_cuda_event *start, gt_cuda_event *end, float *ms);

/* ---- copy.cu: copies and fills ---- */

/* Direction of a copy (values match cudaMemcpyKind). GT_COPY_DEFAULT lets CUDA infer it
 * from the pointers (unified addressing); it also copies between two devices. */
typedef enum gt_cuda_copy_kind {
    GT_COPY_HOST_TO_DEVICE = 1,    /* host (pageable or pinned) -> device */
    GT_COPY_DEVICE_TO_HOST = 2,    /* device -> host (pageable or pinned) */
    GT_COPY_DEVICE_TO_DEVICE = 3,  /* device -> same device */
    GT_COPY_DEFAULT = 4,           /* inferred from the pointers */
} gt_cuda_copy_kind;

/* Copies `bytes` from `src` to `dst` with device `device` current; returns when the copy
 * is done (from pageable host memory: when it has been staged). bytes = 0 is a no-op
 * after the checks. */
gt_status gt_cuda_memcpy(void *dst, const void *src, size_t bytes, gt_cuda_copy_kind kind,
                         int device);

/* Queues the copy on `stream` and returns at once. Host memory must stay valid until the
 * stream has passed the copy; only pinned host memory (GT_DEVICE_PINNED blocks with
 * pinned = 1) overlaps with computation, pageable memory makes the copy synchronous. */
gt_status gt_cuda_memcpy_async(void *dst, const void *src, size_t bytes,
                               gt_cuda_copy_kind kind, gt_cuda_stream *stream);

/* Sets `bytes` of device memory at `dst` to the byte `value` (0..255) on device `device`;
 * returns when done. */
gt_status gt_cuda_memset(void *dst, int value, size_t bytes, int device);

/* Queues the fill on `stream` and returns at once. */
gt_status gt_cuda_memset_async(void *dst, int value, size_t bytes, gt_cuda_stream *stream);

/* ---- cuda_libs.cu: cuBLAS(Lt), cuDNN and NCCL, opened with dlopen when first needed ---- */

/* The libraries the backend opens at run time (none is linked: importing gputrain loads none). */
typedef enum gt_cuda_lib {
    GT_CUDA_LIB_CUBLASLT,  /* libcublasLt.so.<CUDA major>: at the first device context */
    GT_CUDA_LIB_CUBLAS,    /* libcublas.so.<CUDA major>: at the first device context */
    GT_CUDA_LIB_CUDNN,     /* libcudnn.so.9: at the first Conv2d (or cudnn version query) */
    GT_CUDA_LIB_NCCL,      /* libnccl.so.2: when the first NCCL communicator is made */
    GT_CUDA_LIB_COUNT
} gt_cuda_lib;

/* Finds the copy of library `name` (cuda.pathfinder's short name, e.g. "cublasLt") with file
 * name `soname` to open: writes its absolute path to `path` (or "" to let dlopen search by
 * soname) and returns 0; or returns -1 with why it found none in `why`. Called with no lock of
 * the loader held, from any thread, at most once per library load attempt. */
typedef int (*gt_cuda_lib_resolver)(const char *name, const char *soname, char *path, size_t path_size,
                                    char *why, size_t why_size);

/* Installs the resolver (the Python layer's, csrc/py/cuda_libs.c); NULL: dlopen by soname only. */
void gt_cuda_set_lib_resolver(gt_cuda_lib_resolver resolver);

/* Opens `lib` once per process: a copy already loaded (RTLD_NOLOAD by soname) first, else the
 * resolver's path, else the soname through the system's search; then reads every function the
 * backend calls and checks the version. GT_ERR_CUDA names the library, what was tried and, for a
 * version out of range, the version found and the range gputrain needs. Needs no GPU. */
gt_status gt_cuda_lib_load(gt_cuda_lib lib);

/* What is known about `lib`, loaded or not. */
typedef struct gt_cuda_lib_info {
    const char *name;       /* cuda.pathfinder's short name: "cublasLt", "cublas", "cudnn", "nccl" */
    const char *soname;     /* the file name opened, e.g. "libcudnn.so.9" */
    int loaded;             /* 1 once gt_cuda_lib_load succeeded */
    const char *path;       /* the file the dynamic loader mapped ("" until loaded) */
    long version;           /* the library's own version number (0 until loaded), e.g. 91900 */
    long min_version;       /* the oldest version gputrain accepts, same encoding */
    long built_with;        /* the version of the headers gputrain was compiled with */
} gt_cuda_lib_info;

/* Fills *out for `lib` (GT_ERR_VALUE for an unknown lib); loads nothing. */
gt_status gt_cuda_lib_get_info(gt_cuda_lib lib, gt_cuda_lib_info *out);

/* ---- context.cu: cuBLAS and cuBLASLt handles per device ---- */

struct cublasContext;    /* behind cublasHandle_t */
struct cublasLtContext;  /* behind cublasLtHandle_t */
struct cudnnContext;     /* behind cudnnHandle_t */

/* The library handles of one device (cuDNN's when a Conv2d is first planned). GEMM code reads
 * `tf32` to choose CUBLAS_COMPUTE_32F_FAST_TF32 (cuBLASLt) for fp32 work. */
typedef struct gt_cuda_context {
    int device;                        /* CUDA ordinal the handles were created on */
    struct cublasContext *cublas;      /* cublasHandle_t */
    struct cublasLtContext *cublaslt;  /* cublasLtHandle_t */
    int tf32;                          /* 1: fp32 GEMMs/convs may use TF32 tensor cores */
    struct cudnnContext *cudnn;        /* cudnnHandle_t choosing conv algorithms (ops_conv.cu);
                                          NULL until the first Conv2d is planned */
} gt_cuda_context;

/* Creates the handles of device `device`; TF32 starts as gt_cuda_tf32_enabled(). The
 * caller owns the context and frees it with gt_cuda_context_free. */
gt_status gt_cuda_context_create(int device, gt_cuda_context **out);

/* Destroys the handles and the context. NULL is ignored. */
void gt_cuda_context_free(gt_cuda_context *context);

/* The shared context of device `device` from the per-device table, created on first use
 * (thread-safe). It stays owned by the table: do not free it; see gt_cuda_context_free_all. */
gt_status gt_cuda_context_get(int device, gt_cuda_context **out);

/* Frees every context in the table (call when no work uses them any more). */
void gt_cuda_context_free_all(void);

/* Switches TF32 for fp32 math (enabled: 1 or 0): cuBLAS math mode CUBLAS_TF32_TENSOR_OP_MATH
 * or CUBLAS_DEFAULT_MATH on every context of the table and on those created later. Without
 * a device it records the choice and succeeds (no library is called). Default: 0. */
gt_status gt_cuda_set_tf32(int enabled);

/* The TF32 choice new contexts start with (1 or 0). */
int gt_cuda_tf32_enabled(void);

/* Switches TF32 on one context (see gt_cuda_set_tf32). */
gt_status gt_cuda_context_set_tf32(gt_cuda_context *context, int enabled);

/* Reads the cuBLAS handle's math mode back: *tf32 = 1 for CUBLAS_TF32_TENSOR_OP_MATH. */
gt_status gt_cuda_context_cublas_tf32(gt_cuda_context *context, int *tf32);

#ifdef __cplusplus
}
#endif
#endif
