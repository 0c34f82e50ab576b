#include "train/grad_norm.h"

#include <math.h>

#include "core/clip_rules.h"
#include "core/fp_ops.h"
#include "core/simd.h"

#if GT_SIMD_X86
#include <immintrin.h>

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

/* Adds the squares of x[start..n) (start a multiple of 16) into the lanes, then folds them. */
static double finish_chunk(double lanes[GT_SUMSQ_LANES], const float *x, size_t start, size_t n) {
    for (size_t i = start; i < n; i++) {
        double value = (double)x[i];
        lanes[i % GT_SUMSQ_LANES] += value * value;
    }
    for (size_t width = GT_SUMSQ_LANES / 2; width >= 1; width /= 2)
        for (size_t l = 0; l < width; l++)
            lanes[l] += lanes[l + width];
    return lanes[0];
}

static double chunk_scalar(const float *x, size_t n) {
    double lanes[GT_SUMSQ_LANES] = {0};
    return finish_chunk(lanes, x, 0, n);
}

#if GT_SIMD_X86
TARGET_AVX512 static double chunk_avx512(const float *x, size_t n) {
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        low = _mm512_add_pd(low, _mm512_mul_pd(a, a));
        high = _mm512_add_pd(high, _mm512_mul_pd(b, b));
    }
    double lanes[GT_SUMSQ_LANES];
    _mm512_storeu_pd(lanes, low);
    _mm512_storeu_pd(lanes + 8, high);
    return finish_chunk(lanes, x, i, n);
}

TARGET_AVX2 static double chunk_avx2(const float *x, size_t n) {
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int q = 0; q < 4; q++) {
            __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * q));
            acc[q] = _mm256_add_pd(acc[q], _mm256_mul_pd(a, a));
        }
    }
    double lanes[GT_SUMSQ_LANES];
    for (int q = 0; q < 4; q++)
        _mm256_storeu_pd(lanes + 4 * q, acc[q]);
    return finish_chunk(lanes, x, i, n);
}
#endif

static double chunk_sumsq(gt_simd level, const float *x, size_t n) {
#if GT_SIMD_X86
    switch (level) {
    case GT_SIMD_AVX512: return chunk_avx512(x, n);
    case GT_SIMD_AVX2: return chunk_avx2(x, n);
    case GT_SIMD_SCALAR: break;
    }
#else
    (void)level;
#endif
    return chunk_scalar(x, n);
}

double gt_sumsq_chunk(const float *x, size_t n) { return chunk_sumsq(gt_simd_level(), x, n); }

gt_status gt_grad_sumsq(const float *x, size_t n, double *out) {
    *out = 0.0;
    if (n == 0)
        return GT_OK;
    if (!x)
        return GT_FAIL(GT_ERR_VALUE, "grad: NULL pointer for %zu elements", n);
    size_t chunk = gt_sumsq_chunk_len(n);
    size_t num_chunks = (n + chunk - 1) / chunk;
    double totals[GT_SUMSQ_MAX_CHUNKS];
    gt_simd level = gt_simd_level();
#pragma omp parallel for schedule(static) if (num_chunks > 1)
    for (size_t c = 0; c < num_chunks; c++) {
        size_t start = c * chunk;
        size_t len = n - start < chunk ? n - start : chunk;
        totals[c] = chunk_sumsq(level, x + start, len);
    }
    double sum = 0.0;
    for (size_t c = 0; c < num_chunks; c++)
        sum += totals[c];
    *out = sum;
    return GT_OK;
}

gt_status gt_grad_norm_l2(const float *x, size_t n, double *out) {
    double sumsq = 0.0;
    GT_TRY(gt_grad_sumsq(x, n, &sumsq));
    *out = sqrt(sumsq);
    return GT_OK;
}

gt_status gt_grad_absmax(const float *x, size_t n, double *out) {
    *out = 0.0;
    if (n == 0)
        return GT_OK;
    if (!x)
        return GT_FAIL(GT_ERR_VALUE, "grad: NULL pointer for %zu elements", n);
    float largest = 0.0f;
    int any_nan = 0;
#pragma omp parallel for schedule(static) reduction(max : largest) reduction(| : any_nan) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        any_nan |= a != a;
        largest = a > largest ? a : largest;
    }
    *out = any_nan ? NAN : (double)largest;
    return GT_OK;
}

gt_status gt_grad_clip(float *x, size_t n, const double *sumsq, double max_norm) {
    const float coef = gt_clip_rule_coef_sumsq(max_norm, *sumsq);
    if (coef == 1.0f)
        return GT_OK;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        x[i] = gt_mul(x[i], coef);
    return GT_OK;
}
