#include "ops/checks.h"

#include <limits.h>
#include <math.h>

#include "core/alloc.h"

gt_status gt_op_check_dtype(gt_dtype dt, const char *arg_name) {
    if (dt == GT_F32 || dt == GT_F16 || dt == GT_BF16)
        return GT_OK;
    return GT_FAIL(GT_ERR_VALUE, "%s: expected f32, f16 or bf16, got %s", arg_name,
                   gt_dtype_name(dt));
}

gt_status gt_op_check_size(int64_t value, const char *arg_name) {
    if (value < 0)
        return GT_FAIL(GT_ERR_VALUE, "%s: must be >= 0, got %lld", arg_name, (long long)value);
    return GT_OK;
}

gt_status gt_op_check_ptr(const void *ptr, const char *arg_name) {
    if (!ptr)
        return GT_FAIL(GT_ERR_VALUE, "%s: NULL pointer", arg_name);
    return GT_OK;
}

/* Fails unless value fits a BLAS's 32-bit int arguments and is >= minimum. */
static gt_status check_dim(int64_t value, int64_t minimum, const char *arg_name) {
    if (value < minimum || value > INT_MAX)
        return GT_FAIL(GT_ERR_VALUE, "%s: must be in [%lld, %d], got %lld", arg_name,
                       (long long)minimum, INT_MAX, (long long)value);
    return GT_OK;
}

static int64_t at_least_one(size_t value) { return value > 1 ? (int64_t)value : 1; }

gt_status gt_gemm_check(const gt_gemm_args *g) {
    GT_TRY(gt_op_check_ptr(g, "args"));
    GT_TRY(gt_op_check_dtype(g->a_dt, "a_dt"));
    GT_TRY(gt_op_check_dtype(g->b_dt, "b_dt"));
    GT_TRY(gt_op_check_dtype(g->c_dt, "c_dt"));
    GT_TRY(check_dim(g->m, 0, "m"));
    GT_TRY(check_dim(g->n, 0, "n"));
    GT_TRY(check_dim(g->k, 0, "k"));
    GT_TRY(check_dim(g->lda, at_least_one(gt_gemm_a_cols(g)), "lda"));
    GT_TRY(check_dim(g->ldb, at_least_one(gt_gemm_b_cols(g)), "ldb"));
    GT_TRY(check_dim(g->ldc, at_least_one((size_t)g->n), "ldc"));
    GT_TRY(check_dim(g->batch, 1, "batch"));
    if (g->batch > 1 && (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0))
        return GT_FAIL(GT_ERR_VALUE, "stride_a/stride_b/stride_c: must be >= 0");
    if (g->m > 0 && g->n > 0) {
        GT_TRY(gt_op_check_ptr(g->c, "c"));
        if (g->k > 0) {
            GT_TRY(gt_op_check_ptr(g->a, "a"));
            GT_TRY(gt_op_check_ptr(g->b, "b"));
        }
    }
    return GT_OK;
}

/* Fails unless every element count of the convolution's tensors fits GT_MAX_BYTES-sized memory
 * and its im2col GEMMs have 32-bit sizes. */
static gt_status check_conv_extents(const gt_conv2d_args *a, int64_t out_h, int64_t out_w) {
    int64_t cols = 0, rows = 0, in = 0, out = 0;
    if (__builtin_mul_overflow(out_h, out_w, &cols) || cols > INT_MAX)
        return GT_FAIL(GT_ERR_VALUE, "height/width: %lld x %lld output positions per channel are more "
                       "than a GEMM can take (%d)", (long long)out_h, (long long)out_w, INT_MAX);
    if (__builtin_mul_overflow(a->in_channels / a->groups, a->kernel_h * a->kernel_w, &rows) ||
        rows > INT_MAX)
        return GT_FAIL(GT_ERR_VALUE, "kernel_h/kernel_w: in_channels / groups x kernel_h x kernel_w is "
                       "more than a GEMM can take (%d)", INT_MAX);
    int64_t limit = (int64_t)(GT_MAX_BYTES / sizeof(float));
    if (__builtin_mul_overflow(a->batch, a->in_channels, &in) ||
        __builtin_mul_overflow(in, a->height * a->width, &in) || in > limit ||
        __builtin_mul_overflow(a->batch, a->out_channels, &out) ||
        __builtin_mul_overflow(out, cols, &out) || out > limit)
        return GT_FAIL(GT_ERR_VALUE, "batch: the input or output of this convolution has more "
                       "elements than any memory holds");
    return GT_OK;
}

