/* CPU residual add: out = a + b elementwise in f32, rounded once into dt (out may alias a or b:
 * each element is read before it is written), and the scale by a constant, out = dt(in * factor)
 * (out may alias in). */
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

#include <math.h>

GT_INLINE void add_body(void *out, const void *a, const void *b, size_t begin, size_t end,
                        gt_dtype dt) {
    for (size_t i = begin; i < end; i++)
        gt_cpu_store(out, i, gt_cpu_load(a, i, dt) + gt_cpu_load(b, i, dt), dt);
}
GT_INLINE void add_f16(void *out, const void *a, const void *b, size_t begin, size_t end) {
    float a32[GT_STAGE], b32[GT_STAGE];
    for (size_t s = begin; s < end; s += GT_STAGE) {
        size_t len = gt_stage_len(s, end);
        gt_cpu_widen_f16(a32, a, s, len);
        gt_cpu_widen_f16(b32, b, s, len);
        add_body(a32, a32, b32, 0, len, GT_F32);
        gt_cpu_narrow_f16(out, s, a32, len);
    }
}
GT_CPU_KERNEL_STAGED(add, (void *out, const void *a, const void *b, size_t begin, size_t end,
                           gt_dtype dt), out, a, b, begin, end)

gt_status gt_cpu_add(gt_backend *be, void *out, const void *a, const void *b, int64_t n,
                     gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    __typeof__(&add_scalar) kernel = GT_CPU_RUN(add);
    size_t count = (size_t)n, chunks = gt_cpu_chunks(count);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * GT_CPU_CHUNK;
        kernel(out, a, b, begin, gt_cpu_chunk_end(begin, count), dt);
    }
    return GT_OK;
}

/* out = dt(in * factor): the Scale layer's forward and backward (ops.h). */
GT_INLINE void scale_body(void *out, const void *in, float factor, size_t begin, size_t end, gt_dtype dt) {
    for (size_t i = begin; i < end; i++)
        gt_cpu_store(out, i, gt_cpu_load(in, i, dt) * factor, dt);
}
GT_INLINE void scale_f16(void *out, const void *in, float factor, size_t begin, size_t end) {
    float x32[GT_STAGE];
    for (size_t s = begin; s < end; s += GT_STAGE) {
        size_t len = gt_stage_len(s, end);
        gt_cpu_widen_f16(x32, in, s, len);
        scale_body(x32, x32, factor, 0, len, GT_F32);
        gt_cpu_narrow_f16(out, s, x32, len);
    }
}
GT_CPU_KERNEL_STAGED(scale, (void *out, const void *in, float factor, size_t begin, size_t end, gt_dtype dt),
                     out, in, factor, begin, end)

gt_status gt_cpu_scale(gt_backend *be, void *out, const void *in, int64_t n, float factor, gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (!isfinite(factor))
        return GT_FAIL(GT_ERR_VALUE, "factor: must be finite, got %g", (double)factor);
    if (n > 0) {
        GT_TRY(gt_op_check_ptr(out, "out"));
        GT_TRY(gt_op_check_ptr(in, "in"));
    }
    __typeof__(&scale_scalar) kernel = GT_CPU_RUN(scale);
    size_t count = (size_t)n, chunks = gt_cpu_chunks(count);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * GT_CPU_CHUNK;
        kernel(out, in, factor, begin, gt_cpu_chunk_end(begin, count), dt);
    }
    return GT_OK;
}
