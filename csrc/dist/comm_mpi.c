/* The MPI transport: non-blocking sends and receives (MPI_Isend/MPI_Irecv), polled with MPI_Test
 * against the communicator's deadline so that a dead peer is a GT_ERR_TIMEOUT naming it.
 * Handles are those of the MPICH ABI (int MPI_Comm, MPI_Datatype, MPI_Request), which the `mpich`
 * wheel, Intel MPI and MVAPICH share; Open MPI's pointer handles are refused with a message. */
#include "dist/comm_mpi.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int mpi_handle;  /* MPI_Comm, MPI_Datatype and MPI_Request in the MPICH ABI */
typedef int (*mpi_isend_fn)(const void *, int, mpi_handle, int, int, mpi_handle, mpi_handle *);
typedef int (*mpi_irecv_fn)(void *, int, mpi_handle, int, int, mpi_handle, mpi_handle *);
typedef int (*mpi_test_fn)(mpi_handle *, int *, void *);
typedef int (*mpi_request_fn)(mpi_handle *);

enum { GT_MPI_PIECE = 1 << 30, GT_MPI_STATUS_MAX = 64, GT_MPI_TAG_SPAN = 32000 };

typedef struct mpi_transport {
    void *library;              /* dlopen handle of the already loaded MPI library */
    mpi_isend_fn isend;         /* MPI_Isend */
    mpi_irecv_fn irecv;         /* MPI_Irecv */
    mpi_test_fn test;           /* MPI_Test */
    mpi_request_fn cancel;      /* MPI_Cancel */
    mpi_request_fn free_request;/* MPI_Request_free */
    mpi_handle comm;            /* the communicator */
    mpi_handle byte_type;       /* MPI_BYTE */
    _Alignas(16) unsigned char status[GT_MPI_STATUS_MAX];  /* an MPI_Status, ignored */
} mpi_transport;

/* One exchange in flight. */
struct gt_comm_pending {
    mpi_handle *requests;       /* (posted) its requests */
    int *peers;                 /* (posted) the peer of each request */
    signed char *done;          /* (posted) 1 once the request completed */
    size_t posted;              /* requests posted */
    size_t left;                /* requests not completed */
    uint64_t call;              /* the collective's number (for messages) */
    double deadline;            /* CLOCK_MONOTONIC seconds past which it timed out */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t pieces(size_t bytes) { return (bytes + GT_MPI_PIECE - 1) / GT_MPI_PIECE; }

static void pending_free(gt_comm_pending *x) {
    free(x->requests), free(x->peers), free(x->done), free(x);
}

static gt_status pending_alloc(size_t needed, gt_comm_pending **out) {
    gt_comm_pending *x = calloc(1, sizeof *x);
    if (x) {
        x->requests = calloc(needed + 1, sizeof *x->requests);
        x->peers = calloc(needed + 1, sizeof *x->peers);
        x->done = calloc(needed + 1, 1);
    }
    if (!x || !x->requests || !x->peers || !x->done) {
        if (x)
            pending_free(x);
        return GT_FAIL(GT_ERR_OOM, "MPI: out of host memory for %zu requests", needed);
    }
    *out = x;
    return GT_OK;
}

/* Posts the receives then the sends of one exchange, each message in pieces below INT_MAX bytes. */
static gt_status post(gt_comm *comm, int tag, const void *const *send, const size_t *send_bytes, void *const *recv,
                      const size_t *recv_bytes, gt_comm_pending *x) {
    mpi_transport *t = comm->impl;
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < comm->size; p++) {
            size_t bytes = pass == 0 ? recv_bytes[p] : send_bytes[p];
            for (size_t off = 0; off < bytes; off += GT_MPI_PIECE) {
                int count = (int)(bytes - off < GT_MPI_PIECE ? bytes - off : GT_MPI_PIECE);
                mpi_handle *req = &x->requests[x->posted];
                int rc = pass == 0 ? t->irecv((char *)recv[p] + off, count, t->byte_type, p, tag, t->comm, req)
                                   : t->isend((const char *)send[p] + off, count, t->byte_type, p, tag, t->comm, req);
                if (rc != 0)
                    return GT_FAIL(GT_ERR_RUNTIME, "MPI_%s to/from rank %d failed with MPI error %d",
                                   pass == 0 ? "Irecv" : "Isend", p, rc);
                x->peers[x->posted] = p;
                x->posted++, x->left++;
            }
        }
    }
    return GT_OK;
}

/* Cancels and frees the requests still in flight after a failure, then x. */
static void mpi_abandon(gt_comm *comm, gt_comm_pending *x) {
    mpi_transport *t = comm->impl;
    for (size_t i = 0; i < x->posted; i++) {
        if (!x->done[i]) {
            t->cancel(&x->requests[i]);
            t->free_request(&x->requests[i]);
        }
    }
    pending_free(x);
}

/* Names the first peer that has not completed, for the timeout message. */
static int silent_peer(const gt_comm_pending *x) {
    for (size_t i = 0; i < x->posted; i++)
        if (!x->done[i])
            return x->peers[i];
    return -1;
}

