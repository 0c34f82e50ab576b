// CUDA disentangled attention (ops.h, gt_disentangled_args): DeBERTa's attention with the c2p and
// p2c terms. The scores are gt_dis_score (ops/disentangled_hd.h), the CPU op's function; the sums
// run in other orders than the CPU's (the results agree to rounding, not bit for bit). Compiled in
// CI; written without a GPU to run it on (no GPU test has run this file).
//
// The workspace holds two (B, H, T, T) f32 matrices, so no kernel needs more than a row of
// registers and none uses atomics (the same bits on every run):
//   forward   dis_probs_kernel (thread per (b, h, i)): lse_i and P M into the workspace;
//             dis_out_kernel (thread per (b, h, i, d)): out = sum_j (P M)_ij v_j[d];
//   backward  dis_ds_kernel (thread per (b, h, i)): P M and scale dS into the workspace;
//             dis_dq_kernel (thread per (b, h, i, d)), dis_dkdv_kernel (thread per (b, h, j, d)),
//             dis_dpos_kernel (thread per (h, r, d): sums over b, then the relative distances
//             whose row is r, then i).
// key_lengths are device memory, checked on the device as the attention op's are.
#include "core/dropout.h"
#include "ops/disentangled_hd.h"
#include "ops_kernels.cuh"

