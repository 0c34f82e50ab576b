/* CPU bias: out[r, c] += bias[c] (parallel over row blocks) and its gradient
 * dbias[c] (+)= sum_r dout[r, c] (parallel over column blocks; each column is summed in double
 * over rows 0..rows-1 in order, so the result does not depend on the thread count). */
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

enum { GT_BIAS_COLS = 128 };  /* columns per block of the gradient's column sums */

GT_INLINE void bias_add_body(void *out, const float *bias, size_t row_begin, size_t row_end,
                             size_t cols, gt_dtype dt) {
    for (size_t r = row_begin; r < row_end; r++)
        for (size_t c = 0; c < cols; c++) {
            size_t i = r * cols + c;
            gt_cpu_store(out, i, gt_cpu_load(out, i, dt) + bias[c], dt);
        }
}
/* f16 rows through f32 stage buffers. */
GT_INLINE void bias_add_f16(void *out, const float *bias, size_t row_begin, size_t row_end,
                            size_t cols) {
    float buf[GT_STAGE];
    for (size_t r = row_begin; r < row_end; r++)
        for (size_t c = 0; c < cols; c += GT_STAGE) {
            size_t len = gt_stage_len(c, cols);
            gt_cpu_widen_f16(buf, out, r * cols + c, len);
            bias_add_body(buf, bias + c, 0, 1, len, GT_F32);
            gt_cpu_narrow_f16(out, r * cols + c, buf, len);
        }
}
GT_CPU_KERNEL_STAGED(bias_add, (void *out, const float *bias, size_t row_begin, size_t row_end,
                                size_t cols, gt_dtype dt), out, bias, row_begin, row_end, cols)

gt_status gt_cpu_bias_add(gt_backend *be, void *out, const float *bias, int64_t rows,
                          int64_t cols, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (rows == 0 || cols == 0)
        return GT_OK;
    __typeof__(&bias_add_scalar) kernel = GT_CPU_RUN(bias_add);
    size_t block = GT_CPU_CHUNK / (size_t)cols + 1;  /* rows per block */
    size_t blocks = ((size_t)rows + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * block < (size_t)rows ? (b + 1) * block : (size_t)rows;
        kernel(out, bias, b * block, end, (size_t)cols, dt);
    }
    return GT_OK;
}

/* Column sums of dout[:, col_begin:col_end] into dbias, in row order. */
GT_INLINE void bias_backward_body(float *dbias, const void *dout, size_t rows, size_t cols,
                                  size_t col_begin, size_t col_end, int accumulate,
                                  gt_dtype dt) {
    double sums[GT_BIAS_COLS] = {0};
    size_t width = col_end - col_begin;
    for (size_t r = 0; r < rows; r++) {
        size_t row = r * cols + col_begin;
        for (size_t c = 0; c < width; c++)
            sums[c] += (double)gt_cpu_load(dout, row + c, dt);
    }
    for (size_t c = 0; c < width; c++) {
        float sum = (float)sums[c];
        dbias[col_begin + c] = accumulate ? dbias[col_begin + c] + sum : sum;
    }
}
GT_CPU_KERNEL(bias_backward, (float *dbias, const void *dout, size_t rows, size_t cols,
                              size_t col_begin, size_t col_end, int accumulate, gt_dtype dt),
              dbias, dout, rows, cols, col_begin, col_end, accumulate)

gt_status gt_cpu_bias_backward(gt_backend *be, float *dbias, const void *dout, int64_t rows,
                               int64_t cols, gt_dtype dt, int accumulate) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    __typeof__(&bias_backward_scalar) kernel = GT_CPU_RUN(bias_backward);
    size_t blocks = ((size_t)cols + GT_BIAS_COLS - 1) / GT_BIAS_COLS;
#pragma omp parallel for schedule(static) if (blocks > 1 && rows * cols > GT_CPU_CHUNK)
    for (size_t b = 0; b < blocks; b++) {
        size_t begin = b * GT_BIAS_COLS;
        size_t end = begin + GT_BIAS_COLS < (size_t)cols ? begin + GT_BIAS_COLS : (size_t)cols;
        kernel(dbias, dout, (size_t)rows, (size_t)cols, begin, end, accumulate, dt);
    }
    return GT_OK;
}
