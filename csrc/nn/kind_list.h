/* Every layer kind: X(NAME, name), in enum order (append a new kind at the end). NAME gives the
 * enum value GT_LAYER_NAME; name is the kind's spec name (the first item of its spec tuple) and
 * its row, `gt_layer_type gt_layer_type_name` (nn/kind.h), defined in the kind's C file or, for
 * the kinds that predate the table, in nn/kinds.c. */
#ifndef GT_NN_KIND_LIST_H
#define GT_NN_KIND_LIST_H

#define GT_LAYER_KIND_LIST(X) \
    X(LINEAR, linear)         \
    X(ACTIVATION, activation) \
    X(DROPOUT, dropout)       \
    X(LAYERNORM, layernorm)   \
    X(EMBEDDING, embedding)   \
    X(FLATTEN, flatten)       \
    X(SEQUENTIAL, sequential) \
    X(RESIDUAL, residual)     \
    X(ATTENTION, attention)   \
    X(TOKENS, tokens)         \
    X(POOL, pool)             \
    X(POSITION, position)     \
    X(CONV2D, conv2d)         \
    X(BATCHNORM2D, batchnorm2d) \
    X(POOL2D, pool2d)         \
    X(RMSNORM, rmsnorm)       \
    /* end of the list */

#endif
