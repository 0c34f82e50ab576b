/* QLinear: out = in @ dequant(W)^T + b over a frozen weight W (out_features, in_features) stored
 * compactly: quantized as bitsandbytes stores it -- NF4 or FP4 codes, two per byte, the even element
 * in the high nibble, row-major, one f32 absmax per block of `blocksize` elements of the flattened
 * weight; or int8 (LLM.int8's row-wise format: one int8 code per element, one f32 absmax per row,
 * "SCB", dequantized as bitsandbytes' CPU/XPU training path does, code * f32(absmax * f32(1/127)))
 * -- or in half precision alone ("bf16" | "f16": a frozen base with no f32 master, as PEFT's base
 * in a bf16 model; "dequantizing" is a cast, and in its own compute dtype the GEMMs read the stored
 * weight itself, with no tile).
 * Spec: ("qlinear", in_features, out_features, bias, quant_type "nf4" | "fp4" | "int8" | "bf16" |
 * "f16", blocksize (4-bit: 2..4096, even; int8 and half: 0, no blocks), tile_rows, double_quant
 * (4-bit only: the absmax held double-quantized, as bitsandbytes' compress_statistics keeps it: 8-bit
 * codes of absmax - offset, blockwise in blocks of 256 with the signed dynamic map, an f32 absmax per
 * such block and the f32 offset; each tile's absmax is dequantized into the workspace first, as
 * bitsandbytes computes it: dequantize_blockwise, then + offset in f32)).
 *
 * The weight never exists dequantized as a whole: forward dequantizes blocks of tile_rows rows of
 * W into a tile (the compute dtype: f32, f16 or bf16, each element code[k] * absmax rounded once,
 * ops.h dequantize_blockwise) at the start of the workspace and runs the backend's GEMM on it,
 * out[:, r0:r0+t] = in @ tile^T, tile by tile. Backward computes din only (W is frozen: no weight
 * gradient ever): din = dout @ W as one GEMM when one tile holds W (the same GEMM a Linear holding
 * dequant(W) runs), else the sum over tiles of dout[:, r0:r0+t] @ tile accumulated in f32 (in the
 * workspace after the tile in half precision, then cast once). The bias (if any) is an ordinary
 * trainable f32 parameter. The codes and absmax are frozen buffers (nn/kind.h) in the buffer arena,
 * named 'weight' ((ceil(out * in / 2), 1) uint8, bitsandbytes' packed shape) and 'weight.absmax'
 * (double_quant: its uint8 codes, then 'weight.nested_absmax' and 'weight.offset'); a half weight is
 * one, 'weight' ((out, in) bf16 or f16). */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "nn/kind.h"
#include "ops/dynamic_map.h"

enum { GT_QLINEAR_NF4 = 0, GT_QLINEAR_FP4 = 1, GT_QLINEAR_INT8 = 2, GT_QLINEAR_BF16 = 3, GT_QLINEAR_F16 = 4 };
enum { GT_QLINEAR_TILE_ELEMENTS = 1 << 23 };  /* tile_rows 0: about this many elements per tile (16 MiB in bf16) */
enum { GT_QLINEAR_NESTED_BLOCK = 256 };  /* absmax values per block of a double-quantized absmax (bitsandbytes') */

/* QLinear's own hyper-parameters (in gt_layer.config). */
typedef struct qlinear_config {
    int quant_type;     /* GT_QLINEAR_NF4, GT_QLINEAR_FP4, GT_QLINEAR_INT8, GT_QLINEAR_BF16 or GT_QLINEAR_F16 */
    int64_t blocksize;  /* 4-bit: elements per absmax block (of the flattened weight), even; int8, half: 0 */
    int64_t tile_rows;  /* rows of W dequantized per GEMM; 0: automatic */
    int double_quant;   /* 4-bit: 1 when the absmax is held double-quantized (8-bit codes, nested absmax, offset) */
} qlinear_config;
_Static_assert(sizeof(qlinear_config) <= GT_LAYER_CONFIG_BYTES, "QLinear's config fits gt_layer.config");

