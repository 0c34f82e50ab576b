/* CPU gated activation (ops.h, glu_forward / glu_backward): the element math of ops/glu_hd.h,
 * the code the CUDA kernels run, one row at a time, rows in parallel. Each element depends only on
 * its inputs, so any thread count gives the same bits. The activation is chosen outside the loop
 * and the dtype by GT_CPU_KERNEL, so f32 and bf16 rows vectorise (f16 converts per element). */
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/glu_hd.h"

#define GT_GLU_FORWARD_LOOP(fn)                                                         \
    for (size_t i = 0; i < inter; i++) {                                                \
        float a = fn(gt_cpu_load(in, g + i, dt));                                       \
        gt_cpu_store(out, o + i, gt_glu_out(a, gt_cpu_load(in, g + inter + i, dt), dt), dt); \
    }

/* Row r of out from row r of in. */
GT_INLINE void glu_forward_body(void *out, const void *in, size_t r, size_t inter, gt_activation act,
                                gt_dtype dt) {
    size_t o = r * inter, g = r * 2 * inter;
    switch (act) {
    case GT_ACT_RELU: GT_GLU_FORWARD_LOOP(gt_relu); break;
    case GT_ACT_GELU_ERF: GT_GLU_FORWARD_LOOP(gt_gelu_erf); break;
    case GT_ACT_GELU_TANH: GT_GLU_FORWARD_LOOP(gt_gelu_tanh); break;
    case GT_ACT_TANH: GT_GLU_FORWARD_LOOP(gt_tanh_act); break;
    case GT_ACT_SILU: GT_GLU_FORWARD_LOOP(gt_silu); break;
    }
}
GT_CPU_KERNEL(glu_forward, (void *out, const void *in, size_t r, size_t inter, gt_activation act, gt_dtype dt),
              out, in, r, inter, act)

#define GT_GLU_BACKWARD_LOOP(fn, grad)                                                  \
    for (size_t i = 0; i < inter; i++) {                                                \
        float x = gt_cpu_load(in, g + i, dt), u = gt_cpu_load(in, g + inter + i, dt);   \
        float d = gt_cpu_load(dout, o + i, dt);                                         \
        float dgate = grad(gt_glu_dact(d, u, dt), x), dup = gt_glu_dup(d, fn(x), dt);   \
        gt_cpu_store(din, g + i, dgate, dt);                                            \
        gt_cpu_store(din, g + inter + i, dup, dt);                                      \
    }

/* Row r of din from row r of dout and in (din may be in). */
GT_INLINE void glu_backward_body(void *din, const void *dout, const void *in, size_t r, size_t inter,
                                 gt_activation act, gt_dtype dt) {
    size_t o = r * inter, g = r * 2 * inter;
    switch (act) {
    case GT_ACT_RELU: GT_GLU_BACKWARD_LOOP(gt_relu, gt_relu_backward); break;
    case GT_ACT_GELU_ERF: GT_GLU_BACKWARD_LOOP(gt_gelu_erf, gt_gelu_erf_backward); break;
    case GT_ACT_GELU_TANH: GT_GLU_BACKWARD_LOOP(gt_gelu_tanh, gt_gelu_tanh_backward); break;
    case GT_ACT_TANH: GT_GLU_BACKWARD_LOOP(gt_tanh_act, gt_tanh_backward); break;
    case GT_ACT_SILU: GT_GLU_BACKWARD_LOOP(gt_silu, gt_silu_backward); break;
    }
}
GT_CPU_KERNEL(glu_backward, (void *din, const void *dout, const void *in, size_t r, size_t inter,
                             gt_activation act, gt_dtype dt), din, dout, in, r, inter, act)

static gt_status check_glu(int64_t rows, int64_t inter, gt_activation act, gt_dtype dt) {
    if ((int)act < GT_ACT_RELU || (int)act > GT_ACT_SILU)
        return GT_FAIL(GT_ERR_VALUE, "act: unknown activation %d", (int)act);
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(inter, "inter"));
    return gt_op_check_dtype(dt, "dt");
}

gt_status gt_cpu_glu_forward(gt_backend *be, void *out, const void *in, int64_t rows, int64_t inter,
                             gt_activation act, gt_dtype dt) {
    (void)be;
    GT_TRY(check_glu(rows, inter, act, dt));
    if (rows == 0 || inter == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    __typeof__(&glu_forward_scalar) kernel = GT_CPU_RUN(glu_forward);
    size_t n = (size_t)rows, width = (size_t)inter;
#pragma omp parallel for schedule(static) if (n * width > GT_CPU_CHUNK)
    for (size_t r = 0; r < n; r++)
        kernel(out, in, r, width, act, dt);
    return GT_OK;
}

gt_status gt_cpu_glu_backward(gt_backend *be, void *din, const void *dout, const void *in, int64_t rows,
                              int64_t inter, gt_activation act, gt_dtype dt) {
    (void)be;
    GT_TRY(check_glu(rows, inter, act, dt));
    if (!din || rows == 0 || inter == 0)  /* NULL din: the input gradient is not wanted */
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dout, "dout"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    __typeof__(&glu_backward_scalar) kernel = GT_CPU_RUN(glu_backward);
    size_t n = (size_t)rows, width = (size_t)inter;
#pragma omp parallel for schedule(static) if (n * width > GT_CPU_CHUNK)
    for (size_t r = 0; r < n; r++)
        kernel(din, dout, in, r, width, act, dt);
    return GT_OK;
}
