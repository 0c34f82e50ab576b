/* CPU blockwise quantization and dequantization in bitsandbytes' formats (ops.h,
 * quantize_blockwise / dequantize_blockwise; element math in ops/quant_hd.h). One block per
 * iteration of a parallel loop: the result does not depend on the thread count. */
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/quant_kernels.h"
#include "ops/quant_hd.h"

#include <math.h>

/* The arguments both ops share: n >= 0, blocksize > 0, bits 4 or 8, dt f32/f16/bf16. */
static gt_status check_quant_args(int64_t n, int64_t blocksize, int bits, gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (blocksize <= 0)
        return GT_FAIL(GT_ERR_VALUE, "blocksize: must be > 0, got %lld", (long long)blocksize);
    if (bits != 4 && bits != 8)
        return GT_FAIL(GT_ERR_VALUE, "bits: must be 4 or 8, got %d", bits);
    if (bits == 4 && blocksize % 2)
        return GT_FAIL(GT_ERR_VALUE, "blocksize: must be even with 4-bit codes, got %lld", (long long)blocksize);
    return GT_OK;
}

/* Index of the first non-finite element of in, or n. */
static size_t first_non_finite(const void *in, size_t n, gt_dtype dt) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(gt_cpu_load(in, i, dt)))
            return i;
    return n;
}

/* Block b: its absmax, then the code of each element (4 bits: into a zeroed nibble pair). */
static void quantize_block(uint8_t *codes, float *absmax, const void *in, size_t n, size_t bs, size_t b,
                           const float *bounds, const uint8_t *order, int bits, gt_dtype dt) {
    size_t begin = b * bs, end = begin + bs < n ? begin + bs : n;
    int partial = end - begin < bs;
    float amax = 0.0f;
    for (size_t i = begin; i < end; i++) {  /* finite values (checked): a compare, not fmaxf, whose */
        float a = fabsf(gt_cpu_load(in, i, dt));  /* vectorised reduction crashes aarch64's gcc 12 */
        amax = a > amax ? a : amax;
    }
    float divisor = gt_quant_divisor(amax), inv = 1.0f / divisor;
    absmax[b] = partial ? divisor : amax;
    int nbounds = (1 << bits) - 1;
    for (size_t i = begin; i < end; i++) {
        float s = gt_quant_scale(gt_cpu_load(in, i, dt), inv, divisor, partial);
        uint8_t k = gt_quant_encode(s, bounds, order, nbounds);
        if (bits == 8)
            codes[i] = k;
        else
            codes[i >> 1] = (i & 1) ? (uint8_t)((codes[i >> 1] & 0xF0) | k) : (uint8_t)(k << 4);
    }
}

gt_status gt_cpu_quantize_blockwise(gt_backend *be, uint8_t *codes, float *absmax, const void *in, int64_t n,
                                    int64_t blocksize, const float *bounds, const uint8_t *order, int bits,
                                    gt_dtype dt) {
    (void)be;
    GT_TRY(check_quant_args(n, blocksize, bits, dt));
    size_t count = (size_t)n, bs = (size_t)blocksize, blocks = (count + bs - 1) / bs;
    size_t bad = first_non_finite(in, count, dt);
    if (bad < count)
        return GT_FAIL(GT_ERR_VALUE, "in: element %zu is not finite (NaN or inf cannot be quantized)", bad);
#pragma omp parallel for schedule(static) if (blocks > 1 && count > 65536)
    for (size_t b = 0; b < blocks; b++)
        quantize_block(codes, absmax, in, count, bs, b, bounds, order, bits, dt);
    if (bits == 4 && (count & 1))  /* the pad element: scaled value 0 */
        codes[count >> 1] = (uint8_t)((codes[count >> 1] & 0xF0) |
                                      gt_quant_encode(0.0f, bounds, order, (1 << bits) - 1));
    return GT_OK;
}

/* The first element of [begin, end) that the SIMD level's kernel for `bits`-bit codes left (whole
 * vectors from begin on: ops/quant_kernels.h), begin itself at the portable level. */
