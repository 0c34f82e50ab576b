/* CPU activations: out = act(in) and din = dout * act'(in), elementwise, with the shared element
 * math of core/activation.h. Chunks of GT_CPU_CHUNK elements run in parallel; each element's
 * result depends only on its inputs, so any thread count gives the same bits. f16 runs through
 * f32 stage buffers (GT_CPU_KERNEL_STAGED): the same bits, with vectorised conversions. */
#include "core/activation.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

#define GT_ACT_LOOP(expr)                                                   \
    for (size_t i = begin; i < end; i++) {                                  \
        float x = gt_cpu_load(in, i, dt);                                   \
        gt_cpu_store(out, i, (expr), dt);                                   \
    }

GT_INLINE void act_forward_body(void *out, const void *in, size_t begin, size_t end,
                                gt_activation act, gt_dtype dt) {
    switch (act) {
    case GT_ACT_RELU: GT_ACT_LOOP(gt_relu(x)); break;
    case GT_ACT_GELU_ERF: GT_ACT_LOOP(gt_gelu_erf(x)); break;
    case GT_ACT_GELU_TANH: GT_ACT_LOOP(gt_gelu_tanh(x)); break;
    case GT_ACT_TANH: GT_ACT_LOOP(gt_tanh_act(x)); break;
    case GT_ACT_SILU: GT_ACT_LOOP(gt_silu(x)); break;
    }
}
GT_INLINE void act_forward_f16(void *out, const void *in, size_t begin, size_t end,
                               gt_activation act) {
    float in32[GT_STAGE], out32[GT_STAGE];
    for (size_t s = begin; s < end; s += GT_STAGE) {
        size_t len = gt_stage_len(s, end);
        gt_cpu_widen_f16(in32, in, s, len);
        act_forward_body(out32, in32, 0, len, act, GT_F32);
        gt_cpu_narrow_f16(out, s, out32, len);
    }
}
GT_CPU_KERNEL_STAGED(act_forward, (void *out, const void *in, size_t begin, size_t end,
                                   gt_activation act, gt_dtype dt), out, in, begin, end, act)

#define GT_ACT_BACKWARD_LOOP(fn)                                            \
    for (size_t i = begin; i < end; i++) {                                  \
        float g = fn(gt_cpu_load(dout, i, dt), gt_cpu_load(in, i, dt));     \
        gt_cpu_store(din, i, g, dt);                                        \
    }

GT_INLINE void act_backward_body(void *din, const void *dout, const void *in, size_t begin,
                                 size_t end, gt_activation act, gt_dtype dt) {
    switch (act) {
    case GT_ACT_RELU: GT_ACT_BACKWARD_LOOP(gt_relu_backward); break;
    case GT_ACT_GELU_ERF: GT_ACT_BACKWARD_LOOP(gt_gelu_erf_backward); break;
    case GT_ACT_GELU_TANH: GT_ACT_BACKWARD_LOOP(gt_gelu_tanh_backward); break;
    case GT_ACT_TANH: GT_ACT_BACKWARD_LOOP(gt_tanh_backward); break;
    case GT_ACT_SILU: GT_ACT_BACKWARD_LOOP(gt_silu_backward); break;
    }
}
GT_INLINE void act_backward_f16(void *din, const void *dout, const void *in, size_t begin,
                                size_t end, gt_activation act) {
    float dout32[GT_STAGE], in32[GT_STAGE], din32[GT_STAGE];
    for (size_t s = begin; s < end; s += GT_STAGE) {
        size_t len = gt_stage_len(s, end);
        gt_cpu_widen_f16(dout32, dout, s, len);
        gt_cpu_widen_f16(in32, in, s, len);
        act_backward_body(din32, dout32, in32, 0, len, act, GT_F32);
        gt_cpu_narrow_f16(din, s, din32, len);
    }
}
GT_CPU_KERNEL_STAGED(act_backward, (void *din, const void *dout, const void *in, size_t begin,
                                    size_t end, gt_activation act, gt_dtype dt),
                     din, dout, in, begin, end, act)

static gt_status check_activation(gt_activation act, int64_t n, gt_dtype dt) {
    if ((int)act < GT_ACT_RELU || (int)act > GT_ACT_SILU)
        return GT_FAIL(GT_ERR_VALUE, "act: unknown activation %d", (int)act);
    GT_TRY(gt_op_check_size(n, "n"));
    return gt_op_check_dtype(dt, "dt");
}

gt_status gt_cpu_activation_forward(gt_backend *be, void *out, const void *in, int64_t n,
                                    gt_activation act, gt_dtype dt) {
    GT_TRY(check_activation(act, n, dt));
    __typeof__(&act_forward_scalar) kernel = GT_CPU_RUN(act_forward);
    size_t count = (size_t)n, chunks = gt_cpu_chunks(count);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * GT_CPU_CHUNK;
        size_t end = gt_cpu_chunk_end(begin, count);
        kernel(out, in, begin, end, act, dt);
    }
    return GT_OK;
}

gt_status gt_cpu_activation_backward(gt_backend *be, void *din, const void *dout,
                                     const void *in, int64_t n, gt_activation act, gt_dtype dt) {
    GT_TRY(check_activation(act, n, dt));
    if (!din)  /* the input gradient is not wanted */
        return GT_OK;
    __typeof__(&act_backward_scalar) kernel = GT_CPU_RUN(act_backward);
    size_t count = (size_t)n, chunks = gt_cpu_chunks(count);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * GT_CPU_CHUNK;
        size_t end = gt_cpu_chunk_end(begin, count);
        kernel(din, dout, in, begin, end, act, dt);
    }
    return GT_OK;
}