/* bitsandbytes 0.50's decoding tables as f32 bit patterns (python/gputrain/quant/codes.py: NF4,
 * and FP4 with code 8 decoded as -0.0 as its kernels do). */
static const uint32_t nf4_bits[16] = {
    0xbf800000, 0xbf3239b1, 0xbf066b30, 0xbeca32a0, 0xbe91a24d, 0xbe3d353f, 0xbdba7871, 0x00000000,
    0x3da2faff, 0x3e24cae3, 0x3e7c04dd, 0x3ead033a, 0x3ee1a4b8, 0x3f1007ab, 0x3f3913b3, 0x3f800000};
static const uint32_t fp4_bits[16] = {
    0x00000000, 0x3baaaaab, 0x3f2aaaab, 0x3f800000, 0x3eaaaaab, 0x3f000000, 0x3e2aaaab, 0x3e800000,
    0x80000000, 0xbbaaaaab, 0xbf2aaaab, 0xbf800000, 0xbeaaaaab, 0xbf000000, 0xbe2aaaab, 0xbe800000};

/* int8: the row's absmax times f32(1 / 127), as bitsandbytes' MatMul8bitFp scales its codes. */
#define GT_QLINEAR_INT8_SCALE (1.0f / 127.0f)

static qlinear_config config_of(const gt_layer *layer) {
    qlinear_config c;
    memcpy(&c, layer->config, sizeof c);
    return c;
}

static int is_int8(const gt_layer *layer) { return config_of(layer).quant_type == GT_QLINEAR_INT8; }

static int is_double_quant(const gt_layer *layer) { return config_of(layer).double_quant; }

/* bitsandbytes' signed dynamic map, the code of a double-quantized absmax (f32 bit patterns). */
static const uint32_t dynamic_signed_bits[256] = {GT_DYNMAP_SIGNED_CODE};

gt_dtype gt_qlinear_stored_dtype(const gt_layer *layer) {
    int type = config_of(layer).quant_type;
    return type == GT_QLINEAR_BF16 ? GT_BF16 : (type == GT_QLINEAR_F16 ? GT_F16 : GT_U8);
}

static int is_half(const gt_layer *layer) { return gt_qlinear_stored_dtype(layer) != GT_U8; }

/* 1 when the GEMMs read the stored weight itself: a half weight in the compute dtype `dt`. */
static int reads_stored(const gt_layer *layer, gt_dtype dt) { return gt_qlinear_stored_dtype(layer) == dt; }

/* Elements per absmax block of the flattened weight: a row for int8; 1 for a half weight (no
 * blocks: a tile may start at any row). */
static int64_t block_of(const gt_layer *layer) {
    if (is_half(layer))
        return 1;
    return is_int8(layer) ? layer->in_features : config_of(layer).blocksize;
}

/* In the enum's order: describe_qlinear indexes it by quant_type. */
static const gt_enum_name quant_type_names[] = {
    {"nf4", GT_QLINEAR_NF4}, {"fp4", GT_QLINEAR_FP4}, {"int8", GT_QLINEAR_INT8}, {"bf16", GT_QLINEAR_BF16},
    {"f16", GT_QLINEAR_F16}, {NULL, 0}};
static const gt_layer_arg qlinear_args[] = {
    GT_ARG_SIZE_AT("in_features", GT_ARG_FIELD(in_features)),
    GT_ARG_SIZE_AT("out_features", GT_ARG_FIELD(out_features)), GT_ARG_FLAG_AT("bias", GT_ARG_FIELD(has_bias)),
    {"quant_type", GT_ARG_ENUM, GT_ARG_CONFIG(qlinear_config, quant_type), 0, 0, 0, quant_type_names},
    {"blocksize", GT_ARG_INT, GT_ARG_CONFIG(qlinear_config, blocksize), 0, 4096, 0, NULL},
    {"tile_rows", GT_ARG_INT, GT_ARG_CONFIG(qlinear_config, tile_rows), 0, INT_MAX, 0, NULL},
    GT_ARG_FLAG_AT("double_quant", GT_ARG_CONFIG(qlinear_config, double_quant))};
