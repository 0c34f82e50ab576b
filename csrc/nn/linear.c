/* Linear: out = in @ W^T + b, W (out_features, in_features), over the rows of `in`.
 * Backward: dW (+)= dout^T @ in, db (+)= sum of dout rows, din = dout @ W. In half-precision
 * mode the GEMMs read the half copy of W; dW accumulates in f32. A Linear tied to a
 * TokenEmbedding's table uses its first out_features rows; the rows after them (token types) get
 * zeros unless the gradients accumulate (the TokenEmbedding adds to them next). A frozen weight
 * or bias (gt_param.frozen) has no gradient: its GEMM or row sum is skipped. A Linear tied to a
 * table held frozen alone in f16/bf16 (nn/sequence.c) has no weight parameter: its GEMMs read the
 * stored table, in a model of that precision (gt_plan_linear checks it), and it has no dW. */
#include "nn/layer.h"

int gt_linear_reads_half_table(const gt_layer *layer) {
    return layer->tied && layer->tied->kind == GT_LAYER_TOKENS && gt_tokens_table_dtype(layer->tied) != GT_F32;
}

/* W as the GEMMs read it: the half copy in f16/bf16 mode, else the f32 master; a tied half table
 * as it is stored. */
static const void *compute_weight(const gt_layer *layer, const gt_run *run) {
    if (gt_linear_reads_half_table(layer))
        return layer->tied->frozen;
    return run->dt == GT_F32 ? (const void *)layer->weight.data : layer->weight.lowp;
}

gt_status gt_linear_forward(gt_layer *layer, const void *in, gt_run *run) {
    int64_t rows = gt_rows_of(&layer->in_shape);
    gt_gemm_args args = {
        .trans_a = 0, .trans_b = 1, .m = rows, .n = layer->out_features, .k = layer->in_features,
        .alpha = 1.0f, .a = in, .a_dt = run->dt, .lda = layer->in_features,
        .b = compute_weight(layer, run), .b_dt = run->dt, .ldb = layer->in_features,
        .beta = 0.0f, .c = layer->out.ptr, .c_dt = run->dt, .ldc = layer->out_features,
        .batch = 1,
    };
    GT_TRY(run->backend->ops->gemm(run->backend, &args));
    if (!layer->has_bias)
        return GT_OK;
    return run->backend->ops->bias_add(run->backend, layer->out.ptr, layer->bias.data, rows,
                                       layer->out_features, run->dt);
}

/* dW (+)= dout^T @ in (f32); a tied TokenEmbedding's token-type rows after W get zeros unless
 * the gradients accumulate. */
static gt_status linear_dweight(gt_layer *layer, const void *dout, const void *in, int accumulate,
                                gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    gt_gemm_args dweight = {
        .trans_a = 1, .trans_b = 0, .m = layer->out_features, .n = layer->in_features,
        .k = gt_rows_of(&layer->in_shape), .alpha = 1.0f, .a = dout, .a_dt = run->dt,
        .lda = layer->out_features, .b = in, .b_dt = run->dt, .ldb = layer->in_features,
        .beta = accumulate ? 1.0f : 0.0f, .c = layer->weight.grad, .c_dt = GT_F32,
        .ldc = layer->in_features, .batch = 1,
    };
    GT_TRY(ops->gemm(run->backend, &dweight));
    size_t used = (size_t)(layer->out_features * layer->in_features);
    if (!accumulate && layer->weight.numel > used)  /* a tied TokenEmbedding's token-type rows */
        GT_TRY(ops->zero(run->backend, layer->weight.grad + used, (layer->weight.numel - used) * sizeof(float)));
    return GT_OK;
}

gt_status gt_linear_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                             gt_run *run) {
    const gt_ops *ops = run->backend->ops;
    int64_t rows = gt_rows_of(&layer->in_shape);
    int accumulate = gt_layer_accumulates(layer, run);
    if (!layer->weight.frozen && !gt_linear_reads_half_table(layer))
        GT_TRY(linear_dweight(layer, dout, in, accumulate, run));
    if (layer->has_bias && !layer->bias.frozen)
        GT_TRY(ops->bias_backward(run->backend, layer->bias.grad, dout, rows, layer->out_features,
                                  run->dt, accumulate));
    if (!din)
        return GT_OK;
    gt_gemm_args dinput = {
        .trans_a = 0, .trans_b = 0, .m = rows, .n = layer->in_features, .k = layer->out_features,
        .alpha = 1.0f, .a = dout, .a_dt = run->dt, .lda = layer->out_features,
        .b = compute_weight(layer, run), .b_dt = run->dt, .ldb = layer->in_features,
        .beta = 0.0f, .c = din, .c_dt = run->dt, .ldc = layer->in_features, .batch = 1,
    };
    return ops->gemm(run->backend, &dinput);
}
