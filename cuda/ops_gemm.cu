// CUDA GEMM through cuBLASLt: C = alpha op(A) op(B) + beta C, row-major (ops.h).
//
// Row-major C (m, n) is column-major C^T (n, m), so cuBLASLt computes C^T = op(B)^T op(A)^T:
// its "A" is our B (transposed when trans_b), its "B" is our A, and its m, n are our n, m.
// fp32 accumulation always: CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 for f32 operands
// when the device context's TF32 switch is on. The operand types cuBLAS takes directly are
// A = B in {f32, f16, bf16} with C of the same type or f32; any other mix stages its half
// operands in f32 in the workspace (one batch at a time, as the CPU backend does), multiplies in
// f32 and rounds the result once into C. beta = 0 does not read C (cuBLAS's contract; a staged
// half C is widened only when beta != 0). k = 0 gives C = beta C (0 when beta = 0) by a kernel.
//
// The pointer alignments (up to 16 bytes) are given to the heuristic (its default assumes 256
// bytes; parameter slices of a model are often only 2- or 4-byte aligned). When cuBLASLt offers no algorithm,
// the GEMM falls back to cublasGemmStridedBatchedEx on the context's cuBLAS handle, whose
// stream is set under a lock (the handle is shared by every backend of the device).

#include <mutex>

#include "core/alloc.h"
#include "cuda_libs.cuh"
#include "ops_kernels.cuh"