static size_t dequantize_vectors(void *out, const uint8_t *codes, float scale, const float *code, size_t begin,
                                 size_t end, int bits, gt_dtype dt) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512:
        return (bits == 4 ? gt_dequantize4_avx512 : gt_dequantize8_avx512)(out, codes, code, scale, begin, end, dt);
    case GT_SIMD_AVX2:
        return (bits == 4 ? gt_dequantize4_avx2 : gt_dequantize8_avx2)(out, codes, code, scale, begin, end, dt);
    default:
        break;
    }
#endif
    (void)out, (void)codes, (void)scale, (void)code, (void)end, (void)bits, (void)dt;
    return begin;
}

void gt_cpu_dequantize4_block(void *out, const uint8_t *codes, float scale, const float *code, size_t begin,
                              size_t end, gt_dtype dt) {
    size_t i = dequantize_vectors(out, codes, scale, code, begin, end, 4, dt);  /* even, as begin */
    if (i == end)
        return;
    float l32[16];
    uint16_t l16[16];
    for (uint8_t k = 0; k < 16; k++)
        gt_quant_decode_store(dt == GT_F32 ? (void *)l32 : (void *)l16, k, code, k, scale, dt);
    if (dt == GT_F32) {
        float *o = out;
        for (; i + 1 < end; i += 2) {
            o[i] = l32[codes[i >> 1] >> 4];
            o[i + 1] = l32[codes[i >> 1] & 0x0F];
        }
        if (i < end)
            o[i] = l32[gt_quant_code_at(codes, i, 4)];
    } else {
        uint16_t *o = out;
        for (; i + 1 < end; i += 2) {
            o[i] = l16[codes[i >> 1] >> 4];
            o[i + 1] = l16[codes[i >> 1] & 0x0F];
        }
        if (i < end)
            o[i] = l16[gt_quant_code_at(codes, i, 4)];
    }
}

/* Elements of an 8-bit block from which decoding its 256 possible outputs first and looking them up
 * beats decoding element by element (a QLinear's int8 rows: thousands of elements a block). */
enum { GT_DEQUANTIZE8_TABLE_FROM = 1024 };

/* Block b of 8-bit codes [begin, end) by a table of its 256 possible outputs (gt_quant_decode_store
 * of each code: the same bits as element by element). */
static void dequantize8_block(void *out, const uint8_t *codes, float scale, const float *code, size_t begin,
                              size_t end, gt_dtype dt) {
    float l32[256];
    uint16_t l16[256];
    for (int k = 0; k < 256; k++)
        gt_quant_decode_store(dt == GT_F32 ? (void *)l32 : (void *)l16, (size_t)k, code, (uint8_t)k, scale, dt);
    if (dt == GT_F32) {
        float *o = out;
        for (size_t i = begin; i < end; i++)
            o[i] = l32[codes[i]];
    } else {
        uint16_t *o = out;
        for (size_t i = begin; i < end; i++)
            o[i] = l16[codes[i]];
    }
}

gt_status gt_cpu_dequantize_blockwise(gt_backend *be, void *out, const uint8_t *codes, const float *absmax,
                                      const float *code, int64_t n, int64_t blocksize, int bits, gt_dtype dt) {
    (void)be;
    GT_TRY(check_quant_args(n, blocksize, bits, dt));
    size_t count = (size_t)n, bs = (size_t)blocksize, blocks = (count + bs - 1) / bs;
#pragma omp parallel for schedule(static) if (blocks > 1 && count > 65536)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * bs < count ? (b + 1) * bs : count;
        float scale = absmax[b];
        if (bits == 4) {
            gt_cpu_dequantize4_block(out, codes, scale, code, b * bs, end, dt);
            continue;
        }
        size_t rest = dequantize_vectors(out, codes, scale, code, b * bs, end, 8, dt);
        if (end - rest >= GT_DEQUANTIZE8_TABLE_FROM) {
            dequantize8_block(out, codes, scale, code, rest, end, dt);
            continue;
        }
        for (size_t i = rest; i < end; i++)
            gt_quant_decode_store(out, i, code, codes[i], scale, dt);
    }
    return GT_OK;
}
