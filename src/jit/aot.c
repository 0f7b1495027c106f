/*
 * The AOT kernel bundle: reader, process-wide lookup and writer; aot.h documents the file format
 * and the guarantees.
 *
 * The reader keeps the file open and its index in memory; each lookup is a binary search over the
 * index by key hash, a byte compare of the key text, and one pread of the cubin, which is checked
 * against its checksum before it is handed out.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "jit/aot.h"
#include "jit/jit.h"
#include "jit/sources.h"

#define HEADER_BYTES     192
#define ENTRY_BYTES      64
#define MAGIC_BYTES      8
#define VERSION_BYTES    16
#define ARCH_LIST_BYTES  112
#define CUBIN_ALIGN      64
#define HEADER_SUM_BYTES 184 /* the header checksum covers everything before it */
/* The arch list holds at most this many archs of at most 23 characters ("sm_100a" is 7). */
#define MAX_ARCHS     16
#define ARCH_NAME_CAP 24

/* Header field offsets. */
enum {
    H_FORMAT = 8,
    H_COUNT = 12,
    H_FILE_BYTES = 16,
    H_STRING_BYTES = 24,
    H_SOURCES = 32,
    H_NVRTC = 40,
    H_LIBRARY = 48,
    H_ARCHS = 64,
    H_META_SUM = 176,
    H_HEADER_SUM = 184,
};

/* Index entry field offsets. */
enum {
    E_HASH_HIGH = 0,
    E_HASH_LOW = 8,
    E_KEY_OFFSET = 16,
    E_KEY_BYTES = 24,
    E_NAME_BYTES = 28,
    E_ARCH = 30,
    E_NAME_OFFSET = 32,
    E_CUBIN_OFFSET = 40,
    E_CUBIN_BYTES = 48,
    E_CUBIN_SUM = 56,
};

/* ---------------------------------------------------------------------------------------------
 * Little-endian fields and whole-file I/O
 * ------------------------------------------------------------------------------------------- */

static void put_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
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

/* A NUL-padded text field of cap bytes into dst (cap + 1 bytes); false if it has no NUL. */
static bool get_text(const unsigned char *p, size_t cap, char *dst) {
    const unsigned char *nul = memchr(p, '\0', cap);
    if (!nul)
        return false;
    memcpy(dst, p, (size_t)(nul - p) + 1);
    return true;
}

/* Splits "sm_80,sm_90a" into names; false for an empty or oversized item or too many items. */
static bool split_archs(const char *list, char names[][ARCH_NAME_CAP], int *count) {
    *count = 0;
    if (!list[0])
        return true;
    for (const char *p = list;;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= ARCH_NAME_CAP || *count == MAX_ARCHS)
            return false;
        memcpy(names[*count], p, n);
        names[(*count)++][n] = '\0';
        if (!p[n])
            return true;
        p += n + 1;
    }
}

static void current_identity(char *version, size_t cap, unsigned long long *sources) {
    cinfer__fmt(version, cap, "%s", cinfer_version_string());
    *sources = cinfer__kernel_sources_hash();
}

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

struct cinfer__aot_bundle {
    char path[PATH_MAX];
    int fd;
    uint64_t file_bytes;
    uint32_t count;
    int nvrtc_version;
    unsigned long long sources_hash;
    char library_version[VERSION_BYTES + 1];
    char arch_list[ARCH_LIST_BYTES + 1];
    char archs[MAX_ARCHS][ARCH_NAME_CAP];
    int num_archs;
    unsigned char *meta; /* the index, then the string table: file bytes [HEADER_BYTES, ...) */
    uint64_t meta_bytes;
    atomic_bool broken;        /* a cubin failed its checksum: the bundle is no longer used */
    atomic_flag broken_warned; /* the warning about it was printed */
    atomic_flag arch_logged;   /* the info line about a missing arch was printed */
};

static const unsigned char *entry_at(const cinfer__aot_bundle_t *b, uint32_t i) {
    return b->meta + (size_t)i * ENTRY_BYTES;
}

/* The string at file offset `offset` (checked at open to lie in the string table). */
static const char *string_at(const cinfer__aot_bundle_t *b, uint64_t offset) {
    return (const char *)b->meta + (offset - HEADER_BYTES);
}

