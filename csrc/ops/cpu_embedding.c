/* CPU embedding: out[i, :] = table[ids[i], :] (the table f32, f16 or bf16, or quantized blockwise
 * and dequantized row by row; rounded to dt) and the scatter-add gradient
 * dtable[ids[i], :] (+)= dout[i, :]. The backward splits the columns into blocks run in
 * parallel; inside a block the rows i are added in increasing order, so every element of
 * dtable receives its contributions in the same order for any thread count. */
#include <string.h>

#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"
#include "ops/quant_hd.h"

enum { GT_EMB_COLS = 128 };  /* columns per block of the backward */

/* Fails with GT_ERR_INDEX naming the first id outside [0, num). */
static gt_status check_ids(const int64_t *ids, int64_t n, int64_t num) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= num)
            return GT_FAIL(GT_ERR_INDEX, "ids[%lld] = %lld is out of range [0, %lld)",
                           (long long)i, (long long)ids[i], (long long)num);
    return GT_OK;
}

static gt_status check_embedding(const int64_t *ids, int64_t n, int64_t num, int64_t dim,
                                 gt_dtype dt) {
    GT_TRY(gt_op_check_size(n, "n"));
    GT_TRY(gt_op_check_size(num, "num"));
    GT_TRY(gt_op_check_size(dim, "dim"));
    GT_TRY(gt_op_check_dtype(dt, "dt"));
    if (n > 0)
        GT_TRY(gt_op_check_ptr(ids, "ids"));
    return check_ids(ids, n, num);
}

GT_INLINE void emb_forward_body(void *out, const int64_t *ids, const void *table, gt_dtype table_dt,
                                size_t row_begin, size_t row_end, size_t dim, gt_dtype dt) {
    for (size_t i = row_begin; i < row_end; i++) {
        size_t src = (size_t)ids[i] * dim;
        if (table_dt == GT_F32)
            for (size_t c = 0; c < dim; c++)
                gt_cpu_store(out, i * dim + c, ((const float *)table)[src + c], dt);
        else
            for (size_t c = 0; c < dim; c++)
                gt_cpu_store(out, i * dim + c, gt_cpu_load(table, src + c, table_dt), dt);
    }
}
GT_CPU_KERNEL(emb_forward, (void *out, const int64_t *ids, const void *table, gt_dtype table_dt,
                            size_t row_begin, size_t row_end, size_t dim, gt_dtype dt),
              out, ids, table, table_dt, row_begin, row_end, dim)

gt_status gt_cpu_embedding_forward(gt_backend *be, void *out, const int64_t *ids,
                                   const void *table, gt_dtype table_dt, int64_t n, int64_t num, int64_t dim,
                                   gt_dtype dt) {
    GT_TRY(check_embedding(ids, n, num, dim, dt));
    GT_TRY(gt_op_check_dtype(table_dt, "table_dt"));
    if (n == 0 || dim == 0)
        return GT_OK;
    __typeof__(&emb_forward_scalar) kernel = GT_CPU_RUN(emb_forward);
    size_t block = GT_CPU_CHUNK / (size_t)dim + 1, blocks = ((size_t)n + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * block < (size_t)n ? (b + 1) * block : (size_t)n;
        kernel(out, ids, table, table_dt, b * block, end, (size_t)dim, dt);
    }
    return GT_OK;
}

/* A quantized table's shape: blocksize > 0 (even with 4 bits), bits 4 or 8, dim whole blocks. */
static gt_status check_quantized_table(int64_t dim, int64_t blocksize, int bits) {
    if (bits != 4 && bits != 8)
        return GT_FAIL(GT_ERR_VALUE, "bits: must be 4 or 8, got %d", bits);
    if (blocksize <= 0 || (bits == 4 && blocksize % 2))
        return GT_FAIL(GT_ERR_VALUE, "blocksize: must be > 0 (even with 4 bits), got %lld", (long long)blocksize);
    if (dim % blocksize)
        return GT_FAIL(GT_ERR_VALUE, "dim: %lld is not a multiple of blocksize %lld (a row must be whole blocks)",
                       (long long)dim, (long long)blocksize);
    return GT_OK;
}

