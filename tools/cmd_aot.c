/*
 * `cinfer aot`: builds an AOT kernel bundle from a named set of specs (src/jit/aot_set.c) for one
 * or more archs, through the JIT path itself: each spec is rendered by the one renderer, its cubin
 * comes from the disk cache or NVRTC under the same key, and the bundle stores it under that key.
 * `cinfer aot --list FILE` shows what a bundle holds.
 *
 * Compiles run on -j worker threads (NVRTC compiles are independent and single-threaded); every
 * arch and spec is checked and rendered before the first compile.
 */
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "jit/aot.h"
#include "jit/jit.h"

/* More archs than the bundle header holds is refused by the writer; this bounds the parser. */
#define MAX_ARCHS 16
/* Worker threads beyond this gain nothing: NVRTC compiles of one set are few. */
#define MAX_JOBS 64

typedef struct aot_args {
    const char *arch_list, *set, *output, *list;
    int jobs; /* 0 = one per online CPU */
    bool help, set_given;
} aot_args_t;

static int parse_args(int argc, char **argv, aot_args_t *a) {
    memset(a, 0, sizeof *a);
    a->set = "default";
    const char *jobs = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (cli_is_help(arg)) {
            a->help = true;
            return CLI_EXIT_OK;
        }
        /* Every option takes one value: "--name value", or "--name=value" for --arch and --set. */
        static const char *const names[] = {"--arch", "--set", "-o", "--list", "-j"};
        const char **slots[] = {&a->arch_list, &a->set, &a->output, &a->list, &jobs};
        size_t k = 0;
        const char *value = NULL;
        for (; k < sizeof names / sizeof names[0]; k++) {
            const size_t n = strlen(names[k]);
            if (strcmp(arg, names[k]) == 0) {
                if (i + 1 >= argc)
                    return cli_usage_error("aot", "%s needs a value", arg);
                value = argv[++i];
                break;
            }
            if (k < 2 && strncmp(arg, names[k], n) == 0 && arg[n] == '=') {
                value = arg + n + 1;
                break;
            }
        }
        if (k == sizeof names / sizeof names[0])
            return cli_usage_error("aot", "unexpected argument \"%s\"", arg);
        const bool set_twice = slots[k] == &a->set ? a->set_given : *slots[k] != NULL;
        if (set_twice)
            return cli_usage_error("aot", CLI_GIVEN_TWICE, names[k], *slots[k], value);
        *slots[k] = value;
        a->set_given = a->set_given || slots[k] == &a->set;
    }
    if (jobs && ((a->jobs = atoi(jobs)) < 1 || a->jobs > MAX_JOBS))
        return cli_usage_error("aot", "-j %s: expected 1..%d", jobs, MAX_JOBS);
    if (a->list) {
        if (a->arch_list || a->output || a->set_given || a->jobs)
            return cli_usage_error("aot", "--list takes no other arguments");
        return CLI_EXIT_OK;
    }
    if (!a->arch_list)
        return cli_usage_error("aot", "no --arch given (a bundle holds the archs it is built for)");
    if (!a->output)
        return cli_usage_error("aot", "no -o FILE given");
    return CLI_EXIT_OK;
}

/* ---- the build ---- */

/* One (spec, arch) pair: rendered up front, compiled by a worker. */
typedef struct job {
    const char *arch;
    cinfer__rendered_t rendered;
    void *cubin;
    size_t size;
    double seconds;
    cinfer__jit_source_t from;
} job_t;

typedef struct build {
    job_t *jobs;
    size_t num_jobs;
    atomic_size_t next; /* the next job to take */
    int name_width;
    pthread_mutex_t lock;   /* guards the output and the fields below */
    cinfer_status_t status; /* the first failure; later jobs are not started */
    char error[4096];
} build_t;

