#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

double cinfer__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cinfer__fmt(char *dst, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

void cinfer__str_append(cinfer__str_t *s, const char *text, size_t len) {
    if (s->failed)
        return;
    if (s->len + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + len + 1)
            cap *= 2;
        char *data = realloc(s->data, cap);
        if (!data) {
            s->failed = true;
            return;
        }
        s->data = data;
        s->cap = cap;
    }
    memcpy(s->data + s->len, text, len);
    s->len += len;
    s->data[s->len] = '\0';
}

void cinfer__str_puts(cinfer__str_t *s, const char *text) {
    cinfer__str_append(s, text, strlen(text));
}

void cinfer__str_printf(cinfer__str_t *s, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        s->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        cinfer__str_append(s, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        s->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    cinfer__str_append(s, big, (size_t)n);
    free(big);
}

void cinfer__str_free(cinfer__str_t *s) {
    free(s->data);
    s->data = NULL;
    s->len = s->cap = 0;
    s->failed = false;
}
