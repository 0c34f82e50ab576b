/* The CPU backend's op functions, one group per file (csrc/ops/cpu_*.c), gathered into the
 * table of gt_cpu_ops() by cpu_ops.c. Signatures and semantics are those of ops.h. */
#ifndef GT_CPU_OPS_H
#define GT_CPU_OPS_H

#include "ops/ops.h"

/* cpu_gemm.c */
size_t gt_cpu_gemm_workspace_bytes(const gt_gemm_args *args);
gt_status gt_cpu_gemm(gt_backend *be, const gt_gemm_args *args);

/* cpu_bias.c */
gt_status gt_cpu_bias_add(gt_backend *be, void *out, const float *bias, int64_t rows,
                          int64_t cols, gt_dtype dt);
gt_status gt_cpu_bias_backward(gt_backend *be, float *dbias, const void *dout, int64_t rows,
                               int64_t cols, gt_dtype dt, int accumulate);

/* cpu_activation.c */
gt_status gt_cpu_activation_forward(gt_backend *be, void *out, const void *in, int64_t n,
                                    gt_activation act, gt_dtype dt);
gt_status gt_cpu_activation_backward(gt_backend *be, void *din, const void *dout,
                                     const void *in, int64_t n, gt_activation act, gt_dtype dt);

/* cpu_dropout.c */
gt_status gt_cpu_dropout_forward(gt_backend *be, void *out, const void *in, int64_t n, double p,
                                 gt_dropout_key key, gt_dtype dt);
gt_status gt_cpu_dropout_backward(gt_backend *be, void *din, const void *dout, int64_t n,
                                  double p, gt_dropout_key key, gt_dtype dt);

/* cpu_add.c */
gt_status gt_cpu_add(gt_backend *be, void *out, const void *a, const void *b, int64_t n,
                     gt_dtype dt);

/* cpu_layernorm.c */
gt_status gt_cpu_layernorm_forward(gt_backend *be, void *out, float *mean, float *rstd,
                                   const void *in, const float *weight, const float *bias,
                                   int64_t rows, int64_t cols, float eps, gt_dtype dt);
gt_status gt_cpu_layernorm_backward(gt_backend *be, void *din, float *dweight, float *dbias,
                                    const void *dout, const void *in, const float *weight,
                                    const float *mean, const float *rstd, int64_t rows,
                                    int64_t cols, gt_dtype dt, int accumulate);

/* cpu_embedding.c */
gt_status gt_cpu_embedding_forward(gt_backend *be, void *out, const int64_t *ids,
                                   const float *table, int64_t n, int64_t num, int64_t dim,
                                   gt_dtype dt);
gt_status gt_cpu_embedding_backward(gt_backend *be, float *dtable, const void *dout,
                                    const int64_t *ids, int64_t n, int64_t num, int64_t dim,
                                    gt_dtype dt, int accumulate);

/* cpu_pool.c */
gt_status gt_cpu_mask_lengths(gt_backend *be, int64_t *lengths, const int64_t *mask, int64_t batch,
                              int64_t seq, int64_t stride);
gt_status gt_cpu_pool_forward(gt_backend *be, void *out, const void *in, const int64_t *lengths,
                              int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt);
gt_status gt_cpu_pool_backward(gt_backend *be, void *din, const void *dout, const int64_t *lengths,
                               int64_t batch, int64_t seq, int64_t dim, gt_pool_mode mode, gt_dtype dt);

/* cpu_xent.c */
gt_status gt_cpu_softmax_xent(gt_backend *be, float *losses, int64_t *count, void *dlogits,
                              const void *logits, const int64_t *targets, int64_t rows,
                              int64_t classes, float label_smoothing, int64_t ignore_index,
                              float dloss_scale, gt_dtype dt);

/* cpu_reduce.c */
gt_status gt_cpu_mse(gt_backend *be, float *loss, void *dpred, const void *pred,
                     const float *target, int64_t n, float dloss_scale, gt_dtype dt);
gt_status gt_cpu_sum_squares(gt_backend *be, double *out, const float *x, int64_t n);

/* cpu_attention.c */
size_t gt_cpu_attention_workspace_bytes(const gt_attention_args *args, int threads);
gt_status gt_cpu_attention_forward(gt_backend *be, const gt_attention_args *args);
gt_status gt_cpu_attention_backward(gt_backend *be, const gt_attention_args *args);

/* cpu_conv.c */
size_t gt_cpu_conv2d_workspace_bytes(const gt_conv2d_args *args, int threads);
gt_status gt_cpu_conv2d_forward(gt_backend *be, const gt_conv2d_args *args);
gt_status gt_cpu_conv2d_backward(gt_backend *be, const gt_conv2d_args *args);

/* cpu_batchnorm.c */
gt_status gt_cpu_batchnorm_forward(gt_backend *be, const gt_batchnorm_args *args);
gt_status gt_cpu_batchnorm_backward(gt_backend *be, const gt_batchnorm_args *args);

/* cpu_pool2d.c */
size_t gt_cpu_pool2d_workspace_bytes(const gt_pool2d_args *args, int threads);
gt_status gt_cpu_pool2d_forward(gt_backend *be, const gt_pool2d_args *args);
gt_status gt_cpu_pool2d_backward(gt_backend *be, const gt_pool2d_args *args);

/* cpu_memory.c */
gt_status gt_cpu_cast(gt_backend *be, void *dst, gt_dtype dst_dt, const void *src,
                      gt_dtype src_dt, int64_t n);
gt_status gt_cpu_copy(gt_backend *be, void *dst, const void *src, size_t bytes);
gt_status gt_cpu_zero(gt_backend *be, void *dst, size_t bytes);

#endif
