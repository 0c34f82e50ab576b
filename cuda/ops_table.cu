// The CUDA backend's op table (every op of cuda/ops_*.cu), its per-backend state, and the helpers
// the op files share: the per-call set-up, argument checks and the fixed-order part sums.
#include <cuda_runtime.h>

#include <stdlib.h>

#include "ops_kernels.cuh"

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
    if (status != GT_OK) {
        free(state);
        return status;
    }
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
    return GT_OK;
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
    return GT_OK;
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
