/* The optimizer on CUDA (cuda/optim.cu), callable from C: the AdamW, SGD and EMA kernels (the
 * element math of core/adamw.h, core/sgd.h and core/ema_math.h, so the bits equal the CPU
 * loops') and the deterministic sum of squares (the order of core/sumsq_order.h). `stream` arguments are cudaStream_t (NULL: the legacy
 * default stream; the device table, cuda/device_table.cu, always passes gputrain's own stream).
 * Included by C files only when built with GT_WITH_CUDA. */
#ifndef GT_OPTIM_CUDA_H
#define GT_OPTIM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "core/adamw.h"
#include "core/adamw8bit.h"
#include "core/device_backend.h"
#include "core/sgd.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Queues adamw8bit_kernel (cuda/optim8.cu) over one parameter of n elements on device `device`:
 * c1, c2 (n,) codes and absmax1, absmax2 (ceil(n / GT_ADAMW8_BLOCK),) updated in place. */
gt_status gt_cuda_adamw8bit(int device, const gt_adamw8_scalars *s, float *p, const float *g, uint8_t *c1,
                            uint8_t *c2, float *absmax1, float *absmax2, size_t n, void *stream);

/* Queues adamw_kernel over n elements on device `device` (device pointers; v_max only with
 * s->amsgrad). Returns after the launch. */
gt_status gt_cuda_adamw(int device, gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                        const float *g, float *m, float *v, float *v_max, size_t n, void *stream);

/* Queues sgd_kernel over n elements (buf only with s->use_momentum). */
gt_status gt_cuda_sgd(int device, const gt_sgd_scalars *s, float *p, const float *g, float *buf,
                      size_t n, void *stream);

/* Queues ema_kernel: ema = lerp(ema, p, weight) over n elements. */
gt_status gt_cuda_ema(int device, float *ema, const float *p, float weight, size_t n, void *stream);

/* Queues ema_swap_kernel: exchanges ema[0..n) and p[0..n). */
gt_status gt_cuda_ema_swap(int device, float *ema, float *p, size_t n, void *stream);

/* The sum of squares of n device floats in core/sumsq_order.h's order (the same bits as
 * gt_grad_sumsq); waits for the result. */
gt_status gt_cuda_grad_sumsq(int device, const float *x, size_t n, double *out, void *stream);

/* Queues the same sum of squares into *out (device memory), with totals (GT_SUMSQ_MAX_CHUNKS,)
 * device doubles of scratch; the host does not wait. */
gt_status gt_cuda_grad_sumsq_async(int device, const float *x, size_t n, double *out, double *totals,
                                   void *stream);

/* Queues *loss_sum += gt_loss_mean(values, rows, count) (core/loss_mean.h; device pointers). */
gt_status gt_cuda_loss_accumulate(int device, const float *values, int64_t rows, const int64_t *count,
                                  double *loss_sum, void *stream);

/* Queues grad_clip_kernel: grad[0..n) *= min(1, max_norm / (sqrt(*sumsq) + 1e-6)) in fp32
 * (core/clip_rules.h), *sumsq a device double; nothing is written when that is 1. */
gt_status gt_cuda_grad_clip(int device, float *grad, size_t n, const double *sumsq, double max_norm,
                            void *stream);

/* Queue gt_cuda_adamw / gt_cuda_sgd with the scalars of table `t` for the device's count
 * (core/device_backend.h's gt_update_table); nothing is written when *t->found_inf. */
gt_status gt_cuda_adamw_table(int device, gt_numerics numerics, const gt_update_table *t, float *p,
                              const float *g, float *m, float *v, float *v_max, size_t n, void *stream);
gt_status gt_cuda_sgd_table(int device, const gt_update_table *t, float *p, const float *g, float *buf,
                            size_t n, void *stream);

/* Queues *count += 1 unless *found_inf (device pointers, one thread). */
gt_status gt_cuda_count_update(int device, uint64_t *count, const int *found_inf, void *stream);

#ifdef __cplusplus
}
#endif
#endif
