/* Host harness of the CUDA RMSNorm kernels (cuda/ops_rmsnorm.cu): the GT_HD functions of
 * csrc/ops/rmsnorm_hd.h run over the kernels' grids in the kernels' decomposition (one row per
 * thread for the forward and din, one column per thread for dweight, here serially and in reverse
 * order to show that the order of the threads does not matter), so the arithmetic the GPU runs is
 * checked on any machine against the CPU op. tests/test_rmsnorm.py compiles it (C11,
 * -ffp-contract=off like the extension) and calls it through ctypes; dt is a gt_dtype (0 f32,
 * 1 f16, 2 bf16); weight and dweight may be NULL (no affine), din may be NULL; plus_one as the op's. */
#include "ops/rmsnorm_hd.h"

void gt_harness_rmsnorm_forward(void *out, float *rstd, const void *in, const float *weight, int plus_one,
                                int64_t rows, int64_t cols, float eps, int dt) {
    for (size_t r = (size_t)rows; r-- > 0;)
        gt_rms_forward_row(out, rstd, in, weight, plus_one, r, (size_t)cols, eps, (gt_dtype)dt);
}

void gt_harness_rmsnorm_backward(void *din, float *dweight, const void *dout, const void *in, const float *weight,
                                 int plus_one, const float *rstd, int64_t rows, int64_t cols, int dt, int accumulate) {
    for (size_t c = (size_t)cols; dweight && c-- > 0;) {  /* rmsnorm_dweight_kernel's threads */
        double sum = 0.0;
        for (size_t r = 0; r < (size_t)rows; r++)
            sum += gt_rms_dweight_term(dout, in, rstd, r, c, (size_t)cols, (gt_dtype)dt);
        gt_rms_dweight_store(dweight, c, sum, accumulate);
    }
    for (size_t r = (size_t)rows; din && r-- > 0;)  /* rmsnorm_din_kernel's threads */
        gt_rms_din_row(din, dout, in, weight, plus_one, rstd, r, (size_t)cols, (gt_dtype)dt);
}
