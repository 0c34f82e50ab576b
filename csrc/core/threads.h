/* Thread counts: one setting drives OpenMP regions and the BLAS thread pool. */
#ifndef GT_THREADS_H
#define GT_THREADS_H

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the threads used by gputrain's parallel loops and by the BLAS (n >= 1). */
gt_status gt_set_num_threads(int n);

/* Threads used by parallel loops. */
int gt_get_num_threads(void);

/* Threads the BLAS library uses. */
int gt_blas_num_threads(void);

/* Logical CPUs this process may run on. */
int gt_cpu_count(void);

#ifdef __cplusplus
}
#endif
#endif
