/* The CUDA backend's op table (ops.h) and its per-backend state, callable from C. Included by C
 * files only when built with GT_WITH_CUDA.
 *
 * Every op of gt_cuda_ops() queues its work on the state's stream and returns without waiting,
 * except the ops that check or scale with a value read back: softmax_xent (its count), mse (its
 * sum), sum_squares (*out), the id checks of embedding_forward/embedding_backward and the
 * key-length check of attention_forward/attention_backward (when key_lengths is given); those wait
 * for the stream. Array arguments are device pointers of the state's device, softmax_xent's
 * `count` and mse's `loss` included (written in stream order); sum_squares' `out` is a host
 * pointer. Errors of the caller's data (ids or targets out of range) are reported
 * as GT_ERR_INDEX naming the first bad position, as on the CPU.
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
 * order (BatchNorm's double sums included), so they give the CPU op's bits; pool_forward and
 * pool_backward check their lengths on the device and wait for the stream, like attention.
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

/* What a CUDA gt_backend's `impl` points to. */
typedef struct gt_cuda_backend_state {
    int device;                       /* CUDA ordinal every op runs on */
    void *stream;                     /* cudaStream_t the ops queue on; NULL: legacy default stream */
    struct gt_cuda_context *context;  /* the device's shared cuBLASLt handle and TF32 flag */
    gt_block scratch;                 /* device memory: reduction parts and check results */
    void *conv;                       /* cuDNN handle on `stream` and per-shape descriptors
                                         (ops_conv.cu); NULL until the first convolution */
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

/* Waits until every op queued so far on the backend's stream has finished. */
gt_status gt_cuda_backend_synchronize(gt_backend *be);

/* Copies `bytes` between host and device memory (either direction, or device to device) in
 * the backend's stream order; returns when the copy is done. */
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

/* cuDNN's version as cudnnGetVersion() gives it (e.g. 91900 for 9.19.0); no device needed. */
size_t gt_cuda_cudnn_version(void);

/* How many algorithm choices the process-wide cache holds. */
size_t gt_cuda_cudnn_cached_choices(void);

#ifdef __cplusplus
}
#endif
#endif