/* Whether [offset, offset + bytes] (with the NUL) lies in the string table and ends in a NUL. */
static bool string_ok(const cinfer__aot_bundle_t *b, uint64_t offset, uint64_t bytes) {
    const uint64_t start = HEADER_BYTES + (uint64_t)b->count * ENTRY_BYTES;
    const uint64_t end = HEADER_BYTES + b->meta_bytes;
    return offset >= start && offset < end && bytes < end - offset &&
           string_at(b, offset)[bytes] == '\0' && strlen(string_at(b, offset)) == bytes;
}

/* Checks every index entry against the file; NULL when all are sound, else what is wrong. */
static const char *check_entries(const cinfer__aot_bundle_t *b, char *why, size_t cap) {
    const uint64_t data_start = HEADER_BYTES + b->meta_bytes;
    for (uint32_t i = 0; i < b->count; i++) {
        const unsigned char *e = entry_at(b, i);
        const uint64_t cubin = get_u64(e + E_CUBIN_OFFSET), bytes = get_u64(e + E_CUBIN_BYTES);
        if (!string_ok(b, get_u64(e + E_KEY_OFFSET), get_u32(e + E_KEY_BYTES)) ||
            !string_ok(b, get_u64(e + E_NAME_OFFSET), get_u16(e + E_NAME_BYTES)) ||
            get_u16(e + E_ARCH) >= b->num_archs || cubin < data_start || bytes == 0 ||
            cubin > b->file_bytes || bytes > b->file_bytes - cubin) {
            cinfer__fmt(why, cap, "index entry %u points outside the file", (unsigned)i);
            return why;
        }
        if (i > 0) {
            const unsigned char *prev = entry_at(b, i - 1);
            const uint64_t ph = get_u64(prev + E_HASH_HIGH), h = get_u64(e + E_HASH_HIGH);
            if (ph > h || (ph == h && get_u64(prev + E_HASH_LOW) > get_u64(e + E_HASH_LOW))) {
                cinfer__fmt(why, cap, "index is not sorted at entry %u", (unsigned)i);
                return why;
            }
        }
    }
    return NULL;
}

/* Fills b from its open file. Returns SUCCESS or the status of what is wrong, with the message
 * set (naming the path). */
