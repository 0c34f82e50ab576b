// cuda/comm_nccl.h: rank-order collectives over NCCL. NOT YET RUN ON A GPU.
#include <cuda_runtime.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm_nccl.h"
#include "cuda_internal.cuh"
#include "cuda_libs.cuh"
#include "dist/comm.h"
#include "dist/comm_device.h"

namespace {

// A communicator's NCCL state (gt_comm.device_impl).
struct nccl_state {
    ncclComm_t nccl;             // the NCCL communicator of comm's ranks
    int device;                  // the CUDA ordinal it was made on
    void *staging;               // (size - 1, GT_COMM_BUCKET / size + 1) f64-sized slots, device memory
    cudaEvent_t done;            // recorded after each collective, polled by the watchdog
    std::thread watchdog;        // polls `done` against the deadline
    std::mutex lock;             // guards the fields below
    std::condition_variable changed;  // signalled when a collective is queued or on close
    double deadline;             // CLOCK_MONOTONIC seconds past which the last collective timed out; 0: none
    bool closing;                // the watchdog exits
    bool aborted;                // ncclCommAbort was called
};

double now_s() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

gt_status nccl_error(ncclResult_t r, const char *what, const char *file, int line) {
    return gt_set_error(r == ncclSystemError || r == ncclRemoteError ? GT_ERR_RUNTIME : GT_ERR_CUDA, file, line,
                        "%s failed: %s", what, gt_nccl.ncclGetErrorString(r));
}

#define GT_NCCL_TRY(call, what)                                          \
    do {                                                                 \
        ncclResult_t gt_nccl_r_ = (call);                                \
        if (gt_nccl_r_ != ncclSuccess)                                   \
            return nccl_error(gt_nccl_r_, (what), __FILE__, __LINE__);   \
    } while (0)

size_t slot_elems(const gt_comm *comm) { return GT_COMM_BUCKET / (size_t)comm->size + 1; }

// The deadline passed (or NCCL reported an asynchronous error): keep the failure in comm, then abort.
void fail_and_abort(gt_comm *comm, nccl_state *s, ncclResult_t async) {
    gt_status status = async != ncclSuccess
        ? GT_FAIL(GT_ERR_RUNTIME, "NCCL collective on rank %d failed: %s", comm->rank, gt_nccl.ncclGetErrorString(async))
        : GT_FAIL(GT_ERR_TIMEOUT, "rank %d: an NCCL collective did not complete within %g s (distributed "
                  "timeout): a rank died or stopped calling the same collectives", comm->rank, comm->timeout_s);
    gt_comm_device_failed(comm, status);  // before the abort lets the queued work (and the step's read) end
    gt_nccl.ncclCommAbort(s->nccl);
    s->aborted = true;
    gt_clear_error();
}

// One poll of the collective in flight: true when it is over (done, failed or aborted).
bool poll_once(gt_comm *comm, nccl_state *s) {
    ncclResult_t async = ncclSuccess;
    gt_nccl.ncclCommGetAsyncError(s->nccl, &async);
    cudaError_t q = cudaEventQuery(s->done);
    if (q == cudaSuccess && async == ncclSuccess)
        return true;
    if (q != cudaErrorNotReady)
        cudaGetLastError();
    if (async != ncclSuccess && async != ncclInProgress) {
        fail_and_abort(comm, s, async);
        return true;
    }
    if (now_s() > s->deadline) {
        fail_and_abort(comm, s, ncclSuccess);
        return true;
    }
    return false;
}

void watchdog_main(gt_comm *comm, nccl_state *s) {
    cudaSetDevice(s->device);
    std::unique_lock<std::mutex> guard(s->lock);
    for (;;) {
        s->changed.wait(guard, [s] { return s->closing || s->deadline > 0.0; });
        if (s->closing)
            return;
        if (s->aborted || poll_once(comm, s)) {
            s->deadline = 0.0;
            continue;
        }
        s->changed.wait_for(guard, std::chrono::microseconds(200));
    }
}

void state_free(void *impl) {
    nccl_state *s = static_cast<nccl_state *>(impl);
    {
        std::lock_guard<std::mutex> guard(s->lock);
        s->closing = true;
    }
    s->changed.notify_all();
    s->watchdog.join();
    cudaSetDevice(s->device);
    if (!s->aborted)
        gt_nccl.ncclCommDestroy(s->nccl);
    cudaFree(s->staging);
    cudaEventDestroy(s->done);
    delete s;
}

// ncclCommInitRank from rank 0's id, broadcast over comm's host transport (its deadline holds).
gt_status make_nccl(gt_comm *comm, ncclComm_t *out) {
    GT_TRY(gt_cuda_lib_load(GT_CUDA_LIB_NCCL));  // NCCL is opened only when a communicator is made
    ncclUniqueId id = {};
    if (comm->rank == 0)
        GT_NCCL_TRY(gt_nccl.ncclGetUniqueId(&id), "ncclGetUniqueId");
    GT_TRY(gt_comm_broadcast(comm, &id, sizeof id, 0));
    GT_NCCL_TRY(gt_nccl.ncclCommInitRank(out, comm->size, id, comm->rank), "ncclCommInitRank");
    return GT_OK;
}

gt_status new_state(gt_comm *comm, int index, nccl_state **out) {
    nccl_state *s = new (std::nothrow) nccl_state();
    if (!s)
        return GT_FAIL(GT_ERR_OOM, "NCCL communicator: out of host memory");
    s->device = index;
    size_t bytes = (size_t)(comm->size - 1) * slot_elems(comm) * sizeof(double);
    cudaError_t err = cudaMalloc(&s->staging, bytes ? bytes : 1);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        cudaFree(s->staging);
        delete s;
        return gt_cuda_error(err, "NCCL staging / event", __FILE__, __LINE__);
    }
    gt_status status = make_nccl(comm, &s->nccl);
    if (status != GT_OK) {
        cudaFree(s->staging);
        cudaEventDestroy(s->done);
        delete s;
        return status;
    }
    s->watchdog = std::thread(watchdog_main, comm, s);
    *out = s;
    return GT_OK;
}

