/*
 * Tests of the AOT kernel bundle (src/jit/aot.c) and its sets (src/jit/aot_set.c), without a GPU.
 *
 * The group setup builds the "ci" set's bundle for sm_80 and sm_90a the way `cinfer aot` does
 * (render, cinfer__jit_cubin_rendered with real NVRTC compiles, write) and keeps the cubins; the
 * scenarios then point CINFER_AOT_PATH at that bundle or at damaged copies of it, reload the
 * settings and the process's bundle, and look kernels up through cinfer__jit_cubin with
 * CINFER_JIT=off and an empty kernel cache, so a success can only come from the bundle.
 * Warnings are counted by capturing this process's stderr around each reload and lookup.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jit/aot.h"
#include "jit/jit.h"
#include "ops/append.h"
#include "ops/decode.h"
#include "ops/prefill.h"

/* One kernel of the set, compiled for one arch. */
typedef struct kernel {
    cinfer__spec_t spec;
    char arch[16];
    char name[192];
    char *key;
    void *cubin;
    size_t size;
} kernel_t;

static const char *const archs[] = {"sm_80", "sm_90a"};
#define NUM_ARCHS 2

static struct {
    char root[64];         /* mkdtemp folder holding everything below */
    char build[PATH_MAX];  /* kernel cache the bundle is built from */
    char empty[PATH_MAX];  /* kernel cache of the lookups: must stay empty */
    char bundle[PATH_MAX]; /* the ci set's bundle for both archs */
    char path[PATH_MAX];   /* scratch bundle of each scenario */
    char self[PATH_MAX];   /* this executable, for the child process */
    kernel_t *kernels;
    size_t num_kernels;
    int nvrtc_version;
} g;

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* Sets the environment of the lookups and rereads it: settings, then the process's bundle. */
static void use(const char *aot_path, bool jit) {
    setenv("CINFER_CACHE_DIR", g.empty, 1);
    if (aot_path)
        setenv("CINFER_AOT_PATH", aot_path, 1);
    else
        unsetenv("CINFER_AOT_PATH");
    if (jit)
        unsetenv("CINFER_JIT");
    else
        setenv("CINFER_JIT", "off", 1);
    unsetenv("CINFER_LOG");
    cinfer__settings_reload();
    cinfer__aot_reload();
}

/* Captures what this process writes to stderr between begin and end. */
static struct {
    int saved;
    char file[PATH_MAX];
    char text[8192];
} capture;

