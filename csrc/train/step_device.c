#include "train/step_device.h"

#include "core/alloc.h"

#ifdef GT_WITH_CUDA
#include "cuda_backend.h"
#include "scaler_cuda.h"
#endif

/* Device scratch of one step: the scaler state the kernel reads, and the inf flag it sets. */
typedef struct step_scratch {
    gt_scaler scaler;  /* copy of the host scaler (scale, enabled, ...) */
    int found_inf;     /* 0 before the kernel, 1 after it if a gradient was not finite */
} step_scratch;

#ifdef GT_WITH_CUDA
/* With the scratch allocated: copy in, unscale on the legacy default stream, read the flag.
 * The blocking copies run on that stream too, so they order with the model's kernels. */
static gt_status unscale_with(gt_model *model, const gt_scaler *scaler, step_scratch *scratch, int *flag) {
    int device = model->backend.device.index;
    step_scratch host = {.scaler = *scaler, .found_inf = 0};
    GT_TRY(gt_cuda_memcpy(scratch, &host, sizeof host, GT_COPY_HOST_TO_DEVICE, device));
    GT_TRY(gt_cuda_scaler_unscale_check(&scratch->scaler, model->grads.block.ptr, model->num_params,
                                        &scratch->found_inf, NULL));
    return gt_cuda_memcpy(flag, &scratch->found_inf, sizeof *flag, GT_COPY_DEVICE_TO_HOST, device);
}
#endif

size_t gt_step_scaler_bytes(gt_device device) {
    return device.kind == GT_DEVICE_CUDA ? gt_block_reserved_bytes(sizeof(step_scratch)) : 0;
}

gt_status gt_step_unscale_check_device(gt_model *model, const gt_scaler *scaler, int *found_inf) {
    if (model->backend.device.kind != GT_DEVICE_CUDA)
        return GT_FAIL(GT_ERR_VALUE, "model: expected a model on a CUDA device");
    if (model->num_params == 0)
        return GT_OK;
#ifdef GT_WITH_CUDA
    gt_block block = {0};
    GT_TRY(gt_block_alloc(model->backend.device, sizeof(step_scratch), &block));
    int flag = 0;
    gt_status status = unscale_with(model, scaler, block.ptr, &flag);
    gt_block_free(&block);
    if (status == GT_OK && flag)
        *found_inf = 1;
    return status;
#else
    return GT_FAIL(GT_ERR_CUDA, "model: 'cuda:%d' needs the CUDA backend, which was not compiled in",
                   model->backend.device.index);
#endif
}
