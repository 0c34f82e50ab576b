/* The CPU GEMM library on x86-64: oneDNN (onednn-cpu-gomp, GNU OpenMP like gputrain). Its kernels
 * are generated at run time for the CPU in hand, from SSE4.1 to AVX-512 and AMX, so one build
 * runs on every x86-64 CPU that NumPy runs on.
 * - f32: dnnl_sgemm, oneDNN's BLAS-like GEMM.
 * - bf16 on CPUs with AVX512_BF16 or AMX: a matmul primitive with bf16 inputs, f32 accumulation
 *   and an f32 or bf16 C (beta through a sum post-op). Primitives are made once per shape and
 *   kept in a small cache; their scratchpad is gputrain's (planned workspace), not oneDNN's.
 *   Given B as it lies, a primitive copies all of it into its kernels' blocked layout on every
 *   call, so the row blocks of a split GEMM can instead share one copy packed before them
 *   (gt_blas_pack_b): with 128-row blocks the copies took a third as long as the AMX products.
 * oneDNN runs a call single-threaded when it is made inside an active OpenMP region and sizes its
 * blocking by omp_get_max_threads(); every call here therefore runs with that set to 1 for the
 * calling task only (run_alone), so neither the bits nor the blocking depend on the pool.
 * Asynchronous signals are held off the calling thread for the call: oneDNN 2023.2's generated
 * f32 GEMM kernels point rsp into a heap buffer, so a signal frame pushed there (Ctrl-C, a
 * profiler's timer) corrupted the heap (oneDNN issue #4845, fixed upstream in 2026). */
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "ops/cpu_blas.h"

enum { MATMUL_CACHE_SLOTS = 64 };  /* distinct GEMM shapes kept as primitives */

/* What a matmul primitive is made for. */
typedef struct matmul_key {
    int64_t m, n, k;          /* sizes of op(A) (m, k) and op(B) (k, n) */
    int64_t lda, ldb, ldc;    /* leading dimensions (elements) */
    int trans_a, trans_b;     /* 1 when A / B are stored transposed */
    gt_dtype ab_dt, c_dt;     /* dtypes of A and B, and of C */
    float beta;               /* scale of the old C (0: not read) */
    int packed_b;             /* 1: B comes packed in the primitive's layout (gt_blas_pack_b) */
} matmul_key;

/* One cached primitive. */
typedef struct matmul_slot {
    matmul_key key;                  /* the shape it computes */
    dnnl_primitive_t primitive;      /* NULL while the slot is free */
    const_dnnl_memory_desc_t md[4];  /* A, B, C and scratchpad layouts (owned by primitive) */
    size_t scratch_bytes;            /* bytes of the scratchpad the primitive needs */
    dnnl_memory_desc_t plain_b;      /* packed_b: B's layout as it lies (owned), else NULL */
    dnnl_primitive_t pack;           /* packed_b: the reorder of plain_b into md[1], else NULL */
    int users;                       /* calls holding it now; never evicted while > 0 */
    uint64_t last_use;               /* tick of its last lookup (least recent is evicted) */
} matmul_slot;

static dnnl_engine_t engine;                 /* the CPU engine, made once */
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static matmul_slot cache[MATMUL_CACHE_SLOTS];  /* guarded by cache_lock */
static uint64_t cache_tick;                     /* guarded by cache_lock */

static void make_engine(void) { engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0); }

static gt_status dnnl_fail(dnnl_status_t status, const char *what) {
    return GT_FAIL(GT_ERR_RUNTIME, "oneDNN %s failed (dnnl_status_t %d)", what, (int)status);
}

/* fork() copies only the forking thread: the primitive cache's lock is taken around it, so a
 * DataLoader worker forked while another thread held it can still run a GEMM. */
static void lock_cache(void) { pthread_mutex_lock(&cache_lock); }
static void unlock_cache(void) { pthread_mutex_unlock(&cache_lock); }
static void lock_cache_around_fork(void) { pthread_atfork(lock_cache, unlock_cache, unlock_cache); }

void gt_blas_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, lock_cache_around_fork);
}

static int isa_has(dnnl_cpu_isa_t isa) {
    return ((unsigned)dnnl_get_effective_cpu_isa() & (unsigned)isa) == (unsigned)isa;
}

