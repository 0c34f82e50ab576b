/* CPU 2-D convolution (ops.h, gt_conv2d_args) as im2col + GEMM through the CPU GEMM path
 * (cpu_gemm.c: oneDNN on x86-64, OpenBLAS elsewhere), so it runs wherever the GEMMs do.
 *
 * For a sample n and group g the column matrix col (K, L), K = C/groups KH KW rows (c, i, j) and
 * L = OH OW columns (y, x), holds in[n, g C/groups + c, y sh - ph + i dh, x sw - pw + j dw] (0 in
 * the padding). Then, with W_g the (O/groups, K) rows of the weight and dout_g likewise:
 *   forward   out_g (O/groups, L) = W_g col + bias
 *   backward  dW_g (+)= dout_g col^T;  dcol = W_g^T dout_g, scattered back (col2im) into din.
 * col is built a tile of output rows at a time (at most TILE_ELEMS elements), so it stays small
 * and in cache; a 1x1 kernel with stride 1 and no padding uses the input itself as col. With
 * strides 1 and OW = W (a "same" convolution) the valid part of a row (c, i, j) of a tile is one
 * run of x, copied at once (and scattered back at once by col2im) with its padding fixed up.
 *
 * Threads: the forward runs one sample per unit of work, the backward one chunk of samples; each
 * unit runs on one thread with that thread's slot of the workspace (as many threads as the
 * workspace has slots), its GEMMs single-threaded inside the parallel region (when one thread
 * runs everything, they are split over the pool as any GEMM). Determinism: a unit's arithmetic
 * is fixed by the shapes (the GEMMs are cut by shape, never by thread count: cpu_gemm_split.c),
 * din scatters in a fixed order, and each batch chunk adds its weight gradients into a partial of
 * its own; the partials are summed in chunk order. The chunks depend on the batch size only, so
 * every thread count gives the same bits. Precision: GEMMs accumulate in f32 and write f32 (out
 * and dcol in half mode go through f32 scratch), so out and din are rounded once. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/cast.h"
#include "core/threads.h"
#include "ops/checks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

enum {
    TILE_ELEMS = 1 << 17,  /* elements of a column tile ((K or O/groups) x columns) at most, unless
                              one output row of the larger is more */
    MAX_CHUNKS = 16,       /* batch chunks of the backward (weight-gradient partials) at most */
};
#define PARTIAL_BYTES_MAX ((size_t)32 << 20)  /* bytes of all weight-gradient partials at most */

/* A convolution's sizes as used by the kernels (checked by gt_conv2d_check first). */
typedef struct conv_geom {
    size_t n, c, h, w, o;        /* batch, input channels, input rows/columns, output channels */
    size_t cg, og;               /* input and output channels per group */
    size_t groups;               /* groups */
    size_t kh, kw, sh, sw;       /* kernel, stride */
    size_t ph, pw, dh, dw;       /* padding, dilation */
    size_t oh, ow;               /* output rows, columns */
    size_t hw, l, k;             /* H W; columns of col (OH OW); rows of col (cg KH KW) */
    size_t tile_rows;            /* output rows per column tile */
    size_t chunks;               /* batch chunks of the backward, each with a weight partial */
    size_t elem;                 /* bytes of an activation element */
    int direct;                  /* 1: 1x1 kernel, stride 1, no padding (col is the input) */
} conv_geom;

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static conv_geom geometry(const gt_conv2d_args *a) {
    conv_geom g = {
        .n = (size_t)a->batch, .c = (size_t)a->in_channels, .h = (size_t)a->height,
        .w = (size_t)a->width, .o = (size_t)a->out_channels, .groups = (size_t)a->groups,
        .kh = (size_t)a->kernel_h, .kw = (size_t)a->kernel_w, .sh = (size_t)a->stride_h,
        .sw = (size_t)a->stride_w, .ph = (size_t)a->pad_h, .pw = (size_t)a->pad_w,
        .dh = (size_t)a->dilation_h, .dw = (size_t)a->dilation_w,
        .oh = (size_t)gt_conv2d_out_h(a), .ow = (size_t)gt_conv2d_out_w(a),
        .elem = gt_dtype_size(a->dt),
    };
    g.cg = g.c / g.groups, g.og = g.o / g.groups;
    g.hw = g.h * g.w, g.l = g.oh * g.ow, g.k = g.cg * g.kh * g.kw;
    g.direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
    size_t width = (g.k > g.og ? g.k : g.og) * g.ow;
    size_t max_rows = width < TILE_ELEMS ? TILE_ELEMS / width : 1;
    size_t tiles = (g.oh + max_rows - 1) / max_rows;
    g.tile_rows = (g.oh + tiles - 1) / tiles;  /* even tiles */
    size_t partial = gt_size_mul_sat(g.o * g.k, sizeof(float));
    g.chunks = min_size(min_size(g.n, MAX_CHUNKS), 1 + PARTIAL_BYTES_MAX / partial);
    return g;
}

