/* GEMMs of the CPU library on gputrain's OpenMP threads. C is cut into blocks of rows (or of
 * columns when C is wider than tall), and each block is one single-threaded library call
 * (cpu_blas.h), the blocks spread over the threads. The library's own threads are never used,
 * so GEMMs and the elementwise loops between them share one pool instead of two spinning
 * against each other (with OpenBLAS threading beside OpenMP the MLP step ran 3x slower).
 *
 * The cut depends on the GEMM and the CPU, never on the thread count: every thread count makes
 * the same library calls on the same blocks, so the bits of C cannot depend on it, whatever
 * kernels and internal blocking the library picks on this CPU (a cut per thread did: OpenBLAS's
 * Haswell kernels gave other bits next to the cut). Blocks are at least gt_blas_min_part(g) wide
 * (128 rows/columns, more where the library's kernels need it): measured on one thread with
 * oneDNN (benchmarks/README.md), cutting the wider side of the MLP's GEMMs into 128-wide blocks
 * cost 0-5% against one call at AVX-512, 64-wide blocks up to 45%. The minimum depends on the
 * GEMM and the CPU, never on the thread count, so the bits still do not.
 * Row blocks share B: where the library would copy B into its kernels' layout in every call
 * (bf16 matmul), B is packed once into the scratch before the blocks run (gt_blas_pack_b).
 * Column blocks write into a dense C block of their scratch, copied into C after, where the
 * library runs them faster so (gt_blas_wants_dense_c). */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "ops/cpu_gemm_split.h"

enum {
    GT_GEMM_MIN_SPLIT_FLOPS = 1 << 22,  /* 2 m n k below which a GEMM is one call */
    GT_GEMM_MIN_PART_FLOPS = 1 << 21,   /* 2 m n k a block has at least */
    GT_GEMM_MAX_PARTS = 32,             /* blocks a GEMM is cut into at most */
    GT_GEMM_PART_ALIGN = 16,            /* block edges fall on multiples of this */
};

static double gemm_flops(const gt_blas_gemm *g) {
    return 2.0 * (double)g->m * (double)g->n * (double)g->k;
}

gt_gemm_parts gt_gemm_parts_of(const gt_blas_gemm *g) {
    gt_gemm_parts parts = {g->m >= g->n, 1, g->m >= g->n ? g->m : g->n};
    double flops = gemm_flops(g);
    if (flops < GT_GEMM_MIN_SPLIT_FLOPS)
        return parts;
    int64_t count = parts.extent / gt_blas_min_part(g);
    if (count > GT_GEMM_MAX_PARTS)
        count = GT_GEMM_MAX_PARTS;
    if ((double)count > flops / GT_GEMM_MIN_PART_FLOPS)
        count = (int64_t)(flops / GT_GEMM_MIN_PART_FLOPS);
    parts.count = count > 1 ? count : 1;
    return parts;
}

/* First row/column of block `index` (index == count gives the extent). */
static int64_t part_start(const gt_gemm_parts *parts, int64_t index) {
    if (index >= parts->count)
        return parts->extent;
    int64_t even = index * parts->extent / parts->count;
    return even / GT_GEMM_PART_ALIGN * GT_GEMM_PART_ALIGN;
}

/* The GEMM of block `index` of g. */
static gt_blas_gemm part_gemm(const gt_blas_gemm *g, const gt_gemm_parts *parts, int64_t index) {
    int64_t lo = part_start(parts, index), hi = part_start(parts, index + 1);
    size_t ab_size = gt_dtype_size(g->ab_dt), c_size = gt_dtype_size(g->c_dt);
    gt_blas_gemm part = *g;
    if (parts->split_rows) {
        if (g->a)
            part.a = (const char *)g->a + (size_t)(g->trans_a ? lo : lo * g->lda) * ab_size;
        part.c = (char *)g->c + (size_t)(lo * g->ldc) * c_size;
        part.m = hi - lo;
    } else {
        if (g->b)
            part.b = (const char *)g->b + (size_t)(g->trans_b ? lo * g->ldb : lo) * ab_size;
        part.c = (char *)g->c + (size_t)lo * c_size;
        part.n = hi - lo;
    }
    return part;
}

/* Bytes of B packed once for all the row blocks of g (0: each block reads B as it lies). */
static gt_status shared_b_bytes(const gt_blas_gemm *g, const gt_gemm_parts *parts,
                                size_t *bytes) {
    *bytes = 0;
    if (!parts->split_rows || parts->count < 2)
        return GT_OK;
    gt_blas_gemm blocks[GT_GEMM_MAX_PARTS];
    for (int64_t i = 0; i < parts->count; i++)
        blocks[i] = part_gemm(g, parts, i);
    GT_TRY(gt_blas_shared_b_bytes(blocks, parts->count, bytes));
    *bytes = gt_align_up(*bytes);
    return GT_OK;
}

/* Bytes of the dense C block each column block writes into, at the front of its scratch, when
 * the library asks for one (0: the blocks write into C where it lies). */
