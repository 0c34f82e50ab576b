/* Argument checks shared by the CPU backend's ops; messages name the argument. */
#include "ops/cpu_kernels.h"

gt_status gt_cpu_check_dtype(gt_dtype dt, const char *arg_name) {
    if (dt == GT_F32 || dt == GT_F16 || dt == GT_BF16)
        return GT_OK;
    return GT_FAIL(GT_ERR_VALUE, "%s: expected f32, f16 or bf16, got %s", arg_name,
                   gt_dtype_name(dt));
}

gt_status gt_cpu_check_size(int64_t value, const char *arg_name) {
    if (value < 0)
        return GT_FAIL(GT_ERR_VALUE, "%s: must be >= 0, got %lld", arg_name, (long long)value);
    return GT_OK;
}

gt_status gt_cpu_check_ptr(const void *ptr, const char *arg_name) {
    if (!ptr)
        return GT_FAIL(GT_ERR_VALUE, "%s: NULL pointer", arg_name);
    return GT_OK;
}
