/* CPU scaled dot-product attention (ops.h, gt_attention_args): a blocked online-softmax forward
 * and a backward that recomputes the probabilities tile by tile (FlashAttention, Dao et al.
 * 2022, algorithms 1 and 2), so no (T, T) matrix is ever held: at most one (Q_BLOCK, K_BLOCK)
 * tile of scores per thread.
 *
 * Forward: a unit of work is (b, h, a block of Q_BLOCK queries). For each block of K_BLOCK keys,
 * S = scale Q K^T; each query row keeps the running max m and sum l of exp(S - m), rescales its
 * f32 output accumulator by exp(m_old - m_new) and adds the (dropped-out) probabilities times V.
 * At the end out = acc / l and lse = m + log l. The tile of scores is held transposed, so the
 * softmax steps run with the block's queries in vector lanes, each query's terms still in order
 * of keys.
 * Backward: a unit is (b, kv head g) (grouped-query attention: query head h reads kv head
 * g = h / (H / K); K = H is plain multi-head attention). For each query head of g's group in
 * increasing h, with D_i = dout_i . out_i, for each key block and each query block that sees it:
 * P = exp(S - lse), dV += (P M)^T dO, dP = (dO V^T) M, dS = P (dP - D), dK += scale dS^T Q,
 * dQ += scale dS K (dQ in an f32 (T, D) accumulator of the head, dK and dV in f32 (T, D)
 * accumulators of the unit: k and v are never expanded per query head, and the group's terms
 * are added in a fixed order).
 * Visibility: each query sees one range of keys (attention_hd.h, gt_attn_range: causal, key
 * lengths, sliding window, key starts); only key tiles overlapping a query block's ranges are
 * visited, so a sliding window of W keys costs O(T W), not O(T^2).
 *
 * Determinism: a unit runs on one thread in a fixed order and units write disjoint outputs, so
 * any thread count gives the same bits. The tile products keep blocks of outputs in vector
 * registers and add their terms in a fixed order (over head_dim for scores, over keys or queries
 * for the rest), vectorising over an output row without reassociation in the SSE, AVX2 and
 * AVX-512 clones of cpu_kernels.h; exp is gt_vm_expf. Invisible (masked) entries of a tile are
 * exact zeros in the products. Scratch is one slot of the workspace per thread (as many threads
 * as the workspace has slots): the op never allocates. The CUDA kernels' per-row math
 * (ops/attention_hd.h) repeats these operations in this order, so a change of order here must
 * be made there too (tests/test_attention_cuda_math.py compares the bits). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/dropout.h"
#include "core/threads.h"
#include "core/vmath.h"
#include "ops/attention_hd.h"
#include "ops/checks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/philox_lanes.h"

enum { Q_BLOCK = GT_ATTN_Q_TILE, K_BLOCK = GT_ATTN_K_TILE };  /* queries and keys per tile */

/* dst (rows, D) = rows of an operand from element `base`, `stride` apart, widened to f32. */
GT_INLINE void load_rows(float *dst, const void *src, size_t base, size_t stride, size_t rows,
                         size_t dim, gt_dtype dt) {
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < dim; d++)
            dst[r * dim + d] = gt_cpu_load(src, base + r * stride + d, dt);
}

/* dst (D, K_BLOCK) = the same rows transposed, zeros in the columns beyond `rows`. */
GT_INLINE void load_rows_t(float *dst, const void *src, size_t base, size_t stride, size_t rows,
                           size_t dim, gt_dtype dt) {
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < dim; d++)
            dst[d * K_BLOCK + r] = gt_cpu_load(src, base + r * stride + d, dt);
    for (size_t d = 0; rows < K_BLOCK && d < dim; d++)
        memset(dst + d * K_BLOCK + rows, 0, (K_BLOCK - rows) * sizeof(float));
}

/* Rows of `src` (rows, D) times `factor`, rounded into an operand at `base`, `stride` apart. */
GT_INLINE void store_rows(void *dst, size_t base, size_t stride, const float *src, size_t rows,
                          size_t dim, float factor, gt_dtype dt) {
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < dim; d++)
            gt_cpu_store(dst, base + r * stride + d, src[r * dim + d] * factor, dt);
}

enum { ACC_COLS = 32, ACC_COLS_WIDE = 64 };  /* output columns of a block kept in registers */