static void capture_begin(void) {
    fflush(stderr);
    snprintf(capture.file, sizeof capture.file, "%s/stderr", g.root);
    int fd = open(capture.file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    capture.saved = dup(2);
    assert_true(capture.saved >= 0);
    assert_true(dup2(fd, 2) >= 0);
    close(fd);
}

/* Ends the capture; returns the number of warning lines, the text is in capture.text. */
static int capture_end(void) {
    fflush(stderr);
    assert_true(dup2(capture.saved, 2) >= 0);
    close(capture.saved);
    FILE *f = fopen(capture.file, "rb");
    assert_non_null(f);
    size_t n = fread(capture.text, 1, sizeof capture.text - 1, f);
    fclose(f);
    capture.text[n] = '\0';
    /* Show it again, so a failing test's log explains itself. */
    fputs(capture.text, stderr);
    int warnings = 0;
    for (const char *p = capture.text; (p = strstr(p, "cinfer: warning: ")); p++)
        warnings++;
    return warnings;
}

/* use() with the warnings of the reload counted. */
static int use_counting_warnings(const char *aot_path) {
    capture_begin();
    use(aot_path, false);
    return capture_end();
}

static cinfer_status_t lookup(const kernel_t *k, const char *arch, cinfer__jit_source_t *from,
                              void **cubin, size_t *size) {
    char name[192];
    *cubin = NULL;
    *size = 0;
    cinfer_status_t st = cinfer__jit_cubin(&k->spec, arch, cubin, size, from, name);
    if (st == CINFER_STATUS_SUCCESS)
        assert_string_equal(name, k->name);
    return st;
}

/* Every kernel of the set misses: NOT_FOUND naming it (CINFER_JIT=off). */
static void assert_all_miss(void) {
    for (size_t i = 0; i < g.num_kernels; i++) {
        cinfer__jit_source_t from;
        void *cubin;
        size_t size;
        assert_int_equal(lookup(&g.kernels[i], g.kernels[i].arch, &from, &cubin, &size),
                         CINFER_STATUS_NOT_FOUND);
        assert_non_null(strstr(cinfer_last_error(), g.kernels[i].name));
        assert_null(cubin);
    }
}

static uint64_t aot_hits(void) {
    cinfer_jit_stats_t s = CINFER_JIT_STATS_INIT;
    assert_int_equal(cinfer_jit_get_stats(&s), CINFER_STATUS_SUCCESS);
    return s.aot_hits;
}

/* Writes the kernels whose arch passes `arch` (NULL: all) to path with identity id. */
static void write_bundle(const char *path, const cinfer__aot_identity_t *id, const char *arch) {
    cinfer__aot_writer_t *w;
    assert_int_equal(cinfer__aot_writer_create(id, &w), CINFER_STATUS_SUCCESS);
    for (size_t i = 0; i < g.num_kernels; i++) {
        const kernel_t *k = &g.kernels[i];
        if (arch && strcmp(arch, k->arch) != 0)
            continue;
        assert_int_equal(cinfer__aot_writer_add(w, k->arch, k->name, k->key, k->cubin, k->size),
                         CINFER_STATUS_SUCCESS);
    }
    uint64_t bytes = 0;
    assert_int_equal(cinfer__aot_writer_finish(w, path, &bytes), CINFER_STATUS_SUCCESS);
    assert_true(bytes > 0);
    cinfer__aot_writer_destroy(w);
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc((size_t)n + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return data;
}

static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
}

/* Entries in the empty cache folder (it must never get any). */
static int cache_entries(void) {
    uint64_t entries = 0, bytes = 0;
    assert_int_equal(cinfer__cache_usage(g.empty, &entries, &bytes), CINFER_STATUS_SUCCESS);
    return (int)entries;
}

/* ---------------------------------------------------------------------------------------------
 * Group setup: the ci bundle, built as `cinfer aot` builds it
 * ------------------------------------------------------------------------------------------- */

static int group_setup(void **state) {
    (void)state;
    snprintf(g.root, sizeof g.root, "/tmp/cinfer-test-aot-XXXXXX");
    if (!mkdtemp(g.root))
        return -1;
    snprintf(g.build, sizeof g.build, "%s/build-cache", g.root);
    snprintf(g.empty, sizeof g.empty, "%s/empty-cache", g.root);
    snprintf(g.bundle, sizeof g.bundle, "%s/ci.aot", g.root);
    snprintf(g.path, sizeof g.path, "%s/scenario.aot", g.root);
    ssize_t n = readlink("/proc/self/exe", g.self, sizeof g.self - 1);
    if (n <= 0)
        return -1;
    g.self[n] = '\0';
    setenv("CINFER_CACHE_DIR", g.build, 1);
    unsetenv("CINFER_JIT");
    unsetenv("CINFER_AOT_PATH");
    cinfer__settings_reload();
    cinfer__aot_reload();
    g.nvrtc_version = cinfer__jit_nvrtc_version();
    if (g.nvrtc_version == 0) {
        fprintf(stderr, "test_aot: NVRTC cannot be loaded: %s\n", cinfer_last_error());
        return -1;
    }

    cinfer__aot_writer_t *w;
    if (cinfer__aot_writer_create(NULL, &w) != CINFER_STATUS_SUCCESS)
        return -1;
    for (int a = 0; a < NUM_ARCHS; a++) {
        cinfer__spec_t *specs;
        size_t count;
        if (cinfer__aot_set_specs("ci", archs[a], &specs, &count) != CINFER_STATUS_SUCCESS)
            return -1;
        kernel_t *grown = realloc(g.kernels, (g.num_kernels + count) * sizeof *grown);
        if (!grown)
            return -1;
        g.kernels = grown;
        for (size_t i = 0; i < count; i++) {
            kernel_t *k = &g.kernels[g.num_kernels++];
            memset(k, 0, sizeof *k);
            k->spec = specs[i];
            snprintf(k->arch, sizeof k->arch, "%s", archs[a]);
            cinfer__rendered_t r;
            cinfer__jit_source_t from;
            if (cinfer__spec_render(&specs[i], archs[a], g.nvrtc_version, &r) !=
                    CINFER_STATUS_SUCCESS ||
                cinfer__jit_cubin_rendered(&r, &k->cubin, &k->size, &from) !=
                    CINFER_STATUS_SUCCESS) {
                fprintf(stderr, "test_aot: %s\n", cinfer_last_error());
                return -1;
            }
            snprintf(k->name, sizeof k->name, "%s", r.name);
            k->key = strdup(r.key.data);
            cinfer_status_t st =
                cinfer__aot_writer_add(w, archs[a], r.name, r.key.data, k->cubin, k->size);
            cinfer__rendered_free(&r);
            if (!k->key || st != CINFER_STATUS_SUCCESS)
                return -1;
        }
        free(specs);
    }
    cinfer_status_t st = cinfer__aot_writer_finish(w, g.bundle, NULL);
    cinfer__aot_writer_destroy(w);
    return st == CINFER_STATUS_SUCCESS ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

static int group_teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < g.num_kernels; i++) {
        free(g.kernels[i].key);
        free(g.kernels[i].cubin);
    }
    free(g.kernels);
    unsetenv("CINFER_AOT_PATH");
    unsetenv("CINFER_JIT");
    cinfer__settings_reload();
    cinfer__aot_reload();
    return nftw(g.root, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---------------------------------------------------------------------------------------------
 * The sets
 * ------------------------------------------------------------------------------------------- */

static bool has_spec(const cinfer__spec_t *list, size_t n, const cinfer__spec_t *spec) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&list[i], spec, sizeof *spec) == 0)
            return true;
    return false;
}

