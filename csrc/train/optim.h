/* The fused optimizer: AdamW or SGD over a list of fp32 parameter slices, one pass over the
 * parameter, gradient and state memory per step.
 *
 * The state (AdamW: exp_avg, exp_avg_sq [, max_exp_avg_sq]; SGD: momentum_buffer) lives in
 * arenas the optimizer owns, packed in parameter order, so parameters that are adjacent in
 * memory (a model's parameter and gradient arenas) merge into one run that the update walks
 * once. With cpu_offload_fraction f, the state of the last f of the elements (and an fp32
 * master copy of those parameters) lives in pinned host memory and is updated by CPU threads
 * while the device updates the rest (see train/offload.h); the result is bit-identical for
 * every f.
 *
 * Typical use by the training step:
 *     gt_optimizer_set_hparams(opt, g, &hp);   // scheduler: lr per group, between steps
 *     gt_grad_norm_l2(...) or gt_optimizer_grad_norm(opt, &norm);
 *     gt_optimizer_step(opt, gt_clip_coef(max_norm, norm) * unscale);
 */
#ifndef GT_OPTIM_H
#define GT_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/adamw.h"
#include "core/device_backend.h"
#include "core/status.h"

typedef enum gt_optim_kind {
    GT_OPTIM_ADAMW = 0,  /* torch.optim.AdamW */
    GT_OPTIM_SGD = 1,    /* torch.optim.SGD */
    GT_OPTIM_ADAMW8BIT = 2,  /* bitsandbytes.optim.AdamW8bit: 8-bit blockwise moments (train/optim8.h) */
} gt_optim_kind;

/* State arrays ("slots") per parameter, named as in PyTorch's state_dict. */
typedef enum gt_optim_slot {
    GT_SLOT_EXP_AVG = 0,         /* AdamW first moment */
    GT_SLOT_EXP_AVG_SQ = 1,      /* AdamW second moment */
    GT_SLOT_MAX_EXP_AVG_SQ = 2,  /* AdamW running max of the second moment (amsgrad) */
    GT_SLOT_MOMENTUM = 3,        /* SGD momentum buffer */
    GT_SLOT_COUNT
} gt_optim_slot;

/* Hyperparameters of one parameter group (float64, as Python gives them). */
typedef struct gt_optim_hparams {
    double lr;            /* learning rate, >= 0 */
    double weight_decay;  /* AdamW: decoupled decay; SGD: L2 penalty; >= 0 */
    double beta1;         /* AdamW first-moment decay, in [0, 1) */
    double beta2;         /* AdamW second-moment decay, in [0, 1) */
    double eps;           /* AdamW denominator term, > 0 */
    double momentum;      /* SGD momentum, >= 0 */
    double dampening;     /* SGD dampening */
    int amsgrad;          /* AdamW: 1 for AMSGrad */
    int nesterov;         /* SGD: 1 for Nesterov momentum (momentum > 0, dampening 0) */
    int maximize;         /* 1: maximise the objective */
} gt_optim_hparams;

/* One parameter the optimizer updates. */
typedef struct gt_optim_param_desc {
    float *param;   /* (numel,) fp32 values on the optimizer's device */
    float *grad;    /* (numel,) fp32 gradient on the device, or NULL: skipped by steps */
    size_t numel;   /* number of elements */
    size_t group;   /* index of its hyperparameter group */
} gt_optim_param_desc;

typedef struct gt_optimizer_config {
    gt_optim_kind kind;           /* AdamW or SGD */
    gt_numerics numerics;         /* AdamW arithmetic (SGD has one) */
    gt_device device;             /* where params and grads live: cpu or an accelerator */
    double cpu_offload_fraction;  /* 0 <= f <= 1: share of elements whose state is on the host */
    size_t offload_chunk_numel;   /* elements per staging chunk; 0 = 1 Mi elements */
    gt_stream *compute_stream;    /* accelerator: the training step's stream (NULL = default) */
    int zero_size;                /* ZeRO-1 (train/zero.h): the params are this rank's shard of a
                                     model's parameters sharded over zero_size ranks; 0: not sharded */
    int zero_rank;                /* ZeRO-1: the rank whose shard they are, in [0, zero_size) */
    size_t min_8bit_size;         /* AdamW8bit: parameters with fewer elements keep float32 moments */
} gt_optimizer_config;

typedef struct gt_optimizer gt_optimizer;

/* Validates the hyperparameters of `kind`, naming the offending argument. */
gt_status gt_optim_hparams_check(gt_optim_kind kind, const gt_optim_hparams *hp);

