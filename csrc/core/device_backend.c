#include "core/device_backend.h"

#include <stdatomic.h>

enum { GT_DEVICE_KINDS = 4 };  /* cpu, pinned, cuda, sim */

/* The registered tables, by device kind; set once at module start-up. */
static _Atomic(const gt_device_backend *) tables[GT_DEVICE_KINDS];

void gt_device_backend_install(gt_device_kind kind, const gt_device_backend *table) {
    if ((int)kind >= 0 && (int)kind < GT_DEVICE_KINDS)
        atomic_store(&tables[kind], table);
}

const gt_device_backend *gt_device_backend_of(gt_device device) {
    if ((int)device.kind < 0 || (int)device.kind >= GT_DEVICE_KINDS)
        return NULL;
    return atomic_load(&tables[device.kind]);
}

gt_status gt_device_backend_get(gt_device device, const char *arg_name, const gt_device_backend **out) {
    *out = gt_device_backend_of(device);
    if (*out)
        return GT_OK;
    char name[32];
    gt_device_name(device, name, sizeof name);
    int cuda = device.kind == GT_DEVICE_CUDA;  /* a CudaError in Python */
    return GT_FAIL(cuda ? GT_ERR_CUDA : GT_ERR_RUNTIME,
                   "%s: '%s' needs the %s backend, which was not compiled into this build of gputrain",
                   arg_name, name, cuda ? "CUDA" : "sim");
}
