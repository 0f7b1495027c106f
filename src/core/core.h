/*
 * Internal core: error reporting, logging, settings, time. Everything inside the library includes
 * this header; nothing here is exported.
 */
#ifndef CINFER_CORE_H
#define CINFER_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cinfer.h"

#if defined(__GNUC__)
#define CINFER__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define CINFER__PRINTF(fmt, args)
#endif

/* Sets the calling thread's last-error message and returns status, so callers can write
 * `return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "q: ...")`. */
cinfer_status_t cinfer__error(cinfer_status_t status, const char *fmt, ...) CINFER__PRINTF(2, 3);
cinfer_status_t cinfer__verror(cinfer_status_t status, const char *fmt, va_list ap);
/* The status that goes with cinfer_last_error()'s message (SUCCESS before any error). */
cinfer_status_t cinfer__last_status(void);

/* The message of a NULL context argument: where a context comes from, and why there may be none. */
#define CINFER__NULL_CTX                                                                           \
    "ctx is NULL (a context comes from cinfer_context_create, which returns "                      \
    "CINFER_STATUS_NO_DEVICE on a machine without a GPU)"

/* Between cinfer__error_mute() and cinfer__error_unmute() (nestable) errors return their status
 * and are logged but leave the last-error message alone: for a try whose failure the caller
 * handles (a fallback), so that a call that succeeds does not replace the message of an earlier
 * failing call. */
void cinfer__error_mute(void);
void cinfer__error_unmute(void);

/* Evaluates a status expression and returns it from the enclosing function on failure. */
#define CINFER__CHECK(expr)                                                                        \
    do {                                                                                           \
        cinfer_status_t cinfer__st_ = (expr);                                                      \
        if (cinfer__st_ != CINFER_STATUS_SUCCESS)                                                  \
            return cinfer__st_;                                                                    \
    } while (0)

/* Log levels of CINFER_LOG. */
enum { CINFER__LOG_QUIET = 0, CINFER__LOG_INFO = 1, CINFER__LOG_DEBUG = 2 };

/* Writes one line "cinfer: <message>" to stderr when CINFER_LOG >= level. */
void cinfer__log(int level, const char *fmt, ...) CINFER__PRINTF(2, 3);
/* Always writes a warning line (used once per condition by callers). */
void cinfer__warn(const char *fmt, ...) CINFER__PRINTF(1, 2);

/* The settings read from the environment, once per process. */
typedef struct cinfer__settings {
    char cache_dir[4096]; /* "" when no folder could be derived (no HOME) */
    int log_level;
    bool jit_enabled;
    char nvrtc_path[4096]; /* "" = search */
    char cuda_path[4096];  /* "" = libcuda.so.1 */
    char aot_path[4096];   /* "" = next to the library */
} cinfer__settings_t;

const cinfer__settings_t *cinfer__settings(void);
/* Rereads the environment; for tests that change variables. Not thread-safe. */
void cinfer__settings_reload(void);

/* Reads exactly n bytes (at offset, for pread_full); false on an error or an early end of file. */
bool cinfer__read_full(int fd, void *buf, size_t n);
bool cinfer__pread_full(int fd, void *buf, size_t n, uint64_t offset);
/* Writes exactly n bytes; false with errno set on failure (ENOSPC when no progress is made). */
bool cinfer__write_full(int fd, const void *buf, size_t n);

/* Monotonic seconds. */
double cinfer__now(void);

/* Formats into a fixed buffer; truncates silently (the buffers are sized for their contents). */
void cinfer__fmt(char *dst, size_t cap, const char *fmt, ...) CINFER__PRINTF(3, 4);

/* A growable string for rendering sources and keys. On allocation failure `failed` is set and
 * further appends are ignored, so callers check once at the end. */
typedef struct cinfer__str {
    char *data;
    size_t len, cap;
    bool failed;
} cinfer__str_t;

void cinfer__str_append(cinfer__str_t *s, const char *text, size_t len);
void cinfer__str_puts(cinfer__str_t *s, const char *text);
void cinfer__str_printf(cinfer__str_t *s, const char *fmt, ...) CINFER__PRINTF(2, 3);
void cinfer__str_free(cinfer__str_t *s);

#endif
