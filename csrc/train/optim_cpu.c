#include "train/optim_cpu.h"

#include <omp.h>

#include "core/ema_math.h"
#include "core/simd.h"

#if GT_SIMD_X86
#include <immintrin.h>

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

/* ---------------------------------------------------------------- scalar ---------- */

static void adamw_scalar(gt_numerics numerics, const gt_adamw_scalars *s, float *p, const float *g,
                         float *m, float *v, float *v_max, size_t n) {
    float unused = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float *vm = s->amsgrad ? &v_max[i] : &unused;
        if (numerics == GT_NUMERICS_EXACT)
            gt_adamw_exact(&p[i], g[i], &m[i], &v[i], vm, s);
        else
            gt_adamw_fast(&p[i], g[i], &m[i], &v[i], vm, s);
    }
}

static void sgd_scalar(const gt_sgd_scalars *s, float *p, const float *g, float *buf, size_t n) {
    float unused = 0.0f;
    for (size_t i = 0; i < n; i++)
        gt_sgd_update(&p[i], g[i], s->use_momentum ? &buf[i] : &unused, s);
}

static void ema_scalar(float *ema, const float *p, float weight, size_t n) {
    for (size_t i = 0; i < n; i++)
        gt_ema_update(&ema[i], p[i], weight);
}

#if GT_SIMD_X86
/* ---------------------------------------------------------------- AVX-512 --------- */

/* gt_recip_newton on 16 lanes: same guess, same FMA steps, same division fallback. */
TARGET_AVX512 static inline __m512 recip_avx512(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512i guess = _mm512_sub_epi32(_mm512_set1_epi32((int)GT_RECIP_MAGIC), _mm512_castps_si512(x));
    __m512 y = _mm512_castsi512_ps(guess);
    for (int k = 0; k < 3; k++) {
        __m512 e = _mm512_fnmadd_ps(x, y, one);
        y = _mm512_fmadd_ps(y, e, y);
    }
    __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(0x1p-125f), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(x, _mm512_set1_ps(0x1p125f), _CMP_LE_OQ);
    if (in_range != 0xFFFF)
        y = _mm512_mask_div_ps(y, (__mmask16)~in_range, one, x);
    return y;
}

/* gt_max_nan on 16 lanes: vmaxps returns the second operand on ties, NaN lanes are patched. */
TARGET_AVX512 static inline __m512 max_nan_avx512(__m512 a, __m512 b) {
    __mmask16 nan = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    return _mm512_mask_add_ps(_mm512_max_ps(a, b), nan, a, b);
}

TARGET_AVX512 static void adamw_avx512(gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                                       const float *g, float *m, float *v, float *v_max, size_t n) {
    const int small = fabsf(s->beta1_weight) < 0.5f;
    const __m512 coef = _mm512_set1_ps(s->grad_coef), sign = _mm512_set1_ps(s->maximize ? -0.0f : 0.0f);
    const __m512 decay = _mm512_set1_ps(s->decay), b2 = _mm512_set1_ps(s->beta2);
    const __m512 lerp_w = _mm512_set1_ps(small ? s->beta1_weight : s->beta1_weight - 1.0f);
    const __m512 omb2 = _mm512_set1_ps(s->one_minus_beta2), eps = _mm512_set1_ps(s->eps);
    const __m512 bc2 = _mm512_set1_ps(s->bc2_sqrt), inv_bc2 = _mm512_set1_ps(s->inv_bc2_sqrt);
    const __m512 nss = _mm512_set1_ps(s->neg_step_size);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_xor_ps(_mm512_mul_ps(_mm512_loadu_ps(g + i), coef), sign);
        __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
        __m512 mi = _mm512_loadu_ps(m + i);
        mi = _mm512_fmadd_ps(lerp_w, _mm512_sub_ps(gi, mi), small ? mi : gi);
        __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(omb2, gi), gi, _mm512_mul_ps(_mm512_loadu_ps(v + i), b2));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        if (s->amsgrad) {
            vi = max_nan_avx512(_mm512_loadu_ps(v_max + i), vi);
            _mm512_storeu_ps(v_max + i, vi);
        }
        __m512 step = _mm512_mul_ps(nss, mi);
        if (numerics == GT_NUMERICS_EXACT) {
            __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
            pi = _mm512_add_ps(pi, _mm512_div_ps(step, denom));
        } else {
            __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), inv_bc2, eps);
            pi = _mm512_fmadd_ps(step, recip_avx512(denom), pi);
        }
        _mm512_storeu_ps(p + i, pi);
    }
    adamw_scalar(numerics, s, p + i, g + i, m + i, v + i, s->amsgrad ? v_max + i : v_max, n - i);
}

