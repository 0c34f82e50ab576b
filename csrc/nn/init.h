/* Internal to csrc/nn: parameter initialisation of a layer tree. */
#ifndef GT_NN_INIT_H
#define GT_NN_INIT_H

#include "nn/layer.h"

/* Initialises every parameter below `root` from `seed`, in state_dict order. */
void gt_init_layer_tree(gt_layer *root, uint64_t seed);

#endif
