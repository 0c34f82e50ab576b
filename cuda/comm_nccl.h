/* The CUDA backend's collectives (core/device_backend.h's allreduce_sum, broadcast and allgather) over NCCL
 * (cuda/comm_nccl.cu). NOT YET RUN ON A GPU: compiled and linked against the toolkit's NCCL and
 * NVIDIA's nvidia-nccl-cu13 wheel only.
 *
 * The NCCL communicator is made on a communicator's first device collective: rank 0's
 * ncclGetUniqueId is broadcast over the communicator's host transport (MPI), then every rank
 * calls ncclCommInitRank. ncclAllReduce's sum is not in rank order for more than 2 ranks, so the
 * all-reduce is the one of dist/comm.h made of grouped ncclSend/ncclRecv: per bucket, a
 * reduce-scatter into a device staging buffer, a kernel summing each element in rank order
 * ((x_0 + x_1) + x_2 ..., the CPU's bits), then an all-gather of the summed chunks. A watchdog
 * thread polls an event recorded after each collective against the communicator's deadline;
 * past it, it records a GT_ERR_TIMEOUT in the communicator (dist/comm_device.h) and calls
 * ncclCommAbort, so the queued work ends and the step fails at its read. `stream` is a
 * cudaStream_t on device `index` (current). Included by C files only with GT_WITH_CUDA. */
#ifndef GT_COMM_NCCL_H
#define GT_COMM_NCCL_H

#include <stddef.h>

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gt_comm;

gt_status gt_cuda_nccl_allreduce_sum(int index, struct gt_comm *comm, gt_dtype dtype, void *buf, size_t n,
                                     void *stream);
gt_status gt_cuda_nccl_broadcast(int index, struct gt_comm *comm, void *buf, size_t bytes, int root, void *stream);
/* buf (n f32) in gt_comm_chunk's chunks: chunk r from rank r to every rank (the all-gather phase
 * of the all-reduce over the whole buffer: no staging). */
gt_status gt_cuda_nccl_allgather(int index, struct gt_comm *comm, float *buf, size_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
