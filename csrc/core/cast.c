/* gt_cast: picks a kernel per (dtype pair, SIMD level) and runs it over chunks on OpenMP threads.
 * The scalar kernels here are the reference every wide kernel in cast_x86.c must match. */
#include "core/cast.h"

#include <stdint.h>
#include <string.h>

#include "core/cast_kernels.h"
#include "core/half.h"
#include "core/simd.h"

enum {
    CAST_CHUNK = 1 << 15,          /* elements per parallel work item */
    CAST_PARALLEL_CHUNKS = 8,      /* fewer chunks than this run on the calling thread */
    CAST_STAGING = 512,            /* f32 elements staged per step of an f16 <-> bf16 conversion */
};

static void f32_to_f16_scalar(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++)
        out[i] = gt_f32_to_f16(in[i]);
}

static void f16_to_f32_scalar(const void *src, void *dst, size_t n) {
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    for (size_t i = 0; i < n; i++)
        out[i] = gt_f16_to_f32(in[i]);
}

static void f32_to_bf16_scalar(const void *src, void *dst, size_t n) {
    const float *in = (const float *)src;
    uint16_t *out = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++)
        out[i] = gt_f32_to_bf16(in[i]);
}

static void bf16_to_f32_scalar(const void *src, void *dst, size_t n) {
    const uint16_t *in = (const uint16_t *)src;
    float *out = (float *)dst;
    for (size_t i = 0; i < n; i++)
        out[i] = gt_bf16_to_f32(in[i]);
}

static void copy_2byte(const void *src, void *dst, size_t n) { memcpy(dst, src, n * 2); }

static void copy_4byte(const void *src, void *dst, size_t n) { memcpy(dst, src, n * 4); }

/* Kernels indexed by gt_simd level: scalar, avx2, avx512 (scalar only off x86-64, where the
 * level is always scalar). */
#if GT_SIMD_X86
#define GT_CAST_KERNELS(scalar, name) {scalar, gt_cast_##name##_avx2, gt_cast_##name##_avx512}
#else
#define GT_CAST_KERNELS(scalar, name) {scalar}
#endif
static const gt_cast_kernel to_f16[3] = GT_CAST_KERNELS(f32_to_f16_scalar, f32_to_f16);
static const gt_cast_kernel from_f16[3] = GT_CAST_KERNELS(f16_to_f32_scalar, f16_to_f32);
static const gt_cast_kernel to_bf16[3] = GT_CAST_KERNELS(f32_to_bf16_scalar, f32_to_bf16);
static const gt_cast_kernel from_bf16[3] = GT_CAST_KERNELS(bf16_to_f32_scalar, bf16_to_f32);

/* One conversion: `widen` alone, or `widen` to f32 then `narrow` (f16 <-> bf16). */
typedef struct cast_plan {
    gt_cast_kernel widen;   /* src -> dst, or src -> f32 staging when narrow is set */
    gt_cast_kernel narrow;  /* f32 staging -> dst; NULL for a one-step conversion */
    size_t src_size;        /* bytes per source element */
    size_t dst_size;        /* bytes per destination element */
} cast_plan;

static int is_castable(gt_dtype dtype) { return dtype == GT_F32 || dtype == GT_F16 || dtype == GT_BF16; }

static gt_status make_plan(gt_dtype src, gt_dtype dst, gt_simd level, cast_plan *plan) {
    if (!is_castable(src))
        return GT_FAIL(GT_ERR_TYPE, "src_dtype: cast supports f32, f16 and bf16, got '%s'",
                       gt_dtype_name(src));
    if (!is_castable(dst))
        return GT_FAIL(GT_ERR_TYPE, "dst_dtype: cast supports f32, f16 and bf16, got '%s'",
                       gt_dtype_name(dst));
    plan->src_size = gt_dtype_size(src);
    plan->dst_size = gt_dtype_size(dst);
    plan->narrow = NULL;
    if (src == dst) {
        plan->widen = src == GT_F32 ? copy_4byte : copy_2byte;
    } else if (src == GT_F32) {
        plan->widen = dst == GT_F16 ? to_f16[level] : to_bf16[level];
    } else {
        plan->widen = src == GT_F16 ? from_f16[level] : from_bf16[level];
        if (dst != GT_F32)
            plan->narrow = dst == GT_F16 ? to_f16[level] : to_bf16[level];
    }
    return GT_OK;
}

/* Runs a plan over elements [0, n) of one chunk. */
static void run_plan(const cast_plan *plan, const char *src, char *dst, size_t n) {
    if (!plan->narrow) {
        plan->widen(src, dst, n);
        return;
    }
    float staging[CAST_STAGING];
    for (size_t begin = 0; begin < n; begin += CAST_STAGING) {
        size_t count = n - begin < CAST_STAGING ? n - begin : CAST_STAGING;
        plan->widen(src + begin * plan->src_size, staging, count);
        plan->narrow(staging, dst + begin * plan->dst_size, count);
    }
}

static int ranges_overlap(const char *a, size_t a_bytes, const char *b, size_t b_bytes) {
    return (uintptr_t)a < (uintptr_t)b + b_bytes && (uintptr_t)b < (uintptr_t)a + a_bytes;
}

gt_status gt_cast(const void *src, gt_dtype src_dtype, void *dst, gt_dtype dst_dtype, size_t n) {
    cast_plan plan;
    GT_TRY(make_plan(src_dtype, dst_dtype, gt_simd_level(), &plan));
    if (n == 0)
        return GT_OK;
    if (!src || !dst)
        return GT_FAIL(GT_ERR_VALUE, "%s: NULL buffer for %zu elements", src ? "dst" : "src", n);
    if (n > SIZE_MAX / 4)
        return GT_FAIL(GT_ERR_VALUE, "n: %zu elements overflow the address space", n);
    if (ranges_overlap(src, n * plan.src_size, dst, n * plan.dst_size))
        return GT_FAIL(GT_ERR_VALUE, "dst: overlaps src");
    const char *in = (const char *)src;
    char *out = (char *)dst;
    size_t chunks = (n + CAST_CHUNK - 1) / CAST_CHUNK;
    if (chunks < CAST_PARALLEL_CHUNKS) {  /* outside any OpenMP construct: the staged f16 kernels
                                             (ops/cpu_kernels.h) call this per block, often inside
                                             a parallel loop, and an `if (0)` region still costs
                                             a (nested) team each time */
        for (size_t c = 0; c < chunks; c++)
            run_plan(&plan, in + c * CAST_CHUNK * plan.src_size, out + c * CAST_CHUNK * plan.dst_size,
                     n - c * CAST_CHUNK < CAST_CHUNK ? n - c * CAST_CHUNK : CAST_CHUNK);
        return GT_OK;
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * CAST_CHUNK;
        size_t count = n - begin < CAST_CHUNK ? n - begin : CAST_CHUNK;
        run_plan(&plan, in + begin * plan.src_size, out + begin * plan.dst_size, count);
    }
    return GT_OK;
}
