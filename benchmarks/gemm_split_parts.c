/* What gputrain's GEMM split (csrc/ops/cpu_gemm_split.c) costs with oneDNN's sgemm, one thread:
 * each GEMM of the MLP step (benchmarks/bench_step.py) as one dnnl_sgemm call and cut into 2, 4
 * and 8 parts the way gputrain cuts it (blocks of rows of C when m >= n, else of columns, edges
 * on multiples of 16). The variants alternate call by call, so the machine's load hits them
 * alike; GFLOP/s at the median and the best of 30 calls each. Run it at two ISA levels:
 *
 *   V=<venv with onednn-cpu-gomp + onednn-devel-cpu-gomp>
 *   gcc -O2 -fopenmp benchmarks/gemm_split_parts.c -I$V/include -L$V/lib -ldnnl -Wl,-rpath,$V/lib -o split_parts
 *   ./split_parts; DNNL_MAX_CPU_ISA=AVX2 ./split_parts
 */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { CALLS = 30, VARIANTS = 4 };

typedef struct gemm {
    int m, n, k;       /* C is (m, n), the inner dimension k */
    int ta, tb;        /* 1: A stored (k, m) / B stored (n, k) */
    const char *name;  /* the step's GEMM it is */
} gemm;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* C = op(A) op(B) as `parts` library calls on blocks of C. */
static void run(const gemm *g, const float *a, const float *b, float *c, int parts) {
    int rows = g->m >= g->n, lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    long extent = rows ? g->m : g->n;
    for (long i = 0; i < parts; i++) {
        long lo = i * extent / parts / 16 * 16;
        long hi = i + 1 == parts ? extent : (i + 1) * extent / parts / 16 * 16;
        const float *pa = a, *pb = b;
        float *pc = c + (rows ? lo * g->n : lo);
        if (rows)
            pa = g->ta ? a + lo : a + lo * lda;
        else
            pb = g->tb ? b + lo * ldb : b + lo;
        dnnl_sgemm(g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', rows ? hi - lo : g->m,
                   rows ? g->n : hi - lo, g->k, 1.0f, pa, lda, pb, ldb, 0.0f, pc, g->n);
    }
}

int main(void) {
    omp_set_num_threads(1);
    const gemm step[5] = {{256, 1024, 784, 0, 1, "forward 1: X W1^T"},
                          {256, 1024, 1024, 0, 1, "forward 2: H1 W2^T"},
                          {1024, 784, 256, 1, 0, "weight grad 1: dY1^T X"},
                          {1024, 1024, 256, 1, 0, "weight grad 2: dY2^T H1"},
                          {256, 1024, 1024, 0, 0, "input grad 2: dY2 W2"}};
    const int parts[VARIANTS] = {1, 2, 4, 8};
    printf("oneDNN ISA mask 0x%x; GFLOP/s median (best) of %d calls\n",
           (unsigned)dnnl_get_effective_cpu_isa(), CALLS);
    for (int s = 0; s < 5; s++) {
        const gemm *g = &step[s];
        float *a = malloc(sizeof(float) * g->m * g->k), *b = malloc(sizeof(float) * g->n * g->k);
        float *c = malloc(sizeof(float) * g->m * g->n);
        for (long i = 0; i < (long)g->m * g->k; i++)
            a[i] = (float)rand() / RAND_MAX;
        for (long i = 0; i < (long)g->n * g->k; i++)
            b[i] = (float)rand() / RAND_MAX;
        double seconds[VARIANTS][CALLS];
        for (int v = 0; v < VARIANTS; v++)
            run(g, a, b, c, parts[v]);
        for (int r = 0; r < CALLS; r++)
            for (int v = 0; v < VARIANTS; v++) {
                double start = now();
                run(g, a, b, c, parts[v]);
                seconds[v][r] = now() - start;
            }
        printf("%-24s %4dx%4dx%4d %c%c", g->name, g->m, g->n, g->k, g->ta ? 'T' : 'N',
               g->tb ? 'T' : 'N');
        double flops = 2.0 * g->m * g->n * g->k;
        for (int v = 0; v < VARIANTS; v++) {
            qsort(seconds[v], CALLS, sizeof(double), by_value);
            printf("  %d part%s %5.0f (%3.0f)", parts[v], parts[v] > 1 ? "s" : " ",
                   flops / seconds[v][CALLS / 2] / 1e9, flops / seconds[v][0] / 1e9);
        }
        printf("\n");
        free(a), free(b), free(c);
    }
    return 0;
}
