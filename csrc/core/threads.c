#include "core/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

gt_status gt_set_num_threads(int n) {
    if (n < 1)
        return GT_FAIL(GT_ERR_VALUE, "num_threads must be >= 1, got %d", n);
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