static void sets_are_distinct_valid_specs_from_the_ops(void **state) {
    (void)state;
    cinfer__spec_t *ci, *def;
    size_t num_ci, num_def;
    assert_int_equal(cinfer__aot_set_specs("ci", "sm_90a", &ci, &num_ci), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__aot_set_specs("default", "sm_90a", &def, &num_def),
                     CINFER_STATUS_SUCCESS);
    assert_true(num_ci >= 3 && num_ci <= 20);
    assert_true(num_def > 4 * num_ci);
    for (size_t i = 0; i < num_def; i++) {
        assert_int_equal(cinfer__spec_validate(&def[i]), CINFER_STATUS_SUCCESS);
        cinfer__spec_t copy = def[i];
        cinfer__spec_normalize(&copy);
        assert_memory_equal(&copy, &def[i], sizeof copy);
        assert_false(has_spec(def, i, &def[i])); /* no duplicates */
    }
    /* Every ci spec is a default spec. */
    for (size_t i = 0; i < num_ci; i++)
        assert_true(has_spec(def, num_def, &ci[i]));

    /* The kernels create loads for a Llama-3-8B batch decode are in both sets. */
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = 32;
    o.num_kv_heads = 8;
    o.head_dim = 128;
    cinfer__spec_t attention, merge;
    unsigned smem;
    assert_int_equal(cinfer__decode_kernel_specs(&o, true, &attention, &merge, &smem),
                     CINFER_STATUS_SUCCESS);
    assert_true(has_spec(ci, num_ci, &attention) && has_spec(ci, num_ci, &merge));
    /* So are the cache writes of its serving step: append (16-byte rows) and the page-table
     * helpers, which a server with CINFER_JIT=off needs as well. */
    cinfer__spec_t writes[3];
    cinfer__append_kernel_spec(CINFER__DT_BF16, CINFER__DT_BF16, 128, true, &writes[0]);
    cinfer__seq_lens_kernel_spec(&writes[1]);
    cinfer__batch_indices_positions_kernel_spec(&writes[2]);
    for (int k = 0; k < 3; k++)
        assert_true(has_spec(ci, num_ci, &writes[k]) && has_spec(def, num_def, &writes[k]));
    /* Every kernel a Llama-3-8B causal single prefill may load (the default tiles, the smaller
     * ones it takes for short grids, the turn-taking ones it takes for long grids) is in the
     * default set. */
    cinfer__spec_t prefill_specs[4];
    int num_prefill = 0;
    assert_int_equal(
        cinfer__prefill_single_specs(&o, 1, "sm_90a", 227 * 1024, prefill_specs, &num_prefill),
        CINFER_STATUS_SUCCESS);
    assert_int_equal(num_prefill, 4);
    assert_true(prefill_specs[1].tile_q < prefill_specs[0].tile_q);
    assert_true(prefill_specs[2].tile_q == 256 && prefill_specs[2].warps == 8);
    assert_true(prefill_specs[3].backend == CINFER__BACKEND_SM90);
    for (int k = 0; k < 4; k++)
        assert_true(has_spec(def, num_def, &prefill_specs[k]) &&
                    has_spec(ci, num_ci, &prefill_specs[k]));
    /* Not on other archs (wgmma is sm_90a's). */
    assert_int_equal(
        cinfer__prefill_single_specs(&o, 1, "sm_80", 163 * 1024, prefill_specs, &num_prefill),
        CINFER_STATUS_SUCCESS);
    for (int k = 0; k < num_prefill; k++)
        assert_true(prefill_specs[k].backend == CINFER__BACKEND_SM80);
    /* At D = 64 and 256 the sm90 kernel too (K/V tiles of 64 rows at 256), in the default set. */
    for (int wide = 0; wide < 2; wide++) {
        cinfer_attention_options_t od = o;
        od.head_dim = wide ? 256 : 64;
        assert_int_equal(
            cinfer__prefill_single_specs(&od, 1, "sm_90a", 227 * 1024, prefill_specs, &num_prefill),
            CINFER_STATUS_SUCCESS);
        const cinfer__spec_t *last = &prefill_specs[num_prefill - 1];
        assert_true(last->backend == CINFER__BACKEND_SM90);
        assert_int_equal(last->tile_kv, wide ? 64 : 128);
        assert_true(has_spec(def, num_def, last));
    }

    /* The default set: fp16 and bf16; head dims 64, 128, 256; paged and single decode; causal
     * prefill with and without soft cap and sliding window. */
    const cinfer__dtype_t dtypes[] = {CINFER__DT_F16, CINFER__DT_BF16};
    const int dims[] = {64, 128, 256};
    for (int d = 0; d < 2; d++) {
        for (int h = 0; h < 3; h++) {
            int paged = 0, single = 0, prefill = 0;
            for (size_t i = 0; i < num_def; i++) {
                const cinfer__spec_t *s = &def[i];
                if (s->dtype_o != dtypes[d] || s->head_dim_vo != dims[h])
                    continue;
                paged += s->op == CINFER__OP_DECODE_TC && s->paged;
                single += s->op == CINFER__OP_DECODE_TC && !s->paged;
                prefill += s->op == CINFER__OP_PREFILL && s->mask == CINFER__MASK_CAUSAL;
            }
            assert_true(paged >= 1 && single >= 1 && prefill >= 1);
        }
        uint32_t prefill_flags = 0;
        for (size_t i = 0; i < num_def; i++)
            if (def[i].op == CINFER__OP_PREFILL && def[i].dtype_o == dtypes[d])
                prefill_flags |= 1u << def[i].flags;
        const uint32_t all = 1u << 0 | 1u << CINFER__FLAG_SOFT_CAP | 1u << CINFER__FLAG_WINDOW |
                             1u << (CINFER__FLAG_SOFT_CAP | CINFER__FLAG_WINDOW);
        assert_int_equal(prefill_flags & all, all);
        /* MLA: the attention kernels of 16 heads per token (mma.sync) and of 64 (the warpgroup
         * kernel, sm_90a), causal and not, and the merge. */
        int mla = 0, mla_wide = 0, mla_merge = 0;
        for (size_t i = 0; i < num_def; i++) {
            const cinfer__spec_t *s = &def[i];
            if (s->dtype_o != dtypes[d])
                continue;
            if (s->op == CINFER__OP_MLA && s->gqa_pack == 16 && s->tile_q == 16)
                mla += s->mask == CINFER__MASK_CAUSAL ? 2 : 1;
            if (s->op == CINFER__OP_MLA && s->gqa_pack == 64 && s->tile_q == 64)
                mla_wide += s->mask == CINFER__MASK_CAUSAL ? 2 : 1;
            mla_merge += s->op == CINFER__OP_MLA_MERGE;
        }
        assert_int_equal(mla, 3);
        assert_int_equal(mla_wide, 3);
        assert_int_equal(mla_merge, 1);
    }
    for (size_t i = 0; i < num_ci; i++)
        assert_true(ci[i].op != CINFER__OP_MLA && ci[i].op != CINFER__OP_MLA_MERGE);
    free(ci);
    free(def);

    assert_int_equal(cinfer__aot_set_specs("nightly", "sm_90a", &ci, &num_ci),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "\"nightly\""));
    assert_non_null(strstr(cinfer_last_error(), "default, ci"));
}