static gt_status mpi_start(gt_comm *comm, uint64_t call, const void *const *send, const size_t *send_bytes, void *const *recv,
                           const size_t *recv_bytes, gt_comm_pending **out) {
    size_t needed = 0;
    for (int p = 0; p < comm->size; p++)
        needed += pieces(send_bytes[p]) + pieces(recv_bytes[p]);
    gt_comm_pending *x = NULL;
    GT_TRY(pending_alloc(needed, &x));
    x->call = call;
    x->deadline = now_s() + comm->timeout_s;
    gt_status status = post(comm, (int)(call % GT_MPI_TAG_SPAN) + 1, send, send_bytes, recv, recv_bytes, x);
    if (status != GT_OK) {
        mpi_abandon(comm, x);
        return status;
    }
    *out = x;
    return GT_OK;
}

/* Tests every unfinished request once; on completion frees x. */
static gt_status mpi_test(gt_comm *comm, gt_comm_pending *x, int *done) {
    mpi_transport *t = comm->impl;
    for (size_t i = 0; i < x->posted; i++) {
        int flag = 0;
        if (x->done[i])
            continue;
        if (t->test(&x->requests[i], &flag, t->status) != 0)
            return GT_FAIL(GT_ERR_RUNTIME, "MPI_Test with rank %d failed", x->peers[i]);
        if (flag)
            x->done[i] = 1, x->left--;
    }
    *done = x->left == 0;
    if (*done) {
        pending_free(x);
        return GT_OK;
    }
    if (now_s() > x->deadline)
        return GT_FAIL(GT_ERR_TIMEOUT, "rank %d: collective #%llu with rank %d did not complete within "
                       "%g s (distributed timeout): that rank died or stopped calling the same "
                       "collectives", comm->rank, (unsigned long long)x->call, silent_peer(x), comm->timeout_s);
    return GT_OK;
}

static gt_status mpi_exchange(gt_comm *comm, const void *const *send, const size_t *send_bytes, void *const *recv,
                              const size_t *recv_bytes) {
    gt_comm_pending *x = NULL;
    GT_TRY(mpi_start(comm, comm->calls, send, send_bytes, recv, recv_bytes, &x));
    for (unsigned long polls = 0;; polls++) {
        int done = 0;
        gt_status status = mpi_test(comm, x, &done);
        if (status != GT_OK) {
            mpi_abandon(comm, x);
            return status;
        }
        if (done)
            return GT_OK;
        if (polls > 1000)
            nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
    }
}

static void mpi_free(gt_comm *comm) {
    mpi_transport *t = comm->impl;
    if (!t)
        return;
    dlclose(t->library);
    free(t);
}

static const gt_comm_ops mpi_ops = {.exchange = mpi_exchange, .start = mpi_start, .test = mpi_test,
                                    .abandon = mpi_abandon, .free = mpi_free};

static gt_status load_symbols(mpi_transport *t, const char *library) {
    t->library = dlopen(library, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!t->library)
        return GT_FAIL(GT_ERR_VALUE, "library: the MPI library '%s' is not loaded in this process (%s)", library,
                       dlerror());
    const char *names[] = {"MPI_Isend", "MPI_Irecv", "MPI_Test", "MPI_Cancel", "MPI_Request_free"};
    void *fns[5];
    for (int i = 0; i < 5; i++) {
        if (!(fns[i] = dlsym(t->library, names[i]))) {
            dlclose(t->library);
            return GT_FAIL(GT_ERR_VALUE, "library: '%s' has no %s; is it an MPI library?", library, names[i]);
        }
    }
    t->isend = (mpi_isend_fn)fns[0], t->irecv = (mpi_irecv_fn)fns[1], t->test = (mpi_test_fn)fns[2];
    t->cancel = (mpi_request_fn)fns[3], t->free_request = (mpi_request_fn)fns[4];
    return GT_OK;
}

static gt_status check_handles(const gt_mpi_handles *h) {
    if (h->handle_bytes != (int)sizeof(mpi_handle))
        return GT_FAIL(GT_ERR_VALUE, "handle_bytes: this MPI library has %d-byte handles; gputrain calls MPI "
                       "libraries of the MPICH ABI (4-byte handles: the mpich wheel, MPICH, Intel MPI, MVAPICH), "
                       "not Open MPI yet", h->handle_bytes);
    if (h->status_bytes < 1 || h->status_bytes > GT_MPI_STATUS_MAX)
        return GT_FAIL(GT_ERR_VALUE, "status_bytes: must be in [1, %d], got %d", GT_MPI_STATUS_MAX, h->status_bytes);
    if (h->comm < INT_MIN || h->comm > UINT_MAX || h->byte_type < INT_MIN || h->byte_type > UINT_MAX)
        return GT_FAIL(GT_ERR_VALUE, "comm/byte_type: not 4-byte MPI handles (%lld, %lld)", (long long)h->comm,
                       (long long)h->byte_type);
    return GT_OK;
}

gt_status gt_comm_mpi_create(const gt_mpi_handles *handles, int rank, int size, double timeout_s, gt_comm *comm) {
    GT_TRY(check_handles(handles));
    mpi_transport *t = calloc(1, sizeof *t);
    if (!t)
        return GT_FAIL(GT_ERR_OOM, "MPI transport: out of host memory");
    gt_status status = load_symbols(t, handles->library);
    if (status != GT_OK) {
        free(t);
        return status;
    }
    t->comm = (mpi_handle)(uint32_t)handles->comm;
    t->byte_type = (mpi_handle)(uint32_t)handles->byte_type;
    *comm = (gt_comm){.ops = &mpi_ops, .impl = t, .rank = rank, .size = size, .timeout_s = timeout_s};
    status = gt_comm_init(comm);
    if (status != GT_OK)
        gt_comm_free(comm);
    return status;
}