TARGET_AVX512 static void sgd_avx512(const gt_sgd_scalars *s, float *p, const float *g, float *buf,
                                     size_t n) {
    const __m512 coef = _mm512_set1_ps(s->grad_coef), sign = _mm512_set1_ps(s->maximize ? -0.0f : 0.0f);
    const __m512 wd = _mm512_set1_ps(s->weight_decay), mom = _mm512_set1_ps(s->momentum);
    const __m512 damp_w = _mm512_set1_ps(s->dampening_weight), neg_lr = _mm512_set1_ps(s->neg_lr);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 pi = _mm512_loadu_ps(p + i);
        __m512 gi = _mm512_xor_ps(_mm512_mul_ps(_mm512_loadu_ps(g + i), coef), sign);
        if (s->use_weight_decay)
            gi = _mm512_fmadd_ps(pi, wd, gi);
        if (s->use_momentum) {
            __m512 b = s->first_step ? gi
                                     : _mm512_fmadd_ps(gi, damp_w, _mm512_mul_ps(_mm512_loadu_ps(buf + i), mom));
            _mm512_storeu_ps(buf + i, b);
            gi = s->nesterov ? _mm512_fmadd_ps(b, mom, gi) : b;
        }
        _mm512_storeu_ps(p + i, _mm512_fmadd_ps(gi, neg_lr, pi));
    }
    sgd_scalar(s, p + i, g + i, s->use_momentum ? buf + i : buf, n - i);
}

TARGET_AVX512 static void ema_avx512(float *ema, const float *p, float weight, size_t n) {
    const int small = fabsf(weight) < 0.5f;
    const __m512 w = _mm512_set1_ps(small ? weight : weight - 1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = _mm512_loadu_ps(ema + i), pi = _mm512_loadu_ps(p + i);
        _mm512_storeu_ps(ema + i, _mm512_fmadd_ps(w, _mm512_sub_ps(pi, e), small ? e : pi));
    }
    ema_scalar(ema + i, p + i, weight, n - i);
}

/* ---------------------------------------------------------------- AVX2 ------------ */

TARGET_AVX2 static inline __m256 recip_avx2(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256i guess = _mm256_sub_epi32(_mm256_set1_epi32((int)GT_RECIP_MAGIC), _mm256_castps_si256(x));
    __m256 y = _mm256_castsi256_ps(guess);
    for (int k = 0; k < 3; k++) {
        __m256 e = _mm256_fnmadd_ps(x, y, one);
        y = _mm256_fmadd_ps(y, e, y);
    }
    __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(0x1p-125f), _CMP_GE_OQ),
                                    _mm256_cmp_ps(x, _mm256_set1_ps(0x1p125f), _CMP_LE_OQ));
    if (_mm256_movemask_ps(in_range) != 0xFF)
        y = _mm256_blendv_ps(_mm256_div_ps(one, x), y, in_range);
    return y;
}

TARGET_AVX2 static inline __m256 max_nan_avx2(__m256 a, __m256 b) {
    __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_add_ps(a, b), nan);
}

TARGET_AVX2 static void adamw_avx2(gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                                   const float *g, float *m, float *v, float *v_max, size_t n) {
    const int small = fabsf(s->beta1_weight) < 0.5f;
    const __m256 coef = _mm256_set1_ps(s->grad_coef), sign = _mm256_set1_ps(s->maximize ? -0.0f : 0.0f);
    const __m256 decay = _mm256_set1_ps(s->decay), b2 = _mm256_set1_ps(s->beta2);
    const __m256 lerp_w = _mm256_set1_ps(small ? s->beta1_weight : s->beta1_weight - 1.0f);
    const __m256 omb2 = _mm256_set1_ps(s->one_minus_beta2), eps = _mm256_set1_ps(s->eps);
    const __m256 bc2 = _mm256_set1_ps(s->bc2_sqrt), inv_bc2 = _mm256_set1_ps(s->inv_bc2_sqrt);
    const __m256 nss = _mm256_set1_ps(s->neg_step_size);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_xor_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), coef), sign);
        __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
        __m256 mi = _mm256_loadu_ps(m + i);
        mi = _mm256_fmadd_ps(lerp_w, _mm256_sub_ps(gi, mi), small ? mi : gi);
        __m256 vi = _mm256_fmadd_ps(_mm256_mul_ps(omb2, gi), gi, _mm256_mul_ps(_mm256_loadu_ps(v + i), b2));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        if (s->amsgrad) {
            vi = max_nan_avx2(_mm256_loadu_ps(v_max + i), vi);
            _mm256_storeu_ps(v_max + i, vi);
        }
        __m256 step = _mm256_mul_ps(nss, mi);
        if (numerics == GT_NUMERICS_EXACT) {
            __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
            pi = _mm256_add_ps(pi, _mm256_div_ps(step, denom));
        } else {
            __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), inv_bc2, eps);
            pi = _mm256_fmadd_ps(step, recip_avx2(denom), pi);
        }
        _mm256_storeu_ps(p + i, pi);
    }
    adamw_scalar(numerics, s, p + i, g + i, m + i, v + i, s->amsgrad ? v_max + i : v_max, n - i);
}

