/* 8-bit AdamW's per-step constants (bitsandbytes' AdamW8bit: both moments kept as 8-bit codes of
 * its dynamic maps with one float32 absmax per block of GT_ADAMW8_BLOCK elements of a parameter).
 * The element and block math is ops/adamw8bit_hd.h; the constants are AdamW's (core/adamw.h, made
 * in float64 on the host and rounded once) plus f32(beta1), which the first moment's
 * m * beta1 + (1 - beta1) * g needs (AdamW's lerp does not). */
#ifndef GT_ADAMW8BIT_H
#define GT_ADAMW8BIT_H

#include <stdint.h>

#include "core/adamw.h"

/* Elements per quantization block of a parameter's moments (bitsandbytes' optimizers: 256). */
#define GT_ADAMW8_BLOCK 256

/* Parameters with fewer elements keep float32 moments by default (bitsandbytes' min_8bit_size). */
#define GT_ADAMW8_MIN_SIZE 4096

typedef struct gt_adamw8_scalars {
    gt_adamw_scalars a;  /* AdamW's constants (amsgrad 0): grad_coef, decay, 1 - beta1, beta2, ... */
    float beta1;         /* f32(beta1): decay of the first moment */
} gt_adamw8_scalars;

/* The constants for update number `step` (>= 1). */
static inline gt_adamw8_scalars gt_adamw8_scalars_make(double lr, double beta1, double beta2, double eps,
                                                       double weight_decay, int64_t step, float grad_coef,
                                                       int maximize) {
    gt_adamw8_scalars s;
    s.a = gt_adamw_scalars_make(lr, beta1, beta2, eps, weight_decay, step, grad_coef, maximize, 0);
    s.beta1 = (float)beta1;
    return s;
}

#endif