namespace {

constexpr size_t kLtWorkspace = 4u << 20;  // cuBLASLt workspace the plan reserves, bytes
constexpr size_t kLtAlign = 256;           // alignment of that workspace, bytes

std::mutex legacy_lock;  // guards the stream of the shared cuBLAS handles (fallback path)


// 1 when cuBLAS multiplies these operand types directly.
bool direct_types(const gt_gemm_args *g) {
    return g->a_dt == g->b_dt && (g->c_dt == g->a_dt || g->c_dt == GT_F32);
}

// Bytes of the f32 staging copies a mixed-type GEMM needs (0 for direct types).
size_t staging_bytes(const gt_gemm_args *g) {
    if (direct_types(g))
        return 0;
    size_t bytes = 0;
    if (g->a_dt != GT_F32)  /* saturating: SIZE_MAX when the sizes overflow (never allocated) */
        bytes = gt_size_add_sat(bytes, gt_align_up(gt_size_mul_sat(gt_gemm_a_rows(g) * sizeof(float),
                                                                   gt_gemm_a_cols(g))));
    if (g->b_dt != GT_F32)
        bytes = gt_size_add_sat(bytes, gt_align_up(gt_size_mul_sat(gt_gemm_b_rows(g) * sizeof(float),
                                                                   gt_gemm_b_cols(g))));
    if (g->c_dt != GT_F32)
        bytes = gt_size_add_sat(bytes, gt_align_up(gt_size_mul_sat((size_t)g->m * sizeof(float),
                                                                   (size_t)g->n)));
    return bytes;
}

gt_status cublas_fail(cublasStatus_t status, const char *what, int line) {
    return gt_set_error(GT_ERR_CUDA, __FILE__, line, "%s failed: %s (%s)", what, gt_cublas.cublasGetStatusString(status),
                        gt_cublas.cublasGetStatusName(status));
}

#define GT_CUBLAS_TRY(call, what)                                \
    do {                                                         \
        cublasStatus_t gt_blas_status_ = (call);                 \
        if (gt_blas_status_ != CUBLAS_STATUS_SUCCESS)            \
            return cublas_fail(gt_blas_status_, (what), __LINE__); \
    } while (0)

cudaDataType_t cuda_type(gt_dtype dt) {
    return dt == GT_F16 ? CUDA_R_16F : (dt == GT_BF16 ? CUDA_R_16BF : CUDA_R_32F);
}

// ------------------------------------------------------------------ kernels

// dst (rows, cols) with leading dimension dst_ld = src converted from SRC to DST.
template <gt_dtype SRC, gt_dtype DST>
__global__ void convert_matrix_kernel(void *dst, size_t dst_ld, const void *src, size_t src_ld, size_t rows,
                                      size_t cols) {
    GT_GRID_STRIDE(i, rows * cols) {
        size_t r = i / cols, c = i % cols;
        store_elem<DST>(dst, r * dst_ld + c, load_elem<SRC>(src, r * src_ld + c));
    }
}

// C = beta C over `batch` (rows, cols) matrices, without reading C when beta is 0 (the k = 0 case).
template <gt_dtype DT>
__global__ void scale_matrix_kernel(void *c, size_t ldc, size_t stride_c, size_t batch, size_t rows, size_t cols,
                                    float beta) {
    size_t per_matrix = rows * cols;
    GT_GRID_STRIDE(i, per_matrix * batch) {
        size_t b = i / per_matrix, within = i % per_matrix;
        size_t at = b * stride_c + (within / cols) * ldc + within % cols;
        store_elem<DT>(c, at, beta == 0.0f ? 0.0f : beta * load_elem<DT>(c, at));
    }
}

// Launches convert_matrix_kernel for a half <-> f32 conversion.
gt_status convert_matrix(cudaStream_t stream, void *dst, gt_dtype dst_dt, size_t dst_ld, const void *src,
                         gt_dtype src_dt, size_t src_ld, size_t rows, size_t cols) {
    unsigned grid = grid_for(rows * cols);
    if (src_dt == GT_F16 && dst_dt == GT_F32)
        convert_matrix_kernel<GT_F16, GT_F32><<<grid, kThreads, 0, stream>>>(dst, dst_ld, src, src_ld, rows, cols);
    else if (src_dt == GT_BF16 && dst_dt == GT_F32)
        convert_matrix_kernel<GT_BF16, GT_F32><<<grid, kThreads, 0, stream>>>(dst, dst_ld, src, src_ld, rows, cols);
    else if (src_dt == GT_F32 && dst_dt == GT_F16)
        convert_matrix_kernel<GT_F32, GT_F16><<<grid, kThreads, 0, stream>>>(dst, dst_ld, src, src_ld, rows, cols);
    else if (src_dt == GT_F32 && dst_dt == GT_BF16)
        convert_matrix_kernel<GT_F32, GT_BF16><<<grid, kThreads, 0, stream>>>(dst, dst_ld, src, src_ld, rows, cols);
    else
        return GT_FAIL(GT_ERR_RUNTIME, "gemm: no staging conversion from %s to %s", gt_dtype_name(src_dt),
                       gt_dtype_name(dst_dt));
    return gt_cuda_check_launch("convert_matrix_kernel launch");
}

// ------------------------------------------------------------------ one cuBLAS call

// A GEMM in cuBLAS's column-major terms: D = op(A) op(B) + beta C, D = C.
struct BlasCall {
    cublasOperation_t trans_a, trans_b;  // op of the column-major A and B
    uint64_t m, n, k;                    // D is (m, n), op(A) (m, k), op(B) (k, n)
    const void *a, *b;                   // operands
    void *c;                             // C and D
    cudaDataType_t a_type, b_type, c_type;
    int64_t lda, ldb, ldc;               // leading dimensions, elements
    int64_t stride_a, stride_b, stride_c;  // elements between matrices of a batch
    int32_t batch;                       // matrices (1: a plain GEMM)
    cublasComputeType_t compute;         // fp32 accumulation, optionally TF32
    float alpha, beta;                   // scalars (host)
    void *workspace;                     // cuBLASLt workspace (kLtAlign-aligned) or NULL
    size_t workspace_bytes;              // its size
};

// The largest power of two <= 16 dividing the address (and the batch stride in bytes). Capped at
// 16 bytes (the widest vector access), so that operands placed differently (a checkpointed
// block's recompute region) get the same algorithm and the same bits.
uint32_t alignment_of(const void *ptr, int64_t stride, size_t elem_size, int32_t batch) {
    uint32_t align = 16;
    while (align > 1 && (uintptr_t)ptr % align != 0)
        align /= 2;
    while (batch > 1 && align > 1 && ((size_t)stride * elem_size) % align != 0)
        align /= 2;
    return align;
}

size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// cuBLASLt descriptors, destroyed on every path out of lt_matmul.
struct LtDescs {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~LtDescs() {
        if (pref)
            gt_cublaslt.cublasLtMatmulPreferenceDestroy(pref);
        if (c)
            gt_cublaslt.cublasLtMatrixLayoutDestroy(c);
        if (b)
            gt_cublaslt.cublasLtMatrixLayoutDestroy(b);
        if (a)
            gt_cublaslt.cublasLtMatrixLayoutDestroy(a);
        if (op)
            gt_cublaslt.cublasLtMatmulDescDestroy(op);
    }
};

gt_status make_layout(cublasLtMatrixLayout_t *out, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                      int32_t batch, int64_t stride) {
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatrixLayoutCreate(out, type, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    if (batch == 1)
        return GT_OK;
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
                  "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                               sizeof stride),
                  "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    return GT_OK;
}

gt_status make_preference(cublasLtMatmulPreference_t *out, const BlasCall &call) {
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatmulPreferenceCreate(out), "cublasLtMatmulPreferenceCreate");
    uint64_t workspace = call.workspace_bytes;
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatmulPreferenceSetAttribute(*out, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                                   sizeof workspace),
                  "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    uint32_t align_a = alignment_of(call.a, call.stride_a, type_size(call.a_type), call.batch);
    uint32_t align_b = alignment_of(call.b, call.stride_b, type_size(call.b_type), call.batch);
    uint32_t align_c = alignment_of(call.c, call.stride_c, type_size(call.c_type), call.batch);
    const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t values[4] = {align_a, align_b, align_c, align_c};
    for (int i = 0; i < 4; i++)
        GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatmulPreferenceSetAttribute(*out, attrs[i], &values[i], sizeof values[i]),
                      "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
    return GT_OK;
}

// Runs the call with cuBLASLt; *ran = false (and GT_OK) when the heuristic offers no algorithm.
gt_status lt_matmul(const gt_cuda_backend_state *state, const BlasCall &call, bool *ran) {
    *ran = false;
    cublasLtHandle_t handle = reinterpret_cast<cublasLtHandle_t>(state->context->cublaslt);
    LtDescs d;
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatmulDescCreate(&d.op, call.compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &call.trans_a, sizeof call.trans_a),
                  "cublasLtMatmulDescSetAttribute(TRANSA)");
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &call.trans_b, sizeof call.trans_b),
                  "cublasLtMatmulDescSetAttribute(TRANSB)");
    bool ta = call.trans_a == CUBLAS_OP_T, tb = call.trans_b == CUBLAS_OP_T;
    GT_TRY(make_layout(&d.a, call.a_type, ta ? call.k : call.m, ta ? call.m : call.k, call.lda, call.batch,
                       call.stride_a));
    GT_TRY(make_layout(&d.b, call.b_type, tb ? call.n : call.k, tb ? call.k : call.n, call.ldb, call.batch,
                       call.stride_b));
    GT_TRY(make_layout(&d.c, call.c_type, call.m, call.n, call.ldc, call.batch, call.stride_c));
    GT_TRY(make_preference(&d.pref, call));
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    cublasStatus_t status =
        gt_cublaslt.cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0))
        return GT_OK;
    if (status != CUBLAS_STATUS_SUCCESS)
        return cublas_fail(status, "cublasLtMatmulAlgoGetHeuristic", __LINE__);
    GT_CUBLAS_TRY(gt_cublaslt.cublasLtMatmul(handle, d.op, &call.alpha, call.a, d.a, call.b, d.b, &call.beta, call.c, d.c, call.c,
                                             d.c, &result.algo, call.workspace, call.workspace_bytes, stream_of(state)),
                  "cublasLtMatmul");
    *ran = true;
    return GT_OK;
}

