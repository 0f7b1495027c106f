#include <stdio.h>

#include "core/core.h"

static void vline(const char *prefix, const char *fmt, va_list ap) {
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    /* One fprintf call per line so lines from several threads do not interleave. */
    fprintf(stderr, "cinfer: %s%s\n", prefix, line);
}

void cinfer__log(int level, const char *fmt, ...) {
    if (cinfer__settings()->log_level < level)
        return;
    va_list ap;
    va_start(ap, fmt);
    vline("", fmt, ap);
    va_end(ap);
}

void cinfer__warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline("warning: ", fmt, ap);
    va_end(ap);
}
