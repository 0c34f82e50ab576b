/* The start of a data-parallel job: every rank's parameters become one rank's. */
#ifndef GT_DIST_PARAMS_H
#define GT_DIST_PARAMS_H

#include "dist/comm.h"
#include "nn/model.h"

/* The model's (num_params,) f32 parameters on every rank become rank `root`'s, and its half-
 * precision copy follows: what a job does once after building its model, so that ranks that
 * initialised differently start from the same weights (DDP's broadcast at construction). A
 * device model's are sent by its device (the backend's broadcast on comm's stream, ordered by
 * events: dist/comm_device.h); the host then waits for the model's stream, once. */
gt_status gt_dist_broadcast_params(gt_comm *comm, gt_model *model, int root);

#endif
