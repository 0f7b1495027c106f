/*
 * The `cinfer` command-line tool, run as a separate process: exit statuses, what each command
 * prints, and the kernel cache it leaves behind. Every test gets its own temporary cache folder,
 * removed afterwards, and the child's environment is pinned (CINFER_CACHE_DIR set, CINFER_JIT and
 * CINFER_LOG unset) so the outcome does not depend on the caller's shell.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SPEC   "merge_states:dtype=bf16,head_dim=128,vec=8"
#define KERNEL "merge_states_bf16_hd128_vec8"
/* A library path that cannot exist, to take the no-driver path on any machine. */
#define NO_DRIVER "CINFER_CUDA_PATH=/nonexistent/cinfer-test/libcuda.so.1"

typedef struct fixture {
    char root[256];  /* mkdtemp folder holding everything below */
    char cache[300]; /* CINFER_CACHE_DIR of every run */
    char out[300], err[300];
} fixture_t;

typedef struct result {
    int status; /* exit status; -1 when the child died of a signal */
    char *out, *err;
} result_t;

static char binary[4096];

static int setup(void **state) {
    const char *dir = getenv("CINFER_TEST_BINARY_DIR");
    if (!dir || !dir[0]) {
        fprintf(stderr, "CINFER_TEST_BINARY_DIR is not set (run the test through ctest)\n");
        return -1;
    }
    snprintf(binary, sizeof binary, "%s/cinfer", dir);
    fixture_t *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(f->root, sizeof f->root, "%s/cinfer-cli-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(f->root)) {
        free(f);
        return -1;
    }
    snprintf(f->cache, sizeof f->cache, "%s/cache", f->root);
    snprintf(f->out, sizeof f->out, "%s/stdout", f->root);
    snprintf(f->err, sizeof f->err, "%s/stderr", f->root);
    if (mkdir(f->cache, 0755) != 0) {
        rmdir(f->root);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

static int teardown(void **state) {
    fixture_t *f = *state;
    int rc = nftw(f->root, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return rc;
}

static char *read_all(const char *path) {
    FILE *file = fopen(path, "rb");
    if (!file)
        return strdup("");
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + len, 1, cap - len - 1, file)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            char *grown = realloc(text, cap * 2);
            if (!grown) {
                free(text);
                text = NULL;
                break;
            }
            text = grown;
            cap *= 2;
        }
    }
    fclose(file);
    if (text)
        text[len] = '\0';
    return text;
}

/*
 * Runs the tool with args (NULL-terminated). env holds extra "NAME=VALUE" settings for the
 * child (NULL-terminated, may be NULL). stdout and stderr go to files that are read back.
 */
static result_t run_env(const fixture_t *f, const char *const *env, const char *const *args) {
    result_t r = {-1, NULL, NULL};
    const char *argv[32];
    int argc = 0;
    argv[argc++] = binary;
    for (; args && args[argc - 1] && argc < 31; argc++)
        argv[argc] = args[argc - 1];
    argv[argc] = NULL;

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int out = open(f->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(f->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
            _exit(126);
        setenv("CINFER_CACHE_DIR", f->cache, 1);
        unsetenv("CINFER_JIT");
        unsetenv("CINFER_LOG");
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execv(binary, (char *const *)argv);
        _exit(127);
    }
    int wstatus = 0;
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
    r.out = read_all(f->out);
    r.err = read_all(f->err);
    assert_non_null(r.out);
    assert_non_null(r.err);
    /* 126/127: the child could not redirect or exec; that is a broken test setup. */
    if (r.status == 126 || r.status == 127)
        fail_msg("could not run %s (status %d)", binary, r.status);
    return r;
}

#define ARGS(...)            ((const char *const[]){__VA_ARGS__, NULL})
#define ENV(...)             ((const char *const[]){__VA_ARGS__, NULL})
#define RUN(f, ...)          run_env((f), NULL, ARGS(__VA_ARGS__))
#define RUN_ENV(f, env, ...) run_env((f), (env), ARGS(__VA_ARGS__))

static void result_free(result_t *r) {
    free(r->out);
    free(r->err);
}

/* The number of lines of text that contain every one of the NULL-terminated needles. */
static int count_lines(const char *text, const char *const *needles) {
    int count = 0;
    while (*text) {
        const char *end = strchr(text, '\n');
        size_t len = end ? (size_t)(end - text) : strlen(text);
        char *line = strndup(text, len);
        assert_non_null(line);
        bool all = true;
        for (int i = 0; needles[i]; i++)
            all = all && strstr(line, needles[i]) != NULL;
        count += all;
        free(line);
        text += len + (end ? 1 : 0);
    }
    return count;
}
#define COUNT(text, ...) count_lines((text), ARGS(__VA_ARGS__))

/* A copy of the first line that starts with prefix, or NULL. */
static char *line_starting(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= n && strncmp(p, prefix, n) == 0)
            return strndup(p, len);
        p += len + (end ? 1 : 0);
    }
    return NULL;
}

/* Prints what the child said when an assertion is about to fail, so the log explains it. */
static void show(const char *what, const result_t *r) {
    fprintf(stderr, "--- %s: status %d\n--- stdout:\n%s--- stderr:\n%s---\n", what, r->status,
            r->out, r->err);
}

