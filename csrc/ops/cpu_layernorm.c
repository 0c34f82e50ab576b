/* CPU LayerNorm over the last dim of (rows, cols), with f32 statistics computed in double by
 * two passes (mean, then mean of squared deviations) with fixed-order sums (GT_LANE_SUM):
 *   mean = sum(x) / cols, rstd = 1 / sqrt(sum((x - mean)^2) / cols + eps)   (stored as f32)
 *   xhat = (x - mean) * rstd, out = xhat * weight + bias                      (f32, rounded to dt)
 * Backward, with g = dout * weight:
 *   din = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dweight (+)= sum_r dout * xhat, dbias (+)= sum_r dout  (column blocks, rows in order)
 * Rows run in parallel; every sum has a fixed order, so any thread count gives the same bits. */
#include <math.h>

#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

enum { GT_LN_COLS = 128 };  /* columns per block of the weight/bias gradient sums */

GT_INLINE void ln_forward_body(void *out, float *mean, float *rstd, const void *in,
                               const float *weight, const float *bias, size_t row_begin,
                               size_t row_end, size_t cols, float eps, gt_dtype dt) {
    for (size_t r = row_begin; r < row_end; r++) {
        size_t row = r * cols;
        double sum, squares;
        GT_LANE_SUM(sum, 0, cols, (double)gt_cpu_load(in, row + k, dt));
        double mu = sum / (double)cols;
        GT_LANE_SUM(squares, 0, cols, ((double)gt_cpu_load(in, row + k, dt) - mu) *
                                          ((double)gt_cpu_load(in, row + k, dt) - mu));
        float m = (float)mu;
        float s = (float)(1.0 / sqrt(squares / (double)cols + (double)eps));
        for (size_t c = 0; c < cols; c++) {
            float xhat = (gt_cpu_load(in, row + c, dt) - m) * s;
            float scaled = xhat * weight[c];
            gt_cpu_store(out, row + c, bias ? scaled + bias[c] : scaled, dt);
        }
        mean[r] = m;
        rstd[r] = s;
    }
}
GT_CPU_KERNEL(ln_forward, (void *out, float *mean, float *rstd, const void *in,
                           const float *weight, const float *bias, size_t row_begin,
                           size_t row_end, size_t cols, float eps, gt_dtype dt),
              out, mean, rstd, in, weight, bias, row_begin, row_end, cols, eps)

static gt_status check_layernorm(const void *in, const float *weight, int64_t rows,
                                 int64_t cols, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (rows > 0 && cols == 0)
        return GT_FAIL(GT_ERR_VALUE, "cols: LayerNorm needs at least one column");
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(weight, "weight"));
    return GT_OK;
}

/* Rows per parallel block for rows of `cols` elements. */
static size_t ln_block_rows(int64_t cols) { return GT_CPU_CHUNK / (size_t)cols + 1; }

gt_status gt_cpu_layernorm_forward(gt_backend *be, void *out, float *mean, float *rstd,
                                   const void *in, const float *weight, const float *bias,
                                   int64_t rows, int64_t cols, float eps, gt_dtype dt) {
    GT_TRY(check_layernorm(in, weight, rows, cols, dt));
    if (!(eps >= 0.0f))
        return GT_FAIL(GT_ERR_VALUE, "eps: must be >= 0, got %g", (double)eps);
    if (rows == 0)
        return GT_OK;
    __typeof__(&ln_forward_scalar) kernel = GT_CPU_RUN(ln_forward);
    size_t block = ln_block_rows(cols), blocks = ((size_t)rows + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * block < (size_t)rows ? (b + 1) * block : (size_t)rows;
        kernel(out, mean, rstd, in, weight, bias, b * block, end, (size_t)cols, eps, dt);
    }
    return GT_OK;
}

