#include "nn/rdrop.h"

#include <math.h>

gt_status gt_rdrop_check(const gt_loss *loss, const gt_tensor *out) {
    float alpha = loss->rdrop_alpha;
    if (!(alpha >= 0.0f && isfinite(alpha)))
        return GT_FAIL(GT_ERR_VALUE, "rdrop_alpha: must be a finite number >= 0, got %g", (double)alpha);
    if (alpha == 0.0f)
        return GT_OK;
    if (loss->kind != GT_LOSS_CROSS_ENTROPY)
        return GT_FAIL(GT_ERR_VALUE, "rdrop_alpha: R-Drop's KL term compares class distributions; it applies to "
                       "cross-entropy only, not MSE");
    if (out->ndim < 2 || out->shape[0] % 2 != 0)
        return GT_FAIL(GT_ERR_VALUE, "rdrop_alpha: R-Drop needs each micro-batch stacked on itself (2B rows: row i "
                       "and row B + i are one example), got an output of %lld rows",
                       out->ndim ? (long long)out->shape[0] : 0LL);
    return GT_OK;
}