// The same call through cublasGemmStridedBatchedEx (the shared handle's stream set under a lock).
gt_status legacy_matmul(const gt_cuda_backend_state *state, const BlasCall &call) {
    cublasHandle_t handle = reinterpret_cast<cublasHandle_t>(state->context->cublas);
    std::lock_guard<std::mutex> guard(legacy_lock);
    GT_CUBLAS_TRY(gt_cublas.cublasSetStream(handle, stream_of(state)), "cublasSetStream");
    GT_CUBLAS_TRY(gt_cublas.cublasGemmStridedBatchedEx(handle, call.trans_a, call.trans_b, (int)call.m, (int)call.n,
                                                       (int)call.k, &call.alpha, call.a, call.a_type, (int)call.lda,
                                                       call.stride_a, call.b, call.b_type, (int)call.ldb, call.stride_b,
                                                       &call.beta, call.c, call.c_type, (int)call.ldc, call.stride_c,
                                                       call.batch, call.compute, CUBLAS_GEMM_DEFAULT),
                  "cublasGemmStridedBatchedEx");
    return GT_OK;
}

gt_status blas_matmul(const gt_cuda_backend_state *state, const BlasCall &call) {
    bool ran = false;
    GT_TRY(lt_matmul(state, call, &ran));
    return ran ? GT_OK : legacy_matmul(state, call);
}

