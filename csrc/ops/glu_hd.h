/* The element math of the gated activation (ops.h, glu_forward / glu_backward), shared by the CPU
 * op (cpu_glu.c), the CUDA kernels (cuda/ops_glu.cu) and a host harness (tests/_glu_harness.c)
 * that runs the kernels' per-thread function over their grid, so the arithmetic the GPU runs is
 * tested in CI without a GPU (DESIGN.md principle 3).
 *
 * Layout: row r of `in` is [gate | up], element i of the gate at r * 2 inter + i and of up at
 * r * 2 inter + inter + i; out and dout are (rows, inter); din is laid out as in. The activations
 * are core/activation.h's (branch-free f32, not libm), and each intermediate is rounded to dt
 * where PyTorch's eager code rounds it, so half results follow Hugging Face's:
 *   out   = dt(dt(act(g)) * u)
 *   dup   = dt(dout * dt(act(g)))        dgate = dt(act'(g) * dt(dout * u)). */
#ifndef GT_GLU_HD_H
#define GT_GLU_HD_H

#include <stddef.h>
#include <stdint.h>

#include "ops/activation_hd.h"
#include "ops/elem_hd.h"
#include "ops/ops.h"

/* out before its store's rounding: dt(act(g)) * u, given a = act(g). */
GT_HD_INLINE float gt_glu_out(float a, float u, gt_dtype dt) { return gt_hd_round(a, dt) * u; }

/* dup before its store's rounding: dout * dt(a), given a = act(g). */
GT_HD_INLINE float gt_glu_dup(float dout, float a, gt_dtype dt) { return dout * gt_hd_round(a, dt); }

/* The gradient reaching act(g): dt(dout * u); dgate = act'(g) times it (gt_activation_grad). */
GT_HD_INLINE float gt_glu_dact(float dout, float u, gt_dtype dt) { return gt_hd_round(dout * u, dt); }

/* Element e = r * inter + i of out (one CUDA thread's work in the forward). */
GT_HD_INLINE void gt_glu_forward_element(void *out, const void *in, size_t e, size_t inter,
                                         gt_activation act, gt_dtype dt) {
    size_t g = e / inter * 2 * inter + e % inter;
    float a = gt_activation_value(act, gt_hd_load(in, g, dt));
    gt_hd_store(out, e, gt_glu_out(a, gt_hd_load(in, g + inter, dt), dt), dt);
}

/* Elements (r, i) and (r, inter + i) of din for e = r * inter + i (one thread in the backward):
 * both inputs are read before either output is written, so din may be in. */
GT_HD_INLINE void gt_glu_backward_element(void *din, const void *dout, const void *in, size_t e,
                                          size_t inter, gt_activation act, gt_dtype dt) {
    size_t g = e / inter * 2 * inter + e % inter;
    float x = gt_hd_load(in, g, dt), u = gt_hd_load(in, g + inter, dt), d = gt_hd_load(dout, e, dt);
    float dgate = gt_activation_grad(act, gt_glu_dact(d, u, dt), x);
    float dup = gt_glu_dup(d, gt_activation_value(act, x), dt);
    gt_hd_store(din, g, dgate, dt);
    gt_hd_store(din, g + inter, dup, dt);
}

#endif
