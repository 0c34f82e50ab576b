/* CPU DoRA ops (ops.h: dora_norm, dora_combine, col_scale, dora_magnitude_backward): the element
 * math of ops/dora_hd.h, the code the CUDA kernels run; rows (or columns) in parallel, each one's
 * sum in a fixed order, so any thread count gives the same bits. */
#include "ops/checks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/dora_hd.h"

gt_status gt_cpu_dora_norm(gt_backend *be, float *scale, float *norm, const float *w, const float *magnitude,
                           int64_t rows, int64_t cols) {
    GT_TRY(gt_dora_norm_check(scale, norm, w, magnitude, rows, cols));
#pragma omp parallel for schedule(static) if (rows * cols > GT_CPU_CHUNK)
    for (int64_t r = 0; r < rows; r++)
        gt_dora_norm_row(scale, norm, w, magnitude, (size_t)r, (size_t)cols);
    return GT_OK;
}

gt_status gt_cpu_dora_combine(gt_backend *be, void *out, const void *u, const void *v, const float *scale,
                              float scaling, int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_dora_combine_check(out, u, v, scale, rows, cols, dt));
    size_t n = (size_t)rows * (size_t)cols;
#pragma omp parallel for schedule(static) if (n > GT_CPU_CHUNK)
    for (size_t e = 0; e < n; e++)
        gt_dora_combine_element(out, u, v, scale, scaling, e, (size_t)cols, dt);
    return GT_OK;
}

gt_status gt_cpu_col_scale(gt_backend *be, void *out, const void *in, const float *scale, float offset,
                           int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_col_scale_check(out, in, scale, rows, cols, dt));
    size_t n = (size_t)rows * (size_t)cols;
#pragma omp parallel for schedule(static) if (n > GT_CPU_CHUNK)
    for (size_t e = 0; e < n; e++)
        gt_col_scale_element(out, in, scale, offset, e, (size_t)cols, dt);
    return GT_OK;
}

gt_status gt_cpu_dora_magnitude_backward(gt_backend *be, float *dmagnitude, const void *dout, const void *u,
                                         const void *v, const float *norm, float scaling, int64_t rows,
                                         int64_t cols, gt_dtype dt, int accumulate) {
    GT_TRY(gt_dora_magnitude_backward_check(dmagnitude, dout, u, v, norm, rows, cols, dt));
#pragma omp parallel for schedule(static) if (rows * cols > GT_CPU_CHUNK)
    for (int64_t c = 0; c < cols; c++)
        gt_dora_magnitude_column(dmagnitude, dout, u, v, norm, scaling, (size_t)c, (size_t)rows, (size_t)cols, dt,
                                 accumulate);
    return GT_OK;
}
