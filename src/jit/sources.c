#include <pthread.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "jit/sources.h"

const cinfer__source_t *cinfer__kernel_source(const char *name) {
    for (size_t i = 0; i < cinfer__kernel_source_count; i++)
        if (strcmp(cinfer__kernel_sources[i].name, name) == 0)
            return &cinfer__kernel_sources[i];
    return NULL;
}

static unsigned long long sources_hash;
static pthread_once_t sources_once = PTHREAD_ONCE_INIT;

static void hash_sources(void) {
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (size_t i = 0; i < cinfer__kernel_source_count; i++) {
        const cinfer__source_t *s = &cinfer__kernel_sources[i];
        /* Names are hashed with their terminating NUL so "a"+"bc" and "ab"+"c" differ. */
        XXH3_64bits_update(&state, s->name, strlen(s->name) + 1);
        XXH3_64bits_update(&state, &s->length, sizeof s->length);
        XXH3_64bits_update(&state, s->text, s->length);
    }
    sources_hash = XXH3_64bits_digest(&state);
}

unsigned long long cinfer__kernel_sources_hash(void) {
    pthread_once(&sources_once, hash_sources);
    return sources_hash;
}
