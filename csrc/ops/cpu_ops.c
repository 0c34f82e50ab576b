/* The CPU backend's op table (ops.h): every op of csrc/ops/cpu_*.c in one static table. */
#include "ops/cpu_ops.h"

static const gt_ops cpu_ops = {
    .name = "cpu",
    .gemm_workspace_bytes = gt_cpu_gemm_workspace_bytes,
    .gemm = gt_cpu_gemm,
    .bias_add = gt_cpu_bias_add,
    .bias_backward = gt_cpu_bias_backward,
    .activation_forward = gt_cpu_activation_forward,
    .activation_backward = gt_cpu_activation_backward,
    .dropout_forward = gt_cpu_dropout_forward,
    .dropout_backward = gt_cpu_dropout_backward,
    .add = gt_cpu_add,
    .layernorm_forward = gt_cpu_layernorm_forward,
    .layernorm_backward = gt_cpu_layernorm_backward,
    .embedding_forward = gt_cpu_embedding_forward,
    .embedding_backward = gt_cpu_embedding_backward,
    .softmax_xent = gt_cpu_softmax_xent,
    .mse = gt_cpu_mse,
    .sum_squares = gt_cpu_sum_squares,
    .cast = gt_cpu_cast,
    .copy = gt_cpu_copy,
    .zero = gt_cpu_zero,
    .attention_workspace_bytes = gt_cpu_attention_workspace_bytes,
    .attention_forward = gt_cpu_attention_forward,
    .attention_backward = gt_cpu_attention_backward,
    .batchnorm_forward = gt_cpu_batchnorm_forward,
    .batchnorm_backward = gt_cpu_batchnorm_backward,
    .pool2d_workspace_bytes = gt_cpu_pool2d_workspace_bytes,
    .pool2d_forward = gt_cpu_pool2d_forward,
    .pool2d_backward = gt_cpu_pool2d_backward,
};

const gt_ops *gt_cpu_ops(void) { return &cpu_ops; }