static cinfer_status_t load_bundle(cinfer__aot_bundle_t *b, uint64_t size) {
    const char *path = b->path;
    unsigned char h[HEADER_BYTES];
    const size_t head = size < HEADER_BYTES ? (size_t)size : HEADER_BYTES;
    errno = 0;
    if (!cinfer__pread_full(b->fd, h, head, 0))
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: cannot read the header: %s",
                             path, errno ? strerror(errno) : "end of file");
    /* The magic first, so that any other file is called what it is, whatever its size. */
    if (head >= MAGIC_BYTES && memcmp(h, CINFER__AOT_MAGIC, MAGIC_BYTES) != 0)
        return cinfer__error(CINFER_STATUS_IO_ERROR,
                             "%s is not a cinfer AOT bundle (no \"" CINFER__AOT_MAGIC "\" magic)",
                             path);
    if (size < HEADER_BYTES)
        return cinfer__error(CINFER_STATUS_IO_ERROR,
                             "AOT bundle %s: truncated (%llu bytes, less than its %d-byte header)",
                             path, (unsigned long long)size, HEADER_BYTES);
    const uint32_t format = get_u32(h + H_FORMAT);
    if (format != CINFER__AOT_FORMAT_VERSION)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "AOT bundle %s has format version %u; this library (cinfer %s) reads "
                             "version %u",
                             path, (unsigned)format, cinfer_version_string(),
                             CINFER__AOT_FORMAT_VERSION);
    if (XXH3_64bits(h, HEADER_SUM_BYTES) != get_u64(h + H_HEADER_SUM))
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: corrupt header (checksum)",
                             path);
    if (!get_text(h + H_LIBRARY, VERSION_BYTES, b->library_version) ||
        !get_text(h + H_ARCHS, ARCH_LIST_BYTES, b->arch_list) ||
        !split_archs(b->arch_list, b->archs, &b->num_archs))
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: corrupt header (text fields)",
                             path);
    b->sources_hash = get_u64(h + H_SOURCES);
    char version[VERSION_BYTES + 1];
    unsigned long long sources;
    current_identity(version, sizeof version, &sources);
    if (strcmp(b->library_version, version) != 0 || b->sources_hash != sources)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "AOT bundle %s was built for cinfer %s (kernel sources %016llx); this "
                             "is cinfer %s (kernel sources %016llx)",
                             path, b->library_version, b->sources_hash, version, sources);
    b->file_bytes = get_u64(h + H_FILE_BYTES);
    if (b->file_bytes != size)
        return cinfer__error(CINFER_STATUS_IO_ERROR,
                             "AOT bundle %s: %s (%llu bytes, the header says %llu)", path,
                             size < b->file_bytes ? "truncated" : "trailing bytes",
                             (unsigned long long)size, (unsigned long long)b->file_bytes);
    b->count = get_u32(h + H_COUNT);
    b->nvrtc_version = (int)get_u32(h + H_NVRTC);
    const uint64_t strings = get_u64(h + H_STRING_BYTES);
    const uint64_t room = size - HEADER_BYTES;
    if ((uint64_t)b->count * ENTRY_BYTES > room ||
        strings > room - (uint64_t)b->count * ENTRY_BYTES)
        return cinfer__error(CINFER_STATUS_IO_ERROR,
                             "AOT bundle %s: corrupt header (%u entries and %llu string bytes do "
                             "not fit in %llu bytes)",
                             path, (unsigned)b->count, (unsigned long long)strings,
                             (unsigned long long)size);
    b->meta_bytes = (uint64_t)b->count * ENTRY_BYTES + strings;
    b->meta = malloc(b->meta_bytes ? (size_t)b->meta_bytes : 1);
    if (!b->meta)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "AOT bundle %s: out of memory", path);
    errno = 0;
    if (!cinfer__pread_full(b->fd, b->meta, (size_t)b->meta_bytes, HEADER_BYTES))
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: cannot read the index: %s",
                             path, errno ? strerror(errno) : "end of file");
    if (XXH3_64bits(b->meta, (size_t)b->meta_bytes) != get_u64(h + H_META_SUM))
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: corrupt index (checksum)",
                             path);
    char why[96];
    if (check_entries(b, why, sizeof why))
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: corrupt index (%s)", path,
                             why);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__aot_open(const char *path, cinfer__aot_bundle_t **out) {
    if (!path || !out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__aot_open: path and out must not be NULL");
    *out = NULL;
    cinfer__aot_bundle_t *b = calloc(1, sizeof *b);
    if (!b)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "AOT bundle %s: out of memory", path);
    cinfer__fmt(b->path, sizeof b->path, "%s", path);
    atomic_init(&b->broken, false);
    atomic_flag_clear(&b->broken_warned);
    atomic_flag_clear(&b->arch_logged);
    cinfer_status_t st;
    b->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (b->fd < 0) {
        int err = errno;
        st = cinfer__error(err == ENOENT ? CINFER_STATUS_NOT_FOUND : CINFER_STATUS_IO_ERROR,
                           "AOT bundle %s: %s", path, strerror(err));
        goto out_free;
    }
    struct stat s;
    if (fstat(b->fd, &s) != 0 || !S_ISREG(s.st_mode)) {
        st = cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: not a regular file", path);
        goto out_free;
    }
    st = load_bundle(b, (uint64_t)s.st_size);
    if (st != CINFER_STATUS_SUCCESS)
        goto out_free;
    *out = b;
    return CINFER_STATUS_SUCCESS;

out_free:
    cinfer__aot_close(b);
    return st;
}

void cinfer__aot_close(cinfer__aot_bundle_t *b) {
    if (!b)
        return;
    if (b->fd >= 0)
        close(b->fd);
    free(b->meta);
    free(b);
}

