/* The element math of the rotary position embedding (ops.h, gt_rope_args), shared by the CPU op
 * (cpu_rope.c), the CUDA kernels (cuda/ops_rope.cu) and a host harness (tests/_rope_harness.c)
 * that runs the kernels' grid serially, so the arithmetic the GPU runs is tested in CI without a
 * GPU (DESIGN.md principle 3). All GT_HD: C11 on the host, __host__ __device__ under nvcc.
 *
 * One call of gt_rope_column does column i of one (b, t) for every head: a rotated pair
 * (i < R / 2: elements i and i + R / 2) or, for an out-of-place call, one passed-through element
 * (i >= R / 2: element R / 2 + i of the row). No two columns write the same element.
 *
 * Every operation is rounded once (-ffp-contract=off on the host, nvcc --fmad=false), so the
 * device repeats the CPU's bits. The libm calls are cos and sin in double of the f32 angle (at
 * most 1 ulp of double in glibc, 2 in CUDA's libdevice): their rounding to f32 can differ only
 * within 2 ulps of double of an f32 rounding boundary. Hugging Face computes cos and sin in f32
 * (PyTorch's vectorised cosf/sinf, within 1 ulp of f32): the correctly rounded value here is
 * within that ulp of its, and equal after the rounding to bf16/f16 except at a tie boundary. */
#ifndef GT_ROPE_HD_H
#define GT_ROPE_HD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/half.h"
#include "core/hd.h"
#include "ops/elem_hd.h"
#include "ops/ops.h"

/* Columns per (b, t): R / 2 rotated pairs, plus D - R passed-through elements when out is not in. */
GT_HD size_t gt_rope_columns(const gt_rope_args *a) {
    size_t pairs = (size_t)a->rotary_dim / 2;
    return a->out == a->in ? pairs : pairs + (size_t)(a->head_dim - a->rotary_dim);
}

/* The cos and sin of position `pos` at frequency inv_freq, each rounded to f32, multiplied by
 * `factor` in f32 (Hugging Face's attention_scaling; 1 changes no bit), then rounded to dt. */
GT_HD void gt_rope_cos_sin(int64_t pos, float inv_freq, float factor, gt_dtype dt, float *c, float *s) {
    float angle = (float)pos * inv_freq;
    float cos32 = (float)cos((double)angle), sin32 = (float)sin((double)angle);
    *c = gt_hd_round(cos32 * factor, dt);
    *s = gt_hd_round(sin32 * factor, dt);
}

/* The rotated pair (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), every product rounded to dt (the
 * caller's store rounds the sums); -s rotates the other way (the backward). */
GT_HD void gt_rope_pair(float x1, float x2, float c, float s, gt_dtype dt, float *o1, float *o2) {
    *o1 = gt_hd_round(x1 * c, dt) - gt_hd_round(x2 * s, dt);
    *o2 = gt_hd_round(x2 * c, dt) + gt_hd_round(x1 * s, dt);
}

/* Column i (i < gt_rope_columns(a)) of batch entry b, position t, for every head: forward
 * (backward = 0) or the transpose rotation (backward = 1). */
GT_HD void gt_rope_column(const gt_rope_args *a, size_t b, size_t t, size_t i, int backward) {
    size_t half = (size_t)a->rotary_dim / 2, heads = (size_t)a->heads;
    size_t row = b * (size_t)a->strides.batch + t * (size_t)a->strides.row;
    gt_dtype dt = a->dt;
    if (i >= half) {  /* a passed-through element (out-of-place calls only) */
        size_t d = half + i;
        for (size_t h = 0; h < heads; h++) {
            size_t at = row + h * (size_t)a->strides.head + d;
            gt_hd_store(a->out, at, gt_hd_load(a->in, at, dt), dt);
        }
        return;
    }
    int64_t pos = a->positions ? a->positions[b * (size_t)a->positions_stride + t] : (int64_t)t;
    float c, s, o1, o2;
    gt_rope_cos_sin(pos, a->inv_freq[i], a->attention_factor, dt, &c, &s);
    if (backward)
        s = -s;  /* dt(-x) = -dt(x): the transpose rotation, with the same roundings */
    for (size_t h = 0; h < heads; h++) {
        size_t at = row + h * (size_t)a->strides.head + i;
        gt_rope_pair(gt_hd_load(a->in, at, dt), gt_hd_load(a->in, at + half, dt), c, s, dt, &o1, &o2);
        gt_hd_store(a->out, at, o1, dt);
        gt_hd_store(a->out, at + half, o2, dt);
    }
}

#endif
