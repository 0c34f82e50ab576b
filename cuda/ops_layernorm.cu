// CUDA LayerNorm over the last dim of (rows, cols), the CPU backend's arithmetic (cpu_layernorm.c)
// step for step, so the statistics and din are bit-identical to it:
//   mean = sum(x) / cols, rstd = 1 / sqrt(sum((x - mean)^2) / cols + eps)  (double sums, stored f32)
//   xhat = (x - mean) * rstd, out = xhat * weight + bias                    (f32, rounded to dt)
//   g = dout * weight: din = rstd * (g - mean(g) - xhat * mean(g * xhat))
// The row sums are the CPU's GT_LANE_SUM: 8 lanes (8 threads of a warp, one row per 8 threads,
// 32 rows per block) each adding every 8th term in order, folded pairwise by shuffles.
// dweight (+)= sum_r dout * xhat and dbias (+)= sum_r dout: one thread per (column, row lane),
// 16 row lanes adding every 16th row in order, folded pairwise in shared memory: a fixed order
// without atomics (the same bits on every run; the CPU adds the rows in one sequence, so the two
// may differ in the last bit of the f32 result when the double sums round differently).
#include "ops_kernels.cuh"

namespace {

constexpr unsigned kParamCols = 32;   // columns per block of the parameter-gradient kernel
constexpr unsigned kParamLanes = 16;  // row lanes per column of that kernel

// The group's (8 threads of one row) total of a folded lane sum, in every lane of the group.
__device__ __forceinline__ double group_total(double lane_sum, unsigned lane) {
    return __shfl_sync(0xffffffffu, fold_lanes(lane_sum, lane), 0, kLanes);
}

template <gt_dtype DT>
__global__ void layernorm_forward_kernel(void *out, float *mean, float *rstd, const void *in, const float *weight,
                                         const float *bias, size_t rows, size_t cols, float eps) {
    const unsigned lane = threadIdx.x % kLanes;
    const size_t groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    for (size_t group = blockIdx.x; group < groups; group += gridDim.x) {
        const size_t r = group * kRowsPerBlock + threadIdx.x / kLanes;
        const bool valid = r < rows;
        const size_t row = valid ? r * cols : 0, width = valid ? cols : 0;
        double sum = lane_partial(0, width, lane, [&](size_t k) { return (double)load_elem<DT>(in, row + k); });
        const double mu = __ddiv_rn(group_total(sum, lane), (double)cols);
        double squares = lane_partial(0, width, lane, [&](size_t k) {
            double d = __dsub_rn((double)load_elem<DT>(in, row + k), mu);
            return __dmul_rn(d, d);
        });
        squares = group_total(squares, lane);
        const float m = __double2float_rn(mu);
        const float s = __double2float_rn(
            __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(squares, (double)cols), (double)eps))));
        for (size_t c = lane; c < width; c += kLanes) {
            float xhat = __fmul_rn(__fsub_rn(load_elem<DT>(in, row + c), m), s);
            float scaled = __fmul_rn(xhat, weight[c]);
            store_elem<DT>(out, row + c, bias ? __fadd_rn(scaled, bias[c]) : scaled);
        }
        if (valid && lane == 0) {
            mean[r] = m;
            rstd[r] = s;
        }
    }
}

// din rows; each row of dout is read completely before its din row is written (din may alias it).
template <gt_dtype DT>
__global__ void layernorm_din_kernel(void *din, const void *dout, const void *in, const float *weight,
                                     const float *mean, const float *rstd, size_t rows, size_t cols) {
    const unsigned lane = threadIdx.x % kLanes;
    const size_t groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    for (size_t group = blockIdx.x; group < groups; group += gridDim.x) {
        const size_t r = group * kRowsPerBlock + threadIdx.x / kLanes;
        const bool valid = r < rows;
        const size_t row = valid ? r * cols : 0, width = valid ? cols : 0;
        const float m = valid ? mean[r] : 0.0f, s = valid ? rstd[r] : 0.0f;
        double sum_g = lane_partial(0, width, lane, [&](size_t k) {
            return (double)__fmul_rn(load_elem<DT>(dout, row + k), weight[k]);
        });
        double sum_gx = lane_partial(0, width, lane, [&](size_t k) {
            float g = __fmul_rn(load_elem<DT>(dout, row + k), weight[k]);
            float xhat = __fmul_rn(__fsub_rn(load_elem<DT>(in, row + k), m), s);
            return __dmul_rn((double)g, (double)xhat);
        });
        const float mean_g = __double2float_rn(__ddiv_rn(group_total(sum_g, lane), (double)cols));
        const float mean_gx = __double2float_rn(__ddiv_rn(group_total(sum_gx, lane), (double)cols));
        for (size_t c = lane; c < width; c += kLanes) {
            float g = __fmul_rn(load_elem<DT>(dout, row + c), weight[c]);
            float xhat = __fmul_rn(__fsub_rn(load_elem<DT>(in, row + c), m), s);
            store_elem<DT>(din, row + c, __fmul_rn(s, __fsub_rn(__fsub_rn(g, mean_g), __fmul_rn(xhat, mean_gx))));
        }
    }
}