void cinfer__aot_info(const cinfer__aot_bundle_t *b, cinfer__aot_info_t *info) {
    memset(info, 0, sizeof *info);
    info->path = b->path;
    cinfer__fmt(info->library_version, sizeof info->library_version, "%s", b->library_version);
    info->sources_hash = b->sources_hash;
    info->nvrtc_version = b->nvrtc_version;
    cinfer__fmt(info->archs, sizeof info->archs, "%s", b->arch_list);
    info->count = b->count;
    info->bytes = b->file_bytes;
}

void cinfer__aot_entry(const cinfer__aot_bundle_t *b, uint32_t i, cinfer__aot_entry_t *out) {
    const unsigned char *e = entry_at(b, i);
    out->name = string_at(b, get_u64(e + E_NAME_OFFSET));
    out->arch = b->archs[get_u16(e + E_ARCH)];
    out->cubin_bytes = get_u64(e + E_CUBIN_BYTES);
}

bool cinfer__aot_has_arch(const cinfer__aot_bundle_t *b, const char *arch) {
    for (int i = 0; i < b->num_archs; i++)
        if (strcmp(b->archs[i], arch) == 0)
            return true;
    return false;
}

/* The index of the entry whose key text is key, or -1. */
static int64_t find_entry(const cinfer__aot_bundle_t *b, const char *key, size_t key_len) {
    const XXH128_hash_t hash = XXH3_128bits(key, key_len);
    /* The first entry whose hash is not below the key's. */
    uint32_t lo = 0, hi = b->count;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        const unsigned char *e = entry_at(b, mid);
        const uint64_t high = get_u64(e + E_HASH_HIGH), low = get_u64(e + E_HASH_LOW);
        if (high < hash.high64 || (high == hash.high64 && low < hash.low64))
            lo = mid + 1;
        else
            hi = mid;
    }
    /* Equal hashes (a collision) are told apart by the key text. */
    for (uint32_t i = lo; i < b->count; i++) {
        const unsigned char *e = entry_at(b, i);
        if (get_u64(e + E_HASH_HIGH) != hash.high64 || get_u64(e + E_HASH_LOW) != hash.low64)
            break;
        if (get_u32(e + E_KEY_BYTES) == key_len &&
            memcmp(string_at(b, get_u64(e + E_KEY_OFFSET)), key, key_len) == 0)
            return i;
    }
    return -1;
}

/* Reads and checks the cubin of entry i. SUCCESS, OUT_OF_MEMORY, or IO_ERROR (the message says
 * why). */
static cinfer_status_t read_cubin(const cinfer__aot_bundle_t *b, uint32_t i, void **cubin,
                                  size_t *size) {
    const unsigned char *e = entry_at(b, i);
    const uint64_t offset = get_u64(e + E_CUBIN_OFFSET), bytes = get_u64(e + E_CUBIN_BYTES);
    const char *name = string_at(b, get_u64(e + E_NAME_OFFSET));
    if (bytes > SIZE_MAX)
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: %s is too large", b->path,
                             name);
    void *data = malloc((size_t)bytes);
    if (!data)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "AOT bundle %s: out of memory for %s",
                             b->path, name);
    errno = 0;
    if (!cinfer__pread_full(b->fd, data, (size_t)bytes, offset)) {
        free(data);
        return cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: cannot read %s: %s", b->path,
                             name, errno ? strerror(errno) : "the file is shorter than it was");
    }
    if (XXH3_64bits(data, (size_t)bytes) != get_u64(e + E_CUBIN_SUM)) {
        free(data);
        return cinfer__error(CINFER_STATUS_IO_ERROR,
                             "AOT bundle %s: the cubin of %s fails its checksum", b->path, name);
    }
    *cubin = data;
    *size = (size_t)bytes;
    return CINFER_STATUS_SUCCESS;
}

/* Stops using b after a cubin failed to read or check: one warning per bundle. */
static void mark_broken(cinfer__aot_bundle_t *b, const char *why) {
    atomic_store(&b->broken, true);
    if (!atomic_flag_test_and_set(&b->broken_warned))
        cinfer__warn("%s; the bundle is ignored from now on and kernels come from the kernel "
                     "cache or NVRTC",
                     why);
}

