/* Host harness of the CUDA gated-activation kernels (cuda/ops_glu.cu): the per-thread functions of
 * csrc/ops/glu_hd.h run over the kernels' whole grid (one thread per element e of the
 * (rows, inter) output), last element first, so the arithmetic the GPU runs is checked on any
 * machine. tests/test_glu_cuda_math.py compiles it (C11, -ffp-contract=off like the extension)
 * and calls gt_harness_glu through ctypes: backward 0 writes out from in, 1 writes din from dout
 * and in (din may be in); act a gt_activation, dt a gt_dtype (0 f32, 1 f16, 2 bf16). */
#include "ops/glu_hd.h"

void gt_harness_glu(int backward, int64_t rows, int64_t inter, void *out, const void *dout, const void *in,
                    int act, int dt) {
    size_t n = (size_t)rows * (size_t)inter;
    for (size_t e = n; e-- > 0;) {
        if (backward)
            gt_glu_backward_element(out, dout, in, e, (size_t)inter, (gt_activation)act, (gt_dtype)dt);
        else
            gt_glu_forward_element(out, in, e, (size_t)inter, (gt_activation)act, (gt_dtype)dt);
    }
}
