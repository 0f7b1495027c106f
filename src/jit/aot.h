/*
 * The AOT kernel bundle: the cubins of a listed set of specs, compiled ahead of time by
 * `cinfer aot` through the JIT path (same renderer, same cache keys) and shipped in one file next
 * to the library. Lookup order for a spec: module table -> AOT bundle -> disk cache -> NVRTC.
 *
 * File layout (little endian; offsets are from the start of the file):
 *
 *   header, 192 bytes:
 *     0   magic "CINFERAB" (8)
 *     8   format version u32 (CINFER__AOT_FORMAT_VERSION)
 *     12  entry count u32
 *     16  file bytes u64: the whole file; a shorter file is truncated
 *     24  string bytes u64: the key and name texts that follow the index
 *     32  kernel-sources hash u64 (cinfer__kernel_sources_hash of the library that wrote it)
 *     40  NVRTC version u32 that every key was rendered with (major * 1000 + minor * 10)
 *     44  reserved u32 (0)
 *     48  library version text (16, NUL-padded, at most 15 characters), e.g. "0.1.0"
 *     64  arch list text (112, NUL-padded), comma-separated, e.g. "sm_80,sm_90a" (at most 16)
 *     176 metadata checksum u64: XXH3-64 of the index and the string table
 *     184 header checksum u64: XXH3-64 of bytes [0, 184)
 *   index: entry count x 64 bytes, sorted by key hash (high, then low):
 *     0   key hash high u64 \  XXH3-128 of the key text, the hash the kernel cache's file
 *     8   key hash low u64   /  names carry (cinfer__rendered_t.key_hash)
 *     16  key offset u64 (NUL-terminated text in the string table)
 *     24  key bytes u32 (without the NUL)
 *     28  name bytes u16 (without the NUL)
 *     30  arch index u16 (position in the header's arch list)
 *     32  name offset u64 (NUL-terminated kernel name in the string table)
 *     40  cubin offset u64 (64-byte aligned)
 *     48  cubin bytes u64
 *     56  cubin checksum u64 (XXH3-64 of the cubin)
 *   string table: key text NUL, name NUL, for each entry in index order;
 *   cubins, each starting on a 64-byte boundary.
 *
 * Trust: opening checks the magic, the format version, the header checksum, the library identity
 * (version text and kernel-sources hash), the file size, the metadata checksum and the bounds of
 * every entry, and keeps the index in memory. Cubins are read from the open file when used and
 * checked against their checksum on every read, so a bundle that is overwritten in place while a
 * process runs is detected instead of served (and nothing is mapped that could fault). A lookup
 * finds the entry by the hash of the full key text, then compares the key text byte for byte.
 *
 * A bundle that cannot be used (missing file named by CINFER_AOT_PATH, another format or library
 * version, truncated or corrupt, a cubin failing its checksum) is never an error: one warning per
 * process, and kernels come from the disk cache or NVRTC as if there were no bundle. A bundle
 * without the arch asked for simply has no entry for it (an info line, not a warning).
 *
 * Keys are rendered with the NVRTC version recorded in the bundle, not the one installed at run
 * time: a cubin does not depend on the NVRTC that loads next to it, and a machine with another
 * NVRTC, or none at all, must still be served by the bundle. Everything else in the key (library
 * version, kernel sources, prelude, arch, options) must match exactly.
 */
#ifndef CINFER_JIT_AOT_H
#define CINFER_JIT_AOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jit/spec.h"

#define CINFER__AOT_MAGIC          "CINFERAB"
#define CINFER__AOT_FORMAT_VERSION 1u
/* The file the library looks for in the folder of libcinfer.so when CINFER_AOT_PATH is unset. */
#define CINFER__AOT_DEFAULT_NAME "libcinfer.aot"

/* ---- reading ---- */

typedef struct cinfer__aot_bundle cinfer__aot_bundle_t;

/*
 * Opens and checks the bundle at path (the header, index and key texts are read; cubins are read
 * when used). SUCCESS; NOT_FOUND (no such file); IO_ERROR (unreadable, truncated or corrupt);
 * UNSUPPORTED (another format or library version); OUT_OF_MEMORY. The message names the file and
 * the reason; the caller decides whether that deserves a warning.
 */
cinfer_status_t cinfer__aot_open(const char *path, cinfer__aot_bundle_t **out);
/* Closes the file and frees the bundle; NULL is a no-op. */
void cinfer__aot_close(cinfer__aot_bundle_t *bundle);

/* What the header says. */
typedef struct cinfer__aot_info {
    const char *path;
    char library_version[17];
    unsigned long long sources_hash;
    int nvrtc_version;
    char archs[113]; /* comma-separated */
    uint32_t count;
    uint64_t bytes; /* file size */
} cinfer__aot_info_t;

