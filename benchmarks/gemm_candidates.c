/* The measurement behind gputrain's choice of CPU GEMM library (benchmarks/README.md, "CPU GEMM
 * library"). One candidate per build:
 *   -DUSE_DNNL            oneDNN (onednn-cpu-gomp): dnnl_sgemm, and a bf16 matmul primitive
 *   -DUSE_SCIPY_OPENBLAS  OpenBLAS from scipy-openblas32 (DYNAMIC_ARCH; scipy_-prefixed symbols)
 *   -DUSE_OPENBLAS        OpenBLAS from cmeel-openblas (a fixed-target build)
 *   -DUSE_MKL             Intel MKL (mkl + mkl-devel): cblas_sgemm, cblas_gemm_bf16bf16f32
 * For C = A B^T at 256x1024x784 (the MLP's forward GEMM) and C = A B at 2048^3: the largest
 * relative error against a double-precision reference on a grid of elements, then GFLOP/s with
 * 2 threads and with 1 (median and best of 7 runs of >= 0.3 s each). bf16 (oneDNN and MKL:
 * neither OpenBLAS build exports a bf16 GEMM) multiplies bf16 copies of the same matrices into
 * f32. The instruction set is capped by the libraries' own variables (DNNL_MAX_CPU_ISA=AVX2,
 * OPENBLAS_CORETYPE=Haswell, MKL_ENABLE_INSTRUCTIONS=AVX2), so one machine measures two
 * levels. `./gemm_x check` multiplies small shapes and only checks the results (for runs under
 * qemu-x86_64 -cpu ...); it exits with 1 when an error exceeds 1e-5. Build and run commands
 * are in benchmarks/README.md. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(USE_DNNL)
#include <oneapi/dnnl/dnnl.h>
#elif defined(USE_MKL)
#include <mkl.h>
#elif defined(USE_SCIPY_OPENBLAS)
#include <cblas.h>
#define cblas_sgemm scipy_cblas_sgemm
#define openblas_set_num_threads scipy_openblas_set_num_threads
#define openblas_get_config scipy_openblas_get_config
#define openblas_get_corename scipy_openblas_get_corename
#else
#include <cblas.h>
#endif

typedef struct shape {
    int m, n, k;      /* C is (m, n), the inner dimension k */
    int trans_b;      /* 1: B is stored (n, k) and used transposed */
    const char *name; /* for the report */
} shape;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void f32_gemm(const shape *s, const void *a, const void *b, float *c) {
#if defined(USE_DNNL)
    dnnl_sgemm('N', s->trans_b ? 'T' : 'N', s->m, s->n, s->k, 1.0f, a, s->k, b,
               s->trans_b ? s->k : s->n, 0.0f, c, s->n);
#else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s->trans_b ? CblasTrans : CblasNoTrans, s->m, s->n,
                s->k, 1.0f, a, s->k, b, s->trans_b ? s->k : s->n, 0.0f, c, s->n);
#endif
}

#if defined(USE_MKL)
static int make_bf16_matmul(const shape *s) {
    (void)s;
    return 1;
}

static void bf16_gemm(const shape *s, const void *a, const void *b, float *c) {
    cblas_gemm_bf16bf16f32(CblasRowMajor, CblasNoTrans, s->trans_b ? CblasTrans : CblasNoTrans,
                           s->m, s->n, s->k, 1.0f, a, s->k, b, s->trans_b ? s->k : s->n, 0.0f,
                           c, s->n);
}
#endif

#if defined(USE_DNNL)
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static dnnl_primitive_t matmul;    /* bf16 x bf16 -> f32 for the current shape */
static dnnl_memory_t mem_a, mem_b, mem_c;

/* Makes the bf16 matmul of shape s; 0 when this CPU has no bf16 matmul in oneDNN. */
static int make_bf16_matmul(const shape *s) {
    dnnl_memory_desc_t md_a, md_b, md_c;
    dnnl_dims_t dims_a = {s->m, s->k}, dims_b = {s->k, s->n}, dims_c = {s->m, s->n};
    dnnl_dims_t strides_a = {s->k, 1}, strides_c = {s->n, 1};
    dnnl_dims_t strides_b = {s->trans_b ? 1 : s->n, s->trans_b ? s->k : 1};
    dnnl_memory_desc_create_with_strides(&md_a, 2, dims_a, dnnl_bf16, strides_a);
    dnnl_memory_desc_create_with_strides(&md_b, 2, dims_b, dnnl_bf16, strides_b);
    dnnl_memory_desc_create_with_strides(&md_c, 2, dims_c, dnnl_f32, strides_c);
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_primitive_desc_create(&pd, engine, md_a, md_b, NULL, md_c, NULL) != dnnl_success)
        return 0;
    const char *impl;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    printf("  bf16 matmul implementation: %s\n", impl);
    dnnl_primitive_create(&matmul, pd);
    dnnl_memory_create(&mem_a, md_a, engine, DNNL_MEMORY_NONE);
    dnnl_memory_create(&mem_b, md_b, engine, DNNL_MEMORY_NONE);
    dnnl_memory_create(&mem_c, md_c, engine, DNNL_MEMORY_NONE);
    return 1;
}

static void bf16_gemm(const shape *s, const void *a, const void *b, float *c) {
    dnnl_memory_set_data_handle(mem_a, (void *)a);
    dnnl_memory_set_data_handle(mem_b, (void *)b);
    dnnl_memory_set_data_handle(mem_c, c);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mem_a}, {DNNL_ARG_WEIGHTS, mem_b}, {DNNL_ARG_DST, mem_c}};
    dnnl_primitive_execute(matmul, stream, 3, args);
    dnnl_stream_wait(stream);
}
#endif

