/*
 * `cinfer cache ls` and `cinfer cache clear`: the on-disk kernel cache of jit/cache.h, seen from
 * the command line.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "jit/cache.h"

/* One listed entry with the arch read from its key. */
typedef struct listed {
    cinfer__cache_entry_t entry;
    char arch[24];
} listed_t;

typedef struct listing {
    const char *dir;
    listed_t *items;
    size_t count, cap;
    bool out_of_memory;
} listing_t;

/*
 * The arch an entry was compiled for, from the "arch sm_XY" line of its key text. The file name
 * carries only the kernel name and a hash, so two archs of one kernel look alike without it. The
 * layout read here is the one cache.h documents (a 32-byte header whose bytes 12..15 hold the key
 * length, then the key); "?" when the entry cannot be read.
 */
static void read_arch(const char *dir, const char *file, char *dst, size_t cap) {
    cinfer__fmt(dst, cap, "?");
    char path[4096 + 512];
    cinfer__fmt(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    /* The arch line comes early in the key; the key's start is plenty. */
    unsigned char buf[32 + 1024];
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got < 32)
        return;
    uint32_t key_len = (uint32_t)buf[12] | (uint32_t)buf[13] << 8 | (uint32_t)buf[14] << 16 |
                       (uint32_t)buf[15] << 24;
    size_t avail = (size_t)got - 32;
    size_t n = key_len < avail ? key_len : avail;
    char *key = (char *)buf + 32;
    key[n] = '\0';
    const char *line = strstr(key, "\narch ");
    if (!line)
        return;
    line += strlen("\narch ");
    size_t len = strcspn(line, "\n");
    if (len == 0 || len >= cap)
        return;
    memcpy(dst, line, len);
    dst[len] = '\0';
}

static void collect(void *arg, const cinfer__cache_entry_t *entry) {
    listing_t *l = arg;
    if (l->out_of_memory)
        return;
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        listed_t *grown = realloc(l->items, cap * sizeof *grown);
        if (!grown) {
            l->out_of_memory = true;
            return;
        }
        l->items = grown;
        l->cap = cap;
    }
    listed_t *item = &l->items[l->count++];
    item->entry = *entry;
    if (entry->valid_header)
        read_arch(l->dir, entry->file, item->arch, sizeof item->arch);
    else
        cinfer__fmt(item->arch, sizeof item->arch, "?");
}

/* By kernel name, then arch, then file name, so the listing is stable. */
static int compare_listed(const void *pa, const void *pb) {
    const listed_t *a = pa, *b = pb;
    int c = strcmp(a->entry.name, b->entry.name);
    if (c == 0)
        c = strcmp(a->arch, b->arch);
    if (c == 0)
        c = strcmp(a->entry.file, b->entry.file);
    return c;
}

/* "42 s", "5 min", "3 h", "12 d". */
static void age_text(double seconds, char *dst, size_t cap) {
    if (seconds < 0)
        seconds = 0;
    if (seconds < 120)
        cinfer__fmt(dst, cap, "%.0f s", seconds);
    else if (seconds < 2 * 3600)
        cinfer__fmt(dst, cap, "%.0f min", seconds / 60);
    else if (seconds < 2 * 86400)
        cinfer__fmt(dst, cap, "%.0f h", seconds / 3600);
    else
        cinfer__fmt(dst, cap, "%.0f d", seconds / 86400);
}

/* The folder, or an error when none could be derived from the environment. */
static cinfer_status_t cache_folder(const char **dir) {
    *dir = cinfer_cache_dir();
    if (!(*dir)[0])
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "no kernel cache folder: CINFER_CACHE_DIR, XDG_CACHE_HOME and HOME "
                             "are all unset");
    return CINFER_STATUS_SUCCESS;
}

/*
 * A note on stderr when the folder does not exist. The library treats a missing folder as an
 * empty cache and creates it at the first compile, so it is no error (the exit status stays 0),
 * but a mistyped CINFER_CACHE_DIR must not look like an empty cache in the right place.
 */
static void note_if_missing(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT)
        fprintf(stderr,
                "cinfer: note: the kernel cache folder %s does not exist (taken as an empty cache; "
                "the first compile creates it)\n",
                dir);
}

