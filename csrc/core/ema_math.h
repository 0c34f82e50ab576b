/* The exponential moving average of weights, shared by the CPU loop and the CUDA kernel:
 * ema = lerp(ema, p, f32(1 - decay)), PyTorch's `ema.lerp_(p, 1 - decay)` (timm's ModelEmaV3). */
#ifndef GT_EMA_MATH_H
#define GT_EMA_MATH_H

#include "core/fp_ops.h"

GT_HD void gt_ema_update(float *ema, float param, float weight) { *ema = gt_lerp(*ema, param, weight); }

#endif
