// CUDA 2-D convolution (ops.h, gt_conv2d_args) through cuDNN's convolution API
// (cudnnConvolutionForward / BackwardData / BackwardFilter), NCHW, f32/f16/bf16 activations with
// f32 compute.
//
// Algorithms: chosen once per (device, sizes, dtype, TF32, benchmark, deterministic) and kept in a
// process-wide cache. benchmark off: the first usable result of cuDNN's heuristics
// (cudnnGet*Algorithm_v7); on: the fastest usable one measured by cudnnFind*Algorithm (it
// allocates its own trial memory, once per shape, when the plan asks for the workspace).
// "Usable": CUDNN_STATUS_SUCCESS, a workspace within the limit, and with deterministic on, a
// result cuDNN reports as CUDNN_DETERMINISTIC (which rules out e.g. BWD_FILTER_ALGO_0/3 and
// BWD_DATA_ALGO_0, whose sums use atomics). The search runs with tensor-core math for f16/bf16
// and, for fp32, TF32 allowed or not as gputrain.backends.tf32 says (CUDNN_FMA_MATH when not).
// The choice happens in gt_cuda_conv2d_workspace_bytes (plan time) on the device context's cuDNN
// handle, so the plan's workspace holds what the chosen algorithms need; a call whose key is not
// cached yet (the knobs changed after planning) chooses then, within the workspace it was given.
//
// Running: each backend state gets one cuDNN handle bound to its stream (created at its first
// convolution) and tensor/filter/convolution descriptors per shape; no call allocates device memory.
// Bias: out[n, o] += bias[o] after the convolution (f32 add, one rounding to dt). dbias: a
// fixed-order double sum per channel (no atomics). dweight: f32 straight from cuDNN with
// beta = accumulate; for f16/bf16 cuDNN writes it in dt to the workspace and a kernel widens and
// adds it (PyTorch's autocast also rounds the weight gradient to the half type once).

#include <array>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <new>

#include "core/tensor.h"
#include "cuda_libs.cuh"
#include "ops_kernels.cuh"

