/* Host side of the rotary position embedding (ops/rope.h): the shared argument check, the rotary
 * dimension and Hugging Face's inverse-frequency table in float32. The build rounds every f32
 * operation once (-ffp-contract=off), as PyTorch's elementwise CPU kernels do. */
#include "ops/rope.h"

#include <math.h>

#include "ops/checks.h"

/* 1 when an element offset of a rope operand with these strides could overflow int64. */
static int rope_strides_overflow(const gt_rope_args *a) {
    int64_t last = 0, term = 0;
    int64_t extents[3] = {a->batch - 1, a->heads - 1, a->seq - 1};
    int64_t steps[3] = {a->strides.batch, a->strides.head, a->strides.row};
    for (int i = 0; i < 3; i++) {
        if (steps[i] < 0 || __builtin_mul_overflow(extents[i], steps[i], &term) ||
            __builtin_add_overflow(last, term, &last))
            return 1;
    }
    return __builtin_add_overflow(last, a->head_dim, &last);
}

gt_status gt_rope_check(const gt_rope_args *a) {
    GT_TRY(gt_op_check_size(a->batch, "batch"));
    GT_TRY(gt_op_check_size(a->heads, "heads"));
    GT_TRY(gt_op_check_size(a->seq, "seq"));
    GT_TRY(gt_op_check_size(a->head_dim, "head_dim"));
    GT_TRY(gt_op_check_dtype(a->dt, "dt"));
    if (a->rotary_dim < 2 || a->rotary_dim % 2 != 0 || a->rotary_dim > a->head_dim)
        return GT_FAIL(GT_ERR_VALUE, "rotary_dim: must be even and in [2, head_dim = %lld], got %lld",
                       (long long)a->head_dim, (long long)a->rotary_dim);
    if (!(a->attention_factor > 0.0f) || !isfinite(a->attention_factor))
        return GT_FAIL(GT_ERR_VALUE, "attention_factor: must be finite and > 0, got %g",
                       (double)a->attention_factor);
    if (a->positions_stride < 0)
        return GT_FAIL(GT_ERR_VALUE, "positions_stride: must be >= 0, got %lld",
                       (long long)a->positions_stride);
    if (a->batch == 0 || a->heads == 0 || a->seq == 0)
        return GT_OK;
    if (rope_strides_overflow(a))
        return GT_FAIL(GT_ERR_VALUE, "strides: negative, or beyond 64-bit element offsets");
    GT_TRY(gt_op_check_ptr(a->in, "in"));
    GT_TRY(gt_op_check_ptr(a->out, "out"));
    return gt_op_check_ptr(a->inv_freq, "inv_freq");
}

gt_status gt_rope_rotary_dim(int64_t head_dim, double partial_rotary_factor, int64_t *out) {
    if (head_dim < 2)
        return GT_FAIL(GT_ERR_VALUE, "head_dim: must be >= 2, got %lld", (long long)head_dim);
    if (!(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0))
        return GT_FAIL(GT_ERR_VALUE, "partial_rotary_factor: must be in (0, 1], got %g",
                       partial_rotary_factor);
    int64_t dim = (int64_t)((double)head_dim * partial_rotary_factor);  /* Python's int(): truncation */
    if (dim < 2 || dim % 2 != 0)
        return GT_FAIL(GT_ERR_VALUE, "partial_rotary_factor: head_dim %lld * %g gives rotary dim %lld, "
                       "which must be even and >= 2", (long long)head_dim, partial_rotary_factor,
                       (long long)dim);
    *out = dim;
    return GT_OK;
}

/* A finite value > 0 of field `name`. */
static gt_status check_positive(double value, const char *name) {
    if (!(value > 0.0) || !isfinite(value))
        return GT_FAIL(GT_ERR_VALUE, "%s: must be finite and > 0, got %g", name, value);
    return GT_OK;
}

static gt_status check_freq(int64_t rotary_dim, const gt_rope_freq *f) {
    if (rotary_dim < 2 || rotary_dim % 2 != 0)
        return GT_FAIL(GT_ERR_VALUE, "rotary_dim: must be even and >= 2, got %lld", (long long)rotary_dim);
    GT_TRY(check_positive(f->theta, "rope_theta"));
    if (f->type == GT_ROPE_DEFAULT)
        return GT_OK;
    if (f->type != GT_ROPE_LLAMA3 && f->type != GT_ROPE_LINEAR && f->type != GT_ROPE_YARN)
        return GT_FAIL(GT_ERR_VALUE, "rope_type: unknown rope type %d", (int)f->type);
    GT_TRY(check_positive(f->factor, "factor"));
    if (f->type == GT_ROPE_LINEAR)
        return GT_OK;
    GT_TRY(check_positive(f->original_max_position_embeddings, "original_max_position_embeddings"));
    if (f->type == GT_ROPE_YARN) {
        GT_TRY(check_positive(f->beta_fast, "beta_fast"));
        return check_positive(f->beta_slow, "beta_slow");
    }
    GT_TRY(check_positive(f->low_freq_factor, "low_freq_factor"));
    if (!(f->high_freq_factor > f->low_freq_factor) || !isfinite(f->high_freq_factor))
        return GT_FAIL(GT_ERR_VALUE, "high_freq_factor: must be finite and > low_freq_factor (%g), got %g",
                       f->low_freq_factor, f->high_freq_factor);
    return GT_OK;
}

