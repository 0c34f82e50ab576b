/* The per-thread math of the CUDA attention kernels (cuda/ops_attention.cu), shared with a host
 * harness (tests/_attention_harness.c) that runs the same functions over the whole grid
 * serially, so the exact arithmetic the GPU runs is tested in CI without a GPU (DESIGN.md
 * principle 3). All GT_HD: C11 on the host, __host__ __device__ under nvcc.
 *
 * One thread owns one row (ops.h, gt_attention_args; u = (b * heads + h) * seq + i for query
 * rows, u = (b * kv_heads + g) * seq + j for key rows):
 *   gt_attn_forward_row   query row i: out_i and lse_i, streaming over key tiles with an online
 *                         softmax (FlashAttention, Dao et al. 2022, algorithm 1);
 *   gt_attn_delta_row     D_i = dout_i . out_i, the backward's precomputed row term;
 *   gt_attn_dkdv_row      key row j of kv head g: dk_j and dv_j, recomputing its column of P
 *                         tile by tile for each query head of g's group in turn (grouped-query
 *                         attention: k and v are never expanded per query head);
 *   gt_attn_dq_row        query row i: dq_i, recomputing its row of P tile by tile.
 * No thread writes what another writes: no atomics, the same bits on every run.
 *
 * Each query sees one range of keys [lo_i, hi_i) (gt_attn_range: causal, key lengths, sliding
 * window, key starts). Tiles that hold none of a row's visible keys add exact zeros to the
 * backward's sums (dk, dv, dq start at +0 and a sum of +0/-0 terms added to them changes no bit),
 * so the backward threads may skip other tiles than the CPU does; the forward visits exactly
 * the CPU's tiles (the union of its query block's ranges).
 *
 * The operations and their order are those of the CPU op (cpu_attention.c, whose blocks are
 * GT_ATTN_Q_TILE queries by GT_ATTN_K_TILE keys): scores summed over head_dim in order from 0;
 * per key tile, the running max, alpha = exp(m_old - m), exp(s - m), their sum in order, l = l
 * alpha + sum, out *= alpha, and the tile's sum over keys of p v formed from 0 then added; the
 * backward's sums over a tile formed from 0 and added tile by tile; gt_vm_expf for exp and
 * gt_attn_lse for the log. Both builds round every operation once (-ffp-contract=off, nvcc
 * --fmad=false, no fmaf), so a thread's results are the CPU op's bits. The one libm call is the
 * double log of gt_attn_lse (at most 1 ulp of double on the GPU and in glibc); its rounding to
 * float could differ only within 1 double ulp of a float rounding boundary.
 *
 * Per-thread scratch (caller's, of head_dim or tile floats): the device passes local arrays,
 * the harness heap memory. */
#ifndef GT_ATTENTION_HD_H
#define GT_ATTENTION_HD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dropout.h"
#include "core/half.h"
#include "core/hd.h"
#include "core/vmath.h"
#include "ops/elem_hd.h"
#include "ops/ops.h"

enum { GT_ATTN_Q_TILE = 64, GT_ATTN_K_TILE = 64 };  /* queries and keys per tile (the CPU's) */

/* lse = m + log(l) (l > 0), with log in double rounded once to float. */
GT_HD float gt_attn_lse(float m, float l) {
    return m + (float)log((double)l);
}

/* The keys query i of batch entry b sees (ops.h): [*lo, *hi), empty (*lo == *hi) when none. */
GT_HD void gt_attn_range(const gt_attention_args *a, size_t b, size_t i, size_t *lo, size_t *hi) {
    size_t t = (size_t)a->seq, end = a->key_lengths ? (size_t)a->key_lengths[b] : t, start = 0;
    if (a->causal && i + 1 < end)
        end = i + 1;
    if (a->window > 0 && i + 1 > (size_t)a->window)
        start = i + 1 - (size_t)a->window;  /* keys j > i - window */
    if (a->key_starts) {
        int64_t first = a->key_starts[b * t + i];
        size_t from = first <= 0 ? 0 : ((uint64_t)first > t ? t : (size_t)first);
        start = from > start ? from : start;
    }
    *hi = end;
    *lo = start < end ? start : end;
}

