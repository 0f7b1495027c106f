/*
 * Tests of the on-disk kernel cache (src/jit/cache.c) with a fake compile function, so no NVRTC
 * or GPU is needed. Each test gets a fresh folder under /tmp.
 *
 * The warning about an unusable cache folder is printed once per process, so every scenario that
 * degrades runs in a forked child whose stderr is captured; the test process itself never
 * degrades, which keeps the children's "once" state fresh. The tests run as root in CI, where
 * permission bits do not stop writes: read-only folders are then simulated by dropping to the
 * user "nobody" in the child, and paths that no user can create (below a regular file) are tested
 * as well.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "jit/cache.h"

/* Exit code of a child that cannot set up its scenario (the ctest convention for "skipped"). */
#define CHILD_SKIP 77
/* uid/gid of "nobody", used to make permission bits bind when the tests run as root. */
#define NOBODY_ID 65534
/* Every test must finish well within this; a hang (a lock never released) fails instead. */
#define WATCHDOG_SECONDS 60

/* ---------------------------------------------------------------------------------------------
 * Fixture: a fresh folder per test
 * ------------------------------------------------------------------------------------------- */

typedef struct fixture {
    char root[PATH_MAX]; /* mkdtemp folder, removed afterwards */
    char dir[PATH_MAX];  /* the cache folder, nested and not created, to exercise mkdir -p */
} fixture_t;

static void watchdog_fired(int sig) {
    (void)sig;
    static const char msg[] = "test_cache: watchdog expired (a cache call hung)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(1);
}

static void arm_watchdog(unsigned seconds) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = watchdog_fired;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

/* Forked children do not inherit the parent's alarm; each gets its own, so a child left behind
 * by a failed assertion in the parent (blocked on a pipe or a lock) cannot outlive the test run
 * for long. */
#define CHILD_WATCHDOG_SECONDS 20

static void arm_child_watchdog(void) {
    signal(SIGALRM, SIG_DFL);
    alarm(CHILD_WATCHDOG_SECONDS);
}

static int setup(void **state) {
    fixture_t *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    cinfer__fmt(f->root, sizeof f->root, "/tmp/cinfer-test-cache-XXXXXX");
    if (!mkdtemp(f->root)) {
        free(f);
        return -1;
    }
    cinfer__fmt(f->dir, sizeof f->dir, "%s/a/b/kernels", f->root);
    arm_watchdog(WATCHDOG_SECONDS);
    *state = f;
    return 0;
}

static int make_writable(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    if (type == FTW_D || type == FTW_DNR)
        chmod(path, 0755);
    return 0;
}

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)type;
    (void)ftw;
    remove(path);
    return 0;
}

static void remove_tree(const char *path) {
    /* Read-only folders left by a test are made writable first so their files can go. */
    chmod(path, 0755);
    nftw(path, make_writable, 16, FTW_PHYS);
    nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int teardown(void **state) {
    fixture_t *f = *state;
    alarm(0);
    remove_tree(f->root);
    free(f);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Fake compile function
 * ------------------------------------------------------------------------------------------- */

typedef struct fake {
    const char *key;          /* the payload is derived from it */
    unsigned tag;             /* mixed into the payload to tell compilers apart (0: none) */
    atomic_int *calls;        /* in-process call counter */
    const char *counter_path; /* when set, each call appends a line (counts across processes) */
    unsigned sleep_ms;        /* widens race windows */
    cinfer_status_t fail;     /* returned instead of compiling when not SUCCESS */
    int ready_fd;             /* when >= 0: write one byte, then hang until killed */
} fake_t;

static size_t payload_bytes(const char *key) {
    return 2000 + (size_t)(XXH64(key, strlen(key), 0) % 3000);
}

/* The deterministic payload of (key, tag); malloc'ed. */
static unsigned char *make_payload(const char *key, unsigned tag, size_t *bytes) {
    size_t n = payload_bytes(key);
    unsigned char *p = malloc(n);
    if (!p)
        return NULL;
    uint64_t x = XXH64(key, strlen(key), tag) | 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)x;
    }
    *bytes = n;
    return p;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static cinfer_status_t fake_compile(void *arg, void **payload, size_t *size) {
    fake_t *fake = arg;
    if (fake->calls)
        atomic_fetch_add(fake->calls, 1);
    if (fake->counter_path) {
        int fd = open(fake->counter_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t ignored = write(fd, "compiled\n", 9);
            (void)ignored;
            close(fd);
        }
    }
    if (fake->ready_fd >= 0) {
        ssize_t ignored = write(fake->ready_fd, "r", 1);
        (void)ignored;
        for (;;)
            pause();
    }
    if (fake->sleep_ms)
        sleep_ms(fake->sleep_ms);
    if (fake->fail != CINFER_STATUS_SUCCESS)
        return cinfer__error(fake->fail, "fake nvrtc failure for %s", fake->key);
    unsigned char *p = make_payload(fake->key, fake->tag, size);
    if (!p)
        return CINFER_STATUS_OUT_OF_MEMORY;
    *payload = p;
    return CINFER_STATUS_SUCCESS;
}

static fake_t fake_for(const char *key, atomic_int *calls) {
    fake_t fake = {key, 0, calls, NULL, 0, CINFER_STATUS_SUCCESS, -1};
    return fake;
}

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static void entry_path(char *dst, const char *dir, const char *stem, const char *suffix) {
    cinfer__fmt(dst, PATH_MAX, "%s/%s%s", dir, stem, suffix);
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Files in dir whose name starts with prefix (-1 if dir cannot be read). */
static int count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

static int count_open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the listing's own descriptor */
}

static void write_file(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, n), (ssize_t)n);
    close(fd);
}

