/* Host harness of the CUDA rotary-embedding kernel (cuda/ops_rope.cu): rope_kernel's grid
 * (one thread per column u of rows * columns, row r = u / columns = b * seq + t) run serially
 * over the GT_HD math of csrc/ops/rope_hd.h, so the arithmetic the GPU runs is checked on any
 * machine. tests/test_rope_cuda_math.py compiles it (C11, -ffp-contract=off like the extension)
 * and calls gt_harness_rope through ctypes.
 *
 * gt_harness_rope(backward, sizes, in, out, strides, positions, positions_stride, inv_freq, dt,
 * attention_factor): sizes = (batch, heads, seq, head_dim, rotary_dim); strides = (batch, head,
 * row) in elements; the rest as gt_rope_args (ops.h) takes them (positions NULL: position t); dt a
 * gt_dtype (0 f32, 1 f16, 2 bf16). The grid is
 * walked last column first, so no result may depend on the order the device runs threads in. */
#include "ops/rope_hd.h"

void gt_harness_rope(int backward, const int64_t sizes[5], const void *in, void *out,
                     const int64_t strides[3], const int64_t *positions, int64_t positions_stride,
                     const float *inv_freq, int dt, float attention_factor) {
    gt_rope_args a = {
        .batch = sizes[0], .heads = sizes[1], .seq = sizes[2], .head_dim = sizes[3],
        .rotary_dim = sizes[4], .in = in, .out = out,
        .strides = {strides[0], strides[1], strides[2]},
        .positions = positions, .positions_stride = positions_stride, .inv_freq = inv_freq,
        .dt = (gt_dtype)dt, .attention_factor = attention_factor,
    };
    size_t rows = (size_t)a.batch * (size_t)a.seq, columns = gt_rope_columns(&a), seq = (size_t)a.seq;
    for (size_t u = rows * columns; u-- > 0;) {
        size_t r = u / columns;
        gt_rope_column(&a, r / seq, r % seq, u % columns, backward);
    }
}