GT_INLINE void ln_din_body(void *din, const void *dout, const void *in, const float *weight,
                           const float *mean, const float *rstd, size_t row_begin,
                           size_t row_end, size_t cols, gt_dtype dt) {
    for (size_t r = row_begin; r < row_end; r++) {
        size_t row = r * cols;
        float m = mean[r], s = rstd[r];
        double sum_g, sum_gx;
        GT_LANE_SUM(sum_g, 0, cols, (double)(gt_cpu_load(dout, row + k, dt) * weight[k]));
        GT_LANE_SUM(sum_gx, 0, cols, (double)(gt_cpu_load(dout, row + k, dt) * weight[k]) *
                                         (double)((gt_cpu_load(in, row + k, dt) - m) * s));
        float mean_g = (float)(sum_g / (double)cols), mean_gx = (float)(sum_gx / (double)cols);
        for (size_t c = 0; c < cols; c++) {
            float g = gt_cpu_load(dout, row + c, dt) * weight[c];
            float xhat = (gt_cpu_load(in, row + c, dt) - m) * s;
            gt_cpu_store(din, row + c, s * (g - mean_g - xhat * mean_gx), dt);
        }
    }
}
GT_CPU_KERNEL(ln_din, (void *din, const void *dout, const void *in, const float *weight,
                       const float *mean, const float *rstd, size_t row_begin, size_t row_end,
                       size_t cols, gt_dtype dt),
              din, dout, in, weight, mean, rstd, row_begin, row_end, cols)

/* dweight/dbias for columns [col_begin, col_end): sums over all rows in order, in double. */
GT_INLINE void ln_dparams_body(float *dweight, float *dbias, const void *dout, const void *in,
                               const float *mean, const float *rstd, size_t rows, size_t cols,
                               size_t col_begin, size_t col_end, int accumulate, gt_dtype dt) {
    double sum_w[GT_LN_COLS] = {0}, sum_b[GT_LN_COLS] = {0};
    size_t width = col_end - col_begin;
    for (size_t r = 0; r < rows; r++) {
        size_t row = r * cols + col_begin;
        float m = mean[r], s = rstd[r];
        for (size_t c = 0; c < width; c++) {
            float g = gt_cpu_load(dout, row + c, dt);
            float xhat = (gt_cpu_load(in, row + c, dt) - m) * s;
            sum_w[c] += (double)(g * xhat);
            sum_b[c] += (double)g;
        }
    }
    for (size_t c = 0; c < width; c++) {
        float w = (float)sum_w[c], b = (float)sum_b[c];
        if (dweight)  /* NULL: a frozen weight */
            dweight[col_begin + c] = accumulate ? dweight[col_begin + c] + w : w;
        if (dbias)
            dbias[col_begin + c] = accumulate ? dbias[col_begin + c] + b : b;
    }
}
GT_CPU_KERNEL(ln_dparams, (float *dweight, float *dbias, const void *dout, const void *in,
                           const float *mean, const float *rstd, size_t rows, size_t cols,
                           size_t col_begin, size_t col_end, int accumulate, gt_dtype dt),
              dweight, dbias, dout, in, mean, rstd, rows, cols, col_begin, col_end, accumulate)

/* The weight and bias gradients come first: din may then alias dout (each row of dout is read
 * completely before its din row is written). A NULL din (the model's first layer: no input
 * gradient is wanted) computes the parameter gradients only; a NULL dweight or dbias (a frozen
 * parameter) is not computed. */
gt_status gt_cpu_layernorm_backward(gt_backend *be, void *din, float *dweight, float *dbias,
                                    const void *dout, const void *in, const float *weight,
                                    const float *mean, const float *rstd, int64_t rows,
                                    int64_t cols, gt_dtype dt, int accumulate) {
    GT_TRY(check_layernorm(in, weight, rows, cols, dt));
    __typeof__(&ln_dparams_scalar) dparams = GT_CPU_RUN(ln_dparams);
    size_t col_blocks = dweight || dbias ? ((size_t)cols + GT_LN_COLS - 1) / GT_LN_COLS : 0;  /* 0: both frozen */
#pragma omp parallel for schedule(static) if (col_blocks > 1 && rows * cols > GT_CPU_CHUNK)
    for (size_t b = 0; b < col_blocks; b++) {
        size_t begin = b * GT_LN_COLS;
        size_t end = begin + GT_LN_COLS < (size_t)cols ? begin + GT_LN_COLS : (size_t)cols;
        dparams(dweight, dbias, dout, in, mean, rstd, (size_t)rows, (size_t)cols, begin, end,
                accumulate, dt);
    }
    if (rows == 0 || !din)
        return GT_OK;
    __typeof__(&ln_din_scalar) kernel = GT_CPU_RUN(ln_din);
    size_t block = ln_block_rows(cols), blocks = ((size_t)rows + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * block < (size_t)rows ? (b + 1) * block : (size_t)rows;
        kernel(din, dout, in, weight, mean, rstd, b * block, end, (size_t)cols, dt);
    }
    return GT_OK;
}