/* Columns of a full tile. */
static size_t tile_cols(const conv_geom *g) { return g->tile_rows * g->ow; }

/* ------------------------------------------------------------ GEMMs ---------------------- */

/* out tile (og, cols) f32 at ldc = W_g (og, K) @ B (K, cols) at ldb. */
static gt_gemm_args forward_gemm(const conv_geom *g, gt_dtype dt, const void *w, const void *b,
                                 size_t ldb, float *c, size_t ldc, size_t cols) {
    gt_gemm_args args = {.m = (int64_t)g->og, .n = (int64_t)cols, .k = (int64_t)g->k, .alpha = 1.0f,
                         .a = w, .a_dt = dt, .lda = (int64_t)g->k, .b = b, .b_dt = dt,
                         .ldb = (int64_t)ldb, .c = c, .c_dt = GT_F32, .ldc = (int64_t)ldc, .batch = 1};
    return args;
}

/* dW_g (og, K) f32 (+)= dout tile (og, cols) at lda @ B^T, B (K, cols) at ldb. */
static gt_gemm_args weight_gemm(const conv_geom *g, gt_dtype dt, const void *dout, size_t lda,
                                const void *b, size_t ldb, float *dw, int add, size_t cols) {
    gt_gemm_args args = {.trans_b = 1, .m = (int64_t)g->og, .n = (int64_t)g->k, .k = (int64_t)cols,
                         .alpha = 1.0f, .a = dout, .a_dt = dt, .lda = (int64_t)lda, .b = b,
                         .b_dt = dt, .ldb = (int64_t)ldb, .beta = add ? 1.0f : 0.0f, .c = dw,
                         .c_dt = GT_F32, .ldc = (int64_t)g->k, .batch = 1};
    return args;
}

/* dcol (K, cols) in c_dt at ldc = W_g^T (K, og) @ dout tile (og, cols) at ldb. */
static gt_gemm_args input_gemm(const conv_geom *g, gt_dtype dt, const void *w, const void *dout,
                               size_t ldb, void *c, gt_dtype c_dt, size_t ldc, size_t cols) {
    gt_gemm_args args = {.trans_a = 1, .m = (int64_t)g->k, .n = (int64_t)cols, .k = (int64_t)g->og,
                         .alpha = 1.0f, .a = w, .a_dt = dt, .lda = (int64_t)g->k, .b = dout,
                         .b_dt = dt, .ldb = (int64_t)ldb, .c = c, .c_dt = c_dt, .ldc = (int64_t)ldc,
                         .batch = 1};
    return args;
}

static size_t max_bytes(size_t a, size_t b) { return a > b ? a : b; }

/* The workspace the GEMMs of one unit need (the largest of any tile width). */
static size_t gemm_scratch(const conv_geom *g, gt_dtype dt, int backward) {
    size_t full = tile_cols(g), last = (g->oh - (g->oh - 1) / g->tile_rows * g->tile_rows) * g->ow;
    size_t widths[2] = {full, last}, bytes = 0;
    for (int t = 0; t < 2; t++) {
        size_t cols = widths[t], ld_in = g->direct ? g->l : cols;
        if (!backward) {
            gt_gemm_args f = forward_gemm(g, dt, NULL, NULL, ld_in, NULL, cols, cols);
            bytes = max_bytes(bytes, gt_cpu_gemm_workspace_bytes(&f));
            continue;
        }
        for (int add = 0; add <= 1; add++) {
            gt_gemm_args w = weight_gemm(g, dt, NULL, g->l, NULL, ld_in, NULL, add, cols);
            bytes = max_bytes(bytes, gt_cpu_gemm_workspace_bytes(&w));
        }
        gt_gemm_args d = g->direct ? input_gemm(g, dt, NULL, NULL, g->l, NULL, dt, g->l, cols)
                                   : input_gemm(g, dt, NULL, NULL, g->l, NULL, GT_F32, cols, cols);
        bytes = max_bytes(bytes, gt_cpu_gemm_workspace_bytes(&d));
    }
    return bytes;
}