cinfer_status_t cinfer__aot_find(cinfer__aot_bundle_t *b, const char *key, size_t key_len,
                                 void **cubin, size_t *size) {
    if (!b || !key || !cubin || !size)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__aot_find: bundle, key, cubin and size must not be NULL");
    *cubin = NULL;
    *size = 0;
    if (atomic_load(&b->broken))
        return cinfer__error(CINFER_STATUS_NOT_FOUND,
                             "AOT bundle %s is not used (a cubin failed its checksum)", b->path);
    const int64_t i = find_entry(b, key, key_len);
    if (i < 0)
        return cinfer__error(CINFER_STATUS_NOT_FOUND, "AOT bundle %s has no entry for this key",
                             b->path);
    cinfer_status_t st = read_cubin(b, (uint32_t)i, cubin, size);
    if (st == CINFER_STATUS_IO_ERROR)
        mark_broken(b, cinfer_last_error());
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * The process's bundle
 * ------------------------------------------------------------------------------------------- */

static pthread_once_t process_once = PTHREAD_ONCE_INIT;
static cinfer__aot_bundle_t *process_bundle;

/*
 * The folder of the loaded libcinfer.so, found through the object holding this function. In a
 * program that links the library statically that object is the program itself, which has no
 * bundle next to it: false.
 */
static bool library_folder(char *dst, size_t cap) {
    Dl_info info;
    if (!dladdr((void *)&library_folder, &info) || !info.dli_fname || !info.dli_fname[0])
        return false;
    char object[PATH_MAX], exe[PATH_MAX];
    if (!realpath(info.dli_fname, object))
        return false;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        if (strcmp(object, exe) == 0)
            return false;
    }
    cinfer__fmt(dst, cap, "%s", dirname(object));
    return true;
}

static void open_process_bundle(void) {
    const cinfer__settings_t *s = cinfer__settings();
    char path[PATH_MAX + 32];
    const bool explicit = s->aot_path[0] != '\0';
    if (explicit) {
        cinfer__fmt(path, sizeof path, "%s", s->aot_path);
    } else {
        char folder[PATH_MAX];
        if (!library_folder(folder, sizeof folder)) {
            cinfer__log(CINFER__LOG_DEBUG, "AOT bundle: none (linked statically and "
                                           "CINFER_AOT_PATH is not set)");
            return;
        }
        cinfer__fmt(path, sizeof path, "%s/" CINFER__AOT_DEFAULT_NAME, folder);
    }
    cinfer_status_t st = cinfer__aot_open(path, &process_bundle);
    if (st == CINFER_STATUS_SUCCESS) {
        cinfer__log(CINFER__LOG_INFO, "AOT bundle %s: %u kernels for %s", path,
                    (unsigned)process_bundle->count, process_bundle->arch_list);
    } else if (st == CINFER_STATUS_NOT_FOUND && !explicit) {
        /* No bundle installed next to the library is a normal installation. */
        cinfer__log(CINFER__LOG_DEBUG, "AOT bundle: none at %s", path);
    } else {
        cinfer__warn("%s%s; it is ignored and kernels come from the kernel cache or NVRTC "
                     "(shown once per process)",
                     explicit ? "CINFER_AOT_PATH: " : "", cinfer_last_error());
    }
}

cinfer__aot_bundle_t *cinfer__aot_process_bundle(void) {
    pthread_once(&process_once, open_process_bundle);
    if (process_bundle && atomic_load(&process_bundle->broken))
        return NULL;
    return process_bundle;
}

void cinfer__aot_reload(void) {
    pthread_once(&process_once, open_process_bundle);
    cinfer__aot_close(process_bundle);
    process_bundle = NULL;
    open_process_bundle();
}