/* tile_rows is rounded up to whole blocks (tile_rows above). */

static void describe_qlinear(const gt_layer *layer, char *buf, size_t bytes) {
    snprintf(buf, bytes, "QLinear(%lld, %lld, %s)", (long long)layer->in_features, (long long)layer->out_features,
             quant_type_names[config_of(layer).quant_type].name);
}

/* GEMM dimensions fit a BLAS int. (Blocks run over the flattened weight, as bitsandbytes' do: a
 * block may span two rows; tiles start on a block boundary.) */
static gt_status check_qlinear(gt_layer *layer) {
    char name[128];
    describe_qlinear(layer, name, sizeof name);
    if (layer->in_features > INT_MAX || layer->out_features > INT_MAX)
        return GT_FAIL(GT_ERR_VALUE, "%s: in_features and out_features must be at most %d (a GEMM dimension)",
                       name, INT_MAX);
    long long blocksize = (long long)config_of(layer).blocksize;
    if ((is_int8(layer) || is_half(layer)) && blocksize != 0)
        return GT_FAIL(GT_ERR_VALUE, "%s: blocksize must be 0 for %s, got %lld", name,
                       is_int8(layer) ? "int8 (one absmax per row)" : "a half weight (no blocks)", blocksize);
    if (!is_int8(layer) && !is_half(layer) && (blocksize < 2 || blocksize % 2))
        return GT_FAIL(GT_ERR_VALUE, "%s: blocksize must be even and at least 2 (two 4-bit codes a byte), got %lld",
                       name, blocksize);
    if (is_double_quant(layer) && (is_int8(layer) || is_half(layer)))
        return GT_FAIL(GT_ERR_VALUE, "%s: double_quant is for a 4-bit weight's absmax (int8 and half weights have "
                       "none to compress)", name);
    return GT_OK;
}

/* bias (out,) = 0 (a new QLinear's weight is 0 too, until codes are written); the weight is no
 * parameter. */
static gt_status qlinear_params(gt_layer *layer) {
    if (layer->has_bias)
        gt_layer_param(&layer->bias, 1, &layer->out_features, GT_INIT_CONSTANT, 0.0f);
    return GT_OK;
}

/* Bytes of the stored weight: two codes per byte in 4 bits, one per byte in int8, two bytes an
 * element in half precision. */
static size_t code_bytes(const gt_layer *layer) {
    size_t n = (size_t)layer->out_features * (size_t)layer->in_features;
    if (is_half(layer))
        return n * 2;
    return is_int8(layer) ? n : (n + 1) / 2;
}

/* Absmax values of the weight: one per block of the flattened weight (int8: per row). */
static size_t absmax_count(const gt_layer *layer) {
    size_t n = (size_t)layer->out_features * (size_t)layer->in_features, bs = (size_t)block_of(layer);
    return (n + bs - 1) / bs;
}

/* f32 absmax values of a double-quantized absmax: one per 256 of its values. */
static size_t nested_count(const gt_layer *layer) {
    return (absmax_count(layer) + GT_QLINEAR_NESTED_BLOCK - 1) / GT_QLINEAR_NESTED_BLOCK;
}

/* 'weight': (ceil(n / 2), 1) uint8 codes (int8: (out, in) int8; half: (out, in) bf16 or f16);
 * 'weight.absmax': (ceil(n / blocksize),) f32 (int8: (out,); half: none; double_quant: uint8 codes,
 * then 'weight.nested_absmax' (ceil(blocks / 256),) f32 and 'weight.offset' (1,) f32); n = out * in. */