/* ------------------------------------------------------------ slots ---------------------- */

/* Where a thread's scratch lies in its slot (bytes from the slot's start; 0 size: unused). */
typedef struct slot_layout {
    size_t col;     /* (K, tile) dt column tile (not direct), at the slot's start */
    size_t acc;     /* forward: (og, tile) f32 output tile (half dt); backward: (K, tile) f32 dcol
                       (not direct) */
    size_t din;     /* backward: (cg, H, W) f32 input-gradient accumulator (half dt, not direct) */
    size_t gemm;    /* the GEMMs' workspace */
    size_t total;   /* slot bytes, >= GT_ALIGN; SIZE_MAX when the sizes overflow */
} slot_layout;

static slot_layout layout_of(const conv_geom *g, gt_dtype dt, int backward) {
    size_t tile = tile_cols(g);
    size_t col = g->direct ? 0 : gt_size_mul_sat(g->k * tile, g->elem);
    size_t acc = backward ? (g->direct ? 0 : gt_size_mul_sat(g->k * tile, sizeof(float)))
                          : (dt == GT_F32 ? 0 : gt_size_mul_sat(g->og * tile, sizeof(float)));
    size_t din = backward && !g->direct && dt != GT_F32 ? gt_size_mul_sat(g->cg, g->hw * sizeof(float))
                                                        : 0;
    slot_layout s = {0};
    s.acc = gt_align_up(col);  /* col first */
    s.din = gt_size_add_sat(s.acc, gt_align_up(acc));
    s.gemm = gt_size_add_sat(s.din, gt_align_up(din));
    s.total = gt_size_add_sat(s.gemm, gt_align_up(gemm_scratch(g, dt, backward)));
    s.total = max_bytes(gt_align_up(s.total), GT_ALIGN);
    return s;
}

/* Bytes of the weight-gradient partials of chunks 1.. (chunk 0 adds into dweight itself). */
static size_t partial_bytes(const conv_geom *g) {
    return gt_align_up(gt_size_mul_sat((g->chunks - 1) * g->o, g->k * sizeof(float)));
}

size_t gt_cpu_conv2d_workspace_bytes(const gt_conv2d_args *args, int threads) {
    gt_conv2d_args sizes = *args;
    sizes.batch = 0;  /* the sizes only: the pointers may be unset */
    if (args->batch == 0 || gt_conv2d_check(&sizes, 0) != GT_OK) {
        gt_clear_error();
        return 0;
    }
    conv_geom g = geometry(args);
    size_t slot = max_bytes(layout_of(&g, args->dt, 0).total, layout_of(&g, args->dt, 1).total);
    return gt_size_add_sat(partial_bytes(&g), gt_size_mul_sat(slot, threads > 1 ? (size_t)threads : 1));
}

/* ------------------------------------------------------------ im2col / col2im ------------ */

/* Output columns [lo, hi) whose input column x sw + base (base = j dw - pw) lies in [0, W). */
typedef struct col_span {
    size_t lo, hi;   /* valid output columns */
    int64_t base;    /* input column of output column 0 */
} col_span;

static col_span span_of(const conv_geom *g, size_t j) {
    col_span s = {0, 0, (int64_t)(j * g->dw) - (int64_t)g->pw};
    int64_t sw = (int64_t)g->sw, lo = s.base >= 0 ? 0 : (-s.base + sw - 1) / sw;
    int64_t last = (int64_t)g->w - 1 - s.base;  /* output columns with x sw <= last fit */
    int64_t hi = last < 0 ? 0 : last / sw + 1;
    s.hi = (size_t)(hi < (int64_t)g->ow ? hi : (int64_t)g->ow);
    s.lo = (size_t)lo < s.hi ? (size_t)lo : s.hi;
    return s;
}