void cinfer__aot_info(const cinfer__aot_bundle_t *bundle, cinfer__aot_info_t *info);

/* One index entry, for listings. The strings belong to the bundle. */
typedef struct cinfer__aot_entry {
    const char *name; /* the kernel name */
    const char *arch;
    uint64_t cubin_bytes;
} cinfer__aot_entry_t;

/* Entry i (< info.count) in index order. */
void cinfer__aot_entry(const cinfer__aot_bundle_t *bundle, uint32_t i, cinfer__aot_entry_t *out);

/* Whether the header's arch list names arch. */
bool cinfer__aot_has_arch(const cinfer__aot_bundle_t *bundle, const char *arch);

/*
 * The cubin stored under exactly this key text (what cinfer__spec_render produced with the
 * bundle's NVRTC version): a malloc'ed copy in *cubin (caller frees). NOT_FOUND when there is no
 * such entry; IO_ERROR when the entry's cubin cannot be read or fails its checksum (one warning;
 * the bundle is then no longer used and later lookups miss); OUT_OF_MEMORY. Thread-safe.
 */
cinfer_status_t cinfer__aot_find(cinfer__aot_bundle_t *bundle, const char *key, size_t key_len,
                                 void **cubin, size_t *size);

/*
 * The process's bundle lookup, as cinfer__jit_cubin uses it: the bundle (CINFER_AOT_PATH, else
 * libcinfer.aot next to the loaded libcinfer.so; none for a program linked statically) is opened
 * once per process on first use (pthread_once), with one warning if it exists but cannot be used.
 * Renders spec for arch with the bundle's NVRTC version and returns true with a malloc'ed copy of
 * its cubin and its kernel name (cap >= 192, may be NULL) on a hit; false on any miss (an invalid
 * spec included: the caller's own rendering reports it). Thread-safe.
 */
bool cinfer__aot_lookup(const cinfer__spec_t *spec, const char *arch, void **cubin, size_t *size,
                        char *name);

/* The process's bundle (opening it if needed), or NULL when there is none or it is unusable. */
cinfer__aot_bundle_t *cinfer__aot_process_bundle(void);

/* Closes the process's bundle and opens it again from the current settings (call
 * cinfer__settings_reload first). For tests; not thread-safe. */
void cinfer__aot_reload(void);

/* ---- writing ---- */

/* Who a bundle is for. cinfer__aot_identity_current fills this library's. */
typedef struct cinfer__aot_identity {
    char library_version[16]; /* at most 15 characters are stored */
    unsigned long long sources_hash;
    int nvrtc_version; /* the NVRTC version every added key was rendered with */
} cinfer__aot_identity_t;

/* This library's version and kernel sources, and the loaded NVRTC's version (0 if none). */
void cinfer__aot_identity_current(cinfer__aot_identity_t *id);

typedef struct cinfer__aot_writer cinfer__aot_writer_t;

/* A writer for a bundle with identity id (NULL: cinfer__aot_identity_current). */
cinfer_status_t cinfer__aot_writer_create(const cinfer__aot_identity_t *id,
                                          cinfer__aot_writer_t **out);

/*
 * Adds one kernel: its arch, readable name, full key text (cinfer__rendered_t.key, rendered with
 * the writer's NVRTC version) and cubin (copied). A key added twice is kept once. INVALID_ARGUMENT
 * for a bad arch or name, more archs than the header holds, or a key whose "arch" line does not
 * name arch; OUT_OF_MEMORY.
 */
cinfer_status_t cinfer__aot_writer_add(cinfer__aot_writer_t *w, const char *arch, const char *name,
                                       const char *key, const void *cubin, size_t size);

/* Writes the bundle to path through a temporary file in the same folder, renamed into place;
 * *bytes (may be NULL) receives the file size. IO_ERROR naming the path on failure. */
cinfer_status_t cinfer__aot_writer_finish(cinfer__aot_writer_t *w, const char *path,
                                          uint64_t *bytes);

/* NULL is a no-op. */
void cinfer__aot_writer_destroy(cinfer__aot_writer_t *w);

/* ---- the sets of specs built ahead of time (aot_set.c) ---- */

/* "default, ci": the names of the sets, for messages. */
const char *cinfer__aot_set_names(void);

/*
 * The distinct specs of set `name` ("default": the serving shapes of Llama, Qwen, Mistral and
 * Gemma; "ci": a handful that prove the path quickly) for arch, derived from attention options
 * through the functions the operations themselves use to pick their kernels. *specs is
 * malloc'ed (caller frees). INVALID_ARGUMENT naming the known sets for an unknown name.
 */
cinfer_status_t cinfer__aot_set_specs(const char *name, const char *arch, cinfer__spec_t **specs,
                                      size_t *count);

#endif
