/* Gradient clipping's coefficient, shared by the host step (csrc/train/step.c through
 * gt_clip_coef) and the device kernels that clip from a device sum of squares
 * (csrc/train/grad_norm.c's gt_grad_clip for the cpu and sim, cuda/optim.cu): DESIGN.md
 * principle 3, one formula so every backend gives the same bits.
 *
 * torch.nn.utils.clip_grad_norm_'s rule: coef = max_norm / (norm + 1e-6) in float64, applied
 * only when it is below 1, rounded once to float32; a NaN norm gives 1 (no clipping). */
#ifndef GT_CLIP_RULES_H
#define GT_CLIP_RULES_H

#include <math.h>

#include "core/hd.h"

/* min(1, max_norm / (norm + 1e-6)) as float32 (1 when the quotient is NaN). */
GT_HD float gt_clip_rule_coef(double max_norm, double norm) {
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

/* The coefficient for a sum of squares `sumsq` of the gradients (norm = sqrt(sumsq)). */
GT_HD float gt_clip_rule_coef_sumsq(double max_norm, double sumsq) {
    return gt_clip_rule_coef(max_norm, sqrt(sumsq));
}

#endif
