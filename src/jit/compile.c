/*
 * NVRTC compilation and the cubin lookup path (AOT bundle, disk cache, then compile under the
 * per-key lock).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "jit/aot.h"
#include "jit/jit.h"
#include "jit/sources.h"

int cinfer__jit_nvrtc_version(void) {
    const cinfer__nvrtc_t *nv;
    if (cinfer__nvrtc_get(&nv) != CINFER_STATUS_SUCCESS)
        return 0;
    return nv->major * 1000 + nv->minor * 10;
}

static _Thread_local char last_log[4096];

const char *cinfer__jit_last_log(void) {
    return last_log;
}

/* NVRTC's log of prog (malloc'ed, NUL-terminated; NULL when it cannot be read). */
static char *program_log(const cinfer__nvrtc_t *nv, nvrtcProgram prog) {
    size_t log_size = 0;
    if (nv->nvrtcGetProgramLogSize(prog, &log_size) != NVRTC_SUCCESS)
        return NULL;
    char *log = malloc(log_size + 1);
    if (!log || nv->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
        free(log);
        return NULL;
    }
    log[log_size] = '\0';
    return log;
}

/* Keeps NVRTC's log of a successful compile (last_log) and reports it: a log line at CINFER_LOG=1,
 * a warning for a ptxas performance-loss remark (a user's variant that makes the kernel serialize
 * its wgmmas, for example). */
static void keep_log(const cinfer__nvrtc_t *nv, nvrtcProgram prog, const cinfer__rendered_t *r) {
    last_log[0] = '\0';
    char *log = program_log(nv, prog);
    if (log && log[0]) {
        const char *arch = r->arch_option + strlen("--gpu-architecture=");
        const char *loss = strstr(log, "Performance Loss");
        cinfer__fmt(last_log, sizeof last_log, "%s", log);
        cinfer__log(CINFER__LOG_INFO, "NVRTC's log for %s (%s):\n%s", r->name, arch, log);
        if (loss)
            cinfer__warn("%s (%s): ptxas reports a potential performance loss (CINFER_LOG=1 shows "
                         "NVRTC's whole log): %s",
                         r->name, arch, loss);
    }
    free(log);
}

/* NVRTC sees every embedded kernel file as a header, so templates #include each other by name. */
static void header_tables(const char **texts, const char **names) {
    for (size_t i = 0; i < cinfer__kernel_source_count; i++) {
        texts[i] = cinfer__kernel_sources[i].text;
        names[i] = cinfer__kernel_sources[i].name;
    }
}

