#include "core/simd.h"

#include <stdatomic.h>

static atomic_int chosen_level = -1;

gt_simd gt_simd_supported(void) {
#if GT_SIMD_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return GT_SIMD_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return GT_SIMD_AVX2;
#endif
    return GT_SIMD_SCALAR;
}

gt_simd gt_simd_level(void) {
    int level = atomic_load_explicit(&chosen_level, memory_order_relaxed);
    if (level < 0) {
        level = (int)gt_simd_supported();
        atomic_store(&chosen_level, level);
    }
    return (gt_simd)level;
}

gt_status gt_set_simd_level(gt_simd level) {
    if ((int)level < GT_SIMD_SCALAR || (int)level > (int)gt_simd_supported())
        return GT_FAIL(GT_ERR_VALUE, "SIMD level '%s' is not supported by this CPU (best: '%s')",
                       gt_simd_name(level), gt_simd_name(gt_simd_supported()));
    atomic_store(&chosen_level, (int)level);
    return GT_OK;
}

int gt_cpu_has_avx512_bf16(void) {
#if GT_SIMD_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

const char *gt_simd_name(gt_simd level) {
    switch (level) {
    case GT_SIMD_SCALAR: return "scalar";
    case GT_SIMD_AVX2: return "avx2";
    case GT_SIMD_AVX512: return "avx512";
    }
    return "unknown";
}
