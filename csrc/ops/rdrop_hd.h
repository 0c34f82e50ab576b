/* The math of R-Drop's loss (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural
 * Networks") on one pair of logit rows (ops.h, softmax_xent_rdrop), shared by the CPU op
 * (cpu_xent.c, which the sim backend runs) and the CUDA kernel (cuda/ops_rdrop.cu): both call
 * gt_rdrop_pair per pair, so they differ only by their exp/log (CUDA's differ from glibc's by a
 * few ulp).
 *
 * Rows a and b are the two dropout passes of one example (row a of the first half of the
 * logits, b = a + rows/2). With C classes, smoothing e, lse = m + log(sum_j exp(x_j - m)),
 * log-probabilities l_j = x_j - lse, p_j = exp(l_j) and d_j = la_j - lb_j:
 *   ce_a            = (1 - e)(lse_a - xa_t) + e (lse_a - mean_j xa_j)      (cpu_xent.c's loss)
 *   S               = sum_j (pa_j - pb_j) d_j = KL(pa||pb) + KL(pb||pa)
 *                   = Ea[d] - Eb[d]             (Ea[d] = sum_j pa_j d_j = KL(pa||pb))
 *   losses[a]       = ce_a + alpha S / 2,   losses[b] = ce_b + alpha S / 2
 * so that the rows' mean over the N counted rows (core/loss_mean.h, as for softmax_xent) is
 *   L = (1/N) sum_rows ce + alpha (1/n) sum_pairs (KL(pa||pb) + KL(pb||pa)) / 2,   n = N / 2,
 * the cross-entropy averaged over both passes plus alpha times the symmetric KL averaged over
 * the pairs. Its gradient (KL through both rows, as the paper's code, which detaches nothing),
 * times g = dloss_scale / N:
 *   dxa_k = g [(pa_k - y_k) + alpha (pa_k (d_k - Ea[d]) + pa_k - pb_k)]
 *   dxb_k = g [(pb_k - y_k) + alpha (-pb_k (d_k - Eb[d]) + pb_k - pa_k)]
 * with y the smoothed one-hot target. A pair where either target is ignore_index has no KL; its
 * counted row (if any) gets its cross-entropy alone, an ignored row loss 0 and gradient 0.
 * Sums run in double in class order; the gradient is formed in double and rounded once. */
#ifndef GT_RDROP_HD_H
#define GT_RDROP_HD_H

#include <math.h>

#include "ops/elem_hd.h"

/* The parameters of one call. */
typedef struct gt_rdrop_rule {
    size_t classes;        /* C */
    size_t half;           /* rows / 2: row a pairs with row a + half */
    float smoothing;       /* e in [0, 1] */
    float alpha;           /* the KL's weight, >= 0 */
    int64_t ignore_index;  /* targets equal to it are skipped */
    float grad_scale;      /* dloss_scale / N (N: counted rows) */
} gt_rdrop_rule;

/* One row's softmax statistics. */
typedef struct gt_rdrop_row {
    size_t base;      /* offset of the row's first logit */
    double lse;       /* log sum_j exp(x_j) */
    double loss;      /* its cross-entropy (smoothed) */
} gt_rdrop_row;

/* lse and the cross-entropy of the row at `base` with target t. */
GT_HD_INLINE gt_rdrop_row gt_rdrop_stats(const void *logits, size_t base, int64_t t, const gt_rdrop_rule *rule,
                                        gt_dtype dt) {
    size_t classes = rule->classes;
    float m = gt_hd_load(logits, base, dt);
    for (size_t j = 1; j < classes; j++) {
        float x = gt_hd_load(logits, base + j, dt);
        m = x > m ? x : m;
    }
    double sum_exp = 0.0, sum_x = 0.0;
    for (size_t j = 0; j < classes; j++) {
        float x = gt_hd_load(logits, base + j, dt);
        sum_exp += (double)expf(x - m);
        sum_x += (double)x;
    }
    gt_rdrop_row row;
    row.base = base;
    row.lse = (double)m + log(sum_exp);
    double nll = row.lse - (double)gt_hd_load(logits, base + (size_t)t, dt);
    double smooth = row.lse - sum_x / (double)classes;
    double e = (double)rule->smoothing;
    row.loss = (1.0 - e) * nll + e * smooth;
    return row;
}

