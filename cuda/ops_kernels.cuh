// Shared by the CUDA op files (cuda/ops_*.cu) only (C++): dtype-templated loads and stores with
// the RNE conversions of core/half.h, launch sizes, the argument checks (the CPU backend's
// messages), the per-call set-up, the fixed-order lane sums of the CPU's GT_LANE_SUM, and the
// op functions each file defines for the table in ops_table.cu.
#ifndef GT_OPS_KERNELS_CUH
#define GT_OPS_KERNELS_CUH

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

#include "core/half.h"
#include "cuda_internal.cuh"
#include "ops/checks.h"
#include "ops/ops.h"
#include "ops_cuda.h"

constexpr int kThreads = 256;            // threads per block of the elementwise kernels
constexpr size_t kMaxBlocks = 65535;     // grid cap; grid-stride loops cover the rest
constexpr unsigned kLanes = 8;           // lanes of a fixed-order sum (the CPU's GT_LANES)
constexpr unsigned kRowsPerBlock = kThreads / kLanes;  // rows of a lane-sum block (32)

// Blocks for `units` independent units of work of `per_block` units each, capped.
static inline unsigned grid_for(size_t units, size_t per_block = kThreads) {
    size_t blocks = (units + per_block - 1) / per_block;
    return (unsigned)(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// Element i of an activation array of dtype DT, widened to f32 (exact).
template <gt_dtype DT>
__device__ __forceinline__ float load_elem(const void *base, size_t i) {
    if constexpr (DT == GT_F16)
        return gt_f16_to_f32(static_cast<const uint16_t *>(base)[i]);
    else if constexpr (DT == GT_BF16)
        return gt_bf16_to_f32(static_cast<const uint16_t *>(base)[i]);
    else
        return static_cast<const float *>(base)[i];
}

// Stores an f32 value into element i of an array of dtype DT, rounding once (RNE).
template <gt_dtype DT>
__device__ __forceinline__ void store_elem(void *base, size_t i, float value) {
    if constexpr (DT == GT_F16)
        static_cast<uint16_t *>(base)[i] = gt_f32_to_f16(value);
    else if constexpr (DT == GT_BF16)
        static_cast<uint16_t *>(base)[i] = gt_f32_to_bf16(value);
    else
        static_cast<float *>(base)[i] = value;
}

// for (size_t i = first global thread; i < n; i += all threads of the grid)
#define GT_GRID_STRIDE(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);    \
         i += (size_t)gridDim.x * blockDim.x)

// Launches KERNEL<dt>, an activation-dtype template, with the given configuration and args.
#define GT_LAUNCH_DT(dt, KERNEL, grid, block, shmem, stream, ...)                      \
    do {                                                                               \
        switch (dt) {                                                                  \
        case GT_F16: KERNEL<GT_F16><<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__); break;   \
        case GT_BF16: KERNEL<GT_BF16><<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__); break; \
        default: KERNEL<GT_F32><<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__); break;        \
        }                                                                              \
    } while (0)

// The sum of the 8 lane values of one group of 8 consecutive threads of a warp, folded as the
// CPU's GT_LANE_SUM folds them: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). Valid in
// the group's lane 0. Every thread of the warp must call it (full-warp shuffles).
__device__ __forceinline__ double fold_lanes(double value, unsigned lane) {
    for (unsigned width = 1; width < kLanes; width *= 2) {
        double other = __shfl_down_sync(0xffffffffu, value, width, kLanes);
        if (lane % (2 * width) == 0)
            value = __dadd_rn(value, other);
    }
    return value;
}

// Lane `lane`'s share of a fixed-order sum over [begin, end): the terms k = begin + lane,
// begin + lane + 8, ... added in increasing k (a lane of the CPU's GT_LANE_SUM).
template <typename Term>
__device__ __forceinline__ double lane_partial(size_t begin, size_t end, unsigned lane, Term term) {
    double sum = 0.0;
    for (size_t k = begin + lane; k < end; k += kLanes)
        sum = __dadd_rn(sum, term(k));
    return sum;
}

// parts[p] = the fixed-order sum (the CPU's GT_LANE_SUM) of term(k) over part p's elements
// [p * part_size, min(n, (p + 1) * part_size)): 8 threads per part, 32 parts per block.
template <typename Term>
__global__ void lane_parts_kernel(double *parts, size_t n, size_t part_size, size_t num_parts, Term term) {
    const unsigned lane = threadIdx.x % kLanes;
    const size_t groups = (num_parts + kRowsPerBlock - 1) / kRowsPerBlock;
    for (size_t group = blockIdx.x; group < groups; group += gridDim.x) {
        const size_t p = group * kRowsPerBlock + threadIdx.x / kLanes;
        const size_t begin = p < num_parts ? p * part_size : n;
        const size_t end = n - begin < part_size ? n : begin + part_size;
        double sum = fold_lanes(lane_partial(begin, end, lane, term), lane);
        if (p < num_parts && lane == 0)
            parts[p] = sum;
    }
}

// The backend state of `be` with its device made current on this thread.
gt_status gt_cuda_op_begin(gt_backend *be, gt_cuda_backend_state **out);

// The stream of a state as a cudaStream_t.
static inline cudaStream_t stream_of(const gt_cuda_backend_state *state) {
    return static_cast<cudaStream_t>(state->stream);
}

// Fails with GT_ERR_CUDA naming `kernel` when its launch failed.
gt_status gt_cuda_check_launch(const char *kernel);

// The first bad index of an op's device check when it found none.
constexpr unsigned long long kNoBad = ~0ull;

