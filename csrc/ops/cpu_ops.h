/* The CPU backend's op functions: gt_cpu_<op> for every op of GT_OP_LIST (ops.h), with its
 * signature and semantics, defined in csrc/ops/cpu_*.c (one group per file: cpu_gemm.c,
 * cpu_bias.c, cpu_activation.c, cpu_dropout.c, cpu_add.c, cpu_layernorm.c, cpu_embedding.c,
 * cpu_xent.c, cpu_reduce.c, cpu_memory.c, cpu_attention.c, cpu_pool.c, cpu_conv.c,
 * cpu_batchnorm.c, cpu_pool2d.c, cpu_rope.c, cpu_glu.c) and gathered into the table of gt_cpu_ops() by cpu_ops.c. */
#ifndef GT_CPU_OPS_H
#define GT_CPU_OPS_H

#include "ops/ops.h"

#define GT_CPU_DECLARE(kind, name, params, skip) gt_op_##name##_fn gt_cpu_##name;
GT_OP_LIST(GT_CPU_DECLARE)
#undef GT_CPU_DECLARE

/* Elements [begin, end) of one block of 4-bit codes (begin even) into out in dt: the block's 16
 * possible outputs, code[k] * scale rounded once (gt_quant_decode_store), looked up per element,
 * whole vectors by the SIMD level's kernel (quant_kernels.h) (cpu_quant.c; the quantized
 * embedding's rows too). */
void gt_cpu_dequantize4_block(void *out, const uint8_t *codes, float scale, const float *code, size_t begin,
                              size_t end, gt_dtype dt);

#endif
