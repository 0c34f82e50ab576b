/* CPU copies: dtype casts (core/cast.h), byte copies and zero fills, parallel over chunks of
 * bytes large enough that each thread streams memory; 2-D copies (rows of strided matrices),
 * parallel over rows. */
#include <string.h>

#include "core/cast.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_ops.h"

enum { GT_COPY_CHUNK = 1 << 20 };  /* bytes per parallel chunk of copy/zero */

gt_status gt_cpu_copy(gt_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dst, "dst"));
    GT_TRY(gt_op_check_ptr(src, "src"));
    size_t chunks = (bytes + GT_COPY_CHUNK - 1) / GT_COPY_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * GT_COPY_CHUNK;
        size_t len = bytes - begin < GT_COPY_CHUNK ? bytes - begin : GT_COPY_CHUNK;
        memcpy((char *)dst + begin, (const char *)src + begin, len);
    }
    return GT_OK;
}

gt_status gt_cpu_zero(gt_backend *be, void *dst, size_t bytes) {
    if (bytes == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dst, "dst"));
    size_t chunks = (bytes + GT_COPY_CHUNK - 1) / GT_COPY_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * GT_COPY_CHUNK;
        size_t len = bytes - begin < GT_COPY_CHUNK ? bytes - begin : GT_COPY_CHUNK;
        memset((char *)dst + begin, 0, len);
    }
    return GT_OK;
}

gt_status gt_cpu_cast(gt_backend *be, void *dst, gt_dtype dst_dt, const void *src,
                      gt_dtype src_dt, int64_t n) {
    GT_TRY(gt_op_check_size(n, "n"));
    return gt_cast(src, src_dt, dst, dst_dt, (size_t)n);
}

gt_status gt_cpu_copy_2d(gt_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                         size_t width, size_t rows) {
    if (width == 0 || rows == 0)
        return GT_OK;
    GT_TRY(gt_op_check_ptr(dst, "dst"));
    GT_TRY(gt_op_check_ptr(src, "src"));
    if (dst_pitch < width || src_pitch < width)
        return GT_FAIL(GT_ERR_VALUE, "dst_pitch, src_pitch: must be >= width (%zu), got %zu and %zu", width,
                       dst_pitch, src_pitch);
#pragma omp parallel for schedule(static) if (rows * width > GT_COPY_CHUNK)
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
    return GT_OK;
}
