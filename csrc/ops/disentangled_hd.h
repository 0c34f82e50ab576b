/* The per-element math of disentangled attention (ops.h, gt_disentangled_args), shared by the CPU
 * op (cpu_disentangled.c) and the CUDA kernels (cuda/ops_disentangled.cu), so both compute the
 * same scores in the same order (DESIGN.md principle 3):
 *   score(i, j) = scale * ((q_i . k_j + q_i . pos_k[r]) + k_j . pos_q[r]),  r = rel_index[i - j + T - 1],
 * each dot product an f32 sum in increasing d of f32-widened elements, an absent term (NULL
 * pos_k or pos_q) left out. */
#ifndef GT_DISENTANGLED_HD_H
#define GT_DISENTANGLED_HD_H

#include <stddef.h>
#include <stdint.h>

#include "ops/elem_hd.h"
#include "ops/ops.h"

/* Element offset of (b, h, t, 0) of an operand at strides s. */
GT_HD_INLINE size_t gt_dis_at(const gt_attn_strides *s, size_t b, size_t h, size_t t) {
    return b * (size_t)s->batch + h * (size_t)s->head + t * (size_t)s->row;
}

/* Element offset of (row r, head h, 0) of pos_k / pos_q. */
GT_HD_INLINE size_t gt_dis_pos_at(const gt_disentangled_args *a, size_t r, size_t h) {
    return r * (size_t)a->pos_row + h * (size_t)a->head_dim;
}

/* The relative-position row of query i and key j. */
GT_HD_INLINE size_t gt_dis_rel(const gt_disentangled_args *a, size_t i, size_t j) {
    return (size_t)a->rel_index[i + (size_t)a->seq - 1 - j];
}

/* sum over d < D of x[xo + d] y[yo + d], in f32, in increasing d. */
GT_HD_INLINE float gt_dis_dot(const void *x, size_t xo, const void *y, size_t yo, size_t dim, gt_dtype dt) {
    float acc = 0.0f;
    for (size_t d = 0; d < dim; d++)
        acc += gt_hd_load(x, xo + d, dt) * gt_hd_load(y, yo + d, dt);
    return acc;
}

/* The scaled score of query i and key j of (b, h) (see above). */
GT_HD_INLINE float gt_dis_score(const gt_disentangled_args *a, size_t b, size_t h, size_t i, size_t j) {
    size_t dim = (size_t)a->head_dim, qo = gt_dis_at(&a->in, b, h, i), ko = gt_dis_at(&a->in, b, h, j);
    size_t po = gt_dis_pos_at(a, gt_dis_rel(a, i, j), h);
    float s = gt_dis_dot(a->q, qo, a->k, ko, dim, a->dt);
    if (a->pos_k)
        s += gt_dis_dot(a->q, qo, a->pos_k, po, dim, a->dt);
    if (a->pos_q)
        s += gt_dis_dot(a->k, ko, a->pos_q, po, dim, a->dt);
    return a->scale * s;
}

/* Keys visible to every query of entry b. */
GT_HD_INLINE size_t gt_dis_keys(const gt_disentangled_args *a, size_t b) {
    return a->key_lengths ? (size_t)a->key_lengths[b] : (size_t)a->seq;
}

#endif