// 1 when the check whose first bad index is *first_bad failed (NULL: the op had nothing to check).
__device__ inline bool gt_check_failed(const unsigned long long *first_bad) {
    return first_bad && *first_bad != kNoBad;
}

// Queues the check of values[0:n] (device memory) against error.limit: ids and targets must be in
// [0, limit) (targets equal to error.ignore_index pass), lengths in [0, limit]. The first bad index
// goes to scratch_words(state)[0] (kNoBad when none; the op's kernels test it with
// gt_check_failed) and, when the state's error slot is empty, into the slot with `error`'s other
// fields. Nothing is read back: the slot is reported at the stream's next wait.
gt_status gt_cuda_check_entries(const gt_cuda_backend_state *state, const int64_t *values, size_t n,
                                gt_cuda_op_error error);

// Device scratch of a state: GT_CUDA_MAX_PARTS doubles, then 64-bit check words.
static inline double *scratch_parts(const gt_cuda_backend_state *state) {
    return static_cast<double *>(state->scratch.ptr);
}
static inline unsigned long long *scratch_words(const gt_cuda_backend_state *state) {
    return reinterpret_cast<unsigned long long *>(static_cast<char *>(state->scratch.ptr) +
                                                  GT_CUDA_MAX_PARTS * sizeof(double));
}

// Parts of a fixed-order sum over n elements (cpu_reduce.c): at most GT_CUDA_MAX_PARTS parts of
// part_size(n) elements, at least 16384 and a multiple of 8.
size_t gt_cuda_sum_part_size(size_t n);

// The part sums of `num_parts` parts copied back from the scratch and added in part order on
// the host (the CPU's add_parts); waits for the stream.
gt_status gt_cuda_add_parts(const gt_cuda_backend_state *state, size_t num_parts, double *out);

// Queues the part sums of term(k) over k < n (n >= 1) in the CPU's order (cpu_reduce.c) into
// scratch_parts(state) (lane_parts_kernel); *num_parts = how many. Does not wait.
template <typename Term>
gt_status gt_cuda_fixed_order_parts(const gt_cuda_backend_state *state, size_t n, Term term, size_t *num_parts) {
    size_t size = gt_cuda_sum_part_size(n);
    *num_parts = (n + size - 1) / size;
    lane_parts_kernel<<<grid_for(*num_parts, kRowsPerBlock), kThreads, 0, stream_of(state)>>>(
        scratch_parts(state), n, size, *num_parts, term);
    return gt_cuda_check_launch("lane_parts_kernel launch");
}

// *out = the sum of term(k) over k < n (n >= 1) in the CPU's order: the parts above, their sums
// added in part order on the host. Waits for the stream.
template <typename Term>
gt_status gt_cuda_fixed_order_sum(const gt_cuda_backend_state *state, size_t n, Term term, double *out) {
    size_t num_parts = 0;
    GT_TRY(gt_cuda_fixed_order_parts(state, n, term, &num_parts));
    return gt_cuda_add_parts(state, num_parts, out);
}

// The ops the CUDA backend implements, one line each (add a line above the end marker): X(op)
// for an op of ops.h's GT_OP_LIST, defined as gt_cuda_<op> (type gt_op_<op>_fn) in a
// cuda/ops_*.cu file. ops_table.cu builds the table from this list; the ops not listed are NULL.
#define GT_CUDA_OP_LIST(X)       \
    X(gemm_workspace_bytes)      \
    X(gemm)                      \
    X(bias_add)                  \
    X(bias_backward)             \
    X(activation_forward)        \
    X(activation_backward)       \
    X(dropout_forward)           \
    X(dropout_backward)          \
    X(add)                       \
    X(layernorm_forward)         \
    X(layernorm_backward)        \
    X(embedding_forward)         \
    X(embedding_backward)        \
    X(softmax_xent)              \
    X(softmax_xent_rdrop)        \
    X(mse)                       \
    X(sum_squares)               \
    X(cast)                      \
    X(copy)                      \
    X(zero)                      \
    X(attention_workspace_bytes) \
    X(attention_forward)         \
    X(attention_backward)        \
    X(mask_lengths)              \
    X(pool_forward)              \
    X(pool_backward)             \
    X(batchnorm_forward)         \
    X(batchnorm_backward)        \
    X(pool2d_workspace_bytes)    \
    X(pool2d_forward)            \
    X(pool2d_backward)           \
    X(conv2d_workspace_bytes)    \
    X(conv2d_forward)            \
    X(conv2d_backward)           \
    X(rmsnorm_forward)           \
    X(rmsnorm_backward)          \
    X(rope_forward)              \
    X(rope_backward)             \
    X(glu_forward)               \
    X(glu_backward)              \
    X(key_starts)                \
    X(scale)                     \
    X(copy_2d)                   \
    X(disentangled_workspace_bytes) \
    X(disentangled_forward)      \
    X(disentangled_backward)     \
    X(xent_count)                \
    X(softmax_xent_counted)      \
    X(quantize_blockwise)        \
    X(dequantize_blockwise)      \
    X(dora_norm)                 \
    X(dora_combine)              \
    X(col_scale)                 \
    X(dora_magnitude_backward)   \
    X(quantized_embedding_forward) \
    /* end of the list */

#define GT_CUDA_DECLARE(op) gt_op_##op##_fn gt_cuda_##op;
GT_CUDA_OP_LIST(GT_CUDA_DECLARE)
#undef GT_CUDA_DECLARE

#endif