namespace {

constexpr size_t kAlign = 256;  // byte alignment of the staged weight gradient's successor

// What an algorithm choice depends on: device, the 14 sizes, dtype, TF32, benchmark, deterministic.
using conv_key = std::array<int64_t, 19>;
// What the descriptors depend on: the 14 sizes and the dtype.
using shape_key = std::array<int64_t, 15>;

struct conv_choice {
    cudnnConvolutionFwdAlgo_t fwd;           // forward algorithm
    cudnnMathType_t fwd_math;                // math type it runs with
    size_t fwd_bytes;                        // its workspace, bytes
    cudnnConvolutionBwdDataAlgo_t data;      // dx algorithm
    cudnnMathType_t data_math;
    size_t data_bytes;
    cudnnConvolutionBwdFilterAlgo_t filter;  // dweight algorithm
    cudnnMathType_t filter_math;
    size_t filter_bytes;
};

struct conv_descs {
    cudnnTensorDescriptor_t x;            // (N, C, H, W) dt
    cudnnTensorDescriptor_t y;            // (N, O, OH, OW) dt
    cudnnFilterDescriptor_t w;            // (O, C / groups, KH, KW) dt
    cudnnConvolutionDescriptor_t conv;    // pads, strides, dilations, groups, f32 compute
};

// What a backend state's `conv` points to.
struct conv_runtime {
    cudnnHandle_t handle;                    // bound to the state's stream
    std::map<shape_key, conv_descs> shapes;  // descriptors per shape
};

// Process-wide: the knobs and the algorithm cache.
struct conv_globals {
    std::atomic<int> benchmark{0};            // 1: cudnnFind*, else heuristics
    std::atomic<int> deterministic{0};        // 1: deterministic algorithms only
    std::mutex lock;                          // guards `choices` and the contexts' cudnn handles
    std::map<conv_key, conv_choice> choices;  // algorithm choice per key
};

conv_globals globals;

gt_status cudnn_error(cudnnStatus_t status, const char *what, int line) {
    return gt_set_error(status == CUDNN_STATUS_ALLOC_FAILED ? GT_ERR_OOM : GT_ERR_CUDA, __FILE__, line,
                        "%s failed: %s", what, gt_cudnn.cudnnGetErrorString(status));
}

#define GT_CUDNN_TRY(call, what)                                  \
    do {                                                          \
        cudnnStatus_t gt_cudnn_st_ = (call);                      \
        if (gt_cudnn_st_ != CUDNN_STATUS_SUCCESS)                 \
            return cudnn_error(gt_cudnn_st_, (what), __LINE__);   \
    } while (0)

cudnnDataType_t data_type(gt_dtype dt) {
    return dt == GT_F16 ? CUDNN_DATA_HALF : dt == GT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

shape_key shape_of(const gt_conv2d_args *a) {
    return {a->batch, a->in_channels, a->height, a->width, a->out_channels, a->groups, a->kernel_h,
            a->kernel_w, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->dilation_h, a->dilation_w,
            (int64_t)a->dt};
}

conv_key key_of(const gt_conv2d_args *a, int device) {
    shape_key s = shape_of(a);
    conv_key k{};
    for (size_t i = 0; i < s.size(); i++)
        k[i] = s[i];
    k[15] = device;
    k[16] = gt_cuda_tf32_enabled();
    k[17] = globals.benchmark.load();
    k[18] = globals.deterministic.load();
    return k;
}

// cuDNN takes int sizes, and its legacy kernels index each tensor with int.
gt_status check_int_extents(const gt_conv2d_args *a) {
    const int64_t groups = a->groups, oh = gt_conv2d_out_h(a), ow = gt_conv2d_out_w(a);
    const int64_t extents[] = {a->in_channels * a->height * a->width, a->out_channels * oh * ow,
                               a->out_channels * (a->in_channels / groups) * a->kernel_h * a->kernel_w};
    static const char *const names[] = {"x", "out", "weight"};
    for (int i = 0; i < 3; i++) {
        int64_t total = 0;
        if (__builtin_mul_overflow(extents[i], i == 2 ? 1 : a->batch, &total) || total > INT_MAX)
            return GT_FAIL(GT_ERR_VALUE, "%s: conv2d on CUDA (cuDNN) takes tensors of at most %d elements",
                           names[i], INT_MAX);
    }
    return GT_OK;
}

// The math type the algorithms are searched with (PyTorch's choice): tensor cores for f16/bf16,
// cuDNN's default (TF32 allowed) for fp32 with TF32 on, plain FMA for fp32 without it.
cudnnMathType_t search_math(const gt_conv2d_args *a, int tf32) {
    if (a->dt != GT_F32)
        return CUDNN_TENSOR_OP_MATH;
    return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// The math type an algorithm runs with: cuDNN's, except FMA for fp32 without TF32.
cudnnMathType_t math_for(const gt_conv2d_args *a, cudnnMathType_t reported, int tf32) {
    return a->dt == GT_F32 && !tf32 ? CUDNN_FMA_MATH : reported;
}

gt_status descs_create(conv_descs *d) {
    GT_CUDNN_TRY(gt_cudnn.cudnnCreateTensorDescriptor(&d->x), "cudnnCreateTensorDescriptor");
    GT_CUDNN_TRY(gt_cudnn.cudnnCreateTensorDescriptor(&d->y), "cudnnCreateTensorDescriptor");
    GT_CUDNN_TRY(gt_cudnn.cudnnCreateFilterDescriptor(&d->w), "cudnnCreateFilterDescriptor");
    GT_CUDNN_TRY(gt_cudnn.cudnnCreateConvolutionDescriptor(&d->conv), "cudnnCreateConvolutionDescriptor");
    return GT_OK;
}

void descs_destroy(conv_descs *d) {
    if (d->conv)
        gt_cudnn.cudnnDestroyConvolutionDescriptor(d->conv);
    if (d->w)
        gt_cudnn.cudnnDestroyFilterDescriptor(d->w);
    if (d->y)
        gt_cudnn.cudnnDestroyTensorDescriptor(d->y);
    if (d->x)
        gt_cudnn.cudnnDestroyTensorDescriptor(d->x);
    *d = conv_descs{};
}

gt_status descs_set(conv_descs *d, const gt_conv2d_args *a) {
    cudnnDataType_t t = data_type(a->dt);
    int n = (int)a->batch, oh = (int)gt_conv2d_out_h(a), ow = (int)gt_conv2d_out_w(a);
    GT_CUDNN_TRY(gt_cudnn.cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, t, n, (int)a->in_channels, (int)a->height,
                                                     (int)a->width), "cudnnSetTensor4dDescriptor(x)");
    GT_CUDNN_TRY(gt_cudnn.cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, t, n, (int)a->out_channels, oh, ow),
                 "cudnnSetTensor4dDescriptor(out)");
    GT_CUDNN_TRY(gt_cudnn.cudnnSetFilter4dDescriptor(d->w, t, CUDNN_TENSOR_NCHW, (int)a->out_channels,
                                                     (int)(a->in_channels / a->groups), (int)a->kernel_h, (int)a->kernel_w),
                 "cudnnSetFilter4dDescriptor(weight)");
    GT_CUDNN_TRY(gt_cudnn.cudnnSetConvolution2dDescriptor(d->conv, (int)a->pad_h, (int)a->pad_w, (int)a->stride_h,
                                                          (int)a->stride_w, (int)a->dilation_h, (int)a->dilation_w,
                                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                 "cudnnSetConvolution2dDescriptor");
    GT_CUDNN_TRY(gt_cudnn.cudnnSetConvolutionGroupCount(d->conv, (int)a->groups), "cudnnSetConvolutionGroupCount");
    return GT_OK;
}

// Descriptors for `a`'s shape, made once and kept (`tmp` holds them when `shapes` is NULL).
gt_status descs_for(std::map<shape_key, conv_descs> *shapes, const gt_conv2d_args *a, conv_descs *tmp,
                    conv_descs **out) {
    if (shapes) {
        auto found = shapes->find(shape_of(a));
        if (found != shapes->end()) {
            *out = &found->second;
            return GT_OK;
        }
    }
    conv_descs d{};
    gt_status status = descs_create(&d);
    if (status == GT_OK)
        status = descs_set(&d, a);
    if (status != GT_OK) {
        descs_destroy(&d);
        return status;
    }
    if (!shapes) {
        *tmp = d;
        *out = tmp;
        return GT_OK;
    }
    *out = &shapes->emplace(shape_of(a), d).first->second;
    return GT_OK;
}

// Index of the first usable result of a perf list, or -1.
template <typename Perf>
int first_usable(const Perf *perf, int count, size_t limit) {
    for (int i = 0; i < count; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > limit)
            continue;
        if (globals.deterministic.load() && perf[i].determinism != CUDNN_DETERMINISTIC)
            continue;
        return i;
    }
    return -1;
}

gt_status none_usable(const gt_conv2d_args *a, const char *pass, size_t limit) {
    return GT_FAIL(GT_ERR_RUNTIME, "conv2d: cuDNN has no usable %s algorithm for (batch %lld, %lld -> %lld channels, "
                   "%lldx%lld kernel, groups %lld)%s within %zu bytes of workspace", pass, (long long)a->batch,
                   (long long)a->in_channels, (long long)a->out_channels, (long long)a->kernel_h,
                   (long long)a->kernel_w, (long long)a->groups,
                   globals.deterministic.load() ? " that is deterministic" : "", limit);
}

gt_status choose_forward(cudnnHandle_t h, const conv_descs *d, const gt_conv2d_args *a, size_t limit, int tf32,
                         conv_choice *c) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    if (globals.benchmark.load())
        GT_CUDNN_TRY(gt_cudnn.cudnnFindConvolutionForwardAlgorithm(h, d->x, d->w, d->conv, d->y,
                                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
                     "cudnnFindConvolutionForwardAlgorithm");
    else
        GT_CUDNN_TRY(gt_cudnn.cudnnGetConvolutionForwardAlgorithm_v7(h, d->x, d->w, d->conv, d->y,
                                                                     CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
                     "cudnnGetConvolutionForwardAlgorithm_v7");
    int i = first_usable(perf, count, limit);
    if (i < 0)
        return none_usable(a, "forward", limit);
    c->fwd = perf[i].algo;
    c->fwd_math = math_for(a, perf[i].mathType, tf32);
    c->fwd_bytes = perf[i].memory;
    return GT_OK;
}

gt_status choose_data(cudnnHandle_t h, const conv_descs *d, const gt_conv2d_args *a, size_t limit, int tf32,
                      conv_choice *c) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    if (globals.benchmark.load())
        GT_CUDNN_TRY(gt_cudnn.cudnnFindConvolutionBackwardDataAlgorithm(h, d->w, d->y, d->conv, d->x,
                                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
                     "cudnnFindConvolutionBackwardDataAlgorithm");
    else
        GT_CUDNN_TRY(gt_cudnn.cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d->w, d->y, d->conv, d->x,
                                                                          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
                     "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    int i = first_usable(perf, count, limit);
    if (i < 0)
        return none_usable(a, "backward-data", limit);
    c->data = perf[i].algo;
    c->data_math = math_for(a, perf[i].mathType, tf32);
    c->data_bytes = perf[i].memory;
    return GT_OK;
}

gt_status choose_filter(cudnnHandle_t h, const conv_descs *d, const gt_conv2d_args *a, size_t limit, int tf32,
                        conv_choice *c) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    if (globals.benchmark.load())
        GT_CUDNN_TRY(gt_cudnn.cudnnFindConvolutionBackwardFilterAlgorithm(h, d->x, d->y, d->conv, d->w,
                                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                                          perf),
                     "cudnnFindConvolutionBackwardFilterAlgorithm");
    else
        GT_CUDNN_TRY(gt_cudnn.cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d->x, d->y, d->conv, d->w,
                                                                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                                            perf),
                     "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    int i = first_usable(perf, count, limit);
    if (i < 0)
        return none_usable(a, "backward-filter", limit);
    c->filter = perf[i].algo;
    c->filter_math = math_for(a, perf[i].mathType, tf32);
    c->filter_bytes = perf[i].memory;
    return GT_OK;
}

// Bytes of the f16/bf16 weight gradient staged ahead of cuDNN's workspace (0 for f32).
size_t stage_bytes(const gt_conv2d_args *a) {
    if (a->dt == GT_F32)
        return 0;
    size_t n = (size_t)a->out_channels * (size_t)(a->in_channels / a->groups) * (size_t)a->kernel_h *
               (size_t)a->kernel_w;
    return (n * gt_dtype_size(a->dt) + kAlign - 1) / kAlign * kAlign;
}

size_t choice_bytes(const gt_conv2d_args *a, const conv_choice *c) {
    size_t filter = stage_bytes(a) + c->filter_bytes;
    size_t bytes = c->fwd_bytes > c->data_bytes ? c->fwd_bytes : c->data_bytes;
    return bytes > filter ? bytes : filter;
}

// The choice for `a` on device `device` (cached); made with handle `h` within `limit` bytes.
gt_status choice_for(cudnnHandle_t h, const conv_descs *d, const gt_conv2d_args *a, int device, size_t limit,
                     conv_choice *out) {
    conv_key key = key_of(a, device);
    std::lock_guard<std::mutex> guard(globals.lock);
    auto found = globals.choices.find(key);
    if (found != globals.choices.end() && choice_bytes(a, &found->second) <= limit) {
        *out = found->second;
        return GT_OK;
    }
    conv_choice c{};
    int tf32 = (int)key[16];
    size_t stage = stage_bytes(a);
    GT_CUDNN_TRY(gt_cudnn.cudnnSetConvolutionMathType(d->conv, search_math(a, tf32)), "cudnnSetConvolutionMathType");
    GT_TRY(choose_forward(h, d, a, limit, tf32, &c));
    GT_TRY(choose_data(h, d, a, limit, tf32, &c));
    GT_TRY(choose_filter(h, d, a, limit > stage ? limit - stage : 0, tf32, &c));
    globals.choices[key] = c;
    *out = c;
    return GT_OK;
}

// The selection handle of `device`: its shared context's, on the default stream, made once.
gt_status selector_of(int device, cudnnHandle_t *out) {
    gt_cuda_context *context = NULL;
    GT_TRY(gt_cuda_context_get(device, &context));
    GT_TRY(gt_cuda_lib_load(GT_CUDA_LIB_CUDNN));  // before the lock (the loader may wait for the GIL)
    std::lock_guard<std::mutex> guard(globals.lock);
    if (!context->cudnn)
        GT_CUDNN_TRY(gt_cudnn.cudnnCreate(&context->cudnn), "cudnnCreate");
    *out = context->cudnn;
    return GT_OK;
}

// Chooses the algorithms of `a` on the current device; *bytes = the workspace they need.
gt_status plan_choice(const gt_conv2d_args *a, size_t *bytes) {
    int device = 0;
    GT_CUDA_TRY(cudaGetDevice(&device), "cudaGetDevice");
    cudnnHandle_t h = NULL;
    GT_TRY(selector_of(device, &h));
    conv_descs tmp{}, *d = NULL;
    GT_TRY(descs_for(NULL, a, &tmp, &d));
    conv_choice c{};
    gt_status status = choice_for(h, d, a, device, SIZE_MAX, &c);
    descs_destroy(&tmp);
    if (status == GT_OK)
        *bytes = choice_bytes(a, &c);
    return status;
}

// The runtime of a state: its handle (bound to the state's stream) made on first use.
gt_status runtime_of(gt_cuda_backend_state *state, conv_runtime **out) {
    if (!state->conv) {
        GT_TRY(gt_cuda_lib_load(GT_CUDA_LIB_CUDNN));
        cudnnHandle_t h = NULL;
        GT_CUDNN_TRY(gt_cudnn.cudnnCreate(&h), "cudnnCreate");
        cudnnStatus_t st = gt_cudnn.cudnnSetStream(h, stream_of(state));
        if (st != CUDNN_STATUS_SUCCESS) {
            gt_cudnn.cudnnDestroy(h);
            return cudnn_error(st, "cudnnSetStream", __LINE__);
        }
        conv_runtime *rt = new (std::nothrow) conv_runtime;
        if (!rt) {
            gt_cudnn.cudnnDestroy(h);
            return GT_FAIL(GT_ERR_OOM, "out of host memory for the cuDNN state");
        }
        rt->handle = h;
        state->conv = rt;
    }
    *out = static_cast<conv_runtime *>(state->conv);
    return GT_OK;
}

// Everything a call needs after the checks.
struct conv_call {
    gt_cuda_backend_state *state;
    conv_runtime *rt;
    conv_descs *d;
    conv_choice c;
};

gt_status conv_begin(gt_backend *be, const gt_conv2d_args *a, conv_call *call) {
    GT_TRY(gt_cuda_op_begin(be, &call->state));
    GT_TRY(check_int_extents(a));
    GT_TRY(runtime_of(call->state, &call->rt));
    GT_TRY(descs_for(&call->rt->shapes, a, NULL, &call->d));
    size_t room = be->workspace ? be->workspace_bytes : 0;
    return choice_for(call->rt->handle, call->d, a, call->state->device, room, &call->c);
}

template <gt_dtype DT>
__global__ void channel_bias_kernel(void *out, const float *bias, size_t n, size_t per_channel, size_t channels) {
    GT_GRID_STRIDE(i, n) store_elem<DT>(out, i, __fadd_rn(load_elem<DT>(out, i), bias[i / per_channel % channels]));
}

// dbias[o] (+)= sum over n, p of dout[n, o, p]: one block per channel, threads adding every
// kThreads-th term in double in order, then a pairwise fold (a fixed order without atomics).
template <gt_dtype DT>
__global__ void channel_sum_kernel(float *dbias, const void *dout, size_t batch, size_t channels, size_t per_channel,
                                   int accumulate) {
    __shared__ double sums[kThreads];
    const size_t terms = batch * per_channel;
    for (size_t o = blockIdx.x; o < channels; o += gridDim.x) {
        double sum = 0.0;
        for (size_t t = threadIdx.x; t < terms; t += kThreads) {
            size_t n = t / per_channel, p = t % per_channel;
            sum = __dadd_rn(sum, (double)load_elem<DT>(dout, (n * channels + o) * per_channel + p));
        }
        sums[threadIdx.x] = sum;
        __syncthreads();
        for (unsigned width = kThreads / 2; width >= 1; width /= 2) {
            if (threadIdx.x < width)
                sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + width]);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            float total = __double2float_rn(sums[0]);
            dbias[o] = accumulate ? __fadd_rn(dbias[o], total) : total;
        }
        __syncthreads();
    }
}