static void assert_failed_with(const result_t *r, int status, const char *message) {
    if (r->status != status || strncmp(r->err, "cinfer: error: ", 15) != 0 ||
        !strstr(r->err, message))
        show(message, r);
    assert_int_equal(r->status, status);
    assert_memory_equal(r->err, "cinfer: error: ", 15);
    assert_non_null(strstr(r->err, message));
    /* A failed command (not a usage error) names the library's status after its message. */
    if (status == 1)
        assert_non_null(strstr(r->err, " [CINFER_STATUS_"));
}

/* ---- help and usage ---- */

static void help_lists_every_command(void **state) {
    fixture_t *f = *state;
    const char *const forms[][2] = {{"--help", NULL}, {"help", NULL}, {"-h", NULL}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        result_t r = run_env(f, NULL, forms[i]);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "usage: cinfer"));
        assert_int_equal(COUNT(r.out, "  info "), 1);
        assert_int_equal(COUNT(r.out, "  cache "), 1);
        assert_int_equal(COUNT(r.out, "  compile "), 1);
        assert_int_equal(COUNT(r.out, "  demo "), 1);
        assert_string_equal(r.err, "");
        result_free(&r);
    }
    result_t r = RUN(f, "help", "compile");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--arch"));
    assert_non_null(strstr(r.out, "--list-ops"));
    result_free(&r);
    r = RUN(f, "compile", "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--load"));
    result_free(&r);
    r = RUN(f, "--version");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "cinfer 0."));
    result_free(&r);
    /* --version is in the command list, and `help help` is that list. */
    r = RUN(f, "--help");
    assert_int_equal(COUNT(r.out, "cinfer --version"), 1);
    result_free(&r);
    r = RUN(f, "help", "help");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    assert_non_null(strstr(r.out, "usage: cinfer <command>"));
    assert_int_equal(COUNT(r.out, "  compile "), 1);
    result_free(&r);
}

static void usage_errors_exit_2(void **state) {
    fixture_t *f = *state;
    static const char *const cases[][7] = {
        {NULL},
        {"frobnicate", NULL},
        {"help", "frobnicate", NULL},
        {"compile", NULL},
        {"compile", "--arch", NULL},
        {"compile", "--frobnicate", SPEC, NULL},
        {"compile", "--list-ops", SPEC, NULL},
        {"compile", "--arch", "sm_90a", "--arch", "sm_80", SPEC, NULL},
        {"compile", "--arch=sm_90a", "--arch", "sm_90a", SPEC, NULL},
        {"cache", NULL},
        {"cache", "frobnicate", NULL},
        {"cache", "ls", "extra", NULL},
        {"info", "extra", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result_t r = run_env(f, NULL, cases[i]);
        if (r.status != 2)
            show(cases[i][0] ? cases[i][0] : "(no arguments)", &r);
        assert_int_equal(r.status, 2);
        assert_memory_equal(r.err, "cinfer: error: ", 15);
        assert_non_null(strstr(r.err, "usage: cinfer"));
        assert_string_equal(r.out, "");
        result_free(&r);
    }
    result_t r = RUN(f, "frobnicate");
    assert_non_null(strstr(r.err, "unknown command \"frobnicate\""));
    result_free(&r);
    /* An option of one value given twice is refused, naming both values (the last does not
     * silently win). */
    r = RUN(f, "compile", "--arch", "sm_90a", "--arch=sm_80", SPEC);
    assert_failed_with(&r, 2, "--arch is given twice (\"sm_90a\", then \"sm_80\"): give it once");
    result_free(&r);
}

/* ---- info ---- */

static void info_reports_library_driver_nvrtc_devices_and_cache(void **state) {
    fixture_t *f = *state;
    result_t r = RUN(f, "info");
    if (r.status != 0)
        show("info", &r);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    assert_non_null(strstr(r.out, "0.1."));
    char *nvrtc = line_starting(r.out, "NVRTC:");
    assert_non_null(nvrtc);
    free(nvrtc);
    char *cache = line_starting(r.out, "kernel cache:");
    assert_non_null(cache);
    assert_non_null(strstr(cache, f->cache));
    assert_non_null(strstr(cache, "(0 entries"));
    free(cache);
    char *jit = line_starting(r.out, "JIT stats:");
    assert_non_null(jit);
    assert_non_null(strstr(jit, "misses"));
    free(jit);
    char *settings = line_starting(r.out, "settings:");
    assert_non_null(settings);
    assert_non_null(strstr(settings, "CINFER_LOG=0 (quiet), CINFER_JIT=on"));
    free(settings);

    /* Either machine is fine, but the lines must agree with each other. */
    char *driver = line_starting(r.out, "CUDA driver:");
    char *devices = line_starting(r.out, "devices:");
    assert_non_null(driver);
    assert_non_null(devices);
    if (strstr(driver, "not found")) {
        assert_non_null(strstr(devices, "none"));
        assert_null(strstr(r.out, "device 0:"));
    } else {
        assert_non_null(strstr(driver, "found, version "));
        assert_null(strstr(devices, "none"));
        char *first = line_starting(r.out, "  device 0: ");
        assert_non_null(first);
        assert_non_null(strstr(first, "compute capability "));
        assert_non_null(strstr(first, " SMs, "));
        assert_non_null(strstr(first, "arch sm_"));
        free(first);
    }
    free(driver);
    free(devices);
    result_free(&r);
}

static void info_without_driver_still_succeeds(void **state) {
    fixture_t *f = *state;
    result_t r = RUN_ENV(f, ENV(NO_DRIVER, "CINFER_JIT=off", "CINFER_LOG=1"), "info");
    assert_int_equal(r.status, 0);
    char *driver = line_starting(r.out, "CUDA driver:");
    assert_non_null(driver);
    assert_non_null(strstr(driver, "not found: no CUDA driver"));
    assert_non_null(strstr(driver, "/nonexistent/cinfer-test/libcuda.so.1"));
    free(driver);
    char *devices = line_starting(r.out, "devices:");
    assert_non_null(devices);
    assert_non_null(strstr(devices, "none (no CUDA device or driver)"));
    free(devices);
    assert_non_null(strstr(r.out, "CINFER_LOG=1 (info), CINFER_JIT=off"));
    result_free(&r);
}

/* The toolkit's stub libcuda loads but fails every call, cuGetErrorName included: the message
 * still says what failed (the CUresult) and what was loaded. */
static void info_with_the_stub_driver_names_it(void **state) {
    fixture_t *f = *state;
    struct stat st;
    if (stat(CINFER_TEST_CUDA_STUB, &st) != 0) {
        printf("no stub libcuda at %s: nothing to check\n", CINFER_TEST_CUDA_STUB);
        return;
    }
    result_t r =
        RUN_ENV(f, ENV("CINFER_CUDA_PATH=" CINFER_TEST_CUDA_STUB, "CINFER_JIT=off"), "info");
    assert_int_equal(r.status, 0);
    char *driver = line_starting(r.out, "CUDA driver:");
    assert_non_null(driver);
    assert_non_null(strstr(driver, "loaded but failed with"));
    assert_non_null(strstr(driver, "(CUresult 34): it is the CUDA toolkit's stub library"));
    assert_non_null(strstr(driver, "CINFER_CUDA_PATH"));
    free(driver);
    result_free(&r);
}

/* ---- cache ---- */

static void cache_ls_on_empty_and_missing_folders(void **state) {
    fixture_t *f = *state;
    result_t r = RUN(f, "cache", "ls");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "total: 0 entries, 0 B in ", f->cache), 1);
    assert_null(strstr(r.out, "KERNEL"));
    assert_string_equal(r.err, "");
    result_free(&r);

    /* A missing folder is an empty cache (the first compile creates it): exit 0, with a note on
     * stderr that names the folder, so a mistyped CINFER_CACHE_DIR is seen. */
    assert_int_equal(rmdir(f->cache), 0);
    r = RUN(f, "cache", "ls");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "total: 0 entries"), 1);
    assert_int_equal(
        COUNT(r.err, "cinfer: note: the kernel cache folder ", f->cache, " does not exist"), 1);
    result_free(&r);
    r = RUN(f, "cache", "clear");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "removed 0 entries"), 1);
    assert_int_equal(COUNT(r.err, "cinfer: note: ", f->cache, " does not exist"), 1);
    result_free(&r);
    r = RUN(f, "info");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "kernel cache:", "(0 entries", "does not exist yet"), 1);
    result_free(&r);
}

