/* One activation, chosen at run time, applied to one element: the dispatch that a kernel running
 * any gt_activation per element uses (the CUDA elementwise kernels, the gated activation on CPU
 * and CUDA). The math itself is core/activation.h's; the CPU elementwise op keeps its own switch
 * outside its vectorised loops. */
#ifndef GT_OPS_ACTIVATION_HD_H
#define GT_OPS_ACTIVATION_HD_H

#include "core/activation.h"
#include "ops/elem_hd.h"  /* GT_HD_INLINE */
#include "ops/ops.h"

/* act(x) for any gt_activation (x for an unknown one: the ops check act first). */
GT_HD_INLINE float gt_activation_value(gt_activation act, float x) {
    switch (act) {
    case GT_ACT_RELU: return gt_relu(x);
    case GT_ACT_GELU_ERF: return gt_gelu_erf(x);
    case GT_ACT_GELU_TANH: return gt_gelu_tanh(x);
    case GT_ACT_TANH: return gt_tanh_act(x);
    case GT_ACT_SILU: return gt_silu(x);
    }
    return x;
}

/* dout * act'(x). */
GT_HD_INLINE float gt_activation_grad(gt_activation act, float dout, float x) {
    switch (act) {
    case GT_ACT_RELU: return gt_relu_backward(dout, x);
    case GT_ACT_GELU_ERF: return gt_gelu_erf_backward(dout, x);
    case GT_ACT_GELU_TANH: return gt_gelu_tanh_backward(dout, x);
    case GT_ACT_TANH: return gt_tanh_backward(dout, x);
    case GT_ACT_SILU: return gt_silu_backward(dout, x);
    }
    return dout;
}

#endif
