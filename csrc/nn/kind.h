/* The table of layer kinds (DESIGN.md: "registered in one table of kinds, as ops are in
 * GT_OP_LIST"). Each kind is one row, `gt_layer_type`: its spec name, its typed arguments (read
 * by the one generic spec parser of the bindings, csrc/py/model.c), the rules between them, its
 * parameters with their shapes and initialisation, its plan, forward and backward. Model code
 * (plan, layout, init, forward, backward, messages) only reads rows; it never switches on kinds.
 *
 * How to add a kind (say `foo`): append `X(FOO, foo)` to GT_LAYER_KIND_LIST (nn/kind_list.h);
 * write csrc/nn/foo.c with its forward, backward, plan (nn/plan.h has the helpers), its
 * parameters hook and `const gt_layer_type gt_layer_type_foo = {...}`; add its Python class,
 * whose _spec() is ("foo", args...) in the row's argument order. A hyper-parameter that no
 * gt_layer field holds goes in the kind's own struct laid over gt_layer.config (GT_ARG_CONFIG).
 * A kind that needs a new op adds it as ops/ops.h says. */
#ifndef GT_NN_KIND_H
#define GT_NN_KIND_H

#include <math.h>
#include <stddef.h>

#include "nn/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one item of a spec tuple is, and how it is stored in the gt_layer. */
typedef enum gt_arg_type {
    GT_ARG_INT = 0,       /* int64_t: an int in [min, max] */
    GT_ARG_INT_PAIR = 1,  /* int64_t[2]: a sequence of two ints, each in [min, max] */
    GT_ARG_FLOAT = 2,     /* float: a real in [min, max] (checked as a double, stored rounded) */
    GT_ARG_DOUBLE = 3,    /* double: a real in [min, max] */
    GT_ARG_BOOL = 4,      /* int: 1 when the item is true */
    GT_ARG_ENUM = 5,      /* int (an enum of C): the value of the item's name in `names` */
    GT_ARG_LAYERS = 6,    /* a list of layer specs: the layer's children */
    GT_ARG_BLOCK = 7,     /* a list of layer specs: one Sequential child that holds them */
} gt_arg_type;

/* One name an enum argument accepts. */
typedef struct gt_enum_name {
    const char *name;  /* as written in the spec; NULL ends a list */
    int value;         /* the C enum's value stored */
} gt_enum_name;

/* One typed argument of a kind's spec, in spec order. */
typedef struct gt_layer_arg {
    const char *name;            /* the constructor argument's name (messages name it) */
    gt_arg_type type;            /* what the item is */
    size_t offset;               /* where it is stored: bytes from the start of the gt_layer */
    double min, max;             /* INT, INT_PAIR, FLOAT, DOUBLE: allowed range (NaN never is) */
    int min_exclusive;           /* FLOAT, DOUBLE: 1 when min itself is refused (eps > 0) */
    const gt_enum_name *names;   /* ENUM: the accepted names, ended by {NULL, 0} */
} gt_layer_arg;

/* Where an argument lives: a gt_layer field, or a field of the kind's own struct in `config`. */
#define GT_ARG_FIELD(field) offsetof(gt_layer, field)
#define GT_ARG_CONFIG(type, field) (offsetof(gt_layer, config) + offsetof(type, field))

/* Shorthands of common arguments stored at `at` (GT_ARG_FIELD or GT_ARG_CONFIG). */
#define GT_ARG_INT64_MAX 9223372036854775807.0  /* INT64_MAX as a double (comparisons exact) */
#define GT_ARG_SIZE_AT(name, at) {name, GT_ARG_INT, at, 1, GT_ARG_INT64_MAX, 0, NULL}  /* int >= 1 */
#define GT_ARG_FLAG_AT(name, at) {name, GT_ARG_BOOL, at, 0, 0, 0, NULL}
#define GT_ARG_EPS_AT(name, at) {name, GT_ARG_FLOAT, at, 0, INFINITY, 1, NULL}        /* float > 0 */
#define GT_ARG_PROBABILITY_AT(name, at) {name, GT_ARG_DOUBLE, at, 0, 1, 0, NULL}      /* [0, 1] */
/* The args array of a row and its length. */
#define GT_LAYER_ARGS(args) args, sizeof args / sizeof args[0]