// ------------------------------------------------------------------ the op

// The row-major GEMM `g` (operands as given: a, b, c with their dtypes and leading dimensions)
// as a column-major cuBLAS call over `batch` matrices.
BlasCall make_call(const gt_cuda_backend_state *state, const gt_gemm_args *g, const void *a, gt_dtype a_dt,
                   int64_t lda, const void *b, gt_dtype b_dt, int64_t ldb, void *c, gt_dtype c_dt, int64_t ldc,
                   int32_t batch) {
    BlasCall call = {};
    call.trans_a = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    call.trans_b = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    call.m = (uint64_t)g->n, call.n = (uint64_t)g->m, call.k = (uint64_t)g->k;
    call.a = b, call.a_type = cuda_type(b_dt), call.lda = ldb, call.stride_a = g->stride_b;
    call.b = a, call.b_type = cuda_type(a_dt), call.ldb = lda, call.stride_b = g->stride_a;
    call.c = c, call.c_type = cuda_type(c_dt), call.ldc = ldc, call.stride_c = g->stride_c;
    call.batch = batch;
    bool tf32 = a_dt == GT_F32 && b_dt == GT_F32 && state->context->tf32;
    call.compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    call.alpha = g->alpha, call.beta = g->beta;
    return call;
}

// The cuBLASLt workspace: what follows the staging copies in the backend's workspace, aligned.
void lt_workspace(const gt_backend *be, size_t staging, void **ptr, size_t *bytes) {
    *ptr = nullptr, *bytes = 0;
    if (!be->workspace || be->workspace_bytes <= staging)
        return;
    uintptr_t begin = (uintptr_t)be->workspace + staging;
    uintptr_t aligned = (begin + kLtAlign - 1) / kLtAlign * kLtAlign;
    uintptr_t end = (uintptr_t)be->workspace + be->workspace_bytes;
    if (aligned < end) {
        *ptr = reinterpret_cast<void *>(aligned);
        *bytes = end - aligned;
    }
}