/* Of the keys [j0, j0 + cols), those query i sees, counted from j0: [*c0, *c1) (empty: 0, 0). */
GT_HD void gt_attn_tile_cols(const gt_attention_args *a, size_t b, size_t i, size_t j0, size_t cols,
                             size_t *c0, size_t *c1) {
    size_t lo, hi;
    gt_attn_range(a, b, i, &lo, &hi);
    size_t first = lo > j0 ? lo : j0, last = hi < j0 + cols ? hi : j0 + cols;
    *c0 = first < last ? first - j0 : 0;
    *c1 = first < last ? last - j0 : 0;
}

/* The union of the key ranges of queries [i0, i0 + rows) that see any key: [*lo, *hi), or 0, 0
 * when none does. The forward's key tiles of a query block are those overlapping it. */
GT_HD void gt_attn_block_range(const gt_attention_args *a, size_t b, size_t i0, size_t rows,
                               size_t *lo, size_t *hi) {
    size_t first = SIZE_MAX, last = 0;
    for (size_t r = 0; r < rows; r++) {
        size_t l, h;
        gt_attn_range(a, b, i0 + r, &l, &h);
        if (l < h) {
            first = l < first ? l : first;
            last = h > last ? h : last;
        }
    }
    *lo = last > 0 ? first : 0;
    *hi = last;
}

/* The end (exclusive) of the queries that can see a key < j_end under causal/window: with a
 * window W only queries i < j_end - 1 + W do; the rest of the visibility is checked row by row. */
GT_HD size_t gt_attn_query_end(const gt_attention_args *a, size_t j_end) {
    size_t t = (size_t)a->seq;
    if (a->window <= 0 || (uint64_t)a->window > t)
        return t;
    size_t end = j_end - 1 + (size_t)a->window;
    return end < t ? end : t;
}

/* The dropout element of (b * heads + h = bh, query i, key j) (ops.h). */
GT_HD uint64_t gt_attn_dropout_index(const gt_attention_args *a, size_t bh, size_t i, size_t j) {
    uint64_t t = (uint64_t)a->seq;
    return a->dropout_key.offset + ((uint64_t)bh * t + i) * t + j;
}

/* x[c] *= the dropout multiplier of element g + c, for c < n (one Philox call per group of 4). */
GT_HD void gt_attn_dropout_apply(const gt_attention_args *a, uint64_t g, float *x, size_t n) {
    const gt_dropout_key *key = &a->dropout_key;
    float p = (float)a->dropout_p, scale = gt_dropout_scale(a->dropout_p);
    uint32_t words[4] = {0, 0, 0, 0};
    for (size_t c = 0; c < n; c++, g++) {
        if (c == 0 || g % 4u == 0)
            gt_philox_random4(key->seed, key->layer, key->step, g / 4u, words);
        x[c] *= gt_dropout_factor(words[g % 4u], p, scale);
    }
}

/* sum over d < dim, in order from 0, of x[d] * y[base + d] (y of dtype dt). */
GT_HD float gt_attn_dot(const float *x, const void *y, size_t base, size_t dim, gt_dtype dt) {
    float sum = 0.0f;
    for (size_t d = 0; d < dim; d++)
        sum += x[d] * gt_hd_load(y, base + d, dt);
    return sum;
}

/* acc[d] += (sum over c < n, in order from 0, of w[c] * rows[base + c * stride + d]). */
GT_HD void gt_attn_accumulate(float *acc, const float *w, size_t n, const void *rows, size_t base,
                              size_t stride, size_t dim, gt_dtype dt) {
    for (size_t d = 0; d < dim; d++) {
        float sum = 0.0f;
        for (size_t c = 0; c < n; c++)
            sum += w[c] * gt_hd_load(rows, base + c * stride + d, dt);
        acc[d] += sum;
    }
}

/* dst[d] = row `base` of an operand, widened; the row's dim elements. */
GT_HD void gt_attn_load_row(float *dst, const void *src, size_t base, size_t dim, gt_dtype dt) {
    for (size_t d = 0; d < dim; d++)
        dst[d] = gt_hd_load(src, base + d, dt);
}