namespace {

constexpr unsigned kDisThreads = 128;

__device__ float dis_drop(const gt_disentangled_args &a, size_t bh, size_t i, size_t j) {
    if (a.dropout_p <= 0.0)
        return 1.0f;
    size_t t = (size_t)a.seq;
    uint64_t g = a.dropout_key.offset + ((uint64_t)bh * t + i) * t + j;
    return gt_dropout_element_factor(a.dropout_key.seed, a.dropout_key.layer, a.dropout_key.step, g,
                                     (float)a.dropout_p, gt_dropout_scale(a.dropout_p));
}

// Row u = (b, h, i): lse_i and (P M)_i. into pm (zeros past the visible keys).
__global__ void dis_probs_kernel(gt_disentangled_args a, float *pm, size_t rows, const unsigned long long *bad) {
    if (gt_check_failed(bad))
        return;
    GT_GRID_STRIDE(u, rows) {
        size_t t = (size_t)a.seq, i = u % t, bh = u / t, b = bh / (size_t)a.heads, h = bh % (size_t)a.heads;
        size_t keys = gt_dis_keys(&a, b);
        float *row = pm + u * t, m = -INFINITY, sum = 0.0f, lse = -INFINITY;
        for (size_t j = 0; j < keys; j++) {
            row[j] = gt_dis_score(&a, b, h, i, j);
            m = row[j] > m ? row[j] : m;
        }
        for (size_t j = 0; j < keys; j++)
            sum += expf(row[j] - m);
        if (keys > 0)
            lse = m + logf(sum);
        for (size_t j = 0; j < t; j++)
            row[j] = j < keys ? expf(row[j] - lse) * dis_drop(a, bh, i, j) : 0.0f;
        a.lse[u] = lse;
    }
}

// Element (b, h, i, d): out = sum_j pm_ij v_j[d].
__global__ void dis_out_kernel(gt_disentangled_args a, const float *pm, size_t n, const unsigned long long *bad) {
    if (gt_check_failed(bad))
        return;
    GT_GRID_STRIDE(u, n) {
        size_t dim = (size_t)a.head_dim, t = (size_t)a.seq, d = u % dim, row = u / dim;
        size_t i = row % t, bh = row / t, b = bh / (size_t)a.heads, h = bh % (size_t)a.heads;
        float acc = 0.0f;
        for (size_t j = 0; j < gt_dis_keys(&a, b); j++)
            acc += pm[row * t + j] * gt_hd_load(a.v, gt_dis_at(&a.in, b, h, j) + d, a.dt);
        gt_hd_store(a.out, gt_dis_at(&a.out_strides, b, h, i) + d, acc, a.dt);
    }
}

// Row u = (b, h, i): pm_i. = P M and ds_i. = scale P (M dP - sum_j P M dP), dP = dO_i . v_j.
__global__ void dis_ds_kernel(gt_disentangled_args a, float *pm, float *ds, size_t rows,
                              const unsigned long long *bad) {
    if (gt_check_failed(bad))
        return;
    GT_GRID_STRIDE(u, rows) {
        size_t t = (size_t)a.seq, i = u % t, bh = u / t, b = bh / (size_t)a.heads, h = bh % (size_t)a.heads;
        size_t keys = gt_dis_keys(&a, b), dim = (size_t)a.head_dim, go = gt_dis_at(&a.out_strides, b, h, i);
        float lse = a.lse[u], delta = 0.0f, *p = pm + u * t, *g = ds + u * t;
        for (size_t j = 0; j < keys; j++) {
            p[j] = expf(gt_dis_score(&a, b, h, i, j) - lse);
            g[j] = gt_dis_dot(a.dout, go, a.v, gt_dis_at(&a.in, b, h, j), dim, a.dt);
            delta += p[j] * dis_drop(a, bh, i, j) * g[j];
        }
        for (size_t j = 0; j < t; j++) {
            float m = j < keys ? dis_drop(a, bh, i, j) : 0.0f;
            g[j] = j < keys ? a.scale * (p[j] * (m * g[j] - delta)) : 0.0f;
            p[j] = j < keys ? p[j] * m : 0.0f;
        }
    }
}

// Element (b, h, i, d): dq_i[d] = sum_j ds_ij (k_j[d] + pos_k[r][d]).
__global__ void dis_dq_kernel(gt_disentangled_args a, const float *ds, size_t n, const unsigned long long *bad) {
    if (gt_check_failed(bad))
        return;
    GT_GRID_STRIDE(u, n) {
        size_t dim = (size_t)a.head_dim, t = (size_t)a.seq, d = u % dim, row = u / dim;
        size_t i = row % t, bh = row / t, b = bh / (size_t)a.heads, h = bh % (size_t)a.heads;
        float acc = 0.0f;
        for (size_t j = 0; j < gt_dis_keys(&a, b); j++) {
            float kd = gt_hd_load(a.k, gt_dis_at(&a.in, b, h, j) + d, a.dt);
            float pk = a.pos_k ? gt_hd_load(a.pos_k, gt_dis_pos_at(&a, gt_dis_rel(&a, i, j), h) + d, a.dt) : 0.0f;
            acc += ds[row * t + j] * (kd + pk);
        }
        gt_hd_store(a.dq, gt_dis_at(&a.in, b, h, i) + d, acc, a.dt);
    }
}

// Element (b, h, j, d): dk_j[d] = sum_i ds_ij (q_i[d] + pos_q[r][d]), dv_j[d] = sum_i pm_ij dO_i[d].
__global__ void dis_dkdv_kernel(gt_disentangled_args a, const float *pm, const float *ds, size_t n,
                                const unsigned long long *bad) {
    if (gt_check_failed(bad))
        return;
    GT_GRID_STRIDE(u, n) {
        size_t dim = (size_t)a.head_dim, t = (size_t)a.seq, d = u % dim, row = u / dim;
        size_t j = row % t, bh = row / t, b = bh / (size_t)a.heads, h = bh % (size_t)a.heads;
        float dk = 0.0f, dv = 0.0f;
        for (size_t i = 0; i < t; i++) {
            size_t at = (bh * t + i) * t + j;
            float qd = gt_hd_load(a.q, gt_dis_at(&a.in, b, h, i) + d, a.dt);
            float pq = a.pos_q ? gt_hd_load(a.pos_q, gt_dis_pos_at(&a, gt_dis_rel(&a, i, j), h) + d, a.dt) : 0.0f;
            dk += ds[at] * (qd + pq);
            dv += pm[at] * gt_hd_load(a.dout, gt_dis_at(&a.out_strides, b, h, i) + d, a.dt);
        }
        gt_hd_store(a.dk, gt_dis_at(&a.in, b, h, j) + d, dk, a.dt);
        gt_hd_store(a.dv, gt_dis_at(&a.in, b, h, j) + d, dv, a.dt);
    }
}

// Element (h, r, d): dpos_k[r][d] = sum ds_ij q_i[d], dpos_q[r][d] = sum ds_ij k_j[d] over b and the
// (i, j = i - delta) whose relative row rel_index[delta + T - 1] is r.
__global__ void dis_dpos_kernel(gt_disentangled_args a, const float *ds, size_t n, const unsigned long long *bad) {
    if (gt_check_failed(bad))
        return;
    GT_GRID_STRIDE(u, n) {
        size_t dim = (size_t)a.head_dim, t = (size_t)a.seq, d = u % dim, hr = u / dim;
        size_t rows = 2 * (size_t)a.span, r = hr % rows, h = hr / rows;
        float dpk = 0.0f, dpq = 0.0f;
        for (size_t b = 0; b < (size_t)a.batch; b++) {
            size_t keys = gt_dis_keys(&a, b), bh = b * (size_t)a.heads + h;
            for (size_t e = 0; e + 1 < 2 * t; e++) {  // delta = e - (T - 1)
                if ((size_t)a.rel_index[e] != r)
                    continue;
                for (size_t i = 0; i < t; i++) {
                    if (i + t - 1 < e || i + t - 1 - e >= keys)
                        continue;
                    size_t j = i + t - 1 - e;
                    float g = ds[(bh * t + i) * t + j];
                    dpk += g * gt_hd_load(a.q, gt_dis_at(&a.in, b, h, i) + d, a.dt);
                    dpq += g * gt_hd_load(a.k, gt_dis_at(&a.in, b, h, j) + d, a.dt);
                }
            }
        }
        size_t at = gt_dis_pos_at(&a, r, h) + d;
        if (a.dpos_k)
            gt_hd_store(a.dpos_k, at, dpk, a.dt);
        if (a.dpos_q)
            gt_hd_store(a.dpos_q, at, dpq, a.dt);
    }
}

// Rows (b, h, i), the checks, the state, the device check of key_lengths and the workspace.
gt_status dis_begin(gt_backend *be, const gt_disentangled_args *a, int backward, gt_cuda_backend_state **state,
                    size_t *rows, const unsigned long long **bad) {
    GT_TRY(gt_disentangled_check(a, backward));
    *rows = 0;
    *bad = NULL;
    if (a->batch == 0 || a->heads == 0 || a->seq == 0)
        return GT_OK;
    *rows = (size_t)a->batch * (size_t)a->heads * (size_t)a->seq;
    GT_TRY(gt_cuda_op_begin(be, state));
    size_t need = gt_cuda_disentangled_workspace_bytes(a, 1);
    if (!be->workspace || be->workspace_bytes < need)
        return GT_FAIL(GT_ERR_VALUE, "workspace: disentangled attention (batch %lld, heads %lld, seq %lld) needs "
                       "%zu bytes, got %zu", (long long)a->batch, (long long)a->heads, (long long)a->seq, need,
                       be->workspace ? be->workspace_bytes : (size_t)0);
    if (!a->key_lengths)
        return GT_OK;
    gt_cuda_op_error error = {GT_CUDA_CHECK_KEY_LENGTHS, 0, 0, a->seq, 0};
    GT_TRY(gt_cuda_check_entries(*state, a->key_lengths, (size_t)a->batch, error));
    *bad = scratch_words(*state);
    return GT_OK;
}

}  // namespace

