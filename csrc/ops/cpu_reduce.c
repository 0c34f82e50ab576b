/* CPU reductions with results independent of the thread count and SIMD level: the n elements
 * are split into at most GT_SUM_PARTS parts whose size depends on n only; each part is summed
 * in double with GT_LANE_SUM (in parallel), and the part sums are added in part order.
 *   sum_squares: sum_i x_i^2
 *   mse:         loss = sum_i (pred_i - target_i)^2 / n,
 *                dpred_i = (pred_i - target_i) * (2 dloss_scale / n)   (the factor rounded to f32) */
#include "core/loss_mean.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

enum { GT_SUM_PARTS = 1024 };  /* most parts of a fixed-order sum (their sums live on the stack) */

/* Elements per part for n elements: at least GT_CPU_CHUNK, a multiple of GT_LANES. */
static size_t part_size(size_t n) {
    size_t size = (n + GT_SUM_PARTS - 1) / GT_SUM_PARTS;
    size = size < GT_CPU_CHUNK ? GT_CPU_CHUNK : size;
    return (size + GT_LANES - 1) / GT_LANES * GT_LANES;
}

/* The part sums added in order. */
static double add_parts(const double *parts, size_t count) {
    double total = 0.0;
    for (size_t p = 0; p < count; p++)
        total += parts[p];
    return total;
}

GT_INLINE void squares_body(double *part, const float *x, size_t begin, size_t end, gt_dtype dt) {
    GT_LANE_SUM(*part, begin, end, (double)x[k] * (double)x[k]);
}
GT_CPU_KERNEL(squares, (double *part, const float *x, size_t begin, size_t end, gt_dtype dt),
              part, x, begin, end)

gt_status gt_cpu_sum_squares(gt_backend *be, double *out, const float *x, int64_t n) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_ptr(out, "out"));
    __typeof__(&squares_scalar) kernel = GT_CPU_RUN(squares);
    double parts[GT_SUM_PARTS];
    size_t count = (size_t)n, size = part_size(count), num_parts = (count + size - 1) / size;
#pragma omp parallel for schedule(static) if (num_parts > 1)
    for (size_t p = 0; p < num_parts; p++) {
        size_t end = count - p * size < size ? count : (p + 1) * size;
        kernel(&parts[p], x, p * size, end, GT_F32);
    }
    *out = add_parts(parts, num_parts);
    return GT_OK;
}

/* Squared error of [begin, end) into *part; writes dpred there when non-NULL. */
GT_INLINE void mse_body(double *part, void *dpred, const void *pred, const float *target,
                        float grad_factor, size_t begin, size_t end, gt_dtype dt) {
    GT_LANE_SUM(*part, begin, end,
                (double)(gt_cpu_load(pred, k, dt) - target[k]) *
                    (double)(gt_cpu_load(pred, k, dt) - target[k]));
    if (dpred)
        for (size_t i = begin; i < end; i++)
            gt_cpu_store(dpred, i, (gt_cpu_load(pred, i, dt) - target[i]) * grad_factor, dt);
}
GT_CPU_KERNEL(mse, (double *part, void *dpred, const void *pred, const float *target,
                    float grad_factor, size_t begin, size_t end, gt_dtype dt),
              part, dpred, pred, target, grad_factor, begin, end)

gt_status gt_cpu_mse(gt_backend *be, float *loss, void *dpred, const void *pred,
                     const float *target, int64_t n, const float *loss_scale, float dloss_divisor,
                     gt_dtype dt) {
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    GT_TRY(gt_op_check_ptr(loss, "loss"));
    if (n < 1)
        return GT_FAIL(GT_ERR_VALUE, "n: the mean squared error needs n >= 1, got %lld",
                       (long long)n);
    __typeof__(&mse_scalar) kernel = GT_CPU_RUN(mse);
    float grad_factor = gt_mse_grad_factor(gt_dloss_scale(loss_scale, dloss_divisor), n);
    double parts[GT_SUM_PARTS];
    size_t count = (size_t)n, size = part_size(count), num_parts = (count + size - 1) / size;
#pragma omp parallel for schedule(static) if (num_parts > 1)
    for (size_t p = 0; p < num_parts; p++) {
        size_t end = count - p * size < size ? count : (p + 1) * size;
        kernel(&parts[p], dpred, pred, target, grad_factor, p * size, end, dt);
    }
    *loss = (float)(add_parts(parts, num_parts) / (double)n);
    return GT_OK;
}
