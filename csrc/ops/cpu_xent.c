/* CPU fused softmax + cross-entropy with label smoothing and ignore_index (PyTorch semantics).
 * For a counted row with target t, C classes and smoothing e, with m = max_j x_j and
 * lse = m + log(sum_j exp(x_j - m)) (the max subtraction keeps exp in range):
 *   loss = (1 - e) (lse - x_t) + e (lse - mean_j x_j)      [(1-e) nll + e mean_j -log p_j]
 *   dlogits_j = (p_j - (1 - e) [j == t] - e / C) * dloss_scale / count,  p_j = exp(x_j - lse)
 * Ignored rows get loss 0 and gradient 0. Rows run in parallel; each row's sums run in double
 * in GT_LANE_SUM's fixed lane order and exp is gt_vm_expf, so the loops vectorise (3-4x faster
 * than libm's expf in class order at 32k classes, benchmarks/README.md) and every SIMD level and
 * thread count gives the same bits. R-Drop's pair form (softmax_xent_rdrop, the math in
 * ops/rdrop_hd.h) runs pairs of rows in parallel the same way. */
#include <math.h>

#include "core/loss_mean.h"
#include "core/vmath.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/rdrop_hd.h"

/* The smoothing parameters of one call. */
typedef struct xent_rule {
    size_t classes;        /* C */
    float smoothing;       /* e in [0, 1] */
    int64_t ignore_index;  /* targets equal to it are skipped */
    float grad_scale;      /* dloss_scale / count */
} xent_rule;

/* max_j of the row's C logits, in GT_LANES lanes combined pairwise (max is exact in any order;
 * the logits hold no NaN: the callers check). */
GT_INLINE float row_max(const void *logits, size_t row, size_t classes, gt_dtype dt) {
    float lanes[GT_LANES];
    for (size_t j = 0; j < GT_LANES; j++)
        lanes[j] = gt_cpu_load(logits, row + (j < classes ? j : 0), dt);
    size_t base = 0;
    for (; classes - base >= GT_LANES; base += GT_LANES)
        for (size_t j = 0; j < GT_LANES; j++) {
            float x = gt_cpu_load(logits, row + base + j, dt);
            lanes[j] = gt_vm_select(x > lanes[j], x, lanes[j]);
        }
    for (size_t j = 0; base + j < classes; j++) {
        float x = gt_cpu_load(logits, row + base + j, dt);
        lanes[j] = gt_vm_select(x > lanes[j], x, lanes[j]);
    }
    for (size_t width = GT_LANES / 2; width >= 1; width /= 2)
        for (size_t j = 0; j < width; j++)
            lanes[j] = gt_vm_select(lanes[j + width] > lanes[j], lanes[j + width], lanes[j]);
    return lanes[0];
}

enum { XENT_STAGE = 1024 };  /* classes whose exp is staged at a time (a multiple of GT_LANES) */

/* sum_j exp(x_j - m) and sum_j x_j in double over the row, in GT_LANE_SUM's order (lane i adds
 * the j with j % GT_LANES == i in increasing j; lanes combined pairwise). The exps are staged a
 * block at a time so that they vectorise at the full f32 width, the sums at the f64 width. */
GT_INLINE void row_sums(double *sum_exp, double *sum_x, const void *logits, size_t row,
                        size_t classes, float m, gt_dtype dt) {
    double exp_lanes[GT_LANES] = {0}, x_lanes[GT_LANES] = {0};
    float xs[XENT_STAGE], exps[XENT_STAGE];
    for (size_t stage = 0; stage < classes; stage += XENT_STAGE) {
        size_t len = classes - stage < XENT_STAGE ? classes - stage : XENT_STAGE;
        for (size_t j = 0; j < len; j++) {
            xs[j] = gt_cpu_load(logits, row + stage + j, dt);
            exps[j] = gt_vm_expf(xs[j] - m);
        }
        size_t base = 0;
        for (; len - base >= GT_LANES; base += GT_LANES)
            for (size_t j = 0; j < GT_LANES; j++) {
                exp_lanes[j] += (double)exps[base + j];
                x_lanes[j] += (double)xs[base + j];
            }
        /* The row's last classes (XENT_STAGE is a multiple of GT_LANES: lane j is j's lane). */
        for (size_t j = 0; base + j < len; j++) {
            exp_lanes[j] += (double)exps[base + j];
            x_lanes[j] += (double)xs[base + j];
        }
    }
    *sum_exp = ((exp_lanes[0] + exp_lanes[1]) + (exp_lanes[2] + exp_lanes[3])) +
               ((exp_lanes[4] + exp_lanes[5]) + (exp_lanes[6] + exp_lanes[7]));
    *sum_x = ((x_lanes[0] + x_lanes[1]) + (x_lanes[2] + x_lanes[3])) +
             ((x_lanes[4] + x_lanes[5]) + (x_lanes[6] + x_lanes[7]));
}

