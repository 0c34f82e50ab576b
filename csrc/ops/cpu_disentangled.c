/* CPU disentangled attention (ops.h, gt_disentangled_args): DeBERTa's attention with the
 * content-to-position and position-to-content terms. The scores come from gt_dis_score
 * (ops/disentangled_hd.h), which the CUDA kernels run too.
 *
 * Forward: a unit is (b, h). Per query i: the scores of its visible keys into a (T,) row, their
 * max and log-sum-exp, P = exp(S - lse), and out_i = sum_j (P M)_ij v_j in an f32 (D,) row.
 * Backward: a unit is one head h, over b = 0, 1, ... in order, because dpos_k and dpos_q sum
 * over the batch: per query i, P and dP = dO_i . v_j are recomputed, dS = P (M dP - sum P M dP),
 * dq_i is summed over j, and dk, dv (f32 (T, D) accumulators of the entry) and dpos_k, dpos_q
 * (f32 (2S, D) accumulators of the head) gather their terms in increasing i, then j. A unit runs
 * on one thread in a fixed order and units write disjoint outputs: any thread count gives the
 * same bits. Scratch is one slot of the workspace per thread; the op never allocates.
 *
 * Cost: O(B H T^2 D) scalar work (no tiles, no GEMM): written for correctness at encoder lengths
 * (T <= 512), not speed. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/dropout.h"
#include "core/threads.h"
#include "ops/checks.h"
#include "ops/cpu_ops.h"
#include "ops/disentangled_hd.h"

/* f32 elements of one thread's scratch: forward (T scores + D output), backward (P, dP, dq row,
 * dk and dv of an entry, dpos_k and dpos_q of a head). */
static size_t slot_floats(const gt_disentangled_args *a, int backward) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, rows = 2 * (size_t)a->span;
    return backward ? 2 * t + dim + 2 * t * dim + 2 * rows * dim : t + dim;
}

/* Bytes of one thread's slot (either pass), SIZE_MAX when the sizes overflow. */
static size_t slot_bytes(const gt_disentangled_args *a) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, span = (size_t)a->span;
    if (t > (1u << 24) || dim > (1u << 16) || span > (1u << 24))
        return SIZE_MAX;
    size_t floats = slot_floats(a, 1);
    return (floats * sizeof(float) + 63) / 64 * 64;
}

size_t gt_cpu_disentangled_workspace_bytes(const gt_disentangled_args *args, int threads) {
    size_t slot = slot_bytes(args), n = threads > 1 ? (size_t)threads : 1;
    return slot > SIZE_MAX / n ? SIZE_MAX : slot * n;
}

/* The dropout multiplier of (b, h, i, j) (1 without dropout). */
static float drop_factor(const gt_disentangled_args *a, size_t b, size_t h, size_t i, size_t j) {
    if (a->dropout_p <= 0.0)
        return 1.0f;
    size_t t = (size_t)a->seq;
    uint64_t g = a->dropout_key.offset + (((uint64_t)b * (uint64_t)a->heads + h) * t + i) * t + j;
    return gt_dropout_element_factor(a->dropout_key.seed, a->dropout_key.layer, a->dropout_key.step, g,
                                     (float)a->dropout_p, gt_dropout_scale(a->dropout_p));
}

/* P[j] = exp(S_ij - lse_i) for the `keys` (>= 1) visible keys of query i; writes *lse. */
static void probabilities(const gt_disentangled_args *a, float *p, size_t b, size_t h, size_t i, size_t keys,
                          float *lse) {
    float m = -INFINITY, sum = 0.0f;
    for (size_t j = 0; j < keys; j++) {
        p[j] = gt_dis_score(a, b, h, i, j);
        m = p[j] > m ? p[j] : m;
    }
    for (size_t j = 0; j < keys; j++)
        sum += expf(p[j] - m);
    *lse = m + logf(sum);
    for (size_t j = 0; j < keys; j++)
        p[j] = expf(p[j] - *lse);
}