static unsigned char *slurp(const char *path, size_t *n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    fstat(fd, &st);
    unsigned char *buf = malloc((size_t)st.st_size + 1);
    ssize_t got = read(fd, buf, (size_t)st.st_size);
    close(fd);
    *n = got < 0 ? 0 : (size_t)got;
    buf[*n] = 0;
    return buf;
}

static int count_lines(const char *path) {
    size_t n = 0;
    unsigned char *text = slurp(path, &n);
    if (!text)
        return 0;
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += text[i] == '\n';
    free(text);
    return lines;
}

static int count_substr(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* Asks for (stem, key) and checks the outcome and that the payload is the fake's for key. */
static void expect_get(const char *dir, const char *stem, const char *key, fake_t *fake,
                       cinfer__cache_outcome_t expected) {
    void *payload = NULL;
    size_t size = 0;
    cinfer__cache_outcome_t outcome = (cinfer__cache_outcome_t)-1;
    assert_int_equal(
        cinfer__cache_get_or_compile(dir, stem, key, fake_compile, fake, &payload, &size, &outcome),
        CINFER_STATUS_SUCCESS);
    assert_int_equal(outcome, expected);
    size_t want_size = 0;
    unsigned char *want = make_payload(key, fake->tag, &want_size);
    assert_non_null(want);
    assert_int_equal(size, want_size);
    assert_memory_equal(payload, want, size);
    free(want);
    free(payload);
}

/* Runs fn in a forked child whose stderr goes to a buffer; returns its exit code (128 + signal
 * when killed). Child checks report on stdout through CHILD_CHECK. */
typedef int (*child_fn)(void *arg);

static int run_child(child_fn fn, void *arg, char *captured, size_t cap) {
    char capture_path[] = "/tmp/cinfer-test-cache-stderr-XXXXXX";
    int capture_fd = mkstemp(capture_path);
    assert_true(capture_fd >= 0);
    unlink(capture_path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        arm_child_watchdog();
        dup2(capture_fd, STDERR_FILENO);
        close(capture_fd);
        int rc = fn(arg);
        fflush(stdout);
        _exit(rc);
    }
    int wstatus = 0;
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    ssize_t got = pread(capture_fd, captured, cap - 1, 0);
    captured[got > 0 ? got : 0] = '\0';
    close(capture_fd);
    if (captured[0])
        printf("[child stderr] %s", captured);
    return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

#define CHILD_CHECK(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("child check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);                \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Child-side version of expect_get: 0 when the call succeeds with the expected outcome and the
 * fake's payload. */
static int child_get(const char *dir, const char *stem, const char *key, fake_t *fake,
                     cinfer__cache_outcome_t expected) {
    void *payload = NULL;
    size_t size = 0, want_size = 0;
    cinfer__cache_outcome_t outcome = (cinfer__cache_outcome_t)-1;
    cinfer_status_t status =
        cinfer__cache_get_or_compile(dir, stem, key, fake_compile, fake, &payload, &size, &outcome);
    unsigned char *want = make_payload(key, fake->tag, &want_size);
    bool ok = status == CINFER_STATUS_SUCCESS && outcome == expected && want && size == want_size &&
              memcmp(payload, want, size) == 0;
    if (!ok)
        printf("child_get(%s, %s): status %d outcome %d size %zu\n", dir, stem, (int)status,
               (int)outcome, size);
    free(want);
    free(payload);
    return ok ? 0 : 1;
}

/* Makes dir read-only for this (child) process: chmod 0555 and, as root, become "nobody" so the
 * bits bind. Returns CHILD_SKIP when writes into dir still succeed. */
static int become_read_only(const char *dir) {
    if (chmod(dir, 0555) != 0)
        return 1;
    if (geteuid() == 0) {
        if (setgroups(0, NULL) != 0 || setgid(NOBODY_ID) != 0 || setuid(NOBODY_ID) != 0) {
            printf("cannot drop root privileges: %s\n", strerror(errno));
            return CHILD_SKIP;
        }
    }
    char probe[PATH_MAX];
    cinfer__fmt(probe, sizeof probe, "%s/probe", dir);
    int fd = open(probe, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) {
        close(fd);
        unlink(probe);
        printf("%s stays writable after chmod 0555 and dropping privileges\n", dir);
        return CHILD_SKIP;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Hit and miss
 * ------------------------------------------------------------------------------------------- */

static const char *STEM = "merge_states_bf16_hd128-3f2a9c01";
static const char *KEY = "merge_states|dtype=bf16|head_dim=128|arch=sm_90|nvrtc=12.4|opts=-O3";

static void test_miss_then_hit(void **state) {
    fixture_t *f = *state;
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);

    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED);
    assert_int_equal(calls, 1);
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_HIT);
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_HIT);
    assert_int_equal(calls, 1);

    /* The folder was created (mkdir -p) and holds the entry, its lock and nothing else. */
    char path[PATH_MAX];
    entry_path(path, f->dir, STEM, ".cubin");
    assert_true(exists(path));
    entry_path(path, f->dir, STEM, ".lock");
    assert_true(exists(path));
    assert_int_equal(count_files(f->dir), 2);
    assert_int_equal(count_prefixed(f->dir, ".tmp-"), 0);

    /* cinfer__cache_read serves the same payload without compiling. */
    void *payload = NULL;
    size_t size = 0, want_size = 0;
    assert_int_equal(cinfer__cache_read(f->dir, STEM, KEY, &payload, &size), CINFER_STATUS_SUCCESS);
    unsigned char *want = make_payload(KEY, 0, &want_size);
    assert_int_equal(size, want_size);
    assert_memory_equal(payload, want, size);
    free(payload);
    free(want);

    /* Another key under another stem is another entry. */
    const char *key2 = "decode|dtype=fp16|head_dim=64";
    fake_t fake2 = fake_for(key2, &calls);
    expect_get(f->dir, "decode_fp16_hd64-0badc0de", key2, &fake2, CINFER__CACHE_COMPILED);
    expect_get(f->dir, "decode_fp16_hd64-0badc0de", key2, &fake2, CINFER__CACHE_HIT);
    assert_int_equal(calls, 2);
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_HIT);
    assert_int_equal(calls, 2);
}

