/* The kernel sources of kernels/, embedded at build time by cmake/embed.c. */
#ifndef CINFER_JIT_SOURCES_H
#define CINFER_JIT_SOURCES_H

#include <stddef.h>

typedef struct cinfer__source {
    const char *name; /* file name, as kernels #include it */
    const char *text;
    size_t length;
} cinfer__source_t;

extern const cinfer__source_t cinfer__kernel_sources[];
extern const size_t cinfer__kernel_source_count;

/* The source with this file name, or NULL. */
const cinfer__source_t *cinfer__kernel_source(const char *name);

/* XXH3-64 over every embedded file's name and text: part of every cache key. */
unsigned long long cinfer__kernel_sources_hash(void);

#endif
