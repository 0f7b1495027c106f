/*
 * The on-disk kernel cache; cache.h documents the file format and the guarantees.
 *
 * A lookup first reads the entry without any lock (the common case, a hit, costs one open and
 * one read). On a miss it takes the key's lock, reads again (another process may have written
 * the entry while this one waited), compiles, writes a temporary file and renames it into place.
 * Entries are never modified after the rename, so a reader that opened one sees either the old
 * file or the new one, never a mixture.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "jit/cache.h"

/* magic (8) | format version u32 | key length u32 | payload size u64 | checksum u64. */
#define HEADER_BYTES 32
#define MAGIC_BYTES  8

#define ENTRY_SUFFIX ".cubin"
#define LOCK_SUFFIX  ".lock"
#define TEMP_PREFIX  ".tmp-"

/* The longest file stem: "<stem>.cubin" must fit in one file name (NAME_MAX on Linux). */
#define STEM_MAX (255 - (sizeof ENTRY_SUFFIX - 1))

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static bool has_suffix(const char *name, const char *suffix) {
    size_t n = strlen(name), s = strlen(suffix);
    return n > s && memcmp(name + n - s, suffix, s) == 0;
}

static bool has_prefix(const char *name, const char *prefix) {
    return strncmp(name, prefix, strlen(prefix)) == 0;
}

static bool is_entry_name(const char *name) {
    return has_suffix(name, ENTRY_SUFFIX) && !has_prefix(name, TEMP_PREFIX);
}

static bool is_cache_file_name(const char *name) {
    return is_entry_name(name) || has_suffix(name, LOCK_SUFFIX) || has_prefix(name, TEMP_PREFIX);
}

/* A file stem must name a file directly inside the folder. */
static bool is_plain_stem(const char *stem) {
    if (!stem || !stem[0] || strchr(stem, '/'))
        return false;
    if (strcmp(stem, ".") == 0 || strcmp(stem, "..") == 0)
        return false;
    return strlen(stem) <= STEM_MAX;
}

/* Formats "<dir>/<stem><suffix>"; false when the path does not fit. */
static bool join_path(char *dst, size_t cap, const char *dir, const char *stem,
                      const char *suffix) {
    int n = snprintf(dst, cap, "%s/%s%s", dir, stem, suffix);
    return n >= 0 && (size_t)n < cap;
}

/*
 * Cache trouble (folder missing and not creatable, read-only, disk full) is never an error: the
 * first occurrence in the process is a warning, later ones are debug lines, so a service with a
 * read-only home does not print one warning per kernel.
 */
static atomic_flag trouble_warned = ATOMIC_FLAG_INIT;
static _Atomic uint64_t trouble_count;

uint64_t cinfer__cache_write_failures(void) {
    return atomic_load(&trouble_count);
}

static void cache_trouble(const char *fmt, ...) CINFER__PRINTF(1, 2);

static void cache_trouble(const char *fmt, ...) {
    char what[PATH_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&trouble_count, 1);
    if (!atomic_flag_test_and_set(&trouble_warned))
        cinfer__warn("kernel cache not usable (%s); kernels are compiled in memory and not saved; "
                     "set CINFER_CACHE_DIR to a writable folder (shown once per process)",
                     what);
    else
        cinfer__log(CINFER__LOG_DEBUG, "kernel cache not usable: %s", what);
}

/* ---------------------------------------------------------------------------------------------
 * Reading an entry
 * ------------------------------------------------------------------------------------------- */

typedef enum entry_state {
    ENTRY_VALID,
    ENTRY_MISSING, /* absent, unreadable, or not loadable for a reason other than its content */
    ENTRY_CORRUPT, /* present but invalid; deleted when the folder allows it */
} entry_state_t;

/*
 * Checks the open entry (file_bytes long) against key and loads its payload. Returns NULL when
 * valid, else what is wrong with it; *corrupt says whether the content is to blame (as opposed to
 * running out of memory).
 */