static void *worker(void *arg) {
    build_t *b = arg;
    for (;;) {
        const size_t i = atomic_fetch_add(&b->next, 1);
        if (i >= b->num_jobs)
            return NULL;
        pthread_mutex_lock(&b->lock);
        const bool failed = b->status != CINFER_STATUS_SUCCESS;
        pthread_mutex_unlock(&b->lock);
        if (failed)
            return NULL;
        job_t *j = &b->jobs[i];
        const double start = cinfer__now();
        cinfer_status_t st =
            cinfer__jit_cubin_rendered(&j->rendered, &j->cubin, &j->size, &j->from);
        j->seconds = cinfer__now() - start;
        pthread_mutex_lock(&b->lock);
        if (st != CINFER_STATUS_SUCCESS) {
            if (b->status == CINFER_STATUS_SUCCESS) {
                b->status = st;
                /* The message is thread-local: carry it to the main thread. */
                cinfer__fmt(b->error, sizeof b->error, "%s", cinfer_last_error());
            }
        } else {
            printf("%-*s  %-7s  %6.2f s  %-10s  %zu bytes\n", b->name_width, j->rendered.name,
                   j->arch, j->seconds,
                   j->from == CINFER__JIT_FROM_COMPILE ? "compiled" : "cache hit", j->size);
            fflush(stdout);
        }
        pthread_mutex_unlock(&b->lock);
    }
}

/* Runs every job on `threads` workers; the first failure's status and message. */
static cinfer_status_t run_jobs(build_t *b, int threads) {
    pthread_t tids[MAX_JOBS];
    int started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tids[started], NULL, worker, b) != 0)
            break;
    if (started == 0)
        worker(b); /* no thread could be started: build on this one */
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    if (b->status != CINFER_STATUS_SUCCESS)
        return cinfer__error(b->status, "%s", b->error);
    return CINFER_STATUS_SUCCESS;
}

/* Renders every spec of the set for every arch with NVRTC version `nvrtc`, into b->jobs. */
static cinfer_status_t plan_jobs(const char *set, char archs[][CLI_ARCH_CHARS], int num_archs,
                                 int nvrtc, build_t *b) {
    cinfer__spec_t *specs[MAX_ARCHS] = {NULL};
    size_t counts[MAX_ARCHS] = {0}, total = 0;
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    for (int a = 0; a < num_archs && st == CINFER_STATUS_SUCCESS; a++) {
        st = cinfer__aot_set_specs(set, archs[a], &specs[a], &counts[a]);
        total += counts[a];
    }
    /* Allocated once: a rendered spec's options point into itself, so it must not move. */
    if (st == CINFER_STATUS_SUCCESS && !(b->jobs = calloc(total ? total : 1, sizeof *b->jobs)))
        st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "aot: out of memory");
    for (int a = 0; a < num_archs && st == CINFER_STATUS_SUCCESS; a++) {
        for (size_t i = 0; i < counts[a] && st == CINFER_STATUS_SUCCESS; i++) {
            job_t *j = &b->jobs[b->num_jobs];
            j->arch = archs[a];
            st = cinfer__spec_render(&specs[a][i], archs[a], nvrtc, &j->rendered);
            if (st != CINFER_STATUS_SUCCESS)
                break;
            b->num_jobs++;
            const int n = (int)strlen(j->rendered.name);
            b->name_width = n > b->name_width ? n : b->name_width;
        }
    }
    for (int a = 0; a < num_archs; a++)
        free(specs[a]);
    return st;
}

static void free_jobs(build_t *b) {
    for (size_t i = 0; i < b->num_jobs; i++) {
        cinfer__rendered_free(&b->jobs[i].rendered);
        free(b->jobs[i].cubin);
    }
    free(b->jobs);
}

static int threads_for(int jobs) {
    if (jobs > 0)
        return jobs;
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus < 1 ? 1 : cpus > MAX_JOBS ? MAX_JOBS : (int)cpus;
}

/* The folder of the bundle to write must exist and be writable: checked before minutes of
 * compiling, which the bundle's temporary file would otherwise be the first to find out. */
static cinfer_status_t check_output_folder(const char *output) {
    char copy[4096];
    if (snprintf(copy, sizeof copy, "%s", output) >= (int)sizeof copy)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "-o: the path is longer than %zu bytes", sizeof copy - 1);
    const char *folder = dirname(copy);
    if (access(folder, W_OK | X_OK) != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "-o %s: cannot write into the folder \"%s\" (%s)", output, folder,
                             strerror(errno));
    return CINFER_STATUS_SUCCESS;
}