// dweight[i] (+)= the staged dt weight gradient, widened.
template <gt_dtype DT>
__global__ void widen_add_kernel(float *dweight, const void *staged, size_t n, int accumulate) {
    GT_GRID_STRIDE(i, n) {
        float g = load_elem<DT>(staged, i);
        dweight[i] = accumulate ? __fadd_rn(dweight[i], g) : g;
    }
}

gt_status add_bias(const conv_call *call, const gt_conv2d_args *a) {
    size_t per_channel = (size_t)(gt_conv2d_out_h(a) * gt_conv2d_out_w(a)), channels = (size_t)a->out_channels;
    size_t n = (size_t)a->batch * channels * per_channel;
    cudaStream_t stream = stream_of(call->state);
    GT_LAUNCH_DT(a->dt, channel_bias_kernel, grid_for(n), kThreads, 0, stream, a->out, a->bias, n, per_channel,
                 channels);
    return gt_cuda_check_launch("channel_bias_kernel launch");
}

gt_status bias_gradient(const conv_call *call, const gt_conv2d_args *a) {
    size_t per_channel = (size_t)(gt_conv2d_out_h(a) * gt_conv2d_out_w(a)), channels = (size_t)a->out_channels;
    GT_LAUNCH_DT(a->dt, channel_sum_kernel, grid_for(channels, 1), kThreads, 0, stream_of(call->state), a->dbias,
                 a->dout, (size_t)a->batch, channels, per_channel, a->accumulate);
    return gt_cuda_check_launch("channel_sum_kernel launch");
}