static const char *load_entry(int fd, uint64_t file_bytes, const char *key, void **payload,
                              size_t *size, bool *corrupt) {
    *corrupt = true;
    unsigned char header[HEADER_BYTES];
    if (file_bytes < HEADER_BYTES)
        return file_bytes == 0 ? "empty file" : "truncated header";
    if (!cinfer__read_full(fd, header, sizeof header))
        return "unreadable header";
    if (memcmp(header, CINFER__CACHE_MAGIC, MAGIC_BYTES) != 0)
        return "bad magic";
    if (get_u32(header + 8) != CINFER__CACHE_FORMAT_VERSION)
        return "other format version";
    uint64_t key_bytes = get_u32(header + 12);
    uint64_t payload_bytes = get_u64(header + 16);
    uint64_t checksum = get_u64(header + 24);
    /* Compared without overflow: a corrupt payload size can be anything. */
    uint64_t body_bytes = file_bytes - HEADER_BYTES;
    if (key_bytes > body_bytes || payload_bytes != body_bytes - key_bytes)
        return "size mismatch (truncated or trailing bytes)";
    if (payload_bytes > SIZE_MAX - 1)
        return "payload too large";
    size_t key_len = strlen(key);
    if (key_bytes != key_len)
        return "key mismatch (another key with the same file name)";

    *corrupt = false;
    char *stored_key = malloc(key_len + 1);
    unsigned char *data = malloc(payload_bytes ? (size_t)payload_bytes : 1);
    if (!stored_key || !data) {
        free(stored_key);
        free(data);
        return "out of memory";
    }
    *corrupt = true;
    const char *problem = NULL;
    if (!cinfer__read_full(fd, stored_key, key_len) ||
        !cinfer__read_full(fd, data, (size_t)payload_bytes))
        problem = "unreadable body";
    else if (memcmp(stored_key, key, key_len) != 0)
        problem = "key mismatch (another key with the same file name)";
    else if (XXH3_64bits(data, (size_t)payload_bytes) != checksum)
        problem = "checksum mismatch";
    free(stored_key);
    if (problem) {
        free(data);
        return problem;
    }
    *payload = data;
    *size = (size_t)payload_bytes;
    return NULL;
}

/*
 * Deletes a corrupt entry, but only if the path still names the file that was read: another
 * process may have renamed a fresh entry into place meanwhile, and that one must stay.
 */
static void remove_corrupt(const char *path, const struct stat *read_file) {
    struct stat now;
    if (stat(path, &now) != 0 || now.st_dev != read_file->st_dev || now.st_ino != read_file->st_ino)
        return;
    if (unlink(path) != 0)
        cinfer__log(CINFER__LOG_DEBUG, "kernel cache: cannot remove corrupt entry %s: %s", path,
                    strerror(errno));
}

/* Reads the entry at path; on ENTRY_VALID *payload (malloc'ed) and *size are set. `why` receives
 * the reason for any other state. */
static entry_state_t read_entry(const char *path, const char *key, void **payload, size_t *size,
                                char *why, size_t why_cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cinfer__fmt(why, why_cap, "%s", errno == ENOENT ? "no entry" : strerror(errno));
        return ENTRY_MISSING;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        cinfer__fmt(why, why_cap, "not a regular file");
        close(fd);
        return ENTRY_MISSING;
    }
    bool corrupt = false;
    const char *problem = load_entry(fd, (uint64_t)st.st_size, key, payload, size, &corrupt);
    close(fd);
    if (!problem)
        return ENTRY_VALID;
    cinfer__fmt(why, why_cap, "%s", problem);
    if (!corrupt)
        return ENTRY_MISSING;
    cinfer__log(CINFER__LOG_DEBUG, "kernel cache: removing invalid entry %s: %s", path, problem);
    remove_corrupt(path, &st);
    return ENTRY_CORRUPT;
}