/* The entry on disk follows the layout documented in cache.h, field by field. */
static void test_file_format(void **state) {
    fixture_t *f = *state;
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED);

    char path[PATH_MAX];
    entry_path(path, f->dir, STEM, ".cubin");
    size_t n = 0, want_size = 0;
    unsigned char *file = slurp(path, &n);
    unsigned char *want = make_payload(KEY, 0, &want_size);
    assert_non_null(file);
    size_t key_len = strlen(KEY);
    assert_int_equal(n, 32 + key_len + want_size);
    assert_memory_equal(file, "CINFERKC", 8);
    uint32_t version, stored_key_len;
    uint64_t stored_size, checksum;
    memcpy(&version, file + 8, 4); /* the test machines are little endian, like the format */
    memcpy(&stored_key_len, file + 12, 4);
    memcpy(&stored_size, file + 16, 8);
    memcpy(&checksum, file + 24, 8);
    assert_int_equal(version, CINFER__CACHE_FORMAT_VERSION);
    assert_int_equal(stored_key_len, key_len);
    assert_int_equal(stored_size, want_size);
    assert_int_equal(checksum, XXH3_64bits(want, want_size));
    assert_memory_equal(file + 32, KEY, key_len);
    assert_memory_equal(file + 32 + key_len, want, want_size);
    free(file);
    free(want);
}

static void test_no_folder_compiles(void **state) {
    (void)state;
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    expect_get(NULL, STEM, KEY, &fake, CINFER__CACHE_COMPILED);
    expect_get("", STEM, KEY, &fake, CINFER__CACHE_COMPILED);
    expect_get("", STEM, KEY, &fake, CINFER__CACHE_COMPILED);
    assert_int_equal(calls, 3);
    void *payload = (void *)1;
    size_t size = 1;
    assert_int_equal(cinfer__cache_read(NULL, STEM, KEY, &payload, &size), CINFER_STATUS_NOT_FOUND);
    assert_null(payload);
}

static void test_invalid_arguments(void **state) {
    fixture_t *f = *state;
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    void *payload = NULL;
    size_t size = 0;
    cinfer__cache_outcome_t outcome;
    char long_stem[300];
    memset(long_stem, 'k', sizeof long_stem - 1);
    long_stem[sizeof long_stem - 1] = '\0';
    const char *bad_stems[] = {"../escape", "a/b", "..", ".", "", long_stem};
    for (size_t i = 0; i < sizeof bad_stems / sizeof bad_stems[0]; i++) {
        assert_int_equal(cinfer__cache_get_or_compile(f->dir, bad_stems[i], KEY, fake_compile,
                                                      &fake, &payload, &size, &outcome),
                         CINFER_STATUS_INVALID_ARGUMENT);
        assert_int_equal(cinfer__cache_read(f->dir, bad_stems[i], KEY, &payload, &size),
                         CINFER_STATUS_INVALID_ARGUMENT);
    }
    assert_int_equal(cinfer__cache_get_or_compile(f->dir, STEM, NULL, fake_compile, &fake, &payload,
                                                  &size, &outcome),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_int_equal(
        cinfer__cache_get_or_compile(f->dir, STEM, KEY, NULL, &fake, &payload, &size, &outcome),
        CINFER_STATUS_INVALID_ARGUMENT);
    assert_int_equal(calls, 0);
    assert_false(exists(f->dir));
}

/* ---------------------------------------------------------------------------------------------
 * Key collisions and corrupt entries
 * ------------------------------------------------------------------------------------------- */

static void test_key_collision(void **state) {
    fixture_t *f = *state;
    atomic_int calls = 0;
    /* key_b has the length of key_a (the byte comparison decides), key_c another length. */
    const char *key_a = "attention|variant=causal|hd=128|v1";
    const char *key_b = "attention|variant=causal|hd=128|v2";
    const char *key_c = "attention|variant=sliding|hd=128";
    fake_t fake_a = fake_for(key_a, &calls);
    fake_t fake_b = fake_for(key_b, &calls);
    fake_t fake_c = fake_for(key_c, &calls);
    const char *stem = "attention-deadbeef";

    expect_get(f->dir, stem, key_a, &fake_a, CINFER__CACHE_COMPILED);
    expect_get(f->dir, stem, key_b, &fake_b, CINFER__CACHE_COMPILED);
    assert_int_equal(calls, 2);
    /* The entry now holds key_b: key_b hits, key_a no longer does. */
    expect_get(f->dir, stem, key_b, &fake_b, CINFER__CACHE_HIT);
    assert_int_equal(calls, 2);

    void *payload = NULL;
    size_t size = 0;
    char path[PATH_MAX];
    entry_path(path, f->dir, stem, ".cubin");
    assert_int_equal(cinfer__cache_read(f->dir, stem, key_a, &payload, &size),
                     CINFER_STATUS_NOT_FOUND);
    assert_null(payload);
    assert_false(exists(path));

    expect_get(f->dir, stem, key_c, &fake_c, CINFER__CACHE_COMPILED);
    expect_get(f->dir, stem, key_a, &fake_a, CINFER__CACHE_COMPILED);
    expect_get(f->dir, stem, key_a, &fake_a, CINFER__CACHE_HIT);
    assert_int_equal(calls, 4);
    assert_int_equal(count_prefixed(f->dir, ".tmp-"), 0);
}

typedef void (*mutate_fn)(const char *path);

static void flip_byte_at(const char *path, long offset_from_end) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    off_t at = lseek(fd, 0, SEEK_END) - offset_from_end;
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

static void flip_payload_byte(const char *path) {
    flip_byte_at(path, 17);
}

static void flip_key_byte(const char *path) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, 33), 1);
    b ^= 0x01;
    assert_int_equal(pwrite(fd, &b, 1, 33), 1);
    close(fd);
}