static void cache_ls_flags_a_corrupt_entry(void **state) {
    fixture_t *f = *state;
    char path[512];
    snprintf(path, sizeof path, "%s/%s-00112233445566778899aabbccddeeff.cubin", f->cache, KERNEL);
    FILE *junk = fopen(path, "wb");
    assert_non_null(junk);
    fputs("this is not a cache entry, just some bytes that are long enough", junk);
    fclose(junk);

    result_t r = RUN(f, "cache", "ls");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, KERNEL, "corrupt"), 1);
    assert_int_equal(COUNT(r.out, "total: 1 entry,"), 1);
    result_free(&r);
    r = RUN(f, "cache", "clear");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "removed 1 entry"), 1);
    result_free(&r);
    assert_int_equal(access(path, F_OK), -1);
}

/* ---- compile ---- */

static void compile_then_hit_then_list_then_clear(void **state) {
    fixture_t *f = *state;
    result_t r = RUN(f, "compile", "--arch", "sm_80,sm_90a", SPEC);
    if (r.status != 0)
        show("first compile", &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "compiled in "), 2);
    assert_int_equal(COUNT(r.out, KERNEL, "sm_80 ", "compiled in ", " s ", " bytes"), 1);
    assert_int_equal(COUNT(r.out, KERNEL, "sm_90a", "compiled in ", " s ", " bytes"), 1);
    assert_int_equal(COUNT(r.out, "cache hit"), 0);
    result_free(&r);

    r = RUN(f, "compile", "--arch=sm_80,sm_90a", SPEC);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, KERNEL, "cache hit (", " ms)", " bytes"), 2);
    assert_int_equal(COUNT(r.out, "compiled"), 0);
    result_free(&r);

    /* The hits come from disk: with compiling forbidden they still succeed. */
    r = RUN_ENV(f, ENV("CINFER_JIT=off"), "compile", "--arch", "sm_90a,sm_80", SPEC);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "cache hit"), 2);
    result_free(&r);

    r = RUN(f, "cache", "ls");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, KERNEL), 2);
    assert_int_equal(COUNT(r.out, KERNEL, " sm_80 "), 1);
    assert_int_equal(COUNT(r.out, KERNEL, " sm_90a "), 1);
    assert_int_equal(COUNT(r.out, "corrupt"), 0);
    assert_int_equal(COUNT(r.out, "total: 2 entries, ", f->cache), 1);
    result_free(&r);

    r = RUN(f, "info");
    assert_int_equal(COUNT(r.out, "kernel cache:", "(2 entries, "), 1);
    result_free(&r);

    r = RUN(f, "cache", "clear");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "removed 2 entries", f->cache), 1);
    result_free(&r);

    r = RUN(f, "cache", "ls");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, KERNEL), 0);
    assert_int_equal(COUNT(r.out, "total: 0 entries"), 1);
    result_free(&r);

    /* And now nothing is cached: with compiling forbidden the spec cannot be had, and the
     * message says that no bundle was there to look in (compile uses none beside the tool). */
    r = RUN_ENV(f, ENV("CINFER_JIT=off"), "compile", "--arch", "sm_90a", SPEC);
    assert_failed_with(&r, 1, "CINFER_JIT=off");
    assert_non_null(strstr(r.err, "no AOT bundle is loaded"));
    result_free(&r);
}