static void forward_unit(const gt_disentangled_args *a, float *slot, size_t u) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, b = u / (size_t)a->heads, h = u % (size_t)a->heads;
    size_t keys = gt_dis_keys(a, b);
    float *p = slot, *acc = slot + t;
    for (size_t i = 0; i < t; i++) {
        float *lse = a->lse + u * t + i;
        size_t oo = gt_dis_at(&a->out_strides, b, h, i);
        memset(acc, 0, dim * sizeof(float));
        *lse = -INFINITY;
        if (keys > 0)
            probabilities(a, p, b, h, i, keys, lse);
        for (size_t j = 0; j < keys; j++) {
            float w = p[j] * drop_factor(a, b, h, i, j);
            size_t vo = gt_dis_at(&a->in, b, h, j);
            for (size_t d = 0; d < dim; d++)
                acc[d] += w * gt_hd_load(a->v, vo + d, a->dt);
        }
        for (size_t d = 0; d < dim; d++)
            gt_hd_store(a->out, oo + d, acc[d], a->dt);
    }
}

/* Scratch of one backward unit. */
typedef struct bwd_scratch {
    float *p;     /* (T,) P of the current query */
    float *ds;    /* (T,) dP = dO_i . v_j of the current query */
    float *dq;    /* (D,) dq of the current query */
    float *dk;    /* (T, D) dk of the current entry */
    float *dv;    /* (T, D) dv of the current entry */
    float *dpk;   /* (2S, D) dpos_k of the head */
    float *dpq;   /* (2S, D) dpos_q of the head */
} bwd_scratch;

static bwd_scratch carve(const gt_disentangled_args *a, float *slot) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, rows = 2 * (size_t)a->span;
    bwd_scratch w = {slot, slot + t, slot + 2 * t, slot + 2 * t + dim, slot + 2 * t + dim + t * dim,
                     slot + 2 * t + dim + 2 * t * dim, slot + 2 * t + dim + 2 * t * dim + rows * dim};
    return w;
}

/* Query i of (b, h): P, dS, then its terms of dq_i, dk, dv, dpos_k, dpos_q. */
static void backward_query(const gt_disentangled_args *a, bwd_scratch *w, size_t b, size_t h, size_t i,
                           size_t keys) {
    size_t dim = (size_t)a->head_dim, t = (size_t)a->seq;
    size_t qo = gt_dis_at(&a->in, b, h, i), go = gt_dis_at(&a->out_strides, b, h, i);
    float lse = a->lse[(b * (size_t)a->heads + h) * t + i], delta = 0.0f;
    for (size_t j = 0; j < keys; j++) {
        w->p[j] = expf(gt_dis_score(a, b, h, i, j) - lse);
        w->ds[j] = gt_dis_dot(a->dout, go, a->v, gt_dis_at(&a->in, b, h, j), dim, a->dt);
        delta += w->p[j] * drop_factor(a, b, h, i, j) * w->ds[j];
    }
    memset(w->dq, 0, dim * sizeof(float));
    for (size_t j = 0; j < keys; j++) {
        float m = drop_factor(a, b, h, i, j), pm = w->p[j] * m;
        float c = a->scale * (w->p[j] * (m * w->ds[j] - delta));
        size_t ko = gt_dis_at(&a->in, b, h, j), r = gt_dis_rel(a, i, j), po = gt_dis_pos_at(a, r, h);
        for (size_t d = 0; d < dim; d++) {
            float qd = gt_hd_load(a->q, qo + d, a->dt), kd = gt_hd_load(a->k, ko + d, a->dt);
            float pk = a->pos_k ? gt_hd_load(a->pos_k, po + d, a->dt) : 0.0f;
            float pq = a->pos_q ? gt_hd_load(a->pos_q, po + d, a->dt) : 0.0f;
            w->dq[d] += c * (kd + pk);
            w->dk[j * dim + d] += c * (qd + pq);
            w->dv[j * dim + d] += pm * gt_hd_load(a->dout, go + d, a->dt);
            w->dpk[r * dim + d] += c * qd;
            w->dpq[r * dim + d] += c * kd;
        }
    }
    if (a->dq)
        for (size_t d = 0; d < dim; d++)
            gt_hd_store(a->dq, qo + d, w->dq[d], a->dt);
}

/* Rows [0, rows) of an f32 (rows, D) accumulator into operand `dst` at element offsets base + r step. */
static void store_rows(void *dst, size_t base, size_t step, const float *src, size_t rows, size_t dim,
                       gt_dtype dt) {
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < dim; d++)
            gt_hd_store(dst, base + r * step + d, src[r * dim + d], dt);
}