/* ---------------------------------------------------------------------------------------------
 * Serving from the bundle
 * ------------------------------------------------------------------------------------------- */

static void every_set_kernel_comes_from_the_bundle(void **state) {
    (void)state;
    assert_int_equal(use_counting_warnings(g.bundle), 0);
    const uint64_t before = aot_hits();
    for (size_t i = 0; i < g.num_kernels; i++) {
        const kernel_t *k = &g.kernels[i];
        cinfer__jit_source_t from = CINFER__JIT_FROM_COMPILE;
        void *cubin;
        size_t size;
        cinfer_status_t st = lookup(k, k->arch, &from, &cubin, &size);
        if (st != CINFER_STATUS_SUCCESS)
            fail_msg("%s for %s: %s", k->name, k->arch, cinfer_last_error());
        assert_int_equal(from, CINFER__JIT_FROM_AOT);
        assert_int_equal(size, k->size);
        assert_memory_equal(cubin, k->cubin, size);
        free(cubin);
    }
    assert_int_equal(aot_hits() - before, g.num_kernels);
    assert_int_equal(cache_entries(), 0);

    cinfer__aot_bundle_t *b = cinfer__aot_process_bundle();
    assert_non_null(b);
    cinfer__aot_info_t info;
    cinfer__aot_info(b, &info);
    assert_string_equal(info.path, g.bundle);
    assert_string_equal(info.archs, "sm_80,sm_90a");
    assert_string_equal(info.library_version, cinfer_version_string());
    assert_int_equal(info.count, g.num_kernels);
    assert_int_equal(info.nvrtc_version, g.nvrtc_version);
    for (uint32_t i = 0; i < info.count; i++) {
        cinfer__aot_entry_t e;
        cinfer__aot_entry(b, i, &e);
        bool listed = false;
        for (size_t j = 0; j < g.num_kernels; j++)
            listed = listed ||
                     (strcmp(g.kernels[j].name, e.name) == 0 &&
                      strcmp(g.kernels[j].arch, e.arch) == 0 && g.kernels[j].size == e.cubin_bytes);
        assert_true(listed);
    }
}