// Two (B, H, T, T) f32 matrices: P M and scale dS.
size_t gt_cuda_disentangled_workspace_bytes(const gt_disentangled_args *args, int threads) {
    (void)threads;
    size_t n = 0;
    if (args->batch <= 0 || args->heads <= 0 || args->seq <= 0)
        return 0;
    if (__builtin_mul_overflow((size_t)args->batch, (size_t)args->heads, &n) ||
        __builtin_mul_overflow(n, (size_t)args->seq, &n) || __builtin_mul_overflow(n, (size_t)args->seq, &n) ||
        __builtin_mul_overflow(n, 2 * sizeof(float), &n))
        return SIZE_MAX;
    return n;
}

gt_status gt_cuda_disentangled_forward(gt_backend *be, const gt_disentangled_args *args) {
    gt_cuda_backend_state *state = NULL;
    const unsigned long long *bad = NULL;
    size_t rows = 0;
    GT_TRY(dis_begin(be, args, 0, &state, &rows, &bad));
    if (rows == 0)
        return GT_OK;
    float *pm = static_cast<float *>(be->workspace);
    size_t n = rows * (size_t)args->head_dim;
    cudaStream_t stream = stream_of(state);
    dis_probs_kernel<<<grid_for(rows, kDisThreads), kDisThreads, 0, stream>>>(*args, pm, rows, bad);
    GT_TRY(gt_cuda_check_launch("dis_probs_kernel launch"));
    dis_out_kernel<<<grid_for(n, kDisThreads), kDisThreads, 0, stream>>>(*args, pm, n, bad);
    return gt_cuda_check_launch("dis_out_kernel launch");
}

gt_status gt_cuda_disentangled_backward(gt_backend *be, const gt_disentangled_args *args) {
    gt_cuda_backend_state *state = NULL;
    const unsigned long long *bad = NULL;
    size_t rows = 0;
    GT_TRY(dis_begin(be, args, 1, &state, &rows, &bad));
    if (rows == 0)
        return GT_OK;
    float *pm = static_cast<float *>(be->workspace), *ds = pm + rows * (size_t)args->seq;
    size_t n = rows * (size_t)args->head_dim, pos = (size_t)args->heads * 2 * (size_t)args->span * (size_t)args->head_dim;
    cudaStream_t stream = stream_of(state);
    dis_ds_kernel<<<grid_for(rows, kDisThreads), kDisThreads, 0, stream>>>(*args, pm, ds, rows, bad);
    GT_TRY(gt_cuda_check_launch("dis_ds_kernel launch"));
    if (args->dq) {
        dis_dq_kernel<<<grid_for(n, kDisThreads), kDisThreads, 0, stream>>>(*args, ds, n, bad);
        GT_TRY(gt_cuda_check_launch("dis_dq_kernel launch"));
        dis_dkdv_kernel<<<grid_for(n, kDisThreads), kDisThreads, 0, stream>>>(*args, pm, ds, n, bad);
        GT_TRY(gt_cuda_check_launch("dis_dkdv_kernel launch"));
    }
    if (!args->dpos_k && !args->dpos_q)
        return GT_OK;
    dis_dpos_kernel<<<grid_for(pos, kDisThreads), kDisThreads, 0, stream>>>(*args, ds, pos, bad);
    return gt_cuda_check_launch("dis_dpos_kernel launch");
}
