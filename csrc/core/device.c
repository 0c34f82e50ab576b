#include "core/device.h"

#include "core/device_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

gt_cuda_hooks gt_cuda;

int gt_cuda_device_count(void) { return gt_cuda.device_count ? gt_cuda.device_count() : 0; }

static gt_status parse_cuda_index(const char *digits, const char *text, const char *arg_name,
                                  int *out) {
    char *end = NULL;
    long index = strtol(digits, &end, 10);
    /* the spelling Python's gputrain._vocab.parse_device accepts: ASCII digits, no sign, space or leading 0 */
    int canonical = *digits >= '0' && *digits <= '9' && (digits[0] != '0' || digits[1] == '\0');
    if (!canonical || *end != '\0' || index < 0 || index >= GT_MAX_CUDA_DEVICES)
        return GT_FAIL(GT_ERR_VALUE, "%s: invalid device '%s' (expected 'cpu', 'cuda:N' or 'sim:N')",
                       arg_name, text);
    *out = (int)index;
    return GT_OK;
}

/* "sim" or "sim:N": the simulated device, if this build registered it. */
static gt_status parse_sim(const char *text, const char *arg_name, gt_device *out) {
    int index = 0;
    if (text[3] == ':')
        GT_TRY(parse_cuda_index(text + 4, text, arg_name, &index));
    gt_device device = {GT_DEVICE_SIM, index};
    const gt_device_backend *table = NULL;
    GT_TRY(gt_device_backend_get(device, arg_name, &table));
    if (index >= table->device_count())
        return GT_FAIL(GT_ERR_VALUE, "%s: device '%s' does not exist (%d simulated devices)", arg_name, text,
                       table->device_count());
    *out = device;
    return GT_OK;
}

gt_status gt_device_parse(const char *text, const char *arg_name, gt_device *out) {
    if (strcmp(text, "sim") == 0 || strncmp(text, "sim:", 4) == 0)
        return parse_sim(text, arg_name, out);
    if (strcmp(text, "cpu") == 0) {
        *out = gt_cpu_device();
        return GT_OK;
    }
    if (strcmp(text, "pinned") == 0) {
        *out = gt_pinned_device();
        return GT_OK;
    }
    int index = 0;
    if (strcmp(text, "cuda") == 0)
        index = 0;
    else if (strncmp(text, "cuda:", 5) == 0)
        GT_TRY(parse_cuda_index(text + 5, text, arg_name, &index));
    else
        return GT_FAIL(GT_ERR_VALUE, "%s: invalid device '%s' (expected 'cpu', 'cuda:N' or 'sim:N')",
                       arg_name, text);
    int count = gt_cuda_device_count();
    if (index >= count)
        return GT_FAIL(GT_ERR_RUNTIME,
                       "%s: device '%s' is not available (%d CUDA device%s usable%s)", arg_name,
                       text, count, count == 1 ? "" : "s",
                       gt_cuda.device_count ? "" : "; gputrain was built without CUDA");
    *out = gt_cuda_device(index);
    return GT_OK;
}

void gt_device_name(gt_device device, char *buf, size_t buf_bytes) {
    switch (device.kind) {
    case GT_DEVICE_CPU: snprintf(buf, buf_bytes, "cpu"); return;
    case GT_DEVICE_PINNED: snprintf(buf, buf_bytes, "pinned"); return;
    case GT_DEVICE_CUDA: snprintf(buf, buf_bytes, "cuda:%d", device.index); return;
    case GT_DEVICE_SIM: snprintf(buf, buf_bytes, "sim:%d", device.index); return;
    }
    snprintf(buf, buf_bytes, "unknown");
}

gt_status gt_device_total_memory(gt_device device, size_t *out) {
    if (gt_device_is_accelerator(device)) {
        size_t free_bytes = 0;
        const gt_device_backend *table = NULL;
        GT_TRY(gt_device_backend_get(device, "device", &table));
        return table->mem_get_info(device.index, &free_bytes, out);
    }
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_bytes = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_bytes <= 0)
        return GT_FAIL(GT_ERR_OS, "cannot read the size of physical memory");
    *out = (size_t)pages * (size_t)page_bytes;
    return GT_OK;
}
