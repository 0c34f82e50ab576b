#include "sim/sim_comm.h"

#include "dist/comm.h"
#include "dist/comm_device.h"
#include "sim/sim_stream.h"

typedef struct comm_job {
    gt_comm *comm;    /* the communicator */
    void *buf;        /* the buffer, in place */
    size_t n;         /* its elements (all-reduce, all-gather) or bytes (broadcast) */
    gt_dtype dtype;   /* GT_F32 or GT_F64 (all-reduce) */
    int root;         /* the rank broadcast from */
} comm_job;

/* buf (n f64) summed over the ranks in rank order, element by element (a loss sum: n is small). */
static gt_status sum_f64(gt_comm *comm, double *buf, size_t n) {
    for (size_t i = 0; i < n; i++)
        GT_TRY(gt_comm_sum_f64(comm, buf[i], &buf[i]));
    return GT_OK;
}

static gt_status run_allreduce(void *args) {
    comm_job *j = args;
    gt_status status = j->dtype == GT_F32 ? gt_comm_allreduce_sum_f32(j->comm, j->buf, j->n)
                                          : sum_f64(j->comm, j->buf, j->n);
    return gt_comm_device_failed(j->comm, status);
}

static gt_status run_broadcast(void *args) {
    comm_job *j = args;
    return gt_comm_device_failed(j->comm, gt_comm_broadcast(j->comm, j->buf, j->n, j->root));
}

gt_status gt_sim_allreduce_sum(int index, gt_stream *stream, struct gt_comm *comm, gt_dtype dtype, void *buf,
                               size_t n) {
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: no communicator");
    if (dtype != GT_F32 && dtype != GT_F64)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: dtype must be float32 or float64, got dtype %d", (int)dtype);
    if (n && !buf)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: NULL buffer for %zu elements", n);
    comm_job job = {.comm = comm, .buf = buf, .n = n, .dtype = dtype};
    return gt_sim_enqueue(index, stream, run_allreduce, &job, sizeof job);
}

gt_status gt_sim_broadcast(int index, gt_stream *stream, struct gt_comm *comm, void *buf, size_t bytes, int root) {
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "broadcast: no communicator");
    if (root < 0 || root >= comm->size)
        return GT_FAIL(GT_ERR_VALUE, "root must be in [0, %d), got %d", comm->size, root);
    if (bytes && !buf)
        return GT_FAIL(GT_ERR_VALUE, "broadcast: NULL buffer for %zu bytes", bytes);
    comm_job job = {.comm = comm, .buf = buf, .n = bytes, .root = root};
    return gt_sim_enqueue(index, stream, run_broadcast, &job, sizeof job);
}

static gt_status run_allgather(void *args) {
    comm_job *j = args;
    return gt_comm_device_failed(j->comm, gt_comm_allgather(j->comm, j->buf, j->n, sizeof(float)));
}

gt_status gt_sim_allgather(int index, gt_stream *stream, struct gt_comm *comm, float *buf, size_t n) {
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "allgather: no communicator");
    if (n && !buf)
        return GT_FAIL(GT_ERR_VALUE, "allgather: NULL buffer for %zu elements", n);
    comm_job job = {.comm = comm, .buf = buf, .n = n};
    return gt_sim_enqueue(index, stream, run_allgather, &job, sizeof job);
}