// Mixed operand types: each batch widens its half operands into f32 staging copies, multiplies
// in f32 and rounds a half C once.
gt_status staged_gemm(gt_backend *be, const gt_cuda_backend_state *state, const gt_gemm_args *g,
                      const BlasCall *lt) {
    char *next = static_cast<char *>(be->workspace);
    float *a32 = nullptr, *b32 = nullptr, *c32 = nullptr;
    if (g->a_dt != GT_F32)
        a32 = reinterpret_cast<float *>(next), next += gt_align_up(gt_gemm_a_rows(g) * gt_gemm_a_cols(g) * sizeof(float));
    if (g->b_dt != GT_F32)
        b32 = reinterpret_cast<float *>(next), next += gt_align_up(gt_gemm_b_rows(g) * gt_gemm_b_cols(g) * sizeof(float));
    if (g->c_dt != GT_F32)
        c32 = reinterpret_cast<float *>(next);
    cudaStream_t stream = stream_of(state);
    size_t a_size = gt_dtype_size(g->a_dt), b_size = gt_dtype_size(g->b_dt), c_size = gt_dtype_size(g->c_dt);
    for (int64_t i = 0; i < g->batch; i++) {
        const char *a = static_cast<const char *>(g->a) + (size_t)(i * g->stride_a) * a_size;
        const char *b = static_cast<const char *>(g->b) + (size_t)(i * g->stride_b) * b_size;
        char *c = static_cast<char *>(g->c) + (size_t)(i * g->stride_c) * c_size;
        if (a32)
            GT_TRY(convert_matrix(stream, a32, GT_F32, gt_gemm_a_cols(g), a, g->a_dt, (size_t)g->lda, gt_gemm_a_rows(g), gt_gemm_a_cols(g)));
        if (b32)
            GT_TRY(convert_matrix(stream, b32, GT_F32, gt_gemm_b_cols(g), b, g->b_dt, (size_t)g->ldb, gt_gemm_b_rows(g), gt_gemm_b_cols(g)));
        if (c32 && g->beta != 0.0f)
            GT_TRY(convert_matrix(stream, c32, GT_F32, (size_t)g->n, c, g->c_dt, (size_t)g->ldc, (size_t)g->m,
                                  (size_t)g->n));
        BlasCall call = make_call(state, g, a32 ? a32 : (const void *)a, GT_F32, a32 ? (int64_t)gt_gemm_a_cols(g) : g->lda,
                                  b32 ? b32 : (const void *)b, GT_F32, b32 ? (int64_t)gt_gemm_b_cols(g) : g->ldb,
                                  c32 ? c32 : (void *)c, GT_F32, c32 ? g->n : g->ldc, 1);
        call.workspace = lt->workspace, call.workspace_bytes = lt->workspace_bytes;
        GT_TRY(blas_matmul(state, call));
        if (c32)
            GT_TRY(convert_matrix(stream, c, g->c_dt, (size_t)g->ldc, c32, GT_F32, (size_t)g->n, (size_t)g->m,
                                  (size_t)g->n));
    }
    return GT_OK;
}

gt_status scale_c(const gt_cuda_backend_state *state, const gt_gemm_args *g) {
    size_t per_batch = (size_t)g->m * (size_t)g->n, stride = g->batch > 1 ? (size_t)g->stride_c : 0;
    GT_LAUNCH_DT(g->c_dt, scale_matrix_kernel, grid_for(per_batch * (size_t)g->batch), kThreads, 0,
                 stream_of(state), g->c, (size_t)g->ldc, stride, (size_t)g->batch, (size_t)g->m, (size_t)g->n,
                 g->beta);
    return gt_cuda_check_launch("scale_matrix_kernel launch");
}

}  // namespace

size_t gt_cuda_gemm_workspace_bytes(const gt_gemm_args *args) {
    return gt_size_add_sat(staging_bytes(args), kLtWorkspace + kLtAlign);
}

gt_status gt_cuda_gemm(gt_backend *be, const gt_gemm_args *args) {
    GT_TRY(gt_gemm_check(args));
    gt_cuda_backend_state *state = NULL;
    GT_TRY(gt_cuda_op_begin(be, &state));
    if (args->m == 0 || args->n == 0)
        return GT_OK;
    if (args->k == 0)
        return scale_c(state, args);
    size_t staging = staging_bytes(args);
    if (staging > 0 && (!be->workspace || be->workspace_bytes < staging))
        return GT_FAIL(GT_ERR_RUNTIME,
                       "workspace: a mixed-precision GEMM (%lld x %lld x %lld, %s x %s -> %s) needs %zu bytes, "
                       "the backend has %zu", (long long)args->m, (long long)args->n, (long long)args->k,
                       gt_dtype_name(args->a_dt), gt_dtype_name(args->b_dt), gt_dtype_name(args->c_dt), staging,
                       be->workspace ? be->workspace_bytes : (size_t)0);
    BlasCall lt = {};
    lt_workspace(be, staging, &lt.workspace, &lt.workspace_bytes);
    if (!direct_types(args))
        return staged_gemm(be, state, args, &lt);
    BlasCall call = make_call(state, args, args->a, args->a_dt, args->lda, args->b, args->b_dt, args->ldb, args->c,
                              args->c_dt, args->ldc, (int32_t)args->batch);
    call.workspace = lt.workspace, call.workspace_bytes = lt.workspace_bytes;
    return blas_matmul(state, call);
}