gt_status data_gradient(const conv_call *call, gt_backend *be, const gt_conv2d_args *a) {
    const float one = 1.0f, zero = 0.0f;
    GT_CUDNN_TRY(gt_cudnn.cudnnSetConvolutionMathType(call->d->conv, call->c.data_math), "cudnnSetConvolutionMathType");
    GT_CUDNN_TRY(gt_cudnn.cudnnConvolutionBackwardData(call->rt->handle, &one, call->d->w, a->weight, call->d->y, a->dout,
                                                       call->d->conv, call->c.data, be->workspace, call->c.data_bytes, &zero,
                                                       call->d->x, a->dx),
                 "cudnnConvolutionBackwardData");
    return GT_OK;
}

gt_status filter_gradient(const conv_call *call, gt_backend *be, const gt_conv2d_args *a) {
    const float one = 1.0f, beta = a->accumulate && a->dt == GT_F32 ? 1.0f : 0.0f;
    size_t stage = stage_bytes(a);
    void *dw = stage ? be->workspace : static_cast<void *>(a->dweight);
    void *work = static_cast<char *>(be->workspace) + stage;
    GT_CUDNN_TRY(gt_cudnn.cudnnSetConvolutionMathType(call->d->conv, call->c.filter_math), "cudnnSetConvolutionMathType");
    GT_CUDNN_TRY(gt_cudnn.cudnnConvolutionBackwardFilter(call->rt->handle, &one, call->d->x, a->x, call->d->y, a->dout,
                                                         call->d->conv, call->c.filter, work, call->c.filter_bytes, &beta,
                                                         call->d->w, dw),
                 "cudnnConvolutionBackwardFilter");
    if (!stage)
        return GT_OK;
    size_t n = (size_t)a->out_channels * (size_t)(a->in_channels / a->groups) * (size_t)(a->kernel_h * a->kernel_w);
    GT_LAUNCH_DT(a->dt, widen_add_kernel, grid_for(n), kThreads, 0, stream_of(call->state), a->dweight, dw, n,
                 a->accumulate);
    return gt_cuda_check_launch("widen_add_kernel launch");
}