static void compile_unknown_field_names_it(void **state) {
    fixture_t *f = *state;
    result_t r = RUN(f, "compile", "--arch", "sm_90a", SPEC, "merge_states:dtype=bf16,bogus=1");
    assert_failed_with(&r, 1, "unknown field \"bogus\"");
    assert_non_null(strstr(r.err, "[CINFER_STATUS_INVALID_ARGUMENT]"));
    /* Every spec is checked before the first compile. */
    assert_string_equal(r.out, "");
    result_free(&r);
    r = RUN(f, "compile", "nope:dtype=bf16");
    assert_failed_with(&r, 1, "unknown operation \"nope\"");
    result_free(&r);
    /* A field left out is "not given" (INVALID_ARGUMENT, as every missing field); one given as 0
     * is out of range, with its value and the range. */
    r = RUN(f, "compile", "merge_states:dtype=bf16,head_dim=0,vec=8");
    assert_failed_with(&r, 1, "head_dim_vo 0 is out of range [1, 1024]");
    assert_null(strstr(r.err, "not given"));
    result_free(&r);
    r = RUN(f, "compile", "merge_states:dtype=bf16");
    assert_failed_with(&r, 1, "merge_states: head_dim_vo is not given (head_dim_vo=N");
    assert_non_null(strstr(r.err, "[CINFER_STATUS_INVALID_ARGUMENT]"));
    result_free(&r);
    r = RUN(f, "compile", "--arch", "sm_90a",
            "decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=0");
    assert_failed_with(&r, 1, "decode: warps 0 outside [1, 8]");
    assert_null(strstr(r.err, "not given"));
    result_free(&r);
    r = RUN(f, "compile", "--arch", "sm_90a",
            "decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4");
    assert_failed_with(&r, 1, "decode: warps is not given (warps=N)");
    result_free(&r);
    /* An empty item of a spec is refused as one of --arch is. */
    r = RUN(f, "compile", "--arch", "sm_90a", "merge_states:dtype=bf16,,head_dim=128,vec=8");
    assert_failed_with(&r, 1,
                       "spec \"merge_states:dtype=bf16,,head_dim=128,vec=8\": empty field at "
                       "column 25");
    assert_string_equal(r.out, "");
    result_free(&r);
    /* A custom mask is a variant, not a value of mask=. */
    r = RUN(f, "compile", "--arch", "sm_90a", "prefill:backend=sm80,mask=custom");
    assert_failed_with(&r, 1, "\"custom\" is not a mask of the spec (expected none or causal)");
    assert_non_null(strstr(r.err, "variant=custom_mask"));
    result_free(&r);
    /* Of several specs, the one that fails validation is named. */
    r = RUN(f, "compile", "--arch", "sm_90a", SPEC, "merge_states:dtype=bf16,head_dim=64,vec=5");
    assert_failed_with(&r, 1, "spec \"merge_states:dtype=bf16,head_dim=64,vec=5\": ");
    assert_string_equal(r.out, "");
    result_free(&r);
    r = RUN(f, "cache", "ls");
    assert_int_equal(COUNT(r.out, "total: 0 entries"), 1);
    result_free(&r);
}

/* compile exists to fill the cache: a cubin it cannot store fails the command (the library only
 * warns and compiles in memory). */
static void compile_into_an_unusable_cache_fails(void **state) {
    fixture_t *f = *state;
    result_t r =
        RUN_ENV(f, ENV("CINFER_CACHE_DIR=/dev/null/cache"), "compile", "--arch", "sm_90a", SPEC);
    /* (stderr: the library's warning first, then the error) */
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "cinfer: warning: kernel cache not usable"));
    assert_non_null(strstr(r.err, "cinfer: error: the kernel cache could not store the cubins"));
    assert_non_null(strstr(r.err, "[CINFER_STATUS_IO_ERROR]"));
    result_free(&r);
}

