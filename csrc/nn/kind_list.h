/* Every layer kind: X(NAME, name), in enum order (append a new kind at the end). NAME gives the
 * enum value GT_LAYER_NAME; name is the kind's spec name (the first item of its spec tuple) and
 * its row, `gt_layer_type gt_layer_type_name` (nn/kind.h), defined in the kind's C file or, for
 * the kinds that predate the table, in nn/kinds.c. */
#ifndef GT_NN_KIND_LIST_H
#define GT_NN_KIND_LIST_H

#define GT_LAYER_KIND_LIST(X)                                                                       \
    X(LINEAR, linear)           /* (..., in) -> (..., out): x W^T + b */                            \
    X(ACTIVATION, activation)   /* elementwise ReLU, GELU, tanh, SiLU */                            \
    X(DROPOUT, dropout)         /* elementwise, Philox masks */                                     \
    X(LAYERNORM, layernorm)     /* (..., C) -> same */                                              \
    X(EMBEDDING, embedding)     /* int64 ids (...) -> (..., dim) */                                 \
    X(FLATTEN, flatten)         /* (N, ...) -> (N, rest): a view */                                 \
    X(SEQUENTIAL, sequential)   /* its children, one after another */                               \
    X(RESIDUAL, residual)       /* x + block(x) */                                                  \
    X(ATTENTION, attention)     /* (B, T, 3E) fused q|k|v -> (B, T, E); no parameters */            \
    X(TOKENS, tokens)           /* (B, C, T) int64 ids | token types | 0/1 mask -> (B, T, E) */     \
    X(POOL, pool)               /* (B, T, E) -> (B, E): first token or masked mean */               \
    X(POSITION, position)       /* (..., T, C) + weight[o:o+T] (num_positions, C), offset o */      \
    X(CONV2D, conv2d)           /* (N, C, H, W) -> (N, O, OH, OW) */                                \
    X(BATCHNORM2D, batchnorm2d) /* (N, C, H, W) -> same; weight, bias (C,); running statistics */   \
    X(POOL2D, pool2d)           /* (N, C, H, W) -> (N, C, OH, OW): max, average, adaptive average */ \
    X(RMSNORM, rmsnorm)         /* (..., G C) -> same: x / sqrt(mean(x^2) + eps) * weight per C */  \
    X(ROPE, rope)               /* (B, T, (H + 2K) D) [q | k | v]: q and k heads rotate, v passes */ \
    X(PARALLEL, parallel)       /* children on the same input, outputs concatenated (last dim) */  \
    X(GLU, glu)                 /* (..., 2 I) [gate | up] -> (..., I): act(gate) * up */            \
    X(SCALE, scale)             /* elementwise x * dt(factor) */                                    \
    X(BIAS, bias)               /* (..., C) + b (C,): an LM head's bias after a tied_linear */      \
    X(DISENTANGLED_ATTENTION, disentangled_attention) /* (B, T, 3E) -> (B, T, E): DeBERTa's */ \
    X(QLINEAR, qlinear)         /* Linear over a frozen NF4/FP4 weight, dequantized tile by tile */ \
    X(LORA, lora)               /* (..., in) -> (..., out): frozen Linear + LoRA's B A path */      \
    X(CHECKPOINT, checkpoint)   /* block(x): with checkpointing, one recomputed unit (x kept) */    \
    /* end of the list */

#endif