cinfer_status_t cinfer__cache_read(const char *dir, const char *file_stem, const char *key,
                                   void **payload, size_t *size) {
    if (!key || !payload || !size)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__cache_read: key, payload and size must not be NULL");
    if (!is_plain_stem(file_stem))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__cache_read: file_stem \"%s\" is not a plain file name",
                             file_stem ? file_stem : "(null)");
    *payload = NULL;
    *size = 0;
    if (!dir || !dir[0])
        return cinfer__error(CINFER_STATUS_NOT_FOUND, "kernel cache: no cache folder");
    char path[PATH_MAX];
    if (!join_path(path, sizeof path, dir, file_stem, ENTRY_SUFFIX))
        return cinfer__error(CINFER_STATUS_NOT_FOUND, "kernel cache: path too long in %s", dir);
    char why[128];
    if (read_entry(path, key, payload, size, why, sizeof why) == ENTRY_VALID)
        return CINFER_STATUS_SUCCESS;
    return cinfer__error(CINFER_STATUS_NOT_FOUND, "kernel cache entry %s: %s", path, why);
}

/* ---------------------------------------------------------------------------------------------
 * Writing an entry
 * ------------------------------------------------------------------------------------------- */

/* mkdir -p with mode 0755; returns 0 or an errno value. */
static int make_dirs(const char *dir) {
    struct stat st;
    if (stat(dir, &st) == 0)
        return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    char buf[PATH_MAX];
    size_t n = strlen(dir);
    if (n >= sizeof buf)
        return ENAMETOOLONG;
    memcpy(buf, dir, n + 1);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0755) != 0) {
            /* An existing folder is fine; mkdir reports other errors (EACCES, EROFS) for
             * existing paths on some file systems, hence the stat instead of checking EEXIST. */
            int err = errno;
            if (stat(buf, &st) != 0)
                return err;
            if (!S_ISDIR(st.st_mode))
                return ENOTDIR;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    return 0;
}

/* Writes the entry through a temporary file renamed onto path. Returns 0 or an errno value and
 * removes the temporary file on failure. */
static int write_entry(const char *dir, const char *stem, const char *path, const char *key,
                       const void *payload, size_t size) {
    size_t key_len = strlen(key);
    if (key_len > UINT32_MAX)
        return EOVERFLOW; /* the header stores the key length in 32 bits */
    char temp[PATH_MAX];
    /* The stem in the temporary name only helps a human reading the folder; it is shortened so
     * the name stays within NAME_MAX. */
    int n = snprintf(temp, sizeof temp, "%s/" TEMP_PREFIX "%.64s-XXXXXX", dir, stem);
    if (n < 0 || (size_t)n >= sizeof temp)
        return ENAMETOOLONG;
    int fd = mkostemp(temp, O_CLOEXEC);
    if (fd < 0)
        return errno;

    unsigned char header[HEADER_BYTES];
    memcpy(header, CINFER__CACHE_MAGIC, MAGIC_BYTES);
    put_u32(header + 8, CINFER__CACHE_FORMAT_VERSION);
    put_u32(header + 12, (uint32_t)key_len);
    put_u64(header + 16, (uint64_t)size);
    put_u64(header + 24, XXH3_64bits(payload, size));

    int err = 0;
    if (!cinfer__write_full(fd, header, sizeof header) || !cinfer__write_full(fd, key, key_len) ||
        !cinfer__write_full(fd, payload, size))
        err = errno;
    /* mkostemp creates the file 0600; entries are as readable as the folder allows. */
    if (!err && fchmod(fd, 0644) != 0)
        cinfer__log(CINFER__LOG_DEBUG, "kernel cache: fchmod %s: %s", temp, strerror(errno));
    if (close(fd) != 0 && !err)
        err = errno;
    if (!err && rename(temp, path) != 0)
        err = errno;
    if (err)
        unlink(temp);
    return err;
}

/* ---------------------------------------------------------------------------------------------
 * Lookup or compile
 * ------------------------------------------------------------------------------------------- */

static cinfer_status_t run_compile(cinfer__cache_compile_fn compile, void *arg, void **payload,
                                   size_t *size, cinfer__cache_outcome_t *outcome) {
    void *data = NULL;
    size_t bytes = 0;
    cinfer_status_t status = compile(arg, &data, &bytes);
    if (status != CINFER_STATUS_SUCCESS)
        return status;
    if (!data && bytes > 0)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "kernel cache: compile returned no payload for %zu bytes", bytes);
    *payload = data;
    *size = bytes;
    *outcome = CINFER__CACHE_COMPILED;
    return CINFER_STATUS_SUCCESS;
}