/* o[k][d0:d0+W] (rows ldo apart) = (o[k][...] if add, else 0) + the sum over c < n, in order, of
 * p[k * pr + c * pc] * x[c][d0:d0+W] (rows ldx apart) for k < R (R and W constants): the sums
 * are formed in registers from 0, then added to o or stored into it. */
#define PRODUCT_FIXED(R, W)                                                          \
    do {                                                                             \
        float acc[R][W] = {{0}};                                                     \
        for (size_t c = 0; c < n; c++)                                               \
            for (size_t k = 0; k < (R); k++)                                         \
                for (size_t j = 0; j < (W); j++)                                     \
                    acc[k][j] += p[k * pr + c * pc] * x[c * ldx + d0 + j];           \
        for (size_t k = 0; k < (R); k++)                                             \
            for (size_t j = 0; j < (W); j++)                                         \
                o[k * ldo + d0 + j] = add ? o[k * ldo + d0 + j] + acc[k][j] : acc[k][j]; \
    } while (0)

/* The same for `rows` rows and `width` columns of any size, ACC_COLS_WIDE at most. */
GT_INLINE void product_block(float *restrict o, size_t ldo, const float *restrict p, size_t pr,
                             size_t pc, const float *restrict x, size_t ldx, size_t rows,
                             size_t n, size_t d0, size_t width, int add) {
    if (width == ACC_COLS_WIDE && rows == 4) {
        PRODUCT_FIXED(4, ACC_COLS_WIDE);
        return;
    }
    if (width == ACC_COLS && rows == 4) {
        PRODUCT_FIXED(4, ACC_COLS);
        return;
    }
    if (width == ACC_COLS && rows == 2) {
        PRODUCT_FIXED(2, ACC_COLS);
        return;
    }
    for (size_t k = 0; k < rows; k++) {
        float acc[ACC_COLS_WIDE] = {0};
        for (size_t c = 0; c < n; c++)
            for (size_t j = 0; j < width; j++)
                acc[j] += p[k * pr + c * pc] * x[c * ldx + d0 + j];
        for (size_t j = 0; j < width; j++)
            o[k * ldo + d0 + j] = add ? o[k * ldo + d0 + j] + acc[j] : acc[j];
    }
}

/* o (rows, cols; rows ldo apart) = or += p (rows, n; element (k, c) at k * pr + c * pc) @ x (n,
 * cols; rows ldx apart): each element of o gets the sum of its n terms (in order of c), stored or
 * added to it, whatever the blocking. Blocks of 4 rows by ACC_COLS_WIDE outputs (`wide`:
 * AVX-512's 32 vector registers) or 2 by ACC_COLS stay in registers over all n (sixteen or eight
 * independent add chains), so x is read once per block of rows. */
GT_INLINE void tile_products(float *o, size_t ldo, const float *p, size_t pr, size_t pc,
                             const float *x, size_t ldx, size_t rows, size_t n, size_t cols,
                             int wide, int add) {
    size_t step = wide ? 4 : 2, block_cols = wide ? ACC_COLS_WIDE : ACC_COLS;
    for (size_t r = 0; r < rows; r += step) {
        size_t block = rows - r < step ? rows - r : step;
        for (size_t d0 = 0; d0 < cols; d0 += block_cols)
            product_block(o + r * ldo, ldo, p + r * pr, pr, pc, x, ldx, block, n, d0,
                          cols - d0 < block_cols ? cols - d0 : block_cols, add);
    }
}

/* s (rows, K_BLOCK) = a (rows, D) @ bt (D, K_BLOCK), each sum over d in order, over all K_BLOCK
 * columns (bt's unused columns are zeros, and so are s's there). */
GT_INLINE void tile_product(float *s, const float *a, const float *bt, size_t rows, size_t dim,
                            int wide) {
    tile_products(s, K_BLOCK, a, dim, 1, bt, K_BLOCK, rows, dim, K_BLOCK, wide, 0);
}

/* o (rows, D) += p (rows, n; element (k, c) at k * pr + c * pc) @ x (n, D). */
GT_INLINE void tile_accumulate(float *o, const float *p, size_t pr, size_t pc, const float *x,
                               size_t rows, size_t n, size_t dim, int wide) {
    tile_products(o, dim, p, pr, pc, x, dim, rows, n, dim, wide, 1);
}