// comm's NCCL state on device `index`, made on first use.
gt_status state_of(gt_comm *comm, int index, nccl_state **out) {
    if (comm->failed)
        return GT_FAIL(GT_ERR_RUNTIME, "the communicator failed earlier (a rank timed out or died); restart the "
                       "job from its last checkpoint");
    nccl_state *s = static_cast<nccl_state *>(comm->device_impl);
    if (s && s->device != index)
        return GT_FAIL(GT_ERR_VALUE, "device: the communicator's NCCL collectives run on cuda:%d, not cuda:%d",
                       s->device, index);
    if (!s) {
        GT_TRY(new_state(comm, index, &s));
        comm->device_impl = s;
        comm->device_impl_free = state_free;
    }
    *out = s;
    return GT_OK;
}

// Each element i < count of `mine` becomes x_0 + x_1 + ... in rank order: x_rank = mine[i], the
// peers' in staging slots of `slot` elements (the order of dist/comm.c's sum_rank_order).
template <typename T>
__global__ void sum_rank_order_kernel(T *mine, const T *staging, size_t slot, int size, int rank, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        T acc = 0;
        for (int p = 0; p < size; p++) {
            T x = p == rank ? mine[i] : staging[(size_t)(p - (p > rank)) * slot + i];
            acc = p == 0 ? x : acc + x;
        }
        mine[i] = acc;
    }
}

struct bucket_args {
    gt_comm *comm;        // ranks and sizes
    nccl_state *s;        // NCCL communicator and staging
    char *buf;            // the bucket's first element
    size_t count;         // its elements
    size_t elem;          // bytes per element
    ncclDataType_t type;  // ncclFloat32 or ncclFloat64
    cudaStream_t stream;  // where it is queued
};

// Elements of the bucket's type at `at`, to send or receive (none when n == 0).
struct span {
    char *at;
    size_t n;
};