/* Takes an exclusive flock, waiting as long as another holder compiles. */
static int lock_exclusive(int fd) {
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR)
            return errno;
    }
    return 0;
}

cinfer_status_t cinfer__cache_get_or_compile(const char *dir, const char *file_stem,
                                             const char *key, cinfer__cache_compile_fn compile,
                                             void *arg, void **payload, size_t *size,
                                             cinfer__cache_outcome_t *outcome) {
    if (!key || !compile || !payload || !size || !outcome)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__cache_get_or_compile: key, compile, payload, size and "
                             "outcome must not be NULL");
    *payload = NULL;
    *size = 0;
    if (!dir || !dir[0])
        return run_compile(compile, arg, payload, size, outcome);
    if (!is_plain_stem(file_stem))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__cache_get_or_compile: file_stem \"%s\" is not a plain "
                             "file name of at most %zu bytes",
                             file_stem ? file_stem : "(null)", (size_t)STEM_MAX);

    char entry[PATH_MAX], lock[PATH_MAX], why[128];
    if (!join_path(entry, sizeof entry, dir, file_stem, ENTRY_SUFFIX) ||
        !join_path(lock, sizeof lock, dir, file_stem, LOCK_SUFFIX)) {
        cache_trouble("path too long in %s", dir);
        return run_compile(compile, arg, payload, size, outcome);
    }

    if (read_entry(entry, key, payload, size, why, sizeof why) == ENTRY_VALID) {
        *outcome = CINFER__CACHE_HIT;
        return CINFER_STATUS_SUCCESS;
    }

    int err = make_dirs(dir);
    if (err) {
        cache_trouble("cannot create folder %s: %s", dir, strerror(err));
        return run_compile(compile, arg, payload, size, outcome);
    }
    int lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0) {
        cache_trouble("cannot open lock file %s: %s", lock, strerror(errno));
        return run_compile(compile, arg, payload, size, outcome);
    }
    err = lock_exclusive(lock_fd);
    if (err) {
        /* Without the lock, concurrent misses may compile twice; the rename keeps every reader
         * safe, so the entry is still written. */
        cache_trouble("cannot lock %s: %s", lock, strerror(err));
    } else if (read_entry(entry, key, payload, size, why, sizeof why) == ENTRY_VALID) {
        /* Another process or thread compiled it while this one waited. */
        close(lock_fd);
        *outcome = CINFER__CACHE_HIT;
        return CINFER_STATUS_SUCCESS;
    }
    cinfer__log(CINFER__LOG_DEBUG, "kernel cache miss %s: %s", entry, why);

    cinfer_status_t status = run_compile(compile, arg, payload, size, outcome);
    if (status != CINFER_STATUS_SUCCESS)
        goto out_close_lock;
    err = write_entry(dir, file_stem, entry, key, *payload, *size);
    if (err)
        cache_trouble("cannot write %s: %s", entry, strerror(err));
    else
        cinfer__log(CINFER__LOG_DEBUG, "kernel cache: wrote %s (%zu bytes)", entry, *size);

out_close_lock:
    close(lock_fd);
    return status;
}

/* ---------------------------------------------------------------------------------------------
 * Listing and clearing
 * ------------------------------------------------------------------------------------------- */

static bool header_is_current(int dir_fd, const char *name) {
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    unsigned char header[MAGIC_BYTES + 4];
    bool ok = cinfer__read_full(fd, header, sizeof header) &&
              memcmp(header, CINFER__CACHE_MAGIC, MAGIC_BYTES) == 0 &&
              get_u32(header + MAGIC_BYTES) == CINFER__CACHE_FORMAT_VERSION;
    close(fd);
    return ok;
}

/* Opens dir for listing; *d stays NULL (and SUCCESS is returned) when there is no folder. */
static cinfer_status_t open_cache_dir(const char *dir, DIR **d) {
    *d = NULL;
    if (!dir || !dir[0])
        return CINFER_STATUS_SUCCESS;
    *d = opendir(dir);
    if (*d || errno == ENOENT)
        return CINFER_STATUS_SUCCESS;
    return cinfer__error(CINFER_STATUS_IO_ERROR, "cannot read kernel cache folder %s: %s", dir,
                         strerror(errno));
}