/* f[0:c] = the dropout multipliers of elements g, g + 1, ... to the end of g's Philox group, n at
 * most; returns c. */
GT_INLINE size_t group_factors(float *f, const gt_dropout_key *key, uint64_t g, size_t n, float p, float scale) {
    uint32_t words[4];
    gt_philox_random4(key->seed, key->layer, key->step, g / 4u, words);
    size_t c = 0;
    for (unsigned k = (unsigned)(g % 4u); k < 4u && c < n; k++, c++)
        f[c] = gt_dropout_factor(words[k], p, scale);
    return c;
}

/* f[0:n] = the dropout multipliers of elements g, g + 1, ... (core/dropout.h): from the first
 * whole Philox group on, PHILOX_LANES groups at a time while there are as many. */
GT_INLINE void dropout_factors(float *f, const gt_dropout_key *key, uint64_t g, size_t n,
                               float p, float scale) {
    size_t c = g % 4u ? group_factors(f, key, g, n, p, scale) : 0;
    for (; n - c >= 4 * PHILOX_LANES; c += 4 * PHILOX_LANES) {
        uint32_t words[4][PHILOX_LANES];
        philox_lanes(key, (g + c) / 4u, words);
        for (size_t l = 0; l < PHILOX_LANES; l++)
            for (size_t j = 0; j < 4; j++)
                f[c + 4 * l + j] = gt_dropout_factor(words[j][l], p, scale);
    }
    while (c < n)
        c += group_factors(f + c, key, g + c, n - c, p, scale);
}

/* The dropout element index of (b, h, query i, key j) (ops.h). */
static inline uint64_t dropout_index(const gt_attention_args *a, size_t bh, size_t i, size_t j) {
    size_t t = (size_t)a->seq;
    return a->dropout_key.offset + ((uint64_t)bh * t + i) * t + j;
}

/* f32 elements of one thread's forward and backward scratch. */
static size_t forward_floats(size_t dim) {
    return dim * (2 * Q_BLOCK + 2 * K_BLOCK) + Q_BLOCK * K_BLOCK + K_BLOCK + 2 * Q_BLOCK;
}
static size_t backward_floats(size_t t, size_t dim) {
    return 5 * t * dim + t + 3 * K_BLOCK * dim + 3 * Q_BLOCK * K_BLOCK;
}

/* The scratch of one forward unit, carved from a slot. Scores are held transposed (a key per
 * row, a query per column), so that the online softmax runs down the tile's columns with the
 * block's queries in vector lanes: each query's terms still come in order of keys. */
typedef struct fwd_scratch {
    float *qt;  /* (D, Q_BLOCK) the block's queries, transposed */
    float *k;   /* (K_BLOCK, D) a key block */
    float *v;   /* (K_BLOCK, D) its values */
    float *st;  /* (K_BLOCK, Q_BLOCK) scores, then probabilities: [key c][query r] */
    float *o;   /* (Q_BLOCK, D) output accumulator */
    float *f;   /* (K_BLOCK,) dropout multipliers of one row */
    float *m;   /* (Q_BLOCK,) running max of the scaled scores */
    float *l;   /* (Q_BLOCK,) running sum of exp(score - m) */
} fwd_scratch;

_Static_assert(Q_BLOCK == K_BLOCK, "transposed query and key tiles share one leading dimension");

static fwd_scratch carve_forward(float *slot, size_t dim) {
    fwd_scratch w;
    w.qt = slot;
    w.k = w.qt + dim * Q_BLOCK;
    w.v = w.k + K_BLOCK * dim;
    w.st = w.v + K_BLOCK * dim;
    w.o = w.st + K_BLOCK * Q_BLOCK;
    w.f = w.o + Q_BLOCK * dim;
    w.m = w.f + K_BLOCK;
    w.l = w.m + Q_BLOCK;
    return w;
}

/* The visible columns [c0[r], c1[r]) of one key tile for each of the Q_BLOCK query rows (0, 0
 * when the row sees none of them, as rows past the block's `rows` never do). */
