#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { GT_ERROR_MESSAGE_BYTES = 1024 };

static _Thread_local char error_message[GT_ERROR_MESSAGE_BYTES];

/* Drops the directories of a source path so messages read "alloc.c:42". */
static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

gt_status gt_set_error(gt_status code, const char *file, int line, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int written = vsnprintf(error_message, sizeof error_message, fmt, args);
    va_end(args);
    if (written < 0)
        written = 0;
    size_t used = (size_t)written < sizeof error_message ? (size_t)written : sizeof error_message - 1;
    snprintf(error_message + used, sizeof error_message - used, " (%s:%d)", base_name(file), line);
    return code;
}

const char *gt_error_message(void) { return error_message; }

void gt_clear_error(void) { error_message[0] = '\0'; }

const char *gt_status_name(gt_status code) {
    switch (code) {
    case GT_OK: return "GT_OK";
    case GT_ERR_VALUE: return "GT_ERR_VALUE";
    case GT_ERR_TYPE: return "GT_ERR_TYPE";
    case GT_ERR_INDEX: return "GT_ERR_INDEX";
    case GT_ERR_OOM: return "GT_ERR_OOM";
    case GT_ERR_CUDA: return "GT_ERR_CUDA";
    case GT_ERR_OS: return "GT_ERR_OS";
    case GT_ERR_RUNTIME: return "GT_ERR_RUNTIME";
    case GT_ERR_TIMEOUT: return "GT_ERR_TIMEOUT";
    }
    return "GT_ERR_UNKNOWN";
}
