/* The simulated device's op table (ops/ops.h): every op copies its arguments into a job on the
 * backend's sim stream and returns; the stream's worker runs the CPU backend's op
 * (gt_cpu_ops()) with them. Only sum_squares (its *out is a host result) waits for the stream;
 * softmax_xent's *count and mse's *loss are sim memory written by the job, and a failing job (a
 * target or an embedding id out of range: the CPU op checks before it touches memory) is the
 * stream's sticky error, returned by its next synchronisation (the CUDA table's id and target
 * checks wait for their stream instead). */
#ifndef GT_SIM_OPS_H
#define GT_SIM_OPS_H

#include "core/device_backend.h"
#include "ops/ops.h"

/* What a sim gt_backend's `impl` points to. */
typedef struct gt_sim_backend_state {
    int index;           /* sim ordinal */
    gt_stream *stream;   /* the stream the ops queue on; NULL: the default stream */
} gt_sim_backend_state;

const gt_ops *gt_sim_ops(void);

/* Fills `be` with the sim table on device `index`, queueing on `stream`. */
gt_status gt_sim_backend_init(gt_backend *be, int index, gt_stream *stream);

/* Waits for the backend's stream and frees its state; impl NULL is ignored. */
void gt_sim_backend_release(gt_backend *be);

#endif
