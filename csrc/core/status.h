/* Status codes and the thread-local error message (DESIGN.md principle 5).
 * Every fallible core function returns a gt_status; on failure it has called
 * GT_FAIL, which records "message (file:line)" for the binding layer to raise. */
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
} gt_status;

/* Records the message (printf-style) with file:line and returns `code`. */
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

/* The message of the last failure on this thread ("" if none). */
const char *gt_error_message(void);

void gt_clear_error(void);

/* The name of a status code, e.g. "GT_ERR_OOM". */
const char *gt_status_name(gt_status code);

#ifdef __cplusplus
}
#endif
#endif
