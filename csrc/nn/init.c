/* Deterministic parameter initialisation with PyTorch's default distributions, drawn from
 * Philox(seed; stream_a = parameter index, stream_b = GT_INIT_STREAM; element / 4), each
 * parameter by the rule its kind's params hook gave it (nn/kind.h): e.g. Linear and Conv2d weight
 * and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5); fan_in =
 * in_features, or in_channels / groups * kh * kw), LayerNorm and BatchNorm2d weight = 1 and
 * bias = 0, Embedding (and token, position tables) weight ~ N(0, 1). */
#include "nn/init.h"

#include <math.h>

#include "core/philox.h"

enum { GT_INIT_STREAM = 0x494e4954u };  /* "INIT" */

static void fill_uniform(float *x, size_t n, float low, float high, uint64_t seed, uint32_t id) {
    for (size_t i = 0; i < n; i += 4) {
        uint32_t bits[4];
        gt_philox_random4(seed, id, GT_INIT_STREAM, i / 4, bits);
        for (size_t j = 0; j < 4 && i + j < n; j++)
            x[i + j] = low + (high - low) * gt_uint32_to_uniform(bits[j]);
    }
}

static void fill_normal(float *x, size_t n, uint64_t seed, uint32_t id) {
    for (size_t i = 0; i < n; i += 4) {
        uint32_t bits[4];
        float z[4];
        gt_philox_random4(seed, id, GT_INIT_STREAM, i / 4, bits);
        gt_box_muller(bits[0], bits[1], &z[0], &z[1]);
        gt_box_muller(bits[2], bits[3], &z[2], &z[3]);
        for (size_t j = 0; j < 4 && i + j < n; j++)
            x[i + j] = z[j];
    }
}

static void fill_constant(float *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

/* One parameter by its rule (layer.h, gt_init_rule), from Philox stream `id`. */
static void init_param(gt_param *param, const gt_layer *layer, uint64_t seed, uint32_t id) {
    switch (param->init) {
    case GT_INIT_FAN_IN_UNIFORM: {  /* fan_in: in_features, or in_channels / groups * kh * kw */
        float bound = 1.0f / sqrtf((float)(layer->weight.numel / (size_t)layer->weight.shape[0]));
        fill_uniform(param->data, param->numel, -bound, bound, seed, id);
        break;
    }
    case GT_INIT_NORMAL: fill_normal(param->data, param->numel, seed, id); break;
    case GT_INIT_CONSTANT: fill_constant(param->data, param->numel, param->init_value); break;
    }
}

/* The parameters of the tree in state_dict order, each with the next stream id. */
static void init_layer(gt_layer *layer, uint64_t seed, uint32_t *next_id) {
    if (layer->tied)  /* initialised at its first use */
        return;
    if (layer->weight.numel)
        init_param(&layer->weight, layer, seed, (*next_id)++);
    if (layer->bias.numel)
        init_param(&layer->bias, layer, seed, (*next_id)++);
    for (size_t i = 0; i < layer->num_children; i++)
        init_layer(&layer->children[i], seed, next_id);
}

void gt_init_layer_tree(gt_layer *root, uint64_t seed) {
    uint32_t next_id = 0;
    init_layer(root, seed, &next_id);
}