enum {
    GT_KIND_PARAMS = 1,       /* a module with parameters (BatchNorm2d: or buffers); ("tied", i)
                                 specs count these */
    GT_KIND_DROPOUT_ID = 2,   /* takes the next dropout id (its Philox stream) when parsed */
    GT_KIND_NO_BUFFER = 4,    /* plans no output buffer: its output is a view or a child's */
    GT_KIND_CONTAINER = 8,    /* holds layers (children) and computes nothing else of its own */
    GT_KIND_READS_IDS = 16,   /* reads the model's int64 ids (a model starting with it takes ids) */
    GT_KIND_FREEZES = 32,     /* its backward honours frozen parameters (gt_param.frozen: grad NULL,
                                 no work on it); a kind without it refuses them */
    GT_KIND_LOOKUP = 64,      /* its weight is a table whose rows are looked up in f32: it has no
                                 half copy (gt_param.lowp) unless a tied GEMM layer reads it too */
};

enum { GT_MAX_FROZEN_PIECES = 4 };

/* One frozen buffer of a layer (a kind's frozen hook). */
typedef struct gt_frozen_piece {
    size_t offset;     /* bytes from the layer's frozen_offset in the buffer arena (GT_ALIGN-aligned) */
    size_t bytes;      /* its bytes */
    gt_dtype dtype;    /* GT_U8, GT_I8, GT_F32, GT_F16 or GT_BF16 */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* its shape as state_dict shows it */
} gt_frozen_piece;

/* Bytes of a layer's frozen buffers (the end of its last piece, GT_ALIGN-aligned; 0: none). */
size_t gt_layer_frozen_bytes(const gt_layer *layer);

/* One layer kind. Hooks that a kind does not need are NULL where said. */
typedef struct gt_layer_type {
    const char *name;             /* spec name, as in GT_LAYER_KIND_LIST */
    const char *title;            /* the Python class, in messages */
    const gt_layer_arg *args;     /* (num_args,) the spec's items after the name */
    size_t num_args;              /* items after the name */
    unsigned flags;               /* GT_KIND_* */
    /* After parsing: rules between arguments (GT_ERR_VALUE message) and derived fields; NULL: none */
    gt_status (*check)(gt_layer *layer);
    /* "Linear(16, 8)" into buf (the layer in messages); NULL: no text but the path */
    void (*describe)(const gt_layer *layer, char *buf, size_t bytes);
    /* Sets shape and init rule of each parameter present (gt_layer_param); NULL: none */
    gt_status (*params)(gt_layer *layer);
    /* Output shape and buffers for input `in` (gt_plan_layer has set out = in with the
     * activation precision); see gt_plan_site */
    gt_status (*plan)(gt_plan_walk *w, gt_layer *layer, const gt_tensor *in, const gt_plan_site *site);
    gt_status (*forward)(gt_layer *layer, const void *in, gt_run *run);
    /* din may be NULL (the model's first layer: no input gradient wanted) */
    gt_status (*backward)(gt_layer *layer, void *din, const void *dout, const void *in, gt_run *run);
    /* Frozen buffers (a quantized weight: codes and scales; never optimised, no gradient, not
     * restored by a failed step) in the buffer arena after the running statistics: fills
     * pieces[0:count] (offsets from the layer's frozen_offset, in state_dict order) and returns
     * count (<= GT_MAX_FROZEN_PIECES); NULL: none */
    size_t (*frozen)(const gt_layer *layer, gt_frozen_piece *pieces);
} gt_layer_type;

#define GT_LAYER_TYPE_DECL(NAME, name) extern const gt_layer_type gt_layer_type_##name;
GT_LAYER_KIND_LIST(GT_LAYER_TYPE_DECL)
#undef GT_LAYER_TYPE_DECL

/* The row of a kind (kind < GT_LAYER_KIND_COUNT). */
const gt_layer_type *gt_layer_type_of(gt_layer_kind kind);

/* The kind whose spec name is `name`; 0 when there is none. */
int gt_layer_kind_named(const char *name, gt_layer_kind *kind);

/* Gives a parameter its shape dims[0:ndim] (ndim in 1..4) and how it starts (params hooks). */
void gt_layer_param(gt_param *param, int ndim, const int64_t *dims, gt_init_rule init, float value);

/* A QLinear's stored weight dtype: GT_BF16 or GT_F16 for a weight in half precision alone (its
 * frozen buffer, (out, in), is the weight itself), else GT_U8 (quantized codes). */
gt_dtype gt_qlinear_stored_dtype(const gt_layer *layer);

/* The 16 values of bitsandbytes' 4-bit code (f32): NF4 when nf4 is 1, else FP4. */
void gt_quant4_code_table(int nf4, float table[16]);

/* "layer 'path' (Linear(16, 8))", or "layer 'path'" for a kind without text, into buf. */
const char *gt_layer_describe(char *buf, size_t bytes, const gt_layer *layer, const char *path);

#ifdef __cplusplus
}
#endif
#endif
