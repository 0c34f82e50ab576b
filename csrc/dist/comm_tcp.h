/* The TCP transport of comm.h: one connected stream socket per pair of ranks (a full mesh),
 * which gputrain.distributed sets up through its TCP store (rank 0 listens at MASTER_ADDR:
 * MASTER_PORT) when the job was launched torchrun-style, without MPI. */
#ifndef GT_DIST_COMM_TCP_H
#define GT_DIST_COMM_TCP_H

#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills `comm` (zeroed by the caller) with the TCP transport for `rank` of `size`: fds[p] is the
 * connected socket to rank p (fds[rank] is ignored). The transport owns (and closes) the sockets
 * once this succeeded; on failure they are left open and nothing is left allocated. */
gt_status gt_comm_tcp_create(const int *fds, int rank, int size, double timeout_s, gt_comm *comm);

#ifdef __cplusplus
}
#endif
#endif