static void flip_checksum(const char *path) {
    int fd = open(path, O_RDWR);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, 24), 1);
    b ^= 0x80;
    assert_int_equal(pwrite(fd, &b, 1, 24), 1);
    close(fd);
}

static void truncate_payload(const char *path) {
    assert_int_equal(truncate(path, file_size(path) - 1), 0);
}

static void truncate_header(const char *path) {
    assert_int_equal(truncate(path, 20), 0);
}

static void truncate_to_zero(const char *path) {
    assert_int_equal(truncate(path, 0), 0);
}

static void append_byte(const char *path) {
    int fd = open(path, O_WRONLY | O_APPEND);
    assert_int_equal(write(fd, "x", 1), 1);
    close(fd);
}

static void wrong_magic(const char *path) {
    int fd = open(path, O_RDWR);
    assert_int_equal(pwrite(fd, "CINFERXX", 8, 0), 8);
    close(fd);
}

static void wrong_version(const char *path) {
    int fd = open(path, O_RDWR);
    uint32_t version = CINFER__CACHE_FORMAT_VERSION + 1;
    assert_int_equal(pwrite(fd, &version, 4, 8), 4);
    close(fd);
}

static void huge_payload_size(const char *path) {
    int fd = open(path, O_RDWR);
    uint64_t size = UINT64_MAX - 8;
    assert_int_equal(pwrite(fd, &size, 8, 16), 8);
    close(fd);
}

static void huge_key_length(const char *path) {
    int fd = open(path, O_RDWR);
    uint32_t len = UINT32_MAX;
    assert_int_equal(pwrite(fd, &len, 4, 12), 4);
    close(fd);
}

static void test_corrupt_entries(void **state) {
    fixture_t *f = *state;
    static const struct {
        const char *name;
        mutate_fn mutate;
    } cases[] = {
        {"payload byte flipped", flip_payload_byte},
        {"key byte flipped", flip_key_byte},
        {"checksum flipped", flip_checksum},
        {"truncated payload", truncate_payload},
        {"truncated header", truncate_header},
        {"zero length", truncate_to_zero},
        {"trailing byte", append_byte},
        {"wrong magic", wrong_magic},
        {"wrong version", wrong_version},
        {"huge payload size", huge_payload_size},
        {"huge key length", huge_key_length},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        print_message("corruption: %s\n", cases[i].name);
        char stem[64], path[PATH_MAX];
        cinfer__fmt(stem, sizeof stem, "kernel%zu-0123abcd", i);
        entry_path(path, f->dir, stem, ".cubin");
        atomic_int calls = 0;
        fake_t fake = fake_for(KEY, &calls);

        /* Read: the corrupt entry is a miss and is deleted. */
        expect_get(f->dir, stem, KEY, &fake, CINFER__CACHE_COMPILED);
        cases[i].mutate(path);
        void *payload = NULL;
        size_t size = 0;
        assert_int_equal(cinfer__cache_read(f->dir, stem, KEY, &payload, &size),
                         CINFER_STATUS_NOT_FOUND);
        assert_null(payload);
        assert_false(exists(path));

        /* Get: the corrupt entry is recompiled and rewritten. */
        expect_get(f->dir, stem, KEY, &fake, CINFER__CACHE_COMPILED);
        assert_int_equal(calls, 2);
        cases[i].mutate(path);
        expect_get(f->dir, stem, KEY, &fake, CINFER__CACHE_COMPILED);
        assert_int_equal(calls, 3);
        expect_get(f->dir, stem, KEY, &fake, CINFER__CACHE_HIT);
        assert_int_equal(calls, 3);
        assert_int_equal(cinfer__cache_read(f->dir, stem, KEY, &payload, &size),
                         CINFER_STATUS_SUCCESS);
        free(payload);
    }
    assert_int_equal(count_prefixed(f->dir, ".tmp-"), 0);
}

/* ---------------------------------------------------------------------------------------------
 * Compile errors and descriptor hygiene
 * ------------------------------------------------------------------------------------------- */

static void test_compile_error(void **state) {
    fixture_t *f = *state;
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    fake.fail = CINFER_STATUS_COMPILE_ERROR;
    void *payload = (void *)1;
    size_t size = 1;
    cinfer__cache_outcome_t outcome;
    assert_int_equal(cinfer__cache_get_or_compile(f->dir, STEM, KEY, fake_compile, &fake, &payload,
                                                  &size, &outcome),
                     CINFER_STATUS_COMPILE_ERROR);
    assert_null(payload);
    assert_non_null(strstr(cinfer_last_error(), "fake nvrtc failure"));
    char path[PATH_MAX];
    entry_path(path, f->dir, STEM, ".cubin");
    assert_false(exists(path));
    assert_int_equal(count_prefixed(f->dir, ".tmp-"), 0);

    /* The lock was released. */
    entry_path(path, f->dir, STEM, ".lock");
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    close(fd);

    fake.fail = CINFER_STATUS_SUCCESS;
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED);
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_HIT);
    assert_int_equal(calls, 2);
}

