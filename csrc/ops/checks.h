/* Argument checks every backend's ops share (the same rules and messages on the CPU and on
 * CUDA), and the shapes of a GEMM's operands as they are stored. */
#ifndef GT_OPS_CHECKS_H
#define GT_OPS_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fails with GT_ERR_VALUE unless `dt` is an activation dtype (f32, f16, bf16). */
gt_status gt_op_check_dtype(gt_dtype dt, const char *arg_name);

/* Fails with GT_ERR_VALUE when a size is negative. */
gt_status gt_op_check_size(int64_t value, const char *arg_name);

/* Fails with GT_ERR_VALUE when a pointer needed for a non-empty op is NULL. */
gt_status gt_op_check_ptr(const void *ptr, const char *arg_name);

/* Checks a GEMM's dtypes, sizes (within 32-bit BLAS ints), leading dimensions, batch, strides
 * and pointers, naming the offending field. */
gt_status gt_gemm_check(const gt_gemm_args *g);

/* Checks a convolution's sizes (each in [1, INT_MAX], batch >= 0, pads >= 0, channels divisible
 * by groups, a kernel that fits the padded input, element counts that fit memory, the GEMM sizes
 * of an im2col product within 32-bit BLAS ints), dtype, and the pointers the forward
 * (backward = 0) or the backward needs, naming the offending field; batch 0 checks the sizes only. */
gt_status gt_conv2d_check(const gt_conv2d_args *a, int backward);

/* What every backend checks of an attention call (gt_attention_args), naming the offending
 * field: sizes, dtype, head_dim in [1, max_head_dim] (max_head_dim 0: no upper limit), a finite
 * scale, dropout_p in [0, 1], window >= 0, kv_heads >= 1 dividing heads, strides whose offsets
 * fit int64, and the pointers the forward (backward = 0) or the backward needs. Key lengths are
 * the backend's to check (they may be device memory); every key_starts value is valid. */
gt_status gt_attention_check(const gt_attention_args *a, int backward, int64_t max_head_dim);

/* What every backend checks of a disentangled attention call (gt_disentangled_args): sizes, dtype,
 * scale, dropout, strides and the pointers the pass reads or writes (not the values of rel_index
 * or key_lengths, which may be device memory). */
gt_status gt_disentangled_check(const gt_disentangled_args *a, int backward);

/* What every backend checks of the DoRA ops (ops.h), naming the offending argument: rows and
 * cols >= 0, an activation dtype, and the pointers a non-empty call reads or writes.
 * dora_norm: f32, its four arrays when rows > 0. */
gt_status gt_dora_norm_check(const float *scale, const float *norm, const float *w, const float *magnitude,
                             int64_t rows, int64_t cols);

/* dora_combine: out, u, v and scale, when rows and cols are > 0. */
gt_status gt_dora_combine_check(const void *out, const void *u, const void *v, const float *scale, int64_t rows,
                                int64_t cols, gt_dtype dt);

/* col_scale: out, in and scale, when rows and cols are > 0. */
gt_status gt_col_scale_check(const void *out, const void *in, const float *scale, int64_t rows, int64_t cols,
                             gt_dtype dt);

/* dora_magnitude_backward: dmagnitude and norm when cols > 0; dout, u and v when rows are too. */
gt_status gt_dora_magnitude_backward_check(const float *dmagnitude, const void *dout, const void *u, const void *v,
                                           const float *norm, int64_t rows, int64_t cols, gt_dtype dt);

/* Rows and columns of A and B as stored (before the transposes). */
static inline size_t gt_gemm_a_rows(const gt_gemm_args *g) { return (size_t)(g->trans_a ? g->k : g->m); }
static inline size_t gt_gemm_a_cols(const gt_gemm_args *g) { return (size_t)(g->trans_a ? g->m : g->k); }
static inline size_t gt_gemm_b_rows(const gt_gemm_args *g) { return (size_t)(g->trans_b ? g->n : g->k); }
static inline size_t gt_gemm_b_cols(const gt_gemm_args *g) { return (size_t)(g->trans_b ? g->k : g->n); }

#ifdef __cplusplus
}
#endif
#endif
