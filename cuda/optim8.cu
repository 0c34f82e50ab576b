// 8-bit AdamW's kernel: one CUDA block of GT_ADAMW8_BLOCK threads per quantization block of a
// parameter. Each thread dequantizes its element's moments, runs gt_adamw8_element (the
// GT_HD math of ops/adamw8bit_hd.h, __f*_rn intrinsics, so the same bits as the CPU loop of
// csrc/train/optim8_cpu.c), the block reduces the new absmax of each moment (a max, exact in any
// order), and each thread writes its codes with the quantizer of ops/quant_hd.h.
#include <cuda_runtime.h>

#include "cuda_internal.cuh"
#include "ops/adamw8bit_hd.h"
#include "ops/dynamic_map.h"
#include "optim_cuda.h"

namespace {

constexpr size_t kMaxGrid = 65535;  // grid cap; a block-stride loop covers the rest

__constant__ uint32_t kCode1[256] = {GT_DYNMAP_SIGNED_CODE};
__constant__ uint32_t kBounds1[256] = {GT_DYNMAP_SIGNED_BOUNDS};
__constant__ uint32_t kCode2[256] = {GT_DYNMAP_UNSIGNED_CODE};
__constant__ uint32_t kBounds2[256] = {GT_DYNMAP_UNSIGNED_BOUNDS};
__constant__ uint8_t kOrder[256] = {GT_DYNMAP_ORDER};

// Largest of red[0..GT_ADAMW8_BLOCK) into red[0] (every thread of the block calls it).
__device__ void block_max(float *red) {
    for (int half = GT_ADAMW8_BLOCK / 2; half > 0; half /= 2) {
        __syncthreads();
        if ((int)threadIdx.x < half)
            red[threadIdx.x] = gt_adamw8_amax(red[threadIdx.x], red[threadIdx.x + half]);
    }
    __syncthreads();
}

__global__ void adamw8bit_kernel(gt_adamw8_scalars s, float *p, const float *g, uint8_t *c1, uint8_t *c2,
                                 float *absmax1, float *absmax2, size_t n) {
    __shared__ float red1[GT_ADAMW8_BLOCK], red2[GT_ADAMW8_BLOCK];
    const float *code1 = reinterpret_cast<const float *>(kCode1);
    const float *code2 = reinterpret_cast<const float *>(kCode2);
    size_t blocks = (n + GT_ADAMW8_BLOCK - 1) / GT_ADAMW8_BLOCK;
    for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        size_t begin = b * GT_ADAMW8_BLOCK, i = begin + threadIdx.x;
        size_t len = n - begin < GT_ADAMW8_BLOCK ? n - begin : GT_ADAMW8_BLOCK;
        float m = 0.0f, v = 0.0f;
        if (i < n) {
            m = code1[c1[i]] * absmax1[b];
            v = code2[c2[i]] * absmax2[b];
            gt_adamw8_element(&p[i], g[i], &m, &v, &s);
        }
        red1[threadIdx.x] = gt_adamw8_amax(0.0f, m);
        red2[threadIdx.x] = gt_adamw8_amax(0.0f, v);
        block_max(red1);
        block_max(red2);
        int partial = len < GT_ADAMW8_BLOCK;
        float div1, inv1, div2, inv2;
        float a1 = gt_adamw8_absmax(red1[0], partial, &div1, &inv1);
        float a2 = gt_adamw8_absmax(red2[0], partial, &div2, &inv2);
        if (i < n) {
            c1[i] = gt_adamw8_code(m, inv1, div1, partial, reinterpret_cast<const float *>(kBounds1), kOrder);
            c2[i] = gt_adamw8_code(v, inv2, div2, partial, reinterpret_cast<const float *>(kBounds2), kOrder);
        }
        if (threadIdx.x == 0) {
            absmax1[b] = a1;
            absmax2[b] = a2;
        }
        __syncthreads();  // red1/red2 are read above before the next block's stores
    }
}

}  // namespace

extern "C" gt_status gt_cuda_adamw8bit(int device, const gt_adamw8_scalars *s, float *p, const float *g,
                                       uint8_t *c1, uint8_t *c2, float *absmax1, float *absmax2, size_t n,
                                       void *stream) {
    if (n == 0)
        return GT_OK;
    GT_TRY(gt_cuda_require_device(device, "device"));
    if (!p || !g || !c1 || !c2 || !absmax1 || !absmax2)
        return GT_FAIL(GT_ERR_VALUE, "adamw8bit: NULL device pointer for %zu elements", n);
    size_t blocks = (n + GT_ADAMW8_BLOCK - 1) / GT_ADAMW8_BLOCK;
    unsigned grid = (unsigned)(blocks > kMaxGrid ? kMaxGrid : blocks);
    adamw8bit_kernel<<<grid, GT_ADAMW8_BLOCK, 0, (cudaStream_t)stream>>>(*s, p, g, c1, c2, absmax1, absmax2, n);
    GT_CUDA_TRY(cudaGetLastError(), "adamw8bit_kernel launch");
    return GT_OK;
}