static void count_visit(void *arg, const cinfer__cache_entry_t *entry) {
    (void)entry;
    (*(int *)arg)++;
}

static void test_no_descriptor_leaks(void **state) {
    fixture_t *f = *state;
    int before = count_open_fds();
    assert_true(before > 0);
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    char path[PATH_MAX];
    entry_path(path, f->dir, STEM, ".cubin");
    void *payload = NULL;
    size_t size = 0;
    cinfer__cache_outcome_t outcome;

    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED); /* miss */
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_HIT);      /* hit */
    flip_payload_byte(path);
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED); /* corrupt */
    fake_t other = fake_for("another key", &calls);
    expect_get(f->dir, STEM, "another key", &other, CINFER__CACHE_COMPILED); /* collision */
    assert_int_equal(cinfer__cache_read(f->dir, STEM, KEY, &payload, &size),
                     CINFER_STATUS_NOT_FOUND);
    assert_int_equal(cinfer__cache_read(f->dir, "missing-0", KEY, &payload, &size),
                     CINFER_STATUS_NOT_FOUND);
    fake.fail = CINFER_STATUS_COMPILE_ERROR;
    assert_int_equal(cinfer__cache_get_or_compile(f->dir, STEM, KEY, fake_compile, &fake, &payload,
                                                  &size, &outcome),
                     CINFER_STATUS_COMPILE_ERROR);
    int visits = 0;
    uint64_t entries = 0, bytes = 0;
    unsigned removed = 0;
    assert_int_equal(cinfer__cache_list(f->dir, count_visit, &visits), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__cache_usage(f->dir, &entries, &bytes), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__cache_clear(f->dir, &removed), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__cache_list(f->root, count_visit, &visits), CINFER_STATUS_SUCCESS);
    assert_int_equal(count_open_fds(), before);
}

/* ---------------------------------------------------------------------------------------------
 * Concurrency
 * ------------------------------------------------------------------------------------------- */

#define RACERS 8
/* Long enough that all racers miss before the first compile finishes. */
#define RACE_COMPILE_MS 200

typedef struct race_result {
    int status;
    int outcome;
    uint64_t size;
    uint64_t hash; /* XXH64 of the payload */
} race_result_t;

static void test_concurrent_processes(void **state) {
    fixture_t *f = *state;
    const char *key = "prefill|hd=128|page=16|race";
    const char *stem = "prefill_hd128-racerace";
    char counter[PATH_MAX];
    cinfer__fmt(counter, sizeof counter, "%s/compile-count", f->root);
    int go[2], results[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(results), 0);
    pid_t pids[RACERS];
    fflush(stdout);
    for (int i = 0; i < RACERS; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            arm_child_watchdog();
            /* Wait for the start signal (end of file on the pipe) so all ask at once. */
            close(go[1]);
            close(results[0]);
            char c;
            while (read(go[0], &c, 1) > 0) {
            }
            fake_t fake = {
                key, (unsigned)getpid(), NULL, counter, RACE_COMPILE_MS, CINFER_STATUS_SUCCESS, -1};
            void *payload = NULL;
            size_t size = 0;
            cinfer__cache_outcome_t outcome = (cinfer__cache_outcome_t)-1;
            race_result_t r;
            memset(&r, 0, sizeof r);
            r.status = cinfer__cache_get_or_compile(f->dir, stem, key, fake_compile, &fake,
                                                    &payload, &size, &outcome);
            r.outcome = (int)outcome;
            r.size = size;
            r.hash = payload ? XXH64(payload, size, 0) : 0;
            free(payload);
            /* Records are far below PIPE_BUF, so each write is atomic. */
            ssize_t put = write(results[1], &r, sizeof r);
            _exit(put == (ssize_t)sizeof r ? 0 : 1);
        }
    }
    close(go[0]);
    close(results[1]);
    close(go[1]); /* start */
    for (int i = 0; i < RACERS; i++) {
        int wstatus = 0;
        assert_int_equal(waitpid(pids[i], &wstatus, 0), pids[i]);
        assert_true(WIFEXITED(wstatus));
        assert_int_equal(WEXITSTATUS(wstatus), 0);
    }
    int compiled = 0, hits = 0;
    race_result_t first = {0}, r;
    for (int i = 0; i < RACERS; i++) {
        assert_int_equal(read(results[0], &r, sizeof r), (ssize_t)sizeof r);
        assert_int_equal(r.status, CINFER_STATUS_SUCCESS);
        compiled += r.outcome == CINFER__CACHE_COMPILED;
        hits += r.outcome == CINFER__CACHE_HIT;
        if (i == 0)
            first = r;
        /* The payload carries its compiler's pid, so equal payloads mean one compile. */
        assert_int_equal(r.size, first.size);
        assert_int_equal(r.hash, first.hash);
    }
    close(results[0]);
    assert_int_equal(compiled, 1);
    assert_int_equal(hits, RACERS - 1);
    assert_int_equal(count_lines(counter), 1);

    void *payload = NULL;
    size_t size = 0;
    assert_int_equal(cinfer__cache_read(f->dir, stem, key, &payload, &size), CINFER_STATUS_SUCCESS);
    assert_int_equal(XXH64(payload, size, 0), first.hash);
    free(payload);
    assert_int_equal(count_prefixed(f->dir, ".tmp-"), 0);
}

