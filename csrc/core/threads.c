#include "core/threads.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

/* Set in a process forked from one that loaded gputrain: GNU OpenMP keeps its parent's thread
 * pool, whose threads do not exist in the child, so a team of more than one thread hangs there. */
static atomic_bool forked_child;

static void on_fork_in_child(void) {
    atomic_store(&forked_child, true);
    omp_set_num_threads(1);
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, on_fork_in_child); }

void gt_threads_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
}

gt_status gt_set_num_threads(int n) {
    if (n < 1)
        return GT_FAIL(GT_ERR_VALUE, "num_threads must be >= 1, got %d", n);
    if (n > 1 && atomic_load(&forked_child))
        return GT_FAIL(GT_ERR_RUNTIME,
                       "num_threads=%d: this process was forked from one that had loaded gputrain, and GNU "
                       "OpenMP cannot start threads after fork, so gputrain runs on 1 thread here; start "
                       "the process with the 'spawn' or 'forkserver' method to use more",
                       n);
    omp_set_num_threads(n);
    return GT_OK;
}

int gt_get_num_threads(void) { return omp_get_max_threads(); }

int gt_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
