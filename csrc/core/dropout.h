/* The dropout mask rule every backend follows (DESIGN.md principles 3 and 4): the mask is a pure
 * function of (seed, layer, step, element), never a stored RNG stream.
 *
 * Element g = offset + i (offset: the micro-batch's element offset, i: the index in the tensor)
 * of dropout layer `layer` at training step `step` uses word g % 4 of
 *     gt_philox_random4(seed, stream_a = layer, stream_b = step, index = g / 4)
 * (so one Philox call serves four consecutive elements), u = gt_uint32_to_uniform(word) in
 * [0, 1) with 24 random bits, and the element is kept when u >= (float)p. Kept elements are
 * scaled by gt_dropout_scale(p); dropped ones are multiplied by 0 (NaN and inf stay NaN, as in
 * PyTorch's x * mask * scale). p = 1 drops every element (u < 1 always). */
#ifndef GT_DROPOUT_H
#define GT_DROPOUT_H

#include <stdint.h>

#include "core/hd.h"
#include "core/philox.h"

/* The factor of kept elements, PyTorch's CPU rule (noise.div_(1 - p) on a float tensor): 1 - p
 * in double, rounded to f32, then 1 / that in f32 (p = 0.9 gives 10, not 1 / (1 - 0.9f) =
 * 9.999998). p = 1 keeps nothing; its scale is defined as 0 (as PyTorch's CUDA kernel does). */
GT_HD float gt_dropout_scale(double p) {
    float keep = (float)(1.0 - p);
    return keep == 0.0f ? 0.0f : 1.0f / keep;
}

/* scale when the element drawn from `word` is kept (u >= p), else 0. */
GT_HD float gt_dropout_factor(uint32_t word, float p, float scale) {
    return gt_uint32_to_uniform(word) >= p ? scale : 0.0f;
}

/* The multiplier of element g (see above): a self-contained form for one element per thread. */
GT_HD float gt_dropout_element_factor(uint64_t seed, uint32_t layer, uint32_t step, uint64_t g,
                                      float p, float scale) {
    uint32_t words[4];
    gt_philox_random4(seed, layer, step, g / 4u, words);
    return gt_dropout_factor(words[g % 4u], p, scale);
}

#endif
