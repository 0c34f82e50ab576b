/* The simulated device's training-step kernels (core/device_backend.h): each is queued on a
 * sim stream with its arguments copied, and its worker runs the CPU loop of the same math
 * (train/optim_cpu.c, train/grad_norm.c, train/scaler.c), so the bits equal the CPU path's. */
#ifndef GT_SIM_KERNELS_H
#define GT_SIM_KERNELS_H

#include "core/device_backend.h"

gt_status gt_sim_adamw8bit(int index, gt_stream *stream, const gt_adamw8_scalars *s, float *p, const float *g,
                           uint8_t *c1, uint8_t *c2, float *absmax1, float *absmax2, size_t n);
gt_status gt_sim_adamw(int index, gt_stream *stream, gt_numerics numerics, const gt_adamw_scalars *s, float *p,
                       const float *g, float *m, float *v, float *v_max, size_t n);
gt_status gt_sim_sgd(int index, gt_stream *stream, const gt_sgd_scalars *s, float *p, const float *g,
                     float *buf, size_t n);
gt_status gt_sim_ema(int index, gt_stream *stream, float *ema, const float *p, float weight, size_t n);
gt_status gt_sim_ema_swap(int index, gt_stream *stream, float *ema, float *p, size_t n);
gt_status gt_sim_grad_sumsq(int index, gt_stream *stream, const float *x, size_t n, double *out);
gt_status gt_sim_grad_sumsq_async(int index, gt_stream *stream, const float *x, size_t n, double *out,
                                  double *totals);
gt_status gt_sim_loss_accumulate(int index, gt_stream *stream, const float *values, int64_t rows,
                                 const int64_t *count, double *loss_sum);
gt_status gt_sim_unscale_check(int index, gt_stream *stream, const gt_scaler *scaler, float *grad, size_t n,
                               int *found_inf);
gt_status gt_sim_grad_clip(int index, gt_stream *stream, float *grad, size_t n, const double *sumsq,
                           double max_norm);
gt_status gt_sim_scaler_update(int index, gt_stream *stream, gt_scaler *scaler, const int *found_inf);
gt_status gt_sim_adamw_table(int index, gt_stream *stream, gt_numerics numerics, const gt_update_table *t,
                             float *p, const float *g, float *m, float *v, float *v_max, size_t n);
gt_status gt_sim_sgd_table(int index, gt_stream *stream, const gt_update_table *t, float *p, const float *g,
                           float *buf, size_t n);
gt_status gt_sim_count_update(int index, gt_stream *stream, uint64_t *count, const int *found_inf);

#endif
