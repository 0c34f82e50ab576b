/* The CUDA backend's op table (ops.h) and its per-backend state, callable from C. Included by C
 * files only when built with GT_WITH_CUDA.
 *
 * Every op of gt_cuda_ops() queues its work on the state's stream and returns without waiting,
 * except sum_squares (*out is a host pointer), which waits. Array arguments are device pointers of
 * the state's device, softmax_xent's `count` and mse's `loss` included (written in stream order,
 * never read back). The caller's data that only the device sees (ids, targets, lengths and
 * key_lengths) is checked by a kernel: the first bad entry of the first op that found one is kept
 * in the state's error slot (the op's own kernels then skip their work) and reported, with the
 * CPU's message and status, when the host next waits for the stream (gt_cuda_backend_synchronize,
 * or the device interface's blocking copy and stream wait: gt_cuda_stream_op_error).
 *
 * Element math is the GT_HD code of core/ (half.h, activation.h with vmath.h's correctly rounded
 * + - * / only, dropout.h), so elementwise ops and activations match the CPU backend to the last
 * bit, dropout masks are bit-identical, and sum_squares, mse and
 * the LayerNorm statistics follow the CPU's summation order (GT_LANE_SUM in fixed parts), so
 * they match it bit for bit. bias_backward, the LayerNorm parameter gradients and
 * embedding_backward use fixed orders without floating-point atomics: the same bits on every
 * run (embedding_backward also adds in the CPU's order, so it matches it exactly). Attention
 * (ops_attention.cu) runs the per-row math of ops/attention_hd.h, the CPU op's operations in its
 * order, so out, lse and the gradients are the CPU op's bits; head_dim is at most 256 there.
 * BatchNorm, 2-D pooling and the sequence mask/pooling ops (ops_batchnorm.cu, ops_pool2d.cu,
 * ops_sequence.cu) run the math of ops/batchnorm_hd.h, pool2d_hd.h and sequence_hd.h in the CPU's
 * order (BatchNorm's double sums included), so they give the CPU op's bits.
 * Conv2d (ops_conv.cu) is cuDNN's: within a stated tolerance of the CPU op, the same bits from
 * run to run only with gt_cuda_cudnn_set_flags(.., deterministic = 1); choosing a shape's
 * algorithms (once, normally when the plan sizes the workspace) waits for the device. */
#ifndef GT_OPS_CUDA_H
#define GT_OPS_CUDA_H

#include <stddef.h>

#include "core/alloc.h"
#include "core/status.h"
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gt_cuda_context;

/* Which device check of an op's data failed (gt_cuda_op_error.check). */
typedef enum gt_cuda_check {
    GT_CUDA_CHECK_NONE = 0,         /* no bad entry since the last report */
    GT_CUDA_CHECK_IDS = 1,          /* embedding ids outside [0, limit) */
    GT_CUDA_CHECK_TARGETS = 2,      /* softmax_xent targets outside [0, limit), not ignore_index */
    GT_CUDA_CHECK_LENGTHS = 3,      /* pooling lengths outside [0, limit] */
    GT_CUDA_CHECK_KEY_LENGTHS = 4,  /* attention key_lengths outside [0, limit] */
} gt_cuda_check;

/* The first bad entry a device check found since the host last waited for the stream. */
typedef struct gt_cuda_op_error {
    int64_t check;         /* a gt_cuda_check; GT_CUDA_CHECK_NONE: nothing to report */
    int64_t index;         /* position of the first bad entry in its array */
    int64_t value;         /* the entry */
    int64_t limit;         /* the range's bound: num, classes or seq */
    int64_t ignore_index;  /* softmax_xent's ignore_index (targets only) */
} gt_cuda_op_error;