bool cinfer__aot_lookup(const cinfer__spec_t *spec, const char *arch, void **cubin, size_t *size,
                        char *name) {
    cinfer__aot_bundle_t *b = cinfer__aot_process_bundle();
    if (!b || !arch)
        return false;
    if (!cinfer__aot_has_arch(b, arch)) {
        if (!atomic_flag_test_and_set(&b->arch_logged))
            cinfer__log(CINFER__LOG_INFO, "AOT bundle %s has no kernels for %s (it holds %s)",
                        b->path, arch, b->arch_list[0] ? b->arch_list : "none");
        return false;
    }
    cinfer__rendered_t r;
    /* An invalid spec is reported by the caller's own rendering. */
    if (cinfer__spec_render(spec, arch, b->nvrtc_version, &r) != CINFER_STATUS_SUCCESS)
        return false;
    bool hit = false;
    const int64_t i = find_entry(b, r.key.data, r.key.len);
    if (i >= 0) {
        cinfer_status_t st = read_cubin(b, (uint32_t)i, cubin, size);
        hit = st == CINFER_STATUS_SUCCESS;
        if (st == CINFER_STATUS_IO_ERROR)
            mark_broken(b, cinfer_last_error());
    }
    if (hit && name)
        cinfer__fmt(name, 192, "%s", r.name);
    cinfer__rendered_free(&r);
    return hit;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

typedef struct writer_entry {
    XXH128_hash_t hash;
    uint16_t arch;
    char *name, *key;
    size_t key_len;
    void *cubin;
    size_t size;
} writer_entry_t;

struct cinfer__aot_writer {
    cinfer__aot_identity_t id;
    char archs[MAX_ARCHS][ARCH_NAME_CAP];
    int num_archs;
    writer_entry_t *entries;
    size_t count, cap;
};

void cinfer__aot_identity_current(cinfer__aot_identity_t *id) {
    memset(id, 0, sizeof *id);
    current_identity(id->library_version, sizeof id->library_version, &id->sources_hash);
    id->nvrtc_version = cinfer__jit_nvrtc_version();
}

cinfer_status_t cinfer__aot_writer_create(const cinfer__aot_identity_t *id,
                                          cinfer__aot_writer_t **out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__aot_writer_create: out is NULL");
    *out = NULL;
    cinfer__aot_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "AOT bundle writer: out of memory");
    if (id)
        w->id = *id;
    else
        cinfer__aot_identity_current(&w->id);
    w->id.library_version[VERSION_BYTES - 1] = '\0';
    *out = w;
    return CINFER_STATUS_SUCCESS;
}

/* The value of the key's "arch" line, which the renderer writes as "\narch <arch>\n". */
static bool key_names_arch(const char *key, const char *arch) {
    const char *line = strstr(key, "\narch ");
    if (!line)
        return false;
    line += 6;
    const size_t n = strlen(arch);
    return strncmp(line, arch, n) == 0 && line[n] == '\n';
}

static int arch_index(cinfer__aot_writer_t *w, const char *arch) {
    for (int i = 0; i < w->num_archs; i++)
        if (strcmp(w->archs[i], arch) == 0)
            return i;
    /* Every arch and a comma must fit the header's list, with its NUL. */
    size_t used = 0;
    for (int i = 0; i < w->num_archs; i++)
        used += strlen(w->archs[i]) + 1;
    if (w->num_archs == MAX_ARCHS || used + strlen(arch) + 1 > ARCH_LIST_BYTES)
        return -1;
    cinfer__fmt(w->archs[w->num_archs], ARCH_NAME_CAP, "%s", arch);
    return w->num_archs++;
}

cinfer_status_t cinfer__aot_writer_add(cinfer__aot_writer_t *w, const char *arch, const char *name,
                                       const char *key, const void *cubin, size_t size) {
    if (!w || !arch || !name || !key || !cubin || size == 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__aot_writer_add: every argument must be set and size > 0");
    if (!arch[0] || strlen(arch) >= ARCH_NAME_CAP || strchr(arch, ','))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "AOT bundle: \"%s\" is not an arch name", arch);
    if (!name[0] || strlen(name) > UINT16_MAX)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "AOT bundle: kernel name of %zu bytes",
                             strlen(name));
    const size_t key_len = strlen(key);
    if (key_len > UINT32_MAX || !key_names_arch(key, arch))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "AOT bundle: the key of %s is not a rendered key for %s", name, arch);
    const XXH128_hash_t hash = XXH3_128bits(key, key_len);
    for (size_t i = 0; i < w->count; i++)
        if (XXH128_isEqual(w->entries[i].hash, hash) && w->entries[i].key_len == key_len &&
            memcmp(w->entries[i].key, key, key_len) == 0)
            return CINFER_STATUS_SUCCESS;
    const int a = arch_index(w, arch);
    if (a < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "AOT bundle: more archs than the header holds (at most %d, %d "
                             "characters in all)",
                             MAX_ARCHS, ARCH_LIST_BYTES - 1);
    if (w->count == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        writer_entry_t *grown = realloc(w->entries, cap * sizeof *grown);
        if (!grown)
            return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "AOT bundle writer: out of memory");
        w->entries = grown;
        w->cap = cap;
    }
    writer_entry_t e = {hash, (uint16_t)a, strdup(name), strdup(key), key_len, malloc(size), size};
    if (!e.name || !e.key || !e.cubin) {
        free(e.name);
        free(e.key);
        free(e.cubin);
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "AOT bundle writer: out of memory");
    }
    memcpy(e.cubin, cubin, size);
    w->entries[w->count++] = e;
    return CINFER_STATUS_SUCCESS;
}

