/* The per-output and per-input math of 2-D pooling (ops.h, gt_pool2d_args), shared by the CPU op
 * (cpu_pool2d.c), the CUDA kernels (cuda/ops_pool2d.cu) and a host harness that runs the
 * kernels' math in CI (tests/_cnn_harness.c).
 *
 * Forward: one output from its window (gt_pool2d_window per dimension): MAX keeps the first
 * maximum in row-major window order (a NaN wins), AVG sums the window in f32 in row-major order
 * and divides. Backward: the CPU scatters each output's gradient into its inputs in output order
 * (row-major); the device gathers instead (gt_pool2d_gather: one input element adds the
 * gradients of the windows that hold it, in the same output order, from 0), so each input's
 * f32 sum has the same terms in the same order: the same bits, without atomics. The one
 * exception: a MAX window that sees no input at all (only with padding > kernel / 2, which
 * PyTorch and the layers refuse) sends its gradient nowhere on the device. */
#ifndef GT_POOL2D_HD_H
#define GT_POOL2D_HD_H

#include <math.h>

#include "ops/elem_hd.h"
#include "ops/ops.h"

/* The input positions of one output along one dimension: first, first + step, ... (count). */
typedef struct gt_pool2d_span {
    int64_t first;    /* first input position inside the input */
    int64_t step;     /* distance between positions (MAX: the dilation, else 1) */
    int64_t count;    /* positions inside the input (0 or more) */
    int64_t divisor;  /* AVG: the window's size counted per count_include_pad; ADAPTIVE: count */
} gt_pool2d_span;

GT_HD_INLINE int64_t gt_pool2d_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The span of output o along dimension d (0: rows, 1: columns) of an input of `size`. */
GT_HD_INLINE gt_pool2d_span gt_pool2d_window(const gt_pool2d_args *a, int d, int64_t o, int64_t size,
                                             int64_t outs) {
    gt_pool2d_span s = {0, 1, 0, 1};
    if (a->kind == GT_POOL_ADAPTIVE_AVG) {
        s.first = o * size / outs;
        s.count = gt_pool2d_ceil_div((o + 1) * size, outs) - s.first;
        s.divisor = s.count;
        return s;
    }
    int64_t start = o * a->stride[d] - a->padding[d], k = a->kernel[d];
    if (a->kind == GT_POOL_AVG) {
        int64_t end = start + k < size + a->padding[d] ? start + k : size + a->padding[d];
        int64_t lo = start > 0 ? start : 0, hi = end < size ? end : size;
        s.first = lo;
        s.count = hi > lo ? hi - lo : 0;
        s.divisor = a->count_include_pad ? end - start : s.count;
        return s;
    }
    int64_t dil = a->dilation[d];  /* no division without dilation: this runs once per output */
    int64_t i0 = start >= 0 ? 0 : dil == 1 ? -start : gt_pool2d_ceil_div(-start, dil);
    int64_t i1 = size <= start ? 0 : dil == 1 ? size - start : gt_pool2d_ceil_div(size - start, dil);
    i1 = i1 < k ? i1 : k;
    s.first = start + i0 * dil;
    s.step = dil;
    s.count = i1 > i0 ? i1 - i0 : 0;
    return s;
}

/* Offset in the plane of the window's maximum (the first one; a NaN wins), or of its first
 * element when none beats -inf. */
GT_HD_INLINE size_t gt_pool2d_argmax(const void *in, size_t plane, const gt_pool2d_span *r,
                                     const gt_pool2d_span *c, int64_t w, gt_dtype dt) {
    size_t best = (size_t)(r->first * w + c->first);
    float value = -INFINITY;
    for (int64_t i = 0; i < r->count; i++) {
        size_t row = (size_t)((r->first + i * r->step) * w);
        for (int64_t j = 0; j < c->count; j++) {
            size_t at = row + (size_t)(c->first + j * c->step);
            float v = gt_hd_load(in, plane + at, dt);
            int take = (v > value) | (v != v);  /* branch-free: random data mispredicts a branch */
            value = take ? v : value;
            best = take ? at : best;
        }
    }
    return best;
}

/* Sum of the window, in f32, row-major. */
GT_HD_INLINE float gt_pool2d_sum(const void *in, size_t plane, const gt_pool2d_span *r,
                                 const gt_pool2d_span *c, int64_t w, gt_dtype dt) {
    float sum = 0.0f;
    for (int64_t i = 0; i < r->count; i++) {
        size_t row = plane + (size_t)((r->first + i) * w + c->first);
        for (int64_t j = 0; j < c->count; j++)
            sum += gt_hd_load(in, row + (size_t)j, dt);
    }
    return sum;
}