/* Input column of output column x (inside the span). */
static size_t input_col(const conv_geom *g, const col_span *s, size_t x) {
    return (size_t)((int64_t)(x * g->sw) + s->base);
}

/* dst[0, ow) = src[x sw + base] over the span, zeros elsewhere (elements of g->elem bytes). */
static void gather_row(char *dst, const char *src, const conv_geom *g, const col_span *s) {
    size_t e = g->elem, count = s->hi - s->lo;
    memset(dst, 0, s->lo * e);
    if (count > 0) {
        const char *in = src + input_col(g, s, s->lo) * e;  /* input of output column lo */
        char *to = dst + s->lo * e;
        if (g->sw == 1)
            memcpy(to, in, count * e);
        else if (e == 4)
            for (size_t x = 0; x < count; x++)
                ((uint32_t *)to)[x] = ((const uint32_t *)in)[x * g->sw];
        else
            for (size_t x = 0; x < count; x++)
                ((uint16_t *)to)[x] = ((const uint16_t *)in)[x * g->sw];
    }
    memset(dst + s->hi * e, 0, (g->ow - s->hi) * e);
}

/* Input row of output row y for kernel row i, or -1 in the padding. */
static int64_t input_row(const conv_geom *g, size_t y, size_t i) {
    int64_t row = (int64_t)(y * g->sh + i * g->dh) - (int64_t)g->ph;
    return row < (int64_t)g->h ? row : -1;
}

/* Zeros elements [from, to) of each of `rows` rows of ow elements of e bytes at dst. */
static void zero_cols(char *dst, const conv_geom *g, size_t rows, size_t from, size_t to) {
    size_t ow = g->ow;
    if (g->elem == 4)
        for (size_t y = 0; y < rows; y++)
            for (size_t x = from; x < to; x++)
                ((uint32_t *)dst)[y * ow + x] = 0;
    else
        for (size_t y = 0; y < rows; y++)
            for (size_t x = from; x < to; x++)
                ((uint16_t *)dst)[y * ow + x] = 0;
}

/* Output rows [a, b) of [r0, r0 + rows) whose input row for kernel row i lies in [0, H). */
static void valid_rows(const conv_geom *g, size_t r0, size_t rows, size_t i, size_t *a, size_t *b) {
    *a = 0;
    while (*a < rows && input_row(g, r0 + *a, i) < 0)  /* the valid rows are one run */
        (*a)++;
    *b = *a;
    while (*b < rows && input_row(g, r0 + *b, i) >= 0)
        (*b)++;
}

/* One (c, i, j) row of a column tile, strides 1 and ow == W: input rows lie back to back in x as
 * output rows do in dst, so the valid run is one copy; the padding columns it spans (or, where
 * the span is empty, every column) are zeroed after. */
static void gather_block(char *dst, const char *plane, const conv_geom *g, size_t r0, size_t rows,
                         size_t i, const col_span *s) {
    size_t e = g->elem, a, b;
    valid_rows(g, r0, rows, i, &a, &b);
    memset(dst, 0, a * g->ow * e);
    if (b > a && s->hi > s->lo) {
        size_t first = a * g->ow + s->lo, last = (b - 1) * g->ow + s->hi;  /* dst elements */
        const char *src = plane + ((size_t)input_row(g, r0 + a, i) * g->w + input_col(g, s, s->lo)) * e;
        memcpy(dst + first * e, src, (last - first) * e);
        zero_cols(dst + a * g->ow * e, g, b - a, 0, s->lo);
        zero_cols(dst + a * g->ow * e, g, b - a, s->hi, g->ow);
    } else {
        memset(dst + a * g->ow * e, 0, (b - a) * g->ow * e);
    }
    memset(dst + b * g->ow * e, 0, (rows - b) * g->ow * e);
}

