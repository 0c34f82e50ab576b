/* The element math of DoRA's ops (ops.h: dora_norm, dora_combine, col_scale,
 * dora_magnitude_backward), shared by the CPU ops (cpu_dora.c) and the CUDA kernels
 * (cuda/ops_dora.cu), so the CPU tests cover the arithmetic the GPU runs (DESIGN.md principle 3).
 * Every value is f32 until its one store in dt; sums run in a fixed order (columns of a row for
 * the norm, rows of a column for the magnitude's gradient), one thread per row or column. */
#ifndef GT_DORA_HD_H
#define GT_DORA_HD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/elem_hd.h"

/* Row r of dora_norm: norm[r] = sqrt(sum_c w[r, c]^2), scale[r] = magnitude[r] / norm[r]. */
GT_HD_INLINE void gt_dora_norm_row(float *scale, float *norm, const float *w, const float *magnitude, size_t r,
                                   size_t cols) {
    float sum = 0.0f;
    for (size_t c = 0; c < cols; c++) {
        float x = w[r * cols + c];
        sum += x * x;
    }
    float n = sqrtf(sum);
    norm[r] = n;
    scale[r] = magnitude[r] / n;
}

/* Element e = r * cols + c of dora_combine: out + ((g - 1) u + (g v) scaling), g = scale[c]. */
GT_HD_INLINE void gt_dora_combine_element(void *out, const void *u, const void *v, const float *scale,
                                          float scaling, size_t e, size_t cols, gt_dtype dt) {
    float g = scale[e % cols];
    float extra = (g - 1.0f) * gt_hd_load(u, e, dt) + (g * gt_hd_load(v, e, dt)) * scaling;
    gt_hd_store(out, e, gt_hd_load(out, e, dt) + extra, dt);
}

/* Element e of col_scale: in * (scale[c] + offset). */
GT_HD_INLINE void gt_col_scale_element(void *out, const void *in, const float *scale, float offset, size_t e,
                                       size_t cols, gt_dtype dt) {
    gt_hd_store(out, e, gt_hd_load(in, e, dt) * (scale[e % cols] + offset), dt);
}

/* Column c of dora_magnitude_backward: (sum_r dout (u + v scaling)) / norm[c], added or written. */
GT_HD_INLINE void gt_dora_magnitude_column(float *dmagnitude, const void *dout, const void *u, const void *v,
                                           const float *norm, float scaling, size_t c, size_t rows, size_t cols,
                                           gt_dtype dt, int accumulate) {
    float sum = 0.0f;
    for (size_t r = 0; r < rows; r++) {
        size_t e = r * cols + c;
        sum += gt_hd_load(dout, e, dt) * (gt_hd_load(u, e, dt) + gt_hd_load(v, e, dt) * scaling);
    }
    float d = sum / norm[c];
    dmagnitude[c] = accumulate ? dmagnitude[c] + d : d;
}

#endif