/* Rows' positions: element (b, h, t, 0) of q/dq and of out/dout for query head bh = b * H + h;
 * element (b, g, t, 0) of k, v, dk, dv for kv head bg = b * K + g. */
GT_HD size_t gt_attn_in_row(const gt_attention_args *a, size_t bh, size_t t) {
    size_t b = bh / (size_t)a->heads, h = bh % (size_t)a->heads;
    return b * (size_t)a->in.batch + h * (size_t)a->in.head + t * (size_t)a->in.row;
}
GT_HD size_t gt_attn_out_row(const gt_attention_args *a, size_t bh, size_t t) {
    size_t b = bh / (size_t)a->heads, h = bh % (size_t)a->heads;
    return b * (size_t)a->out_strides.batch + h * (size_t)a->out_strides.head +
           t * (size_t)a->out_strides.row;
}
GT_HD size_t gt_attn_kv_row(const gt_attention_args *a, size_t bg, size_t t) {
    size_t b = bg / (size_t)a->kv_heads, g = bg % (size_t)a->kv_heads;
    return b * (size_t)a->kv.batch + g * (size_t)a->kv.head + t * (size_t)a->kv.row;
}
/* The kv head b * K + g that query head bh = b * H + h reads (g = h / (H / K)). */
GT_HD size_t gt_attn_kv_of(const gt_attention_args *a, size_t bh) {
    size_t heads = (size_t)a->heads, kv = (size_t)a->kv_heads;
    return bh / heads * kv + bh % heads / (heads / kv);
}

/* The online-softmax update of query i (row q, running m and l, output accumulator o) by its
 * visible keys [j0 + c0, j0 + c1) of the tile [j0, j0 + cols) (c0 < c1): s holds the tile's
 * (dropped-out) probabilities after it, zeros in its invisible columns. */
GT_HD void gt_attn_online_tile(const gt_attention_args *a, size_t bh, size_t i, size_t j0,
                               size_t c0, size_t c1, size_t cols, const float *q, float *o,
                               float *s, float *m, float *l) {
    size_t dim = (size_t)a->head_dim, kv = gt_attn_kv_of(a, bh);
    float mx = *m;
    for (size_t c = c0; c < c1; c++) {
        s[c] = gt_attn_dot(q, a->k, gt_attn_kv_row(a, kv, j0 + c), dim, a->dt);
        s[c] *= a->scale;
        mx = s[c] > mx ? s[c] : mx;
    }
    float alpha = gt_vm_expf(*m - mx), sum = 0.0f;  /* exp(-inf) = 0 on the first tile */
    for (size_t c = c0; c < c1; c++)
        s[c] = gt_vm_expf(s[c] - mx);
    for (size_t c = c0; c < c1; c++)
        sum += s[c];
    *l = *l * alpha + sum;
    *m = mx;
    for (size_t d = 0; d < dim; d++)
        o[d] *= alpha;
    if (a->dropout_p > 0.0)
        gt_attn_dropout_apply(a, gt_attn_dropout_index(a, bh, i, j0 + c0), s + c0, c1 - c0);
    for (size_t c = 0; c < c0; c++)
        s[c] = 0.0f;
    for (size_t c = c1; c < cols; c++)
        s[c] = 0.0f;
}

/* Forward of row u: out_i and lse_i. Scratch: q, o (head_dim), s (GT_ATTN_K_TILE). The key
 * tiles are those overlapping the keys any query of i's GT_ATTN_Q_TILE block sees (the CPU's
 * tiles): a sliding window costs O(window) per query, not O(seq). */