static void compile_bad_arch_fails_before_compiling(void **state) {
    fixture_t *f = *state;
    result_t r = RUN(f, "compile", "--arch", "sm_xx", SPEC);
    assert_failed_with(&r, 1, "\"sm_xx\" is not an arch");
    result_free(&r);
    r = RUN(f, "compile", "--arch", "sm_80,compute_90", SPEC);
    assert_failed_with(&r, 1, "\"compute_90\" is not an arch");
    assert_string_equal(r.out, "");
    result_free(&r);
    r = RUN(f, "compile", "--arch", "sm_80,", SPEC);
    assert_failed_with(&r, 1, "is not an arch");
    result_free(&r);
    r = RUN(f, "compile", "--arch", "sm_99", SPEC);
    assert_failed_with(&r, 1, "sm_99");
    assert_string_equal(r.out, "");
    result_free(&r);
    /* Archs older than sm_80 are refused up front, by name, not by ptxas's output. */
    r = RUN(f, "compile", "--arch", "sm_80,sm_75", SPEC);
    assert_failed_with(&r, 1, "--arch: sm_75 is older than sm_80");
    assert_non_null(strstr(r.err, "[CINFER_STATUS_UNSUPPORTED]"));
    assert_null(strstr(r.err, "ptxas"));
    assert_int_equal(COUNT(r.err, ""), 1);
    assert_string_equal(r.out, "");
    result_free(&r);
    char bundle[400];
    snprintf(bundle, sizeof bundle, "%s/old.aot", f->root);
    r = RUN(f, "aot", "--arch", "sm_70", "--set", "ci", "-o", bundle);
    assert_failed_with(&r, 1, "--arch: sm_70 is older than sm_80");
    assert_string_equal(r.out, "");
    result_free(&r);
    r = RUN_ENV(f, ENV(NO_DRIVER), "bench", "serve", "--arch", "sm_75", "--steps", "2");
    assert_failed_with(&r, 1, "--arch: sm_75 is older than sm_80");
    /* before the replay */
    assert_string_equal(r.out, "");
    result_free(&r);
    r = RUN(f, "cache", "ls");
    assert_int_equal(COUNT(r.out, "total: 0 entries"), 1);
    result_free(&r);
}

static void compile_list_ops(void **state) {
    fixture_t *f = *state;
    result_t r = RUN(f, "compile", "--list-ops");
    assert_int_equal(r.status, 0);
    /* One line per operation: its name, then the fields its specs take. */
    const char *ops[] = {"merge_state ", "merge_state_in_place ", "merge_states "};
    for (int i = 0; i < 3; i++) {
        char *line = line_starting(r.out, ops[i]);
        assert_non_null(line);
        assert_non_null(strstr(line, "dtype_o, head_dim_vo, vec"));
        free(line);
    }
    /* each family's own tile fields: the CUDA-core decode has no stages, the tensor-core one no
     * tile_kv */
    char *decode = line_starting(r.out, "decode ");
    assert_non_null(decode);
    assert_non_null(strstr(decode, "tile_q, tile_kv, warps, variant"));
    free(decode);
    char *decode_tc = line_starting(r.out, "decode_tc ");
    assert_non_null(decode_tc);
    assert_non_null(strstr(decode_tc, "tile_q, warps, stages, variant"));
    free(decode_tc);
    /* The masks a spec takes, and where a custom mask comes from instead. */
    assert_non_null(strstr(r.out, "mask none, causal (a custom mask is"));
    assert_non_null(strstr(r.out, "variant=custom_mask"));
    assert_null(strstr(r.out, "causal, custom"));
    /* examples of the attention families' specs */
    assert_non_null(strstr(r.out, "decode_tc:dtype=bf16,head_dim=128,paged=1,tile_q=4,warps=3,"));
    result_free(&r);
}

static void compile_defaults_to_sm90a_without_device(void **state) {
    fixture_t *f = *state;
    result_t r = RUN_ENV(f, ENV(NO_DRIVER), "compile", SPEC);
    if (r.status != 0)
        show("compile without --arch", &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, KERNEL, " sm_90a ", "compiled in "), 1);
    result_free(&r);
}

static void compile_load_needs_a_device(void **state) {
    fixture_t *f = *state;
    result_t r = RUN_ENV(f, ENV(NO_DRIVER), "compile", "--load", SPEC);
    assert_failed_with(&r, 1, "no CUDA driver");
    /* The device is checked before anything is compiled. */
    assert_string_equal(r.out, "");
    result_free(&r);

    /* On this machine: either a device loads the kernel from the disk cache, or NO_DEVICE. */
    r = RUN(f, "info");
    bool has_device = strstr(r.out, "  device 0: ") != NULL;
    result_free(&r);
    r = RUN(f, "compile", "--load", SPEC);
    if (!has_device) {
        assert_failed_with(&r, 1, "no CUDA");
    } else {
        if (r.status != 0)
            show("compile --load", &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(COUNT(r.out, KERNEL, "compiled in "), 1);
        assert_int_equal(COUNT(r.out, KERNEL, "loaded in ", " ms (disk cache)", "registers"), 1);
    }
    result_free(&r);
}

/* ---- demo ---- */

/* The tool uses the bundle beside it (build/libcinfer.aot) unless CINFER_AOT_PATH is set; set
 * empty, no bundle: every kernel is compiled. */
#define NO_BUNDLE "CINFER_AOT_PATH="

static void demo_without_a_device_compiles_and_succeeds(void **state) {
    fixture_t *f = *state;
    result_t r = RUN_ENV(f, ENV(NO_DRIVER, NO_BUNDLE), "demo");
    if (r.status != 0)
        show("demo", &r);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "no CUDA device found"));
    /* The short replay's schedule, replayed on the host. */
    assert_int_equal(COUNT(r.out, "schedule: 64 steps, "), 1);
    assert_int_equal(COUNT(r.out, "serve replay: llama3-8b (32/8 heads, D=128, bf16), 2 layers"),
                     1);
    /* Its kernels, compiled into the (empty) cache for sm_90a: decode and its merge, the batch
     * prefill tiles, append and the two page-table helpers. */
    assert_int_equal(COUNT(r.out, "compiling the replay's kernels for sm_90a"), 1);
    assert_int_equal(COUNT(r.out, "decode_", "compiled in "), 2);
    assert_true(COUNT(r.out, "prefill_", "_paged_batch_causal_", "compiled in ") >= 1);
    assert_int_equal(COUNT(r.out, "append_paged_kv_cache_", "compiled in "), 1);
    assert_int_equal(COUNT(r.out, "seq_lens", "compiled in "), 1);
    assert_int_equal(COUNT(r.out, "batch_indices_positions", "compiled in "), 1);
    const int kernels = COUNT(r.out, "compiled in ");
    result_free(&r);
    /* A second run finds them in the cache. */
    r = RUN_ENV(f, ENV(NO_DRIVER, NO_BUNDLE), "demo");
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "cache hit"), kernels);
    assert_int_equal(COUNT(r.out, "compiled in "), 0);
    result_free(&r);
    r = RUN(f, "demo", "extra");
    assert_failed_with(&r, 2, "unexpected argument \"extra\"");
    result_free(&r);
}

