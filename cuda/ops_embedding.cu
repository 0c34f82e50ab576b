// CUDA embedding: out[i, :] = table[ids[i], :] (the table f32, f16 or bf16, or quantized blockwise
// and dequantized row by row with the CPU's element math, ops/quant_hd.h; rounded to dt) and the
// scatter-add gradient
// dtable[ids[i], :] (+)= dout[i, :]. The ids are checked on the device first, without waiting: the
// first id outside [0, num) goes to the backend's error slot (GT_ERR_INDEX naming it, as on the CPU,
// at the stream's next wait) and the op's kernels then skip their work.
//
// The backward adds without atomics and in the CPU's order: every element of dtable receives its
// contributions in increasing i, so the result is bit-identical to the CPU backend's and the
// same on every run. A block owns a tile of columns and one partition of the table rows
// (id % partitions); it walks all ids in order (staged through shared memory, the branch is
// uniform across the block) and adds the rows of its partition.
#include "ops/quant_hd.h"
#include "ops_kernels.cuh"

namespace {

constexpr unsigned kEmbCols = 128;     // columns (threads) per block of the backward
constexpr unsigned kIdTile = 1024;     // ids staged in shared memory at a time
constexpr unsigned kPartitions = 128;  // table-row partitions of the backward grid, at most

template <gt_dtype DT>
__global__ void embedding_forward_kernel(void *out, const int64_t *ids, const void *table, gt_dtype table_dt,
                                         size_t n, size_t dim, const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    GT_GRID_STRIDE(i, n * dim) {
        size_t row = i / dim, c = i % dim, at = (size_t)ids[row] * dim + c;
        float value = table_dt == GT_F32   ? static_cast<const float *>(table)[at]
                      : table_dt == GT_F16 ? load_elem<GT_F16>(table, at)
                                           : load_elem<GT_BF16>(table, at);
        store_elem<DT>(out, i, value);
    }
}

template <gt_dtype DT>
__global__ void quantized_embedding_forward_kernel(void *out, const int64_t *ids, const uint8_t *codes,
                                                   const float *absmax, const float *code, size_t n, size_t dim,
                                                   size_t blocksize, int bits, const unsigned long long *first_bad) {
    if (gt_check_failed(first_bad))
        return;
    GT_GRID_STRIDE(i, n * dim) {
        size_t at = (size_t)ids[i / dim] * dim + i % dim;  // the element in the flattened table
        gt_quant_decode_store(out, i, code, gt_quant_code_at(codes, at, bits), absmax[at / blocksize], DT);
    }
}

template <gt_dtype DT>
__global__ void embedding_backward_kernel(float *dtable, const void *dout, const int64_t *ids, size_t n, size_t dim,
                                          unsigned partitions, const unsigned long long *first_bad) {
    __shared__ int64_t tile[kIdTile];
    if (gt_check_failed(first_bad))
        return;
    const size_t c = (size_t)blockIdx.x * kEmbCols + threadIdx.x;
    const unsigned part = blockIdx.y;
    for (size_t base = 0; base < n; base += kIdTile) {
        const size_t len = n - base < kIdTile ? n - base : kIdTile;
        __syncthreads();  // the previous tile has been consumed by every thread
        for (size_t j = threadIdx.x; j < len; j += kEmbCols)
            tile[j] = ids[base + j];
        __syncthreads();
        if (c >= dim)
            continue;
        for (size_t j = 0; j < len; j++) {
            const int64_t id = tile[j];
            if ((uint64_t)id % partitions != part)
                continue;
            float *dst = dtable + (size_t)id * dim + c;
            *dst = __fadd_rn(*dst, load_elem<DT>(dout, (base + j) * dim + c));
        }
    }
}

gt_status check_embedding(const gt_cuda_backend_state *state, const int64_t *ids, int64_t n, int64_t num,
                          int64_t dim, gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_size(num, "num"));
    GT_TRY(gt_op_check_size(dim, "dim"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (n > 0)
        GT_TRY(gt_op_check_ptr(ids, "ids"));
    gt_cuda_op_error error = {GT_CUDA_CHECK_IDS, 0, 0, num, 0};
    return gt_cuda_check_entries(state, ids, (size_t)n, error);
}

}  // namespace

gt_status gt_cuda_embedding_forward(gt_backend *be, void *out, const int64_t *ids, const void *table,
                                    gt_dtype table_dt, int64_t n, int64_t num, int64_t dim, gt_dtype dt) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    GT_TRY(gt_op_check_dtype(table_dt, "table_dt"));
    GT_TRY(check_embedding(state, ids, n, num, dim, dt));
    if (n == 0 || dim == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(table, "table"));
    GT_LAUNCH_DT(dt, embedding_forward_kernel, grid_for((size_t)n * (size_t)dim), kThreads, 0, stream_of(state),
                 out, ids, table, table_dt, (size_t)n, (size_t)dim, scratch_words(state));
    return gt_cuda_check_launch("embedding_forward_kernel launch");
}

gt_status gt_cuda_quantized_embedding_forward(gt_backend *be, void *out, const int64_t *ids, const uint8_t *codes,
                                              const float *absmax, const float *code, int64_t n, int64_t num,
                                              int64_t dim, int64_t blocksize, int bits, gt_dtype dt) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (bits != 4 && bits != 8)
        return GT_FAIL(GT_ERR_VALUE, "bits: must be 4 or 8, got %d", bits);
    if (blocksize <= 0 || (bits == 4 && blocksize % 2) || dim % blocksize)
        return GT_FAIL(GT_ERR_VALUE, "blocksize: %lld must be > 0 (even with 4 bits) and divide dim %lld",
                       (long long)blocksize, (long long)dim);
    GT_TRY(check_embedding(state, ids, n, num, dim, dt));
    if (n == 0 || dim == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(codes, "codes"));
    GT_TRY(gt_op_check_ptr(absmax, "absmax"));
    GT_LAUNCH_DT(dt, quantized_embedding_forward_kernel, grid_for((size_t)n * (size_t)dim), kThreads, 0,
                 stream_of(state), out, ids, codes, absmax, code, (size_t)n, (size_t)dim, (size_t)blocksize, bits,
                 scratch_words(state));
    return gt_cuda_check_launch("quantized_embedding_forward_kernel launch");
}

// accumulate == 0 writes the gradient: dtable is zeroed first (rows no id names get 0).
gt_status gt_cuda_embedding_backward(gt_backend *be, float *dtable, const void *dout, const int64_t *ids, int64_t n,
                                     int64_t num, int64_t dim, gt_dtype dt, int accumulate) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    GT_TRY(check_embedding(state, ids, n, num, dim, dt));
    if (num > 0 && dim > 0)
        GT_TRY(gt_op_check_ptr(dtable, "dtable"));
    cudaStream_t stream = stream_of(state);
    if (!accumulate && num > 0 && dim > 0)
        GT_CUDA_TRY(cudaMemsetAsync(dtable, 0, (size_t)num * (size_t)dim * sizeof(float), stream), "cudaMemsetAsync");
    if (n == 0 || dim == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dout, "dout"));
    unsigned partitions = num < (int64_t)kPartitions ? (unsigned)num : kPartitions;
    dim3 grid((unsigned)(((size_t)dim + kEmbCols - 1) / kEmbCols), partitions);
    GT_LAUNCH_DT(dt, embedding_backward_kernel, grid, kEmbCols, 0, stream, dtable, dout, ids, (size_t)n,
                 (size_t)dim, partitions, scratch_words(state));
    return gt_cuda_check_launch("embedding_backward_kernel launch");
}