// A backward over no samples: the gradients are sums over nothing.
gt_status empty_backward(gt_backend *be, const gt_conv2d_args *a) {
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (a->accumulate)
        return GT_OK;
    size_t wsize = (size_t)a->out_channels * (size_t)(a->in_channels / a->groups) *
                   (size_t)(a->kernel_h * a->kernel_w) * sizeof(float);
    if (a->dweight)
        GT_CUDA_TRY(cudaMemsetAsync(a->dweight, 0, wsize, stream_of(state)), "cudaMemsetAsync");
    if (a->dbias)
        GT_CUDA_TRY(cudaMemsetAsync(a->dbias, 0, (size_t)a->out_channels * sizeof(float), stream_of(state)),
                    "cudaMemsetAsync");
    return GT_OK;
}

}  // namespace

extern "C" size_t gt_cuda_conv2d_workspace_bytes(const gt_conv2d_args *args, int threads) {
    (void)threads;
    gt_conv2d_args sizes = *args;
    sizes.batch = 0;  // the sizes only: the pointers may be unset
    size_t bytes = 0;
    if (args->batch == 0 || gt_conv2d_check(&sizes, 0) != GT_OK || check_int_extents(args) != GT_OK ||
        gt_cuda_require_available() != GT_OK || plan_choice(args, &bytes) != GT_OK) {
        gt_clear_error();  // the op reports the reason when it runs
        return 0;
    }
    return bytes;
}