GT_HD void gt_attn_forward_row(const gt_attention_args *a, size_t u, float *q, float *o, float *s) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, bh = u / t, i = u % t;
    size_t b = bh / (size_t)a->heads, i0 = i / GT_ATTN_Q_TILE * GT_ATTN_Q_TILE, klo, khi;
    gt_attn_block_range(a, b, i0, t - i0 < GT_ATTN_Q_TILE ? t - i0 : GT_ATTN_Q_TILE, &klo, &khi);
    size_t kv = gt_attn_kv_of(a, bh);
    float m = -INFINITY, l = 0.0f;
    gt_attn_load_row(q, a->q, gt_attn_in_row(a, bh, i), dim, a->dt);
    for (size_t d = 0; d < dim; d++)
        o[d] = 0.0f;
    for (size_t j0 = klo / GT_ATTN_K_TILE * GT_ATTN_K_TILE; j0 < khi; j0 += GT_ATTN_K_TILE) {
        size_t cols = khi - j0 < GT_ATTN_K_TILE ? khi - j0 : GT_ATTN_K_TILE, c0, c1;
        gt_attn_tile_cols(a, b, i, j0, cols, &c0, &c1);
        if (c0 < c1)
            gt_attn_online_tile(a, bh, i, j0, c0, c1, cols, q, o, s, &m, &l);
        else
            for (size_t c = 0; c < cols; c++)
                s[c] = 0.0f;
        gt_attn_accumulate(o, s, cols, a->v, gt_attn_kv_row(a, kv, j0), (size_t)a->kv.row, dim,
                           a->dt);
    }
    int seen = l > 0.0f;  /* 0 when the query sees no key */
    float inv = seen ? 1.0f / l : 0.0f;
    a->lse[u] = seen ? gt_attn_lse(m, l) : -INFINITY;
    size_t out = gt_attn_out_row(a, bh, i);
    for (size_t d = 0; d < dim; d++)
        gt_hd_store(a->out, out + d, o[d] * inv, a->dt);
}

/* delta[u] = dout_i . out_i (summed over head_dim in order from 0). */
GT_HD void gt_attn_delta_row(const gt_attention_args *a, size_t u, float *delta) {
    size_t t = (size_t)a->seq, base = gt_attn_out_row(a, u / t, u % t);
    float sum = 0.0f;
    for (size_t d = 0; d < (size_t)a->head_dim; d++)
        sum += gt_hd_load(a->dout, base + d, a->dt) * gt_hd_load(a->out, base + d, a->dt);
    delta[u] = sum;
}

/* dS of query i and key j from score = q_i . k_j and dp = dout_i . v_j:
 * p = exp(scale score - lse_i), dS = p (dp M - delta_i) with M the dropout multiplier of (i, j);
 * *kept = p M (p without dropout). */
GT_HD float gt_attn_ds(const gt_attention_args *a, size_t bh, size_t i, size_t j, float score,
                       float dp, const float *delta, float *kept) {
    size_t u = bh * (size_t)a->seq + i;
    float p = gt_vm_expf(score * a->scale - a->lse[u]);
    if (a->dropout_p > 0.0) {
        float f = 1.0f;
        gt_attn_dropout_apply(a, gt_attn_dropout_index(a, bh, i, j), &f, 1);
        *kept = p * f;
        return p * (dp * f - delta[u]);
    }
    *kept = p;
    return p * (dp - delta[u]);
}

/* One query head's contributions to dk_j and dv_j (key j of kv head bg, k and v its rows): the
 * query tiles from j's tile (causal) or 0 to the last query that can see j, each tile's sums
 * formed from 0 and then added. Scratch: pt, dst (GT_ATTN_Q_TILE): a tile's column of P M, dS. */
GT_HD void gt_attn_dkdv_head(const gt_attention_args *a, size_t bh, size_t j, const float *delta,
                             const float *k, const float *v, float *dk, float *dv, float *pt,
                             float *dst) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, b = bh / (size_t)a->heads;
    size_t j0 = j / GT_ATTN_K_TILE * GT_ATTN_K_TILE, end = gt_attn_query_end(a, j + 1);
    for (size_t i0 = a->causal ? j0 : 0; i0 < end; i0 += GT_ATTN_Q_TILE) {
        size_t rows = t - i0 < GT_ATTN_Q_TILE ? t - i0 : GT_ATTN_Q_TILE;
        for (size_t r = 0; r < rows; r++) {
            size_t i = i0 + r, lo, hi;
            pt[r] = dst[r] = 0.0f;
            gt_attn_range(a, b, i, &lo, &hi);
            if (j < lo || j >= hi)
                continue;
            float score = gt_attn_dot(k, a->q, gt_attn_in_row(a, bh, i), dim, a->dt);
            float dp = gt_attn_dot(v, a->dout, gt_attn_out_row(a, bh, i), dim, a->dt);
            dst[r] = gt_attn_ds(a, bh, i, j, score, dp, delta, &pt[r]);
        }
        gt_attn_accumulate(dv, pt, rows, a->dout, gt_attn_out_row(a, bh, i0),
                           (size_t)a->out_strides.row, dim, a->dt);
        gt_attn_accumulate(dk, dst, rows, a->q, gt_attn_in_row(a, bh, i0), (size_t)a->in.row,
                           dim, a->dt);
    }
}

