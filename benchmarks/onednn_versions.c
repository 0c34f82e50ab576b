/* oneDNN 2026.1 (PyPI `onednn`, SYCL/TBB runtime) against 2023.2 (`onednn-cpu-gomp`, gputrain's
 * bundled copy) on the GEMMs of the GPT, Llama and BERT steps (benchmarks/README.md, "CPU GEMM
 * library: oneDNN 2026.1 against 2023.2"). Built once against the 2023.2 headers and linked to
 * the soname libdnnl.so.3; which copy runs is chosen by LD_LIBRARY_PATH and printed from
 * /proc/self/maps, so both libraries run this same binary. The calls are gputrain's
 * (csrc/ops/cpu_blas_onednn.c, cpu_gemm.c):
 *   f32   dnnl_sgemm, row-major C = A op(B)
 *   bf16  a matmul primitive, bf16 A and B, f32 accumulation, bf16 C (made once per shape)
 *   f16   A and B widened to f32, dnnl_sgemm, C rounded to f16 (gputrain's f16 path, and its
 *         bf16 path where the CPU lacks AVX512_BF16)
 * One process measures one library at one thread count for every shape and dtype asked for;
 * onednn_versions.py runs the processes in interleaved rounds and takes medians.
 * Usage: onednn_versions DTYPES PASSES   (DTYPES: subset of "f32,bf16,f16"; PASSES: "fwd" or
 * "fwd,bwd"). Output: one line "RESULT shape pass dtype gflops" per measurement. */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

typedef struct shape {
    const char *name;  /* model/layer */
    int m, n, k;       /* forward C (m, n) = A (m, k) W^T, W stored (n, k) like a Linear */
    int bwd;           /* 1: also time the two backward GEMMs */
} shape;

static const shape shapes[] = {
    {"gpt2.qkv", 2048, 2304, 768, 1},
    {"gpt2.attn_proj", 2048, 768, 768, 1},
    {"gpt2.fc", 2048, 3072, 768, 1},
    {"gpt2.fc_proj", 2048, 768, 3072, 1},
    {"gpt2.lm_head/6", 2048, 8377, 768, 1},   /* 1/6 of the 50257 columns */
    {"llama.q/o", 1024, 2048, 2048, 0},
    {"llama.kv", 1024, 1024, 2048, 0},         /* k and v, 512 each */
    {"llama.gate/up", 1024, 8192, 2048, 0},
    {"llama.down", 1024, 2048, 8192, 0},
    {"llama.lm_head/16", 1024, 8016, 2048, 0},  /* 1/16 of the 128256 columns */
    {"bert.qkv", 4096, 2304, 768, 0},
    {"bert.attn_proj", 4096, 768, 768, 0},
    {"bert.fc", 4096, 3072, 768, 0},
    {"bert.fc_proj", 4096, 768, 3072, 0},
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One GEMM in gputrain's row-major terms: C (m, n) = op(A) op(B). */
typedef struct gemm {
    int m, n, k, ta, tb;
} gemm;

static dnnl_engine_t engine;
static dnnl_stream_t stream;

/* 1 when `word` is one of the comma-separated items of `list` */
static int listed(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, word, n) && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static void die(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) {
        fprintf(stderr, "%s failed: %d\n", what, (int)s);
        exit(2);
    }
}

static dnnl_memory_desc_t md2(int rows, int cols, int trans, dnnl_data_type_t dt) {
    /* logical (rows, cols); stored transposed when trans */
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : cols, trans ? rows : 1};
    die(dnnl_memory_desc_create_with_strides(&md, 2, dims, dt, strides), "memory desc");
    return md;
}

static void sgemm(const gemm *g, const float *a, const float *b, float *c) {
    die(dnnl_sgemm(g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->m, g->n, g->k, 1.0f, a,
                   g->ta ? g->m : g->k, b, g->tb ? g->k : g->n, 0.0f, c, g->n), "sgemm");
}