static int compare_entries(const void *pa, const void *pb) {
    const writer_entry_t *a = pa, *b = pb;
    if (a->hash.high64 != b->hash.high64)
        return a->hash.high64 < b->hash.high64 ? -1 : 1;
    if (a->hash.low64 != b->hash.low64)
        return a->hash.low64 < b->hash.low64 ? -1 : 1;
    /* Equal hashes (a collision) keep a fixed order, so the same input gives the same file. */
    return strcmp(a->key, b->key);
}

static uint64_t align_up(uint64_t v) {
    return (v + CUBIN_ALIGN - 1) / CUBIN_ALIGN * CUBIN_ALIGN;
}

/* Header, index and string table of the sorted entries, with both checksums; *file_bytes
 * receives the size of the whole file. */
static unsigned char *build_meta(const cinfer__aot_writer_t *w, uint64_t *meta_bytes,
                                 uint64_t *file_bytes) {
    uint64_t strings = 0;
    for (size_t i = 0; i < w->count; i++)
        strings += w->entries[i].key_len + 1 + strlen(w->entries[i].name) + 1;
    const uint64_t index = (uint64_t)w->count * ENTRY_BYTES;
    *meta_bytes = HEADER_BYTES + index + strings;
    uint64_t end = *meta_bytes;
    for (size_t i = 0; i < w->count; i++)
        end = align_up(end) + w->entries[i].size;
    *file_bytes = end;
    unsigned char *m = calloc(1, (size_t)*meta_bytes);
    if (!m)
        return NULL;

    uint64_t text = HEADER_BYTES + index, cubin = *meta_bytes;
    for (size_t i = 0; i < w->count; i++) {
        const writer_entry_t *e = &w->entries[i];
        unsigned char *p = m + HEADER_BYTES + i * ENTRY_BYTES;
        const size_t name_len = strlen(e->name);
        put_u64(p + E_HASH_HIGH, e->hash.high64);
        put_u64(p + E_HASH_LOW, e->hash.low64);
        put_u64(p + E_KEY_OFFSET, text);
        put_u32(p + E_KEY_BYTES, (uint32_t)e->key_len);
        memcpy(m + text, e->key, e->key_len + 1);
        text += e->key_len + 1;
        put_u16(p + E_NAME_BYTES, (uint16_t)name_len);
        put_u16(p + E_ARCH, e->arch);
        put_u64(p + E_NAME_OFFSET, text);
        memcpy(m + text, e->name, name_len + 1);
        text += name_len + 1;
        cubin = align_up(cubin);
        put_u64(p + E_CUBIN_OFFSET, cubin);
        put_u64(p + E_CUBIN_BYTES, e->size);
        put_u64(p + E_CUBIN_SUM, XXH3_64bits(e->cubin, e->size));
        cubin += e->size;
    }

    memcpy(m, CINFER__AOT_MAGIC, MAGIC_BYTES);
    put_u32(m + H_FORMAT, CINFER__AOT_FORMAT_VERSION);
    put_u32(m + H_COUNT, (uint32_t)w->count);
    put_u64(m + H_FILE_BYTES, *file_bytes);
    put_u64(m + H_STRING_BYTES, strings);
    put_u64(m + H_SOURCES, w->id.sources_hash);
    put_u32(m + H_NVRTC, (uint32_t)w->id.nvrtc_version);
    memcpy(m + H_LIBRARY, w->id.library_version, strlen(w->id.library_version));
    char list[ARCH_LIST_BYTES] = "";
    for (int i = 0; i < w->num_archs; i++) {
        size_t n = strlen(list);
        cinfer__fmt(list + n, sizeof list - n, "%s%s", i ? "," : "", w->archs[i]);
    }
    memcpy(m + H_ARCHS, list, strlen(list));
    put_u64(m + H_META_SUM, XXH3_64bits(m + HEADER_BYTES, (size_t)(*meta_bytes - HEADER_BYTES)));
    put_u64(m + H_HEADER_SUM, XXH3_64bits(m, HEADER_SUM_BYTES));
    return m;
}