/* ---- bench serve ---- */

static void bench_serve_usage_errors_name_the_option(void **state) {
    fixture_t *f = *state;
    const struct {
        const char *const *args;
        int status;
        const char *message;
    } cases[] = {
        {ARGS("bench"), 2, "no benchmark given, expected \"serve\""},
        {ARGS("bench", "decode"), 2, "unknown benchmark \"decode\", expected \"serve\""},
        {ARGS("bench", "serve", "--layers", "0"), 2,
         "--layers = \"0\", expected an integer in [1,"},
        {ARGS("bench", "serve", "--prefill-chunk=x"), 2, "--prefill-chunk = \"x\""},
        {ARGS("bench", "serve", "--max-batch", "-3"), 2, "--max-batch = \"-3\""},
        {ARGS("bench", "serve", "--model", "gpt-5"), 2, "--model = \"gpt-5\", expected one of"},
        {ARGS("bench", "serve", "--kv-budget-gb", "-1"), 2, "--kv-budget-gb = \"-1\""},
        {ARGS("bench", "serve", "--frobnicate"), 2, "unknown option \"--frobnicate\""},
        {ARGS("bench", "serve", "--steps", "2", "--steps=3"), 2,
         "--steps is given twice (\"2\", then \"3\"): give it once"},
        {ARGS("bench", "serve", "--model", "qwen2.5-7b", "--model", "gemma2-9b"), 2,
         "--model is given twice"},
        {ARGS("bench", "serve", "--arch", "sm_80,sm_90a"), 1,
         "--arch \"sm_80,sm_90a\": expected at most 1 arch"},
        {ARGS("bench", "serve", "--json", "/nonexistent/cinfer-test/serve.json"), 1,
         "--json /nonexistent/cinfer-test/serve.json: cannot create the file"},
        {ARGS("bench", "serve", "--steps"), 2, "--steps needs a value"},
        {ARGS("bench", "serve", "stray"), 2, "unexpected argument \"stray\""},
        {ARGS("bench", "serve", "--trace", "/nonexistent/cinfer/t.csv"), 1,
         "--trace /nonexistent/cinfer/t.csv: cannot open"},
        {ARGS("bench", "serve", "--kv-budget-gb", "0.01"), 1, "raise --kv-budget-gb"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result_t r = run_env(f, ENV(NO_DRIVER), cases[i].args);
        assert_failed_with(&r, cases[i].status, cases[i].message);
        /* Every usage error of bench serve shows its options; nothing was replayed. */
        if (cases[i].status == 2 && cases[i].args[1] && strcmp(cases[i].args[1], "serve") == 0)
            assert_non_null(strstr(r.err, "usage: cinfer bench serve"));
        assert_null(strstr(r.out, "schedule:"));
        result_free(&r);
    }
    /* --json is checked before the replay; a file the check created is not left behind when the
     * run fails before writing it. */
    char json[400];
    snprintf(json, sizeof json, "%s/never.json", f->root);
    result_t r = RUN_ENV(f, ENV(NO_DRIVER), "bench", "serve", "--json", json, "--trace",
                         "/nonexistent/cinfer/t.csv");
    assert_failed_with(&r, 1, "--trace /nonexistent/cinfer/t.csv: cannot open");
    assert_int_equal(access(json, F_OK), -1);
    result_free(&r);
    /* A bad trace line is named. */
    char trace[400];
    snprintf(trace, sizeof trace, "%s/bad.csv", f->root);
    FILE *file = fopen(trace, "w");
    assert_non_null(file);
    fputs("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,2\n2,ten,2\n", file);
    fclose(file);
    r = RUN_ENV(f, ENV(NO_DRIVER), "bench", "serve", "--trace", trace);
    assert_failed_with(&r, 1, "line 3: ContextTokens = \"ten\"");
    result_free(&r);
    r = RUN(f, "bench", "serve", "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--kv-budget-gb"));
    assert_non_null(strstr(r.out, "gemma2-9b"));
    result_free(&r);
}