/* Element k of the smoothed one-hot target t. */
GT_HD_INLINE double gt_rdrop_target(size_t k, int64_t t, const gt_rdrop_rule *rule) {
    double off = (double)rule->smoothing / (double)rule->classes;
    return k == (size_t)t ? 1.0 - (double)rule->smoothing + off : off;
}

/* A row without KL: its cross-entropy gradient (counted) or zeros (ignored, loss 0). */
GT_HD_INLINE float gt_rdrop_single(void *dlogits, const void *logits, size_t r, int64_t t,
                                   const gt_rdrop_rule *rule, gt_dtype dt) {
    size_t base = r * rule->classes;
    if (t == rule->ignore_index) {
        for (size_t k = 0; dlogits && k < rule->classes; k++)
            gt_hd_store(dlogits, base + k, 0.0f, dt);
        return 0.0f;
    }
    gt_rdrop_row s = gt_rdrop_stats(logits, base, t, rule, dt);
    for (size_t k = 0; dlogits && k < rule->classes; k++) {
        double p = exp((double)gt_hd_load(logits, base + k, dt) - s.lse);
        gt_hd_store(dlogits, base + k, (float)((double)rule->grad_scale * (p - gt_rdrop_target(k, t, rule))), dt);
    }
    return (float)s.loss;
}

/* Pair (a, a + half): writes both rows' losses and (dlogits non-NULL, not aliasing logits) gradients. */
GT_HD_INLINE void gt_rdrop_pair(float *losses, void *dlogits, const void *logits, const int64_t *targets, size_t a,
                                const gt_rdrop_rule *rule, gt_dtype dt) {
    size_t b = a + rule->half, classes = rule->classes;
    int64_t ta = targets[a], tb = targets[b];
    if (ta == rule->ignore_index || tb == rule->ignore_index) {
        losses[a] = gt_rdrop_single(dlogits, logits, a, ta, rule, dt);
        losses[b] = gt_rdrop_single(dlogits, logits, b, tb, rule, dt);
        return;
    }
    gt_rdrop_row ra = gt_rdrop_stats(logits, a * classes, ta, rule, dt);
    gt_rdrop_row rb = gt_rdrop_stats(logits, b * classes, tb, rule, dt);
    double ea = 0.0, eb = 0.0;  /* Ea[d], Eb[d] */
    for (size_t k = 0; k < classes; k++) {
        double la = (double)gt_hd_load(logits, ra.base + k, dt) - ra.lse;
        double lb = (double)gt_hd_load(logits, rb.base + k, dt) - rb.lse;
        ea += exp(la) * (la - lb);
        eb += exp(lb) * (la - lb);
    }
    double kl = 0.5 * (double)rule->alpha * (ea - eb);  /* alpha (KL(pa||pb) + KL(pb||pa)) / 2 */
    losses[a] = (float)(ra.loss + kl);
    losses[b] = (float)(rb.loss + kl);
    if (!dlogits)
        return;
    double alpha = (double)rule->alpha, g = (double)rule->grad_scale;
    for (size_t k = 0; k < classes; k++) {
        double la = (double)gt_hd_load(logits, ra.base + k, dt) - ra.lse;
        double lb = (double)gt_hd_load(logits, rb.base + k, dt) - rb.lse;
        double pa = exp(la), pb = exp(lb), d = la - lb;
        double ga = (pa - gt_rdrop_target(k, ta, rule)) + alpha * (pa * (d - ea) + pa - pb);
        double gb = (pb - gt_rdrop_target(k, tb, rule)) + alpha * (-pb * (d - eb) + pb - pa);
        gt_hd_store(dlogits, ra.base + k, (float)(g * ga), dt);
        gt_hd_store(dlogits, rb.base + k, (float)(g * gb), dt);
    }
}

#endif