GT_INLINE void visible_cols(const gt_attention_args *a, size_t b, size_t i0, size_t rows, size_t j0,
                            size_t cols, uint32_t *c0, uint32_t *c1) {
    for (size_t r = 0; r < Q_BLOCK; r++) {
        size_t lo = 0, hi = 0;
        if (r < rows)
            gt_attn_tile_cols(a, b, i0 + r, j0, cols, &lo, &hi);
        c0[r] = (uint32_t)lo;
        c1[r] = (uint32_t)hi;
    }
}

/* The running max of each row over its visible scaled scores, in order of keys (scaling st).
 * These loops run over all Q_BLOCK rows, a constant count that vectorises without remainders:
 * rows past the block's end (zero queries, written by tile_product) see nothing, and nothing
 * reads their lanes back. */
GT_INLINE void tile_max(float *restrict st, float *restrict mx, const uint32_t *c0,
                        const uint32_t *c1, uint32_t cols, float scale) {
    for (uint32_t c = 0; c < cols; c++) {
        float *sc = st + c * Q_BLOCK;
        for (uint32_t r = 0; r < Q_BLOCK; r++) {
            float x = sc[r] * scale;
            int seen = (c >= c0[r]) & (c < c1[r]);
            sc[r] = x;
            mx[r] = seen & (x > mx[r]) ? x : mx[r];
        }
    }
}

/* st = exp(score - mx) of visible entries, exact zeros elsewhere; sum: each row's visible terms
 * added in order of keys from 0 (adding a zero leaves a sum as it is). */
GT_INLINE void tile_exp(float *restrict st, float *restrict sum, const float *mx,
                        const uint32_t *c0, const uint32_t *c1, uint32_t cols) {
    for (uint32_t r = 0; r < Q_BLOCK; r++)
        sum[r] = 0.0f;
    for (uint32_t c = 0; c < cols; c++) {
        float *sc = st + c * Q_BLOCK;
        for (uint32_t r = 0; r < Q_BLOCK; r++)
            sc[r] = gt_vm_expf(sc[r] - mx[r]);
        for (uint32_t r = 0; r < Q_BLOCK; r++) {
            sc[r] = (c >= c0[r]) & (c < c1[r]) ? sc[r] : 0.0f;
            sum[r] += sc[r];
        }
    }
}

/* Row r's dropout multipliers on its visible probabilities (a column of st). */
GT_INLINE void tile_dropout(const gt_attention_args *a, fwd_scratch *w, size_t bh, size_t i0,
                            size_t j0, const uint32_t *c0, const uint32_t *c1, size_t rows) {
    float p = (float)a->dropout_p, scale = gt_dropout_scale(a->dropout_p);
    for (size_t r = 0; r < rows; r++) {
        if (c0[r] >= c1[r])
            continue;
        dropout_factors(w->f, &a->dropout_key, dropout_index(a, bh, i0 + r, j0 + c0[r]),
                        c1[r] - c0[r], p, scale);
        for (size_t c = c0[r]; c < c1[r]; c++)
            w->st[c * Q_BLOCK + r] *= w->f[c - c0[r]];
    }
}

/* The online-softmax update of the block's rows against one key tile (scores in st): rows that
 * see a column of it take the new max, rescale their sum and output accumulator by
 * exp(m_old - m_new) and add the tile's terms; st is left holding the (dropped-out)
 * probabilities, zeros in invisible entries. */
GT_INLINE void online_tile(const gt_attention_args *a, fwd_scratch *w, size_t bh, size_t i0,
                           size_t j0, const uint32_t *c0, const uint32_t *c1, size_t rows,
                           size_t cols) {
    size_t dim = (size_t)a->head_dim;
    float mx[Q_BLOCK], sum[Q_BLOCK];
    memcpy(mx, w->m, sizeof mx);
    tile_max(w->st, mx, c0, c1, (uint32_t)cols, a->scale);
    tile_exp(w->st, sum, mx, c0, c1, (uint32_t)cols);
    for (size_t r = 0; r < rows; r++) {
        if (c0[r] >= c1[r])
            continue;
        float alpha = gt_vm_expf(w->m[r] - mx[r]);  /* exp(-inf) = 0 on the first tile */
        w->l[r] = w->l[r] * alpha + sum[r];
        w->m[r] = mx[r];
        for (size_t d = 0; d < dim; d++)
            w->o[r * dim + d] *= alpha;
    }
    if (a->dropout_p > 0.0)
        tile_dropout(a, w, bh, i0, j0, c0, c1, rows);
}