extern "C" gt_status gt_cuda_conv2d_forward(gt_backend *be, const gt_conv2d_args *args) {
    GT_TRY(gt_conv2d_check(args, 0));
    conv_call call{};
    if (args->batch == 0)
        return gt_cuda_op_begin(be, &call.state);
    GT_TRY(conv_begin(be, args, &call));
    const float one = 1.0f, zero = 0.0f;
    GT_CUDNN_TRY(gt_cudnn.cudnnSetConvolutionMathType(call.d->conv, call.c.fwd_math), "cudnnSetConvolutionMathType");
    GT_CUDNN_TRY(gt_cudnn.cudnnConvolutionForward(call.rt->handle, &one, call.d->x, args->x, call.d->w, args->weight,
                                                  call.d->conv, call.c.fwd, be->workspace, call.c.fwd_bytes, &zero, call.d->y,
                                                  args->out),
                 "cudnnConvolutionForward");
    return args->bias ? add_bias(&call, args) : GT_OK;
}

extern "C" gt_status gt_cuda_conv2d_backward(gt_backend *be, const gt_conv2d_args *args) {
    GT_TRY(gt_conv2d_check(args, 1));
    if (args->batch == 0)
        return empty_backward(be, args);
    conv_call call{};
    GT_TRY(conv_begin(be, args, &call));
    size_t need = stage_bytes(args) + call.c.filter_bytes, room = be->workspace ? be->workspace_bytes : 0;
    if (args->dweight && need > room)
        return GT_FAIL(GT_ERR_VALUE, "workspace: conv2d's weight gradient (batch %lld, %lld -> %lld channels) needs "
                       "%zu bytes, got %zu", (long long)args->batch, (long long)args->in_channels,
                       (long long)args->out_channels, need, room);
    if (args->dbias)
        GT_TRY(bias_gradient(&call, args));
    if (args->dweight)
        GT_TRY(filter_gradient(&call, be, args));
    return args->dx ? data_gradient(&call, be, args) : GT_OK;
}