/* Rows [row_begin, row_end) of out, each the dequantized row ids[i] (element math of quant_hd.h);
 * 4-bit rows block by block through a table of the block's 16 outputs (the same bits). */
static void quantized_rows(void *out, const int64_t *ids, const uint8_t *codes, const float *absmax,
                           const float *code, size_t row_begin, size_t row_end, size_t dim, size_t blocksize,
                           int bits, gt_dtype dt) {
    for (size_t i = row_begin; i < row_end; i++) {
        size_t first = (size_t)ids[i] * dim;  /* the row's first element in the flattened table */
        if (bits == 4) {  /* first is even (dim is whole blocks, blocksize even): the row starts on a byte */
            void *row = (char *)out + i * dim * gt_dtype_size(dt);
            for (size_t b = 0; b < dim; b += blocksize)
                gt_cpu_dequantize4_block(row, codes + first / 2, absmax[(first + b) / blocksize], code, b,
                                         b + blocksize, dt);
            continue;
        }
        for (size_t c = 0; c < dim; c++) {
            size_t at = first + c;
            gt_quant_decode_store(out, i * dim + c, code, gt_quant_code_at(codes, at, bits), absmax[at / blocksize],
                                  dt);
        }
    }
}

gt_status gt_cpu_quantized_embedding_forward(gt_backend *be, void *out, const int64_t *ids, const uint8_t *codes,
                                             const float *absmax, const float *code, int64_t n, int64_t num,
                                             int64_t dim, int64_t blocksize, int bits, gt_dtype dt) {
    (void)be;
    GT_TRY(check_embedding(ids, n, num, dim, dt));
    GT_TRY(check_quantized_table(dim, blocksize, bits));
    if (n == 0 || dim == 0)
        return GT_OK;
    size_t block = GT_CPU_CHUNK / (size_t)dim + 1, blocks = ((size_t)n + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t end = (b + 1) * block < (size_t)n ? (b + 1) * block : (size_t)n;
        quantized_rows(out, ids, codes, absmax, code, b * block, end, (size_t)dim, (size_t)blocksize, bits, dt);
    }
    return GT_OK;
}

/* Adds dout[:, col_begin:col_end] into the rows ids[:] of dtable, i in increasing order. */
GT_INLINE void emb_backward_body(float *dtable, const void *dout, const int64_t *ids, size_t n,
                                 size_t dim, size_t col_begin, size_t col_end, gt_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        float *dst = dtable + (size_t)ids[i] * dim;
        for (size_t c = col_begin; c < col_end; c++)
            dst[c] += gt_cpu_load(dout, i * dim + c, dt);
    }
}
GT_CPU_KERNEL(emb_backward, (float *dtable, const void *dout, const int64_t *ids, size_t n,
                             size_t dim, size_t col_begin, size_t col_end, gt_dtype dt),
              dtable, dout, ids, n, dim, col_begin, col_end)

/* accumulate == 0 writes the gradient: dtable is zeroed first (rows no id names get 0). */
gt_status gt_cpu_embedding_backward(gt_backend *be, float *dtable, const void *dout,
                                    const int64_t *ids, int64_t n, int64_t num, int64_t dim,
                                    gt_dtype dt, int accumulate) {
    GT_TRY(check_embedding(ids, n, num, dim, dt));
    if (!accumulate && num > 0 && dim > 0)
        GT_TRY(gt_cpu_zero(be, dtable, (size_t)num * (size_t)dim * sizeof(float)));
    if (n == 0 || dim == 0)
        return GT_OK;
    __typeof__(&emb_backward_scalar) kernel = GT_CPU_RUN(emb_backward);
    size_t blocks = ((size_t)dim + GT_EMB_COLS - 1) / GT_EMB_COLS;
#pragma omp parallel for schedule(static) if (blocks > 1 && n * dim > GT_CPU_CHUNK)
    for (size_t b = 0; b < blocks; b++) {
        size_t begin = b * GT_EMB_COLS;
        size_t end = begin + GT_EMB_COLS < (size_t)dim ? begin + GT_EMB_COLS : (size_t)dim;
        kernel(dtable, dout, ids, (size_t)n, (size_t)dim, begin, end, dt);
    }
    return GT_OK;
}