/* What a CUDA gt_backend's `impl` points to. */
typedef struct gt_cuda_backend_state {
    int device;                       /* CUDA ordinal every op runs on */
    void *stream;                     /* cudaStream_t the ops queue on; NULL: legacy default stream */
    struct gt_cuda_context *context;  /* the device's shared cuBLASLt handle and TF32 flag */
    gt_block scratch;                 /* device memory: reduction parts and check results */
    void *conv;                       /* cuDNN handle on `stream` and per-shape descriptors
                                         (ops_conv.cu); NULL until the first convolution */
    gt_cuda_op_error *error;          /* pinned, host-mapped slot the check kernels write */
    struct gt_cuda_backend_state *next;  /* the next live state (ops_table.cu's registry) */
} gt_cuda_backend_state;

/* Bytes of a state's device scratch: GT_CUDA_MAX_PARTS doubles and a few 64-bit words. */
enum { GT_CUDA_MAX_PARTS = 1024, GT_CUDA_SCRATCH_BYTES = GT_CUDA_MAX_PARTS * 8 + 64 };

/* The CUDA backend's table (cuda/ops_*.cu). */
const gt_ops *gt_cuda_ops(void);

/* Fills `be` with the CUDA table, device `device`, no workspace, and a new state (the device's
 * shared context, its scratch taken from the device's pool) queueing on `stream` (a
 * cudaStream_t; NULL for the legacy default stream). Without CUDA or that device it fails with
 * GT_ERR_CUDA / GT_ERR_VALUE (cuda_backend.h). Release with gt_cuda_backend_release. */
gt_status gt_cuda_backend_init(gt_backend *be, int device, void *stream);

/* Waits for the state's stream, frees the state and clears be->impl. An uninitialised or
 * released backend (impl NULL) is ignored. */
void gt_cuda_backend_release(gt_backend *be);

/* Waits until every op queued so far on the backend's stream has finished; then reports the
 * first bad entry a device check recorded (GT_ERR_INDEX or GT_ERR_VALUE, the CPU's message). */
gt_status gt_cuda_backend_synchronize(gt_backend *be);

/* After the caller waited for `stream` (a cudaStream_t) of device `device`: reports and clears
 * the error slot of a live backend state queueing on it (GT_OK when none holds an error). */
gt_status gt_cuda_stream_op_error(int device, void *stream);

/* Copies `bytes` between host and device memory (either direction, or device to device) in
 * the backend's stream order; returns when the copy is done, reporting a recorded bad entry as
 * gt_cuda_backend_synchronize does (the copy has run). */
gt_status gt_cuda_backend_memcpy(gt_backend *be, void *dst, const void *src, size_t bytes);

/* ---- ops_conv.cu: 2-D convolution through cuDNN ---- */

/* The conv2d ops of the table (ops.h). The workspace size chooses the shape's algorithms on the
 * current device (cached; see the knobs below) and returns the bytes they need; 0 when the sizes
 * are invalid or no device is usable (the op reports why when it runs). */
size_t gt_cuda_conv2d_workspace_bytes(const gt_conv2d_args *args, int threads);
gt_status gt_cuda_conv2d_forward(gt_backend *be, const gt_conv2d_args *args);
gt_status gt_cuda_conv2d_backward(gt_backend *be, const gt_conv2d_args *args);

/* Destroys the state's cuDNN handle and descriptors (state->conv; NULL is ignored). */
void gt_cuda_conv_release(gt_cuda_backend_state *state);

/* torch.backends.cudnn's knobs for algorithms chosen from now on (each 0 or 1; default 0 and 0):
 * benchmark 1 measures the algorithms (cudnnFind*) once per shape instead of taking cuDNN's
 * heuristic first choice; deterministic 1 keeps to algorithms cuDNN reports as deterministic. */
gt_status gt_cuda_cudnn_set_flags(int benchmark, int deterministic);
void gt_cuda_cudnn_flags(int *benchmark, int *deterministic);

/* cuDNN's version as cudnnGetVersion() gives it (e.g. 91900 for 9.19.0), loading cuDNN if it is
 * not yet (gt_cuda_lib_load's errors); no device needed. */
gt_status gt_cuda_cudnn_version(size_t *out);

/* How many algorithm choices the process-wide cache holds. */
size_t gt_cuda_cudnn_cached_choices(void);

#ifdef __cplusplus
}
#endif
#endif