/* col (K, rows ow) = the column tile of output rows [r0, r0 + rows) of x (cg, H, W). */
static void im2col_tile(char *col, const char *x, const conv_geom *g, size_t r0, size_t rows) {
    size_t e = g->elem, cols = rows * g->ow;
    int block = g->sh == 1 && g->sw == 1 && g->ow == g->w;
    for (size_t c = 0; c < g->cg; c++)
        for (size_t i = 0; i < g->kh; i++)
            for (size_t j = 0; j < g->kw; j++) {
                char *dst = col + ((c * g->kh + i) * g->kw + j) * cols * e;
                col_span s = span_of(g, j);
                if (block) {
                    gather_block(dst, x + c * g->hw * e, g, r0, rows, i, &s);
                    continue;
                }
                for (size_t y = 0; y < rows; y++) {
                    int64_t row = input_row(g, r0 + y, i);
                    if (row < 0)
                        memset(dst + y * g->ow * e, 0, g->ow * e);
                    else
                        gather_row(dst + y * g->ow * e, x + (c * g->hw + (size_t)row * g->w) * e, g, &s);
                }
            }
}

/* acc (cg, H, W) += one (c, i, j) row of dcol (rows ow), strides 1 and ow == W (the layout of
 * gather_block): the padding columns of the valid rows are zeroed in dcol, then the valid run is
 * one contiguous sum (where it crosses a row's edge it adds those zeros). */
static void scatter_block(float *plane, float *drow, const conv_geom *g, size_t r0, size_t rows,
                          size_t i, const col_span *s) {
    size_t a, b;
    valid_rows(g, r0, rows, i, &a, &b);
    if (b == a || s->hi == s->lo)
        return;
    for (size_t y = a; y < b; y++) {
        for (size_t x = 0; x < s->lo; x++)
            drow[y * g->ow + x] = 0.0f;
        for (size_t x = s->hi; x < g->ow; x++)
            drow[y * g->ow + x] = 0.0f;
    }
    size_t first = a * g->ow + s->lo, count = (b - 1) * g->ow + s->hi - first;
    float *dst = plane + (size_t)input_row(g, r0 + a, i) * g->w + input_col(g, s, s->lo);
    const float *src = drow + first;
    for (size_t t = 0; t < count; t++)
        dst[t] += src[t];
}

/* acc (cg, H, W) += dcol (K, rows ow) scattered back to the input positions it was gathered
 * from, in a fixed order (dcol is scratch: scatter_block zeroes parts of it). */
static void col2im_tile(float *acc, float *dcol, const conv_geom *g, size_t r0, size_t rows) {
    size_t cols = rows * g->ow;
    int block = g->sh == 1 && g->sw == 1 && g->ow == g->w;
    for (size_t c = 0; c < g->cg; c++)
        for (size_t i = 0; i < g->kh; i++)
            for (size_t j = 0; j < g->kw; j++) {
                float *src = dcol + ((c * g->kh + i) * g->kw + j) * cols;
                col_span s = span_of(g, j);
                if (block) {
                    scatter_block(acc + c * g->hw, src, g, r0, rows, i, &s);
                    continue;
                }
                for (size_t y = 0; y < rows; y++) {
                    int64_t row = input_row(g, r0 + y, i);
                    if (row < 0)
                        continue;
                    if (s.lo == s.hi)
                        continue;
                    float *dst = acc + c * g->hw + (size_t)row * g->w + input_col(g, &s, s.lo);
                    const float *d = src + y * g->ow + s.lo;
                    if (g->sw == 1)
                        for (size_t x = 0; x < s.hi - s.lo; x++)
                            dst[x] += d[x];
                    else
                        for (size_t x = 0; x < s.hi - s.lo; x++)
                            dst[x * g->sw] += d[x];
                }
            }
}

/* ------------------------------------------------------------ units ---------------------- */

/* The CPU backend a unit's GEMMs run with: its slot's GEMM scratch. */
static gt_backend slot_backend(char *slot, const slot_layout *s) {
    gt_backend be = {gt_cpu_ops(), gt_cpu_device(), slot + s->gemm, s->total - s->gemm, NULL};
    return be;
}

/* Element offset of (sample n, channel ch) in an (N, channels, plane) tensor. */
static size_t plane_at(size_t n, size_t channels, size_t ch, size_t plane) {
    return (n * channels + ch) * plane;
}