// dweight/dbias for kParamCols columns per block: row lane y adds rows y, y + 16, ... in order,
// then the 16 lanes fold pairwise (l += l + 8, + 4, + 2, + 1).
template <gt_dtype DT>
__global__ void layernorm_dparams_kernel(float *dweight, float *dbias, const void *dout, const void *in,
                                         const float *mean, const float *rstd, size_t rows, size_t cols,
                                         int accumulate) {
    __shared__ double sum_w[kParamLanes][kParamCols];
    __shared__ double sum_b[kParamLanes][kParamCols];
    const unsigned x = threadIdx.x, y = threadIdx.y;
    const size_t c = (size_t)blockIdx.x * kParamCols + x;
    double w = 0.0, b = 0.0;
    if (c < cols) {
        for (size_t r = y; r < rows; r += kParamLanes) {
            float g = load_elem<DT>(dout, r * cols + c);
            float xhat = __fmul_rn(__fsub_rn(load_elem<DT>(in, r * cols + c), mean[r]), rstd[r]);
            w = __dadd_rn(w, (double)__fmul_rn(g, xhat));
            b = __dadd_rn(b, (double)g);
        }
    }
    sum_w[y][x] = w;
    sum_b[y][x] = b;
    __syncthreads();
    for (unsigned width = kParamLanes / 2; width >= 1; width /= 2) {
        if (y < width) {
            sum_w[y][x] = __dadd_rn(sum_w[y][x], sum_w[y + width][x]);
            sum_b[y][x] = __dadd_rn(sum_b[y][x], sum_b[y + width][x]);
        }
        __syncthreads();
    }
    if (y == 0 && c < cols) {
        float dw = __double2float_rn(sum_w[0][x]), db = __double2float_rn(sum_b[0][x]);
        if (dweight)  // NULL: a frozen weight
            dweight[c] = accumulate ? __fadd_rn(dweight[c], dw) : dw;
        if (dbias)
            dbias[c] = accumulate ? __fadd_rn(dbias[c], db) : db;
    }
}

gt_status check_layernorm(const void *in, const float *weight, int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (rows > 0 && cols == 0)
        return GT_FAIL(GT_ERR_VALUE, "cols: LayerNorm needs at least one column");
    if (rows > 0) {
        GT_TRY(gt_op_check_ptr(weight, "weight"));
        GT_TRY(gt_op_check_ptr(in, "in"));
    }
    return GT_OK;
}

}  // namespace

gt_status gt_cuda_layernorm_forward(gt_backend *be, void *out, float *mean, float *rstd, const void *in,
                                    const float *weight, const float *bias, int64_t rows, int64_t cols, float eps,
                                    gt_dtype dt) {
    GT_TRY(check_layernorm(in, weight, rows, cols, dt));
    if (!(eps >= 0.0f))
        return GT_FAIL(GT_ERR_VALUE, "eps: must be >= 0, got %g", (double)eps);
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (rows == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(mean, "mean"));
    GT_TRY(gt_op_check_ptr(rstd, "rstd"));
    GT_LAUNCH_DT(dt, layernorm_forward_kernel, grid_for((size_t)rows, kRowsPerBlock), kThreads, 0, stream_of(state),
                 out, mean, rstd, in, weight, bias, (size_t)rows, (size_t)cols, eps);
    return gt_cuda_check_launch("layernorm_forward_kernel launch");
}

// The weight and bias gradients come first: din may then alias dout, or be NULL (not wanted).
gt_status gt_cuda_layernorm_backward(gt_backend *be, void *din, float *dweight, float *dbias, const void *dout,
                                     const void *in, const float *weight, const float *mean, const float *rstd,
                                     int64_t rows, int64_t cols, gt_dtype dt, int accumulate) {
    GT_TRY(check_layernorm(in, weight, rows, cols, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (cols == 0)
        return GT_OK;
    if (rows > 0) {
        GT_TRY(gt_op_check_ptr(dout, "dout"));
        GT_TRY(gt_op_check_ptr(mean, "mean"));
        GT_TRY(gt_op_check_ptr(rstd, "rstd"));
    }
    cudaStream_t stream = stream_of(state);
    dim3 param_block(kParamCols, kParamLanes);
    unsigned param_grid = (unsigned)(((size_t)cols + kParamCols - 1) / kParamCols);
    if (dweight || dbias) {  // both NULL: frozen weight and bias, din only
        GT_LAUNCH_DT(dt, layernorm_dparams_kernel, param_grid, param_block, 0, stream, dweight, dbias, dout, in,
                     mean, rstd, (size_t)rows, (size_t)cols, accumulate);
        GT_TRY(gt_cuda_check_launch("layernorm_dparams_kernel launch"));
    }
    if (rows == 0 || !din)  // a NULL din (the model's first layer): parameter gradients only
        return GT_OK;
    GT_LAUNCH_DT(dt, layernorm_din_kernel, grid_for((size_t)rows, kRowsPerBlock), kThreads, 0, stream, din, dout,
                 in, weight, mean, rstd, (size_t)rows, (size_t)cols);
    return gt_cuda_check_launch("layernorm_din_kernel launch");
}
