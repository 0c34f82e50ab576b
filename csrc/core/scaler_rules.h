/* The dynamic loss scaler's state and update rules, shared by the C training step
 * (csrc/train/scaler.c) and the CUDA kernels (cuda/scaler.cu): DESIGN.md principle 3.
 *
 * The rules are PyTorch's (torch._amp_update_scale_ and
 * torch._amp_foreach_non_finite_check_and_unscale_):
 *   inv_scale = (float)(1.0 / (double)scale)
 *   unscale:   g = g * inv_scale in fp32 (the multiply is skipped when inv_scale == 1)
 *   found inf: scale = (float)(scale * backoff_factor), growth_tracker = 0
 *   finite:    t = growth_tracker + 1; if t == growth_interval, grow to
 *              (float)(scale * growth_factor) only if that is finite, and t = 0;
 *              growth_tracker = t
 * The factors are doubles, so each product is formed in double and rounded once to float.
 * gputrain adds an optional floor after a backoff (min_scale) and two skip counters. */
#ifndef GT_SCALER_RULES_H
#define GT_SCALER_RULES_H

#include <stdint.h>
#include <string.h>

#include "core/hd.h"

typedef struct gt_scaler {
    float scale;                        /* loss scale, fp32 (PyTorch's _scale tensor) */
    int32_t growth_tracker;             /* finite updates since the last growth or backoff */
    double growth_factor;               /* > 1: scale multiplier after growth_interval finite updates */
    double backoff_factor;              /* in (0, 1): scale multiplier after an update that saw inf/NaN */
    int32_t growth_interval;            /* >= 1: consecutive finite updates needed for one growth */
    float min_scale;                    /* floor applied after a backoff; 0 = none (PyTorch's rule) */
    int enabled;                        /* 0: unscale and update are no-ops, inv_scale reads 1 */
    int64_t skipped_steps;              /* updates that saw inf/NaN, in total */
    int64_t consecutive_skipped_steps;  /* updates that saw inf/NaN since the last finite one */
} gt_scaler;

/* 1 when x is NaN, +Inf or -Inf (all exponent bits set), 0 for every finite value. */
GT_HD int gt_f32_is_nonfinite(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u;
}

/* The reciprocal of the scale, computed in double and rounded once to float. */
GT_HD float gt_scaler_rule_inv_scale(float scale) { return (float)(1.0 / (double)scale); }

/* Counts one iteration in the skip counters (found_inf != 0: its optimizer step was skipped). */
GT_HD void gt_scaler_rule_count(gt_scaler *s, int found_inf) {
    if (found_inf) {
        s->skipped_steps += 1;
        s->consecutive_skipped_steps += 1;
    } else {
        s->consecutive_skipped_steps = 0;
    }
}

/* One dynamic update of scale and growth_tracker from the iteration's found_inf, plus the
 * counters. The tracker increment wraps like PyTorch's int32 tensor instead of overflowing. */
GT_HD void gt_scaler_rule_update(gt_scaler *s, int found_inf) {
    gt_scaler_rule_count(s, found_inf);
    if (found_inf) {
        float backed_off = (float)((double)s->scale * s->backoff_factor);
        s->scale = backed_off < s->min_scale ? s->min_scale : backed_off;
        s->growth_tracker = 0;
        return;
    }
    int32_t successful = (int32_t)((uint32_t)s->growth_tracker + 1u);
    if (successful == s->growth_interval) {
        float grown = (float)((double)s->scale * s->growth_factor);
        if (!gt_f32_is_nonfinite(grown))
            s->scale = grown;
        successful = 0;
    }
    s->growth_tracker = successful;
}

#endif