/* out and lse of the rows of one unit from its accumulators. */
GT_INLINE void finish_rows(const gt_attention_args *a, fwd_scratch *w, size_t out_base,
                           size_t lse_base, size_t rows, gt_dtype dt) {
    size_t dim = (size_t)a->head_dim, stride = (size_t)a->out_strides.row;
    for (size_t r = 0; r < rows; r++) {
        int seen = w->l[r] > 0.0f;  /* 0 when the query sees no key */
        float inv = seen ? 1.0f / w->l[r] : 0.0f;
        a->lse[lse_base + r] = seen ? gt_attn_lse(w->m[r], w->l[r]) : -INFINITY;
        store_rows(a->out, out_base + r * stride, 0, w->o + r * dim, 1, dim, inv, dt);
    }
}

/* Forward of unit u: (b, h, query block). Key tiles: those overlapping the union of the block's
 * visible key ranges (a sliding window of W keys costs O(W) per query). */
GT_INLINE void forward_unit_body(const gt_attention_args *a, float *slot, size_t u, int wide,
                                  gt_dtype dt) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim;
    size_t blocks = (t + Q_BLOCK - 1) / Q_BLOCK, bh = u / blocks;
    size_t b = bh / (size_t)a->heads, h = bh % (size_t)a->heads;
    size_t i0 = (u % blocks) * Q_BLOCK, rows = t - i0 < Q_BLOCK ? t - i0 : Q_BLOCK;
    size_t in_base = b * (size_t)a->in.batch + h * (size_t)a->in.head, in_row = (size_t)a->in.row;
    size_t kv_base = gt_attn_kv_row(a, gt_attn_kv_of(a, bh), 0), kv_row = (size_t)a->kv.row;
    fwd_scratch w = carve_forward(slot, dim);
    uint32_t c0[Q_BLOCK], c1[Q_BLOCK];
    load_rows_t(w.qt, a->q, in_base + i0 * in_row, in_row, rows, dim, dt);
    size_t klo, khi;
    gt_attn_block_range(a, b, i0, rows, &klo, &khi);
    for (size_t r = 0; r < Q_BLOCK; r++) {
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
    }
    memset(w.o, 0, rows * dim * sizeof(float));
    for (size_t j0 = klo / K_BLOCK * K_BLOCK; j0 < khi; j0 += K_BLOCK) {
        size_t cols = khi - j0 < K_BLOCK ? khi - j0 : K_BLOCK;
        load_rows(w.k, a->k, kv_base + j0 * kv_row, kv_row, cols, dim, dt);
        load_rows(w.v, a->v, kv_base + j0 * kv_row, kv_row, cols, dim, dt);
        tile_product(w.st, w.k, w.qt, cols, dim, wide);
        visible_cols(a, b, i0, rows, j0, cols, c0, c1);
        online_tile(a, &w, bh, i0, j0, c0, c1, rows, cols);
        tile_accumulate(w.o, w.st, 1, Q_BLOCK, w.v, rows, cols, dim, wide);
    }
    size_t out_base = b * (size_t)a->out_strides.batch + h * (size_t)a->out_strides.head +
                      i0 * (size_t)a->out_strides.row;
    finish_rows(a, &w, out_base, bh * t + i0, rows, dt);
}
GT_CPU_KERNEL(forward_unit, (const gt_attention_args *a, float *slot, size_t u, int wide, gt_dtype dt),
              a, slot, u, wide)

/* The scratch of one backward unit, carved from a slot. */
typedef struct bwd_scratch {
    float *q;     /* (T, D) queries of one query head */
    float *dout;  /* (T, D) its output gradient */
    float *dq;    /* (T, D) its query gradient accumulator (unscaled) */
    float *delta; /* (T,) dout_i . out_i */
    float *dk;    /* (T, D) key gradient accumulator of the kv head (unscaled) */
    float *dv;    /* (T, D) value gradient accumulator of the kv head */
    float *k;     /* (K_BLOCK, D) a key block */
    float *kt;    /* (D, K_BLOCK) the same, transposed */
    float *vt;    /* (D, K_BLOCK) its values, transposed */
    float *p;     /* (Q_BLOCK, K_BLOCK) probabilities */
    float *f;     /* (Q_BLOCK, K_BLOCK) dropout multipliers, then the kept probabilities */
    float *ds;    /* (Q_BLOCK, K_BLOCK) dP, then dS */
} bwd_scratch;

