/* The CPU loop of 8-bit AdamW over one parameter (ops/adamw8bit_hd.h has the math): one block
 * of GT_ADAMW8_BLOCK elements per iteration of a parallel loop, so the result does not depend on
 * the thread count. Used by the cpu's device table and by sim's workers. */
#include "train/optim8_cpu.h"

#include "ops/adamw8bit_hd.h"
#include "ops/dynamic_map.h"

typedef union map_table {
    uint32_t bits[256];  /* float32 bit patterns */
    float values[256];   /* the same, as floats */
} map_table;

static const map_table code1 = {{GT_DYNMAP_SIGNED_CODE}}, bounds1 = {{GT_DYNMAP_SIGNED_BOUNDS}};
static const map_table code2 = {{GT_DYNMAP_UNSIGNED_CODE}}, bounds2 = {{GT_DYNMAP_UNSIGNED_BOUNDS}};
static const uint8_t identity[256] = {GT_DYNMAP_ORDER};

const float *gt_adamw8_map(int signed_map) { return signed_map ? code1.values : code2.values; }

/* Block b of a parameter of n elements. */
static void update_block(const gt_adamw8_scalars *s, float *p, const float *g, uint8_t *c1, uint8_t *c2,
                         float *absmax1, float *absmax2, size_t n, size_t b) {
    float m[GT_ADAMW8_BLOCK], v[GT_ADAMW8_BLOCK];
    size_t begin = b * GT_ADAMW8_BLOCK, end = begin + GT_ADAMW8_BLOCK < n ? begin + GT_ADAMW8_BLOCK : n;
    size_t len = end - begin;
    float a1 = absmax1[b], a2 = absmax2[b], amax1 = 0.0f, amax2 = 0.0f;
    for (size_t k = 0; k < len; k++) {
        size_t i = begin + k;
        m[k] = code1.values[c1[i]] * a1;
        v[k] = code2.values[c2[i]] * a2;
        gt_adamw8_element(&p[i], g[i], &m[k], &v[k], s);
        amax1 = gt_adamw8_amax(amax1, m[k]);
        amax2 = gt_adamw8_amax(amax2, v[k]);
    }
    int partial = len < GT_ADAMW8_BLOCK;
    float div1, inv1, div2, inv2;
    absmax1[b] = gt_adamw8_absmax(amax1, partial, &div1, &inv1);
    absmax2[b] = gt_adamw8_absmax(amax2, partial, &div2, &inv2);
    for (size_t k = 0; k < len; k++) {
        c1[begin + k] = gt_adamw8_code(m[k], inv1, div1, partial, bounds1.values, identity);
        c2[begin + k] = gt_adamw8_code(v[k], inv2, div2, partial, bounds2.values, identity);
    }
}

void gt_adamw8bit_cpu(const gt_adamw8_scalars *s, float *p, const float *g, uint8_t *c1, uint8_t *c2,
                      float *absmax1, float *absmax2, size_t n) {
    size_t blocks = (n + GT_ADAMW8_BLOCK - 1) / GT_ADAMW8_BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1 && n >= 65536)
    for (size_t b = 0; b < blocks; b++)
        update_block(s, p, g, c1, c2, absmax1, absmax2, n, b);
}