/* out tile rows (og, cols) at ldc L = f32 values (ldv) + bias, rounded once into dt. */
static gt_status store_tile(void *out, const float *values, size_t ldv, const float *bias,
                            const conv_geom *g, size_t cols, gt_dtype dt) {
    for (size_t o = 0; o < g->og; o++) {
        float *v = (float *)values + o * ldv;
        if (bias)
            for (size_t x = 0; x < cols; x++)
                v[x] += bias[o];
        if (dt != GT_F32)
            GT_TRY(gt_cast(v, GT_F32, (char *)out + o * g->l * g->elem, dt, cols));
    }
    return GT_OK;
}

/* Forward of sample n: every group, tile by tile. */
static gt_status forward_unit(const gt_conv2d_args *a, const conv_geom *g, size_t n, char *slot,
                              float *partials) {
    (void)partials;
    slot_layout s = layout_of(g, a->dt, 0);
    gt_backend be = slot_backend(slot, &s);
    for (size_t grp = 0; grp < g->groups; grp++) {
        const char *x = (const char *)a->x + plane_at(n, g->c, grp * g->cg, g->hw) * g->elem;
        char *out = (char *)a->out + plane_at(n, g->o, grp * g->og, g->l) * g->elem;
        const void *w = (const char *)a->weight + grp * g->og * g->k * g->elem;
        const float *bias = a->bias ? a->bias + grp * g->og : NULL;
        for (size_t r0 = 0; r0 < g->oh; r0 += g->tile_rows) {
            size_t rows = min_size(g->tile_rows, g->oh - r0), cols = rows * g->ow, l0 = r0 * g->ow;
            const char *b = g->direct ? x + l0 * g->elem : slot + s.col;
            if (!g->direct)
                im2col_tile(slot + s.col, x, g, r0, rows);
            float *c = a->dt == GT_F32 ? (float *)out + l0 : (float *)(slot + s.acc);
            size_t ldc = a->dt == GT_F32 ? g->l : cols;
            gt_gemm_args args = forward_gemm(g, a->dt, w, b, g->direct ? g->l : cols, c, ldc, cols);
            GT_TRY(gt_cpu_gemm(&be, &args));
            GT_TRY(store_tile(out + l0 * g->elem, c, ldc, bias, g, cols, a->dt));
        }
    }
    return GT_OK;
}

/* Samples [first, end) of backward chunk `chunk`. */
static void chunk_range(const conv_geom *g, size_t chunk, size_t *first, size_t *end) {
    *first = chunk * g->n / g->chunks;
    *end = (chunk + 1) * g->n / g->chunks;
}

/* The weight gradients chunk `chunk` adds into: dweight for chunk 0, else its partial. */
static float *chunk_dweight(const gt_conv2d_args *a, const conv_geom *g, size_t chunk,
                            float *partials) {
    return chunk == 0 ? a->dweight : partials + (chunk - 1) * g->o * g->k;
}

/* The input-gradient part of one tile: dcol = W_g^T dout tile, scattered into acc (or, direct,
 * written into din's tile). */
static gt_status input_tile(const gt_conv2d_args *a, const conv_geom *g, gt_backend *be,
                            const slot_layout *s, char *slot, const void *w, const char *dout,
                            char *din, float *acc, size_t r0, size_t rows) {
    size_t cols = rows * g->ow, l0 = r0 * g->ow;
    if (g->direct) {
        gt_gemm_args args = input_gemm(g, a->dt, w, dout + l0 * g->elem, g->l, din + l0 * g->elem,
                                       a->dt, g->l, cols);
        return gt_cpu_gemm(be, &args);
    }
    float *dcol = (float *)(slot + s->acc);
    gt_gemm_args args = input_gemm(g, a->dt, w, dout + l0 * g->elem, g->l, dcol, GT_F32, cols, cols);
    GT_TRY(gt_cpu_gemm(be, &args));
    col2im_tile(acc, dcol, g, r0, rows);
    return GT_OK;
}