extern "C" void gt_cuda_conv_release(gt_cuda_backend_state *state) {
    conv_runtime *rt = static_cast<conv_runtime *>(state->conv);
    if (!rt)
        return;
    for (auto &entry : rt->shapes)
        descs_destroy(&entry.second);
    gt_cudnn.cudnnDestroy(rt->handle);
    delete rt;
    state->conv = NULL;
}

extern "C" gt_status gt_cuda_cudnn_set_flags(int benchmark, int deterministic) {
    if (benchmark != 0 && benchmark != 1)
        return GT_FAIL(GT_ERR_VALUE, "benchmark: must be 0 or 1, got %d", benchmark);
    if (deterministic != 0 && deterministic != 1)
        return GT_FAIL(GT_ERR_VALUE, "deterministic: must be 0 or 1, got %d", deterministic);
    globals.benchmark.store(benchmark);
    globals.deterministic.store(deterministic);
    return GT_OK;
}

extern "C" void gt_cuda_cudnn_flags(int *benchmark, int *deterministic) {
    *benchmark = globals.benchmark.load();
    *deterministic = globals.deterministic.load();
}

extern "C" gt_status gt_cuda_cudnn_version(size_t *out) {
    *out = 0;
    GT_TRY(gt_cuda_lib_load(GT_CUDA_LIB_CUDNN));
    *out = gt_cudnn.cudnnGetVersion();
    return GT_OK;
}

extern "C" size_t gt_cuda_cudnn_cached_choices(void) {
    std::lock_guard<std::mutex> guard(globals.lock);
    return globals.choices.size();
}