static size_t dense_c_bytes(const gt_blas_gemm *g, const gt_gemm_parts *parts) {
    if (parts->split_rows || parts->count < 2)
        return 0;
    gt_blas_gemm first = part_gemm(g, parts, 0);
    if (!gt_blas_wants_dense_c(&first))
        return 0;
    int64_t widest = 0;
    for (int64_t i = 0; i < parts->count; i++) {
        int64_t width = part_start(parts, i + 1) - part_start(parts, i);
        widest = width > widest ? width : widest;
    }
    return gt_align_up((size_t)(g->m * widest) * gt_dtype_size(g->c_dt));
}

/* The GEMM of block `index` as it runs: reading a packed B when packed_b, writing a dense C
 * block (its c set when it runs) when dense_c. */
static gt_blas_gemm run_gemm(const gt_blas_gemm *g, const gt_gemm_parts *parts, int64_t index,
                             int packed_b, int dense_c) {
    gt_blas_gemm part = part_gemm(g, parts, index);
    part.packed_b = packed_b;
    if (dense_c)
        part.ldc = part.n;
    return part;
}

/* The library's scratch bytes of the neediest block (every block gets that much). */
static gt_status part_scratch(const gt_blas_gemm *g, const gt_gemm_parts *parts, int packed_b,
                              int dense_c, size_t *bytes) {
    *bytes = 0;
    for (int64_t i = 0; i < parts->count; i++) {
        gt_blas_gemm part = run_gemm(g, parts, i, packed_b, dense_c);
        size_t need;
        GT_TRY(gt_blas_scratch_bytes(&part, &need));
        *bytes = need > *bytes ? gt_align_up(need) : *bytes;
    }
    return GT_OK;
}

/* How one GEMM shape is cut and where its blocks' scratch lies. */
typedef struct split_plan {
    gt_blas_gemm shape;   /* the GEMM with its pointers cleared (padding zeroed: a memcmp key) */
    gt_gemm_parts parts;  /* how C is cut */
    size_t packed;        /* bytes of B packed at the front of the scratch (0: none) */
    size_t dense_c;       /* bytes of each block's dense C, first in its scratch (0: none) */
    size_t per_part;      /* scratch bytes of each block (its dense C, then the library's) */
} split_plan;

/* The plan is a function of the shape and the CPU only, and finding it asks the library about
 * every block: each thread keeps the last GT_GEMM_PLANS_KEPT it found (no lock to take). */
enum { GT_GEMM_PLANS_KEPT = 64 };  /* plans kept per thread, the oldest replaced first */
static _Thread_local split_plan plans_kept[GT_GEMM_PLANS_KEPT];  /* the first plans_filled */
static _Thread_local int plans_filled;                            /* entries in use */
static _Thread_local int plans_next;                              /* entry replaced next */

static gt_blas_gemm shape_of(const gt_blas_gemm *g) {
    gt_blas_gemm shape;
    memset(&shape, 0, sizeof shape);
    shape.trans_a = g->trans_a, shape.trans_b = g->trans_b;
    shape.m = g->m, shape.n = g->n, shape.k = g->k;
    shape.alpha = g->alpha, shape.beta = g->beta;
    shape.lda = g->lda, shape.ldb = g->ldb, shape.ldc = g->ldc;
    shape.ab_dt = g->ab_dt, shape.c_dt = g->c_dt, shape.packed_b = g->packed_b;
    return shape;
}

static gt_status find_plan(const gt_blas_gemm *g, split_plan *plan) {
    plan->shape = shape_of(g);
    for (int i = 0; i < plans_filled; i++)
        if (memcmp(&plans_kept[i].shape, &plan->shape, sizeof plan->shape) == 0) {
            *plan = plans_kept[i];
            return GT_OK;
        }
    plan->parts = gt_gemm_parts_of(g);
    GT_TRY(shared_b_bytes(g, &plan->parts, &plan->packed));
    plan->dense_c = dense_c_bytes(g, &plan->parts);
    size_t library;
    GT_TRY(part_scratch(g, &plan->parts, plan->packed > 0, plan->dense_c > 0, &library));
    plan->per_part = plan->dense_c + library;
    plans_kept[plans_next] = *plan;
    plans_next = (plans_next + 1) % GT_GEMM_PLANS_KEPT;
    plans_filled += plans_filled < GT_GEMM_PLANS_KEPT;
    return GT_OK;
}

gt_status gt_cpu_gemm_split_scratch(const gt_blas_gemm *g, size_t *bytes) {
    split_plan plan;
    GT_TRY(find_plan(g, &plan));
    *bytes = plan.packed + plan.per_part * (size_t)plan.parts.count;
    return GT_OK;
}

/* C = beta C, as BLAS defines a GEMM with k = 0 (oneDNN leaves C as it is then); beta = 0
 * writes zeros without reading C. */
