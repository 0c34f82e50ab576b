/* Tensor descriptors: a pointer into memory owned by an arena, with dtype, shape and device.
 * No reference counting: the owner of the arena outlives its descriptors. */
#ifndef GT_TENSOR_H
#define GT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GT_MAX_DIMS = 8 };

typedef enum gt_dtype {
    GT_F32 = 0,   /* IEEE binary32 */
    GT_F16 = 1,   /* IEEE binary16 */
    GT_BF16 = 2,  /* bfloat16: the top half of a binary32 */
    GT_F64 = 3,   /* IEEE binary64 */
    GT_I32 = 4,
    GT_I64 = 5,
    GT_U8 = 6,
    GT_I8 = 7,
    GT_BOOL = 8,  /* one byte, 0 or 1 */
    GT_DTYPE_COUNT
} gt_dtype;

typedef struct gt_tensor {
    void *ptr;                      /* first element; NULL for an unplanned tensor */
    gt_dtype dtype;                 /* element type */
    int ndim;                       /* number of dimensions, 0..GT_MAX_DIMS */
    int64_t shape[GT_MAX_DIMS];     /* extent per dimension; C-contiguous layout */
    gt_device device;               /* where ptr points */
} gt_tensor;

/* Bytes per element of a dtype (0 for an unknown dtype). */
size_t gt_dtype_size(gt_dtype dtype);

/* Name such as "f32", "bf16"; "?" for an unknown dtype. */
const char *gt_dtype_name(gt_dtype dtype);

/* Parses "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16", ... naming `arg_name` on failure. */
gt_status gt_dtype_parse(const char *text, const char *arg_name, gt_dtype *out);

/* Number of elements (1 for a 0-d tensor). */
size_t gt_tensor_numel(const gt_tensor *t);

/* Bytes of the elements. */
size_t gt_tensor_bytes(const gt_tensor *t);

/* Bytes of the elements, checked: GT_ERR_OOM naming `what` when the byte count (or the bytes of
 * a leading part of the shape) would exceed PTRDIFF_MAX, the largest buffer there can be. */
gt_status gt_tensor_checked_bytes(const gt_tensor *t, const char *what, size_t *out);

/* A descriptor for `ndim` dimensions; fails on negative extents or ndim out of range. */
gt_status gt_tensor_make(gt_tensor *out, void *ptr, gt_dtype dtype, int ndim,
                         const int64_t *shape, gt_device device);

#ifdef __cplusplus
}
#endif
#endif