static void a_spec_outside_the_set_is_not_found_by_name(void **state) {
    (void)state;
    use(g.bundle, false);
    cinfer__spec_t s;
    assert_int_equal(cinfer__spec_parse("merge_states:dtype=f16,head_dim=64,vec=8", &s),
                     CINFER_STATUS_SUCCESS);
    void *cubin = NULL;
    size_t size = 0;
    capture_begin();
    cinfer_status_t st = cinfer__jit_cubin(&s, "sm_90a", &cubin, &size, NULL, NULL);
    assert_int_equal(capture_end(), 0);
    assert_int_equal(st, CINFER_STATUS_NOT_FOUND);
    assert_non_null(strstr(cinfer_last_error(), "merge_states_f16_hd64_vec8"));
    assert_non_null(strstr(cinfer_last_error(), "sm_90a"));
    assert_non_null(strstr(cinfer_last_error(), "CINFER_JIT=off"));
    assert_null(cubin);

    /* A set kernel for an arch the bundle was not built for: no entry, and no warning. */
    capture_begin();
    st = cinfer__jit_cubin(&g.kernels[0].spec, "sm_86", &cubin, &size, NULL, NULL);
    assert_int_equal(capture_end(), 0);
    assert_int_equal(st, CINFER_STATUS_NOT_FOUND);
    assert_non_null(strstr(cinfer_last_error(), g.kernels[0].name));
    assert_int_equal(cache_entries(), 0);
}