/* Loss of one counted row (and its gradient row when dlogits is non-NULL). */
GT_INLINE float xent_row(void *dlogits, const void *logits, size_t row, int64_t target,
                         const xent_rule *rule, gt_dtype dt) {
    size_t classes = rule->classes;
    float m = row_max(logits, row, classes, dt);
    double sum_exp, sum_x;
    row_sums(&sum_exp, &sum_x, logits, row, classes, m, dt);
    double lse = (double)m + log(sum_exp);
    double nll = lse - (double)gt_cpu_load(logits, row + (size_t)target, dt);
    double smooth = lse - sum_x / (double)classes;
    float loss = (float)((1.0 - (double)rule->smoothing) * nll + (double)rule->smoothing * smooth);
    if (dlogits) {
        float inv_sum = (float)(1.0 / sum_exp);
        float off = rule->smoothing / (float)classes, on = 1.0f - rule->smoothing + off;
        for (size_t j = 0; j < classes; j++) {
            float p = gt_vm_expf(gt_cpu_load(logits, row + j, dt) - m) * inv_sum;
            float y = gt_vm_select(j == (size_t)target, on, off);
            gt_cpu_store(dlogits, row + j, (p - y) * rule->grad_scale, dt);
        }
    }
    return loss;
}

GT_INLINE void xent_body(float *losses, void *dlogits, const void *logits,
                         const int64_t *targets, size_t row_begin, size_t row_end,
                         const xent_rule *rule, gt_dtype dt) {
    for (size_t r = row_begin; r < row_end; r++) {
        size_t row = r * rule->classes;
        if (targets[r] != rule->ignore_index) {
            losses[r] = xent_row(dlogits, logits, row, targets[r], rule, dt);
        } else {
            losses[r] = 0.0f;
            for (size_t j = 0; dlogits && j < rule->classes; j++)
                gt_cpu_store(dlogits, row + j, 0.0f, dt);
        }
    }
}
GT_CPU_KERNEL(xent, (float *losses, void *dlogits, const void *logits, const int64_t *targets,
                     size_t row_begin, size_t row_end, const xent_rule *rule, gt_dtype dt),
              losses, dlogits, logits, targets, row_begin, row_end, rule)

/* Counts the rows not ignored; fails with GT_ERR_INDEX naming the first bad target. */
static gt_status count_targets(int64_t *count, const int64_t *targets, int64_t rows,
                               int64_t classes, int64_t ignore_index) {
    int64_t counted = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (targets[r] == ignore_index)
            continue;
        if (targets[r] < 0 || targets[r] >= classes)
            return GT_FAIL(GT_ERR_INDEX,
                           "targets[%lld] = %lld is out of range [0, %lld) (ignore_index %lld)",
                           (long long)r, (long long)targets[r], (long long)classes,
                           (long long)ignore_index);
        counted++;
    }
    *count = counted;
    return GT_OK;
}

static gt_status check_xent(int64_t rows, int64_t classes, float label_smoothing, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (classes < 1)
        return GT_FAIL(GT_ERR_VALUE, "classes: must be >= 1, got %lld", (long long)classes);
    if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
        return GT_FAIL(GT_ERR_VALUE, "label_smoothing: must be in [0, 1], got %g",
                       (double)label_smoothing);
    return GT_OK;
}

/* The rows of one call, in blocks over the threads (the blocks do not change any row's bits). */
static void run_xent(float *losses, void *dlogits, const void *logits, const int64_t *targets,
                     int64_t rows, const xent_rule *rule, gt_dtype dt) {
    __typeof__(&xent_scalar) kernel = GT_CPU_RUN(xent);
    size_t block = GT_CPU_CHUNK / rule->classes / 8 + 1;  /* rows per block; exp is costly */
    size_t blocks = ((size_t)rows + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * block < (size_t)rows ? (b + 1) * block : (size_t)rows;
        kernel(losses, dlogits, logits, targets, b * block, end, rule, dt);
    }
}

gt_status gt_cpu_softmax_xent(gt_backend *be, float *losses, int64_t *count, void *dlogits,
                              const void *logits, const int64_t *targets, int64_t rows,
                              int64_t classes, float label_smoothing, int64_t ignore_index,
                              const float *loss_scale, float dloss_divisor, gt_dtype dt) {
    GT_TRY(check_xent(rows, classes, label_smoothing, dt));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(targets, "targets"));
    GT_TRY(count_targets(count, targets, rows, classes, ignore_index));
    xent_rule rule = {(size_t)classes, label_smoothing, ignore_index,
                      *count > 0 ? gt_dloss_scale(loss_scale, dloss_divisor) / (float)*count : 0.0f};
    run_xent(losses, dlogits, logits, targets, rows, &rule, dt);
    return GT_OK;
}