cinfer_status_t cinfer__cache_list(const char *dir,
                                   void (*visit)(void *arg, const cinfer__cache_entry_t *entry),
                                   void *arg) {
    if (!visit)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "cinfer__cache_list: visit is NULL");
    DIR *d;
    CINFER__CHECK(open_cache_dir(dir, &d));
    if (!d)
        return CINFER_STATUS_SUCCESS;
    int dir_fd = dirfd(d);
    cinfer_status_t status = CINFER_STATUS_SUCCESS;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno)
                status =
                    cinfer__error(CINFER_STATUS_IO_ERROR, "cannot read kernel cache folder %s: %s",
                                  dir, strerror(errno));
            break;
        }
        if (!is_entry_name(de->d_name))
            continue;
        struct stat st;
        /* Entries removed meanwhile and anything that is not a plain file are not entries. */
        if (fstatat(dir_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        cinfer__cache_entry_t entry;
        memset(&entry, 0, sizeof entry);
        cinfer__fmt(entry.file, sizeof entry.file, "%s", de->d_name);
        size_t stem_len = strlen(de->d_name) - (sizeof ENTRY_SUFFIX - 1);
        const char *dash = memrchr(de->d_name, '-', stem_len);
        size_t name_len = dash ? (size_t)(dash - de->d_name) : stem_len;
        if (name_len >= sizeof entry.name)
            name_len = sizeof entry.name - 1;
        memcpy(entry.name, de->d_name, name_len);
        entry.name[name_len] = '\0';
        entry.bytes = (uint64_t)st.st_size;
        entry.mtime = (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
        entry.valid_header = header_is_current(dir_fd, de->d_name);
        visit(arg, &entry);
    }
    closedir(d);
    return status;
}

cinfer_status_t cinfer__cache_clear(const char *dir, unsigned *removed) {
    unsigned count = 0;
    if (removed)
        *removed = 0;
    DIR *d;
    CINFER__CHECK(open_cache_dir(dir, &d));
    if (!d)
        return CINFER_STATUS_SUCCESS;
    int dir_fd = dirfd(d);
    unsigned failed = 0;
    int first_err = 0, read_err = 0;
    char first_name[256] = "";
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            read_err = errno;
            break;
        }
        if (!is_cache_file_name(de->d_name))
            continue;
        struct stat st;
        /* Folders are never written by the cache, whatever their name. */
        if (fstatat(dir_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode))
            continue;
        if (unlinkat(dir_fd, de->d_name, 0) == 0) {
            count++;
        } else if (errno != ENOENT) {
            if (!failed) {
                first_err = errno;
                cinfer__fmt(first_name, sizeof first_name, "%s", de->d_name);
            }
            failed++;
        }
    }
    closedir(d);
    if (removed)
        *removed = count;
    if (failed)
        return cinfer__error(CINFER_STATUS_IO_ERROR,
                             "kernel cache %s: could not remove %u file(s) (first: %s: %s)", dir,
                             failed, first_name, strerror(first_err));
    if (read_err)
        return cinfer__error(CINFER_STATUS_IO_ERROR, "cannot read kernel cache folder %s: %s", dir,
                             strerror(read_err));
    return CINFER_STATUS_SUCCESS;
}

typedef struct usage_sum {
    uint64_t entries, bytes;
} usage_sum_t;

static void add_usage(void *arg, const cinfer__cache_entry_t *entry) {
    usage_sum_t *sum = arg;
    sum->entries++;
    sum->bytes += entry->bytes;
}

cinfer_status_t cinfer__cache_usage(const char *dir, uint64_t *entries, uint64_t *bytes) {
    if (!entries || !bytes)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__cache_usage: entries and bytes must not be NULL");
    usage_sum_t sum = {0, 0};
    cinfer_status_t status = cinfer__cache_list(dir, add_usage, &sum);
    *entries = sum.entries;
    *bytes = sum.bytes;
    return status;
}
