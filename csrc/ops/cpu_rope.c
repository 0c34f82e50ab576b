/* CPU rotary position embedding (ops.h, gt_rope_args): the element math of ops/rope_hd.h, the
 * code the CUDA kernels run, over (b, t) rows in parallel. Each column's result depends only on
 * its inputs, so any thread count gives the same bits. Scalar: the cos and sin in double per
 * (b, t, i) dominate, and are shared by the heads of the column. */
#include "ops/cpu_ops.h"
#include "ops/rope.h"
#include "ops/rope_hd.h"

static gt_status rope_run(const gt_rope_args *a, int backward) {
    GT_TRY(gt_rope_check(a));
    size_t rows = (size_t)a->batch * (size_t)a->seq, seq = (size_t)a->seq;
    if (rows == 0 || a->heads == 0)
        return GT_OK;
    size_t columns = gt_rope_columns(a);
#pragma omp parallel for schedule(static) if (rows * columns * (size_t)a->heads > 16384)
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < columns; i++)
            gt_rope_column(a, r / seq, r % seq, i, backward);
    return GT_OK;
}

gt_status gt_cpu_rope_forward(gt_backend *be, const gt_rope_args *args) {
    (void)be;
    return rope_run(args, 0);
}

gt_status gt_cpu_rope_backward(gt_backend *be, const gt_rope_args *args) {
    (void)be;
    return rope_run(args, 1);
}