/* Builds an optimizer and allocates all of its state (zeros) from the allocator: the device
 * share in `config->device`'s pool, the offloaded share, master copy and staging in the pinned
 * pool. Parameters with numel 0 are allowed and never touched. */
gt_status gt_optimizer_create(const gt_optimizer_config *config, const gt_optim_hparams *groups,
                              size_t num_groups, const gt_optim_param_desc *params,
                              size_t num_params, gt_optimizer **out);

/* Frees the optimizer and its arenas. NULL is ignored. */
void gt_optimizer_destroy(gt_optimizer *opt);

/* Replaces the hyperparameters of group `group` (validated). amsgrad cannot be turned on, nor
 * SGD momentum on or off, after creation (the state would be missing). */
gt_status gt_optimizer_set_hparams(gt_optimizer *opt, size_t group, const gt_optim_hparams *hp);
gt_status gt_optimizer_get_hparams(const gt_optimizer *opt, size_t group, gt_optim_hparams *out);

/* Points parameter `index` at a gradient (NULL: the parameter is skipped by steps). */
gt_status gt_optimizer_set_grad(gt_optimizer *opt, size_t index, float *grad);

/* One update of every parameter whose gradient is set; each gradient element is multiplied by
 * `grad_coef` in fp32 as it is read (the clip coefficient, times any unscale factor; gradients
 * are not written). Synchronous: parameters are updated when it returns. */
gt_status gt_optimizer_step(gt_optimizer *opt, float grad_coef);

/* Deferred steps (TrainStep(sync=False) with a loss scaler) unresolved at most. */
#define GT_OPTIM_RING 8

/* Bytes of device memory a deferred step may hand the host as its result (the step's record). */
#define GT_OPTIM_RESULT_BYTES 64

/* Queues one update of every parameter whose gradient is set (grad_coef 1) on the compute stream
 * of an accelerator, with nothing decided on the host: the update is skipped when *found_inf
 * (device memory, set by the work queued before) is nonzero when it runs, and its constants come
 * from a table copied in with it, indexed by the device's count of updates applied (AdamW's bias
 * corrections, SGD's first step, the lr). Row j of `lrs` ((GT_OPTIM_RING, num_groups), or NULL
 * for each group's lr now) is each group's lr for the update j updates after the resolved ones.
 * The host's step counts do not move until gt_optimizer_resolve; until then gt_optimizer_step and
 * gt_optimizer_set_param_step refuse. Needs an accelerator optimizer that may defer (every one
 * with its whole state on the device and not sharded reserves the count and the table in its
 * device arena, gt_optimizer_plan counting them), one step count per group, and fewer than
 * GT_OPTIM_RING unresolved steps (GT_ERR_VALUE otherwise). `result_bytes` of device memory at
 * `result` are handed to the host behind the update (gt_optimizer_deferred_result). */
gt_status gt_optimizer_step_deferred(gt_optimizer *opt, const int *found_inf, const double *lrs,
                                     const void *result, size_t result_bytes);

/* The checks of gt_optimizer_step_deferred, before a step computes anything: GT_ERR_VALUE naming
 * what stops this optimizer from deferring a step with these lrs (NULL, or lrs_len entries). */
gt_status gt_optimizer_check_deferred(gt_optimizer *opt, const double *lrs, size_t lrs_len);

/* The oldest unresolved deferred step: `result_bytes` (<= GT_OPTIM_RESULT_BYTES) of device memory
 * at `result` were copied, behind its update, into its row of a pinned ring (allocated with the
 * table and counted by gt_optimizer_plan), and an event recorded after that copy. With `wait`,
 * waits for that event (one host sync); without, only asks whether it completed (*done). Once
 * done, copies the row's bytes to `out`. The caller then resolves the step. */
gt_status gt_optimizer_deferred_result(gt_optimizer *opt, int wait, void *out, int *done);

/* Resolves the oldest unresolved deferred step, whose work must have run (the caller read its inf
 * flag, or waited for an event recorded after it: its table's host source is reused
 * GT_OPTIM_RING steps later): `applied` is 1 when its update ran (the flag was 0), which advances
 * the step counts of the parameters with a gradient and num_steps. */
gt_status gt_optimizer_resolve(gt_optimizer *opt, int applied);

/* Deferred steps queued and not yet resolved. */
size_t gt_optimizer_pending(const gt_optimizer *opt);

