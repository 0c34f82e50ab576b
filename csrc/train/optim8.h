/* The state of 8-bit AdamW (gt_optimizer of kind GT_OPTIM_ADAMW8BIT, train/optim.h): per
 * parameter of at least `min_8bit_size` elements, bitsandbytes' AdamW8bit state — the codes of
 * both moments, one byte per element each ("state1", "state2"), and one float32 absmax per block
 * of GT_ADAMW8_BLOCK elements of the parameter per moment ("absmax1", "absmax2"); smaller
 * parameters keep float32 moments ("exp_avg", "exp_avg_sq") updated as AdamW's exact numerics
 * update them (bitsandbytes' min_8bit_size). All of it in one arena on the optimizer's device,
 * in this order: state1, state2, absmax1, absmax2, exp_avg, exp_avg_sq (each packed in parameter
 * order), so the plan is (2 bytes + 8 bytes per block) per 8-bit element plus 8 bytes per f32
 * element, each piece rounded up to the allocator's alignment.
 *
 * Offloaded (cpu_offload_fraction > 0): the parameters from `host_first` on keep the same state in
 * a pinned host arena of the same layout instead, and their update runs on the CPU: each step
 * streams a parameter's values and gradient to the host in chunks of whole blocks through two
 * pinned staging buffers (the next chunk in flight while one is updated), updates the chunk with
 * the cpu's kernels (the device's bits) and streams the values back, on a copy stream beside the
 * compute. Whole parameters are offloaded, so a block never straddles the two arenas. */
#ifndef GT_OPTIM8_H
#define GT_OPTIM8_H

#include <stddef.h>
#include <stdint.h>

#include "core/adamw8bit.h"
#include "core/alloc.h"
#include "core/device_backend.h"
#include "core/status.h"

/* The state arrays of one parameter, named as bitsandbytes' and torch's state_dicts name them. */
typedef enum gt_optim8_field {
    GT_OPTIM8_STATE1 = 0,      /* (numel,) uint8 codes of the first moment (8-bit parameters) */
    GT_OPTIM8_STATE2 = 1,      /* (numel,) uint8 codes of the second moment */
    GT_OPTIM8_ABSMAX1 = 2,     /* (blocks,) float32 absmax of the first moment per block */
    GT_OPTIM8_ABSMAX2 = 3,     /* (blocks,) float32 absmax of the second moment per block */
    GT_OPTIM8_EXP_AVG = 4,     /* (numel,) float32 first moment (parameters kept in 32 bits) */
    GT_OPTIM8_EXP_AVG_SQ = 5,  /* (numel,) float32 second moment */
    GT_OPTIM8_FIELD_COUNT
} gt_optim8_field;

/* Where one parameter's state is. */
typedef struct gt_optim8_param {
    size_t numel;      /* elements of the parameter */
    int is_8bit;       /* 1: codes + absmax; 0: float32 moments */
    size_t offset;     /* first element in the codes (8-bit) or the float32 moments */
    size_t block;      /* 8-bit: its first absmax block */
} gt_optim8_param;

/* One side of the state: the device's parameters [0, host_first) or the offloaded ones. */
typedef struct gt_optim8_side {
    gt_arena arena;                              /* its state (pinned pool for the offloaded side) */
    size_t count[GT_OPTIM8_FIELD_COUNT];         /* elements of each field over its parameters */
    void *field[GT_OPTIM8_FIELD_COUNT];          /* each field's array in the arena (NULL when empty) */
} gt_optim8_side;

typedef struct gt_optim8 {
    gt_device device;                            /* the parameters' device */
    gt_optim8_param *params;                     /* (num_params,) offsets within their side's fields */
    size_t num_params;                           /* parameters */
    size_t host_first;                           /* parameters [host_first, num_params) are offloaded */
    gt_optim8_side on_device;                    /* the state of parameters [0, host_first) */
    gt_optim8_side on_host;                      /* the state of the offloaded ones (pinned) */
    size_t chunk_numel;                          /* offloaded: elements per staging chunk (whole blocks) */
    gt_block staging;                            /* offloaded: pinned (2, 2, chunk_numel) f32: two buffers
                                                    of (values, gradient) chunks */
    struct gt_copy_stream *copies;               /* offloaded: the staging copies, beside the compute */
} gt_optim8;

/* The first parameter to offload for `cpu_offload_fraction` f: the parameter boundary nearest to
 * the last f of the elements (num_params: none, 0: all). */
size_t gt_optim8_host_first(const size_t *numels, size_t num_params, double cpu_offload_fraction);

/* Bytes the state of parameters of these sizes takes on the device and in pinned host memory
 * (state and staging) with parameters [host_first, num_params) offloaded and staging chunks of
 * about `chunk_numel` elements: what gt_optim8_create allocates. */
void gt_optim8_plan(const size_t *numels, size_t num_params, size_t min_8bit_size, size_t host_first,
                    size_t chunk_numel, size_t *device_bytes, size_t *host_bytes);

/* Builds the state (zeros: codes 0, absmax 0, as bitsandbytes initialises them) in `device`'s
 * pool, and in pinned memory for parameters [host_first, num_params), whose copies wait for the
 * work queued on `compute_stream` (NULL: the default stream). On failure *out is left empty
 * (gt_optim8_destroy is safe on it). */
gt_status gt_optim8_create(gt_optim8 *out, gt_device device, gt_stream *compute_stream, const size_t *numels,
                           size_t num_params, size_t min_8bit_size, size_t host_first, size_t chunk_numel);

void gt_optim8_destroy(gt_optim8 *state);

/* One update of parameter `index` (device pointers). On the device: queued on `stream`
 * (8-bit: dev->adamw8bit; 32-bit: dev->adamw with AdamW's exact numerics and the same
 * constants). Offloaded: the same kernels of the cpu over its chunks, the device's later work
 * waiting for the values copied back. */
gt_status gt_optim8_update(gt_optim8 *state, const gt_device_backend *dev, gt_stream *stream, size_t index,
                           const gt_adamw8_scalars *s, float *param, const float *grad);

/* Elements of `field` that parameter `index` has (0 when it keeps the other format). */
size_t gt_optim8_field_numel(const gt_optim8 *state, size_t index, gt_optim8_field field);

/* Copies parameter `index`'s `field` to or from host memory (gt_optim8_field_numel elements of
 * 1 byte for the codes, 4 for the rest); blocking, after the queued updates (the caller waits
 * for its stream first). GT_ERR_VALUE naming the field when the parameter does not keep it. */
gt_status gt_optim8_transfer(gt_optim8 *state, size_t index, gt_optim8_field field, void *host, int to_state);

/* The state's field names: "state1", "state2", "absmax1", "absmax2", "exp_avg", "exp_avg_sq". */
const char *gt_optim8_field_name(gt_optim8_field field);

#endif
