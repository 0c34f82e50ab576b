// CUDA scaled dot-product attention (ops.h, gt_attention_args): flash-attention-style kernels
// whose per-thread math is ops/attention_hd.h, the GT_HD code a host harness runs in CI
// (tests/test_attention_cuda_math.py), since no GPU checks this file before it ships.
//
// One thread per row, no (T, T) matrix anywhere, no atomics (the same bits on every run):
//   forward   attention_forward_kernel: query row i streams over key tiles with an online
//             softmax in f32, writes out_i and the f32 lse_i;
//   backward  attention_delta_kernel: D_i = dout_i . out_i into the workspace, then
//             attention_dkdv_kernel (one thread per (b, kv head, key row j): dk_j, dv_j, summing
//             its group's query heads in increasing order; k and v never expanded) and
//             attention_dq_kernel (one thread per query row i: dq_i), each recomputing the
//             probabilities it needs from q, k and lse.
// The rows' operations and their order are the CPU op's (cpu_attention.c), and both builds round
// every operation once, so the results are the CPU op's bits. A thread keeps its rows in local
// arrays of up to kMaxHeadDim floats (kernels instantiated for 32, 64, 128 and 256).
//
// key_starts (any int64 is valid) and key_lengths are device pointers like the operands; it is checked on the device without waiting:
// the first entry outside [0, seq] goes to the backend's error slot (named with the CPU's message
// at the stream's next wait) and the op's kernels skip their work.
#include "ops/attention_hd.h"
#include "ops_kernels.cuh"

namespace {

constexpr unsigned kAttnThreads = 128;  // threads (rows) per block
constexpr int64_t kMaxHeadDim = 256;    // largest head_dim of the kernels' local arrays

template <int MAXD>
__global__ void attention_forward_kernel(gt_attention_args a, size_t rows, const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    float q[MAXD], o[MAXD], s[GT_ATTN_K_TILE];
    GT_GRID_STRIDE(u, rows) gt_attn_forward_row(&a, u, q, o, s);
}

__global__ void attention_delta_kernel(gt_attention_args a, float *delta, size_t rows,
                                       const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    GT_GRID_STRIDE(u, rows) gt_attn_delta_row(&a, u, delta);
}

template <int MAXD>
__global__ void attention_dkdv_kernel(gt_attention_args a, const float *delta, size_t rows,
                                      const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    float k[MAXD], v[MAXD], dk[MAXD], dv[MAXD], pt[GT_ATTN_Q_TILE], dst[GT_ATTN_Q_TILE];
    GT_GRID_STRIDE(u, rows) gt_attn_dkdv_row(&a, u, delta, k, v, dk, dv, pt, dst);
}

template <int MAXD>
__global__ void attention_dq_kernel(gt_attention_args a, const float *delta, size_t rows,
                                    const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    float q[MAXD], dout[MAXD], dq[MAXD], ds[GT_ATTN_K_TILE];
    GT_GRID_STRIDE(u, rows) gt_attn_dq_row(&a, u, delta, q, dout, dq, ds);
}

// Launches KERNEL<MAXD> with the smallest MAXD >= dim over `rows` rows.
#define GT_ATTN_LAUNCH(KERNEL, dim, rows, stream, ...)                                              \
    do {                                                                                          \
        unsigned grid = grid_for((rows), kAttnThreads);                                           \
        if ((dim) <= 32)                                                                          \
            KERNEL<32><<<grid, kAttnThreads, 0, (stream)>>>(__VA_ARGS__);                         \
        else if ((dim) <= 64)                                                                     \
            KERNEL<64><<<grid, kAttnThreads, 0, (stream)>>>(__VA_ARGS__);                         \
        else if ((dim) <= 128)                                                                    \
            KERNEL<128><<<grid, kAttnThreads, 0, (stream)>>>(__VA_ARGS__);                        \
        else                                                                                      \
            KERNEL<kMaxHeadDim><<<grid, kAttnThreads, 0, (stream)>>>(__VA_ARGS__);                \
    } while (0)

// The shared checks (ops/checks.h) with the head_dim limit of the local arrays, and the rows.
gt_status check_args(const gt_attention_args *a, int backward, size_t *rows) {
    GT_TRY(gt_attention_check(a, backward, kMaxHeadDim));
    *rows = 0;
    if (a->batch == 0 || a->heads == 0 || a->seq == 0)
        return GT_OK;
    if (__builtin_mul_overflow((size_t)a->batch, (size_t)a->heads, rows) ||
        __builtin_mul_overflow(*rows, (size_t)a->seq, rows))
        return GT_FAIL(GT_ERR_VALUE, "batch * heads * seq: overflows");
    return GT_OK;
}

// The state of `be` after the checks, with the device check of key_lengths queued; *rows = 0:
// nothing to do; *first_bad = the check's result for the kernels (NULL without key_lengths).
gt_status attention_begin(gt_backend *be, const gt_attention_args *a, int backward, gt_cuda_backend_state **state,
                          size_t *rows, const unsigned long long **first_bad) {
    GT_TRY(check_args(a, backward, rows));
    GT_TRY(gt_cuda_op_begin(be, state));
    *first_bad = NULL;
    if (*rows == 0 || !a->key_lengths)
        return GT_OK;
    gt_cuda_op_error error = {GT_CUDA_CHECK_KEY_LENGTHS, 0, 0, a->seq, 0};
    GT_TRY(gt_cuda_check_entries(*state, a->key_lengths, (size_t)a->batch, error));
    *first_bad = scratch_words(*state);
    return GT_OK;
}

}  // namespace