/* Queues the copies of the offloaded share's gradients (its first two staging chunks) on the
 * compute stream, behind the backward that wrote them, for the next gt_optimizer_step; the
 * caller's next wait for that stream covers them. gt_optimizer_unstage forgets them when no
 * step follows (a skipped or failed training step). No-op without an offloaded share. */
gt_status gt_optimizer_prefetch(gt_optimizer *opt);
void gt_optimizer_unstage(gt_optimizer *opt);

/* Waits until the device share of the steps queued so far has finished (an accelerator: the
 * compute stream; a no-op on the CPU, where gt_optimizer_step returns when everything is done). */
gt_status gt_optimizer_synchronize(const gt_optimizer *opt);

/* L2 norm of the set gradients, as gt_grad_norm_l2 over each maximal run of adjacent
 * gradients, the runs' sums of squares added in parameter order. */
gt_status gt_optimizer_grad_norm(const gt_optimizer *opt, double *out);

/* gt_grad_sumsq (train/grad_norm.h) for n floats on `device` (cpu, or an accelerator, where it
 * queues on `stream` and waits for the result): the same bits on every device. */
gt_status gt_grad_sumsq_on(gt_device device, gt_stream *stream, const float *grad, size_t n, double *out);

/* Number of gt_optimizer_step calls that updated at least one parameter. */
int64_t gt_optimizer_num_steps(const gt_optimizer *opt);

size_t gt_optimizer_num_params(const gt_optimizer *opt);

/* ZeRO-1: the ranks the state is sharded over (0: not sharded) and this shard's rank. */
int gt_optimizer_zero_size(const gt_optimizer *opt);
int gt_optimizer_zero_rank(const gt_optimizer *opt);

/* 1 when the optimizer keeps state slot `slot`. */
int gt_optimizer_has_slot(const gt_optimizer *opt, gt_optim_slot slot);

/* Per-parameter update count (AdamW's `step`; for SGD, 0 means no momentum buffer yet). */
gt_status gt_optimizer_get_param_step(const gt_optimizer *opt, size_t index, int64_t *out);
gt_status gt_optimizer_set_param_step(gt_optimizer *opt, size_t index, int64_t step);

/* Copies a parameter's state slot to/from host memory `host` (numel floats). */
gt_status gt_optimizer_read_state(const gt_optimizer *opt, size_t index, gt_optim_slot slot, float *host);
gt_status gt_optimizer_write_state(gt_optimizer *opt, size_t index, gt_optim_slot slot, const float *host);

/* Re-reads the offloaded parameters into the host master copy (after the parameters were
 * changed by something other than this optimizer). No-op without offload. */
gt_status gt_optimizer_reload_params(gt_optimizer *opt);

/* Bytes of optimizer memory: state on the device; master + state + staging on the host. */
typedef struct gt_optimizer_memory {
    size_t device_bytes;   /* the device arena (state of the non-offloaded elements) */
    size_t host_bytes;     /* the pinned arena (master copy, offloaded state, staging) */
    size_t device_numel;   /* elements updated by the device */
    size_t host_numel;     /* elements updated by the host (offloaded) */
} gt_optimizer_memory;

void gt_optimizer_get_memory(const gt_optimizer *opt, gt_optimizer_memory *out);

/* The memory an optimizer of this configuration and these groups over `total_numel` elements
 * will take, before it is built: device_bytes in config->device's pool and host_bytes in the
 * pinned pool, as the allocator reserves them (gt_block_reserved_bytes of the sizes
 * gt_optimizer_create requests), and the element split. Validates like gt_optimizer_create. */
gt_status gt_optimizer_plan(const gt_optimizer_config *config, const gt_optim_hparams *groups,
                            size_t num_groups, size_t total_numel, gt_optimizer_memory *out);

/* gt_optimizer_plan from each parameter's element count (AdamW8bit's state depends on them:
 * train/optim8.h); the other kinds plan their sum. */
gt_status gt_optimizer_plan_params(const gt_optimizer_config *config, const gt_optim_hparams *groups,
                                   size_t num_groups, const size_t *numels, size_t num_params,
                                   gt_optimizer_memory *out);

/* AdamW8bit: the state (train/optim8.h), for reading and writing a parameter's fields after
 * gt_optimizer_synchronize; NULL for the other kinds. */
struct gt_optim8 *gt_optimizer_state8(gt_optimizer *opt);

/* clip_grad_norm_'s coefficient: min(1, max_norm / (norm + 1e-6)) in float64, as float32. */
float gt_clip_coef(double max_norm, double norm);

#endif
