// The CUDA backend's op table (every op of cuda/ops_*.cu), its per-backend state, and the helpers
// the op files share: the per-call set-up, argument checks and the fixed-order part sums.
#include <cuda_runtime.h>

#include <stdlib.h>

#include <mutex>

#include "ops_kernels.cuh"

namespace {

std::mutex registry_lock;                   // guards `registry`
gt_cuda_backend_state *registry = nullptr;  // the live states, linked by `next`

void register_state(gt_cuda_backend_state *state) {
    std::lock_guard<std::mutex> guard(registry_lock);
    state->next = registry;
    registry = state;
}

void unregister_state(gt_cuda_backend_state *state) {
    std::lock_guard<std::mutex> guard(registry_lock);
    for (gt_cuda_backend_state **at = &registry; *at; at = &(*at)->next)
        if (*at == state) {
            *at = state->next;
            return;
        }
}

// Reports and clears the slot's error (call after waiting for the stream): the CPU ops' messages.
gt_status take_error(gt_cuda_op_error *slot) {
    gt_cuda_op_error e = *slot;
    *slot = gt_cuda_op_error{};
    long long i = (long long)e.index, v = (long long)e.value, limit = (long long)e.limit;
    switch (e.check) {
    case GT_CUDA_CHECK_IDS:
        return GT_FAIL(GT_ERR_INDEX, "ids[%lld] = %lld is out of range [0, %lld)", i, v, limit);
    case GT_CUDA_CHECK_TARGETS:
        return GT_FAIL(GT_ERR_INDEX, "targets[%lld] = %lld is out of range [0, %lld) (ignore_index %lld)", i, v,
                       limit, (long long)e.ignore_index);
    case GT_CUDA_CHECK_LENGTHS:
        return GT_FAIL(GT_ERR_VALUE, "lengths[%lld]: must be in [0, %lld], got %lld", i, limit, v);
    case GT_CUDA_CHECK_KEY_LENGTHS:
        return GT_FAIL(GT_ERR_VALUE, "key_lengths[%lld]: must be in [0, %lld], got %lld", i, limit, v);
    default: return GT_OK;
    }
}

__global__ void check_entries_kernel(const int64_t *values, size_t n, int64_t end, int skip_on, int64_t skip,
                                     unsigned long long *first_bad) {
    GT_GRID_STRIDE(i, n) {
        int64_t v = values[i];
        if ((v < 0 || v >= end) && !(skip_on && v == skip))
            atomicMin(first_bad, (unsigned long long)i);
    }
}

// One thread: when the check found a bad entry and the slot is empty, the slot takes it.
__global__ void record_error_kernel(gt_cuda_op_error *slot, gt_cuda_op_error error, const int64_t *values,
                                    const unsigned long long *first_bad) {
    if (*first_bad == kNoBad || slot->check != GT_CUDA_CHECK_NONE)
        return;
    error.index = (int64_t)*first_bad;
    error.value = values[*first_bad];
    *slot = error;
}

}  // namespace

gt_status gt_cuda_check_entries(const gt_cuda_backend_state *state, const int64_t *values, size_t n,
                                gt_cuda_op_error error) {
    cudaStream_t stream = stream_of(state);
    unsigned long long *first_bad = scratch_words(state);
    GT_CUDA_TRY(cudaMemsetAsync(first_bad, 0xff, sizeof *first_bad, stream), "cudaMemsetAsync");
    if (n == 0)
        return GT_OK;
    int closed = error.check == GT_CUDA_CHECK_LENGTHS || error.check == GT_CUDA_CHECK_KEY_LENGTHS;
    int targets = error.check == GT_CUDA_CHECK_TARGETS;
    check_entries_kernel<<<grid_for(n), kThreads, 0, stream>>>(values, n, error.limit + closed, targets,
                                                               error.ignore_index, first_bad);
    GT_TRY(gt_cuda_check_launch("check_entries_kernel launch"));
    record_error_kernel<<<1, 1, 0, stream>>>(state->error, error, values, first_bad);
    return gt_cuda_check_launch("record_error_kernel launch");
}

extern "C" gt_status gt_cuda_stream_op_error(int device, void *stream) {
    std::lock_guard<std::mutex> guard(registry_lock);
    for (gt_cuda_backend_state *state = registry; state; state = state->next)
        if (state->device == device && state->stream == stream && state->error->check != GT_CUDA_CHECK_NONE)
            return take_error(state->error);
    return GT_OK;
}

// The table: gt_cuda_<op> for every op of GT_CUDA_OP_LIST (ops_kernels.cuh), NULL for the rest.
static constexpr gt_ops make_cuda_ops() {
    gt_ops table{};
    table.name = "cuda";
#define GT_CUDA_ENTRY(op) table.op = gt_cuda_##op;
    GT_CUDA_OP_LIST(GT_CUDA_ENTRY)
#undef GT_CUDA_ENTRY
    return table;
}

