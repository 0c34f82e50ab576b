#include "sim/sim_kernels.h"

#include "core/loss_mean.h"
#include "sim/sim_stream.h"
#include "train/grad_norm.h"
#include "train/optim8_cpu.h"
#include "train/optim_cpu.h"
#include "train/scaler.h"

typedef struct adamw_job {
    gt_numerics numerics;        /* exact or fast arithmetic */
    gt_adamw_scalars s;          /* the step's constants, copied at the launch */
    float *p;                    /* (n,) parameters */
    const float *g;              /* (n,) gradients */
    float *m, *v, *v_max;        /* (n,) moments; v_max only with amsgrad */
    size_t n;                    /* elements */
} adamw_job;

static gt_status run_adamw(void *args) {
    adamw_job *j = args;
    gt_adamw_cpu(j->numerics, &j->s, j->p, j->g, j->m, j->v, j->v_max, j->n);
    return GT_OK;
}

gt_status gt_sim_adamw(int index, gt_stream *stream, gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                       const float *g, float *m, float *v, float *v_max, size_t n) {
    adamw_job job = {numerics, *s, p, g, m, v, v_max, n};
    return n ? gt_sim_enqueue(index, stream, run_adamw, &job, sizeof job) : GT_OK;
}

typedef struct adamw8bit_job {
    gt_adamw8_scalars s;           /* the step's constants, copied at the launch */
    float *p;                      /* (n,) parameters */
    const float *g;                /* (n,) gradients */
    uint8_t *c1, *c2;              /* (n,) codes of the moments */
    float *absmax1, *absmax2;      /* (blocks,) their absmax per block */
    size_t n;                      /* elements */
} adamw8bit_job;

static gt_status run_adamw8bit(void *args) {
    adamw8bit_job *j = args;
    gt_adamw8bit_cpu(&j->s, j->p, j->g, j->c1, j->c2, j->absmax1, j->absmax2, j->n);
    return GT_OK;
}

gt_status gt_sim_adamw8bit(int index, gt_stream *stream, const gt_adamw8_scalars *s, float *p, const float *g,
                           uint8_t *c1, uint8_t *c2, float *absmax1, float *absmax2, size_t n) {
    adamw8bit_job job = {*s, p, g, c1, c2, absmax1, absmax2, n};
    return n ? gt_sim_enqueue(index, stream, run_adamw8bit, &job, sizeof job) : GT_OK;
}

typedef struct sgd_job {
    gt_sgd_scalars s;   /* the step's constants */
    float *p;           /* (n,) parameters */
    const float *g;     /* (n,) gradients */
    float *buf;         /* (n,) momentum buffer, or NULL */
    size_t n;           /* elements */
} sgd_job;

static gt_status run_sgd(void *args) {
    sgd_job *j = args;
    gt_sgd_cpu(&j->s, j->p, j->g, j->buf, j->n);
    return GT_OK;
}

gt_status gt_sim_sgd(int index, gt_stream *stream, const gt_sgd_scalars *s, float *p, const float *g,
                     float *buf, size_t n) {
    sgd_job job = {*s, p, g, buf, n};
    return n ? gt_sim_enqueue(index, stream, run_sgd, &job, sizeof job) : GT_OK;
}

typedef struct ema_job {
    float *ema;      /* (n,) shadow */
    float *p;        /* (n,) parameters (read by the average, exchanged by the swap) */
    float weight;    /* f32(1 - decay) */
    size_t n;        /* elements */
} ema_job;

static gt_status run_ema(void *args) {
    ema_job *j = args;
    gt_ema_cpu(j->ema, j->p, j->weight, j->n);
    return GT_OK;
}

static gt_status run_ema_swap(void *args) {
    ema_job *j = args;
    for (size_t i = 0; i < j->n; i++) {
        float kept = j->ema[i];
        j->ema[i] = j->p[i];
        j->p[i] = kept;
    }
    return GT_OK;
}

gt_status gt_sim_ema(int index, gt_stream *stream, float *ema, const float *p, float weight, size_t n) {
    ema_job job = {ema, (float *)p, weight, n};
    return n ? gt_sim_enqueue(index, stream, run_ema, &job, sizeof job) : GT_OK;
}

gt_status gt_sim_ema_swap(int index, gt_stream *stream, float *ema, float *p, size_t n) {
    ema_job job = {ema, p, 0.0f, n};
    return n ? gt_sim_enqueue(index, stream, run_ema_swap, &job, sizeof job) : GT_OK;
}

typedef struct sumsq_job {
    const float *x;   /* (n,) values */
    size_t n;         /* elements */
    double *out;      /* host result; the launching thread waits for it */
} sumsq_job;

static gt_status run_sumsq(void *args) {
    sumsq_job *j = args;
    return gt_grad_sumsq(j->x, j->n, j->out);
}

gt_status gt_sim_grad_sumsq(int index, gt_stream *stream, const float *x, size_t n, double *out) {
    *out = 0.0;
    if (n == 0)
        return GT_OK;
    sumsq_job job = {x, n, out};
    GT_TRY(gt_sim_enqueue(index, stream, run_sumsq, &job, sizeof job));
    return gt_sim_stream_synchronize(index, stream);
}

/* Queued: the worker writes the sum into device memory (the CPU's totals serve as its scratch). */
gt_status gt_sim_grad_sumsq_async(int index, gt_stream *stream, const float *x, size_t n, double *out,
                                  double *totals) {
    (void)totals;
    sumsq_job job = {x, n, out};
    return gt_sim_enqueue(index, stream, run_sumsq, &job, sizeof job);
}

typedef struct loss_job {
    const float *values;    /* (rows,) per-row losses, or an MSE's mean */
    int64_t rows;           /* their number */
    const int64_t *count;   /* rows that count, or NULL for an MSE */
    double *loss_sum;       /* device accumulator */
} loss_job;

