/* The dynamic loss scaler on the CPU (train/scaler.h): argument checks, the state update
 * (rules shared with CUDA in core/scaler_rules.h), and the fused unscale + inf check: one
 * pass that multiplies each gradient by inv_scale and ORs together "exponent bits all set"
 * (NaN/±Inf), in AVX-512, AVX2 or scalar code, over contiguous per-thread blocks. */
#include "train/scaler.h"

#include <math.h>

#include "core/simd.h"

#if GT_SIMD_X86
#include <immintrin.h>

#define GT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define GT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

enum {
    SCALER_BLOCK = 1 << 14,         /* elements per OpenMP work item (64 KiB of fp32) */
    SCALER_PARALLEL_MIN = 1 << 16,  /* below this many elements one thread does the pass */
};

static gt_status check_factors(double growth_factor, double backoff_factor, int64_t growth_interval,
                               double min_scale) {
    if (!(growth_factor > 1.0) || !isfinite(growth_factor))
        return GT_FAIL(GT_ERR_VALUE, "growth_factor must be a finite number > 1.0, got %g", growth_factor);
    if (!(backoff_factor > 0.0 && backoff_factor < 1.0))
        return GT_FAIL(GT_ERR_VALUE, "backoff_factor must be in (0, 1), got %g", backoff_factor);
    if (growth_interval < 1 || growth_interval > INT32_MAX)
        return GT_FAIL(GT_ERR_VALUE, "growth_interval must be in 1..%d, got %lld", INT32_MAX,
                       (long long)growth_interval);
    if (!(min_scale >= 0.0) || !isfinite((float)min_scale))
        return GT_FAIL(GT_ERR_VALUE, "min_scale must be a finite number >= 0 (0 = no floor), got %g",
                       min_scale);
    return GT_OK;
}

gt_status gt_scaler_init(gt_scaler *out, double init_scale, double growth_factor,
                         double backoff_factor, int64_t growth_interval, double min_scale,
                         int enabled) {
    if (!out)
        return GT_FAIL(GT_ERR_VALUE, "out: NULL scaler");
    float scale = (float)init_scale;
    if (!(scale > 0.0f) || gt_f32_is_nonfinite(scale))
        return GT_FAIL(GT_ERR_VALUE, "init_scale must be finite and > 0 in float32, got %g", init_scale);
    GT_TRY(check_factors(growth_factor, backoff_factor, growth_interval, min_scale));
    gt_scaler s = {
        .scale = scale,
        .growth_tracker = 0,
        .growth_factor = growth_factor,
        .backoff_factor = backoff_factor,
        .growth_interval = (int32_t)growth_interval,
        .min_scale = (float)min_scale,
        .enabled = enabled != 0,
    };
    *out = s;
    return GT_OK;
}

gt_status gt_scaler_validate(const gt_scaler *s) {
    if (!s)
        return GT_FAIL(GT_ERR_VALUE, "scaler: NULL");
    if (!(s->scale >= 0.0f) || gt_f32_is_nonfinite(s->scale))
        return GT_FAIL(GT_ERR_VALUE, "scale must be finite and >= 0, got %g", (double)s->scale);
    return check_factors(s->growth_factor, s->backoff_factor, s->growth_interval, s->min_scale);
}

void gt_scaler_update(gt_scaler *s, int found_inf) {
    if (s && s->enabled)
        gt_scaler_rule_update(s, found_inf);
}

gt_status gt_scaler_set_scale(gt_scaler *s, double new_scale, int found_inf) {
    if (!s)
        return GT_FAIL(GT_ERR_VALUE, "scaler: NULL");
    float scale = (float)new_scale;
    if (!(scale > 0.0f) || gt_f32_is_nonfinite(scale))  /* 0 would unscale by inf: NaN weights */
        return GT_FAIL(GT_ERR_VALUE, "new_scale must be finite and > 0 in float32, got %g", new_scale);
    if (!s->enabled)
        return GT_OK;
    s->scale = scale;
    gt_scaler_rule_count(s, found_inf);
    return GT_OK;
}

float gt_scaler_inv_scale(const gt_scaler *s) {
    return s && s->enabled ? gt_scaler_rule_inv_scale(s->scale) : 1.0f;
}

/* ---- the fused pass: returns 1 when g[0..n) held NaN/±Inf; multiplies when `multiply` ---- */

static int unscale_scalar(float *g, size_t n, float inv, int multiply) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        bad |= gt_f32_is_nonfinite(x);
        if (multiply)
            g[i] = x * inv;
    }
    return bad;
}