static void bench_serve_without_a_device_replays_on_the_host(void **state) {
    fixture_t *f = *state;
    char json[400];
    snprintf(json, sizeof json, "%s/serve.json", f->root);
    result_t r = RUN_ENV(f, ENV(NO_DRIVER), "bench", "serve", "--model", "gemma2-9b", "--steps",
                         "20", "--requests", "40", "--json", json, "--arch", "sm_80");
    if (r.status != 0)
        show("bench serve", &r);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "no CUDA device found"));
    assert_int_equal(COUNT(r.out, "schedule: 20 steps, "), 1);
    assert_int_equal(COUNT(r.out, "compiling the replay's kernels for sm_80"), 1);
    /* gemma2 alternates windowed and global layers: one soft-capped decode kernel (the window
     * is planned, not compiled), prefill kernels with and without the window. */
    assert_int_equal(COUNT(r.out, "decode_tc_", "hd256", "softcap", "compiled in "), 1);
    assert_int_equal(COUNT(r.out, "cache hit"), 0);
    assert_true(COUNT(r.out, "prefill_", "causal_softcap_window", "compiled in ") >= 1);
    assert_true(COUNT(r.out, "prefill_", "causal_softcap_q", "compiled in ") >= 1);
    result_free(&r);
    char *text = read_all(json);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"name\": \"gemma2-9b\""));
    assert_non_null(strstr(text, "\"layer_window_left\": [4095, -1, 4095, -1]"));
    assert_non_null(strstr(text, "\"device\": null"));
    assert_non_null(strstr(text, "\"index\": 19, \"prefill\": ["));
    assert_null(strstr(text, "\"index\": 20,"));
    free(text);
}

/* ---- aot ---- */

/* The ci set (src/jit/aot_set.c): bf16 Llama-3-8B decode and prefill kernels. sm_90a has the
 * turn-taking tiles of single prefill (shared memory past sm_80's) and the sm90 kernels (wgmma:
 * sm_90a only) of single and batch (ragged, paged) prefill, which take the place of batch prefill's
 * 128-row sm80 tiles there: two more in all. */
#define CI_KERNELS_SM80 14
#define CI_KERNELS_SM90 16
#define CI_MERGE        "decode_merge:dtype=bf16,head_dim=128,warps=4"
#define CI_MERGE_KERNEL "decode_merge_bf16_hd128_w4"

static void aot_help_and_usage_errors(void **state) {
    fixture_t *f = *state;
    result_t r = RUN(f, "help");
    assert_int_equal(COUNT(r.out, "  aot "), 1);
    result_free(&r);
    r = RUN(f, "aot", "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--set NAME"));
    assert_non_null(strstr(r.out, "--list FILE"));
    assert_non_null(strstr(r.out, "libcinfer.aot"));
    result_free(&r);
    static const char *const cases[][7] = {
        {"aot", NULL},
        {"aot", "-o", "x.aot", NULL},
        {"aot", "--arch", "sm_90a", NULL},
        {"aot", "--arch", NULL},
        {"aot", "--frobnicate", NULL},
        {"aot", "--arch", "sm_90a", "-j", "0", NULL},
        {"aot", "--list", NULL},
        {"aot", "--list", "x.aot", "--arch", "sm_80", NULL},
        {"aot", "--arch", "sm_90a", "--arch=sm_80", "-o", "x.aot", NULL},
        {"aot", "--set", "ci", "--set=default", NULL},
        {"aot", "-o", "x.aot", "-o", "y.aot", NULL},
        {"aot", "-j", "2", "-j", "3", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        r = run_env(f, NULL, cases[i]);
        if (r.status != 2)
            show("aot usage", &r);
        assert_int_equal(r.status, 2);
        assert_memory_equal(r.err, "cinfer: error: ", 15);
        assert_non_null(strstr(r.err, "usage: cinfer aot"));
        assert_string_equal(r.out, "");
        result_free(&r);
    }
    r = RUN(f, "aot", "--arch", "sm_90a", "-o", "x.aot", "-o", "y.aot");
    assert_failed_with(&r, 2, "-o is given twice (\"x.aot\", then \"y.aot\"): give it once");
    result_free(&r);
}

static void aot_checks_arch_and_set_before_compiling(void **state) {
    fixture_t *f = *state;
    char bundle[400];
    snprintf(bundle, sizeof bundle, "%s/bad.aot", f->root);
    result_t r = RUN(f, "aot", "--arch", "sm_80,sm_xx", "--set", "ci", "-o", bundle);
    assert_failed_with(&r, 1, "\"sm_xx\" is not an arch");
    assert_string_equal(r.out, "");
    result_free(&r);
    r = RUN(f, "aot", "--arch", "sm_90a", "--set", "nightly", "-o", bundle);
    assert_failed_with(&r, 1, "unknown kernel set \"nightly\" (known: default, ci)");
    assert_string_equal(r.out, "");
    result_free(&r);
    /* A folder that cannot take the bundle is found before anything compiles. */
    r = RUN(f, "aot", "--arch", "sm_90a", "--set", "ci", "-o", "/nonexistent/cinfer-test/x.aot");
    assert_failed_with(&r, 1, "cannot write into the folder \"/nonexistent/cinfer-test\"");
    assert_string_equal(r.out, "");
    result_free(&r);
    assert_int_equal(access(bundle, F_OK), -1);
    r = RUN(f, "aot", "--list", bundle);
    assert_failed_with(&r, 1, "No such file");
    result_free(&r);
    r = RUN(f, "cache", "ls");
    assert_int_equal(COUNT(r.out, "total: 0 entries"), 1);
    result_free(&r);
}