typedef struct racer {
    const fixture_t *fixture;
    pthread_barrier_t *barrier;
    fake_t fake;
    race_result_t result;
} racer_t;

static void *race_thread(void *arg) {
    racer_t *racer = arg;
    pthread_barrier_wait(racer->barrier);
    void *payload = NULL;
    size_t size = 0;
    cinfer__cache_outcome_t outcome = (cinfer__cache_outcome_t)-1;
    racer->result.status =
        cinfer__cache_get_or_compile(racer->fixture->dir, "prefill_hd128-threads", racer->fake.key,
                                     fake_compile, &racer->fake, &payload, &size, &outcome);
    racer->result.outcome = (int)outcome;
    racer->result.size = size;
    racer->result.hash = payload ? XXH64(payload, size, 0) : 0;
    free(payload);
    return NULL;
}

static void test_concurrent_threads(void **state) {
    fixture_t *f = *state;
    atomic_int calls = 0;
    pthread_barrier_t barrier;
    assert_int_equal(pthread_barrier_init(&barrier, NULL, RACERS), 0);
    racer_t racers[RACERS];
    pthread_t threads[RACERS];
    for (int i = 0; i < RACERS; i++) {
        memset(&racers[i], 0, sizeof racers[i]);
        racers[i].fixture = f;
        racers[i].barrier = &barrier;
        racers[i].fake = fake_for("prefill|hd=128|threads", &calls);
        racers[i].fake.tag = (unsigned)i + 1; /* tells the compiling thread's payload apart */
        racers[i].fake.sleep_ms = RACE_COMPILE_MS;
        assert_int_equal(pthread_create(&threads[i], NULL, race_thread, &racers[i]), 0);
    }
    for (int i = 0; i < RACERS; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&barrier);
    int compiled = 0, hits = 0;
    for (int i = 0; i < RACERS; i++) {
        assert_int_equal(racers[i].result.status, CINFER_STATUS_SUCCESS);
        compiled += racers[i].result.outcome == CINFER__CACHE_COMPILED;
        hits += racers[i].result.outcome == CINFER__CACHE_HIT;
        assert_int_equal(racers[i].result.size, racers[0].result.size);
        assert_int_equal(racers[i].result.hash, racers[0].result.hash);
    }
    assert_int_equal(calls, 1);
    assert_int_equal(compiled, 1);
    assert_int_equal(hits, RACERS - 1);
    assert_int_equal(count_prefixed(f->dir, ".tmp-"), 0);
}

/* A compiler killed while holding the key's lock must not block the next one. */
static void test_killed_compiler_releases_lock(void **state) {
    fixture_t *f = *state;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        arm_child_watchdog();
        close(ready[0]);
        fake_t fake = fake_for(KEY, NULL);
        fake.ready_fd = ready[1];
        void *payload = NULL;
        size_t size = 0;
        cinfer__cache_outcome_t outcome;
        cinfer__cache_get_or_compile(f->dir, STEM, KEY, fake_compile, &fake, &payload, &size,
                                     &outcome);
        _exit(2); /* never reached: the fake hangs until killed */
    }
    close(ready[1]);
    char c = 0;
    ssize_t got = read(ready[0], &c, 1);
    close(ready[0]);

    /* The child holds the key's lock while it compiles (checked before the kill, asserted after
     * it, so a failure never leaves the child behind). */
    char lock[PATH_MAX];
    entry_path(lock, f->dir, STEM, ".lock");
    int fd = open(lock, O_RDWR);
    int locked = fd >= 0 ? flock(fd, LOCK_EX | LOCK_NB) : 0;
    int lock_errno = errno;
    if (fd >= 0)
        close(fd);

    int killed = kill(pid, SIGKILL);
    int wstatus = 0;
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    assert_int_equal(killed, 0);
    assert_true(WIFSIGNALED(wstatus));
    assert_int_equal(got, 1);
    assert_true(fd >= 0);
    assert_int_equal(locked, -1);
    assert_int_equal(lock_errno, EWOULDBLOCK);

    /* A regression (a lock that survives its holder) would hang here: the watchdog fails it. */
    arm_watchdog(5);
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    double t0 = cinfer__now();
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED);
    double seconds = cinfer__now() - t0;
    arm_watchdog(WATCHDOG_SECONDS);
    assert_true(seconds < 2.0);
    assert_int_equal(calls, 1);
    expect_get(f->dir, STEM, KEY, &fake, CINFER__CACHE_HIT);
    assert_int_equal(count_prefixed(f->dir, ".tmp-"), 0);
}

/* ---------------------------------------------------------------------------------------------
 * Unusable folders (each in a child: the warning is once per process)
 * ------------------------------------------------------------------------------------------- */