gt_status gt_conv2d_check(const gt_conv2d_args *a, int backward) {
    GT_TRY(gt_op_check_ptr(a, "args"));
    GT_TRY(gt_op_check_dtype(a->dt, "dt"));
    GT_TRY(check_dim(a->batch, 0, "batch"));
    const int64_t sizes[] = {a->in_channels, a->height, a->width, a->out_channels, a->groups,
                             a->kernel_h, a->kernel_w, a->stride_h, a->stride_w, a->dilation_h,
                             a->dilation_w};
    static const char *const names[] = {"in_channels", "height", "width", "out_channels", "groups",
                                        "kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h",
                                        "dilation_w"};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        GT_TRY(check_dim(sizes[i], 1, names[i]));
    GT_TRY(check_dim(a->pad_h, 0, "pad_h"));
    GT_TRY(check_dim(a->pad_w, 0, "pad_w"));
    if (a->in_channels % a->groups || a->out_channels % a->groups)
        return GT_FAIL(GT_ERR_VALUE, "groups: in_channels (%lld) and out_channels (%lld) must be "
                       "divisible by groups (%lld)", (long long)a->in_channels,
                       (long long)a->out_channels, (long long)a->groups);
    int64_t out_h = gt_conv2d_out_h(a), out_w = gt_conv2d_out_w(a);
    if (out_h < 1 || out_w < 1) {
        int tall = out_h < 1;
        return GT_FAIL(GT_ERR_VALUE, "%s: the dilated kernel (%lld) is larger than the padded input "
                       "(%lld)", tall ? "kernel_h" : "kernel_w",
                       (long long)(tall ? a->dilation_h * (a->kernel_h - 1) + 1
                                        : a->dilation_w * (a->kernel_w - 1) + 1),
                       (long long)(tall ? a->height + 2 * a->pad_h : a->width + 2 * a->pad_w));
    }
    GT_TRY(check_conv_extents(a, out_h, out_w));
    if (a->batch == 0)
        return GT_OK;
    if (!backward) {
        GT_TRY(gt_op_check_ptr(a->x, "x"));
        GT_TRY(gt_op_check_ptr(a->weight, "weight"));
        return gt_op_check_ptr(a->out, "out");
    }
    GT_TRY(gt_op_check_ptr(a->dout, "dout"));
    if (a->dx)
        GT_TRY(gt_op_check_ptr(a->weight, "weight"));
    return a->dweight ? gt_op_check_ptr(a->x, "x") : GT_OK;
}

/* 1 when an element offset of an attention operand with these strides could overflow int64. */
static int attention_strides_overflow(const gt_attention_args *a, const gt_attn_strides *s, int64_t heads) {
    int64_t last = 0, term = 0;
    int64_t extents[3] = {a->batch - 1, heads - 1, a->seq - 1}, steps[3] = {s->batch, s->head, s->row};
    for (int i = 0; i < 3; i++) {
        if (steps[i] < 0 || __builtin_mul_overflow(extents[i], steps[i], &term) ||
            __builtin_add_overflow(last, term, &last))
            return 1;
    }
    return __builtin_add_overflow(last, a->head_dim, &last);
}

gt_status gt_attention_check(const gt_attention_args *a, int backward, int64_t max_head_dim) {
    GT_TRY(gt_op_check_size(a->batch, "batch"));
    GT_TRY(gt_op_check_size(a->heads, "heads"));
    GT_TRY(gt_op_check_size(a->seq, "seq"));
    GT_TRY(gt_op_check_dtype(a->dt, "dt"));
    if (a->head_dim < 1)
        return GT_FAIL(GT_ERR_VALUE, "head_dim: must be >= 1, got %lld", (long long)a->head_dim);
    if (max_head_dim > 0 && a->head_dim > max_head_dim)
        return GT_FAIL(GT_ERR_VALUE, "head_dim: must be in [1, %lld] on this backend, got %lld",
                       (long long)max_head_dim, (long long)a->head_dim);
    if (!isfinite(a->scale))
        return GT_FAIL(GT_ERR_VALUE, "scale: must be finite, got %g", (double)a->scale);
    if (!(a->dropout_p >= 0.0 && a->dropout_p <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "dropout_p: must be in [0, 1], got %g", a->dropout_p);
    if (a->window < 0)
        return GT_FAIL(GT_ERR_VALUE, "window: must be >= 0 (0: no window), got %lld", (long long)a->window);
    if (a->heads > 0 && (a->kv_heads < 1 || a->heads % a->kv_heads != 0))
        return GT_FAIL(GT_ERR_VALUE, "kv_heads: must be >= 1 and divide heads (%lld), got %lld",
                       (long long)a->heads, (long long)a->kv_heads);
    if (a->batch == 0 || a->heads == 0 || a->seq == 0)
        return GT_OK;
    if (attention_strides_overflow(a, &a->in, a->heads) ||
        attention_strides_overflow(a, &a->kv, a->kv_heads) ||
        attention_strides_overflow(a, &a->out_strides, a->heads))
        return GT_FAIL(GT_ERR_VALUE, "strides: negative, or beyond 64-bit element offsets");
    GT_TRY(gt_op_check_ptr(a->q, "q"));
    GT_TRY(gt_op_check_ptr(a->k, "k"));
    GT_TRY(gt_op_check_ptr(a->v, "v"));
    GT_TRY(gt_op_check_ptr(a->out, "out"));
    GT_TRY(gt_op_check_ptr(a->lse, "lse"));
    if (!backward)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(a->dout, "dout"));
    GT_TRY(gt_op_check_ptr(a->dq, "dq"));
    GT_TRY(gt_op_check_ptr(a->dk, "dk"));
    return gt_op_check_ptr(a->dv, "dv");
}