static void a_bundle_for_other_archs_is_no_warning(void **state) {
    (void)state;
    write_bundle(g.path, NULL, "sm_80");
    assert_int_equal(use_counting_warnings(g.path), 0);
    capture_begin();
    for (size_t i = 0; i < g.num_kernels; i++) {
        const kernel_t *k = &g.kernels[i];
        cinfer__jit_source_t from;
        void *cubin;
        size_t size;
        cinfer_status_t st = lookup(k, k->arch, &from, &cubin, &size);
        if (strcmp(k->arch, "sm_80") == 0) {
            assert_int_equal(st, CINFER_STATUS_SUCCESS);
            assert_int_equal(from, CINFER__JIT_FROM_AOT);
            free(cubin);
        } else {
            assert_int_equal(st, CINFER_STATUS_NOT_FOUND);
        }
    }
    assert_int_equal(capture_end(), 0);
}

/* Keys are rendered with the bundle's NVRTC version, so another NVRTC at run time (or none)
 * is still served; the rest of the key must match. */
static void keys_use_the_bundles_nvrtc_version(void **state) {
    (void)state;
    cinfer__aot_identity_t id;
    cinfer__aot_identity_current(&id);
    id.nvrtc_version = g.nvrtc_version + 10;
    cinfer__aot_writer_t *w;
    assert_int_equal(cinfer__aot_writer_create(&id, &w), CINFER_STATUS_SUCCESS);
    const kernel_t *k = &g.kernels[0];
    cinfer__rendered_t r;
    assert_int_equal(cinfer__spec_render(&k->spec, k->arch, id.nvrtc_version, &r),
                     CINFER_STATUS_SUCCESS);
    static const char fake[] = "\177ELF cubin built by another NVRTC";
    assert_int_equal(cinfer__aot_writer_add(w, k->arch, r.name, r.key.data, fake, sizeof fake),
                     CINFER_STATUS_SUCCESS);
    /* The same key twice is kept once. */
    assert_int_equal(cinfer__aot_writer_add(w, k->arch, r.name, r.key.data, fake, sizeof fake),
                     CINFER_STATUS_SUCCESS);
    /* A key rendered for another arch cannot be stored under this one. */
    assert_int_equal(cinfer__aot_writer_add(w, "sm_86", r.name, r.key.data, fake, sizeof fake),
                     CINFER_STATUS_INVALID_ARGUMENT);
    cinfer__rendered_free(&r);
    assert_int_equal(cinfer__aot_writer_finish(w, g.path, NULL), CINFER_STATUS_SUCCESS);
    cinfer__aot_writer_destroy(w);

    assert_int_equal(use_counting_warnings(g.path), 0);
    cinfer__aot_info_t info;
    cinfer__aot_info(cinfer__aot_process_bundle(), &info);
    assert_int_equal(info.count, 1);
    cinfer__jit_source_t from;
    void *cubin;
    size_t size;
    assert_int_equal(lookup(k, k->arch, &from, &cubin, &size), CINFER_STATUS_SUCCESS);
    assert_int_equal(from, CINFER__JIT_FROM_AOT);
    assert_int_equal(size, sizeof fake);
    assert_memory_equal(cubin, fake, sizeof fake);
    free(cubin);

    /* The key text itself decides: a key that differs anywhere misses. */
    cinfer__aot_bundle_t *b = cinfer__aot_process_bundle();
    assert_int_equal(cinfer__aot_find(b, k->key, strlen(k->key), &cubin, &size),
                     CINFER_STATUS_NOT_FOUND);
    assert_int_equal(cinfer__spec_render(&k->spec, k->arch, id.nvrtc_version, &r),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__aot_find(b, r.key.data, r.key.len, &cubin, &size),
                     CINFER_STATUS_SUCCESS);
    free(cubin);
    assert_int_equal(cinfer__aot_find(b, r.key.data, r.key.len - 1, &cubin, &size),
                     CINFER_STATUS_NOT_FOUND);
    cinfer__rendered_free(&r);
}

/* Without CINFER_AOT_PATH the bundle is libcinfer.aot next to libcinfer.so; this program links
 * the library statically, so it has none, and says nothing about it. */
static void no_default_bundle_when_linked_statically(void **state) {
    (void)state;
    assert_int_equal(use_counting_warnings(NULL), 0);
    assert_null(cinfer__aot_process_bundle());
    assert_all_miss();
}

/* ---------------------------------------------------------------------------------------------
 * Bundles that cannot be used: one warning, never an error
 * ------------------------------------------------------------------------------------------- */

/* Points the process at path, expecting exactly one warning containing `why`, then every lookup
 * to miss without another warning. */
