/* Run on aarch64 under qemu by .ci/aarch64.sh: gputrain's conversions and an f32 GEMM through
 * the C core as built for aarch64 (portable kernels, scipy-openblas32), results written to the
 * file argv[1] for .ci/aarch64_check.py to compare with the x86-64 build. */
#include <stdint.h>
#include <stdio.h>

#include "core/cast.h"
#include "ops/cpu_gemm_split.h"

enum {
    N = 1 << 16,  /* values per conversion */
    M = 67,       /* rows of the GEMM's C */
    NC = 130,     /* columns of C */
    K = 99,       /* inner dimension */
};

static uint32_t f32[N];                   /* inputs: every kind of f32 bit pattern */
static uint16_t halves[N];                /* inputs: bf16 / f16 bit patterns */
static uint16_t bf16[N], f16[N];          /* f32 rounded */
static float from_bf16[N], from_f16[N];   /* halves widened */
static float a[M * K], b[NC * K], c[M * NC];  /* C = A B^T */

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {  /* the LCG of .ci/aarch64_check.py */
        x = x * 1664525u + 1013904223u;
        f32[i] = x;
        halves[i] = (uint16_t)(x >> 7);
    }
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < NC * K; i++)
        b[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
    gt_blas_init();
    gt_blas_gemm g = {0, 1, M, NC, K, 1.0f, 0.0f, a, K, b, K, GT_F32, c, NC, GT_F32};
    if (gt_cast(f32, GT_F32, bf16, GT_BF16, N) != GT_OK ||
        gt_cast(f32, GT_F32, f16, GT_F16, N) != GT_OK ||
        gt_cast(halves, GT_BF16, from_bf16, GT_F32, N) != GT_OK ||
        gt_cast(halves, GT_F16, from_f16, GT_F32, N) != GT_OK ||
        gt_cpu_gemm_split(&g, NULL) != GT_OK) {
        fprintf(stderr, "aarch64 smoke: %s\n", gt_error_message());
        return 1;
    }
    FILE *out = fopen(argv[1], "wb");
    if (!out)
        return 1;
    fwrite(bf16, 2, N, out), fwrite(f16, 2, N, out);
    fwrite(from_bf16, 4, N, out), fwrite(from_f16, 4, N, out), fwrite(c, 4, M * NC, out);
    printf("aarch64 smoke: GEMMs by %s, kernel %s\n", gt_blas_name(), gt_blas_kernel());
    return fclose(out) != 0;
}
