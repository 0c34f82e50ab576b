/* CPU loops of the optimizer element updates over one contiguous run of elements, vectorised
 * (AVX-512 / AVX2 + FMA, chosen by gt_simd_level()) with a scalar path and scalar tails that use
 * the same GT_HD element functions, so every level gives the same bits. Called by each thread of
 * the optimizer's one OpenMP region on its share of a run; they never allocate. */
#ifndef GT_OPTIM_CPU_H
#define GT_OPTIM_CPU_H

#include <stddef.h>

#include "core/adamw.h"
#include "core/sgd.h"

/* AdamW over n elements: p, m, v updated in place; v_max is used only when s->amsgrad. */
void gt_adamw_cpu(gt_numerics numerics, const gt_adamw_scalars *s, float *p, const float *g,
                  float *m, float *v, float *v_max, size_t n);

/* SGD over n elements; buf is used only when s->use_momentum. */
void gt_sgd_cpu(const gt_sgd_scalars *s, float *p, const float *g, float *buf, size_t n);

/* ema = lerp(ema, p, weight) over n elements. */
void gt_ema_cpu(float *ema, const float *p, float weight, size_t n);

/* STREAM's triad a = b + s*c over n elements with all threads (one OpenMP region, the
 * optimizer's vector width): the memory-bandwidth baseline of benchmarks/bench_optim.py. */
void gt_triad_cpu(float *a, const float *b, const float *c, float s, size_t n);

#endif