static bwd_scratch carve_backward(float *slot, size_t t, size_t dim) {
    bwd_scratch w;
    w.q = slot;
    w.dout = w.q + t * dim;
    w.dq = w.dout + t * dim;
    w.delta = w.dq + t * dim;
    w.dk = w.delta + t;
    w.dv = w.dk + t * dim;
    w.k = w.dv + t * dim;
    w.kt = w.k + K_BLOCK * dim;
    w.vt = w.kt + dim * K_BLOCK;
    w.p = w.vt + dim * K_BLOCK;
    w.f = w.p + Q_BLOCK * K_BLOCK;
    w.ds = w.f + Q_BLOCK * K_BLOCK;
    return w;
}

/* Loads q and dout of unit (b, h) and computes delta_i = dout_i . out_i. */
GT_INLINE void backward_prologue(const gt_attention_args *a, bwd_scratch *w, size_t b, size_t h,
                                 gt_dtype dt) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim;
    size_t in_base = b * (size_t)a->in.batch + h * (size_t)a->in.head;
    size_t out_base = b * (size_t)a->out_strides.batch + h * (size_t)a->out_strides.head;
    size_t out_row = (size_t)a->out_strides.row;
    load_rows(w->q, a->q, in_base, (size_t)a->in.row, t, dim, dt);
    load_rows(w->dout, a->dout, out_base, out_row, t, dim, dt);
    for (size_t i = 0; i < t; i++) {
        float sum = 0.0f;
        for (size_t d = 0; d < dim; d++)
            sum += w->dout[i * dim + d] * gt_cpu_load(a->out, out_base + i * out_row + d, dt);
        w->delta[i] = sum;
    }
    memset(w->dq, 0, t * dim * sizeof(float));
}

/* Probabilities (and dropout multipliers) of a tile: rows [i0, i0 + rows), keys [j0, j0 + cols). */
GT_INLINE void backward_probs(const gt_attention_args *a, bwd_scratch *w, size_t b, size_t bh,
                              size_t i0, size_t rows, size_t j0, size_t cols) {
    const float *lse = a->lse + bh * (size_t)a->seq;
    for (size_t r = 0; r < rows; r++) {
        size_t c0, c1;
        gt_attn_tile_cols(a, b, i0 + r, j0, cols, &c0, &c1);
        float *pr = w->p + r * K_BLOCK, shift = lse[i0 + r];
        for (size_t c = c0; c < c1; c++)
            pr[c] = gt_vm_expf(pr[c] * a->scale - shift);
        if (a->dropout_p > 0.0 && c0 < c1)
            dropout_factors(w->f + r * K_BLOCK + c0, &a->dropout_key,
                            dropout_index(a, bh, i0 + r, j0 + c0), c1 - c0, (float)a->dropout_p,
                            gt_dropout_scale(a->dropout_p));
    }
}

/* The gradients of one tile into the accumulators (ds holds dO V^T on entry; the tile's keys at
 * dk, dv + j0 rows). dS and the kept probabilities (P times the dropout multipliers, into f, or
 * P itself without dropout) are zero in invisible columns. dQ += dS K reads the tiles by rows;
 * dV += (P M)^T dO and dK += dS^T Q read them by columns (element strides 1 and K_BLOCK), so no
 * transposed copy is made. */
GT_INLINE void backward_tile(const gt_attention_args *a, bwd_scratch *w, size_t b, size_t i0,
                             size_t rows, size_t j0, size_t cols, int wide) {
    size_t dim = (size_t)a->head_dim;
    int drop = a->dropout_p > 0.0;
    float *kept = drop ? w->f : w->p;
    for (size_t r = 0; r < rows; r++) {
        size_t i = i0 + r, c0, c1;
        gt_attn_tile_cols(a, b, i, j0, cols, &c0, &c1);
        float *pr = w->p + r * K_BLOCK, *fr = w->f + r * K_BLOCK, *dsr = w->ds + r * K_BLOCK;
        float *kr = kept + r * K_BLOCK, delta = w->delta[i];
        if (drop)
            for (size_t c = c0; c < c1; c++) {
                dsr[c] = pr[c] * (dsr[c] * fr[c] - delta);
                fr[c] = pr[c] * fr[c];
            }
        else
            for (size_t c = c0; c < c1; c++)
                dsr[c] = pr[c] * (dsr[c] - delta);
        for (size_t c = 0; c < cols; c++)
            if (c < c0 || c >= c1)
                dsr[c] = kr[c] = 0.0f;
    }
    tile_accumulate(w->dq + i0 * dim, w->ds, K_BLOCK, 1, w->k, rows, cols, dim, wide);
    tile_accumulate(w->dv + j0 * dim, kept, 1, K_BLOCK, w->dout + i0 * dim, cols, rows, dim, wide);
    tile_accumulate(w->dk + j0 * dim, w->ds, 1, K_BLOCK, w->q + i0 * dim, cols, rows, dim, wide);
}