int gt_blas_native(gt_dtype ab_dt, gt_dtype c_dt, float alpha) {
    if (ab_dt == GT_F32)
        return c_dt == GT_F32;
    /* bf16 pays only with AVX512_BF16/AMX (at plain AVX-512 oneDNN's bf16 GEMM ran 160 GFLOP/s
     * here against 420 for widening + sgemm, benchmarks/README.md). f16 GEMMs are widened. */
    return ab_dt == GT_BF16 && (c_dt == GT_F32 || c_dt == GT_BF16) && alpha == 1.0f &&
           isa_has(dnnl_cpu_isa_avx512_core_bf16);
}

int64_t gt_blas_min_part(const gt_blas_gemm *g) {
    /* Below AVX-512, sgemm with a transposed A ran at half speed on parts of 256 rows or fewer
     * (the MLP's weight gradients, k = 256, AVX2: 59-79 GFLOP/s against 117-122 whole or in
     * 512-row parts; benchmarks/gemm_split_parts.c). At AVX-512, 128-wide parts cost <= 10%. */
    if (g->trans_a && g->ab_dt == GT_F32 && !isa_has(dnnl_cpu_isa_avx512_core))
        return 512;
    return 128;
}

static dnnl_data_type_t dnnl_type(gt_dtype dt) {
    return dt == GT_BF16 ? dnnl_bf16 : dt == GT_F16 ? dnnl_f16 : dnnl_f32;
}

static matmul_key key_of(const gt_blas_gemm *g) {
    matmul_key key;
    memset(&key, 0, sizeof key);  /* padding too: keys are compared with memcmp */
    key.m = g->m, key.n = g->n, key.k = g->k;
    key.lda = g->lda, key.ldb = g->ldb, key.ldc = g->ldc;
    key.trans_a = g->trans_a, key.trans_b = g->trans_b;
    key.ab_dt = g->ab_dt, key.c_dt = g->c_dt, key.beta = g->beta;
    key.packed_b = g->packed_b;
    return key;
}

/* A row-major 2-D layout (rows, cols) of dtype dt, stored transposed when `trans`. */
static dnnl_status_t plain_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld,
                              int trans, gt_dtype dt) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    return dnnl_memory_desc_create_with_strides(md, 2, dims, dnnl_type(dt), strides);
}

/* The attributes of every primitive: scratchpad given by gputrain, beta as a sum post-op. */
static dnnl_status_t make_attr(dnnl_primitive_attr_t *attr, float beta) {
    dnnl_status_t status = dnnl_primitive_attr_create(attr);
    if (status == dnnl_success)
        status = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
    if (status == dnnl_success && beta != 0.0f) {
        dnnl_post_ops_t post_ops;
        status = dnnl_post_ops_create(&post_ops);
        if (status == dnnl_success) {
            status = dnnl_post_ops_append_sum(post_ops, beta, 0, dnnl_data_type_undef);
            if (status == dnnl_success)
                status = dnnl_primitive_attr_set_post_ops(*attr, post_ops);
            dnnl_post_ops_destroy(post_ops);
        }
    }
    return status;
}

/* Frees what a slot holds. */
static void free_slot(matmul_slot *slot) {
    dnnl_primitive_destroy(slot->pack);
    dnnl_memory_desc_destroy(slot->plain_b);
    dnnl_primitive_destroy(slot->primitive);
    slot->pack = NULL, slot->plain_b = NULL, slot->primitive = NULL;
}

/* The reorder that packs B as it lies into the layout of a packed_b slot's primitive; left NULL
 * when it would need a scratchpad (gputrain plans none for it: B is then not shared). */
static gt_status make_pack(const matmul_key *k, matmul_slot *slot) {
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_status_t status = plain_md(&slot->plain_b, k->k, k->n, k->ldb, k->trans_b, k->ab_dt);
    if (status == dnnl_success)
        status = make_attr(&attr, 0.0f);
    if (status == dnnl_success)
        status = dnnl_reorder_primitive_desc_create(&pd, slot->plain_b, engine, slot->md[1],
                                                    engine, attr);
    if (status == dnnl_success && dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(
                                      pd, dnnl_query_scratchpad_md, 0)) == 0)
        status = dnnl_primitive_create(&slot->pack, pd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    if (status != dnnl_success) {
        free_slot(slot);
        return dnnl_fail(status, "B packing reorder creation");
    }
    return GT_OK;
}