/* dk_j and dv_j of key row u = (b * K + g) * seq + j: the contributions of the H / K query heads
 * of kv head g, in increasing h (zeros for keys no query sees). Scratch: k, v, dk, dv
 * (head_dim), pt, dst (GT_ATTN_Q_TILE). */
GT_HD void gt_attn_dkdv_row(const gt_attention_args *a, size_t u, const float *delta, float *k,
                            float *v, float *dk, float *dv, float *pt, float *dst) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, bg = u / t, j = u % t;
    size_t kv = (size_t)a->kv_heads, group = (size_t)a->heads / kv, b = bg / kv;
    size_t keys = a->key_lengths ? (size_t)a->key_lengths[b] : t, in = gt_attn_kv_row(a, bg, j);
    for (size_t d = 0; d < dim; d++)
        dk[d] = dv[d] = 0.0f;
    gt_attn_load_row(k, a->k, in, dim, a->dt);
    gt_attn_load_row(v, a->v, in, dim, a->dt);
    size_t first = b * (size_t)a->heads + bg % kv * group;  /* the group's first query head */
    for (size_t h = 0; j < keys && h < group; h++)
        gt_attn_dkdv_head(a, first + h, j, delta, k, v, dk, dv, pt, dst);
    for (size_t d = 0; d < dim; d++) {
        gt_hd_store(a->dk, in + d, dk[d] * a->scale, a->dt);
        gt_hd_store(a->dv, in + d, dv[d] * 1.0f, a->dt);
    }
}

/* dq_i of query row u. Scratch: q, dout, dq (head_dim), ds (GT_ATTN_K_TILE): a tile's row of dS.
 * Only the key tiles overlapping i's visible keys are visited (the CPU's other tiles add zeros). */
GT_HD void gt_attn_dq_row(const gt_attention_args *a, size_t u, const float *delta, float *q,
                          float *dout, float *dq, float *ds) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, bh = u / t, i = u % t;
    size_t b = bh / (size_t)a->heads, keys = a->key_lengths ? (size_t)a->key_lengths[b] : t;
    size_t kv = gt_attn_kv_of(a, bh), lo, hi;
    float kept = 0.0f;
    gt_attn_range(a, b, i, &lo, &hi);
    gt_attn_load_row(q, a->q, gt_attn_in_row(a, bh, i), dim, a->dt);
    gt_attn_load_row(dout, a->dout, gt_attn_out_row(a, bh, i), dim, a->dt);
    for (size_t d = 0; d < dim; d++)
        dq[d] = 0.0f;
    for (size_t j0 = lo / GT_ATTN_K_TILE * GT_ATTN_K_TILE; j0 < hi; j0 += GT_ATTN_K_TILE) {
        size_t cols = keys - j0 < GT_ATTN_K_TILE ? keys - j0 : GT_ATTN_K_TILE;
        for (size_t c = 0; c < cols; c++) {
            ds[c] = 0.0f;
            if (j0 + c < lo || j0 + c >= hi)
                continue;
            size_t in = gt_attn_kv_row(a, kv, j0 + c);
            float score = gt_attn_dot(q, a->k, in, dim, a->dt);
            ds[c] = gt_attn_ds(a, bh, i, j0 + c, score, gt_attn_dot(dout, a->v, in, dim, a->dt),
                               delta, &kept);
        }
        gt_attn_accumulate(dq, ds, cols, a->k, gt_attn_kv_row(a, kv, j0), (size_t)a->kv.row, dim,
                           a->dt);
    }
    size_t in = gt_attn_in_row(a, bh, i);
    for (size_t d = 0; d < dim; d++)
        gt_hd_store(a->dq, in + d, dq[d] * a->scale, a->dt);
}

#endif