static void set_threads(int threads) {
#if defined(USE_DNNL)
    omp_set_num_threads(threads);
#elif defined(USE_MKL)
    mkl_set_num_threads(threads);
#else
    openblas_set_num_threads(threads);
#endif
}

typedef void (*gemm_fn)(const shape *s, const void *a, const void *b, float *c);

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median and best GFLOP/s of 7 runs of at least 0.3 s. */
static void measure(gemm_fn fn, const shape *s, const void *a, const void *b, float *c,
                    double *median, double *best) {
    double seconds[7];
    fn(s, a, b, c);
    for (int r = 0; r < 7; r++) {
        double start = now();
        int calls = 0;
        do {
            fn(s, a, b, c);
            calls++;
        } while (now() - start < 0.3);
        seconds[r] = (now() - start) / calls;
    }
    qsort(seconds, 7, sizeof seconds[0], by_value);
    double flops = 2.0 * s->m * s->n * s->k;
    *median = flops / seconds[3] / 1e9;
    *best = flops / seconds[0] / 1e9;
}

/* The largest |c - exact| / sum |a b| over a grid of elements of C. */
static double max_error(const shape *s, const float *a, const float *b, const float *c) {
    double worst = 0.0;
    for (int i = 0; i < s->m; i += s->m / 16 + 1)
        for (int j = 0; j < s->n; j += s->n / 16 + 1) {
            double exact = 0.0, scale = 0.0;
            for (int p = 0; p < s->k; p++) {
                double term = (double)a[(size_t)i * s->k + p] *
                              (s->trans_b ? b[(size_t)j * s->k + p] : b[(size_t)p * s->n + j]);
                exact += term;
                scale += fabs(term);
            }
            double error = fabs(exact - c[(size_t)i * s->n + j]) / (scale + 1e-30);
            worst = error > worst ? error : worst;
        }
    return worst;
}

/* Checks fn on s, then times it unless check_only; returns 1 when the error exceeds 1e-5. */
static int run(const char *kind, gemm_fn fn, const shape *s, const void *a, const void *b,
               const float *a32, const float *b32, float *c, int check_only) {
    fn(s, a, b, c);
    double error = max_error(s, a32, b32, c);
    printf("  %s %s: max error %.1e%s\n", kind, s->name, error, error > 1e-5 ? " WRONG" : "");
    if (check_only)
        return error > 1e-5;
    for (int threads = 2; threads >= 1; threads--) {
        set_threads(threads);
        double median, best;
        measure(fn, s, a, b, c, &median, &best);
        printf("  %s %s, %d thread%s: median %.1f, best %.1f GFLOP/s\n", kind, s->name, threads,
               threads > 1 ? "s" : "", median, best);
    }
    return error > 1e-5;
}

int main(int argc, char **argv) {
    int check_only = argc > 1 && strcmp(argv[1], "check") == 0;
#if defined(USE_DNNL)
    const dnnl_version_t *v = dnnl_version();
    printf("oneDNN %d.%d.%d, ISA mask 0x%x\n", v->major, v->minor, v->patch,
           (unsigned)dnnl_get_effective_cpu_isa());
    dnnl_engine_create(&engine, dnnl_cpu, 0);
    dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
#elif defined(USE_MKL)
    char version[256];
    mkl_get_version_string(version, sizeof version);
    printf("%s\n", version);
#else
    printf("%s (core %s)\n", openblas_get_config(), openblas_get_corename());
#endif
    const shape timed[2] = {{256, 1024, 784, 1, "256x1024x784 A B^T"},
                            {2048, 2048, 2048, 0, "2048^3 A B"}};
    const shape checked[2] = {{67, 130, 99, 1, "67x130x99 A B^T"}, {96, 80, 72, 0, "96x80x72 A B"}};
    const shape *shapes = check_only ? checked : timed;
    int wrong = 0;
    for (int i = 0; i < 2; i++) {
        const shape *s = &shapes[i];
        size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n;
        float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc((size_t)s->m * s->n * 4);
        uint16_t *a16 = malloc(na * 2), *b16 = malloc(nb * 2);
        srand(1);
        /* values exact in bf16, so the f32 and bf16 GEMMs multiply the same numbers */
        for (size_t j = 0; j < na; j++)
            a16[j] = to_bf16((float)rand() / RAND_MAX - 0.5f), a[j] = from_bf16(a16[j]);
        for (size_t j = 0; j < nb; j++)
            b16[j] = to_bf16((float)rand() / RAND_MAX - 0.5f), b[j] = from_bf16(b16[j]);
        wrong |= run("f32 ", f32_gemm, s, a, b, a, b, c, check_only);
#if defined(USE_DNNL) || defined(USE_MKL)
        if (make_bf16_matmul(s)) {
            wrong |= run("bf16", bf16_gemm, s, a16, b16, a, b, c, check_only);
#if defined(USE_DNNL)
            dnnl_primitive_destroy(matmul);
            dnnl_memory_destroy(mem_a), dnnl_memory_destroy(mem_b), dnnl_memory_destroy(mem_c);
#endif
        } else {
            printf("  bf16: oneDNN has no bf16 matmul for this instruction set\n");
        }
#endif
        free(a), free(b), free(c), free(a16), free(b16);
    }
    return wrong;
}