static void assert_ignored_with_one_warning(const char *path, const char *why) {
    capture_begin();
    use(path, false);
    assert_all_miss();
    assert_int_equal(capture_end(), 1);
    assert_non_null(strstr(capture.text, why));
    assert_non_null(strstr(capture.text, "ignored"));
    assert_null(cinfer__aot_process_bundle());
    assert_int_equal(cache_entries(), 0);
}

static void a_bundle_for_another_library_is_ignored(void **state) {
    (void)state;
    cinfer__aot_identity_t id;
    cinfer__aot_identity_current(&id);
    snprintf(id.library_version, sizeof id.library_version, "9.9.9");
    write_bundle(g.path, &id, NULL);
    cinfer__aot_bundle_t *b;
    assert_int_equal(cinfer__aot_open(g.path, &b), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "built for cinfer 9.9.9"));
    assert_ignored_with_one_warning(g.path, "built for cinfer 9.9.9");

    /* Same version, other kernel sources (a development build). */
    cinfer__aot_identity_current(&id);
    id.sources_hash ^= 1;
    write_bundle(g.path, &id, NULL);
    assert_ignored_with_one_warning(g.path, "kernel sources");

    /* Another format version. */
    size_t size;
    unsigned char *data = read_file(g.bundle, &size);
    data[8] = 2;
    write_file(g.path, data, size);
    assert_int_equal(cinfer__aot_open(g.path, &b), CINFER_STATUS_UNSUPPORTED);
    assert_ignored_with_one_warning(g.path, "format version 2");
    free(data);
}

static void a_truncated_or_corrupt_bundle_is_ignored(void **state) {
    (void)state;
    size_t size;
    unsigned char *data = read_file(g.bundle, &size);
    cinfer__aot_bundle_t *b;

    const size_t cuts[] = {0, 7, 100, 191, 192, 600, size / 2, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_file(g.path, data, cuts[i]);
        assert_int_equal(cinfer__aot_open(g.path, &b), CINFER_STATUS_IO_ERROR);
        assert_ignored_with_one_warning(g.path, "truncated");
    }

    /* Trailing bytes: the size no longer matches the header. */
    unsigned char *longer = malloc(size + 10);
    assert_non_null(longer);
    memcpy(longer, data, size);
    memset(longer + size, 0, 10);
    write_file(g.path, longer, size + 10);
    assert_ignored_with_one_warning(g.path, "trailing bytes");
    free(longer);

    /* Not a bundle at all. */
    const char text[] = "this is a text file that happens to be long enough to hold a header, "
                        "but it is not a cinfer bundle; the reader must notice it at once and "
                        "ignore it, telling the user which file it skipped and why.";
    write_file(g.path, text, sizeof text);
    assert_ignored_with_one_warning(g.path, "not a cinfer AOT bundle");

    /* One flipped bit in the header, in the index, in a key text. */
    const size_t flips[] = {20, 192 + 3, 192 + 64 * g.num_kernels + 40};
    const char *const whys[] = {"corrupt header", "corrupt index", "corrupt index"};
    for (size_t i = 0; i < 3; i++) {
        data[flips[i]] ^= 0x10;
        write_file(g.path, data, size);
        data[flips[i]] ^= 0x10;
        assert_int_equal(cinfer__aot_open(g.path, &b), CINFER_STATUS_IO_ERROR);
        assert_ignored_with_one_warning(g.path, whys[i]);
    }

    /* CINFER_AOT_PATH naming a file that does not exist. */
    char missing[PATH_MAX + 16];
    snprintf(missing, sizeof missing, "%s/missing.aot", g.root);
    assert_int_equal(cinfer__aot_open(missing, &b), CINFER_STATUS_NOT_FOUND);
    assert_ignored_with_one_warning(missing, "CINFER_AOT_PATH");
    free(data);
}

/* A damaged cubin passes the open (cubins are checked when used): its lookup warns once and
 * misses, and the bundle is not used again. */