static int unusable_paths_child(void *arg) {
    fixture_t *f = arg;
    int fds_before = count_open_fds();
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);

    /* A regular file where the folder should be, and one above it: no user can create these. */
    char file[PATH_MAX], below_file[PATH_MAX];
    cinfer__fmt(file, sizeof file, "%s/file", f->root);
    cinfer__fmt(below_file, sizeof below_file, "%s/file/sub/kernels", f->root);
    int fd = open(file, O_WRONLY | O_CREAT, 0644);
    CHILD_CHECK(fd >= 0);
    close(fd);
    CHILD_CHECK(child_get(below_file, STEM, KEY, &fake, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(child_get(file, STEM, KEY, &fake, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(child_get(below_file, STEM, KEY, &fake, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(calls == 3);
    CHILD_CHECK(file_size(file) == 0);

    /* A folder where the entry belongs: the rename fails and the temporary file is removed. */
    char blocked[PATH_MAX];
    cinfer__fmt(blocked, sizeof blocked, "%s/blocked", f->root);
    CHILD_CHECK(mkdir(blocked, 0755) == 0);
    char entry[PATH_MAX];
    entry_path(entry, blocked, STEM, ".cubin");
    CHILD_CHECK(mkdir(entry, 0755) == 0);
    CHILD_CHECK(child_get(blocked, STEM, KEY, &fake, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(child_get(blocked, STEM, KEY, &fake, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(calls == 5);
    CHILD_CHECK(count_prefixed(blocked, ".tmp-") == 0);
    struct stat st;
    CHILD_CHECK(stat(entry, &st) == 0 && S_ISDIR(st.st_mode));

    CHILD_CHECK(count_open_fds() == fds_before);
    return 0;
}

static void test_unusable_paths_degrade(void **state) {
    fixture_t *f = *state;
    char captured[8192];
    assert_int_equal(run_child(unusable_paths_child, f, captured, sizeof captured), 0);
    assert_int_equal(count_substr(captured, "warning:"), 1);
    assert_non_null(strstr(captured, "kernel cache"));
}

static int read_only_fresh_child(void *arg) {
    const char *dir = arg;
    int rc = become_read_only(dir);
    if (rc)
        return rc;
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    CHILD_CHECK(child_get(dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(child_get(dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(calls == 2);
    return 0;
}

static void test_read_only_folder_compiles(void **state) {
    fixture_t *f = *state;
    char dir[PATH_MAX];
    cinfer__fmt(dir, sizeof dir, "%s/ro", f->root);
    assert_int_equal(chmod(f->root, 0755), 0); /* "nobody" must reach dir */
    assert_int_equal(mkdir(dir, 0755), 0);
    char captured[8192];
    int rc = run_child(read_only_fresh_child, dir, captured, sizeof captured);
    if (rc == CHILD_SKIP) {
        print_message("skipped: cannot make %s read-only for this user (root without "
                      "setuid?)\n",
                      dir);
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(count_substr(captured, "warning:"), 1);
    assert_int_equal(count_files(dir), 0);
}

static int read_only_hit_child(void *arg) {
    const char *dir = arg;
    int rc = become_read_only(dir);
    if (rc)
        return rc;
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    CHILD_CHECK(child_get(dir, STEM, KEY, &fake, CINFER__CACHE_HIT) == 0);
    CHILD_CHECK(child_get(dir, STEM, KEY, &fake, CINFER__CACHE_HIT) == 0);
    CHILD_CHECK(calls == 0);
    fprintf(stderr, "hits served\n"); /* marks that no warning came before this point */

    uint64_t entries = 0, bytes = 0;
    CHILD_CHECK(cinfer__cache_usage(dir, &entries, &bytes) == CINFER_STATUS_SUCCESS);
    CHILD_CHECK(entries == 1);
    unsigned removed = 99;
    CHILD_CHECK(cinfer__cache_clear(dir, &removed) == CINFER_STATUS_IO_ERROR);
    CHILD_CHECK(removed == 0);

    /* A new key cannot be stored: compiled in memory with the one warning. */
    const char *key2 = "another|key";
    fake_t fake2 = fake_for(key2, &calls);
    CHILD_CHECK(child_get(dir, "another-0001", key2, &fake2, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(child_get(dir, "another-0001", key2, &fake2, CINFER__CACHE_COMPILED) == 0);
    CHILD_CHECK(calls == 2);
    return 0;
}

static void test_read_only_folder_hits(void **state) {
    fixture_t *f = *state;
    char dir[PATH_MAX];
    cinfer__fmt(dir, sizeof dir, "%s/ro", f->root);
    assert_int_equal(chmod(f->root, 0755), 0);
    atomic_int calls = 0;
    fake_t fake = fake_for(KEY, &calls);
    expect_get(dir, STEM, KEY, &fake, CINFER__CACHE_COMPILED);
    char captured[8192];
    int rc = run_child(read_only_hit_child, dir, captured, sizeof captured);
    if (rc == CHILD_SKIP) {
        print_message("skipped: cannot make %s read-only for this user (root without "
                      "setuid?)\n",
                      dir);
        skip();
    }
    assert_int_equal(rc, 0);
    const char *marker = strstr(captured, "hits served\n");
    assert_non_null(marker);
    assert_int_equal(count_substr(marker, "warning:"), 1);
    assert_int_equal(count_substr(captured, "warning:"), 1);
    /* Nothing was added or removed. */
    assert_int_equal(count_files(dir), 2);
}

/* ---------------------------------------------------------------------------------------------
 * Listing, usage, clearing
 * ------------------------------------------------------------------------------------------- */

#define MAX_LISTED 16

typedef struct listing {
    int count;
    cinfer__cache_entry_t entries[MAX_LISTED];
} listing_t;

static void collect(void *arg, const cinfer__cache_entry_t *entry) {
    listing_t *l = arg;
    if (l->count < MAX_LISTED)
        l->entries[l->count] = *entry;
    l->count++;
}

static const cinfer__cache_entry_t *find_listed(const listing_t *l, const char *file) {
    for (int i = 0; i < l->count && i < MAX_LISTED; i++)
        if (strcmp(l->entries[i].file, file) == 0)
            return &l->entries[i];
    return NULL;
}

static void test_list_usage_clear(void **state) {
    fixture_t *f = *state;
    atomic_int calls = 0;
    const char *stems[] = {"merge_states_bf16_hd128-3f2a", "decode-fp16-hd64-0042", "nodash"};
    const char *names[] = {"merge_states_bf16_hd128", "decode-fp16-hd64", "nodash"};
    const char *keys[] = {"key one", "key two", "key three"};
    for (int i = 0; i < 3; i++) {
        fake_t fake = fake_for(keys[i], &calls);
        expect_get(f->dir, stems[i], keys[i], &fake, CINFER__CACHE_COMPILED);
    }
    /* Files of the cache that do not come from get_or_compile, and files that are not its own. */
    char path[PATH_MAX];
    cinfer__fmt(path, sizeof path, "%s/bad-0001.cubin", f->dir);
    write_file(path, "NOTCACHE\1\0\0\0", 12);
    cinfer__fmt(path, sizeof path, "%s/.tmp-stale-123456", f->dir);
    write_file(path, "partial", 7);
    cinfer__fmt(path, sizeof path, "%s/notes.txt", f->dir);
    write_file(path, "keep me", 7);
    cinfer__fmt(path, sizeof path, "%s/folder.cubin", f->dir);
    assert_int_equal(mkdir(path, 0755), 0);

    listing_t l;
    memset(&l, 0, sizeof l);
    assert_int_equal(cinfer__cache_list(f->dir, collect, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.count, 4);
    uint64_t total = 0;
    double now = (double)time(NULL);
    for (int i = 0; i < 3; i++) {
        char file[300];
        cinfer__fmt(file, sizeof file, "%s.cubin", stems[i]);
        const cinfer__cache_entry_t *e = find_listed(&l, file);
        assert_non_null(e);
        assert_string_equal(e->name, names[i]);
        entry_path(path, f->dir, stems[i], ".cubin");
        assert_int_equal(e->bytes, (uint64_t)file_size(path));
        assert_int_equal(e->bytes, 32 + strlen(keys[i]) + payload_bytes(keys[i]));
        assert_true(e->valid_header);
        assert_true(e->mtime > now - 600 && e->mtime < now + 600);
        total += e->bytes;
    }
    const cinfer__cache_entry_t *bad = find_listed(&l, "bad-0001.cubin");
    assert_non_null(bad);
    assert_string_equal(bad->name, "bad");
    assert_int_equal(bad->bytes, 12);
    assert_false(bad->valid_header);
    total += 12;

    uint64_t entries = 0, bytes = 0;
    assert_int_equal(cinfer__cache_usage(f->dir, &entries, &bytes), CINFER_STATUS_SUCCESS);
    assert_int_equal(entries, 4);
    assert_int_equal(bytes, total);

    /* 4 entries, 3 locks, 1 temporary file; notes.txt and the folder stay. */
    unsigned removed = 0;
    assert_int_equal(cinfer__cache_clear(f->dir, &removed), CINFER_STATUS_SUCCESS);
    assert_int_equal(removed, 8);
    assert_int_equal(count_files(f->dir), 2);
    cinfer__fmt(path, sizeof path, "%s/notes.txt", f->dir);
    assert_true(exists(path));
    cinfer__fmt(path, sizeof path, "%s/folder.cubin", f->dir);
    assert_true(exists(path));

    memset(&l, 0, sizeof l);
    assert_int_equal(cinfer__cache_list(f->dir, collect, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.count, 0);
    assert_int_equal(cinfer__cache_usage(f->dir, &entries, &bytes), CINFER_STATUS_SUCCESS);
    assert_int_equal(entries, 0);
    assert_int_equal(bytes, 0);
    assert_int_equal(cinfer__cache_clear(f->dir, &removed), CINFER_STATUS_SUCCESS);
    assert_int_equal(removed, 0);

    /* After clearing, the cache works as before. */
    fake_t fake = fake_for(keys[0], &calls);
    expect_get(f->dir, stems[0], keys[0], &fake, CINFER__CACHE_COMPILED);
    assert_int_equal(calls, 4);
}

static void test_list_missing_or_bad_folder(void **state) {
    fixture_t *f = *state;
    listing_t l;
    memset(&l, 0, sizeof l);
    uint64_t entries = 9, bytes = 9;
    unsigned removed = 9;

    /* A missing folder (and no folder at all) lists nothing. */
    assert_int_equal(cinfer__cache_list(f->dir, collect, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__cache_list("", collect, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__cache_list(NULL, collect, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.count, 0);
    assert_int_equal(cinfer__cache_usage(f->dir, &entries, &bytes), CINFER_STATUS_SUCCESS);
    assert_int_equal(entries, 0);
    assert_int_equal(bytes, 0);
    assert_int_equal(cinfer__cache_clear(f->dir, &removed), CINFER_STATUS_SUCCESS);
    assert_int_equal(removed, 0);
    assert_false(exists(f->dir));

    /* A file where the folder should be cannot be read as a folder. */
    char file[PATH_MAX];
    cinfer__fmt(file, sizeof file, "%s/file.cubin", f->root);
    write_file(file, "x", 1);
    assert_int_equal(cinfer__cache_list(file, collect, &l), CINFER_STATUS_IO_ERROR);
    assert_int_equal(cinfer__cache_usage(file, &entries, &bytes), CINFER_STATUS_IO_ERROR);
    assert_int_equal(cinfer__cache_clear(file, &removed), CINFER_STATUS_IO_ERROR);
    assert_true(exists(file));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_miss_then_hit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_format, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_folder_compiles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_collision, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compile_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_descriptor_leaks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_compiler_releases_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unusable_paths_degrade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only_folder_compiles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only_folder_hits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_usage_clear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_missing_or_bad_folder, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
