#include "core/threads.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

gt_status gt_set_num_threads(int n) {
    if (n < 1)
        return GT_FAIL(GT_ERR_VALUE, "num_threads must be >= 1, got %d", n);
    omp_set_num_threads(n);
    gt_threads_init();
    return GT_OK;
}

void gt_threads_init(void) {
    /* One thread pool: GEMMs are split over OpenMP threads (ops/cpu_sgemm.c), each calling a
     * single-threaded sgemm, so OpenBLAS's own pthreads never spin against OpenMP's. */
    openblas_set_num_threads(1);
}

int gt_get_num_threads(void) { return omp_get_max_threads(); }

int gt_blas_num_threads(void) { return openblas_get_num_threads(); }

int gt_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