gt_status gt_cpu_xent_count(gt_backend *be, int64_t *count, const int64_t *targets, int64_t rows,
                            int64_t classes, int64_t ignore_index) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(targets, "targets"));
    return count_targets(count, targets, rows, classes, ignore_index);
}

gt_status gt_cpu_softmax_xent_counted(gt_backend *be, float *losses, const int64_t *count, void *dlogits,
                                      const void *logits, const int64_t *targets, int64_t rows,
                                      int64_t classes, float label_smoothing, int64_t ignore_index,
                                      const float *loss_scale, float dloss_divisor, gt_dtype dt) {
    GT_TRY(check_xent(rows, classes, label_smoothing, dt));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(targets, "targets"));
    int64_t here = 0;  /* these rows' targets checked again: a bad one never indexes the logits */
    GT_TRY(count_targets(&here, targets, rows, classes, ignore_index));
    xent_rule rule = {(size_t)classes, label_smoothing, ignore_index,
                      *count > 0 ? gt_dloss_scale(loss_scale, dloss_divisor) / (float)*count : 0.0f};
    run_xent(losses, dlogits, logits, targets, rows, &rule, dt);
    return GT_OK;
}

/* ---- R-Drop's pair form (ops.h softmax_xent_rdrop; the math in ops/rdrop_hd.h) ---- */

GT_INLINE void xent_rdrop_body(float *losses, void *dlogits, const void *logits, const int64_t *targets,
                               size_t pair_begin, size_t pair_end, const gt_rdrop_rule *rule, gt_dtype dt) {
    for (size_t a = pair_begin; a < pair_end; a++)
        gt_rdrop_pair(losses, dlogits, logits, targets, a, rule, dt);
}
GT_CPU_KERNEL(xent_rdrop, (float *losses, void *dlogits, const void *logits, const int64_t *targets,
                           size_t pair_begin, size_t pair_end, const gt_rdrop_rule *rule, gt_dtype dt),
              losses, dlogits, logits, targets, pair_begin, pair_end, rule)

/* The arguments softmax_xent_rdrop adds to softmax_xent's: an even number of rows, alpha >= 0. */
static gt_status check_rdrop(int64_t rows, float alpha) {
    if (rows % 2 != 0)
        return GT_FAIL(GT_ERR_VALUE, "rows: R-Drop pairs row r with row r + rows/2, so rows must be even, got %lld",
                       (long long)rows);
    if (!(alpha >= 0.0f && isfinite(alpha)))
        return GT_FAIL(GT_ERR_VALUE, "rdrop_alpha: must be a finite number >= 0, got %g", (double)alpha);
    return GT_OK;
}

gt_status gt_cpu_softmax_xent_rdrop(gt_backend *be, float *losses, int64_t *count, void *dlogits,
                                    const void *logits, const int64_t *targets, int64_t rows, int64_t classes,
                                    float label_smoothing, int64_t ignore_index, float alpha,
                                    const float *loss_scale, float dloss_divisor, gt_dtype dt) {
    GT_TRY(check_xent(rows, classes, label_smoothing, dt));
    GT_TRY(check_rdrop(rows, alpha));
    GT_TRY(gt_op_check_ptr(count, "count"));
    if (rows > 0)
        GT_TRY(gt_op_check_ptr(targets, "targets"));
    if (dlogits && dlogits == logits)
        return GT_FAIL(GT_ERR_VALUE, "dlogits: must not alias logits (a pair's gradient reads both rows)");
    GT_TRY(count_targets(count, targets, rows, classes, ignore_index));
    size_t pairs = (size_t)rows / 2;
    gt_rdrop_rule rule = {(size_t)classes, pairs, label_smoothing, alpha, ignore_index,
                          *count > 0 ? gt_dloss_scale(loss_scale, dloss_divisor) / (float)*count : 0.0f};
    __typeof__(&xent_rdrop_scalar) kernel = GT_CPU_RUN(xent_rdrop);
    size_t block = GT_CPU_CHUNK / (size_t)classes / 16 + 1;  /* pairs per block; exp is costly */
    size_t blocks = (pairs + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * block < pairs ? (b + 1) * block : pairs;
        kernel(losses, dlogits, logits, targets, b * block, end, &rule, dt);
    }
    return GT_OK;
}
