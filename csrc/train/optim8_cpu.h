/* The CPU loop of 8-bit AdamW (math: ops/adamw8bit_hd.h). */
#ifndef GT_OPTIM8_CPU_H
#define GT_OPTIM8_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/adamw8bit.h"

/* One update of a parameter of n elements: p (n,), its gradient g (n,), the codes of its moments
 * c1, c2 (n,) and their absmax per block absmax1, absmax2 (ceil(n / GT_ADAMW8_BLOCK),), all
 * updated in place. */
void gt_adamw8bit_cpu(const gt_adamw8_scalars *s, float *p, const float *g, uint8_t *c1, uint8_t *c2,
                      float *absmax1, float *absmax2, size_t n);

/* The (256,) dynamic map of the first (signed_map = 1) or the second moment. */
const float *gt_adamw8_map(int signed_map);

#endif
