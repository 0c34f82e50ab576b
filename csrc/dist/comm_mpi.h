/* The MPI transport of comm.h, calling the MPI library that the process already loaded (mpi4py's,
 * e.g. the `mpich` wheel) through dlsym: gputrain is built without MPI headers or libraries. */
#ifndef GT_DIST_COMM_MPI_H
#define GT_DIST_COMM_MPI_H

#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the caller read from its MPI binding (mpi4py: MPI._handleof, MPI._sizeof). */
typedef struct gt_mpi_handles {
    const char *library;   /* path of the loaded MPI library (libmpi.so.12, ...) */
    int64_t comm;          /* the MPI_Comm to use (a Dup of MPI_COMM_WORLD) */
    int64_t byte_type;     /* MPI_BYTE */
    int handle_bytes;      /* sizeof(MPI_Comm) = sizeof(MPI_Request): 4 (the MPICH ABI) */
    int status_bytes;      /* sizeof(MPI_Status) */
} gt_mpi_handles;

/* Fills `comm` (zeroed by the caller) with the MPI transport for `rank` of `size`; on failure
 * nothing is left allocated. */
gt_status gt_comm_mpi_create(const gt_mpi_handles *handles, int rank, int size, double timeout_s, gt_comm *comm);

#ifdef __cplusplus
}
#endif
#endif
