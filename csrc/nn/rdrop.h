/* R-Drop (Liang et al. 2021) in the training step: each micro-batch's rows are fed twice (the
 * caller stacks the micro-batch on itself, so rows i and B + i of a 2B-row micro-batch are one
 * example; their dropout masks differ because Philox's counter runs over the row index), and
 * the loss is ops.h's softmax_xent_rdrop: cross-entropy averaged over both passes plus
 * rdrop_alpha times the symmetric KL of the pairs' distributions averaged over the pairs. */
#ifndef GT_NN_RDROP_H
#define GT_NN_RDROP_H

#include "nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks loss->rdrop_alpha against the loss and the model's planned output `out`: a finite
 * number >= 0; > 0 only with cross-entropy and an output of an even number of rows (dim 0). */
gt_status gt_rdrop_check(const gt_loss *loss, const gt_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
