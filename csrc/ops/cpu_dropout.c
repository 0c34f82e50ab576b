/* CPU dropout: out = in * mask * gt_dropout_scale(p), the mask drawn by the rule of core/dropout.h from
 * Philox(seed; layer, step; (offset + i) / 4), word (offset + i) % 4. The backward applies the
 * same multipliers to dout, regenerated from the same key, so no mask is stored. Chunks run in
 * parallel; an element's multiplier depends only on the key and its index. */
#include "core/dropout.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/philox_lanes.h"

/* Multiplies the element of global index g by its dropout factor. */
GT_INLINE void dropout_element(void *out, const void *in, const gt_dropout_key *key, uint64_t g,
                               float p, float scale, gt_dtype dt) {
    float factor = gt_dropout_element_factor(key->seed, key->layer, key->step, g, p, scale);
    size_t i = (size_t)(g - key->offset);
    gt_cpu_store(out, i, gt_cpu_load(in, i, dt) * factor, dt);
}

/* Multiplies elements [begin, end) by their dropout factors. Philox groups of four elements
 * that lie wholly inside the range run without bounds checks, PHILOX_LANES of them at a time
 * while there are as many; the (at most two) groups cut by the range ends check each element. */
GT_INLINE void dropout_body(void *out, const void *in, size_t begin, size_t end,
                            const gt_dropout_key *key, float p, float scale, gt_dtype dt) {
    uint64_t first = key->offset + begin, last = key->offset + end;  /* global [first, last) */
    uint64_t full_begin = (first + 3u) / 4u, full_end = last / 4u;   /* groups wholly inside */
    uint64_t group = full_begin;
    for (; group + PHILOX_LANES <= full_end; group += PHILOX_LANES) {
        uint32_t words[4][PHILOX_LANES];
        philox_lanes(key, group, words);
        size_t i = (size_t)(group * 4u - key->offset);
        for (size_t l = 0; l < PHILOX_LANES; l++)
            for (size_t j = 0; j < 4; j++) {
                float factor = gt_dropout_factor(words[j][l], p, scale);
                gt_cpu_store(out, i + 4 * l + j, gt_cpu_load(in, i + 4 * l + j, dt) * factor, dt);
            }
    }
    for (; group < full_end; group++) {
        uint32_t words[4];
        gt_philox_random4(key->seed, key->layer, key->step, group, words);
        size_t i = (size_t)(group * 4u - key->offset);
        for (size_t j = 0; j < 4; j++) {
            float factor = gt_dropout_factor(words[j], p, scale);
            gt_cpu_store(out, i + j, gt_cpu_load(in, i + j, dt) * factor, dt);
        }
    }
    uint64_t head_end = last < full_begin * 4u ? last : full_begin * 4u;
    uint64_t tail_begin = full_end * 4u > head_end ? full_end * 4u : head_end;
    for (uint64_t g = first; g < head_end; g++)
        dropout_element(out, in, key, g, p, scale, dt);
    for (uint64_t g = tail_begin; g < last; g++)
        dropout_element(out, in, key, g, p, scale, dt);
}
/* f16 through f32 stage buffers; the stage's elements keep their global indices. */
GT_INLINE void dropout_f16(void *out, const void *in, size_t begin, size_t end,
                           const gt_dropout_key *key, float p, float scale) {
    float buf[GT_STAGE];
    for (size_t s = begin; s < end; s += GT_STAGE) {
        size_t len = gt_stage_len(s, end);
        gt_dropout_key stage_key = *key;
        stage_key.offset += s;
        gt_cpu_widen_f16(buf, in, s, len);
        dropout_body(buf, buf, 0, len, &stage_key, p, scale, GT_F32);
        gt_cpu_narrow_f16(out, s, buf, len);
    }
}
GT_CPU_KERNEL_STAGED(dropout, (void *out, const void *in, size_t begin, size_t end,
                               const gt_dropout_key *key, float p, float scale, gt_dtype dt),
                     out, in, begin, end, key, p, scale)

static gt_status dropout_apply(void *out, const void *in, int64_t n, double p,
                               const gt_dropout_key *key, gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (!(p >= 0.0 && p <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "p: dropout probability must be in [0, 1], got %g", p);
    float scale = gt_dropout_scale(p);
    __typeof__(&dropout_scalar) kernel = GT_CPU_RUN(dropout);
    size_t count = (size_t)n, chunks = gt_cpu_chunks(count);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * GT_CPU_CHUNK;
        kernel(out, in, begin, gt_cpu_chunk_end(begin, count), key, (float)p, scale, dt);
    }
    return GT_OK;
}

gt_status gt_cpu_dropout_forward(gt_backend *be, void *out, const void *in, int64_t n, double p,
                                 gt_dropout_key key, gt_dtype dt) {
    return dropout_apply(out, in, n, p, &key, dt);
}

gt_status gt_cpu_dropout_backward(gt_backend *be, void *din, const void *dout, int64_t n,
                                  double p, gt_dropout_key key, gt_dtype dt) {
    if (!din)  /* the input gradient is not wanted: only the arguments are checked */
        return dropout_apply(NULL, NULL, 0, p, &key, dt);
    return dropout_apply(din, dout, n, p, &key, dt);
}