static gt_status scale_c(const gt_blas_gemm *g) {
    if (g->c_dt != GT_F32)
        return GT_FAIL(GT_ERR_RUNTIME, "gemm: k = 0 with a %s C goes through f32",
                       gt_dtype_name(g->c_dt));
    for (int64_t r = 0; r < g->m; r++) {
        float *row = (float *)g->c + r * g->ldc;
        for (int64_t j = 0; j < g->n; j++)
            row[j] = g->beta == 0.0f ? 0.0f : g->beta * row[j];
    }
    return GT_OK;
}

/* Runs `part` into the dense C block `block` (its rows of C copied in first when beta reads
 * them), then copies the block into C. */
static gt_status run_into_block(const gt_blas_gemm *part, char *block, void *library_scratch) {
    size_t c_size = gt_dtype_size(part->c_dt);
    size_t row = (size_t)part->n * c_size, stride = (size_t)part->ldc * c_size;
    char *c = part->c;
    gt_blas_gemm dense = *part;
    dense.c = block;
    dense.ldc = part->n;
    for (int64_t r = 0; part->beta != 0.0f && r < part->m; r++)
        memcpy(block + (size_t)r * row, c + (size_t)r * stride, row);
    GT_TRY(gt_blas_gemm_run(&dense, library_scratch));
    for (int64_t r = 0; r < part->m; r++)
        memcpy(c + (size_t)r * stride, block + (size_t)r * row, row);
    return GT_OK;
}

gt_status gt_cpu_gemm_split(const gt_blas_gemm *g, void *scratch) {
    if (g->m == 0 || g->n == 0)
        return GT_OK;
    if (g->k == 0)
        return scale_c(g);
    split_plan plan;
    GT_TRY(find_plan(g, &plan));
    gt_gemm_parts parts = plan.parts;
    size_t packed = plan.packed, per_part = plan.per_part;
    if (packed > 0) {
        gt_blas_gemm first = part_gemm(g, &parts, 0);  /* whose layout every block reads */
        GT_TRY(gt_blas_pack_b(&first, scratch));
    }
    char *part_scratch_base = per_part ? (char *)scratch + packed : NULL;
    gt_status failed = GT_OK;
    char message[512] = "";
#pragma omp parallel for schedule(static) if (parts.count > 1)
    for (int64_t i = 0; i < parts.count; i++) {
        gt_blas_gemm part = part_gemm(g, &parts, i);
        if (packed > 0) {
            part.b = scratch;
            part.packed_b = 1;
        }
        char *own_scratch = per_part ? part_scratch_base + i * per_part : NULL;
        gt_status status = plan.dense_c
                               ? run_into_block(&part, own_scratch, own_scratch + plan.dense_c)
                               : gt_blas_gemm_run(&part, own_scratch);
        if (status != GT_OK) {
#pragma omp critical(gt_gemm_split_failure)
            if (failed == GT_OK) {  /* the message is on this worker's thread: copy it */
                failed = status;
                snprintf(message, sizeof message, "%s", gt_error_message());
            }
        }
    }
    if (failed != GT_OK)
        return GT_FAIL(failed, "gemm (%lld x %lld x %lld): %s", (long long)g->m, (long long)g->n,
                       (long long)g->k, message);
    return GT_OK;
}

/* Matrix i of the batch described by g and the strides. */
static gt_blas_gemm batch_item(const gt_blas_gemm *g, int64_t i, int64_t stride_a,
                               int64_t stride_b, int64_t stride_c) {
    size_t ab_size = gt_dtype_size(g->ab_dt), c_size = gt_dtype_size(g->c_dt);
    gt_blas_gemm one = *g;  /* a and b may be NULL when k = 0 */
    one.a = one.a ? (const char *)one.a + (size_t)(i * stride_a) * ab_size : NULL;
    one.b = one.b ? (const char *)one.b + (size_t)(i * stride_b) * ab_size : NULL;
    one.c = (char *)one.c + (size_t)(i * stride_c) * c_size;
    return one;
}

gt_status gt_cpu_gemm_split_batch(const gt_blas_gemm *g, int64_t batch, int64_t stride_a,
                                  int64_t stride_b, int64_t stride_c, void *scratch) {
    gt_gemm_parts parts = gt_gemm_parts_of(g);
    if (batch == 1 || parts.count > 1 || g->ab_dt != GT_F32) {
        for (int64_t i = 0; i < batch; i++) {
            gt_blas_gemm one = batch_item(g, i, stride_a, stride_b, stride_c);
            GT_TRY(gt_cpu_gemm_split(&one, scratch));
        }
        return GT_OK;
    }
    /* small f32 GEMMs (no scratch): one whole GEMM per thread */
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int64_t i = 0; i < batch; i++) {
        gt_blas_gemm one = batch_item(g, i, stride_a, stride_b, stride_c);
        failed |= gt_blas_gemm_run(&one, NULL) != GT_OK;
    }
    return failed ? GT_FAIL(GT_ERR_RUNTIME, "gemm: a GEMM of the batch of %lld failed",
                            (long long)batch)
                  : GT_OK;
}