/* 1 when a query of [i0, i0 + rows) sees a key of [j0, j0 + cols); other tiles add only zeros. */
GT_INLINE int tile_sees(const gt_attention_args *a, size_t b, size_t i0, size_t rows, size_t j0,
                        size_t cols) {
    size_t lo, hi;
    gt_attn_block_range(a, b, i0, rows, &lo, &hi);
    return lo < hi && lo < j0 + cols && hi > j0;
}

/* One query head bh = b * H + h of a backward unit: its dq, and its terms of the kv head's dk, dv
 * (kv rows from kv_base). Query tiles of a key block: from the block's (causal) to the last
 * query that can see it (sliding window), those whose queries see one of its keys. */
GT_INLINE void backward_head(const gt_attention_args *a, bwd_scratch *w, size_t b, size_t h,
                             size_t kv_base, int wide, gt_dtype dt) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, bh = b * (size_t)a->heads + h;
    size_t in_base = b * (size_t)a->in.batch + h * (size_t)a->in.head, in_row = (size_t)a->in.row;
    size_t kv_row = (size_t)a->kv.row, keys = a->key_lengths ? (size_t)a->key_lengths[b] : t;
    backward_prologue(a, w, b, h, dt);
    for (size_t j0 = 0; j0 < keys; j0 += K_BLOCK) {
        size_t cols = keys - j0 < K_BLOCK ? keys - j0 : K_BLOCK;
        size_t i_end = gt_attn_query_end(a, j0 + cols), i_start = a->causal ? j0 : 0;
        if (i_start >= i_end)
            continue;
        load_rows(w->k, a->k, kv_base + j0 * kv_row, kv_row, cols, dim, dt);
        load_rows_t(w->kt, a->k, kv_base + j0 * kv_row, kv_row, cols, dim, dt);
        load_rows_t(w->vt, a->v, kv_base + j0 * kv_row, kv_row, cols, dim, dt);
        for (size_t i0 = i_start; i0 < i_end; i0 += Q_BLOCK) {
            size_t rows = t - i0 < Q_BLOCK ? t - i0 : Q_BLOCK;
            if (!tile_sees(a, b, i0, rows, j0, cols))
                continue;
            tile_product(w->p, w->q + i0 * dim, w->kt, rows, dim, wide);
            backward_probs(a, w, b, bh, i0, rows, j0, cols);
            tile_product(w->ds, w->dout + i0 * dim, w->vt, rows, dim, wide);
            backward_tile(a, w, b, i0, rows, j0, cols, wide);
        }
    }
    store_rows(a->dq, in_base, in_row, w->dq, t, dim, a->scale, dt);
}

/* Backward of unit u = b * K + g (kv head g): the H / K query heads of g's group in increasing
 * h, each adding its terms to g's dk and dv accumulators (a fixed order: the same bits on any
 * thread count), then dk, dv stored (zeros for keys no query sees). */
GT_INLINE void backward_unit_body(const gt_attention_args *a, float *slot, size_t u, int wide,
                                   gt_dtype dt) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim, kv = (size_t)a->kv_heads;
    size_t group = (size_t)a->heads / kv, b = u / kv, g = u % kv;
    size_t kv_base = gt_attn_kv_row(a, u, 0), kv_row = (size_t)a->kv.row;
    bwd_scratch w = carve_backward(slot, t, dim);
    memset(w.dk, 0, t * dim * sizeof(float));
    memset(w.dv, 0, t * dim * sizeof(float));
    for (size_t h = 0; h < group; h++)
        backward_head(a, &w, b, g * group + h, kv_base, wide, dt);
    store_rows(a->dk, kv_base, kv_row, w.dk, t, dim, a->scale, dt);
    store_rows(a->dv, kv_base, kv_row, w.dv, t, dim, 1.0f, dt);
}
GT_CPU_KERNEL(backward_unit, (const gt_attention_args *a, float *slot, size_t u, int wide, gt_dtype dt),
              a, slot, u, wide)