static void backward_unit(const gt_disentangled_args *a, float *slot, size_t h) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, rows = 2 * (size_t)a->span;
    bwd_scratch w = carve(a, slot);
    memset(w.dpk, 0, 2 * rows * dim * sizeof(float));
    for (size_t b = 0; b < (size_t)a->batch; b++) {
        size_t keys = gt_dis_keys(a, b);
        memset(w.dk, 0, 2 * t * dim * sizeof(float));
        for (size_t i = 0; i < t; i++) {
            if (keys > 0) {
                backward_query(a, &w, b, h, i, keys);
            } else if (a->dq) {
                for (size_t d = 0; d < dim; d++)
                    gt_hd_store(a->dq, gt_dis_at(&a->in, b, h, i) + d, 0.0f, a->dt);
            }
        }
        if (a->dk) {
            size_t base = gt_dis_at(&a->in, b, h, 0), step = (size_t)a->in.row;
            store_rows(a->dk, base, step, w.dk, t, dim, a->dt);
            store_rows(a->dv, base, step, w.dv, t, dim, a->dt);
        }
    }
    size_t base = (size_t)h * dim, step = (size_t)a->pos_row;
    if (a->dpos_k)
        store_rows(a->dpos_k, base, step, w.dpk, rows, dim, a->dt);
    if (a->dpos_q)
        store_rows(a->dpos_q, base, step, w.dpq, rows, dim, a->dt);
}

static gt_status check_args(const gt_disentangled_args *a, int backward) {
    GT_TRY(gt_disentangled_check(a, backward));
    for (int64_t b = 0; a->key_lengths && b < a->batch; b++)
        if (a->key_lengths[b] < 0 || a->key_lengths[b] > a->seq)
            return GT_FAIL(GT_ERR_VALUE, "key_lengths[%lld]: must be in [0, %lld], got %lld",
                           (long long)b, (long long)a->seq, (long long)a->key_lengths[b]);
    for (int64_t r = 0; a->batch && a->heads && r < 2 * a->seq - 1; r++)
        if (a->rel_index[r] < 0 || a->rel_index[r] >= 2 * a->span)
            return GT_FAIL(GT_ERR_VALUE, "rel_index[%lld]: must be in [0, %lld), got %d", (long long)r,
                           (long long)(2 * a->span), (int)a->rel_index[r]);
    return GT_OK;
}

typedef void (*unit_fn)(const gt_disentangled_args *a, float *slot, size_t u);

/* Runs `units` units, each on one thread with that thread's workspace slot. */
static gt_status run_units(gt_backend *be, const gt_disentangled_args *a, unit_fn kernel, size_t units) {
    size_t slot = slot_bytes(a);
    size_t slots = slot == SIZE_MAX || !be->workspace ? 0 : be->workspace_bytes / slot;
    if (slots < 1)
        return GT_FAIL(GT_ERR_VALUE, "workspace: disentangled attention (seq %lld, head_dim %lld, span %lld) "
                       "needs %zu bytes per thread, got %zu", (long long)a->seq, (long long)a->head_dim,
                       (long long)a->span, slot, be->workspace ? be->workspace_bytes : (size_t)0);
    size_t threads = (size_t)gt_get_num_threads();
    threads = threads < slots ? threads : slots;
    threads = threads < units ? threads : units;
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
        float *mine = (float *)((char *)be->workspace + (size_t)omp_get_thread_num() * slot);
#pragma omp for schedule(dynamic, 1)
        for (size_t u = 0; u < units; u++)
            kernel(a, mine, u);
    }
    return GT_OK;
}

gt_status gt_cpu_disentangled_forward(gt_backend *be, const gt_disentangled_args *args) {
    GT_TRY(check_args(args, 0));
    size_t units = (size_t)args->batch * (size_t)args->heads;
    return units == 0 || args->seq == 0 ? GT_OK : run_units(be, args, forward_unit, units);
}

gt_status gt_cpu_disentangled_backward(gt_backend *be, const gt_disentangled_args *args) {
    GT_TRY(check_args(args, 1));
    size_t units = args->batch > 0 && args->seq > 0 ? (size_t)args->heads : 0;
    return units == 0 ? GT_OK : run_units(be, args, backward_unit, units);
}