TARGET_AVX2 static void sgd_avx2(const gt_sgd_scalars *s, float *p, const float *g, float *buf,
                                 size_t n) {
    const __m256 coef = _mm256_set1_ps(s->grad_coef), sign = _mm256_set1_ps(s->maximize ? -0.0f : 0.0f);
    const __m256 wd = _mm256_set1_ps(s->weight_decay), mom = _mm256_set1_ps(s->momentum);
    const __m256 damp_w = _mm256_set1_ps(s->dampening_weight), neg_lr = _mm256_set1_ps(s->neg_lr);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 pi = _mm256_loadu_ps(p + i);
        __m256 gi = _mm256_xor_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), coef), sign);
        if (s->use_weight_decay)
            gi = _mm256_fmadd_ps(pi, wd, gi);
        if (s->use_momentum) {
            __m256 b = s->first_step ? gi
                                     : _mm256_fmadd_ps(gi, damp_w, _mm256_mul_ps(_mm256_loadu_ps(buf + i), mom));
            _mm256_storeu_ps(buf + i, b);
            gi = s->nesterov ? _mm256_fmadd_ps(b, mom, gi) : b;
        }
        _mm256_storeu_ps(p + i, _mm256_fmadd_ps(gi, neg_lr, pi));
    }
    sgd_scalar(s, p + i, g + i, s->use_momentum ? buf + i : buf, n - i);
}

TARGET_AVX2 static void ema_avx2(float *ema, const float *p, float weight, size_t n) {
    const int small = fabsf(weight) < 0.5f;
    const __m256 w = _mm256_set1_ps(small ? weight : weight - 1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = _mm256_loadu_ps(ema + i), pi = _mm256_loadu_ps(p + i);
        _mm256_storeu_ps(ema + i, _mm256_fmadd_ps(w, _mm256_sub_ps(pi, e), small ? e : pi));
    }
    ema_scalar(ema + i, p + i, weight, n - i);
}

#endif

/* ---------------------------------------------------------------- triad ----------- */

static void triad_scalar(float *a, const float *b, const float *c, float s, size_t n) {
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
}

#if GT_SIMD_X86
TARGET_AVX512 static void triad_avx512(float *a, const float *b, const float *c, float s, size_t n) {
    const __m512 scalar = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_loadu_ps(b + i), _mm512_mul_ps(scalar, _mm512_loadu_ps(c + i))));
    triad_scalar(a + i, b + i, c + i, s, n - i);
}

TARGET_AVX2 static void triad_avx2(float *a, const float *b, const float *c, float s, size_t n) {
    const __m256 scalar = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(scalar, _mm256_loadu_ps(c + i))));
    triad_scalar(a + i, b + i, c + i, s, n - i);
}
#endif

typedef void (*triad_fn)(float *a, const float *b, const float *c, float s, size_t n);

static triad_fn pick_triad(void) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512: return triad_avx512;
    case GT_SIMD_AVX2: return triad_avx2;
    case GT_SIMD_SCALAR: break;
    }
#endif
    return triad_scalar;
}

void gt_triad_cpu(float *a, const float *b, const float *c, float s, size_t n) {
    triad_fn triad = pick_triad();
#pragma omp parallel
    {
        size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        lo -= lo % 16;
        hi = t + 1 == threads ? n : hi - hi % 16;
        triad(a + lo, b + lo, c + lo, s, hi - lo);
    }
}

/* ---------------------------------------------------------------- dispatch -------- */

void gt_adamw_cpu(gt_numerics numerics, const gt_adamw_scalars *s, float *p, const float *g,
                  float *m, float *v, float *v_max, size_t n) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512: adamw_avx512(numerics, s, p, g, m, v, v_max, n); return;
    case GT_SIMD_AVX2: adamw_avx2(numerics, s, p, g, m, v, v_max, n); return;
    case GT_SIMD_SCALAR: break;
    }
#endif
    adamw_scalar(numerics, s, p, g, m, v, v_max, n);
}

void gt_sgd_cpu(const gt_sgd_scalars *s, float *p, const float *g, float *buf, size_t n) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512: sgd_avx512(s, p, g, buf, n); return;
    case GT_SIMD_AVX2: sgd_avx2(s, p, g, buf, n); return;
    case GT_SIMD_SCALAR: break;
    }
#endif
    sgd_scalar(s, p, g, buf, n);
}

void gt_ema_cpu(float *ema, const float *p, float weight, size_t n) {
#if GT_SIMD_X86
    switch (gt_simd_level()) {
    case GT_SIMD_AVX512: ema_avx512(ema, p, weight, n); return;
    case GT_SIMD_AVX2: ema_avx2(ema, p, weight, n); return;
    case GT_SIMD_SCALAR: break;
    }
#endif
    ema_scalar(ema, p, weight, n);
}