static int build_bundle(const aot_args_t *a) {
    const double start = cinfer__now();
    if (check_output_folder(a->output) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    const cinfer__nvrtc_t *nv;
    if (cinfer__nvrtc_get(&nv) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    char archs[MAX_ARCHS][CLI_ARCH_CHARS];
    int num_archs = 0;
    if (cli_parse_archs(a->arch_list, archs, MAX_ARCHS, &num_archs) != CINFER_STATUS_SUCCESS)
        return cli_fail();

    cinfer__aot_identity_t id;
    cinfer__aot_identity_current(&id);
    build_t b;
    memset(&b, 0, sizeof b);
    atomic_init(&b.next, 0);
    pthread_mutex_init(&b.lock, NULL);
    b.status = CINFER_STATUS_SUCCESS;
    cinfer__aot_writer_t *w = NULL;
    int status = CLI_EXIT_FAILED;
    if (plan_jobs(a->set, archs, num_archs, id.nvrtc_version, &b) != CINFER_STATUS_SUCCESS ||
        cinfer__aot_writer_create(&id, &w) != CINFER_STATUS_SUCCESS)
        goto out_free_jobs;
    if (run_jobs(&b, threads_for(a->jobs)) != CINFER_STATUS_SUCCESS)
        goto out_free_jobs;

    size_t compiled = 0;
    for (size_t i = 0; i < b.num_jobs; i++) {
        const job_t *j = &b.jobs[i];
        compiled += j->from == CINFER__JIT_FROM_COMPILE;
        if (cinfer__aot_writer_add(w, j->arch, j->rendered.name, j->rendered.key.data, j->cubin,
                                   j->size) != CINFER_STATUS_SUCCESS)
            goto out_free_jobs;
    }
    uint64_t bytes = 0;
    if (cinfer__aot_writer_finish(w, a->output, &bytes) != CINFER_STATUS_SUCCESS)
        goto out_free_jobs;
    char size[32];
    cli_format_bytes(bytes, size, sizeof size);
    printf("bundle %s: set %s, %zu kernels for %s, %llu bytes (%s), built in %.1f s (%zu compiled, "
           "%zu from the kernel cache)\n",
           a->output, a->set, b.num_jobs, a->arch_list, (unsigned long long)bytes, size,
           cinfer__now() - start, compiled, b.num_jobs - compiled);
    status = CLI_EXIT_OK;

out_free_jobs:
    if (status != CLI_EXIT_OK)
        status = cli_fail();
    cinfer__aot_writer_destroy(w);
    free_jobs(&b);
    pthread_mutex_destroy(&b.lock);
    return status;
}

/* Listing order: by arch, then by kernel name. */
static int compare_listed(const void *pa, const void *pb) {
    const cinfer__aot_entry_t *a = pa, *b = pb;
    const int by_arch = strcmp(a->arch, b->arch);
    return by_arch ? by_arch : strcmp(a->name, b->name);
}

static int list_bundle(const char *path) {
    cinfer__aot_bundle_t *bundle;
    if (cinfer__aot_open(path, &bundle) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    cinfer__aot_info_t info;
    cinfer__aot_info(bundle, &info);
    cinfer__aot_entry_t *entries = calloc(info.count ? info.count : 1, sizeof *entries);
    if (!entries) {
        cinfer__aot_close(bundle);
        cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "aot --list: out of memory");
        return cli_fail();
    }
    int width = 0;
    for (uint32_t i = 0; i < info.count; i++) {
        cinfer__aot_entry(bundle, i, &entries[i]);
        const int n = (int)strlen(entries[i].name);
        width = n > width ? n : width;
    }
    qsort(entries, info.count, sizeof *entries, compare_listed);
    for (uint32_t i = 0; i < info.count; i++)
        printf("%-*s  %-7s  %llu bytes\n", width, entries[i].name, entries[i].arch,
               (unsigned long long)entries[i].cubin_bytes);
    char size[32];
    cli_format_bytes(info.bytes, size, sizeof size);
    printf("bundle %s: cinfer %s, kernel sources %016llx, NVRTC %d.%d, %u kernels for %s, %s\n",
           info.path, info.library_version, info.sources_hash, info.nvrtc_version / 1000,
           info.nvrtc_version % 1000 / 10, (unsigned)info.count, info.archs, size);
    free(entries);
    cinfer__aot_close(bundle);
    return CLI_EXIT_OK;
}

int cli_aot(int argc, char **argv) {
    aot_args_t a;
    int status = parse_args(argc, argv, &a);
    if (status != CLI_EXIT_OK)
        return status;
    if (a.help)
        return cli_print_help("aot");
    if (a.list)
        return list_bundle(a.list);
    return build_bundle(&a);
}
