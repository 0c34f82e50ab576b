/* Element math of bitsandbytes' blockwise quantization, shared by the CPU backend, sim and the
 * CUDA kernels (DESIGN.md principle 3). The reference is python/gputrain/quant/reference.py
 * (bitsandbytes 0.50's default backend: multiply by 1 / absmax in a full block, divide in a last
 * partial block, clamp to [-1, 1], then torch.bucketize over the midpoints of the sorted code). */
#ifndef GT_QUANT_HD_H
#define GT_QUANT_HD_H

#include <stddef.h>
#include <stdint.h>

#include "ops/elem_hd.h"

/* Smallest absmax a block is scaled by (bitsandbytes' absmax.clamp(min=1e-38)). */
#define GT_QUANT_TINY 1e-38f

/* The value a block is scaled by: max(absmax, 1e-38); a full block multiplies by its f32
 * reciprocal (returned in *inv), a partial block divides by it. */
GT_HD float gt_quant_divisor(float absmax) { return absmax > GT_QUANT_TINY ? absmax : GT_QUANT_TINY; }

/* x scaled into [-1, 1]: clamp(x * inv, -1, 1) in a full block, clamp(x / divisor, -1, 1) in the
 * last, partial one. */
GT_HD float gt_quant_scale(float x, float inv, float divisor, int partial) {
    float s = partial ? x / divisor : x * inv;
    return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
}

/* The code of a scaled value: order[i] for the first i with s <= bounds[i] (i = nbounds when
 * none), bounds sorted ascending (torch.bucketize, right=False). */
GT_HD uint8_t gt_quant_encode(float s, const float *bounds, const uint8_t *order, int nbounds) {
    int lo = 0, hi = nbounds;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (bounds[mid] < s)
            lo = mid + 1;
        else
            hi = mid;
    }
    return order[lo];
}

/* Code k of element i: a byte (8 bits) or a nibble (4 bits: the even element in the high one). */
GT_HD uint8_t gt_quant_code_at(const uint8_t *codes, size_t i, int bits) {
    if (bits == 8)
        return codes[i];
    uint8_t byte = codes[i >> 1];
    return (i & 1) ? (uint8_t)(byte & 0x0F) : (uint8_t)(byte >> 4);
}

/* Dequantized element: code[k] * absmax in f32 (bitsandbytes' kernels), rounded once to dt. */
GT_HD void gt_quant_decode_store(void *out, size_t i, const float *code, uint8_t k, float absmax,
                                 gt_dtype dt) {
    gt_hd_store(out, i, code[k] * absmax, dt);
}

#endif