// One NCCL group with every peer r: send `send(r)`, receive into `recv(r)`; `what` names the
// collective in the failure's message.
template <class SendOf, class RecvOf>
gt_status exchange_with_peers(const bucket_args &a, const char *what, SendOf send, RecvOf recv) {
    GT_NCCL_TRY(gt_nccl.ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r_io = ncclSuccess;
    for (int r = 0; r < a.comm->size; r++) {
        if (r == a.comm->rank)
            continue;
        span out = send(r), in = recv(r);
        if (out.n && r_io == ncclSuccess)
            r_io = gt_nccl.ncclSend(out.at, out.n, a.type, r, a.s->nccl, a.stream);
        if (in.n && r_io == ncclSuccess)
            r_io = gt_nccl.ncclRecv(in.at, in.n, a.type, r, a.s->nccl, a.stream);
    }
    ncclResult_t r_end = gt_nccl.ncclGroupEnd();  // closes the group even after a failed send/recv
    GT_NCCL_TRY(r_io != ncclSuccess ? r_io : r_end, what);
    return GT_OK;
}

// Element range [first, first + count) of the bucket's chunk r.
span chunk_of(const bucket_args &a, int r) {
    size_t first, count;
    gt_comm_chunk(a.count, a.comm->size, r, &first, &count);
    return {a.buf + first * a.elem, count};
}

// Grouped send/recv: chunk r of the bucket to rank r, the peers' chunk `rank` into staging.
gt_status reduce_scatter(const bucket_args &a) {
    size_t mine_first, mine_count, slot = slot_elems(a.comm);
    gt_comm_chunk(a.count, a.comm->size, a.comm->rank, &mine_first, &mine_count);
    auto staging_of = [&](int r) {  // peers in rank order, this rank left out
        return span{static_cast<char *>(a.s->staging) + (size_t)(r - (r > a.comm->rank)) * slot * a.elem, mine_count};
    };
    GT_TRY(exchange_with_peers(a, "ncclSend/ncclRecv (reduce-scatter)", [&](int r) { return chunk_of(a, r); },
                               staging_of));
    if (!mine_count)
        return GT_OK;
    unsigned blocks = (unsigned)((mine_count + 255) / 256 < 1024 ? (mine_count + 255) / 256 : 1024);
    if (a.type == ncclFloat32)
        sum_rank_order_kernel<float><<<blocks, 256, 0, a.stream>>>(reinterpret_cast<float *>(a.buf) + mine_first,
            static_cast<const float *>(a.s->staging), slot, a.comm->size, a.comm->rank, mine_count);
    else
        sum_rank_order_kernel<double><<<blocks, 256, 0, a.stream>>>(reinterpret_cast<double *>(a.buf) + mine_first,
            static_cast<const double *>(a.s->staging), slot, a.comm->size, a.comm->rank, mine_count);
    GT_CUDA_TRY(cudaGetLastError(), "sum_rank_order_kernel launch");
    return GT_OK;
}

// Grouped send/recv: this rank's summed chunk to every peer, theirs into place.
gt_status allgather(const bucket_args &a) {
    span mine = chunk_of(a, a.comm->rank);
    return exchange_with_peers(a, "ncclSend/ncclRecv (all-gather)", [&](int) { return mine; },
                               [&](int r) { return chunk_of(a, r); });
}

// The watchdog's deadline for the work queued so far on `stream`.
gt_status arm_watchdog(gt_comm *comm, nccl_state *s, cudaStream_t stream) {
    GT_CUDA_TRY(cudaEventRecord(s->done, stream), "cudaEventRecord");
    {
        std::lock_guard<std::mutex> guard(s->lock);
        s->deadline = now_s() + comm->timeout_s;
    }
    s->changed.notify_all();
    return GT_OK;
}

gt_status allreduce(int index, gt_comm *comm, gt_dtype dtype, void *buf, size_t n, cudaStream_t stream) {
    nccl_state *s = nullptr;
    GT_TRY(state_of(comm, index, &s));
    bucket_args a = {comm, s, static_cast<char *>(buf), 0, dtype == GT_F32 ? sizeof(float) : sizeof(double),
                     dtype == GT_F32 ? ncclFloat32 : ncclFloat64, stream};
    for (size_t first = 0; first < n; first += GT_COMM_BUCKET) {
        a.buf = static_cast<char *>(buf) + first * a.elem;
        a.count = n - first < GT_COMM_BUCKET ? n - first : GT_COMM_BUCKET;
        GT_TRY(reduce_scatter(a));
        GT_TRY(allgather(a));
        size_t mine_first, mine_count;
        gt_comm_chunk(a.count, comm->size, comm->rank, &mine_first, &mine_count);
        comm->bytes_sent += (a.count - mine_count + mine_count * (size_t)(comm->size - 1)) * a.elem;  // both phases
    }
    return arm_watchdog(comm, s, stream);
}

}  // namespace

extern "C" gt_status gt_cuda_nccl_allreduce_sum(int index, gt_comm *comm, gt_dtype dtype, void *buf, size_t n,
                                                void *stream) {
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: no communicator");
    if (dtype != GT_F32 && dtype != GT_F64)
        return GT_FAIL(GT_ERR_VALUE, "allreduce_sum: dtype must be float32 or float64, got dtype %d", (int)dtype);
    if (comm->size == 1 || n == 0)
        return GT_OK;
    return gt_comm_device_failed(comm, allreduce(index, comm, dtype, buf, n, static_cast<cudaStream_t>(stream)));
}

extern "C" gt_status gt_cuda_nccl_broadcast(int index, gt_comm *comm, void *buf, size_t bytes, int root,
                                            void *stream) {
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "broadcast: no communicator");
    if (root < 0 || root >= comm->size)
        return GT_FAIL(GT_ERR_VALUE, "root must be in [0, %d), got %d", comm->size, root);
    if (comm->size == 1 || bytes == 0)
        return GT_OK;
    nccl_state *s = nullptr;
    GT_TRY(state_of(comm, index, &s));
    GT_NCCL_TRY(gt_nccl.ncclBroadcast(buf, buf, bytes, ncclUint8, root, s->nccl, static_cast<cudaStream_t>(stream)),
                "ncclBroadcast");
    comm->bytes_sent += comm->rank == root ? bytes : 0;
    return arm_watchdog(comm, s, static_cast<cudaStream_t>(stream));
}

extern "C" gt_status gt_cuda_nccl_allgather(int index, gt_comm *comm, float *buf, size_t n, void *stream) {
    if (!comm)
        return GT_FAIL(GT_ERR_VALUE, "allgather: no communicator");
    if (comm->size == 1 || n == 0)
        return GT_OK;
    nccl_state *s = nullptr;
    GT_TRY(state_of(comm, index, &s));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    bucket_args a = {comm, s, reinterpret_cast<char *>(buf), n, sizeof(float), ncclFloat32, st};
    GT_TRY(gt_comm_device_failed(comm, allgather(a)));
    size_t mine_first, mine_count;
    gt_comm_chunk(n, comm->size, comm->rank, &mine_first, &mine_count);
    comm->bytes_sent += mine_count * (size_t)(comm->size - 1) * sizeof(float);
    return arm_watchdog(comm, s, st);
}
