/* The simulated device's collectives (core/device_backend.h's allreduce_sum, broadcast and
 * allgather): a job on the stream whose worker runs the communicator's host collective
 * (dist/comm.h, through its transport: MPI) on the buffer in place, since sim's device memory is
 * host memory. The transport's deadline runs on the worker as on the host; a failure is kept by
 * the stream and by the communicator (dist/comm_device.h). */
#ifndef GT_SIM_COMM_H
#define GT_SIM_COMM_H

#include "core/device_backend.h"

gt_status gt_sim_allreduce_sum(int index, gt_stream *stream, struct gt_comm *comm, gt_dtype dtype, void *buf,
                               size_t n);
gt_status gt_sim_broadcast(int index, gt_stream *stream, struct gt_comm *comm, void *buf, size_t bytes, int root);
gt_status gt_sim_allgather(int index, gt_stream *stream, struct gt_comm *comm, float *buf, size_t n);

#endif