/* Backward of sample n, group grp: dW_g (+)= (add) and din's channels of the group. */
static gt_status backward_group(const gt_conv2d_args *a, const conv_geom *g, size_t n, size_t grp,
                                char *slot, float *dweight, int add) {
    slot_layout s = layout_of(g, a->dt, 1);
    gt_backend be = slot_backend(slot, &s);
    const char *x = a->x ? (const char *)a->x + plane_at(n, g->c, grp * g->cg, g->hw) * g->elem : NULL;
    const char *dout = (const char *)a->dout + plane_at(n, g->o, grp * g->og, g->l) * g->elem;
    const void *w = a->weight ? (const char *)a->weight + grp * g->og * g->k * g->elem : NULL;
    char *din = a->dx ? (char *)a->dx + plane_at(n, g->c, grp * g->cg, g->hw) * g->elem : NULL;
    float *acc = a->dt == GT_F32 ? (float *)din : (float *)(slot + s.din);
    if (din && !g->direct)
        memset(acc, 0, g->cg * g->hw * sizeof(float));
    for (size_t r0 = 0; r0 < g->oh; r0 += g->tile_rows) {
        size_t rows = min_size(g->tile_rows, g->oh - r0), cols = rows * g->ow, l0 = r0 * g->ow;
        if (dweight) {
            const char *b = g->direct ? x + l0 * g->elem : slot + s.col;
            if (!g->direct)
                im2col_tile(slot + s.col, x, g, r0, rows);
            gt_gemm_args args = weight_gemm(g, a->dt, dout + l0 * g->elem, g->l, b,
                                            g->direct ? g->l : cols, dweight + grp * g->og * g->k,
                                            add || r0 > 0, cols);
            GT_TRY(gt_cpu_gemm(&be, &args));
        }
        if (din)
            GT_TRY(input_tile(a, g, &be, &s, slot, w, dout, din, acc, r0, rows));
    }
    if (din && !g->direct && a->dt != GT_F32)
        return gt_cast(acc, GT_F32, din, a->dt, g->cg * g->hw);
    return GT_OK;
}

/* Backward of chunk `chunk`: its samples in order, each group's weight gradients added into the
 * chunk's partial (the first sample writes it, or adds when chunk 0 accumulates into dweight). */
static gt_status chunk_unit(const gt_conv2d_args *a, const conv_geom *g, size_t chunk, char *slot,
                               float *partials) {
    size_t first, end;
    chunk_range(g, chunk, &first, &end);
    float *dweight = a->dweight ? chunk_dweight(a, g, chunk, partials) : NULL;
    int add_first = chunk == 0 && a->accumulate;
    for (size_t n = first; n < end; n++)
        for (size_t grp = 0; grp < g->groups; grp++)
            GT_TRY(backward_group(a, g, n, grp, slot, dweight, n > first || add_first));
    return GT_OK;
}

/* Input gradient only, of sample n. */
static gt_status input_unit(const gt_conv2d_args *a, const conv_geom *g, size_t n, char *slot,
                            float *partials) {
    (void)partials;
    for (size_t grp = 0; grp < g->groups; grp++)
        GT_TRY(backward_group(a, g, n, grp, slot, NULL, 0));
    return GT_OK;
}

typedef gt_status (*unit_fn)(const gt_conv2d_args *a, const conv_geom *g, size_t unit, char *slot,
                             float *partials);

/* Runs `units` units of fn, each on one thread with that thread's slot of the workspace (after
 * `reserved` bytes of partials). */
static gt_status run_units(gt_backend *be, const gt_conv2d_args *a, const conv_geom *g, unit_fn fn,
                           size_t units, int backward, size_t reserved) {
    size_t slot = layout_of(g, a->dt, backward).total;
    size_t room = be->workspace && be->workspace_bytes > reserved ? be->workspace_bytes - reserved : 0;
    size_t slots = slot == SIZE_MAX || reserved == SIZE_MAX ? 0 : room / slot;
    if (slots < 1)
        return GT_FAIL(GT_ERR_VALUE, "workspace: conv2d (batch %zu, %zu -> %zu channels, %zux%zu "
                       "kernel, %zux%zu input) needs %zu bytes per thread after %zu, got %zu", g->n, g->c,
                       g->o, g->kh, g->kw, g->h, g->w, slot, reserved,
                       be->workspace ? be->workspace_bytes : (size_t)0);
    char *base = (char *)be->workspace + reserved;
    float *partials = (float *)be->workspace;
    size_t threads = min_size(min_size((size_t)gt_get_num_threads(), slots), units);
    if (threads <= 1) {  /* one thread: the GEMMs split over the pool themselves */
        for (size_t u = 0; u < units; u++)
            GT_TRY(fn(a, g, u, base, partials));
        return GT_OK;
    }
    gt_status failed = GT_OK;
    char message[512] = "";
#pragma omp parallel num_threads((int)threads)
    {
        char *mine = base + (size_t)omp_get_thread_num() * slot;
#pragma omp for schedule(dynamic, 1)
        for (size_t u = 0; u < units; u++) {
            gt_status status = fn(a, g, u, mine, partials);
            if (status != GT_OK) {
#pragma omp critical(gt_conv2d_failure)
                if (failed == GT_OK) {  /* the message is on this worker's thread: copy it */
                    failed = status;
                    snprintf(message, sizeof message, "%s", gt_error_message());
                }
            }
        }
    }
    if (failed != GT_OK)
        return GT_FAIL(failed, "conv2d: %s", message);
    return GT_OK;
}

