// CUDA reductions and copies: the bias gradient, the sum of squares, dtype casts, byte copies (2-D:
// cudaMemcpy2DAsync) and zero fills.
//   bias_backward: dbias[c] (+)= sum_r dout[r, c]: one thread per (column, row lane), 16 row lanes
//     adding every 16th row in double, in order, folded pairwise in shared memory: a fixed order
//     without atomics (the same bits on every run; the CPU adds the rows in one sequence, so the
//     f32 results may differ from its in the last bit when the double sums round differently).
//   sum_squares: the CPU's order exactly (cpu_reduce.c: fixed parts, GT_LANE_SUM in double, parts
//     added in order), so the result is bit-identical to the CPU's. It waits for the stream.
//   cast: the RNE conversions of core/half.h (bit-identical to gt_cast on the CPU).
#include "ops_kernels.cuh"

namespace {

constexpr unsigned kBiasCols = 32;   // columns per block of bias_backward_kernel
constexpr unsigned kBiasLanes = 16;  // row lanes per column

template <gt_dtype DT>
__global__ void bias_backward_kernel(float *dbias, const void *dout, size_t rows, size_t cols, int accumulate) {
    __shared__ double sums[kBiasLanes][kBiasCols];
    const unsigned x = threadIdx.x, y = threadIdx.y;
    const size_t c = (size_t)blockIdx.x * kBiasCols + x;
    double sum = 0.0;
    if (c < cols)
        for (size_t r = y; r < rows; r += kBiasLanes)
            sum = __dadd_rn(sum, (double)load_elem<DT>(dout, r * cols + c));
    sums[y][x] = sum;
    __syncthreads();
    for (unsigned width = kBiasLanes / 2; width >= 1; width /= 2) {
        if (y < width)
            sums[y][x] = __dadd_rn(sums[y][x], sums[y + width][x]);
        __syncthreads();
    }
    if (y == 0 && c < cols) {
        float total = __double2float_rn(sums[0][x]);
        dbias[c] = accumulate ? __fadd_rn(dbias[c], total) : total;
    }
}

// One term of the sum of squares: (double)x^2 (exact).
struct SquareTerm {
    const float *x;  // (n,)
    __device__ double operator()(size_t k) const {
        double value = (double)x[k];
        return __dmul_rn(value, value);
    }
};

template <gt_dtype SRC, gt_dtype DST>
__global__ void cast_kernel(void *dst, const void *src, size_t n) {
    GT_GRID_STRIDE(i, n) {
        store_elem<DST>(dst, i, load_elem<SRC>(src, i));
    }
}

template <gt_dtype SRC>
void launch_cast(cudaStream_t stream, void *dst, gt_dtype dst_dt, const void *src, size_t n) {
    unsigned grid = grid_for(n);
    switch (dst_dt) {
    case GT_F16: cast_kernel<SRC, GT_F16><<<grid, kThreads, 0, stream>>>(dst, src, n); break;
    case GT_BF16: cast_kernel<SRC, GT_BF16><<<grid, kThreads, 0, stream>>>(dst, src, n); break;
    default: cast_kernel<SRC, GT_F32><<<grid, kThreads, 0, stream>>>(dst, src, n); break;
    }
}

bool castable(gt_dtype dt) { return dt == GT_F32 || dt == GT_F16 || dt == GT_BF16; }

bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    return (uintptr_t)a < (uintptr_t)b + b_bytes && (uintptr_t)b < (uintptr_t)a + a_bytes;
}

}  // namespace

gt_status gt_cuda_bias_backward(gt_backend *be, float *dbias, const void *dout, int64_t rows, int64_t cols,
                                gt_dtype dt, int accumulate) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (cols == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dbias, "dbias"));
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(dout, "dout"));
    dim3 block(kBiasCols, kBiasLanes);
    unsigned grid = (unsigned)(((size_t)cols + kBiasCols - 1) / kBiasCols);
    GT_LAUNCH_DT(dt, bias_backward_kernel, grid, block, 0, stream_of(state), dbias, dout, (size_t)rows, (size_t)cols,
                 accumulate);
    return gt_cuda_check_launch("bias_backward_kernel launch");
}

gt_status gt_cuda_sum_squares(gt_backend *be, double *out, const float *x, int64_t n) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_ptr(out, "out"));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    *out = 0.0;
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(x, "x"));
    return gt_cuda_fixed_order_sum(state, (size_t)n, SquareTerm{x}, out);
}

gt_status gt_cuda_cast(gt_backend *be, void *dst, gt_dtype dst_dt, const void *src, gt_dtype src_dt, int64_t n) {
    GT_TRY(gt_op_check_size(n, "n"));
    if (!castable(src_dt))
        return GT_FAIL(GT_ERR_TYPE, "src_dtype: cast supports f32, f16 and bf16, got '%s'", gt_dtype_name(src_dt));
    if (!castable(dst_dt))
        return GT_FAIL(GT_ERR_TYPE, "dst_dtype: cast supports f32, f16 and bf16, got '%s'", gt_dtype_name(dst_dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0)
        return GT_OK;
    if (!src || !dst)
        return GT_FAIL(GT_ERR_VALUE, "%s: NULL buffer for %lld elements", src ? "dst" : "src", (long long)n);
    size_t count = (size_t)n;
    if (ranges_overlap(src, count * gt_dtype_size(src_dt), dst, count * gt_dtype_size(dst_dt)))
        return GT_FAIL(GT_ERR_VALUE, "dst: overlaps src");
    cudaStream_t stream = stream_of(state);
    if (src_dt == dst_dt) {
        GT_CUDA_TRY(cudaMemcpyAsync(dst, src, count * gt_dtype_size(src_dt), cudaMemcpyDeviceToDevice, stream),
                    "cudaMemcpyAsync");
        return GT_OK;
    }
    switch (src_dt) {
    case GT_F16: launch_cast<GT_F16>(stream, dst, dst_dt, src, count); break;
    case GT_BF16: launch_cast<GT_BF16>(stream, dst, dst_dt, src, count); break;
    default: launch_cast<GT_F32>(stream, dst, dst_dt, src, count); break;
    }
    return gt_cuda_check_launch("cast_kernel launch");
}

gt_status gt_cuda_copy(gt_backend *be, void *dst, const void *src, size_t bytes) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (bytes == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dst, "dst"));
    GT_TRY(gt_op_check_ptr(src, "src"));
    GT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(state)), "cudaMemcpyAsync");
    return GT_OK;
}

gt_status gt_cuda_copy_2d(gt_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                          size_t width, size_t rows) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (width == 0 || rows == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dst, "dst"));
    GT_TRY(gt_op_check_ptr(src, "src"));
    if (dst_pitch < width || src_pitch < width)
        return GT_FAIL(GT_ERR_VALUE, "dst_pitch, src_pitch: must be >= width (%zu), got %zu and %zu", width,
                       dst_pitch, src_pitch);
    GT_CUDA_TRY(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, stream_of(state)),
                "cudaMemcpy2DAsync");
    return GT_OK;
}

gt_status gt_cuda_zero(gt_backend *be, void *dst, size_t bytes) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (bytes == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dst, "dst"));
    GT_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, stream_of(state)), "cudaMemsetAsync");
    return GT_OK;
}
