/* CPU 2-D pooling of NCHW activations (ops.h, gt_pool2d_args), one (n, c) plane at a time, with
 * PyTorch's CPU arithmetic: MAX keeps the first maximum of the window in row-major order (a NaN
 * wins), AVG sums the window in f32 in row-major order and divides by the divisor, adaptive AVG
 * divides by the rows and then by the columns of its window. Backward reads the maxima's offsets
 * the forward saved (or recomputes them from the input without them) and adds each output's
 * gradient to its inputs, outputs in
 * row-major order: into din itself in f32, or into an f32 plane of the workspace (one per
 * thread) rounded once into din for f16/bf16. Planes run in parallel, each on one thread, so any
 * thread count gives the same bits. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/threads.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

/* The input positions of one output along one dimension: first, first + step, ... (count). */
typedef struct pool_span {
    int64_t first;    /* first input position inside the input */
    int64_t step;     /* distance between positions (MAX: the dilation, else 1) */
    int64_t count;    /* positions inside the input (0 or more) */
    int64_t divisor;  /* AVG: the window's size counted per count_include_pad; ADAPTIVE: count */
} pool_span;

GT_INLINE int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The span of output o along dimension d (0: rows, 1: columns) of an input of `size`. */
GT_INLINE pool_span pool_window(const gt_pool2d_args *a, int d, int64_t o, int64_t size, int64_t outs) {
    pool_span s = {0, 1, 0, 1};
    if (a->kind == GT_POOL_ADAPTIVE_AVG) {
        s.first = o * size / outs;
        s.count = ceil_div((o + 1) * size, outs) - s.first;
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
    int64_t i0 = start >= 0 ? 0 : dil == 1 ? -start : ceil_div(-start, dil);
    int64_t i1 = size <= start ? 0 : dil == 1 ? size - start : ceil_div(size - start, dil);
    i1 = i1 < k ? i1 : k;
    s.first = start + i0 * dil;
    s.step = dil;
    s.count = i1 > i0 ? i1 - i0 : 0;
    return s;
}

/* Offset in the plane of the window's maximum (the first one; a NaN wins), or of its first
 * element when none beats -inf. */
GT_INLINE size_t pool_argmax(const void *plane_in, size_t plane, const pool_span *r,
                             const pool_span *c, int64_t w, gt_dtype dt) {
    size_t best = (size_t)(r->first * w + c->first);
    float value = -INFINITY;
    for (int64_t i = 0; i < r->count; i++) {
        size_t row = (size_t)((r->first + i * r->step) * w);
        for (int64_t j = 0; j < c->count; j++) {
            size_t at = row + (size_t)(c->first + j * c->step);
            float v = gt_cpu_load(plane_in, plane + at, dt);
            int take = (v > value) | (v != v);  /* branch-free: random data mispredicts a branch */
            value = take ? v : value;
            best = take ? at : best;
        }
    }
    return best;
}

/* Sum of the window, in f32, row-major. */
GT_INLINE float pool_sum(const void *in, size_t plane, const pool_span *r, const pool_span *c,
                         int64_t w, gt_dtype dt) {
    float sum = 0.0f;
    for (int64_t i = 0; i < r->count; i++) {
        size_t row = plane + (size_t)((r->first + i) * w + c->first);
        for (int64_t j = 0; j < c->count; j++)
            sum += gt_cpu_load(in, row + (size_t)j, dt);
    }
    return sum;
}

/* The value every input of an AVG window receives from an output value v (and the output itself
 * is the window's sum through the same divisions). */
GT_INLINE float pool_divide(const gt_pool2d_args *a, float v, const pool_span *r, const pool_span *c) {
    if (a->kind == GT_POOL_ADAPTIVE_AVG)
        return v / (float)r->divisor / (float)c->divisor;
    return v / (float)(r->divisor * c->divisor);
}

/* The arguments are copied into a local so that stores into the output cannot alias them. */
GT_INLINE void pool_forward_body(const gt_pool2d_args *args, size_t p, gt_dtype dt) {
    const gt_pool2d_args a = *args;
    size_t plane = p * (size_t)(a.h * a.w), out = p * (size_t)(a.out_h * a.out_w);
    for (int64_t oh = 0; oh < a.out_h; oh++) {
        pool_span r = pool_window(&a, 0, oh, a.h, a.out_h);
        for (int64_t ow = 0; ow < a.out_w; ow++) {
            pool_span c = pool_window(&a, 1, ow, a.w, a.out_w);
            size_t at = out + (size_t)(oh * a.out_w + ow);
            float v;
            if (a.kind == GT_POOL_MAX) {
                size_t best = pool_argmax(a.in, plane, &r, &c, a.w, dt);
                v = r.count && c.count ? gt_cpu_load(a.in, plane + best, dt) : -INFINITY;
                if (a.argmax)
                    a.argmax[at] = (int32_t)best;
            } else {
                v = pool_divide(&a, pool_sum(a.in, plane, &r, &c, a.w, dt), &r, &c);
            }
            gt_cpu_store(a.out, at, v, dt);
        }
    }
}
GT_CPU_KERNEL(pool_forward, (const gt_pool2d_args *a, size_t p, gt_dtype dt), a, p)

/* Adds plane p's output gradients into acc (the plane's f32 input gradient, zeroed here). */
GT_INLINE void pool_backward_body(const gt_pool2d_args *args, float *acc, size_t p, gt_dtype dt) {
    const gt_pool2d_args a = *args;
    size_t plane = p * (size_t)(a.h * a.w), out = p * (size_t)(a.out_h * a.out_w);
    memset(acc, 0, (size_t)(a.h * a.w) * sizeof(float));
    if (a.kind == GT_POOL_MAX && a.argmax) {  /* the saved maxima: a scatter in output order */
        for (size_t k = 0; k < (size_t)(a.out_h * a.out_w); k++)
            acc[a.argmax[out + k]] += gt_cpu_load(a.dout, out + k, dt);
    } else {
        for (int64_t oh = 0; oh < a.out_h; oh++) {
            pool_span r = pool_window(&a, 0, oh, a.h, a.out_h);
            for (int64_t ow = 0; ow < a.out_w; ow++) {
                pool_span c = pool_window(&a, 1, ow, a.w, a.out_w);
                float g = gt_cpu_load(a.dout, out + (size_t)(oh * a.out_w + ow), dt);
                if (!r.count || !c.count)
                    continue;
                if (a.kind == GT_POOL_MAX) {
                    acc[pool_argmax(a.in, plane, &r, &c, a.w, dt)] += g;
                    continue;
                }
                float share = pool_divide(&a, g, &r, &c);
                for (int64_t i = 0; i < r.count; i++)
                    for (int64_t j = 0; j < c.count; j++)
                        acc[(r.first + i) * a.w + c.first + j] += share;
            }
        }
    }
    if (dt != GT_F32)
        for (size_t k = 0; k < (size_t)(a.h * a.w); k++)
            gt_cpu_store(a.din, plane + k, acc[k], dt);
}
GT_CPU_KERNEL(pool_backward, (const gt_pool2d_args *a, float *acc, size_t p, gt_dtype dt), a, acc, p)

/* Bytes of one thread's f32 accumulation plane (0 in f32: din accumulates itself). */
static size_t plane_slot(const gt_pool2d_args *a) {
    if (a->dt == GT_F32 || a->h <= 0 || a->w <= 0)
        return 0;
    if ((uint64_t)a->h > SIZE_MAX / sizeof(float) / (uint64_t)a->w)
        return SIZE_MAX;
    return ((size_t)(a->h * a->w) * sizeof(float) + 63) / 64 * 64;
}

size_t gt_cpu_pool2d_workspace_bytes(const gt_pool2d_args *args, int threads) {
    size_t slot = plane_slot(args), n = threads > 1 ? (size_t)threads : 1;
    return slot > SIZE_MAX / n ? SIZE_MAX : slot * n;
}

static gt_status check_pool(const gt_pool2d_args *a, int backward) {
    const int64_t sizes[] = {a->n, a->c, a->h, a->w, a->out_h, a->out_w};
    const char *names[] = {"n", "c", "h", "w", "out_h", "out_w"};
    for (int i = 0; i < 6; i++)
        GT_TRY(gt_op_check_size(sizes[i], names[i]));
    GT_TRY(gt_op_check_dtype(a->dt, "dt"));
    if (a->kind != GT_POOL_MAX && a->kind != GT_POOL_AVG && a->kind != GT_POOL_ADAPTIVE_AVG)
        return GT_FAIL(GT_ERR_VALUE, "kind: unknown pooling %d", (int)a->kind);
    for (int d = 0; d < 2 && a->kind != GT_POOL_ADAPTIVE_AVG; d++) {
        if (a->kernel[d] < 1 || a->stride[d] < 1 || a->dilation[d] < 1 || a->padding[d] < 0)
            return GT_FAIL(GT_ERR_VALUE, "kernel, stride and dilation must be >= 1 and padding >= 0");
    }
    if (a->kind == GT_POOL_MAX && a->argmax && a->h * a->w > INT32_MAX)
        return GT_FAIL(GT_ERR_VALUE, "argmax: planes of %lld x %lld elements are beyond int32 offsets",
                       (long long)a->h, (long long)a->w);
    if (a->kind == GT_POOL_ADAPTIVE_AVG && a->n * a->c > 0 && (a->out_h < 1 || a->out_w < 1))
        return GT_FAIL(GT_ERR_VALUE, "out_h, out_w: adaptive pooling needs an output of at least 1 x 1");
    if (a->n * a->c * a->out_h * a->out_w == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(a->in, "in"));
    GT_TRY(gt_op_check_ptr(backward ? a->dout : a->out, backward ? "dout" : "out"));
    return backward ? gt_op_check_ptr(a->din, "din") : GT_OK;
}

gt_status gt_cpu_pool2d_forward(gt_backend *be, const gt_pool2d_args *a) {
    (void)be;
    GT_TRY(check_pool(a, 0));
    size_t planes = (size_t)(a->n * a->c);
    if (a->out_h * a->out_w == 0)
        return GT_OK;
    __typeof__(&pool_forward_scalar) kernel = GT_CPU_RUN(pool_forward);
#pragma omp parallel for schedule(static) if (planes > 1)
    for (size_t p = 0; p < planes; p++)
        kernel(a, p, a->dt);
    return GT_OK;
}

gt_status gt_cpu_pool2d_backward(gt_backend *be, const gt_pool2d_args *a) {
    GT_TRY(check_pool(a, 1));
    size_t planes = (size_t)(a->n * a->c), slot = plane_slot(a);
    if (planes == 0 || a->h * a->w == 0)
        return GT_OK;
    size_t slots = slot == 0 ? planes : slot == SIZE_MAX || !be->workspace ? 0 : be->workspace_bytes / slot;
    if (slots < 1)
        return GT_FAIL(GT_ERR_VALUE, "workspace: pooling backward of %lld x %lld planes needs %zu bytes "
                       "per thread, got %zu", (long long)a->h, (long long)a->w, slot,
                       be->workspace ? be->workspace_bytes : (size_t)0);
    size_t threads = (size_t)gt_get_num_threads();
    threads = threads < slots ? threads : slots;
    threads = threads < planes ? threads : planes;
    __typeof__(&pool_backward_scalar) kernel = GT_CPU_RUN(pool_backward);
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
        float *mine = slot ? (float *)((char *)be->workspace + (size_t)omp_get_thread_num() * slot) : NULL;
#pragma omp for schedule(static)
        for (size_t p = 0; p < planes; p++)
            kernel(a, mine ? mine : (float *)a->din + p * (size_t)(a->h * a->w), p, a->dt);
    }
    return GT_OK;
}