static int cache_ls(void) {
    listing_t l;
    memset(&l, 0, sizeof l);
    if (cache_folder(&l.dir) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    note_if_missing(l.dir);
    if (cinfer__cache_list(l.dir, collect, &l) != CINFER_STATUS_SUCCESS) {
        free(l.items);
        return cli_fail();
    }
    if (l.out_of_memory) {
        free(l.items);
        cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "listing %s: out of memory", l.dir);
        return cli_fail();
    }
    if (l.count > 0) /* qsort takes no NULL array, even of no elements */
        qsort(l.items, l.count, sizeof *l.items, compare_listed);

    int name_width = 6, arch_width = 4;
    for (size_t i = 0; i < l.count; i++) {
        int n = (int)strlen(l.items[i].entry.name), a = (int)strlen(l.items[i].arch);
        name_width = n > name_width ? n : name_width;
        arch_width = a > arch_width ? a : arch_width;
    }
    time_t now = time(NULL);
    uint64_t total = 0;
    unsigned corrupt = 0;
    /* KEY: the first hex digits of the entry's key hash (its file name's suffix), which tell apart
     * entries of one kernel name (other library versions, NVRTC versions, variant sources). */
    if (l.count)
        printf("%-*s  %-8s  %-*s  %10s  %-19s  %s\n", name_width, "KERNEL", "KEY", arch_width,
               "ARCH", "SIZE", "MODIFIED", "AGE");
    for (size_t i = 0; i < l.count; i++) {
        const cinfer__cache_entry_t *e = &l.items[i].entry;
        char size[32], modified[32] = "?", age[32];
        cli_format_bytes(e->bytes, size, sizeof size);
        time_t mtime = (time_t)e->mtime;
        struct tm tm;
        if (localtime_r(&mtime, &tm))
            strftime(modified, sizeof modified, "%Y-%m-%d %H:%M:%S", &tm);
        age_text(difftime(now, mtime), age, sizeof age);
        const char *dash = strrchr(e->file, '-');
        char key[9] = "?";
        if (dash)
            cinfer__fmt(key, sizeof key, "%.8s", dash + 1);
        printf("%-*s  %-8s  %-*s  %10s  %-19s  %s%s\n", name_width, e->name, key, arch_width,
               l.items[i].arch, size, modified, age, e->valid_header ? "" : "  corrupt");
        total += e->bytes;
        corrupt += !e->valid_header;
    }
    char total_text[32];
    cli_format_bytes(total, total_text, sizeof total_text);
    printf("total: %zu %s, %s in %s", l.count, l.count == 1 ? "entry" : "entries", total_text,
           l.dir);
    if (corrupt)
        printf(" (%u corrupt: they are deleted when next read, or by `cinfer cache clear`)",
               corrupt);
    printf("\n");
    free(l.items);
    return CLI_EXIT_OK;
}

static int cache_clear(void) {
    const char *dir;
    if (cache_folder(&dir) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    note_if_missing(dir);
    /* Entries are counted first: the clear also removes lock and temporary files, and the
     * number a user cares about is the kernels that will have to be compiled again. */
    uint64_t entries = 0, bytes = 0;
    if (cinfer__cache_usage(dir, &entries, &bytes) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    unsigned removed = 0;
    if (cinfer__cache_clear(dir, &removed) != CINFER_STATUS_SUCCESS) {
        printf("removed %u files from %s before the error\n", removed, dir);
        return cli_fail();
    }
    char size[32];
    cli_format_bytes(bytes, size, sizeof size);
    printf("removed %llu %s (%s, %u files) from %s\n", (unsigned long long)entries,
           entries == 1 ? "entry" : "entries", size, removed, dir);
    return CLI_EXIT_OK;
}

int cli_cache(int argc, char **argv) {
    if (argc < 2)
        return cli_usage_error("cache", "cache needs a subcommand: ls or clear");
    const char *sub = argv[1];
    if (cli_is_help(sub))
        return cli_print_help("cache");
    if (strcmp(sub, "ls") != 0 && strcmp(sub, "clear") != 0)
        return cli_usage_error("cache", "unknown cache subcommand \"%s\"", sub);
    for (int i = 2; i < argc; i++) {
        if (cli_is_help(argv[i]))
            return cli_print_help("cache");
        return cli_usage_error("cache", "unexpected argument \"%s\"", argv[i]);
    }
    return strcmp(sub, "ls") == 0 ? cache_ls() : cache_clear();
}
