/* Thread counts: one setting drives OpenMP regions, which also split the GEMMs. */
#ifndef GT_THREADS_H
#define GT_THREADS_H

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Once per process: a process forked from this one runs gputrain on one thread (GNU OpenMP's
 * pool does not survive fork; a team of more threads would hang in the child). */
void gt_threads_init(void);

/* Sets the threads used by gputrain's parallel loops, GEMMs included (n >= 1; 1 in a forked
 * child, see gt_threads_init). */
gt_status gt_set_num_threads(int n);

/* Threads used by parallel loops. */
int gt_get_num_threads(void);

/* Logical CPUs this process may run on. */
int gt_cpu_count(void);

#ifdef __cplusplus
}
#endif
#endif