// The backward's D_i: batch * heads * seq floats (the forward needs none).
size_t gt_cuda_attention_workspace_bytes(const gt_attention_args *args, int threads) {
    (void)threads;
    size_t rows = 0, bytes = 0;
    if (args->batch <= 0 || args->heads <= 0 || args->seq <= 0)
        return 0;
    if (__builtin_mul_overflow((size_t)args->batch, (size_t)args->heads, &rows) ||
        __builtin_mul_overflow(rows, (size_t)args->seq, &rows) || __builtin_mul_overflow(rows, sizeof(float), &bytes))
        return SIZE_MAX;
    return bytes;
}

gt_status gt_cuda_attention_forward(gt_backend *be, const gt_attention_args *args) {
    gt_cuda_backend_state *state = NULL;
    const unsigned long long *first_bad = NULL;
    size_t rows = 0;
    GT_TRY(attention_begin(be, args, 0, &state, &rows, &first_bad));
    if (rows == 0)
        return GT_OK;
    GT_ATTN_LAUNCH(attention_forward_kernel, args->head_dim, rows, stream_of(state), *args, rows, first_bad);
    return gt_cuda_check_launch("attention_forward_kernel launch");
}

gt_status gt_cuda_attention_backward(gt_backend *be, const gt_attention_args *args) {
    gt_cuda_backend_state *state = NULL;
    const unsigned long long *first_bad = NULL;
    size_t rows = 0;
    GT_TRY(attention_begin(be, args, 1, &state, &rows, &first_bad));
    if (rows == 0)
        return GT_OK;
    size_t need = gt_cuda_attention_workspace_bytes(args, 1);
    if (!be->workspace || be->workspace_bytes < need)
        return GT_FAIL(GT_ERR_VALUE, "workspace: attention (batch %lld, heads %lld, seq %lld) needs %zu bytes, "
                       "got %zu", (long long)args->batch, (long long)args->heads, (long long)args->seq, need,
                       be->workspace ? be->workspace_bytes : (size_t)0);
    float *delta = static_cast<float *>(be->workspace);
    cudaStream_t stream = stream_of(state);
    attention_delta_kernel<<<grid_for(rows, kAttnThreads), kAttnThreads, 0, stream>>>(*args, delta, rows,
                                                                                     first_bad);
    GT_TRY(gt_cuda_check_launch("attention_delta_kernel launch"));
    size_t kv_rows = rows / (size_t)args->heads * (size_t)args->kv_heads;  // (b, kv head, key) rows
    GT_ATTN_LAUNCH(attention_dkdv_kernel, args->head_dim, kv_rows, stream, *args, delta, kv_rows, first_bad);
    GT_TRY(gt_cuda_check_launch("attention_dkdv_kernel launch"));
    GT_ATTN_LAUNCH(attention_dq_kernel, args->head_dim, rows, stream, *args, delta, rows, first_bad);
    return gt_cuda_check_launch("attention_dq_kernel launch");
}