static void aot_builds_a_bundle_that_serves_with_jit_off(void **state) {
    fixture_t *f = *state;
    char bundle[400], aot_path[450];
    snprintf(bundle, sizeof bundle, "%s/ci.aot", f->root);
    snprintf(aot_path, sizeof aot_path, "CINFER_AOT_PATH=%s", bundle);
    result_t r = RUN(f, "aot", "--arch", "sm_80,sm_90a", "--set", "ci", "-o", bundle);
    if (r.status != 0)
        show("aot --set ci", &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, " sm_80 ", " s ", "compiled", " bytes"), CI_KERNELS_SM80);
    assert_int_equal(COUNT(r.out, " sm_90a ", " s ", "compiled", " bytes"), CI_KERNELS_SM90);
    assert_int_equal(COUNT(r.out, CI_MERGE_KERNEL, "compiled"), 2);
    char *summary = line_starting(r.out, "bundle ");
    assert_non_null(summary);
    assert_non_null(strstr(summary, bundle));
    assert_non_null(strstr(summary, "30 kernels for sm_80,sm_90a"));
    assert_non_null(strstr(summary, " bytes ("));
    assert_non_null(strstr(summary, "built in "));
    assert_non_null(strstr(summary, "(30 compiled, 0 from the kernel cache)"));
    free(summary);
    assert_string_equal(r.err, "");
    result_free(&r);

    /* The same build again takes every cubin from the kernel cache, under the same keys. */
    r = RUN(f, "aot", "--arch=sm_80,sm_90a", "--set=ci", "-j", "1", "-o", bundle);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "cache hit"), CI_KERNELS_SM80 + CI_KERNELS_SM90);
    assert_int_equal(COUNT(r.out, "(0 compiled, 30 from the kernel cache)"), 1);
    result_free(&r);

    r = RUN(f, "aot", "--list", bundle);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, CI_MERGE_KERNEL, " bytes"), 2);
    char *identity = line_starting(r.out, "bundle ");
    assert_non_null(identity);
    assert_non_null(strstr(identity, "cinfer 0."));
    assert_non_null(strstr(identity, "NVRTC "));
    assert_non_null(strstr(identity, "30 kernels for sm_80,sm_90a"));
    free(identity);
    result_free(&r);

    /* With an empty kernel cache and compiling forbidden, the bundle serves the set... */
    r = RUN(f, "cache", "clear");
    assert_int_equal(r.status, 0);
    result_free(&r);
    r = RUN_ENV(f, ENV(aot_path, "CINFER_JIT=off"), "compile", "--arch", "sm_80,sm_90a", CI_MERGE);
    if (r.status != 0)
        show("compile from the bundle", &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, CI_MERGE_KERNEL), 2);
    assert_string_equal(r.err, "");
    result_free(&r);
    /* ...the KV-cache writes of a serving step included... */
    r = RUN_ENV(f, ENV(aot_path, "CINFER_JIT=off"), "compile", "--arch", "sm_90a",
                "append_paged_kv_cache:dtype=bf16,head_dim=128,vec=8", "seq_lens",
                "batch_indices_positions");
    if (r.status != 0)
        show("the cache writes from the bundle", &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, "AOT bundle"), 3);
    result_free(&r);
    /* ...and nothing else. */
    r = RUN_ENV(f, ENV(aot_path, "CINFER_JIT=off"), "compile", "--arch", "sm_90a", SPEC);
    assert_failed_with(&r, 1, KERNEL);
    assert_non_null(strstr(r.err, "CINFER_JIT=off"));
    result_free(&r);
    r = RUN(f, "cache", "ls");
    assert_int_equal(COUNT(r.out, "total: 0 entries"), 1);
    result_free(&r);
}

static void aot_unusable_bundle_is_one_warning(void **state) {
    fixture_t *f = *state;
    char junk[400], aot_path[450];
    snprintf(junk, sizeof junk, "%s/junk.aot", f->root);
    snprintf(aot_path, sizeof aot_path, "CINFER_AOT_PATH=%s", junk);
    FILE *file = fopen(junk, "wb");
    assert_non_null(file);
    fputs("not a bundle", file);
    fclose(file);
    result_t r = RUN_ENV(f, ENV(aot_path), "compile", "--arch", "sm_80,sm_90a", SPEC);
    if (r.status != 0)
        show("compile with a junk bundle", &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(COUNT(r.out, KERNEL, "compiled in "), 2);
    assert_int_equal(COUNT(r.err, "cinfer: warning: "), 1);
    assert_int_equal(COUNT(r.err, "cinfer: warning: ", junk, "ignored"), 1);
    result_free(&r);
    r = RUN(f, "aot", "--list", junk);
    assert_failed_with(&r, 1, "not a cinfer AOT bundle");
    result_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(help_lists_every_command, setup, teardown),
        cmocka_unit_test_setup_teardown(usage_errors_exit_2, setup, teardown),
        cmocka_unit_test_setup_teardown(info_reports_library_driver_nvrtc_devices_and_cache, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(info_with_the_stub_driver_names_it, setup, teardown),
        cmocka_unit_test_setup_teardown(info_without_driver_still_succeeds, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_ls_on_empty_and_missing_folders, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_ls_flags_a_corrupt_entry, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_then_hit_then_list_then_clear, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_unknown_field_names_it, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_into_an_unusable_cache_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_bad_arch_fails_before_compiling, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_list_ops, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_defaults_to_sm90a_without_device, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_load_needs_a_device, setup, teardown),
        cmocka_unit_test_setup_teardown(demo_without_a_device_compiles_and_succeeds, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(bench_serve_usage_errors_name_the_option, setup, teardown),
        cmocka_unit_test_setup_teardown(bench_serve_without_a_device_replays_on_the_host, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(aot_help_and_usage_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(aot_checks_arch_and_set_before_compiling, setup, teardown),
        cmocka_unit_test_setup_teardown(aot_builds_a_bundle_that_serves_with_jit_off, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(aot_unusable_bundle_is_one_warning, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