static gt_status run_loss(void *args) {
    loss_job *j = args;
    *j->loss_sum += gt_loss_mean(j->values, j->rows, j->count);
    return GT_OK;
}

gt_status gt_sim_loss_accumulate(int index, gt_stream *stream, const float *values, int64_t rows,
                                 const int64_t *count, double *loss_sum) {
    loss_job job = {values, rows, count, loss_sum};
    return gt_sim_enqueue(index, stream, run_loss, &job, sizeof job);
}

typedef struct unscale_job {
    const gt_scaler *scaler;  /* device copy of the scaler state */
    float *grad;              /* (n,) gradients, unscaled in place */
    size_t n;                 /* elements */
    int *found_inf;           /* device flag, set to 1 on a non-finite element */
} unscale_job;

static gt_status run_unscale(void *args) {
    unscale_job *j = args;
    return gt_scaler_unscale_check(j->scaler, j->grad, j->n, j->found_inf);
}

gt_status gt_sim_unscale_check(int index, gt_stream *stream, const gt_scaler *scaler, float *grad, size_t n,
                               int *found_inf) {
    unscale_job job = {scaler, grad, n, found_inf};
    return n ? gt_sim_enqueue(index, stream, run_unscale, &job, sizeof job) : GT_OK;
}

typedef struct clip_job {
    float *grad;           /* (n,) gradients, clipped in place */
    size_t n;              /* elements */
    const double *sumsq;   /* device sum of squares, read when the job runs */
    double max_norm;       /* clipping threshold */
} clip_job;

static gt_status run_clip(void *args) {
    clip_job *j = args;
    return gt_grad_clip(j->grad, j->n, j->sumsq, j->max_norm);
}

gt_status gt_sim_grad_clip(int index, gt_stream *stream, float *grad, size_t n, const double *sumsq,
                           double max_norm) {
    clip_job job = {grad, n, sumsq, max_norm};
    return n ? gt_sim_enqueue(index, stream, run_clip, &job, sizeof job) : GT_OK;
}

typedef struct scaler_update_job {
    gt_scaler *scaler;       /* device scaler state, updated in place */
    const int *found_inf;    /* device flag, read when the job runs */
} scaler_update_job;

static gt_status run_scaler_update(void *args) {
    scaler_update_job *j = args;
    gt_scaler_update(j->scaler, *j->found_inf);
    return GT_OK;
}

gt_status gt_sim_scaler_update(int index, gt_stream *stream, gt_scaler *scaler, const int *found_inf) {
    scaler_update_job job = {scaler, found_inf};
    return gt_sim_enqueue(index, stream, run_scaler_update, &job, sizeof job);
}

/* The scalars of table `t` for the device's count now (the job runs in stream order). */
static const void *table_entry(const gt_update_table *t, size_t scalar_bytes) {
    return (const char *)t->entries + (size_t)(*t->count % t->ring) * t->stride * scalar_bytes;
}

typedef struct adamw_table_job {
    gt_numerics numerics;        /* exact or fast arithmetic */
    gt_update_table t;           /* where the constants and the skip flag are */
    float *p;                    /* (n,) parameters */
    const float *g;              /* (n,) gradients */
    float *m, *v, *v_max;        /* (n,) moments; v_max only with amsgrad */
    size_t n;                    /* elements */
} adamw_table_job;

static gt_status run_adamw_table(void *args) {
    adamw_table_job *j = args;
    if (*j->t.found_inf)
        return GT_OK;
    const gt_adamw_scalars *s = table_entry(&j->t, sizeof *s);
    gt_adamw_cpu(j->numerics, s, j->p, j->g, j->m, j->v, j->v_max, j->n);
    return GT_OK;
}

gt_status gt_sim_adamw_table(int index, gt_stream *stream, gt_numerics numerics, const gt_update_table *t,
                             float *p, const float *g, float *m, float *v, float *v_max, size_t n) {
    adamw_table_job job = {numerics, *t, p, g, m, v, v_max, n};
    return n ? gt_sim_enqueue(index, stream, run_adamw_table, &job, sizeof job) : GT_OK;
}

typedef struct sgd_table_job {
    gt_update_table t;  /* where the constants and the skip flag are */
    float *p;           /* (n,) parameters */
    const float *g;     /* (n,) gradients */
    float *buf;         /* (n,) momentum buffer, or NULL */
    size_t n;           /* elements */
} sgd_table_job;

static gt_status run_sgd_table(void *args) {
    sgd_table_job *j = args;
    if (*j->t.found_inf)
        return GT_OK;
    const gt_sgd_scalars *s = table_entry(&j->t, sizeof *s);
    gt_sgd_cpu(s, j->p, j->g, j->buf, j->n);
    return GT_OK;
}

gt_status gt_sim_sgd_table(int index, gt_stream *stream, const gt_update_table *t, float *p, const float *g,
                           float *buf, size_t n) {
    sgd_table_job job = {*t, p, g, buf, n};
    return n ? gt_sim_enqueue(index, stream, run_sgd_table, &job, sizeof job) : GT_OK;
}

typedef struct count_job {
    uint64_t *count;         /* device count of updates applied */
    const int *found_inf;    /* device flag, read when the job runs */
} count_job;

static gt_status run_count(void *args) {
    count_job *j = args;
    if (!*j->found_inf)
        ++*j->count;
    return GT_OK;
}

gt_status gt_sim_count_update(int index, gt_stream *stream, uint64_t *count, const int *found_inf) {
    count_job job = {count, found_inf};
    return gt_sim_enqueue(index, stream, run_count, &job, sizeof job);
}
