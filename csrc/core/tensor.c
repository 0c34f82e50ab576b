#include "core/tensor.h"

#include "core/alloc.h"

#include <string.h>

typedef struct dtype_info {
    const char *name;    /* short name, e.g. "bf16" */
    const char *alias;   /* NumPy-style name, e.g. "bfloat16" */
    size_t bytes;        /* element size */
} dtype_info;

static const dtype_info dtype_table[GT_DTYPE_COUNT] = {
    [GT_F32] = {"f32", "float32", 4}, [GT_F16] = {"f16", "float16", 2},
    [GT_BF16] = {"bf16", "bfloat16", 2}, [GT_F64] = {"f64", "float64", 8},
    [GT_I32] = {"i32", "int32", 4}, [GT_I64] = {"i64", "int64", 8},
    [GT_U8] = {"u8", "uint8", 1}, [GT_I8] = {"i8", "int8", 1},
    [GT_BOOL] = {"bool", "bool_", 1},
};

size_t gt_dtype_size(gt_dtype dtype) {
    return (unsigned)dtype < GT_DTYPE_COUNT ? dtype_table[dtype].bytes : 0;
}

const char *gt_dtype_name(gt_dtype dtype) {
    return (unsigned)dtype < GT_DTYPE_COUNT ? dtype_table[dtype].name : "?";
}

gt_status gt_dtype_parse(const char *text, const char *arg_name, gt_dtype *out) {
    for (int d = 0; d < GT_DTYPE_COUNT; d++) {
        if (strcmp(text, dtype_table[d].name) == 0 || strcmp(text, dtype_table[d].alias) == 0) {
            *out = (gt_dtype)d;
            return GT_OK;
        }
    }
    return GT_FAIL(GT_ERR_VALUE, "%s: unknown dtype '%s'", arg_name, text);
}

size_t gt_tensor_numel(const gt_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

size_t gt_tensor_bytes(const gt_tensor *t) { return gt_tensor_numel(t) * gt_dtype_size(t->dtype); }

gt_status gt_tensor_checked_bytes(const gt_tensor *t, const char *what, size_t *out) {
    size_t bytes = gt_dtype_size(t->dtype);  /* every prefix product is checked */
    for (int i = 0; i < t->ndim; i++)
        GT_TRY(gt_size_mul(bytes, (size_t)t->shape[i], what, &bytes));
    *out = bytes;
    return GT_OK;
}

gt_status gt_tensor_make(gt_tensor *out, void *ptr, gt_dtype dtype, int ndim,
                         const int64_t *shape, gt_device device) {
    memset(out, 0, sizeof *out);
    if (ndim < 0 || ndim > GT_MAX_DIMS)
        return GT_FAIL(GT_ERR_VALUE, "tensor rank %d is outside 0..%d", ndim, GT_MAX_DIMS);
    if (gt_dtype_size(dtype) == 0)
        return GT_FAIL(GT_ERR_TYPE, "unknown dtype code %d", (int)dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return GT_FAIL(GT_ERR_VALUE, "tensor dimension %d is negative (%lld)", i,
                           (long long)shape[i]);
        out->shape[i] = shape[i];
    }
    out->ptr = ptr;
    out->dtype = dtype;
    out->ndim = ndim;
    out->device = device;
    return GT_OK;
}
