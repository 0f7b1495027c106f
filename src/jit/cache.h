/*
 * The on-disk kernel cache: one file per cache key holding a header and the cubin.
 *
 * File layout (little endian):
 *   magic "CINFERKC" (8 bytes) | format version u32 | key length u32 | payload size u64 |
 *   payload checksum u64 (XXH3-64 of the payload) | key text (key length bytes) | payload.
 * A file is valid only if every header field matches, the stored key text equals the key asked for
 * byte for byte (the file name carries only a hash of it), and the checksum matches.
 *
 * Writes go to a temporary file in the same folder, which is then renamed into place, so readers
 * never see a partial entry. A per-key lock file (`<entry>.lock`, flock) makes N processes or
 * threads that miss the same key compile it once: the first compiles while the others wait, then
 * find the entry. flock locks are released by the OS when a process dies, so a killed compiler
 * never leaves a blocking lock. A corrupt or truncated entry is deleted and treated as a miss.
 * Trouble with the folder itself (missing and not creatable, read-only, full disk) is never fatal:
 * one warning per process, and the caller's compile result is used from memory.
 */
#ifndef CINFER_JIT_CACHE_H
#define CINFER_JIT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

#define CINFER__CACHE_MAGIC          "CINFERKC"
#define CINFER__CACHE_FORMAT_VERSION 1u

/* Produces the payload for a miss (NVRTC compile in the library, a fake in tests). On success
 * *payload is malloc'ed and owned by the caller of cinfer__cache_get_or_compile. */
typedef cinfer_status_t (*cinfer__cache_compile_fn)(void *arg, void **payload, size_t *size);

typedef enum cinfer__cache_outcome {
    CINFER__CACHE_HIT,      /* read from a valid entry */
    CINFER__CACHE_COMPILED, /* compiled by this call (and written, unless the folder failed) */
} cinfer__cache_outcome_t;

/*
 * Returns the payload stored under `key` in folder `dir`, or compiles it with `compile` under the
 * per-key lock and stores it. `file_stem` is the entry's file name without extension: readable
 * kernel name + "-" + key hash (for example "merge_states_bf16_hd128-3f2a...") and must be a
 * plain file name. `dir` may be "" or NULL: no disk cache, just compile.
 *
 * On success *payload (malloc'ed, caller frees) and *size are set and *outcome says where it came
 * from. Errors: only those of `compile` (cache trouble is a warning, not an error).
 * Thread-safe and multi-process-safe.
 */
cinfer_status_t cinfer__cache_get_or_compile(const char *dir, const char *file_stem,
                                             const char *key, cinfer__cache_compile_fn compile,
                                             void *arg, void **payload, size_t *size,
                                             cinfer__cache_outcome_t *outcome);

/* Reads a valid entry without compiling: SUCCESS, or NOT_FOUND (missing or corrupt; a corrupt
 * entry is deleted). */
cinfer_status_t cinfer__cache_read(const char *dir, const char *file_stem, const char *key,
                                   void **payload, size_t *size);

/* One entry of a listing. */
typedef struct cinfer__cache_entry {
    char file[512];    /* file name inside the folder */
    char name[256];    /* kernel name part of the file name */
    uint64_t bytes;    /* file size */
    double mtime;      /* seconds since the epoch */
    bool valid_header; /* magic and format version readable and current */
} cinfer__cache_entry_t;

/* Calls visit for every entry file (*.cubin) in dir; returns SUCCESS (a missing folder lists
 * nothing) or IO_ERROR if the folder exists but cannot be read. */
cinfer_status_t cinfer__cache_list(const char *dir,
                                   void (*visit)(void *arg, const cinfer__cache_entry_t *entry),
                                   void *arg);

/* Deletes every entry, lock and temporary file of the cache in dir (only files this cache
 * writes: *.cubin, *.lock, .tmp-*); *removed receives the count. IO_ERROR if some could not be
 * removed. */
cinfer_status_t cinfer__cache_clear(const char *dir, unsigned *removed);

/* How many compiled payloads this process could not store because of cache trouble. */
uint64_t cinfer__cache_write_failures(void);

/* Counts for `cinfer info`: number of entries and their total bytes. */
cinfer_status_t cinfer__cache_usage(const char *dir, uint64_t *entries, uint64_t *bytes);

#endif