cinfer_status_t cinfer__jit_compile(const cinfer__rendered_t *r, void **cubin, size_t *size,
                                    double *seconds) {
    if (!cinfer__settings()->jit_enabled)
        return cinfer__error(CINFER_STATUS_NOT_FOUND,
                             "kernel %s for %s is not in the %s and CINFER_JIT=off forbids "
                             "compiling it",
                             r->name, r->arch_option + strlen("--gpu-architecture="),
                             cinfer__aot_process_bundle()
                                 ? "AOT bundle or the kernel cache"
                                 : "kernel cache (no AOT bundle is loaded: CINFER_AOT_PATH names "
                                   "one; without it libcinfer.so looks for libcinfer.aot next to "
                                   "itself, and a program linked statically, as the cinfer tool's "
                                   "compile command, looks nowhere)");
    const cinfer__nvrtc_t *nv;
    CINFER__CHECK(cinfer__nvrtc_get(&nv));

    size_t n = cinfer__kernel_source_count;
    const char **texts = calloc(n + 1, sizeof *texts);
    const char **names = calloc(n + 1, sizeof *names);
    if (!texts || !names) {
        free(texts);
        free(names);
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "compiling %s: out of memory", r->name);
    }
    header_tables(texts, names);

    double start = cinfer__now();
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    nvrtcProgram prog = NULL;
    char file[224];
    cinfer__fmt(file, sizeof file, "%s.cu", r->name);
    nvrtcResult res = nv->nvrtcCreateProgram(&prog, r->source.data, file, (int)n, texts, names);
    free(texts);
    free(names);
    if (res != NVRTC_SUCCESS)
        return cinfer__error(CINFER_STATUS_COMPILE_ERROR, "%s: nvrtcCreateProgram: %s", r->name,
                             nv->nvrtcGetErrorString(res));

    res = nv->nvrtcCompileProgram(prog, r->num_options, r->options);
    if (res != NVRTC_SUCCESS) {
        char *log = program_log(nv, prog);
        st =
            cinfer__error(CINFER_STATUS_COMPILE_ERROR, "%s: NVRTC failed (%s) for %s:\n%s", r->name,
                          nv->nvrtcGetErrorString(res), r->arch_option, log ? log : "(no log)");
        free(log);
        goto out_destroy_program;
    }
    keep_log(nv, prog, r);
    size_t bytes = 0;
    if ((res = nv->nvrtcGetCUBINSize(prog, &bytes)) != NVRTC_SUCCESS || bytes == 0) {
        st = cinfer__error(CINFER_STATUS_COMPILE_ERROR, "%s: no cubin (%s)", r->name,
                           nv->nvrtcGetErrorString(res));
        goto out_destroy_program;
    }
    void *data = malloc(bytes);
    if (!data) {
        st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "%s: out of memory for the cubin", r->name);
        goto out_destroy_program;
    }
    nv->nvrtcGetCUBIN(prog, data);
    *cubin = data;
    *size = bytes;
    *seconds = cinfer__now() - start;
    cinfer__log(CINFER__LOG_INFO, "compiled %s for %s in %.2f s", r->name,
                r->arch_option + strlen("--gpu-architecture="), *seconds);
out_destroy_program:
    nv->nvrtcDestroyProgram(&prog);
    return st;
}

typedef struct compile_arg {
    const cinfer__rendered_t *rendered;
} compile_arg_t;

static cinfer_status_t compile_for_cache(void *arg, void **payload, size_t *size) {
    compile_arg_t *a = arg;
    double seconds = 0;
    cinfer__jit_count(CINFER__STAT_MISS, 0);
    CINFER__CHECK(cinfer__jit_compile(a->rendered, payload, size, &seconds));
    cinfer__jit_count(CINFER__STAT_COMPILE, seconds);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__jit_cubin_rendered(const cinfer__rendered_t *r, void **cubin, size_t *size,
                                           cinfer__jit_source_t *from) {
    compile_arg_t arg = {r};
    cinfer__cache_outcome_t outcome;
    CINFER__CHECK(cinfer__cache_get_or_compile(cinfer__settings()->cache_dir, r->file_stem,
                                               r->key.data, compile_for_cache, &arg, cubin, size,
                                               &outcome));
    if (outcome == CINFER__CACHE_HIT)
        cinfer__jit_count(CINFER__STAT_DISK_HIT, 0);
    if (from)
        *from = outcome == CINFER__CACHE_HIT ? CINFER__JIT_FROM_DISK : CINFER__JIT_FROM_COMPILE;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__jit_cubin(const cinfer__spec_t *spec, const char *arch, void **cubin,
                                  size_t *size, cinfer__jit_source_t *from, char *rendered_name) {
    /* The bundle first: a hit needs neither NVRTC (not even loaded) nor the disk. */
    if (cinfer__aot_lookup(spec, arch, cubin, size, rendered_name)) {
        cinfer__jit_count(CINFER__STAT_AOT_HIT, 0);
        if (from)
            *from = CINFER__JIT_FROM_AOT;
        return CINFER_STATUS_SUCCESS;
    }
    cinfer__rendered_t r;
    CINFER__CHECK(cinfer__spec_render(spec, arch, cinfer__jit_nvrtc_version(), &r));
    if (rendered_name)
        cinfer__fmt(rendered_name, 192, "%s", r.name);
    cinfer_status_t st = cinfer__jit_cubin_rendered(&r, cubin, size, from);
    cinfer__rendered_free(&r);
    return st;
}