/* ------------------------------------------------------------ reductions ----------------- */

/* Sum of a row of n dt values: 16 f32 lanes, summed in lane order (the same on every CPU). */
static double row_sum(const void *row, size_t n, gt_dtype dt) {
    float lanes[16] = {0};
    size_t i = 0;
    if (dt == GT_F32)  /* the same sums, 16 lanes at a time (vectorized) */
        for (; i + 16 <= n; i += 16)
            for (int j = 0; j < 16; j++)
                lanes[j] += ((const float *)row)[i + j];
    for (; i < n; i++)
        lanes[i % 16] += gt_cpu_load(row, i, dt);
    double sum = 0.0;
    for (int j = 0; j < 16; j++)
        sum += lanes[j];
    return sum;
}

/* dbias[o] (+)= sum over samples and positions of dout[n, o], each channel in a fixed order. */
static void bias_gradient(const gt_conv2d_args *a, const conv_geom *g) {
#pragma omp parallel for schedule(static) if (g->n * g->o * g->l > GT_CPU_CHUNK)
    for (size_t o = 0; o < g->o; o++) {
        double sum = 0.0;
        for (size_t n = 0; n < g->n; n++)
            sum += row_sum((const char *)a->dout + plane_at(n, g->o, o, g->l) * g->elem, g->l, a->dt);
        a->dbias[o] = a->accumulate ? a->dbias[o] + (float)sum : (float)sum;
    }
}

/* dweight += the partials of chunks 1.. in chunk order, element by element. */
static void sum_partials(float *dweight, const float *partials, size_t count, size_t numel) {
#pragma omp parallel for schedule(static) if (numel * count > GT_CPU_CHUNK)
    for (size_t i = 0; i < numel; i++) {
        float sum = dweight[i];
        for (size_t p = 0; p < count; p++)
            sum += partials[p * numel + i];
        dweight[i] = sum;
    }
}

/* ------------------------------------------------------------ entry points --------------- */

gt_status gt_cpu_conv2d_forward(gt_backend *be, const gt_conv2d_args *args) {
    GT_TRY(gt_conv2d_check(args, 0));
    if (args->batch == 0)
        return GT_OK;
    conv_geom g = geometry(args);
    return run_units(be, args, &g, forward_unit, g.n, 0, 0);
}

gt_status gt_cpu_conv2d_backward(gt_backend *be, const gt_conv2d_args *args) {
    GT_TRY(gt_conv2d_check(args, 1));
    if (args->batch == 0) {
        size_t wsize = (size_t)(args->out_channels / args->groups * args->in_channels);
        if (args->dweight && !args->accumulate)  /* a sum over no samples */
            memset(args->dweight, 0, wsize * (size_t)(args->kernel_h * args->kernel_w) * sizeof(float));
        if (args->dbias && !args->accumulate)
            memset(args->dbias, 0, (size_t)args->out_channels * sizeof(float));
        return GT_OK;
    }
    conv_geom g = geometry(args);
    if (args->dbias)
        bias_gradient(args, &g);
    if (!args->dweight && !args->dx)
        return GT_OK;
    if (!args->dweight)
        return run_units(be, args, &g, input_unit, g.n, 1, 0);
    GT_TRY(run_units(be, args, &g, chunk_unit, g.chunks, 1, partial_bytes(&g)));
    if (g.chunks > 1)
        sum_partials(args->dweight, (const float *)be->workspace, g.chunks - 1, g.o * g.k);
    return GT_OK;
}
