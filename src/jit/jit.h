/*
 * The JIT engine: spec -> cubin (module table, AOT bundle, disk cache, NVRTC, in that order) and
 * spec -> loaded CUfunction in a context.
 */
#ifndef CINFER_JIT_JIT_H
#define CINFER_JIT_JIT_H

#include "cuda/context.h"
#include "jit/cache.h"
#include "jit/spec.h"

/* NVRTC-compiles rendered source into a cubin (malloc'ed). COMPILE_ERROR carries NVRTC's log;
 * NOT_FOUND when CINFER_JIT=off. *seconds receives the compile's wall time. */
cinfer_status_t cinfer__jit_compile(const cinfer__rendered_t *r, void **cubin, size_t *size,
                                    double *seconds);

/* NVRTC's log of this thread's last successful cinfer__jit_compile (its first 4 KiB; "" when
 * NVRTC said nothing): front-end warnings and ptxas remarks such as "Potential Performance Loss"
 * (wgmma serialized). cinfer__jit_compile logs a non-empty one at CINFER_LOG=1 and warns about a
 * performance-loss remark, which the library's own kernels never have (tests/jit). */
const char *cinfer__jit_last_log(void);

/* Where a cubin came from. */
typedef enum cinfer__jit_source {
    CINFER__JIT_FROM_DISK,
    CINFER__JIT_FROM_COMPILE,
    CINFER__JIT_FROM_AOT,
} cinfer__jit_source_t;

/*
 * The cubin of spec for arch, from the AOT bundle, the disk cache or compiled (and cached), in
 * that order. No device needed. *cubin is malloc'ed (caller frees). rendered_name (may be NULL,
 * cap >= 192) receives the kernel name.
 */
cinfer_status_t cinfer__jit_cubin(const cinfer__spec_t *spec, const char *arch, void **cubin,
                                  size_t *size, cinfer__jit_source_t *from, char *rendered_name);

/* The disk-cache-then-compile part of cinfer__jit_cubin for an already rendered spec, skipping
 * the AOT bundle: what `cinfer aot` builds bundles from, so a bundle never copies another. */
cinfer_status_t cinfer__jit_cubin_rendered(const cinfer__rendered_t *r, void **cubin, size_t *size,
                                           cinfer__jit_source_t *from);

/* A kernel loaded in a context. */
typedef struct cinfer__kernel {
    CUfunction function;
    int max_threads; /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */
    int num_regs;
} cinfer__kernel_t;

/* The kernel of spec, loaded into ctx (found in its module table, else via cinfer__jit_cubin). */
cinfer_status_t cinfer__jit_kernel(cinfer_context_t *ctx, const cinfer__spec_t *spec,
                                   cinfer__kernel_t *out);

/* The NVRTC version as major * 1000 + minor * 10, or 0 when NVRTC cannot be loaded. */
int cinfer__jit_nvrtc_version(void);

/* Counters behind cinfer_jit_get_stats. */
void cinfer__jit_count(int which, double seconds);
enum {
    CINFER__STAT_MEMORY_HIT,
    CINFER__STAT_DISK_HIT,
    CINFER__STAT_AOT_HIT,
    CINFER__STAT_MISS,    /* a lookup found no cubin: a compile follows unless CINFER_JIT=off */
    CINFER__STAT_COMPILE, /* an NVRTC compile finished; seconds is its wall time */
};

#endif