/* The value every input of an AVG window receives from an output value v (and the output itself
 * is the window's sum through the same divisions). */
GT_HD_INLINE float gt_pool2d_divide(const gt_pool2d_args *a, float v, const gt_pool2d_span *r,
                                    const gt_pool2d_span *c) {
    if (a->kind == GT_POOL_ADAPTIVE_AVG)
        return v / (float)r->divisor / (float)c->divisor;
    return v / (float)(r->divisor * c->divisor);
}

/* Writes output `at` (of the plane starting at `plane` in the input) from its window r x c, and
 * for MAX its maximum's offset into argmax when saved. */
GT_HD_INLINE void gt_pool2d_output(const gt_pool2d_args *a, size_t plane, size_t at,
                                   const gt_pool2d_span *r, const gt_pool2d_span *c, gt_dtype dt) {
    float v;
    if (a->kind == GT_POOL_MAX) {
        size_t best = gt_pool2d_argmax(a->in, plane, r, c, a->w, dt);
        v = r->count && c->count ? gt_hd_load(a->in, plane + best, dt) : -INFINITY;
        if (a->argmax)
            a->argmax[at] = (int32_t)best;
    } else {
        v = gt_pool2d_divide(a, gt_pool2d_sum(a->in, plane, r, c, a->w, dt), r, c);
    }
    gt_hd_store(a->out, at, v, dt);
}

/* The outputs [*lo, *hi) along dimension d whose windows may hold input position y (a superset;
 * gt_pool2d_holds decides). */
GT_HD_INLINE void gt_pool2d_candidates(const gt_pool2d_args *a, int d, int64_t y, int64_t size,
                                       int64_t outs, int64_t *lo, int64_t *hi) {
    if (a->kind == GT_POOL_ADAPTIVE_AVG) {
        *lo = y * outs / size;
        *hi = gt_pool2d_ceil_div((y + 1) * outs, size);
    } else {
        int64_t dil = a->kind == GT_POOL_MAX ? a->dilation[d] : 1, s = a->stride[d];
        int64_t reach = y + a->padding[d] - (a->kernel[d] - 1) * dil;  /* start of the first window */
        *lo = reach > 0 ? gt_pool2d_ceil_div(reach, s) : 0;
        *hi = (y + a->padding[d]) / s + 1;
    }
    *hi = *hi < outs ? *hi : outs;
}

/* 1 when position y is one of the span's positions. */
GT_HD_INLINE int gt_pool2d_holds(const gt_pool2d_span *s, int64_t y) {
    int64_t i = y - s->first;
    return i >= 0 && i % s->step == 0 && i / s->step < s->count;
}

/* The f32 input gradient of element (y, x) of plane p: the gradients of the outputs whose
 * windows hold it (MAX: whose maximum it is), added from 0 in row-major output order. */
GT_HD_INLINE float gt_pool2d_gather(const gt_pool2d_args *a, size_t p, int64_t y, int64_t x, gt_dtype dt) {
    size_t plane = p * (size_t)(a->h * a->w), out = p * (size_t)(a->out_h * a->out_w);
    size_t at = (size_t)(y * a->w + x);
    int64_t oh0, oh1, ow0, ow1;
    gt_pool2d_candidates(a, 0, y, a->h, a->out_h, &oh0, &oh1);
    gt_pool2d_candidates(a, 1, x, a->w, a->out_w, &ow0, &ow1);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh < oh1; oh++) {
        gt_pool2d_span r = gt_pool2d_window(a, 0, oh, a->h, a->out_h);
        if (!gt_pool2d_holds(&r, y))
            continue;
        for (int64_t ow = ow0; ow < ow1; ow++) {
            gt_pool2d_span c = gt_pool2d_window(a, 1, ow, a->w, a->out_w);
            if (!gt_pool2d_holds(&c, x))
                continue;
            size_t k = out + (size_t)(oh * a->out_w + ow);
            float g = gt_hd_load(a->dout, k, dt);
            if (a->kind != GT_POOL_MAX)
                acc += gt_pool2d_divide(a, g, &r, &c);
            else if ((a->argmax ? (size_t)a->argmax[k] : gt_pool2d_argmax(a->in, plane, &r, &c, a->w, dt)) == at)
                acc += g;
        }
    }
    return acc;
}

#endif