/* 1 when an element offset of a disentangled attention operand could overflow int64. */
static int disentangled_strides_overflow(const gt_disentangled_args *a, const gt_attn_strides *s) {
    gt_attention_args like = {.batch = a->batch, .seq = a->seq, .head_dim = a->head_dim};
    return attention_strides_overflow(&like, s, a->heads);
}

gt_status gt_disentangled_check(const gt_disentangled_args *a, int backward) {
    GT_TRY(gt_op_check_size(a->batch, "batch"));
    GT_TRY(gt_op_check_size(a->heads, "heads"));
    GT_TRY(gt_op_check_size(a->seq, "seq"));
    GT_TRY(gt_op_check_dtype(a->dt, "dt"));
    if (a->head_dim < 1 || a->span < 1)
        return GT_FAIL(GT_ERR_VALUE, "head_dim and span: must be >= 1, got %lld and %lld",
                       (long long)a->head_dim, (long long)a->span);
    if (!isfinite(a->scale))
        return GT_FAIL(GT_ERR_VALUE, "scale: must be finite, got %g", (double)a->scale);
    if (!(a->dropout_p >= 0.0 && a->dropout_p <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "dropout_p: must be in [0, 1], got %g", a->dropout_p);
    if (a->batch == 0 || a->heads == 0 || a->seq == 0)
        return GT_OK;
    int64_t pos_last = 0;
    if (disentangled_strides_overflow(a, &a->in) || disentangled_strides_overflow(a, &a->out_strides) ||
        a->pos_row < a->heads * a->head_dim || __builtin_mul_overflow(2 * a->span, a->pos_row, &pos_last))
        return GT_FAIL(GT_ERR_VALUE, "strides: negative, too small, or beyond 64-bit element offsets");
    GT_TRY(gt_op_check_ptr(a->rel_index, "rel_index"));
    GT_TRY(gt_op_check_ptr(a->q, "q"));
    GT_TRY(gt_op_check_ptr(a->k, "k"));
    GT_TRY(gt_op_check_ptr(a->v, "v"));
    GT_TRY(gt_op_check_ptr(a->lse, "lse"));
    if (!backward)
        return gt_op_check_ptr(a->out, "out");
    GT_TRY(gt_op_check_ptr(a->dout, "dout"));
    if (a->dq && (!a->dk || !a->dv))
        return GT_FAIL(GT_ERR_VALUE, "dk, dv: must be given with dq");
    if (a->pos_k && !a->dpos_k)
        return GT_FAIL(GT_ERR_VALUE, "dpos_k: must be given with pos_k");
    if (a->pos_q && !a->dpos_q)
        return GT_FAIL(GT_ERR_VALUE, "dpos_q: must be given with pos_q");
    return GT_OK;
}

/* Rows and columns >= 0 and an activation dtype: what every DoRA op checks first. */
static gt_status dora_matrix_check(int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(gt_op_check_size(rows, "rows"));
    GT_TRY(gt_op_check_size(cols, "cols"));
    return gt_op_check_dtype(dt, "dt");
}

gt_status gt_dora_norm_check(const float *scale, const float *norm, const float *w, const float *magnitude,
                             int64_t rows, int64_t cols) {
    GT_TRY(dora_matrix_check(rows, cols, GT_F32));
    if (rows == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(scale, "scale"));
    GT_TRY(gt_op_check_ptr(norm, "norm"));
    GT_TRY(gt_op_check_ptr(w, "w"));
    return gt_op_check_ptr(magnitude, "magnitude");
}

gt_status gt_dora_combine_check(const void *out, const void *u, const void *v, const float *scale, int64_t rows,
                                int64_t cols, gt_dtype dt) {
    GT_TRY(dora_matrix_check(rows, cols, dt));
    if (rows == 0 || cols == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(u, "u"));
    GT_TRY(gt_op_check_ptr(v, "v"));
    return gt_op_check_ptr(scale, "scale");
}

gt_status gt_col_scale_check(const void *out, const void *in, const float *scale, int64_t rows, int64_t cols,
                             gt_dtype dt) {
    GT_TRY(dora_matrix_check(rows, cols, dt));
    if (rows == 0 || cols == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(out, "out"));
    GT_TRY(gt_op_check_ptr(in, "in"));
    return gt_op_check_ptr(scale, "scale");
}

gt_status gt_dora_magnitude_backward_check(const float *dmagnitude, const void *dout, const void *u, const void *v,
                                           const float *norm, int64_t rows, int64_t cols, gt_dtype dt) {
    GT_TRY(dora_matrix_check(rows, cols, dt));
    if (cols == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dmagnitude, "dmagnitude"));
    GT_TRY(gt_op_check_ptr(norm, "norm"));
    if (rows == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dout, "dout"));
    GT_TRY(gt_op_check_ptr(u, "u"));
    return gt_op_check_ptr(v, "v");
}