/* Makes the matmul primitive of key `k` into `slot` (called with max threads = 1). */
static gt_status make_matmul(const matmul_key *k, matmul_slot *slot) {
    dnnl_memory_desc_t md_a = NULL, md_b = NULL, md_c = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t status = plain_md(&md_a, k->m, k->k, k->lda, k->trans_a, k->ab_dt);
    dnnl_dims_t dims_b = {k->k, k->n};
    if (status == dnnl_success && k->packed_b)
        status = dnnl_memory_desc_create_with_tag(&md_b, 2, dims_b, dnnl_type(k->ab_dt),
                                                  dnnl_format_tag_any);
    else if (status == dnnl_success)
        status = plain_md(&md_b, k->k, k->n, k->ldb, k->trans_b, k->ab_dt);
    if (status == dnnl_success)
        status = plain_md(&md_c, k->m, k->n, k->ldc, 0, k->c_dt);
    if (status == dnnl_success)
        status = make_attr(&attr, k->beta);
    if (status == dnnl_success)
        status = dnnl_matmul_primitive_desc_create(&pd, engine, md_a, md_b, NULL, md_c, attr);
    if (status == dnnl_success)
        status = dnnl_primitive_create(&slot->primitive, pd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    dnnl_memory_desc_destroy(md_a), dnnl_memory_desc_destroy(md_b), dnnl_memory_desc_destroy(md_c);
    if (status != dnnl_success)
        return dnnl_fail(status, "matmul primitive creation");
    const_dnnl_primitive_desc_t own_pd;
    dnnl_primitive_get_primitive_desc(slot->primitive, &own_pd);
    const dnnl_query_t queries[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                                     dnnl_query_scratchpad_md};
    for (int i = 0; i < 4; i++)
        slot->md[i] = dnnl_primitive_desc_query_md(own_pd, queries[i], 0);
    slot->scratch_bytes = dnnl_memory_desc_get_size(slot->md[3]);
    slot->key = *k;
    return k->packed_b ? make_pack(k, slot) : GT_OK;
}

/* The slot to make a new primitive in: a free one, else the least recently used idle one. */
static matmul_slot *slot_to_fill(void) {
    matmul_slot *victim = NULL;
    for (int i = 0; i < MATMUL_CACHE_SLOTS; i++) {
        matmul_slot *slot = &cache[i];
        if (!slot->primitive)
            return slot;
        if (slot->users == 0 && (!victim || slot->last_use < victim->last_use))
            victim = slot;
    }
    if (victim)
        free_slot(victim);
    return victim;
}

/* The cached primitive of `key`, made if needed, with one more user (release_matmul). */
static gt_status acquire_matmul(const matmul_key *key, matmul_slot **out) {
    if (pthread_once(&engine_once, make_engine) != 0 || engine_status != dnnl_success)
        return dnnl_fail(engine_status, "CPU engine creation");
    gt_status status = GT_OK;
    pthread_mutex_lock(&cache_lock);
    matmul_slot *found = NULL;
    for (int i = 0; i < MATMUL_CACHE_SLOTS && !found; i++)
        if (cache[i].primitive && memcmp(&cache[i].key, key, sizeof *key) == 0)
            found = &cache[i];
    if (!found) {
        found = slot_to_fill();
        if (!found)
            status = GT_FAIL(GT_ERR_RUNTIME, "oneDNN matmul cache: all %d primitives in use",
                             MATMUL_CACHE_SLOTS);
        else if ((status = make_matmul(key, found)) != GT_OK)
            found = NULL;
    }
    if (found) {
        found->users++;
        found->last_use = ++cache_tick;
    }
    pthread_mutex_unlock(&cache_lock);
    *out = found;
    return status;
}

static void release_matmul(matmul_slot *slot) {
    pthread_mutex_lock(&cache_lock);
    slot->users--;
    pthread_mutex_unlock(&cache_lock);
}

/* Runs the cached primitive of g on A, B, C and the scratchpad. */
static gt_status execute_matmul(const gt_blas_gemm *g, void *scratch) {
    matmul_key key = key_of(g);
    matmul_slot *slot;
    GT_TRY(acquire_matmul(&key, &slot));
    void *handles[4] = {(void *)g->a, (void *)g->b, g->c, scratch};
    const int arg_ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[4];
    dnnl_stream_t stream = NULL;
    int created = 0;
    dnnl_status_t status = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
    while (status == dnnl_success && created < 4) {
        args[created].arg = arg_ids[created];
        status = dnnl_memory_create(&args[created].memory, slot->md[created], engine,
                                    handles[created]);
        created += status == dnnl_success;
    }
    if (status == dnnl_success)
        status = dnnl_primitive_execute(slot->primitive, stream, 4, args);
    if (status == dnnl_success)
        status = dnnl_stream_wait(stream);
    for (int i = 0; i < created; i++)
        dnnl_memory_destroy(args[i].memory);
    dnnl_stream_destroy(stream);
    release_matmul(slot);
    return status == dnnl_success ? GT_OK : dnnl_fail(status, "bf16 matmul");
}

/* Packs B as it lies (g->b) into `packed` with the reorder of g's packed_b primitive. */
static gt_status pack_b(const gt_blas_gemm *g, void *packed) {
    gt_blas_gemm packing = *g;
    packing.packed_b = 1;
    matmul_key key = key_of(&packing);
    matmul_slot *slot;
    GT_TRY(acquire_matmul(&key, &slot));
    dnnl_memory_t from = NULL, to = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_status_t status = slot->pack ? dnnl_success : dnnl_unimplemented;
    if (status == dnnl_success)
        status = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
    if (status == dnnl_success)
        status = dnnl_memory_create(&from, slot->plain_b, engine, (void *)g->b);
    if (status == dnnl_success)
        status = dnnl_memory_create(&to, slot->md[1], engine, packed);
    if (status == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
        status = dnnl_primitive_execute(slot->pack, stream, 2, args);
    }
    if (status == dnnl_success)
        status = dnnl_stream_wait(stream);
    dnnl_memory_destroy(from), dnnl_memory_destroy(to);
    dnnl_stream_destroy(stream);
    release_matmul(slot);
    return status == dnnl_success ? GT_OK : dnnl_fail(status, "B packing");
}

/* The packed_b primitive of `part` (release_matmul after). */
static gt_status acquire_packed(const gt_blas_gemm *part, matmul_slot **out) {
    gt_blas_gemm packed = *part;
    packed.packed_b = 1;
    matmul_key key = key_of(&packed);
    return acquire_matmul(&key, out);
}

/* Bytes of one B packed for all parts: 0 unless every part's primitive reads the same layout
 * and it is not B's own. */
static gt_status shared_b_bytes(const gt_blas_gemm *parts, int64_t count, size_t *bytes) {
    *bytes = 0;
    if (count < 2 || parts[0].ab_dt == GT_F32)
        return GT_OK;
    matmul_slot *first;
    GT_TRY(acquire_packed(&parts[0], &first));
    int shared = first->pack && !dnnl_memory_desc_equal(first->md[1], first->plain_b);
    gt_status status = GT_OK;
    for (int64_t i = 1; i < count && shared && status == GT_OK; i++) {
        matmul_slot *slot;
        status = acquire_packed(&parts[i], &slot);
        if (status == GT_OK) {
            shared = slot->pack && dnnl_memory_desc_equal(slot->md[1], first->md[1]);
            release_matmul(slot);
        }
    }
    *bytes = shared && status == GT_OK ? dnnl_memory_desc_get_size(first->md[1]) : 0;
    release_matmul(first);
    return status;
}

static gt_status sgemm(const gt_blas_gemm *g) {
    dnnl_status_t status = dnnl_sgemm(g->trans_a ? 'T' : 'N', g->trans_b ? 'T' : 'N', g->m,
                                      g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb, g->beta,
                                      g->c, g->ldc);
    return status == dnnl_success ? GT_OK : dnnl_fail(status, "sgemm");
}

static gt_status scratch_bytes(const gt_blas_gemm *g, size_t *bytes) {
    *bytes = 0;
    if (g->ab_dt == GT_F32 || g->m == 0 || g->n == 0 || g->k == 0)
        return GT_OK;
    matmul_key key = key_of(g);
    matmul_slot *slot;
    GT_TRY(acquire_matmul(&key, &slot));
    *bytes = slot->scratch_bytes;
    release_matmul(slot);
    return GT_OK;
}

static gt_status gemm_run(const gt_blas_gemm *g, void *scratch) {
    if (g->ab_dt == GT_F32)
        return sgemm(g);
    return execute_matmul(g, scratch);
}

/* fn(g, scratch) with every asynchronous signal blocked on the calling thread (they are
 * delivered when it returns, or to another thread meanwhile). Faults stay unblocked. */
static gt_status without_signals(gt_status (*fn)(const gt_blas_gemm *, void *), const gt_blas_gemm *g,
                                 void *scratch) {
    sigset_t held, before;
    sigfillset(&held);
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        sigdelset(&held, faults[i]);
    pthread_sigmask(SIG_BLOCK, &held, &before);
    gt_status status = fn(g, scratch);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    return status;
}

/* fn(g, scratch) with omp_get_max_threads() = 1 for the calling task only (inside an active
 * region the setting ends with the region; outside one, a one-thread region scopes it), and
 * without signals. */
static gt_status run_alone(gt_status (*fn)(const gt_blas_gemm *, void *), const gt_blas_gemm *g,
                           void *scratch) {
    if (omp_in_parallel() || omp_get_max_threads() == 1) {
        omp_set_num_threads(1);
        return without_signals(fn, g, scratch);
    }
    gt_status status = GT_OK;
#pragma omp parallel num_threads(1)
    {
        omp_set_num_threads(1);
        status = without_signals(fn, g, scratch);
    }
    return status;
}

static gt_status scratch_bytes_fn(const gt_blas_gemm *g, void *bytes) {
    return scratch_bytes(g, (size_t *)bytes);
}

gt_status gt_blas_scratch_bytes(const gt_blas_gemm *g, size_t *bytes) {
    return run_alone(scratch_bytes_fn, g, bytes);
}

gt_status gt_blas_gemm_run(const gt_blas_gemm *g, void *scratch) {
    return run_alone(gemm_run, g, scratch);
}

/* shared_b_bytes through run_alone: `query` carries the part count and the result. */
typedef struct shared_b_query {
    int64_t count;  /* parts */
    size_t bytes;   /* the answer */
} shared_b_query;

static gt_status shared_b_bytes_fn(const gt_blas_gemm *parts, void *query) {
    shared_b_query *q = query;
    return shared_b_bytes(parts, q->count, &q->bytes);
}

gt_status gt_blas_shared_b_bytes(const gt_blas_gemm *parts, int64_t count, size_t *bytes) {
    shared_b_query query = {count, 0};
    gt_status status = run_alone(shared_b_bytes_fn, parts, &query);
    *bytes = query.bytes;
    return status;
}

gt_status gt_blas_pack_b(const gt_blas_gemm *g, void *packed) {
    return run_alone(pack_b, g, packed);
}

int gt_blas_wants_dense_c(const gt_blas_gemm *g) {
    /* oneDNN 3.2's brgemm matmul takes no C with rows ldc apart: a bf16 block (B transposed, as
     * in every forward GEMM) falls back to gemm:jit, 10-18% slower at M = 256 on AVX512_BF16
     * (benchmarks/README.md, the LoRA step). With B as it lies its block is strided too and
     * stays on gemm:jit either way, so only B transposed gains. */
    return g->ab_dt != GT_F32 && g->trans_b && g->ldc != g->n;
}

const char *gt_blas_name(void) { return "onednn"; }

const char *gt_blas_config(void) {
    static char text[96];
    const dnnl_version_t *v = dnnl_version();
    snprintf(text, sizeof text, "oneDNN %d.%d.%d (%s), GNU OpenMP", v->major, v->minor, v->patch,
             v->hash);
    return text;
}

const char *gt_blas_kernel(void) {
    static const struct { dnnl_cpu_isa_t isa; const char *name; } levels[] = {
        {dnnl_cpu_isa_avx512_core_amx_fp16, "avx512_core_amx_fp16"},
        {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
        {dnnl_cpu_isa_avx512_core_fp16, "avx512_core_fp16"},
        {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
        {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
        {dnnl_cpu_isa_avx512_core, "avx512_core"},
        {dnnl_cpu_isa_avx2_vnni_2, "avx2_vnni_2"},
        {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
        {dnnl_cpu_isa_avx2, "avx2"},
        {dnnl_cpu_isa_avx, "avx"},
        {dnnl_cpu_isa_sse41, "sse41"},
    };
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (isa_has(levels[i].isa))
            return levels[i].name;
    return "none (reference kernels)";
}
