#include <stdio.h>
#include <string.h>

#include "core/core.h"

/* Large enough for an NVRTC log excerpt plus context; longer messages are truncated. */
#define CINFER__ERROR_CAP 16384

static _Thread_local char last_error[CINFER__ERROR_CAP];
static _Thread_local cinfer_status_t last_status;
static _Thread_local int muted; /* cinfer__error_mute depth */

const char *cinfer_status_string(cinfer_status_t status) {
    switch (status) {
#define CINFER__STATUS_TEXT(name, value, text)                                                     \
    case CINFER_STATUS_##name:                                                                     \
        return text;
        CINFER_STATUS_LIST(CINFER__STATUS_TEXT)
#undef CINFER__STATUS_TEXT
    }
    return "unknown status";
}

const char *cinfer_status_name(cinfer_status_t status) {
    switch (status) {
#define CINFER__STATUS_NAME(name, value, text)                                                     \
    case CINFER_STATUS_##name:                                                                     \
        return "CINFER_STATUS_" #name;
        CINFER_STATUS_LIST(CINFER__STATUS_NAME)
#undef CINFER__STATUS_NAME
    }
    return "CINFER_STATUS_UNKNOWN";
}

const char *cinfer_last_error(void) {
    return last_error;
}

cinfer_status_t cinfer__last_status(void) {
    return last_status;
}

cinfer_status_t cinfer__verror(cinfer_status_t status, const char *fmt, va_list ap) {
    if (muted > 0) {
        char message[512];
        vsnprintf(message, sizeof message, fmt, ap);
        cinfer__log(CINFER__LOG_DEBUG, "error %s (handled): %s", cinfer_status_name(status),
                    message);
        return status;
    }
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    last_status = status;
    cinfer__log(CINFER__LOG_DEBUG, "error %s: %s", cinfer_status_name(status), last_error);
    return status;
}

void cinfer__error_mute(void) {
    muted++;
}

void cinfer__error_unmute(void) {
    if (muted > 0)
        muted--;
}

cinfer_status_t cinfer__error(cinfer_status_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cinfer__verror(status, fmt, ap);
    va_end(ap);
    return status;
}
