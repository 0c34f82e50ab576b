/* The measurement behind gputrain's choice of CPU GEMM library (benchmarks/README.md,
 * "CPU GEMM library"): fp32 (and bf16 where offered) GEMM GFLOP/s of OpenBLAS (cmeel-openblas)
 * and oneDNN (the onednn wheel; cmeel-openblas exports no bf16 GEMM, and oneDNN's bf16 matmul
 * needs a CPU engine this wheel cannot create here) at 256x1024x784 and 2048^3, best of 7 runs of >= 0.3 s.
 * Build and run commands are in benchmarks/README.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef USE_OPENBLAS
#include <cblas.h>
#endif
#ifdef USE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

typedef void (*gemm_fn)(int m, int n, int k, void *a, void *b, void *c);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double gflops(gemm_fn fn, int m, int n, int k, void *a, void *b, void *c) {
    fn(m, n, k, a, b, c);
    double best = 1e30;
    for (int r = 0; r < 7; r++) {
        double start = now();
        int calls = 0;
        do {
            fn(m, n, k, a, b, c);
            calls++;
        } while (now() - start < 0.3);
        double seconds = (now() - start) / calls;
        best = seconds < best ? seconds : best;
    }
    return 2.0 * m * n * k / best / 1e9;
}

#ifdef USE_OPENBLAS
static void openblas_sgemm(int m, int n, int k, void *a, void *b, void *c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}
#endif

#ifdef USE_DNNL
static void onednn_sgemm(int m, int n, int k, void *a, void *b, void *c) {
    dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}
#endif

int main(void) {
    const int shapes[2][3] = {{256, 1024, 784}, {2048, 2048, 2048}};
    for (int s = 0; s < 2; s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n);
        float *c = malloc(sizeof(float) * (size_t)m * n);
        for (size_t i = 0; i < (size_t)m * k; i++)
            a[i] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t i = 0; i < (size_t)k * n; i++)
            b[i] = (float)rand() / RAND_MAX - 0.5f;
#ifdef USE_OPENBLAS
        printf("openblas %dx%dx%d sgemm %.1f GFLOP/s\n", m, n, k, gflops(openblas_sgemm, m, n, k, a, b, c));
#endif
#ifdef USE_DNNL
        printf("onednn   %dx%dx%d sgemm %.1f GFLOP/s\n", m, n, k, gflops(onednn_sgemm, m, n, k, a, b, c));
#endif
        free(a), free(b), free(c);
    }
    return 0;
}