/* Bytes of one thread's slot (SIZE_MAX when the sizes overflow). */
static size_t slot_bytes(const gt_attention_args *a) {
    size_t t = (size_t)a->seq, dim = (size_t)a->head_dim;
    if (dim > SIZE_MAX / 64 / (t + 2 * K_BLOCK + Q_BLOCK + 1))
        return SIZE_MAX;
    size_t fwd = forward_floats(dim), bwd = backward_floats(t, dim);
    size_t floats = fwd > bwd ? fwd : bwd;
    return (floats * sizeof(float) + 63) / 64 * 64;
}

size_t gt_cpu_attention_workspace_bytes(const gt_attention_args *args, int threads) {
    size_t slot = slot_bytes(args), n = threads > 1 ? (size_t)threads : 1;
    return slot > SIZE_MAX / n ? SIZE_MAX : slot * n;
}

/* The shared checks (ops/checks.h) and the key lengths, which the CPU reads where they lie. */
static gt_status check_args(const gt_attention_args *a, int backward) {
    GT_TRY(gt_attention_check(a, backward, 0));
    if (a->batch == 0 || a->heads == 0 || a->seq == 0)
        return GT_OK;
    for (int64_t b = 0; a->key_lengths && b < a->batch; b++)
        if (a->key_lengths[b] < 0 || a->key_lengths[b] > a->seq)
            return GT_FAIL(GT_ERR_VALUE, "key_lengths[%lld]: must be in [0, %lld], got %lld",
                           (long long)b, (long long)a->seq, (long long)a->key_lengths[b]);
    return GT_OK;
}

typedef void (*unit_kernel)(const gt_attention_args *a, float *slot, size_t u, int wide, gt_dtype dt);

/* Runs `units` units of `kernel`, each on one thread with that thread's workspace slot. */
static gt_status run_units(gt_backend *be, const gt_attention_args *a, unit_kernel kernel,
                           size_t units) {
    size_t slot = slot_bytes(a);
    size_t slots = slot == SIZE_MAX || !be->workspace ? 0 : be->workspace_bytes / slot;
    if (slots < 1)
        return GT_FAIL(GT_ERR_VALUE, "workspace: attention (batch %lld, heads %lld, seq %lld, "
                       "head_dim %lld) needs %zu bytes per thread, got %zu",
                       (long long)a->batch, (long long)a->heads, (long long)a->seq,
                       (long long)a->head_dim, slot, be->workspace ? be->workspace_bytes : (size_t)0);
    size_t threads = (size_t)gt_get_num_threads();
    threads = threads < slots ? threads : slots;
    threads = threads < units ? threads : units;
    int wide = gt_simd_level() == GT_SIMD_AVX512;  /* 32 vector registers: wider blocks */
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
        float *mine = (float *)((char *)be->workspace + (size_t)omp_get_thread_num() * slot);
#pragma omp for schedule(dynamic, 1)
        for (size_t u = 0; u < units; u++)
            kernel(a, mine, u, wide, a->dt);
    }
    return GT_OK;
}

gt_status gt_cpu_attention_forward(gt_backend *be, const gt_attention_args *args) {
    GT_TRY(check_args(args, 0));
    size_t blocks = ((size_t)args->seq + Q_BLOCK - 1) / Q_BLOCK;
    size_t units = (size_t)args->batch * (size_t)args->heads * blocks;
    if (units == 0)
        return GT_OK;
    return run_units(be, args, GT_CPU_RUN(forward_unit), units);
}

gt_status gt_cpu_attention_backward(gt_backend *be, const gt_attention_args *args) {
    GT_TRY(check_args(args, 1));
    size_t units = (size_t)args->batch * (size_t)args->kv_heads * (args->seq > 0);
    if (units == 0)
        return GT_OK;
    return run_units(be, args, GT_CPU_RUN(backward_unit), units);
}