static constexpr gt_ops cuda_ops = make_cuda_ops();

extern "C" const gt_ops *gt_cuda_ops(void) { return &cuda_ops; }

extern "C" gt_status gt_cuda_backend_init(gt_backend *be, int device, void *stream) {
    if (!be)
        return GT_FAIL(GT_ERR_VALUE, "be: must not be NULL");
    *be = gt_backend{};
    GT_TRY(gt_cuda_require_device(device, "device"));
    gt_cuda_context *context = NULL;
    GT_TRY(gt_cuda_context_get(device, &context));
    gt_cuda_backend_state *state = static_cast<gt_cuda_backend_state *>(calloc(1, sizeof *state));
    if (!state)
        return GT_FAIL(GT_ERR_OOM, "out of host memory for a CUDA backend state");
    state->device = device;
    state->stream = stream;
    state->context = context;
    gt_status status = gt_block_alloc(gt_cuda_device(device), GT_CUDA_SCRATCH_BYTES, &state->scratch);
    if (status == GT_OK && cudaHostAlloc(reinterpret_cast<void **>(&state->error), sizeof *state->error,
                                         cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        gt_block_free(&state->scratch);
        status = GT_FAIL(GT_ERR_OOM, "out of pinned host memory for a CUDA backend's error slot");
    }
    if (status != GT_OK) {
        free(state);
        return status;
    }
    *state->error = gt_cuda_op_error{};
    register_state(state);
    be->ops = &cuda_ops;
    be->device = gt_cuda_device(device);
    be->impl = state;
    return GT_OK;
}

extern "C" void gt_cuda_backend_release(gt_backend *be) {
    if (!be || !be->impl)
        return;
    gt_cuda_backend_state *state = static_cast<gt_cuda_backend_state *>(be->impl);
    cudaSetDevice(state->device);
    cudaStreamSynchronize(stream_of(state));
    cudaGetLastError();
    gt_cuda_conv_release(state);
    unregister_state(state);
    cudaFreeHost(state->error);
    gt_block_free(&state->scratch);
    free(state);
    be->impl = NULL;
}

gt_status gt_cuda_op_begin(gt_backend *be, gt_cuda_backend_state **out) {
    *out = NULL;
    if (!be || !be->impl || be->ops != &cuda_ops)
        return GT_FAIL(GT_ERR_VALUE, "be: not a CUDA backend set up by gt_cuda_backend_init");
    gt_cuda_backend_state *state = static_cast<gt_cuda_backend_state *>(be->impl);
    GT_CUDA_TRY(cudaSetDevice(state->device), "cudaSetDevice");
    *out = state;
    return GT_OK;
}

extern "C" gt_status gt_cuda_backend_synchronize(gt_backend *be) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    GT_CUDA_TRY(cudaStreamSynchronize(stream_of(state)), "cudaStreamSynchronize");
    std::lock_guard<std::mutex> guard(registry_lock);
    return take_error(state->error);
}

extern "C" gt_status gt_cuda_backend_memcpy(gt_backend *be, void *dst, const void *src, size_t bytes) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (bytes == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dst, "dst"));
    GT_TRY(gt_op_check_ptr(src, "src"));
    GT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(state)), "cudaMemcpyAsync");
    GT_CUDA_TRY(cudaStreamSynchronize(stream_of(state)), "cudaStreamSynchronize");
    std::lock_guard<std::mutex> guard(registry_lock);
    return take_error(state->error);
}

gt_status gt_cuda_check_launch(const char *kernel) {
    GT_CUDA_TRY(cudaGetLastError(), kernel);
    return GT_OK;
}

size_t gt_cuda_sum_part_size(size_t n) {
    const size_t min_part = 16384;  // the CPU's GT_CPU_CHUNK
    size_t size = (n + GT_CUDA_MAX_PARTS - 1) / GT_CUDA_MAX_PARTS;
    size = size < min_part ? min_part : size;
    return (size + kLanes - 1) / kLanes * kLanes;
}

gt_status gt_cuda_add_parts(const gt_cuda_backend_state *state, size_t num_parts, double *out) {
    double parts[GT_CUDA_MAX_PARTS];
    GT_CUDA_TRY(cudaMemcpyAsync(parts, scratch_parts(state), num_parts * sizeof(double), cudaMemcpyDeviceToHost,
                                stream_of(state)),
                "cudaMemcpyAsync");
    GT_CUDA_TRY(cudaStreamSynchronize(stream_of(state)), "cudaStreamSynchronize");
    double total = 0.0;
    for (size_t p = 0; p < num_parts; p++)
        total += parts[p];
    *out = total;
    return GT_OK;
}
