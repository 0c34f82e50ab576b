/* Host side of the rotary position embedding (ops.h, gt_rope_args): the argument check every
 * backend runs, the rotary dimension of a head, and the inverse-frequency table, computed as
 * Hugging Face's modeling_rope_utils.py computes it in float32 ("default", "linear", "llama3" and
 * "yarn"; yarn's attention_factor is gt_rope_args.attention_factor, given by the caller). */
#ifndef GT_OPS_ROPE_H
#define GT_OPS_ROPE_H

#include <stdint.h>

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hugging Face's rope_type values this implements. */
typedef enum gt_rope_type {
    GT_ROPE_DEFAULT = 0,  /* inv_freq[i] = 1 / theta^(2i / R) */
    GT_ROPE_LLAMA3 = 1,   /* Llama 3.1's smooth interpolation of the low frequencies */
    GT_ROPE_LINEAR = 2,   /* default / factor (position interpolation) */
    GT_ROPE_YARN = 3,     /* YaRN: a ramp between default and default / factor over the dims */
} gt_rope_type;

/* The inverse-frequency table's parameters (a config's rope_theta and rope_scaling). */
typedef struct gt_rope_freq {
    double theta;                      /* rope_theta, > 0 */
    gt_rope_type type;                 /* rope_scaling's rope_type */
    double factor;                     /* linear, llama3, yarn: factor, > 0 */
    double low_freq_factor;            /* llama3: low_freq_factor, > 0 */
    double high_freq_factor;           /* llama3: high_freq_factor, > low_freq_factor */
    double original_max_position_embeddings;  /* llama3, yarn: the pretraining context, > 0 */
    double beta_fast;                  /* yarn: rotations of the fast end of the ramp, > 0 */
    double beta_slow;                  /* yarn: rotations of the slow end of the ramp, > 0 */
    int truncate;                      /* yarn: 1 rounds the ramp's ends to integers (floor, ceil) */
} gt_rope_freq;

/* What every backend checks of a rope call, naming the offending field: sizes >= 0, dtype,
 * rotary_dim even in [2, head_dim], strides >= 0 whose offsets fit int64, positions_stride >= 0,
 * and the pointers of a non-empty call. */
gt_status gt_rope_check(const gt_rope_args *a);

/* *out = int(head_dim * partial_rotary_factor) (Hugging Face's rotary dim); fails naming
 * partial_rotary_factor unless it is in (0, 1] and gives an even dim >= 2. */
gt_status gt_rope_rotary_dim(int64_t head_dim, double partial_rotary_factor, int64_t *out);

/* out[i] for i < rotary_dim / 2: Hugging Face's inv_freq in float32 (each operation of its torch
 * code rounded to f32 as PyTorch's CPU kernels round it; theta^e as double pow rounded once, the
 * correctly rounded value PyTorch's powf is within 1 ulp of). Fails naming the bad field. */
gt_status gt_rope_inv_freq(float *out, int64_t rotary_dim, const gt_rope_freq *f);

#ifdef __cplusplus
}
#endif
#endif
