/* SGD's element update with PyTorch's semantics (torch.optim.SGD, foreach=False), shared by
 * the CPU loops and the CUDA kernel. PyTorch's CPU add with alpha is one FMA, so:
 *   g = g + wd * p                   (fma, only when weight_decay != 0)
 *   buf = g                          (first step)  |  buf = buf*mom + (1 - dampening)*g (fma)
 *   g = g + mom * buf (nesterov, fma) |  g = buf
 *   p = p + (-lr) * g                (fma)
 * Momentum steps are taken only when momentum != 0. */
#ifndef GT_SGD_H
#define GT_SGD_H

#include "core/fp_ops.h"

typedef struct gt_sgd_scalars {
    float grad_coef;          /* multiplies every gradient element as it is read (1 = no-op) */
    float weight_decay;       /* f32(weight_decay), L2 penalty added to the gradient */
    float momentum;           /* f32(momentum) */
    float dampening_weight;   /* f32(1 - dampening): weight of g in the momentum buffer */
    float neg_lr;             /* f32(-lr) */
    int use_weight_decay;     /* 1 when weight_decay != 0 */
    int use_momentum;         /* 1 when momentum != 0 (a buffer exists) */
    int first_step;           /* 1: the buffer is initialised to the gradient */
    int nesterov;             /* 1: Nesterov momentum */
    int maximize;             /* 1: ascend the objective (gradient negated) */
} gt_sgd_scalars;

static inline gt_sgd_scalars gt_sgd_scalars_make(double lr, double momentum, double dampening,
                                                 double weight_decay, int nesterov, int maximize,
                                                 int first_step, float grad_coef) {
    gt_sgd_scalars s;
    s.grad_coef = grad_coef;
    s.weight_decay = (float)weight_decay;
    s.momentum = (float)momentum;
    s.dampening_weight = (float)(1.0 - dampening);
    s.neg_lr = (float)(-lr);
    s.use_weight_decay = weight_decay != 0.0;
    s.use_momentum = momentum != 0.0;
    s.first_step = first_step;
    s.nesterov = nesterov;
    s.maximize = maximize;
    return s;
}

/* One element; `buf` is read and written only when s->use_momentum. */
GT_HD void gt_sgd_update(float *p, float g_raw, float *buf, const gt_sgd_scalars *s) {
    float g = gt_mul(g_raw, s->grad_coef);
    if (s->maximize)
        g = -g;
    if (s->use_weight_decay)
        g = gt_fma(*p, s->weight_decay, g);
    if (s->use_momentum) {
        float b = s->first_step ? g : gt_fma(g, s->dampening_weight, gt_mul(*buf, s->momentum));
        *buf = b;
        g = s->nesterov ? gt_fma(b, s->momentum, g) : b;
    }
    *p = gt_fma(g, s->neg_lr, *p);
}

#endif
