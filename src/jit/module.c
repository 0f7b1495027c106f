/*
 * The per-context module table and the process-wide JIT statistics.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "jit/jit.h"

static _Atomic uint64_t stat_memory_hits, stat_disk_hits, stat_aot_hits, stat_misses, stat_compiles;
static _Atomic uint64_t stat_compile_micros;

void cinfer__jit_count(int which, double seconds) {
    switch (which) {
    case CINFER__STAT_MEMORY_HIT:
        atomic_fetch_add(&stat_memory_hits, 1);
        break;
    case CINFER__STAT_DISK_HIT:
        atomic_fetch_add(&stat_disk_hits, 1);
        break;
    case CINFER__STAT_AOT_HIT:
        atomic_fetch_add(&stat_aot_hits, 1);
        break;
    case CINFER__STAT_MISS:
        atomic_fetch_add(&stat_misses, 1);
        break;
    case CINFER__STAT_COMPILE:
        atomic_fetch_add(&stat_compiles, 1);
        atomic_fetch_add(&stat_compile_micros, (uint64_t)(seconds * 1e6));
        break;
    }
}

cinfer_status_t cinfer_jit_get_stats(cinfer_jit_stats_t *stats) {
    if (!stats)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "stats is NULL");
    if (stats->size < sizeof *stats || stats->version != CINFER_JIT_STATS_VERSION)
        return cinfer__error(
            CINFER_STATUS_INVALID_ARGUMENT,
            "stats: size %zu / version %u; initialize it with CINFER_JIT_STATS_INIT "
            "(size %zu, version %u)",
            stats->size, stats->version, sizeof *stats, CINFER_JIT_STATS_VERSION);
    stats->memory_hits = atomic_load(&stat_memory_hits);
    stats->disk_hits = atomic_load(&stat_disk_hits);
    stats->aot_hits = atomic_load(&stat_aot_hits);
    stats->misses = atomic_load(&stat_misses);
    stats->compiles = atomic_load(&stat_compiles);
    stats->compile_seconds = (double)atomic_load(&stat_compile_micros) * 1e-6;
    stats->cache_write_fails = cinfer__cache_write_failures();
    return CINFER_STATUS_SUCCESS;
}

static cinfer__module_entry_t *find_entry(cinfer_context_t *ctx, const cinfer__spec_t *spec) {
    for (size_t i = 0; i < ctx->num_modules; i++)
        if (memcmp(&ctx->modules[i].spec, spec, sizeof *spec) == 0)
            return &ctx->modules[i];
    return NULL;
}

static void fill_kernel(const cinfer__module_entry_t *e, cinfer__kernel_t *out) {
    out->function = e->function;
    out->max_threads = e->max_threads;
    out->num_regs = e->num_regs;
}

cinfer_status_t cinfer__jit_kernel(cinfer_context_t *ctx, const cinfer__spec_t *in,
                                   cinfer__kernel_t *out) {
    cinfer__spec_t spec = *in;
    cinfer__spec_normalize(&spec);

    pthread_mutex_lock(&ctx->lock);
    cinfer__module_entry_t *hit = find_entry(ctx, &spec);
    if (hit) {
        fill_kernel(hit, out);
        pthread_mutex_unlock(&ctx->lock);
        cinfer__jit_count(CINFER__STAT_MEMORY_HIT, 0);
        return CINFER_STATUS_SUCCESS;
    }
    pthread_mutex_unlock(&ctx->lock);

    /* Compile or read outside the lock: the disk cache's per-key lock keeps two threads from
     * compiling the same kernel, and other kernels are not held up. */
    void *cubin = NULL;
    size_t size = 0;
    char name[192];
    CINFER__CHECK(cinfer__jit_cubin(&spec, ctx->arch, &cubin, &size, NULL, name));

    cinfer_status_t st = cinfer__context_activate(ctx);
    if (st != CINFER_STATUS_SUCCESS) {
        free(cubin);
        return st;
    }
    const cinfer__cuda_t *cu = ctx->cu;
    cinfer__module_entry_t e;
    memset(&e, 0, sizeof e);
    e.spec = spec;
    CUresult res = cu->cuModuleLoadData(&e.module, cubin);
    free(cubin);
    if (res != CUDA_SUCCESS)
        return cinfer__cu_error(res, name);
    res = cu->cuModuleGetFunction(&e.function, e.module, name);
    if (res == CUDA_SUCCESS)
        res = cu->cuFuncGetAttribute(&e.max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                     e.function);
    if (res == CUDA_SUCCESS)
        res = cu->cuFuncGetAttribute(&e.num_regs, CU_FUNC_ATTRIBUTE_NUM_REGS, e.function);
    if (res != CUDA_SUCCESS) {
        cu->cuModuleUnload(e.module);
        return cinfer__cu_error(res, name);
    }

    pthread_mutex_lock(&ctx->lock);
    hit = find_entry(ctx, &spec);
    if (hit) {
        /* Another thread loaded it meanwhile: keep theirs. */
        fill_kernel(hit, out);
        pthread_mutex_unlock(&ctx->lock);
        cu->cuModuleUnload(e.module);
        return CINFER_STATUS_SUCCESS;
    }
    if (ctx->num_modules == ctx->cap_modules) {
        size_t cap = ctx->cap_modules ? ctx->cap_modules * 2 : 16;
        cinfer__module_entry_t *grown = realloc(ctx->modules, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&ctx->lock);
            cu->cuModuleUnload(e.module);
            return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "module table: out of memory");
        }
        ctx->modules = grown;
        ctx->cap_modules = cap;
    }
    ctx->modules[ctx->num_modules++] = e;
    fill_kernel(&e, out);
    pthread_mutex_unlock(&ctx->lock);
    return CINFER_STATUS_SUCCESS;
}