static void a_corrupt_cubin_is_caught_on_use(void **state) {
    (void)state;
    size_t size;
    unsigned char *data = read_file(g.bundle, &size);
    data[size - 100] ^= 0x01; /* inside the last cubin in the file */
    write_file(g.path, data, size);
    free(data);
    assert_int_equal(use_counting_warnings(g.path), 0);
    assert_non_null(cinfer__aot_process_bundle());
    capture_begin();
    int hits = 0;
    for (size_t i = 0; i < g.num_kernels; i++) {
        cinfer__jit_source_t from;
        void *cubin;
        size_t bytes;
        if (lookup(&g.kernels[i], g.kernels[i].arch, &from, &cubin, &bytes) ==
            CINFER_STATUS_SUCCESS) {
            hits++;
            free(cubin);
        } else {
            assert_int_equal(lookup(&g.kernels[i], g.kernels[i].arch, &from, &cubin, &bytes),
                             CINFER_STATUS_NOT_FOUND);
        }
    }
    assert_int_equal(capture_end(), 1);
    assert_non_null(strstr(capture.text, "fails its checksum"));
    assert_true(hits < (int)g.num_kernels);
    assert_null(cinfer__aot_process_bundle());
    assert_int_equal(cache_entries(), 0);
}

/* ---------------------------------------------------------------------------------------------
 * First use from many threads, in a fresh process
 * ------------------------------------------------------------------------------------------- */

#define CHILD_ARG     "--threads-child"
#define CHILD_THREADS 8

static void *child_thread(void *arg) {
    (void)arg;
    for (size_t i = 0; i < g.num_kernels; i++) {
        void *cubin = NULL;
        size_t size = 0;
        cinfer__jit_source_t from;
        if (cinfer__jit_cubin(&g.kernels[i].spec, g.kernels[i].arch, &cubin, &size, &from, NULL) !=
                CINFER_STATUS_SUCCESS ||
            from != CINFER__JIT_FROM_AOT)
            return (void *)1;
        free(cubin);
    }
    return NULL;
}

/* The child: the ci set's specs from CINFER_AOT_PATH on CHILD_THREADS threads at once, the
 * bundle being opened by whichever comes first. Exit status 0 when every lookup hit. */
static int child_main(void) {
    for (int a = 0; a < NUM_ARCHS; a++) {
        cinfer__spec_t *specs;
        size_t count;
        if (cinfer__aot_set_specs("ci", archs[a], &specs, &count) != CINFER_STATUS_SUCCESS)
            return 2;
        g.kernels = realloc(g.kernels, (g.num_kernels + count) * sizeof *g.kernels);
        if (!g.kernels)
            return 2;
        for (size_t i = 0; i < count; i++) {
            g.kernels[g.num_kernels].spec = specs[i];
            snprintf(g.kernels[g.num_kernels++].arch, sizeof g.kernels[0].arch, "%s", archs[a]);
        }
        free(specs);
    }
    pthread_t threads[CHILD_THREADS];
    for (int i = 0; i < CHILD_THREADS; i++)
        if (pthread_create(&threads[i], NULL, child_thread, NULL) != 0)
            return 2;
    int failed = 0;
    for (int i = 0; i < CHILD_THREADS; i++) {
        void *result;
        pthread_join(threads[i], &result);
        failed += result != NULL;
    }
    cinfer_jit_stats_t s = CINFER_JIT_STATS_INIT;
    cinfer_jit_get_stats(&s);
    if (failed || s.aot_hits != (uint64_t)CHILD_THREADS * g.num_kernels || s.disk_hits || s.misses)
        return 1;
    return 0;
}

static void first_use_from_many_threads(void **state) {
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("CINFER_AOT_PATH", g.bundle, 1);
        setenv("CINFER_CACHE_DIR", g.empty, 1);
        setenv("CINFER_JIT", "off", 1);
        execl(g.self, g.self, CHILD_ARG, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(cache_entries(), 0);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], CHILD_ARG) == 0)
        return child_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sets_are_distinct_valid_specs_from_the_ops),
        cmocka_unit_test(every_set_kernel_comes_from_the_bundle),
        cmocka_unit_test(a_spec_outside_the_set_is_not_found_by_name),
        cmocka_unit_test(a_bundle_for_other_archs_is_no_warning),
        cmocka_unit_test(keys_use_the_bundles_nvrtc_version),
        cmocka_unit_test(no_default_bundle_when_linked_statically),
        cmocka_unit_test(a_bundle_for_another_library_is_ignored),
        cmocka_unit_test(a_truncated_or_corrupt_bundle_is_ignored),
        cmocka_unit_test(a_corrupt_cubin_is_caught_on_use),
        cmocka_unit_test(first_use_from_many_threads),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
