#include "sim/sim_ops.h"

#include <stdlib.h>

#include "ops/cpu_ops.h"
#include "sim/sim_stream.h"

/* The CPU backend the worker runs an op with: the sim backend's workspace, CPU ops. */
static gt_backend cpu_view(const gt_backend *be) {
    gt_backend cpu = {gt_cpu_ops(), gt_cpu_device(), be->workspace, be->workspace_bytes, NULL};
    return cpu;
}

/* Queues `fn` with a copy of the job on the backend's stream; with `wait`, also waits for it
 * (and for the stream's earlier work). */
static gt_status launch(gt_backend *be, gt_sim_job_fn fn, const void *job, size_t bytes, int wait) {
    const gt_sim_backend_state *state = be->impl;
    GT_TRY(gt_sim_enqueue(state->index, state->stream, fn, job, bytes));
    return wait ? gt_sim_stream_synchronize(state->index, state->stream) : GT_OK;
}

/* A job's fields, its initialisation from the op's arguments, and the CPU call's arguments: P
 * parameters are copied, A argument structs are copied by value (the caller's may be gone when
 * the worker runs the job). */
#define SIM_FIELD(type, name) type name;
#define SIM_INIT_P(type, name) , .name = name
#define SIM_INIT_A(type, name) , .name = *name
#define SIM_CALL_P(type, name) , j->name
#define SIM_CALL_A(type, name) , &j->name

/* For each op of GT_OP_LIST but the queries (the table points at the CPU's): its job (the CPU
 * backend over this backend's workspace and the op's arguments), the worker's run_<op> and the
 * table's sim_<op>, which queues the job (and waits for it when the op's kind is WAIT). */
#define SIM_QUERY(kind, name, params, skip)
#define SIM_LAUNCH(kind, name, params, skip)                                                     \
    typedef struct name##_job {                                                                  \
        gt_backend cpu;                          /* the CPU backend */                           \
        params(SIM_FIELD, SIM_FIELD)             /* the op's arguments */                        \
    } name##_job;                                                                                \
    _Static_assert(sizeof(name##_job) <= GT_SIM_ARGS_BYTES, "the " #name " job fits a queue entry"); \
    static gt_status run_##name(void *p) {                                                       \
        name##_job *j = p;                                                                       \
        return gt_cpu_##name(&j->cpu params(SIM_CALL_P, SIM_CALL_A));                            \
    }                                                                                            \
    static gt_status sim_##name(gt_backend *be params(GT_OP_DECL_P, GT_OP_DECL_A)) {             \
        if (GT_OP_##skip)                                                                        \
            return GT_OK;                                                                        \
        name##_job job = {.cpu = cpu_view(be) params(SIM_INIT_P, SIM_INIT_A)};                   \
        return launch(be, run_##name, &job, sizeof job, GT_OP_##kind == GT_OP_WAIT);             \
    }
#define SIM_OP(kind, name, params, skip) GT_OP_SELECT(kind, SIM_QUERY, SIM_LAUNCH)(kind, name, params, skip)
GT_OP_LIST(SIM_OP)

#define SIM_ENTRY(kind, name, params, skip) .name = GT_OP_SELECT(kind, gt_cpu_##name, sim_##name),
static const gt_ops sim_ops = {
    .name = "sim",
    GT_OP_LIST(SIM_ENTRY)
};

const gt_ops *gt_sim_ops(void) { return &sim_ops; }

gt_status gt_sim_backend_init(gt_backend *be, int index, gt_stream *stream) {
    *be = (gt_backend){0};
    if (index < 0 || index >= GT_SIM_DEVICES)
        return GT_FAIL(GT_ERR_VALUE, "device: 'sim:%d' does not exist (%d simulated devices)", index,
                       GT_SIM_DEVICES);
    gt_sim_backend_state *state = calloc(1, sizeof *state);
    if (!state)
        return GT_FAIL(GT_ERR_OOM, "sim: out of host memory for a backend state");
    state->index = index;
    state->stream = stream;
    be->ops = &sim_ops;
    be->device = (gt_device){GT_DEVICE_SIM, index};
    be->impl = state;
    return GT_OK;
}

void gt_sim_backend_release(gt_backend *be) {
    if (!be->impl)
        return;
    gt_sim_backend_state *state = be->impl;
    gt_sim_stream_synchronize(state->index, state->stream);
    gt_clear_error();
    free(state);
    be->impl = NULL;
}
