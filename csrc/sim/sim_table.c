#include "sim/sim.h"

#include <string.h>

#include "sim/sim_comm.h"
#include "sim/sim_kernels.h"
#include "sim/sim_memory.h"
#include "sim/sim_ops.h"
#include "sim/sim_stream.h"

static int device_count(void) { return GT_SIM_DEVICES; }

typedef struct copy_job {
    void *dst;         /* destination */
    const void *src;   /* source; NULL for a fill */
    int value;         /* fill byte */
    size_t bytes;      /* length */
} copy_job;

static gt_status run_copy(void *args) {
    copy_job *j = args;
    if (j->src)
        memcpy(j->dst, j->src, j->bytes);
    else
        memset(j->dst, j->value, j->bytes);
    return GT_OK;
}

static gt_status copy_async(int index, gt_stream *stream, void *dst, const void *src, size_t bytes) {
    copy_job job = {dst, src, 0, bytes};
    if (bytes && (!dst || !src))
        return GT_FAIL(GT_ERR_VALUE, "copy: NULL pointer for %zu bytes", bytes);
    return bytes ? gt_sim_enqueue(index, stream, run_copy, &job, sizeof job) : GT_OK;
}

/* A blocking copy: queued on the default stream, then waited for (cudaMemcpy's ordering). */
static gt_status copy(int index, void *dst, const void *src, size_t bytes) {
    GT_TRY(copy_async(index, NULL, dst, src, bytes));
    return gt_sim_stream_synchronize(index, NULL);
}

static gt_status fill(int index, void *dst, int value, size_t bytes) {
    copy_job job = {dst, NULL, value, bytes};
    if (bytes == 0)
        return GT_OK;
    GT_TRY(gt_sim_enqueue(index, NULL, run_copy, &job, sizeof job));
    return gt_sim_stream_synchronize(index, NULL);
}

static const gt_device_backend sim_table = {
    .name = "sim",
    .device_count = device_count,
    .malloc = gt_sim_malloc,
    .free = gt_sim_free,
    .mem_get_info = gt_sim_mem_get_info,
    .memcpy = copy,
    .memset = fill,
    .memcpy_async = copy_async,
    .poison = gt_sim_poison,
    .stream_create = gt_sim_stream_create,
    .stream_destroy = gt_sim_stream_destroy,
    .stream_synchronize = gt_sim_stream_synchronize,
    .stream_wait_event = gt_sim_stream_wait_event,
    .event_create = gt_sim_event_create,
    .event_destroy = gt_sim_event_destroy,
    .event_record = gt_sim_event_record,
    .event_query = gt_sim_event_query,
    .event_synchronize = gt_sim_event_synchronize,
    .stream_native = gt_sim_stream_native,
    .adamw = gt_sim_adamw,
    .sgd = gt_sim_sgd,
    .ema = gt_sim_ema,
    .ema_swap = gt_sim_ema_swap,
    .grad_sumsq = gt_sim_grad_sumsq,
    .scaler_unscale_check = gt_sim_unscale_check,
    .backend_init = gt_sim_backend_init,
    .backend_release = gt_sim_backend_release,
    .backend_scratch_bytes = 0,  /* its state is host memory */
    .stream_from_native = gt_sim_stream_from_native,
    .pointer_device = gt_sim_pointer_device,
    .grad_sumsq_async = gt_sim_grad_sumsq_async,
    .loss_accumulate = gt_sim_loss_accumulate,
    .grad_clip = gt_sim_grad_clip,
    .scaler_update = gt_sim_scaler_update,
    .allreduce_sum = gt_sim_allreduce_sum,
    .broadcast = gt_sim_broadcast,
    .allgather = gt_sim_allgather,
    .adamw_table = gt_sim_adamw_table,
    .sgd_table = gt_sim_sgd_table,
    .count_update = gt_sim_count_update,
    .adamw8bit = gt_sim_adamw8bit,
};

void gt_sim_install(void) { gt_device_backend_install(GT_DEVICE_SIM, &sim_table); }
