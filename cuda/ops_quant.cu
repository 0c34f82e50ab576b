// CUDA blockwise quantization in bitsandbytes' formats (ops.h quantize_blockwise /
// dequantize_blockwise) with the CPU backend's element math (ops/quant_hd.h): one CUDA block per
// quantization block finds its absmax (a max: exact in any order) and encodes its elements; a
// 4-bit byte is written by one thread (elements 2j and 2j + 1). Unlike the CPU op this one does not
// look for non-finite input (that would need a wait): gputrain.quant checks before calling it.
#include "ops/quant_hd.h"
#include "ops_kernels.cuh"

namespace {

template <gt_dtype DT>
__global__ void quantize_blockwise_kernel(uint8_t *codes, float *absmax, const void *in, size_t n, size_t bs,
                                          const float *bounds, const uint8_t *order, int bits) {
    __shared__ float part[kThreads];
    size_t b = blockIdx.x, begin = b * bs, end = begin + bs < n ? begin + bs : n;
    float m = 0.0f;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
        m = fmaxf(m, fabsf(load_elem<DT>(in, i)));
    part[threadIdx.x] = m;
    __syncthreads();
    for (unsigned width = blockDim.x / 2; width > 0; width /= 2) {
        if (threadIdx.x < width)
            part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + width]);
        __syncthreads();
    }
    float amax = part[0], divisor = gt_quant_divisor(amax), inv = __fdiv_rn(1.0f, divisor);
    int partial = end - begin < bs, nbounds = (1 << bits) - 1;
    if (threadIdx.x == 0)
        absmax[b] = partial ? divisor : amax;
    if (bits == 8) {
        for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
            codes[i] = gt_quant_encode(gt_quant_scale(load_elem<DT>(in, i), inv, divisor, partial), bounds, order,
                                       nbounds);
        return;
    }
    for (size_t i = begin + 2 * threadIdx.x; i < end; i += 2 * blockDim.x) {
        uint8_t hi = gt_quant_encode(gt_quant_scale(load_elem<DT>(in, i), inv, divisor, partial), bounds, order,
                                     nbounds);
        float s1 = i + 1 < end ? gt_quant_scale(load_elem<DT>(in, i + 1), inv, divisor, partial) : 0.0f;
        codes[i >> 1] = (uint8_t)((hi << 4) | gt_quant_encode(s1, bounds, order, nbounds));
    }
}

template <gt_dtype DT>
__global__ void dequantize_blockwise_kernel(void *out, const uint8_t *codes, const float *absmax, const float *code,
                                            size_t n, size_t bs, int bits) {
    GT_GRID_STRIDE(i, n) {
        gt_quant_decode_store(out, i, code, gt_quant_code_at(codes, i, bits), absmax[i / bs], DT);
    }
}

gt_status check_quant_args(int64_t n, int64_t blocksize, int bits, gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (blocksize <= 0 || (bits == 4 && blocksize % 2))
        return GT_FAIL(GT_ERR_VALUE, "blocksize: must be > 0 (even with 4 bits), got %lld", (long long)blocksize);
    if (bits != 4 && bits != 8)
        return GT_FAIL(GT_ERR_VALUE, "bits: must be 4 or 8, got %d", bits);
    return GT_OK;
}

}  // namespace

gt_status gt_cuda_quantize_blockwise(gt_backend *be, uint8_t *codes, float *absmax, const void *in, int64_t n,
                                     int64_t blocksize, const float *bounds, const uint8_t *order, int bits,
                                     gt_dtype dt) {
    GT_TRY(check_quant_args(n, blocksize, bits, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0)
        return GT_OK;
    size_t blocks = ((size_t)n + (size_t)blocksize - 1) / (size_t)blocksize;
    if (blocks > 0x7fffffffu)
        return GT_FAIL(GT_ERR_VALUE, "n: %lld elements make more than 2^31 - 1 blocks", (long long)n);
    GT_LAUNCH_DT(dt, quantize_blockwise_kernel, (unsigned)blocks, kThreads, 0, stream_of(state), codes, absmax, in,
                 (size_t)n, (size_t)blocksize, bounds, order, bits);
    return gt_cuda_check_launch("quantize_blockwise_kernel launch");
}

gt_status gt_cuda_dequantize_blockwise(gt_backend *be, void *out, const uint8_t *codes, const float *absmax,
                                       const float *code, int64_t n, int64_t blocksize, int bits, gt_dtype dt) {
    GT_TRY(check_quant_args(n, blocksize, bits, dt));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (n == 0)
        return GT_OK;
    GT_LAUNCH_DT(dt, dequantize_blockwise_kernel, grid_for((size_t)n), kThreads, 0, stream_of(state), out, codes,
                 absmax, code, (size_t)n, (size_t)blocksize, bits);
    return gt_cuda_check_launch("dequantize_blockwise_kernel launch");
}