/* base ** (arange(0, dim, 2).float() / dim) at i: the f32 power of the f32 exponent. */
static float theta_power(size_t i, int64_t rotary_dim, double theta) {
    float exponent = (float)(2 * i) / (float)rotary_dim;
    return (float)pow((double)(float)theta, (double)exponent);
}

/* _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2).float() / dim)). */
static float default_inv_freq(size_t i, int64_t rotary_dim, double theta) {
    return 1.0f / theta_power(i, rotary_dim, theta);
}

/* find_correction_dim of _compute_yarn_parameters, in double as its Python math. */
static double yarn_correction_dim(double rotations, int64_t dim, const gt_rope_freq *f) {
    const double pi = 3.14159265358979323846;
    return ((double)dim * log(f->original_max_position_embeddings / (rotations * 2 * pi))) / (2 * log(f->theta));
}

/* _compute_yarn_parameters at i: the ramp (find_correction_range, linear_ramp_factor) between
 * inv_freq_interpolation = 1 / (factor * pos_freqs) and inv_freq_extrapolation = 1 / pos_freqs,
 * each torch operation rounded to f32 (Python scalars cast to f32; the range in double). */
static float yarn_inv_freq(size_t i, int64_t rotary_dim, const gt_rope_freq *f) {
    double low = yarn_correction_dim(f->beta_fast, rotary_dim, f);
    double high = yarn_correction_dim(f->beta_slow, rotary_dim, f);
    if (f->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0.0 ? low : 0.0;  /* max(low, 0), min(high, dim - 1) */
    high = high < (double)(rotary_dim - 1) ? high : (double)(rotary_dim - 1);
    if (low == high)
        high += 0.001;  /* "prevent singularity" */
    float ramp = ((float)i - (float)low) / (float)(high - low);
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;  /* torch.clamp(ramp, 0, 1) */
    float keep = 1.0f - ramp;  /* inv_freq_extrapolation_factor */
    float power = theta_power(i, rotary_dim, f->theta);
    float extrapolation = 1.0f / power, interpolation = 1.0f / ((float)f->factor * power);
    return interpolation * (1.0f - keep) + extrapolation * keep;
}

/* _compute_llama3_parameters on one default inv_freq, in its torch code's f32 operations
 * (x / tensor is tensor.reciprocal() * x; comparisons against Python floats are in f32). */
static float llama3_inv_freq(float inv_freq, const gt_rope_freq *f) {
    const float factor = (float)f->factor, low = (float)f->low_freq_factor;
    const float old_context = (float)f->original_max_position_embeddings;
    const float low_wavelen = (float)(f->original_max_position_embeddings / f->low_freq_factor);
    const float high_wavelen = (float)(f->original_max_position_embeddings / f->high_freq_factor);
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    float wavelen = (1.0f / inv_freq) * two_pi;
    float inv_llama = wavelen > low_wavelen ? inv_freq / factor : inv_freq;
    float smooth = ((1.0f / wavelen) * old_context - low) / (float)(f->high_freq_factor - f->low_freq_factor);
    float smoothed = ((1.0f - smooth) * inv_llama) / factor + smooth * inv_llama;
    int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    return medium ? smoothed : inv_llama;
}

gt_status gt_rope_inv_freq(float *out, int64_t rotary_dim, const gt_rope_freq *f) {
    GT_TRY(check_freq(rotary_dim, f));
    GT_TRY(gt_op_check_ptr(out, "out"));
    for (size_t i = 0; i < (size_t)rotary_dim / 2; i++) {
        float inv = default_inv_freq(i, rotary_dim, f->theta);
        if (f->type == GT_ROPE_LLAMA3)
            inv = llama3_inv_freq(inv, f);
        else if (f->type == GT_ROPE_LINEAR)
            inv = inv / (float)f->factor;  /* inv_freq /= factor */
        else if (f->type == GT_ROPE_YARN)
            inv = yarn_inv_freq(i, rotary_dim, f);
        out[i] = inv;
    }
    return GT_OK;
}
