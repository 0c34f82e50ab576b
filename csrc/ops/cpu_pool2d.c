/* CPU 2-D pooling of NCHW activations (ops.h, gt_pool2d_args), one (n, c) plane at a time, with
 * PyTorch's CPU arithmetic (the windows and their math are pool2d_hd.h's, shared with CUDA): MAX
 * keeps the first maximum of the window in row-major order (a NaN wins), AVG sums the window in
 * f32 in row-major order and divides by the divisor, adaptive AVG divides by the rows and then by
 * the columns of its window. Backward reads the maxima's offsets the forward saved (or recomputes
 * them from the input without them) and adds each output's gradient to its inputs, outputs in
 * row-major order: into din itself in f32, or into an f32 plane of the workspace (one per
 * thread) rounded once into din for f16/bf16. Planes run in parallel, each on one thread, so any
 * thread count gives the same bits. */
#include <omp.h>
#include <string.h>

#include "core/threads.h"
#include "ops/cnn_checks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/pool2d_hd.h"

/* The arguments are copied into a local so that stores into the output cannot alias them. */
GT_INLINE void pool_forward_body(const gt_pool2d_args *args, size_t p, gt_dtype dt) {
    const gt_pool2d_args a = *args;
    size_t plane = p * (size_t)(a.h * a.w), out = p * (size_t)(a.out_h * a.out_w);
    for (int64_t oh = 0; oh < a.out_h; oh++) {
        gt_pool2d_span r = gt_pool2d_window(&a, 0, oh, a.h, a.out_h);
        for (int64_t ow = 0; ow < a.out_w; ow++) {
            gt_pool2d_span c = gt_pool2d_window(&a, 1, ow, a.w, a.out_w);
            gt_pool2d_output(&a, plane, out + (size_t)(oh * a.out_w + ow), &r, &c, dt);
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
            gt_pool2d_span r = gt_pool2d_window(&a, 0, oh, a.h, a.out_h);
            for (int64_t ow = 0; ow < a.out_w; ow++) {
                gt_pool2d_span c = gt_pool2d_window(&a, 1, ow, a.w, a.out_w);
                float g = gt_cpu_load(a.dout, out + (size_t)(oh * a.out_w + ow), dt);
                if (!r.count || !c.count)
                    continue;
                if (a.kind == GT_POOL_MAX) {
                    acc[gt_pool2d_argmax(a.in, plane, &r, &c, a.w, dt)] += g;
                    continue;
                }
                float share = gt_pool2d_divide(&a, g, &r, &c);
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

gt_status gt_cpu_pool2d_forward(gt_backend *be, const gt_pool2d_args *a) {
    (void)be;
    GT_TRY(gt_pool2d_check(a, 0));
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
    GT_TRY(gt_pool2d_check(a, 1));
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
