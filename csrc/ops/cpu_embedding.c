/* CPU embedding: out[i, :] = table[ids[i], :] (the table f32, f16 or bf16; rounded to dt) and the
 * scatter-add gradient
 * dtable[ids[i], :] (+)= dout[i, :]. The backward splits the columns into blocks run in
 * parallel; inside a block the rows i are added in increasing order, so every element of
 * dtable receives its contributions in the same order for any thread count. */
#include <string.h>

#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

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
