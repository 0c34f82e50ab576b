/* Private to the CPU backend: the GEMM library behind the CPU GEMMs, chosen when gputrain is
 * built (setup.py): oneDNN on x86-64 (cpu_blas_onednn.c; its kernels are generated for the CPU at
 * run time, SSE4.1 through AVX-512, AVX512_BF16 and AMX), OpenBLAS from scipy-openblas32
 * elsewhere (cpu_blas_openblas.c; DYNAMIC_ARCH, every aarch64 core). Each call runs on the
 * calling thread only: cpu_gemm_split.c splits GEMMs over gputrain's own OpenMP threads. */
#ifndef GT_CPU_BLAS_H
#define GT_CPU_BLAS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

/* C = alpha op(A) op(B) + beta C for one row-major GEMM; sizes already checked. */
typedef struct gt_blas_gemm {
    int trans_a, trans_b;  /* 1 when A / B are stored transposed */
    int64_t m, n, k;       /* op(A) is (m, k), op(B) is (k, n), C is (m, n) */
    float alpha, beta;     /* scales of the product and of C (beta = 0: C is not read) */
    const void *a;         /* A: (m, k), or (k, m) when trans_a; dtype ab_dt */
    int64_t lda;           /* elements between rows of A */
    const void *b;         /* B: (k, n), or (n, k) when trans_b; dtype ab_dt */
    int64_t ldb;           /* elements between rows of B */
    gt_dtype ab_dt;        /* dtype of A and B */
    void *c;               /* C: (m, n); dtype c_dt */
    int64_t ldc;           /* elements between rows of C */
    gt_dtype c_dt;         /* dtype of C: f32, or ab_dt */
    int packed_b;          /* 1 when b holds B as gt_blas_pack_b left it (ldb: B's as it lay) */
} gt_blas_gemm;

/* Makes the library run every call on the calling thread; once, at module start. */
void gt_blas_init(void);

/* 1 when the library multiplies ab_dt operands into c_dt natively on this CPU, faster than
 * widening them to f32 (bf16 with AVX512_BF16 or AMX); f32 is always native. */
int gt_blas_native(gt_dtype ab_dt, gt_dtype c_dt, float alpha);

/* Rows or columns each part of g has at least when cpu_gemm_split.c cuts it: narrower parts
 * cost this library's kernels more than their parallelism gives back. */
int64_t gt_blas_min_part(const gt_blas_gemm *g);

/* Scratch bytes one call with these sizes needs (0 for f32); g's pointers are not read. */
gt_status gt_blas_scratch_bytes(const gt_blas_gemm *g, size_t *bytes);

/* One GEMM on the calling thread; `scratch` holds gt_blas_scratch_bytes(g) bytes. The same
 * arguments give the same bits on a given CPU, whatever thread runs it. */
gt_status gt_blas_gemm_run(const gt_blas_gemm *g, void *scratch);

/* Bytes of B packed once, into the layout the library's kernels read, for all of `parts` (the
 * row blocks of one GEMM, which share B); 0 when each part is better off reading B as it lies
 * (f32, or parts whose kernels want different layouts). */
gt_status gt_blas_shared_b_bytes(const gt_blas_gemm *parts, int64_t count, size_t *bytes);

/* Packs g's B into `packed` (gt_blas_shared_b_bytes bytes) for calls with packed_b set. */
gt_status gt_blas_pack_b(const gt_blas_gemm *g, void *packed);

/* 1 when the library runs g, a column block cut from a wider C (ldc > n), faster into a dense
 * C of its own (ldc = n) that is then copied into place. */
int gt_blas_wants_dense_c(const gt_blas_gemm *g);

/* What the library is and what it runs here (for gputrain.info()). */
const char *gt_blas_name(void);    /* "onednn" or "openblas" */
const char *gt_blas_config(void);  /* library version and build */
const char *gt_blas_kernel(void);  /* the instruction set its kernels use on this CPU */

#endif
