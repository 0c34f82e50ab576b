/* The CPU backend's op table (ops.h): gt_cpu_<op> (cpu_ops.h) for every op of GT_OP_LIST. */
#include "ops/cpu_ops.h"

#define GT_CPU_ENTRY(kind, name, params, skip) .name = gt_cpu_##name,
static const gt_ops cpu_ops = {
    .name = "cpu",
    GT_OP_LIST(GT_CPU_ENTRY)
};
#undef GT_CPU_ENTRY

const gt_ops *gt_cpu_ops(void) { return &cpu_ops; }
