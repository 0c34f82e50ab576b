#include "core/status.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_message[GT_ERROR_MESSAGE_BYTES];    /* the last failure's text */
static _Thread_local char error_location[GT_ERROR_LOCATION_BYTES];  /* its "file.c:line" */
static _Thread_local char error_display[GT_ERROR_MESSAGE_BYTES + GT_ERROR_LOCATION_BYTES + 4];

/* 1 from a Ctrl-C until the interrupted operation clears it (set in signal handlers: lock-free). */
static atomic_int interrupt_requested;

/* -1 until set or read from GPUTRAIN_DEBUG; then 0 or 1. */
static atomic_int debug_mode = -1;

/* Drops the directories of a source path so locations read "alloc.c:42". */
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
        error_message[0] = '\0';
    snprintf(error_location, sizeof error_location, "%s:%d", base_name(file), line);
    return code;
}

const char *gt_error_message(void) {
    if (!gt_debug_enabled() || !error_location[0])
        return error_message;
    snprintf(error_display, sizeof error_display, "%s (%s)", error_message, error_location);
    return error_display;
}

void gt_clear_error(void) {
    error_message[0] = '\0';
    error_location[0] = '\0';
}

void gt_error_save(gt_status code, gt_error_state *out) {
    out->code = code;
    memcpy(out->message, error_message, sizeof out->message);
    memcpy(out->location, error_location, sizeof out->location);
}

gt_status gt_error_restore(const gt_error_state *saved) {
    memcpy(error_message, saved->message, sizeof error_message);
    memcpy(error_location, saved->location, sizeof error_location);
    return saved->code;
}

void gt_set_debug(int on) { atomic_store(&debug_mode, on ? 1 : 0); }

int gt_debug_enabled(void) {
    int mode = atomic_load(&debug_mode);
    if (mode >= 0)
        return mode;
    const char *value = getenv("GPUTRAIN_DEBUG");
    int from_env = value && value[0] && strcmp(value, "0") != 0;
    int unset = -1;  /* a concurrent gt_set_debug wins over the environment */
    atomic_compare_exchange_strong(&debug_mode, &unset, from_env);
    return atomic_load(&debug_mode);
}

void gt_interrupt_request(void) { atomic_store(&interrupt_requested, 1); }

void gt_interrupt_clear(void) { atomic_store(&interrupt_requested, 0); }

int gt_interrupt_pending(void) { return atomic_load(&interrupt_requested); }

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
    case GT_ERR_INTERRUPTED: return "GT_ERR_INTERRUPTED";
    }
    return "GT_ERR_UNKNOWN";
}