/* Writes the file through fd: metadata, then each cubin at its aligned offset. 0 or errno. */
static int write_bundle(int fd, const cinfer__aot_writer_t *w, const unsigned char *meta,
                        uint64_t meta_bytes) {
    static const unsigned char zeros[CUBIN_ALIGN];
    if (!cinfer__write_full(fd, meta, (size_t)meta_bytes))
        return errno;
    uint64_t at = meta_bytes;
    for (size_t i = 0; i < w->count; i++) {
        const uint64_t pad = align_up(at) - at;
        if (!cinfer__write_full(fd, zeros, (size_t)pad) ||
            !cinfer__write_full(fd, w->entries[i].cubin, w->entries[i].size))
            return errno;
        at += pad + w->entries[i].size;
    }
    /* The bundle is a release artifact: it must be on disk before it is renamed into place. */
    return fsync(fd) == 0 ? 0 : errno;
}

cinfer_status_t cinfer__aot_writer_finish(cinfer__aot_writer_t *w, const char *path,
                                          uint64_t *bytes) {
    if (!w || !path || !path[0])
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__aot_writer_finish: writer and path must be set");
    if (bytes)
        *bytes = 0;
    if (w->count > UINT32_MAX)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "AOT bundle: too many kernels");
    qsort(w->entries, w->count, sizeof *w->entries, compare_entries);
    uint64_t meta_bytes, file_bytes;
    unsigned char *meta = build_meta(w, &meta_bytes, &file_bytes);
    if (!meta)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "AOT bundle %s: out of memory", path);

    /* The temporary file lives in the target's folder so the rename cannot cross file systems. */
    char folder[PATH_MAX], base[PATH_MAX], temp[PATH_MAX];
    cinfer__fmt(folder, sizeof folder, "%s", path);
    cinfer__fmt(base, sizeof base, "%s", path);
    int n = snprintf(temp, sizeof temp, "%s/.tmp-%.64s-XXXXXX", dirname(folder), basename(base));
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    if (n < 0 || (size_t)n >= sizeof temp) {
        st = cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: path too long", path);
        goto out_free_meta;
    }
    int fd = mkostemp(temp, O_CLOEXEC);
    if (fd < 0) {
        st = cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: cannot create %s: %s", path,
                           temp, strerror(errno));
        goto out_free_meta;
    }
    int err = write_bundle(fd, w, meta, meta_bytes);
    /* mkostemp creates the file 0600; a bundle is read by every user of the library. */
    if (!err && fchmod(fd, 0644) != 0)
        err = errno;
    if (close(fd) != 0 && !err)
        err = errno;
    if (!err && rename(temp, path) != 0)
        err = errno;
    if (err) {
        unlink(temp);
        st = cinfer__error(CINFER_STATUS_IO_ERROR, "AOT bundle %s: cannot write: %s", path,
                           strerror(err));
        goto out_free_meta;
    }
    if (bytes)
        *bytes = file_bytes;
out_free_meta:
    free(meta);
    return st;
}

void cinfer__aot_writer_destroy(cinfer__aot_writer_t *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->count; i++) {
        free(w->entries[i].name);
        free(w->entries[i].key);
        free(w->entries[i].cubin);
    }
    free(w->entries);
    free(w);
}
