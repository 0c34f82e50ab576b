/* Status codes and the thread-local error message (DESIGN.md principle 5).
 * Every fallible core function returns a gt_status; on failure it has called GT_FAIL, which
 * records the message, and the file:line it was raised at, for the binding layer to raise.
 * Users see the message alone; in debug mode (gt_set_debug, or the environment variable
 * GPUTRAIN_DEBUG=1) the message ends with " (file:line)". */
#ifndef GT_STATUS_H
#define GT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gt_status {
    GT_OK = 0,
    GT_ERR_VALUE,       /* bad argument value                 -> ValueError */
    GT_ERR_TYPE,        /* wrong dtype or kind of object      -> TypeError */
    GT_ERR_INDEX,       /* index out of range                 -> IndexError */
    GT_ERR_OOM,         /* over the memory limit / system OOM -> gputrain.OutOfMemoryError */
    GT_ERR_CUDA,        /* CUDA runtime or library failure    -> gputrain.CudaError */
    GT_ERR_OS,          /* system call failure                -> OSError */
    GT_ERR_RUNTIME,     /* invalid state or unsupported here  -> RuntimeError */
    GT_ERR_TIMEOUT,     /* a wait ran out of time             -> TimeoutError */
    GT_ERR_INTERRUPTED, /* abandoned on an interrupt (Ctrl-C) -> KeyboardInterrupt */
} gt_status;

/* Records the message (printf-style) and file:line, and returns `code`. */
gt_status gt_set_error(gt_status code, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#define GT_FAIL(code, ...) gt_set_error((code), __FILE__, __LINE__, __VA_ARGS__)

/* Propagates a failure from a callee; its message is kept as it is. */
#define GT_TRY(expr)                      \
    do {                                  \
        gt_status gt_try_s_ = (expr);     \
        if (gt_try_s_ != GT_OK)           \
            return gt_try_s_;             \
    } while (0)

/* The message of the last failure on this thread ("" if none), followed by " (file:line)" of
 * the GT_FAIL that raised it in debug mode. */
const char *gt_error_message(void);

void gt_clear_error(void);

enum { GT_ERROR_MESSAGE_BYTES = 1024, GT_ERROR_LOCATION_BYTES = 96 };

/* A failure kept aside while cleanup code that may fail itself runs (gt_error_save, then
 * gt_error_restore so that the caller sees the first failure, not a later one). */
typedef struct gt_error_state {
    gt_status code;                               /* the failed status */
    char message[GT_ERROR_MESSAGE_BYTES];         /* its message, without the location */
    char location[GT_ERROR_LOCATION_BYTES];       /* "file.c:123" where it was raised */
} gt_error_state;

/* Copies this thread's failure (code `code`) into *out. */
void gt_error_save(gt_status code, gt_error_state *out);

/* Makes *saved this thread's failure again; returns its code. */
gt_status gt_error_restore(const gt_error_state *saved);

/* Debug mode for messages: 1 appends the file:line of the failure to every message. Off by
 * default; the environment variable GPUTRAIN_DEBUG (any value but "" or "0") turns it on at the
 * first use. Process-wide. */
void gt_set_debug(int on);
int gt_debug_enabled(void);

/* The process-wide interrupt request (Ctrl-C while a long operation runs without the GIL).
 * gt_interrupt_request is async-signal-safe (a signal handler calls it); operations that can
 * be abandoned cleanly poll gt_interrupt_pending and then fail with GT_ERR_INTERRUPTED. */
void gt_interrupt_request(void);
void gt_interrupt_clear(void);
int gt_interrupt_pending(void);

/* The name of a status code, e.g. "GT_ERR_OOM". */
const char *gt_status_name(gt_status code);

#ifdef __cplusplus
}
#endif
#endif