static size_t qlinear_frozen(const gt_layer *layer, gt_frozen_piece *pieces) {
    size_t blocks = absmax_count(layer), bytes = code_bytes(layer);
    if (is_half(layer)) {
        pieces[0] = (gt_frozen_piece){0, bytes, gt_qlinear_stored_dtype(layer), 2,
                                      {layer->out_features, layer->in_features}};
        return 1;
    }
    pieces[0] = is_int8(layer) ? (gt_frozen_piece){0, bytes, GT_I8, 2, {layer->out_features, layer->in_features}}
                               : (gt_frozen_piece){0, bytes, GT_U8, 2, {(int64_t)bytes, 1}};
    size_t at = gt_align_up(bytes);
    if (!is_double_quant(layer)) {
        pieces[1] = (gt_frozen_piece){at, blocks * sizeof(float), GT_F32, 1, {(int64_t)blocks, 0}};
        return 2;
    }
    size_t nested = nested_count(layer);
    pieces[1] = (gt_frozen_piece){at, blocks, GT_U8, 1, {(int64_t)blocks, 0}};
    at += gt_align_up(blocks);
    pieces[2] = (gt_frozen_piece){at, nested * sizeof(float), GT_F32, 1, {(int64_t)nested, 0}};
    at += gt_align_up(nested * sizeof(float));
    pieces[3] = (gt_frozen_piece){at, sizeof(float), GT_F32, 1, {1, 0}};
    return 4;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* Elements a tile starts at a multiple of: a block (double_quant: 256 blocks, a block of the absmax). */
static int64_t tile_unit(const gt_layer *layer) {
    return is_double_quant(layer) ? block_of(layer) * GT_QLINEAR_NESTED_BLOCK : block_of(layer);
}

/* Rows of W per tile: a multiple of tile_unit / gcd(in, tile_unit), so that every tile starts on a
 * block boundary (and on a byte: blocksize is even; double_quant: on a block of the absmax), or all
 * the rows (always, when the GEMMs read the stored weight in `dt`). */
static int64_t tile_rows(const gt_layer *layer, gt_dtype dt) {
    if (reads_stored(layer, dt))
        return layer->out_features;
    qlinear_config c = config_of(layer);
    int64_t align = tile_unit(layer) / gcd64(layer->in_features, tile_unit(layer));
    int64_t rows = c.tile_rows ? c.tile_rows : GT_QLINEAR_TILE_ELEMENTS / layer->in_features;
    rows = (rows + align - 1) / align * align;
    rows = rows < align ? align : rows;
    return rows < layer->out_features ? rows : layer->out_features;
}

/* Bytes of the dequantized tile's weights in `dt` (aligned; sizes checked by scratch_bytes first). */
static size_t tile_weight_bytes(const gt_layer *layer, gt_dtype dt) {
    return gt_align_up((size_t)tile_rows(layer, dt) * (size_t)layer->in_features * gt_dtype_size(dt));
}

/* Absmax blocks a tile spans at most. */
static size_t tile_blocks(const gt_layer *layer, gt_dtype dt) {
    size_t elements = (size_t)tile_rows(layer, dt) * (size_t)layer->in_features, block = (size_t)block_of(layer);
    return (elements + block - 1) / block;
}

/* Workspace bytes before the GEMM's own: the tile (int8: then its rows' f32 scales; double_quant:
 * its blocks' f32 absmax; none when the GEMMs read the stored weight), then (several tiles, half
 * precision) the f32 accumulator of din (rows, in). */
static gt_status scratch_bytes(const gt_layer *layer, int64_t rows, gt_dtype dt, size_t *tile, size_t *acc) {
    const char *what = "the dequantized tile of a QLinear";
    *tile = *acc = 0;
    if (reads_stored(layer, dt))
        return GT_OK;
    GT_TRY(gt_size_mul((size_t)tile_rows(layer, dt) * (size_t)layer->in_features, gt_dtype_size(dt), what, tile));
    GT_TRY(gt_size_align(*tile, what, tile));
    if (is_int8(layer) || is_double_quant(layer))  /* (a row is a block of an int8 weight) */
        GT_TRY(gt_size_add(*tile, gt_align_up(tile_blocks(layer, dt) * sizeof(float)), what, tile));
    if (tile_rows(layer, dt) < layer->out_features && dt != GT_F32) {
        GT_TRY(gt_size_mul((size_t)rows * (size_t)layer->in_features, sizeof(float), what, acc));
        GT_TRY(gt_size_align(*acc, what, acc));
    }
    return GT_OK;
}

/* The forward GEMM of rows r0..r0+t of W (tile at `tile`). */
static gt_gemm_args forward_gemm(const gt_layer *layer, int64_t rows, const void *in, const void *tile, int64_t r0,
                                 int64_t t, gt_dtype dt) {
    return (gt_gemm_args){
        .trans_a = 0, .trans_b = 1, .m = rows, .n = t, .k = layer->in_features, .alpha = 1.0f, .a = in,
        .a_dt = dt, .lda = layer->in_features, .b = tile, .b_dt = dt, .ldb = layer->in_features, .beta = 0.0f,
        .c = layer->out.ptr ? (char *)layer->out.ptr + (size_t)r0 * gt_dtype_size(dt) : NULL, .c_dt = dt,
        .ldc = layer->out_features, .batch = 1};
}

/* The backward GEMM of rows r0..r0+t of W: c (+)= dout[:, r0:r0+t] @ tile, c in c_dt. */
static gt_gemm_args backward_gemm(const gt_layer *layer, int64_t rows, const void *dout, const void *tile, void *c,
                                  gt_dtype c_dt, int64_t r0, int64_t t, gt_dtype dt) {
    return (gt_gemm_args){
        .trans_a = 0, .trans_b = 0, .m = rows, .n = layer->in_features, .k = t, .alpha = 1.0f,
        .a = dout ? (const char *)dout + (size_t)r0 * gt_dtype_size(dt) : NULL, .a_dt = dt,
        .lda = layer->out_features, .b = tile, .b_dt = dt, .ldb = layer->in_features, .beta = r0 ? 1.0f : 0.0f,
        .c = c, .c_dt = c_dt, .ldc = layer->in_features, .batch = 1};
}

/* Raises *need to what a GEMM of `args` needs (beta 0 and 1 alike). */
static gt_status note_gemm(const gt_plan_walk *w, gt_gemm_args args, size_t *need) {
    for (int accumulate = 0; accumulate <= 1; accumulate++) {
        args.beta = accumulate ? 1.0f : 0.0f;
        size_t bytes = w->ops->gemm_workspace_bytes(&args);
        GT_TRY(gt_size_check(bytes, "workspace of a QLinear's GEMM"));
        *need = bytes > *need ? bytes : *need;
    }
    return GT_OK;
}

void gt_quant4_code_table(int nf4, float table[16]) { memcpy(table, nf4 ? nf4_bits : fp4_bits, 16 * sizeof(float)); }

/* The decoding table of the layer's codes into `table`; returns its entries (int8: code b is the
 * signed byte's value; double_quant: the 16 of the 4-bit code, then the 256 of its absmax's). */
static size_t code_table(const gt_layer *layer, float table[16 + 256]) {
    if (is_int8(layer)) {
        for (int b = 0; b < 256; b++)
            table[b] = (float)(int8_t)(uint8_t)b;
        return 256;
    }
    gt_quant4_code_table(config_of(layer).quant_type == GT_QLINEAR_NF4, table);
    if (!is_double_quant(layer))
        return 16;
    memcpy(table + 16, dynamic_signed_bits, sizeof dynamic_signed_bits);
    return 16 + 256;
}

/* (..., in) -> (..., out); the decoding table placed once; the workspace holds the tile, the
 * accumulator and the GEMMs' own scratch after them. */
static gt_status plan_qlinear(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site) {
    GT_TRY(gt_plan_check_features(w, in, layer->in_features, layer, site->path));
    layer->out.shape[in->ndim - 1] = layer->out_features;
    int64_t rows = gt_rows_of(in);
    if (rows > INT_MAX) {
        char name[GT_LAYER_PATH_BYTES + 64];
        return GT_FAIL(GT_ERR_VALUE, "%s: %lld rows per micro-batch are more than the GEMMs of %s can take (%d)",
                       w->input_name, (long long)rows, gt_layer_describe(name, sizeof name, layer, site->path),
                       INT_MAX);
    }
    if (!is_half(layer)) {
        float table[16 + 256];
        size_t entries = code_table(layer, table);
        void *placed = NULL;
        GT_TRY(gt_plan_constant(w, table, entries * sizeof(float), "the code table of a QLinear", &placed));
        layer->quant_code = placed;
    }
    size_t tile = 0, acc = 0, gemm = 0, need = 0;
    GT_TRY(scratch_bytes(layer, rows, w->dt, &tile, &acc));
    int64_t t = tile_rows(layer, w->dt);
    GT_TRY(note_gemm(w, forward_gemm(layer, rows, NULL, NULL, 0, t, w->dt), &gemm));
    gt_dtype c_dt = t < layer->out_features ? GT_F32 : w->dt;
    GT_TRY(note_gemm(w, backward_gemm(layer, rows, NULL, NULL, NULL, c_dt, 0, t, w->dt), &gemm));
    GT_TRY(gt_size_add(tile + acc, gemm, "the workspace of a QLinear", &need));
    if (need > w->workspace_bytes)
        w->workspace_bytes = need;
    return GT_OK;
}

/* The GEMM of `args` with the backend's workspace starting `skip` bytes further on (the tile and
 * accumulator before it stay untouched). */
static gt_status gemm_after(gt_backend *be, size_t skip, const gt_gemm_args *args) {
    void *workspace = be->workspace;
    size_t bytes = be->workspace_bytes;
    be->workspace = (char *)workspace + skip;
    be->workspace_bytes = bytes - skip;
    gt_status status = be->ops->gemm(be, args);
    be->workspace = workspace;
    be->workspace_bytes = bytes;
    return status;
}

/* The f32 absmax of blocks b0..b0+count of a double-quantized weight, into the workspace after the
 * tile (*absmax points there): bitsandbytes' dequantize_blockwise(absmax codes, nested state), then
 * + offset in f32. b0 is a multiple of 256 (tiles start on a block of the absmax). */
static gt_status dequantize_absmax(gt_layer *layer, size_t b0, size_t count, gt_run *run, const float **absmax) {
    gt_backend *be = run->backend;
    const uint8_t *codes = (const uint8_t *)layer->frozen + gt_align_up(code_bytes(layer));
    const float *nested = (const float *)((const char *)codes + gt_align_up(absmax_count(layer)));
    const float *offset = (const float *)((const char *)nested + gt_align_up(nested_count(layer) * sizeof(float)));
    float *out = (float *)((char *)be->workspace + tile_weight_bytes(layer, run->dt));
    GT_TRY(be->ops->dequantize_blockwise(be, out, codes + b0, nested + b0 / GT_QLINEAR_NESTED_BLOCK,
                                         layer->quant_code + 16, (int64_t)count, GT_QLINEAR_NESTED_BLOCK, 8, GT_F32));
    GT_TRY(be->ops->bias_add(be, out, offset, (int64_t)count, 1, GT_F32));
    *absmax = out;
    return GT_OK;
}

/* Rows r0..r0+t of W in the compute dtype, for the GEMMs: the stored weight's own rows when they
 * read it (*rows_at points into it), else dequantized (cast) into the tile at the workspace's start
 * (int8: each row's scale, absmax * f32(1/127) in f32, after the tile first). */
static gt_status dequantize_rows(gt_layer *layer, int64_t r0, int64_t t, gt_run *run, const void **rows_at) {
    gt_backend *be = run->backend;
    size_t first = (size_t)r0 * (size_t)layer->in_features, block = (size_t)block_of(layer);
    int64_t n = t * layer->in_features;
    *rows_at = be->workspace;
    if (reads_stored(layer, run->dt)) {
        *rows_at = layer->frozen + first * 2;
        return GT_OK;
    }
    if (is_half(layer))
        return be->ops->cast(be, be->workspace, run->dt, layer->frozen + first * 2, gt_qlinear_stored_dtype(layer), n);
    const float *absmax = (const float *)(layer->frozen + gt_align_up(code_bytes(layer))) + first / block;
    if (is_double_quant(layer))
        GT_TRY(dequantize_absmax(layer, first / block, ((size_t)n + block - 1) / block, run, &absmax));
    if (!is_int8(layer))
        return be->ops->dequantize_blockwise(be, be->workspace, (const uint8_t *)layer->frozen + first / 2, absmax,
                                             layer->quant_code, n, (int64_t)block, 4, run->dt);
    float *scales = (float *)((char *)be->workspace + tile_weight_bytes(layer, run->dt));
    GT_TRY(be->ops->scale(be, scales, absmax, t, GT_QLINEAR_INT8_SCALE, GT_F32));
    return be->ops->dequantize_blockwise(be, be->workspace, (const uint8_t *)layer->frozen + first, scales,
                                         layer->quant_code, n, (int64_t)block, 8, run->dt);
}

static gt_status qlinear_forward(gt_layer *layer, const void *in, gt_run *run) {
    size_t tile = 0, acc = 0;
    GT_TRY(scratch_bytes(layer, gt_rows_of(&layer->in_shape), run->dt, &tile, &acc));
    int64_t step = tile_rows(layer, run->dt);
    for (int64_t r0 = 0; r0 < layer->out_features; r0 += step) {
        int64_t t = layer->out_features - r0 < step ? layer->out_features - r0 : step;
        const void *weight_rows = NULL;
        GT_TRY(dequantize_rows(layer, r0, t, run, &weight_rows));
        gt_gemm_args args = forward_gemm(layer, gt_rows_of(&layer->in_shape), in, weight_rows, r0, t, run->dt);
        GT_TRY(gemm_after(run->backend, tile + acc, &args));
    }
    if (!layer->has_bias)
        return GT_OK;
    return run->backend->ops->bias_add(run->backend, layer->out.ptr, layer->bias.data, gt_rows_of(&layer->in_shape),
                                       layer->out_features, run->dt);
}

static gt_status qlinear_backward(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run) {
    (void)in;
    const gt_ops *ops = run->backend->ops;
    int64_t rows = gt_rows_of(&layer->in_shape);
    if (layer->has_bias && !layer->bias.frozen)
        GT_TRY(ops->bias_backward(run->backend, layer->bias.grad, dout, rows, layer->out_features, run->dt,
                                  gt_layer_accumulates(layer, run)));
    if (!din)
        return GT_OK;
    size_t tile = 0, acc = 0;
    GT_TRY(scratch_bytes(layer, rows, run->dt, &tile, &acc));
    int64_t step = tile_rows(layer, run->dt);
    int tiled = step < layer->out_features;
    void *c = tiled && run->dt != GT_F32 ? (char *)run->backend->workspace + tile : din;
    gt_dtype c_dt = tiled ? GT_F32 : run->dt;
    for (int64_t r0 = 0; r0 < layer->out_features; r0 += step) {
        int64_t t = layer->out_features - r0 < step ? layer->out_features - r0 : step;
        const void *weight_rows = NULL;
        GT_TRY(dequantize_rows(layer, r0, t, run, &weight_rows));
        gt_gemm_args args = backward_gemm(layer, rows, dout, weight_rows, c, c_dt, r0, t, run->dt);
        GT_TRY(gemm_after(run->backend, tile + acc, &args));
    }
    if (c == din)
        return GT_OK;
    return ops->cast(run->backend, din, run->dt, c, GT_F32, rows * layer->in_features);
}

const gt_layer_type gt_layer_type_qlinear = {
    "qlinear", "QLinear", GT_LAYER_ARGS(qlinear_args), GT_KIND_PARAMS | GT_KIND_FREEZES, check_qlinear,
    describe_qlinear, qlinear_params, plan_qlinear, qlinear_forward, qlinear_backward, qlinear_frozen};