static void widen_f16(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

static void narrow_f16(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

typedef struct bufs {
    float *a32, *b32, *c32;       /* f32 operands (and the widened copies) */
    uint16_t *a16, *b16, *c16;    /* half operands */
    void *scratch;
} bufs;

/* One call of g in dtype dt ("f32", "bf16", "f16"); prim is the bf16 matmul (else NULL). */
static void run_once(const char *dt, const gemm *g, bufs *x, dnnl_primitive_t prim, size_t na,
                     size_t nb) {
    if (!strcmp(dt, "f32")) {
        sgemm(g, x->a32, x->b32, x->c32);
    } else if (!strcmp(dt, "f16")) {
        widen_f16(x->a32, x->a16, na);
        widen_f16(x->b32, x->b16, nb);
        sgemm(g, x->a32, x->b32, x->c32);
        narrow_f16(x->c16, x->c32, (size_t)g->m * g->n);
    } else {
        dnnl_memory_t mem[4];
        dnnl_exec_arg_t args[4];
        const int ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
        void *h[4] = {x->a16, x->b16, x->c16, x->scratch};
        const_dnnl_primitive_desc_t pd;
        dnnl_primitive_get_primitive_desc(prim, &pd);
        const dnnl_query_t q[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                                   dnnl_query_scratchpad_md};
        for (int i = 0; i < 4; i++) {
            die(dnnl_memory_create(&mem[i], dnnl_primitive_desc_query_md(pd, q[i], 0), engine,
                                   h[i]), "memory");
            args[i].arg = ids[i];
            args[i].memory = mem[i];
        }
        die(dnnl_primitive_execute(prim, stream, 4, args), "execute");
        die(dnnl_stream_wait(stream), "wait");
        for (int i = 0; i < 4; i++)
            dnnl_memory_destroy(mem[i]);
    }
}

static dnnl_primitive_t make_bf16(const gemm *g, size_t *scratch_bytes) {
    dnnl_memory_desc_t a = md2(g->m, g->k, g->ta, dnnl_bf16), b = md2(g->k, g->n, g->tb, dnnl_bf16),
                       c = md2(g->m, g->n, 0, dnnl_bf16);
    dnnl_primitive_attr_t attr;
    die(dnnl_primitive_attr_create(&attr), "attr");
    die(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad");
    dnnl_primitive_desc_t pd;
    die(dnnl_matmul_primitive_desc_create(&pd, engine, a, b, NULL, c, attr), "matmul pd");
    dnnl_primitive_t p;
    die(dnnl_primitive_create(&p, pd), "matmul");
    *scratch_bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    dnnl_memory_desc_destroy(a), dnnl_memory_desc_destroy(b), dnnl_memory_desc_destroy(c);
    return p;
}

static void measure(const char *name, const char *pass, const char *dt, const gemm *g) {
    size_t na = (size_t)g->m * g->k, nb = (size_t)g->k * g->n, nc = (size_t)g->m * g->n;
    bufs x = {0};
    x.a32 = aligned_alloc(64, na * 4), x.b32 = aligned_alloc(64, nb * 4);
    x.c32 = aligned_alloc(64, nc * 4);
    x.a16 = aligned_alloc(64, na * 2), x.b16 = aligned_alloc(64, nb * 2);
    x.c16 = aligned_alloc(64, nc * 2);
    for (size_t i = 0; i < na; i++) x.a32[i] = (float)((i * 7919u) % 1000u) / 1000.0f - 0.5f;
    for (size_t i = 0; i < nb; i++) x.b32[i] = (float)((i * 104729u) % 1000u) / 1000.0f - 0.5f;
    /* 0x3C00 = 1.0 in f16, 0x3F80 = 1.0 in bf16: the values do not change the speed */
    for (size_t i = 0; i < na; i++) x.a16[i] = !strcmp(dt, "bf16") ? 0x3F80 : 0x3C00;
    for (size_t i = 0; i < nb; i++) x.b16[i] = !strcmp(dt, "bf16") ? 0x3F80 : 0x3C00;
    dnnl_primitive_t prim = NULL;
    size_t scratch_bytes = 0;
    if (!strcmp(dt, "bf16")) {
        prim = make_bf16(g, &scratch_bytes);
        x.scratch = aligned_alloc(64, scratch_bytes ? (scratch_bytes + 63) / 64 * 64 : 64);
    }
    run_once(dt, g, &x, prim, na, nb);  /* warm-up (kernel generation, pages) */
    int calls = 0;
    double t0 = now(), t;
    do {
        run_once(dt, g, &x, prim, na, nb);
        calls++;
        t = now() - t0;
    } while (t < 0.25);
    printf("RESULT %s %s %s %.1f\n", name, pass, dt, 2.0 * g->m * g->n * g->k * calls / t * 1e-9);
    fflush(stdout);
    if (prim) dnnl_primitive_destroy(prim);
    free(x.a32), free(x.b32), free(x.c32), free(x.a16), free(x.b16), free(x.c16), free(x.scratch);
}

static void print_loaded(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "libdnnl.so")) {
            printf("LOADED %s", strchr(line, '/'));
            break;
        }
    if (f) fclose(f);
    const dnnl_version_t *v = dnnl_version();
    printf("VERSION %d.%d.%d %s cpu_runtime=%u isa=0x%x\n", v->major, v->minor, v->patch, v->hash,
           v->cpu_runtime, (unsigned)dnnl_get_effective_cpu_isa());
}

int main(int argc, char **argv) {
    const char *dtypes = argc > 1 ? argv[1] : "f32,bf16,f16";
    const char *passes = argc > 2 ? argv[2] : "fwd";
    print_loaded();
    if (listed(dtypes, "bf16")) {
        die(dnnl_engine_create(&engine, dnnl_cpu, 0), "CPU engine creation");
        die(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "stream");
    }
    static const char *dts[] = {"f32", "bf16", "f16"};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        /* forward Y = X W^T; backward dX = dY W, dW = dY^T X (row-major, as gputrain's Linear) */
        gemm fwd = {sh->m, sh->n, sh->k, 0, 1}, dx = {sh->m, sh->k, sh->n, 0, 0},
             dw = {sh->n, sh->k, sh->m, 1, 0};
        for (size_t d = 0; d < 3; d++) {
            if (!listed(dtypes, dts[d])) continue;
            measure(sh->name, "fwd", dts[d], &fwd);
            if (sh->bwd && listed(passes, "bwd")) {
                measure(sh->name, "bwd_dx", dts[d], &dx);
                measure(sh->name, "bwd_dw", dts[d], &dw);
            }
        }
    }
    return 0;
}