#if GT_SIMD_X86
GT_TARGET_AVX2 static int unscale_avx2(float *g, size_t n, float inv, int multiply) {
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i bad = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256i bits = _mm256_and_si256(_mm256_castps_si256(x), exponent);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(bits, exponent));
        if (multiply)
            _mm256_storeu_ps(g + i, _mm256_mul_ps(x, vinv));
    }
    int found = _mm256_testz_si256(bad, bad) == 0;
    return found | unscale_scalar(g + i, n - i, inv, multiply);
}

GT_TARGET_AVX512 static int unscale_avx512(float *g, size_t n, float inv, int multiply) {
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    const __m512 vinv = _mm512_set1_ps(inv);
    __mmask16 bad = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512i bits = _mm512_and_si512(_mm512_castps_si512(x), exponent);
        bad |= _mm512_cmpeq_epi32_mask(bits, exponent);
        if (multiply)
            _mm512_storeu_ps(g + i, _mm512_mul_ps(x, vinv));
    }
    if (i < n) {  /* masked tail: lanes past the end load as 0.0f, which is finite */
        __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(tail, g + i);
        __m512i bits = _mm512_and_si512(_mm512_castps_si512(x), exponent);
        bad |= _mm512_cmpeq_epi32_mask(bits, exponent);
        if (multiply)
            _mm512_mask_storeu_ps(g + i, tail, _mm512_mul_ps(x, vinv));
    }
    return bad != 0;
}
#endif

typedef int (*unscale_fn)(float *g, size_t n, float inv, int multiply);

static unscale_fn pick_unscale(void) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512: return unscale_avx512;
    case GT_SIMD_AVX2: return unscale_avx2;
    case GT_SIMD_SCALAR: break;
    }
#endif
    return unscale_scalar;
}

gt_status gt_scaler_unscale_check(const gt_scaler *s, float *grad, size_t n, int *found_inf) {
    if (!s)
        return GT_FAIL(GT_ERR_VALUE, "scaler: NULL");
    if (!found_inf)
        return GT_FAIL(GT_ERR_VALUE, "found_inf: NULL");
    if (n > 0 && !grad)
        return GT_FAIL(GT_ERR_VALUE, "grad: NULL with n = %zu", n);
    if (!s->enabled || n == 0)
        return GT_OK;
    const float inv = gt_scaler_inv_scale(s);
    const int multiply = inv != 1.0f;
    const unscale_fn pass = pick_unscale();
    const size_t blocks = (n + SCALER_BLOCK - 1) / SCALER_BLOCK;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= SCALER_PARALLEL_MIN)
    for (size_t b = 0; b < blocks; b++) {
        size_t start = b * SCALER_BLOCK;
        size_t count = n - start < SCALER_BLOCK ? n - start : SCALER_BLOCK;
        bad |= pass(grad + start, count, inv, multiply);
    }
    if (bad)
        *found_inf = 1;
    return GT_OK;
}

/* ---- the read-bandwidth baseline: the same blocks and loads, summed, nothing stored ---- */

static double read_scalar(const float *x, size_t n) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    return sum;
}

#if GT_SIMD_X86
GT_TARGET_AVX2 static double read_avx2(const float *x, size_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_add_ps(acc0, _mm256_loadu_ps(x + i));
        acc1 = _mm256_add_ps(acc1, _mm256_loadu_ps(x + i + 8));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(acc0, acc1));
    double sum = read_scalar(x + i, n - i);
    for (int k = 0; k < 8; k++)
        sum += lanes[k];
    return sum;
}

GT_TARGET_AVX512 static double read_avx512(const float *x, size_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_add_ps(acc0, _mm512_loadu_ps(x + i));
        acc1 = _mm512_add_ps(acc1, _mm512_loadu_ps(x + i + 16));
    }
    return (double)_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + read_scalar(x + i, n - i);
}
#endif

typedef double (*read_fn)(const float *x, size_t n);

static read_fn pick_read(void) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512: return read_avx512;
    case GT_SIMD_AVX2: return read_avx2;
    case GT_SIMD_SCALAR: break;
    }
#endif
    return read_scalar;
}

double gt_scaler_read_baseline(const float *x, size_t n) {
    const read_fn pass = pick_read();
    const size_t blocks = (n + SCALER_BLOCK - 1) / SCALER_BLOCK;
    double sum = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : sum) if (n >= SCALER_PARALLEL_MIN)
    for (size_t b = 0; b < blocks; b++) {
        size_t start = b * SCALER_BLOCK;
        size_t count = n - start < SCALER_BLOCK ? n - start : SCALER_BLOCK;
        sum += pass(x + start, count);
    }
    return sum;
}
