/* Attention: the parameter-free core of MultiheadAttention. Its input is the fused projection
 * (B, T, 3E) laid out as (B, T, 3, H, D) (q | k | v along the last dim, each E = H * D wide, head
 * h at columns h * D of each), its output (B, T, E) as (B, T, H, D): the op reads and writes those
 * strided layouts directly, so no transpose is ever copied. The dropout key of the probabilities
 * is (seed, dropout_id, step, micro-batch * B * H * T * T), as a Dropout layer's. Keys at or
 * after a sequence's length (run->key_lengths, from the model's attention mask) are masked. */
#include "nn/layer.h"

#include <math.h>

gt_attention_args gt_attention_layer_args(const gt_layer *layer, const gt_tensor *in) {
    int64_t embed = layer->in_features, heads = layer->num_heads, seq = in->shape[1];
    gt_attention_args a = {
        .batch = in->shape[0], .heads = heads, .seq = seq, .head_dim = embed / heads,
        .in = {seq * 3 * embed, embed / heads, 3 * embed},
        .out_strides = {seq * embed, embed / heads, embed},
        .scale = 1.0f / sqrtf((float)(embed / heads)), .causal = layer->causal, .dt = in->dtype,
    };
    return a;
}

/* The arguments of one forward or backward call: pointers, and dropout in training only. */
static gt_attention_args run_args(const gt_layer *layer, const void *in, const gt_run *run) {
    gt_attention_args a = gt_attention_layer_args(layer, &layer->in_shape);
    int64_t embed = layer->in_features;
    a.dt = run->dt;
    a.q = in;
    a.k = (const char *)in + (size_t)embed * gt_dtype_size(run->dt);
    a.v = (const char *)in + (size_t)(2 * embed) * gt_dtype_size(run->dt);
    a.out = layer->out.ptr;
    a.lse = layer->lse;
    a.key_lengths = run->key_lengths;
    if (run->training && layer->p > 0.0) {
        uint64_t per_micro = (uint64_t)(a.batch * a.heads) * (uint64_t)a.seq * (uint64_t)a.seq;
        a.dropout_p = layer->p;
        a.dropout_key = (gt_dropout_key){run->seed, layer->dropout_id, run->step,
                                         run->micro_offset * per_micro};
    }
    return a;
}

gt_status gt_attention_layer_forward(gt_layer *layer, const void *in, gt_run *run) {
    gt_attention_args a = run_args(layer, in, run);
    return run->backend->ops->attention_forward(run->backend, &a);
}

gt_status gt_attention_layer_backward(gt_layer *layer, void *din, const void *dout, const void *in,
                                      gt_run *run) {
    if (!din)
        return GT_OK;
    gt_attention_args a = run_args(layer, in, run);
    int64_t embed = layer->in_features;
    a.dout = dout;
    a.dq = din;
    a.dk = (char *)din + (size_t)embed * gt_dtype_size(run->dt);
    a.dv = (char *)din + (size_t)(2 * embed) * gt_dtype_size(run->dt);
    return run->backend->ops->attention_backward(run->backend, &a);
}
