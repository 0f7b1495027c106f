/*
 * The KV-cache and position utilities (include/cinfer.h) against the float64 CPU reference
 * (src/ref/ref_utils.c): append_paged_kv_cache, get_batch_indices_positions, get_seq_lens, the
 * apply_rope family, packbits and segment_packbits.
 *
 * Every tensor is a "field": a view of some shape inside a device allocation that may be larger
 * (padding in any dimension, an offset origin, a data pointer moved by 2 bytes), with canary zones
 * around the allocation. Inputs are random values encoded on the host and the reference is given
 * exactly the values the GPU reads. Outputs are poisoned (0xFF) before each call, except the
 * paged caches, which hold random old contents: an append must change exactly the slots it
 * writes. Afterwards the whole allocation is compared (outputs against the reference, everything
 * else against its previous bytes), inputs must be unchanged and the canaries intact.
 *
 * Seeds: case k of a test uses cinfer_test_seed() + the test's base + k and prints it on failure;
 * CINFER_TEST_SEED=<base seed> replays a run.
 */
#include "support/field.h"
#include "support/gpu.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/ref_utils.h"

static cinfer_context_t *ctx;
static CUstream stream; /* non-blocking, made in main() */

/* ---------------------------------------------------------------------------------------------
 * Host helpers
 * ------------------------------------------------------------------------------------------- */

/* True when msg names arg as the ops do: "arg: ..." or "arg is ...", or "options->arg", with arg
 * not part of a longer identifier. */
static int names_argument(const char *msg, const char *arg) {
    size_t len = strlen(arg);
    for (const char *p = strstr(msg, arg); p; p = strstr(p + 1, arg)) {
        int starts = p == msg || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int ends = p[len] == ':' || p[len] == ' ' || p[len] == ',';
        if (starts && ends)
            return 1;
    }
    return 0;
}

/* Fails unless st is `want` and the message names `arg`. */
static void expect_error_at(const char *file, int line, cinfer_status_t st, cinfer_status_t want,
                            const char *arg, const char *what) {
    if (st != want)
        cinfer_test_fail_at(file, line, "%s: returned %s, expected %s (message: %s)", what,
                            cinfer_status_name(st), cinfer_status_name(want), cinfer_last_error());
    if (!names_argument(cinfer_last_error(), arg))
        cinfer_test_fail_at(file, line, "%s: the message \"%s\" does not name \"%s\"", what,
                            cinfer_last_error(), arg);
}
#define expect_error(st, want, arg, what) expect_error_at(__FILE__, __LINE__, st, want, arg, what)

/* ---------------------------------------------------------------------------------------------
 * Fields: a view inside a padded, canary-guarded device allocation, mirrored on the host
 * ------------------------------------------------------------------------------------------- */

/* Layouts (support/field.h); the zero layout is a compact tensor. */
static const layout_t COMPACT = {{0}, {0}, 0};
/* [n, H, D] inside [n + 2, H + 3, D + 8] at (1, 2, 8): padding around the view in every dim; the
 * 8-element head-dim offset keeps 16-byte alignment for 16-bit types. */
static const layout_t PADDED_3D = {{2, 3, 8}, {1, 2, 8}, 0};
/* Rows of D + 4 elements: for 16-bit types a row stride 8 bytes off a 16-byte multiple. */
static const layout_t ODD_STRIDE_3D = {{0, 0, 4}, {0, 0, 0}, 0};
/* The data pointer moved by 2 bytes: element-aligned for 16-bit types, not 16-byte aligned. */
static const layout_t SHIFTED = {{0}, {0}, 2};
/* A paged cache [pages, a, b, D] inside [pages + 1, a, b + 1, D + 16] at (1, 0, 1, 0): a spare
 * page before the view and padding after every head row. */
static const layout_t PADDED_CACHE_4D = {{1, 0, 1, 16}, {1, 0, 1, 0}, 0};
/* A combined cache [pages, 2, a, b, D] with padding after each head row and each page. */
static const layout_t PADDED_CACHE_5D = {{1, 0, 0, 1, 16}, {0, 0, 0, 0, 0}, 0};

/* The allocation's elements as the device sees them: host + shift. */
static unsigned char *field_base(const field_t *f, unsigned char *payload) {
    return payload + f->shift;
}

/* A compact 1-d int32 field holding v[0, n). */
static void field_i32(field_t *f, const int32_t *v, int64_t n) {
    const int64_t shape[1] = {n};
    field_make(f, CINFER__DT_I32, 1, shape, &COMPACT);
    for (int64_t i = 0; i < n; i++)
        field_set(f, i, v[i]);
    field_upload(f);
}

/* Fails unless the canaries are intact and every payload byte equals `expected` (the "before"
 * bytes when expected is NULL). Downloads first. */
static void field_expect_bytes(field_t *f, const unsigned char *expected, const char *name,
                               const char *desc) {
    cinfer_status_t st = cinfer_test_buf_check_canaries(&f->buf);
    if (st != CINFER_STATUS_SUCCESS)
        cinfer_test_fail_at(__FILE__, __LINE__, "%s of %s: %s", name, desc, cinfer_last_error());
    field_download(f);
    if (!expected)
        expected = f->before;
    for (size_t b = 0; b < f->bytes; b++) {
        if (f->host[b] != expected[b]) {
            int64_t elem = b < f->shift ? -1 : (int64_t)((b - f->shift) / f->esize);
            cinfer_test_fail_at(__FILE__, __LINE__,
                                "%s of %s: payload byte %zu (allocation element %" PRId64
                                ", %s the view) is 0x%02x, expected 0x%02x",
                                name, desc, b, elem,
                                elem >= 0 && f->inview[elem] ? "inside" : "outside", f->host[b],
                                expected[b]);
        }
    }
}

/* Fails unless nothing in the field changed. */
static void field_expect_kept(field_t *f, const char *name, const char *desc) {
    field_expect_bytes(f, NULL, name, desc);
}

/* The reference's view of a 3-d field [tokens, heads, dim] as it was uploaded. */
static cinfer__ref_strided3_t field_ref3(const field_t *f) {
    cinfer__ref_strided3_t t;
    cinfer__ref_dtype_t rd = CINFER__REF_DTYPE_F16;
    if (cinfer_test_ref_dtype(f->dtype, &rd) != 0)
        cinfer_test_fail_at(__FILE__, __LINE__, "field_ref3: not a float dtype");
    t.data = field_base(f, f->before) + f->origin * (int64_t)f->esize;
    t.dtype = rd;
    t.stride_token = f->stride[0];
    t.stride_head = f->stride[1];
    t.stride_dim = f->stride[2];
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * A paged KV cache and its page table
 * ------------------------------------------------------------------------------------------- */

/* A batch after the append: request b ends with seq_lens[b] tokens, the last append_len of which
 * are new (append_indptr), in pages of page_size listed by kv_indptr / kv_indices; `padding`
 * trailing entries belong to no request (batch index -1). */
typedef struct table {
    int64_t batch, page_size, nnz, max_pages, num_pages;
    int32_t *seq_lens, *append_indptr, *kv_indptr, *kv_indices, *kv_last;
    int32_t *batch_indices, *positions; /* [nnz], from the reference */
} table_t;

/* Random lengths up to max_len; every third request is new (all its tokens appended, starting at
 * position 0), the others append up to two pages and two tokens; pages are a random permutation
 * of max_pages = num_pages + 3 (three never used). */
static void table_make(table_t *t, cinfer_test_rng *rng, int64_t batch, int64_t page_size,
                       int64_t max_len, int64_t padding) {
    memset(t, 0, sizeof *t);
    t->batch = batch;
    t->page_size = page_size;
    t->seq_lens = cinfer_test_xmalloc((size_t)batch * sizeof(int32_t));
    t->append_indptr = cinfer_test_xmalloc((size_t)(batch + 1) * sizeof(int32_t));
    t->kv_indptr = cinfer_test_xmalloc((size_t)(batch + 1) * sizeof(int32_t));
    t->kv_last = cinfer_test_xmalloc((size_t)batch * sizeof(int32_t));
    t->append_indptr[0] = 0;
    t->kv_indptr[0] = 0;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = (int64_t)cinfer_test_rng_below(rng, (uint64_t)max_len + 1);
        const int64_t cap = len < 2 * page_size + 2 ? len : 2 * page_size + 2;
        const int64_t append = b % 3 == 0 ? len : (int64_t)cinfer_test_rng_below(rng, cap + 1);
        const int64_t pages = (len + page_size - 1) / page_size;
        t->seq_lens[b] = (int32_t)len;
        t->append_indptr[b + 1] = t->append_indptr[b] + (int32_t)append;
        t->kv_indptr[b + 1] = t->kv_indptr[b] + (int32_t)pages;
        t->kv_last[b] = pages ? (int32_t)(len - (pages - 1) * page_size) : 0;
    }
    t->num_pages = t->kv_indptr[batch];
    t->max_pages = t->num_pages + 3;
    int32_t *perm = cinfer_test_xmalloc((size_t)t->max_pages * sizeof(int32_t));
    for (int64_t i = 0; i < t->max_pages; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = t->max_pages - 1; i > 0; i--) {
        const int64_t j = (int64_t)cinfer_test_rng_below(rng, (uint64_t)i + 1);
        const int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    t->kv_indices = perm; /* the first num_pages entries are the table */
    t->nnz = t->append_indptr[batch] + padding;
    t->batch_indices = cinfer_test_xmalloc((size_t)t->nnz * sizeof(int32_t));
    t->positions = cinfer_test_xmalloc((size_t)t->nnz * sizeof(int32_t));
    assert_int_equal(cinfer__ref_batch_indices_positions(batch, t->append_indptr, t->seq_lens,
                                                         t->nnz, t->batch_indices, t->positions),
                     CINFER__REF_OK);
}

static void table_free(table_t *t) {
    free(t->seq_lens);
    free(t->append_indptr);
    free(t->kv_indptr);
    free(t->kv_indices);
    free(t->kv_last);
    free(t->batch_indices);
    free(t->positions);
    memset(t, 0, sizeof *t);
}

/* The device copies of a table's index arrays. */
typedef struct table_fields {
    field_t batch_indices, positions, kv_indptr, kv_indices, kv_last;
} table_fields_t;

static void table_fields_make(table_fields_t *tf, const table_t *t) {
    field_i32(&tf->batch_indices, t->batch_indices, t->nnz);
    field_i32(&tf->positions, t->positions, t->nnz);
    field_i32(&tf->kv_indptr, t->kv_indptr, t->batch + 1);
    field_i32(&tf->kv_indices, t->kv_indices, t->num_pages);
    field_i32(&tf->kv_last, t->kv_last, t->batch);
}

static void table_fields_free(table_fields_t *tf) {
    field_free(&tf->batch_indices);
    field_free(&tf->positions);
    field_free(&tf->kv_indptr);
    field_free(&tf->kv_indices);
    field_free(&tf->kv_last);
}

/* The K and V caches of one test: separate [pages, a, b, D] fields, or one combined
 * [pages, 2, a, b, D] field (v unused). */
typedef struct caches {
    int combined;
    cinfer_kv_layout_t layout;
    field_t k, v;
} caches_t;

static void caches_make(caches_t *c, cinfer_test_rng *rng, cinfer__dtype_t dtype,
                        cinfer_kv_layout_t layout, int combined, int64_t pages, int64_t page_size,
                        int64_t heads, int64_t head_dim, const layout_t *lay) {
    memset(c, 0, sizeof *c);
    c->combined = combined;
    c->layout = layout;
    const int nhd = layout == CINFER_KV_LAYOUT_NHD;
    const int64_t a = nhd ? page_size : heads, b = nhd ? heads : page_size;
    if (combined) {
        const int64_t shape[5] = {pages, 2, a, b, head_dim};
        field_make(&c->k, dtype, 5, shape, lay ? lay : &COMPACT);
    } else {
        const int64_t shape[4] = {pages, a, b, head_dim};
        field_make(&c->k, dtype, 4, shape, lay ? lay : &COMPACT);
        field_make(&c->v, dtype, 4, shape, lay ? lay : &COMPACT);
    }
    /* Old contents: an append must leave every slot it does not own as it was. */
    field_fill(&c->k, rng, -1.0, 1.0);
    field_upload(&c->k);
    if (!combined) {
        field_fill(&c->v, rng, -1.0, 1.0);
        field_upload(&c->v);
    }
}

static void caches_free(caches_t *c) {
    field_free(&c->k);
    if (!c->combined)
        field_free(&c->v);
}

/* The reference's view of cache `which` (0 = K, 1 = V) inside a copy of the field's payload. */
static cinfer__ref_paged_out_t cache_ref(const caches_t *c, int which, unsigned char *payload,
                                         cinfer__ref_dtype_t dtype) {
    const field_t *f = which && !c->combined ? &c->v : &c->k;
    const int nhd = c->layout == CINFER_KV_LAYOUT_NHD;
    const int first = c->combined ? 2 : 1;
    const size_t esize = cinfer__ref_dtype_size(dtype);
    int64_t at = f->origin + (which && c->combined ? f->stride[1] : 0);
    cinfer__ref_paged_out_t r;
    r.data = payload + at * (int64_t)esize;
    r.dtype = dtype;
    r.stride_page = f->stride[0];
    r.stride_slot = f->stride[nhd ? first : first + 1];
    r.stride_head = f->stride[nhd ? first + 1 : first];
    r.stride_dim = f->stride[first + 2];
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * append_paged_kv_cache
 * ------------------------------------------------------------------------------------------- */

typedef struct append_case {
    cinfer__dtype_t src, cache;
    cinfer_kv_layout_t layout;
    int combined;
    int64_t page_size, heads, head_dim, batch, max_len, padding;
    double k_scale, v_scale;
    const layout_t *src_layout;   /* of append_k and append_v */
    const layout_t *cache_layout; /* NULL: compact */
    const char *desc;
} append_case_t;

static int is_fp8(cinfer__dtype_t dt) {
    return dt == CINFER__DT_E4M3 || dt == CINFER__DT_E5M2;
}

static int is_power_of_two(double x) {
    int e;
    return frexp(x, &e) == 0.5;
}

/*
 * Compares a downloaded cache payload with the expected bytes. With shadow (fp8 with a scale that
 * is not a power of two, where the kernel's float32 x * (1 / scale) may round a quotient that lies
 * within float32 rounding of a midpoint between two fp8 values to the other side), a differing
 * element must have been written (shadow not NaN: the quotient x / scale in float32), the two
 * codes must be neighbours of one sign, and the quotient must lie within 2^-20 of their midpoint.
 */
static void expect_cache_field(field_t *f, const unsigned char *expected, const float *shadow,
                               const char *name, const char *desc) {
    cinfer_status_t st = cinfer_test_buf_check_canaries(&f->buf);
    if (st != CINFER_STATUS_SUCCESS)
        cinfer_test_fail_at(__FILE__, __LINE__, "%s of %s: %s", name, desc, cinfer_last_error());
    field_download(f);
    for (size_t b = 0; b < f->bytes; b++) {
        if (f->host[b] == expected[b])
            continue;
        const int64_t elem = b < f->shift ? -1 : (int64_t)((b - f->shift) / f->esize);
        if (shadow && elem >= 0 && !isnan(shadow[elem]) && f->esize == 1) {
            const unsigned got = f->host[b], want = expected[b];
            const double g = cinfer_test_load(f->dtype, &f->host[b], 0);
            const double w = cinfer_test_load(f->dtype, &expected[b], 0);
            const double mid = 0.5 * (g + w), q = shadow[elem];
            const int neighbours =
                (got & 0x80) == (want & 0x80) && abs((int)(got & 0x7f) - (int)(want & 0x7f)) == 1;
            if (neighbours && fabs(q - mid) <= 0x1p-20 * fabs(mid))
                continue;
        }
        cinfer_test_fail_at(
            __FILE__, __LINE__,
            "%s of %s: payload byte %zu (allocation element %" PRId64
            ", %s the view) is 0x%02x, expected 0x%02x%s",
            name, desc, b, elem, elem >= 0 && f->inview[elem] ? "inside" : "outside", f->host[b],
            expected[b], shadow && elem >= 0 ? " (not a rounding tie of x / scale)" : "");
    }
}

/* Runs the reference append over copies of the caches' "before" payloads and compares. */
static void expect_append(caches_t *c, const table_t *t, const field_t *k, const field_t *v,
                          int64_t heads, int64_t head_dim, double k_scale, double v_scale,
                          const char *desc) {
    cinfer__ref_dtype_t rd = CINFER__REF_DTYPE_F16;
    assert_int_equal(cinfer_test_ref_dtype(c->k.dtype, &rd), 0);
    field_t *fields[2] = {&c->k, c->combined ? NULL : &c->v};
    unsigned char *expected[2] = {NULL, NULL};
    float *shadow[2] = {NULL, NULL};
    const int need_shadow =
        is_fp8(c->k.dtype) && !(is_power_of_two(k_scale) && is_power_of_two(v_scale));
    for (int i = 0; i < 2; i++) {
        if (!fields[i])
            continue;
        expected[i] = cinfer_test_xmalloc(fields[i]->bytes);
        memcpy(expected[i], fields[i]->before, fields[i]->bytes);
        if (need_shadow) {
            shadow[i] = cinfer_test_xmalloc((size_t)fields[i]->phys_count * sizeof(float));
            for (int64_t e = 0; e < fields[i]->phys_count; e++)
                shadow[i][e] = NAN;
        }
    }
    const cinfer__ref_strided3_t rk = field_ref3(k), rv = field_ref3(v);
    unsigned char *v_payload = c->combined ? expected[0] : expected[1];
    const cinfer__ref_paged_out_t kc = cache_ref(c, 0, field_base(&c->k, expected[0]), rd);
    const cinfer__ref_paged_out_t vc =
        cache_ref(c, 1, field_base(c->combined ? &c->k : &c->v, v_payload), rd);
    int32_t flags = 0;
    assert_int_equal(cinfer__ref_append_paged_kv_cache(
                         t->nnz, heads, head_dim, &rk, &rv, t->batch_indices, t->positions,
                         t->batch, t->kv_indptr, t->kv_indices, t->num_pages, t->max_pages,
                         t->page_size, &kc, &vc, k_scale, v_scale, &flags),
                     CINFER__REF_OK);
    assert_int_equal(flags, 0);
    if (need_shadow) {
        float *v_shadow = c->combined ? shadow[0] : shadow[1];
        const cinfer__ref_paged_out_t ks =
            cache_ref(c, 0, (unsigned char *)shadow[0], CINFER__REF_DTYPE_F32);
        const cinfer__ref_paged_out_t vs =
            cache_ref(c, 1, (unsigned char *)v_shadow, CINFER__REF_DTYPE_F32);
        assert_int_equal(cinfer__ref_append_paged_kv_cache(
                             t->nnz, heads, head_dim, &rk, &rv, t->batch_indices, t->positions,
                             t->batch, t->kv_indptr, t->kv_indices, t->num_pages, t->max_pages,
                             t->page_size, &ks, &vs, k_scale, v_scale, NULL),
                         CINFER__REF_OK);
    }
    for (int i = 0; i < 2; i++) {
        if (!fields[i])
            continue;
        expect_cache_field(fields[i], expected[i], shadow[i], i ? "v_cache" : "k_cache", desc);
        free(expected[i]);
        free(shadow[i]);
    }
}

static DLTensor *cache_v_tensor(caches_t *c) {
    return c->combined ? NULL : &c->v.tensor.t;
}

static void run_append_case(const append_case_t *ac, uint64_t seed) {
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    table_t t;
    table_make(&t, &rng, ac->batch, ac->page_size, ac->max_len, ac->padding);
    const int64_t src_shape[3] = {t.nnz, ac->heads, ac->head_dim};
    field_t k, v, flag;
    field_make(&k, ac->src, 3, src_shape, ac->src_layout);
    field_make(&v, ac->src, 3, src_shape, ac->src_layout);
    field_fill(&k, &rng, -4.0, 4.0);
    field_fill(&v, &rng, -4.0, 4.0);
    field_upload(&k);
    field_upload(&v);
    table_fields_t tf;
    table_fields_make(&tf, &t);
    caches_t c;
    caches_make(&c, &rng, ac->cache, ac->layout, ac->combined, t.max_pages, ac->page_size,
                ac->heads, ac->head_dim, ac->cache_layout);
    const int32_t zero = 0;
    field_i32(&flag, &zero, 1);

    cinfer_append_options_t o = CINFER_APPEND_OPTIONS_INIT;
    o.kv_layout = ac->layout;
    o.page_size = (int)ac->page_size;
    o.k_scale = (float)ac->k_scale;
    o.v_scale = (float)ac->v_scale;
    CINFER_TEST_OK(cinfer_append_paged_kv_cache(
        ctx, &o, &k.tensor.t, &v.tensor.t, &tf.batch_indices.tensor.t, &tf.positions.tensor.t,
        &c.k.tensor.t, cache_v_tensor(&c), &tf.kv_indices.tensor.t, &tf.kv_indptr.tensor.t,
        &tf.kv_last.tensor.t, &flag.tensor.t, stream));
    CINFER_TEST_SYNC(stream);

    char desc[256];
    snprintf(desc, sizeof desc, "%s (seed 0x%016" PRIx64 ", %" PRId64 " tokens)", ac->desc, seed,
             t.nnz);
    expect_append(&c, &t, &k, &v, ac->heads, ac->head_dim, (double)o.k_scale, (double)o.v_scale,
                  desc);
    field_expect_kept(&flag, "error_flag", desc);
    field_expect_kept(&k, "append_k", desc);
    field_expect_kept(&v, "append_v", desc);
    field_expect_kept(&tf.batch_indices, "batch_indices", desc);
    field_expect_kept(&tf.kv_indices, "kv_indices", desc);

    caches_free(&c);
    table_fields_free(&tf);
    field_free(&flag);
    field_free(&k);
    field_free(&v);
    table_free(&t);
}

static void test_append_sweep(void **state) {
    (void)state;
    const cinfer_kv_layout_t NHD = CINFER_KV_LAYOUT_NHD, HND = CINFER_KV_LAYOUT_HND;
    const cinfer__dtype_t F16 = CINFER__DT_F16, BF16 = CINFER__DT_BF16, E4M3 = CINFER__DT_E4M3,
                          E5M2 = CINFER__DT_E5M2;
    /* src, cache, layout, combined, page, heads, D, batch, max_len, padding, k/v scale, layouts */
    const append_case_t cases[] = {
        {BF16, BF16, NHD, 0, 16, 8, 128, 5, 70, 0, 1, 1, &COMPACT, NULL,
         "bf16 NHD page 16 (Llama)"},
        {F16, F16, HND, 0, 16, 4, 64, 4, 50, 2, 1, 1, &PADDED_3D, &PADDED_CACHE_4D,
         "f16 HND padded, 2 padding tokens"},
        {BF16, BF16, NHD, 1, 16, 2, 128, 4, 40, 0, 1, 1, &COMPACT, NULL, "bf16 combined NHD"},
        {F16, F16, HND, 1, 8, 2, 256, 3, 30, 1, 1, 1, &PADDED_3D, &PADDED_CACHE_5D,
         "f16 combined HND padded, D 256"},
        {BF16, BF16, NHD, 0, 1, 2, 64, 5, 9, 0, 1, 1, &COMPACT, NULL, "page size 1"},
        {F16, F16, NHD, 0, 256, 1, 128, 3, 600, 0, 1, 1, &COMPACT, NULL, "page size 256"},
        {BF16, BF16, HND, 0, 3, 3, 96, 6, 20, 0, 1, 1, &ODD_STRIDE_3D, NULL,
         "page size 3, D 96, 8-byte-off rows (element path)"},
        {F16, BF16, NHD, 0, 16, 2, 128, 4, 40, 0, 1, 1, &COMPACT, NULL, "f16 into a bf16 cache"},
        {BF16, F16, HND, 1, 5, 2, 64, 4, 20, 0, 1, 1, &COMPACT, NULL,
         "bf16 into a combined f16 HND cache, page 5"},
        {BF16, E4M3, NHD, 0, 16, 4, 128, 4, 40, 0, 0.5, 2.0, &COMPACT, NULL,
         "e4m3 cache, scales 0.5 and 2"},
        {F16, E5M2, HND, 0, 16, 2, 128, 4, 40, 0, 2.0, 4.0, &PADDED_3D, &PADDED_CACHE_4D,
         "e5m2 HND padded, scales 2 and 4"},
        {BF16, E4M3, NHD, 1, 7, 2, 64, 4, 30, 1, 0.37, 1.3, &COMPACT, NULL,
         "combined e4m3, page 7, scales 0.37 and 1.3"},
        {F16, E5M2, NHD, 0, 4, 2, 40, 3, 20, 0, 0.8125, 3.0, &SHIFTED, NULL,
         "e5m2 from a 2-byte-shifted source (element path), scales 0.8125 and 3"},
        {BF16, BF16, NHD, 0, 16, 2, 100, 3, 40, 0, 1, 1, &COMPACT, NULL, "D 100 (element path)"},
        {BF16, BF16, HND, 0, 2, 1, 8, 1, 5, 0, 1, 1, &COMPACT, NULL, "one head of 8, page 2"},
        {F16, F16, NHD, 0, 4, 3, 1, 3, 10, 0, 1, 1, &COMPACT, NULL, "head dim 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_append_case(&cases[i], cinfer_test_seed() + 1000 + i);
}

/*
 * Tokens that cannot be written are skipped and flagged, padding is skipped silently, and the
 * flag accumulates across calls. Page size 4, one head of 8; request 0 owns pages (2, 0), request
 * 1 page (1); kv_indices holds a fourth entry 9, past the 3-page cache, reachable only through
 * the second table below.
 */
static void test_append_error_flags(void **state) {
    (void)state;
    const uint64_t seed = cinfer_test_seed() + 2000;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    enum { NNZ = 7 };
    /* 0: (0, 5) -> page 0 slot 1; 1: padding; 2: batch 2 of 2; 3: (1, 4) past its 4 slots;
     * 4: (1, -3); 5: batch -7; 6: (1, 3) -> page 1 slot 3. */
    const int32_t batch[NNZ] = {0, -1, 2, 1, 1, -7, 1}, pos[NNZ] = {5, 0, 0, 4, -3, 0, 3};
    const int32_t indptr[3] = {0, 2, 3}, indices[4] = {2, 0, 1, 9}, last[2] = {4, 4};
    table_t t;
    memset(&t, 0, sizeof t);
    t.batch = 2;
    t.page_size = 4;
    t.nnz = NNZ;
    t.max_pages = 3;
    t.num_pages = 4;
    t.batch_indices = (int32_t *)batch;
    t.positions = (int32_t *)pos;
    t.kv_indptr = (int32_t *)indptr;
    t.kv_indices = (int32_t *)indices;
    t.kv_last = (int32_t *)last;
    const int64_t src_shape[3] = {NNZ, 1, 8};
    field_t k, v, flag;
    field_make(&k, CINFER__DT_BF16, 3, src_shape, &COMPACT);
    field_make(&v, CINFER__DT_BF16, 3, src_shape, &COMPACT);
    field_fill(&k, &rng, -2.0, 2.0);
    field_fill(&v, &rng, -2.0, 2.0);
    field_upload(&k);
    field_upload(&v);
    table_fields_t tf;
    table_fields_make(&tf, &t);
    caches_t c;
    caches_make(&c, &rng, CINFER__DT_BF16, CINFER_KV_LAYOUT_NHD, 0, 3, 4, 1, 8, NULL);
    const int32_t zero = 0;
    field_i32(&flag, &zero, 1);
    cinfer_append_options_t o = CINFER_APPEND_OPTIONS_INIT;
    o.page_size = 4;

    CINFER_TEST_OK(cinfer_append_paged_kv_cache(
        ctx, &o, &k.tensor.t, &v.tensor.t, &tf.batch_indices.tensor.t, &tf.positions.tensor.t,
        &c.k.tensor.t, &c.v.tensor.t, &tf.kv_indices.tensor.t, &tf.kv_indptr.tensor.t,
        &tf.kv_last.tensor.t, &flag.tensor.t, stream));
    CINFER_TEST_SYNC(stream);
    field_download(&flag);
    assert_int_equal((int)field_get(&flag, 0),
                     CINFER_APPEND_ERROR_BATCH_INDEX | CINFER_APPEND_ERROR_POSITION);
    /* The reference skips the same tokens (its own flags are checked against the same bits). */
    cinfer__ref_dtype_t rd = CINFER__REF_DTYPE_BF16;
    unsigned char *ek = cinfer_test_xmalloc(c.k.bytes), *ev = cinfer_test_xmalloc(c.v.bytes);
    memcpy(ek, c.k.before, c.k.bytes);
    memcpy(ev, c.v.before, c.v.bytes);
    cinfer__ref_paged_out_t rk = cache_ref(&c, 0, field_base(&c.k, ek), rd);
    cinfer__ref_paged_out_t rv = cache_ref(&c, 1, field_base(&c.v, ev), rd);
    const cinfer__ref_strided3_t sk = field_ref3(&k), sv = field_ref3(&v);
    int32_t ref_flags = 0;
    assert_int_equal(cinfer__ref_append_paged_kv_cache(NNZ, 1, 8, &sk, &sv, batch, pos, 2, indptr,
                                                       indices, 4, 3, 4, &rk, &rv, 1.0, 1.0,
                                                       &ref_flags),
                     CINFER__REF_OK);
    assert_int_equal(ref_flags, CINFER_APPEND_ERROR_BATCH_INDEX | CINFER_APPEND_ERROR_POSITION);
    expect_cache_field(&c.k, ek, NULL, "k_cache", "append with invalid tokens");
    expect_cache_field(&c.v, ev, NULL, "v_cache", "append with invalid tokens");
    /* Exactly two slots changed: page 0 slot 1 (token 0) and page 1 slot 3 (token 6). */
    int changed = 0;
    for (size_t b = 0; b < c.k.bytes; b += 16)
        changed += memcmp(c.k.host + b, c.k.before + b, 16) != 0;
    assert_int_equal(changed, 2);

    /* Second call, flag not cleared: request 1 now claims three pages, entries 2, 3 and 4 of a
     * 4-entry kv_indices, so its position 4 reaches entry 3 = page 9 of 3 and position 8 entry
     * 4, past kv_indices: both PAGE, and the bits add up. */
    field_upload(&c.k);
    field_upload(&c.v);
    const int32_t indptr2[3] = {0, 2, 5}, batch2[2] = {1, 1}, pos2[2] = {4, 8};
    field_t b2, p2, i2;
    field_i32(&b2, batch2, 2);
    field_i32(&p2, pos2, 2);
    field_i32(&i2, indptr2, 3);
    const int64_t two[3] = {2, 1, 8};
    field_t k2;
    field_make(&k2, CINFER__DT_BF16, 3, two, &COMPACT);
    field_fill(&k2, &rng, -2.0, 2.0);
    field_upload(&k2);
    CINFER_TEST_OK(cinfer_append_paged_kv_cache(ctx, &o, &k2.tensor.t, &k2.tensor.t, &b2.tensor.t,
                                                &p2.tensor.t, &c.k.tensor.t, &c.v.tensor.t,
                                                &tf.kv_indices.tensor.t, &i2.tensor.t,
                                                &tf.kv_last.tensor.t, &flag.tensor.t, stream));
    CINFER_TEST_SYNC(stream);
    field_download(&flag);
    assert_int_equal((int)field_get(&flag, 0), CINFER_APPEND_ERROR_BATCH_INDEX |
                                                   CINFER_APPEND_ERROR_POSITION |
                                                   CINFER_APPEND_ERROR_PAGE);
    field_expect_kept(&c.k, "k_cache", "append with a bad page index");
    field_expect_kept(&c.v, "v_cache", "append with a bad page index");

    /* Without an error flag the same bad tokens are still skipped. */
    CINFER_TEST_OK(cinfer_append_paged_kv_cache(
        ctx, &o, &k2.tensor.t, &k2.tensor.t, &b2.tensor.t, &p2.tensor.t, &c.k.tensor.t,
        &c.v.tensor.t, &tf.kv_indices.tensor.t, &i2.tensor.t, &tf.kv_last.tensor.t, NULL, stream));
    CINFER_TEST_SYNC(stream);
    field_expect_kept(&c.k, "k_cache", "append with a bad page index, no flag");

    free(ek);
    free(ev);
    field_free(&k2);
    field_free(&b2);
    field_free(&p2);
    field_free(&i2);
    caches_free(&c);
    table_fields_free(&tf);
    field_free(&flag);
    field_free(&k);
    field_free(&v);
}

/* fp8 rounding at the edges, against the reference bit for bit (scale 1, so no tie tolerance):
 * saturation of large values and infinities, NaN, subnormals and ties to even, signed zeros. */
static void test_append_fp8_special_values(void **state) {
    (void)state;
    static const double values[16] = {1000.0,  -1000.0, INFINITY, -INFINITY,   NAN,     0.0,
                                      -0.0,    0x1p-10, 0x3p-10,  464.0,       70000.0, -61440.0,
                                      57344.0, 0x1p-17, 0x3p-17,  1.0 + 0x1p-3};
    const cinfer__dtype_t caches[2] = {CINFER__DT_E4M3, CINFER__DT_E5M2};
    for (int ci = 0; ci < 2; ci++) {
        cinfer_test_rng rng;
        cinfer_test_rng_init(&rng, cinfer_test_seed() + 2100 + ci);
        table_t t;
        memset(&t, 0, sizeof t);
        const int32_t batch[1] = {0}, pos[1] = {0}, indptr[2] = {0, 1}, indices[1] = {0},
                      last[1] = {1};
        t.batch = 1;
        t.page_size = 1;
        t.nnz = 1;
        t.max_pages = 1;
        t.num_pages = 1;
        t.batch_indices = (int32_t *)batch;
        t.positions = (int32_t *)pos;
        t.kv_indptr = (int32_t *)indptr;
        t.kv_indices = (int32_t *)indices;
        t.kv_last = (int32_t *)last;
        const int64_t shape[3] = {1, 1, 16};
        field_t k;
        field_make(&k, CINFER__DT_BF16, 3, shape, &COMPACT);
        for (int d = 0; d < 16; d++)
            field_set(&k, d, values[d]);
        field_upload(&k);
        table_fields_t tf;
        table_fields_make(&tf, &t);
        caches_t c;
        caches_make(&c, &rng, caches[ci], CINFER_KV_LAYOUT_NHD, 1, 1, 1, 1, 16, NULL);
        cinfer_append_options_t o = CINFER_APPEND_OPTIONS_INIT;
        o.page_size = 1;
        CINFER_TEST_OK(cinfer_append_paged_kv_cache(
            ctx, &o, &k.tensor.t, &k.tensor.t, &tf.batch_indices.tensor.t, &tf.positions.tensor.t,
            &c.k.tensor.t, NULL, &tf.kv_indices.tensor.t, &tf.kv_indptr.tensor.t,
            &tf.kv_last.tensor.t, NULL, stream));
        CINFER_TEST_SYNC(stream);
        expect_append(&c, &t, &k, &k, 1, 16, 1.0, 1.0,
                      ci ? "e5m2 special values" : "e4m3 special values");
        caches_free(&c);
        table_fields_free(&tf);
        field_free(&k);
    }
}

/* An append of no tokens succeeds and touches nothing (the error flag included). */
static void test_append_empty(void **state) {
    (void)state;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 2200);
    const int32_t indptr[2] = {0, 1}, indices[1] = {0}, last[1] = {1}, zero = 0;
    field_t b, p, ip, ix, l, flag, k;
    field_i32(&b, NULL, 0);
    field_i32(&p, NULL, 0);
    field_i32(&ip, indptr, 2);
    field_i32(&ix, indices, 1);
    field_i32(&l, last, 1);
    field_i32(&flag, &zero, 1);
    const int64_t shape[3] = {0, 2, 64};
    field_make(&k, CINFER__DT_F16, 3, shape, &COMPACT);
    caches_t c;
    caches_make(&c, &rng, CINFER__DT_F16, CINFER_KV_LAYOUT_NHD, 0, 1, 16, 2, 64, NULL);
    cinfer_append_options_t o = CINFER_APPEND_OPTIONS_INIT;
    CINFER_TEST_OK(cinfer_append_paged_kv_cache(
        ctx, &o, &k.tensor.t, &k.tensor.t, &b.tensor.t, &p.tensor.t, &c.k.tensor.t, &c.v.tensor.t,
        &ix.tensor.t, &ip.tensor.t, &l.tensor.t, &flag.tensor.t, stream));
    CINFER_TEST_SYNC(stream);
    field_expect_kept(&c.k, "k_cache", "empty append");
    field_expect_kept(&c.v, "v_cache", "empty append");
    field_expect_kept(&flag, "error_flag", "empty append");
    caches_free(&c);
    field_free(&k);
    field_free(&b);
    field_free(&p);
    field_free(&ip);
    field_free(&ix);
    field_free(&l);
    field_free(&flag);
}

/* Bad arguments: a precise status naming the argument, and nothing written. */
static void test_append_argument_errors(void **state) {
    (void)state;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 2300);
    const int32_t batch[2] = {0, 0}, pos[2] = {0, 1}, indptr[2] = {0, 1}, indices[1] = {0},
                  last[1] = {2}, zero = 0;
    field_t b, p, ip, ix, l, flag, k, v, k32;
    field_i32(&b, batch, 2);
    field_i32(&p, pos, 2);
    field_i32(&ip, indptr, 2);
    field_i32(&ix, indices, 1);
    field_i32(&l, last, 1);
    field_i32(&flag, &zero, 1);
    const int64_t shape[3] = {2, 2, 64};
    field_make(&k, CINFER__DT_F16, 3, shape, &COMPACT);
    field_make(&v, CINFER__DT_F16, 3, shape, &COMPACT);
    field_make(&k32, CINFER__DT_F32, 3, shape, &COMPACT);
    field_fill(&k, &rng, -1, 1);
    field_fill(&v, &rng, -1, 1);
    field_upload(&k);
    field_upload(&v);
    caches_t c;
    caches_make(&c, &rng, CINFER__DT_F16, CINFER_KV_LAYOUT_NHD, 0, 2, 16, 2, 64, NULL);
    cinfer_append_options_t o = CINFER_APPEND_OPTIONS_INIT;
    const cinfer_status_t INVALID = CINFER_STATUS_INVALID_ARGUMENT;

#define APPEND(ctx_, o_, k_, v_, b_, p_, kc_, vc_, ix_, ip_, l_, f_)                               \
    cinfer_append_paged_kv_cache(ctx_, o_, k_, v_, b_, p_, kc_, vc_, ix_, ip_, l_, f_, stream)
    DLTensor *K = &k.tensor.t, *V = &v.tensor.t, *B = &b.tensor.t, *P = &p.tensor.t;
    DLTensor *KC = &c.k.tensor.t, *VC = &c.v.tensor.t, *IX = &ix.tensor.t, *IP = &ip.tensor.t;
    DLTensor *L = &l.tensor.t, *F = &flag.tensor.t;

    expect_error(APPEND(NULL, &o, K, V, B, P, KC, VC, IX, IP, L, F), INVALID, "ctx", "ctx NULL");
    cinfer_append_options_t bad = o;
    bad.version = 99;
    expect_error(APPEND(ctx, &bad, K, V, B, P, KC, VC, IX, IP, L, F), INVALID, "options",
                 "options version 99");
    bad = o;
    bad.page_size = 8;
    expect_error(APPEND(ctx, &bad, K, V, B, P, KC, VC, IX, IP, L, F), INVALID, "k_cache",
                 "page_size 8 with a 16-slot cache");
    bad.page_size = 0;
    expect_error(APPEND(ctx, &bad, K, V, B, P, KC, VC, IX, IP, L, F), INVALID, "options->page_size",
                 "page_size 0");
    bad = o;
    bad.kv_layout = CINFER_KV_LAYOUT_HND;
    expect_error(APPEND(ctx, &bad, K, V, B, P, KC, VC, IX, IP, L, F), INVALID, "k_cache",
                 "HND options with an NHD cache of 16 slots and 2 heads");
    bad = o;
    bad.k_scale = 2.0f;
    expect_error(APPEND(ctx, &bad, K, V, B, P, KC, VC, IX, IP, L, F), INVALID, "options->k_scale",
                 "k_scale 2 with an f16 cache");
    bad.k_scale = -1.0f;
    expect_error(APPEND(ctx, &bad, K, V, B, P, KC, VC, IX, IP, L, F), INVALID, "options->k_scale",
                 "k_scale -1");
    expect_error(APPEND(ctx, &o, NULL, V, B, P, KC, VC, IX, IP, L, F), INVALID, "append_k",
                 "append_k NULL");
    expect_error(APPEND(ctx, &o, &k32.tensor.t, V, B, P, KC, VC, IX, IP, L, F), INVALID, "append_k",
                 "append_k float32");
    expect_error(APPEND(ctx, &o, K, &k32.tensor.t, B, P, KC, VC, IX, IP, L, F), INVALID, "append_v",
                 "append_v float32 with append_k f16");
    expect_error(APPEND(ctx, &o, K, V, P, &k.tensor.t, KC, VC, IX, IP, L, F), INVALID, "positions",
                 "positions f16");
    /* batch_indices with 3 entries for 2 tokens. */
    field_t b3;
    const int32_t three[3] = {0, 0, 0};
    field_i32(&b3, three, 3);
    expect_error(APPEND(ctx, &o, K, V, &b3.tensor.t, P, KC, VC, IX, IP, L, F), INVALID,
                 "batch_indices", "batch_indices [3] for 2 tokens");
    expect_error(APPEND(ctx, &o, K, V, B, P, KC, VC, IX, IP, &b3.tensor.t, F), INVALID,
                 "kv_last_page_len", "kv_last_page_len [3] for a batch of 1");
    expect_error(APPEND(ctx, &o, K, V, B, P, KC, VC, IX, IP, L, &b3.tensor.t), INVALID,
                 "error_flag", "error_flag [3]");
    expect_error(APPEND(ctx, &o, K, V, B, P, KC, VC, IX, NULL, L, F), INVALID, "kv_indptr",
                 "kv_indptr NULL");
    /* A v_cache of another dtype, and one with another page count. */
    caches_t other;
    caches_make(&other, &rng, CINFER__DT_BF16, CINFER_KV_LAYOUT_NHD, 0, 3, 16, 2, 64, NULL);
    expect_error(APPEND(ctx, &o, K, V, B, P, KC, &other.v.tensor.t, IX, IP, L, F), INVALID,
                 "v_cache", "v_cache bf16 with k_cache f16");
    /* A combined cache passed as k_cache with a v_cache: ndim 5 where 4 is expected. */
    caches_t comb;
    caches_make(&comb, &rng, CINFER__DT_F16, CINFER_KV_LAYOUT_NHD, 1, 2, 16, 2, 64, NULL);
    expect_error(APPEND(ctx, &o, K, V, B, P, &comb.k.tensor.t, VC, IX, IP, L, F), INVALID,
                 "k_cache", "a 5-d k_cache with a v_cache");
    /* A head dim of 2048 is beyond the kernels. */
    field_t big;
    const int64_t big_shape[3] = {2, 1, 2048};
    field_make(&big, CINFER__DT_F16, 3, big_shape, &COMPACT);
    expect_error(APPEND(ctx, &o, &big.tensor.t, &big.tensor.t, B, P, KC, VC, IX, IP, L, F),
                 CINFER_STATUS_UNSUPPORTED, "append_k", "head dim 2048");
#undef APPEND

    field_expect_kept(&c.k, "k_cache", "argument errors");
    field_expect_kept(&c.v, "v_cache", "argument errors");
    field_expect_kept(&flag, "error_flag", "argument errors");
    caches_free(&c);
    caches_free(&other);
    caches_free(&comb);
    field_free(&big);
    field_free(&b3);
    field_free(&b);
    field_free(&p);
    field_free(&ip);
    field_free(&ix);
    field_free(&l);
    field_free(&flag);
    field_free(&k);
    field_free(&v);
    field_free(&k32);
}

/* ---------------------------------------------------------------------------------------------
 * get_batch_indices_positions and get_seq_lens
 * ------------------------------------------------------------------------------------------- */

static void expect_i32(field_t *f, const int32_t *want, int64_t n, const char *name,
                       const char *desc) {
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&f->buf));
    field_download(f);
    for (int64_t i = 0; i < n; i++) {
        const int32_t got = (int32_t)field_get(f, i);
        if (got != want[i])
            cinfer_test_fail_at(__FILE__, __LINE__, "%s of %s: [%" PRId64 "] = %d, expected %d",
                                name, desc, i, got, want[i]);
    }
}

static void test_batch_indices_positions(void **state) {
    (void)state;
    /* FlashInfer's example, then random batches with empty requests, padding entries after the
     * last request and (case 3) an indptr starting above 0. */
    for (int c = 0; c < 6; c++) {
        const uint64_t seed = cinfer_test_seed() + 3000 + c;
        cinfer_test_rng rng;
        cinfer_test_rng_init(&rng, seed);
        int64_t batch = c == 0 ? 4 : 1 + (int64_t)cinfer_test_rng_below(&rng, 40);
        if (c == 5)
            batch = 0;
        int32_t *indptr = cinfer_test_xmalloc((size_t)(batch + 1) * sizeof(int32_t));
        int32_t *lens = cinfer_test_xmalloc((size_t)(batch ? batch : 1) * sizeof(int32_t));
        indptr[0] = c == 3 ? 3 : 0;
        for (int64_t b = 0; b < batch; b++) {
            const int32_t append =
                c == 0 ? (int32_t)(b + 1) : (int32_t)cinfer_test_rng_below(&rng, b % 4 ? 20 : 1);
            lens[b] = c == 0 ? 5 : append + (int32_t)cinfer_test_rng_below(&rng, 3000);
            indptr[b + 1] = indptr[b] + append;
        }
        const int64_t nnz = indptr[batch] + (c == 0 ? 0 : 5);
        int32_t *want_b = cinfer_test_xmalloc((size_t)nnz * sizeof(int32_t));
        int32_t *want_p = cinfer_test_xmalloc((size_t)nnz * sizeof(int32_t));
        assert_int_equal(
            cinfer__ref_batch_indices_positions(batch, indptr, lens, nnz, want_b, want_p),
            CINFER__REF_OK);
        field_t fi, fl, fb, fp;
        field_i32(&fi, indptr, batch + 1);
        field_i32(&fl, lens, batch);
        const int64_t shape[1] = {nnz};
        field_make(&fb, CINFER__DT_I32, 1, shape, &COMPACT);
        field_make(&fp, CINFER__DT_I32, 1, shape, &COMPACT);
        CINFER_TEST_OK(cinfer_get_batch_indices_positions(ctx, &fi.tensor.t, &fl.tensor.t,
                                                          &fb.tensor.t, &fp.tensor.t, stream));
        CINFER_TEST_SYNC(stream);
        char desc[128];
        snprintf(desc, sizeof desc, "batch %" PRId64 ", nnz %" PRId64 " (seed 0x%016" PRIx64 ")",
                 batch, nnz, seed);
        expect_i32(&fb, want_b, nnz, "batch_indices", desc);
        expect_i32(&fp, want_p, nnz, "positions", desc);
        if (c == 0) {
            const int32_t fi_b[10] = {0, 1, 1, 2, 2, 2, 3, 3, 3, 3};
            const int32_t fi_p[10] = {4, 3, 4, 2, 3, 4, 1, 2, 3, 4};
            expect_i32(&fb, fi_b, 10, "batch_indices", "FlashInfer's example");
            expect_i32(&fp, fi_p, 10, "positions", "FlashInfer's example");
        }
        field_expect_kept(&fi, "append_indptr", desc);
        field_free(&fi);
        field_free(&fl);
        field_free(&fb);
        field_free(&fp);
        free(indptr);
        free(lens);
        free(want_b);
        free(want_p);
    }
    /* Errors: seq_lens of the wrong length, int32 outputs of different lengths. */
    const int32_t indptr[3] = {0, 1, 2}, lens[1] = {4};
    field_t fi, fl, fb, fp;
    field_i32(&fi, indptr, 3);
    field_i32(&fl, lens, 1);
    field_i32(&fb, indptr, 3);
    field_i32(&fp, indptr, 2);
    expect_error(cinfer_get_batch_indices_positions(ctx, &fi.tensor.t, &fl.tensor.t, &fb.tensor.t,
                                                    &fb.tensor.t, stream),
                 CINFER_STATUS_INVALID_ARGUMENT, "seq_lens", "seq_lens [1] for a batch of 2");
    expect_error(cinfer_get_batch_indices_positions(ctx, &fi.tensor.t, &fp.tensor.t, &fb.tensor.t,
                                                    &fp.tensor.t, stream),
                 CINFER_STATUS_INVALID_ARGUMENT, "positions", "positions [2] with 3 entries");
    field_free(&fi);
    field_free(&fl);
    field_free(&fb);
    field_free(&fp);
}

static void test_seq_lens(void **state) {
    (void)state;
    for (int c = 0; c < 4; c++) {
        const uint64_t seed = cinfer_test_seed() + 3100 + c;
        cinfer_test_rng rng;
        cinfer_test_rng_init(&rng, seed);
        const int64_t batch = c == 3 ? 0 : 1 + (int64_t)cinfer_test_rng_below(&rng, 300);
        const int page_size = c == 1 ? 1 : c == 2 ? 256 : 16;
        int32_t *indptr = cinfer_test_xmalloc((size_t)(batch + 1) * sizeof(int32_t));
        int32_t *last = cinfer_test_xmalloc((size_t)(batch ? batch : 1) * sizeof(int32_t));
        int32_t *want = cinfer_test_xmalloc((size_t)(batch ? batch : 1) * sizeof(int32_t));
        indptr[0] = 0;
        for (int64_t b = 0; b < batch; b++) {
            /* Every fifth request has no pages (and a nonzero last_page_len, which must not
             * count). */
            const int32_t pages = b % 5 == 0 ? 0 : (int32_t)cinfer_test_rng_below(&rng, 50);
            indptr[b + 1] = indptr[b] + pages;
            last[b] = 1 + (int32_t)cinfer_test_rng_below(&rng, (uint64_t)page_size);
        }
        assert_int_equal(cinfer__ref_seq_lens(batch, indptr, last, page_size, want),
                         CINFER__REF_OK);
        field_t fi, fl, fo;
        field_i32(&fi, indptr, batch + 1);
        field_i32(&fl, last, batch);
        const int64_t shape[1] = {batch};
        field_make(&fo, CINFER__DT_I32, 1, shape, &COMPACT);
        CINFER_TEST_OK(
            cinfer_get_seq_lens(ctx, &fi.tensor.t, &fl.tensor.t, page_size, &fo.tensor.t, stream));
        CINFER_TEST_SYNC(stream);
        char desc[128];
        snprintf(desc, sizeof desc, "batch %" PRId64 ", page size %d (seed 0x%016" PRIx64 ")",
                 batch, page_size, seed);
        expect_i32(&fo, want, batch, "seq_lens", desc);
        if (c == 0)
            expect_error(
                cinfer_get_seq_lens(ctx, &fi.tensor.t, &fl.tensor.t, 0, &fo.tensor.t, stream),
                CINFER_STATUS_INVALID_ARGUMENT, "page_size", "page_size 0");
        field_free(&fi);
        field_free(&fl);
        field_free(&fo);
        free(indptr);
        free(last);
        free(want);
    }
}

/* ---------------------------------------------------------------------------------------------
 * RoPE
 * ------------------------------------------------------------------------------------------- */

typedef enum rope_mode {
    ROPE_RAGGED,
    ROPE_POS_IDS,
    ROPE_LLAMA31,
    ROPE_LLAMA31_POS_IDS,
    ROPE_TABLE,
} rope_mode_t;

typedef struct rope_case {
    rope_mode_t mode;
    cinfer__dtype_t dtype;
    int64_t nnz, hq, hk, head_dim;
    int64_t rotary_dim; /* 0: the head dim (options->rotary_dim = 0, or the table's width) */
    int interleave;
    int in_place; /* 0: separate outputs; 1: q_out = k_out = NULL; 2: the input tensors again */
    const layout_t *in_layout, *out_layout;
    int64_t max_pos;
    double rope_scale, rope_theta; /* 0: the options' default */
    int bad_positions; /* ragged: tokens before the first and after the last request; table:
                          every fifth position outside the table */
    const char *desc;
    /* Llama 3.1 only (0: the options' defaults) */
    double low_freq_factor, high_freq_factor;
    int old_context_len;
} rope_case_t;

/* Outputs are rotations of inputs in [-2, 2] (|out| < 2.9) computed in fp32 from angles good to
 * float64 and a sincos within 2^-21.4, rounded once: at most half an ulp at magnitude < 4
 * (bf16 2^-7, fp16 2^-10) plus 1e-5. The relative L2 bound is twice the dtype's unit roundoff. */
static double rope_abs_tol(cinfer__dtype_t dt) {
    return dt == CINFER__DT_BF16 ? 0x1p-7 + 1e-5 : 0x1p-10 + 1e-5;
}

static double rope_rel_tol(cinfer__dtype_t dt) {
    return dt == CINFER__DT_BF16 ? 0x1p-8 : 0x1p-11;
}

/*
 * Checks one output tensor [nnz, H, D] (downloaded) against ref: elements from rotary_dim on
 * must be bit copies of the input (`in`, as uploaded), NaN in ref must be NaN, the rest within the
 * tolerances; bytes outside the view must be unchanged, canaries intact.
 */
static void expect_rope(field_t *out, const field_t *in, const double *ref, int64_t rotary_dim,
                        const char *name, const char *desc) {
    cinfer_status_t st = cinfer_test_buf_check_canaries(&out->buf);
    if (st != CINFER_STATUS_SUCCESS)
        cinfer_test_fail_at(__FILE__, __LINE__, "%s of %s: %s", name, desc, cinfer_last_error());
    field_download(out);
    for (size_t b = 0; b < out->bytes; b++) {
        const int64_t elem = b < out->shift ? -1 : (int64_t)((b - out->shift) / out->esize);
        if ((elem < 0 || !out->inview[elem]) && out->host[b] != out->before[b])
            cinfer_test_fail_at(__FILE__, __LINE__,
                                "%s of %s: byte %zu outside the view changed from 0x%02x to "
                                "0x%02x",
                                name, desc, b, out->before[b], out->host[b]);
    }
    const int64_t D = out->shape[2];
    const double abs_tol = rope_abs_tol(out->dtype);
    double err2 = 0.0, ref2 = 0.0;
    for (int64_t i = 0; i < out->count; i++) {
        const int64_t d = i % D;
        const double got = field_get(out, i), want = ref[i];
        if (d >= rotary_dim) {
            const unsigned char *g = field_base(out, out->host) + field_phys(out, i) * out->esize;
            const unsigned char *x = field_base(in, in->before) + field_phys(in, i) * in->esize;
            if (memcmp(g, x, out->esize) != 0)
                cinfer_test_fail_at(__FILE__, __LINE__,
                                    "%s of %s: element %" PRId64 " (d = %" PRId64
                                    ", past the rotary dim) is %.9g, expected a copy of %.9g",
                                    name, desc, i, d, got, field_get(in, i));
            continue;
        }
        if (isnan(want)) {
            if (!isnan(got))
                cinfer_test_fail_at(__FILE__, __LINE__,
                                    "%s of %s: element %" PRId64 " is %.9g, expected NaN (a "
                                    "position outside the table)",
                                    name, desc, i, got);
            continue;
        }
        if (!(fabs(got - want) <= abs_tol))
            cinfer_test_fail_at(__FILE__, __LINE__,
                                "%s of %s: element %" PRId64 " (token %" PRId64 ", head %" PRId64
                                ", d %" PRId64 ") is %.9g, expected %.9g (tolerance %.3g)",
                                name, desc, i, i / (D * out->shape[1]), i / D % out->shape[1], d,
                                got, want, abs_tol);
        err2 += (got - want) * (got - want);
        ref2 += want * want;
    }
    if (ref2 > 0 && sqrt(err2 / ref2) > rope_rel_tol(out->dtype))
        cinfer_test_fail_at(__FILE__, __LINE__, "%s of %s: relative L2 error %.3g > %.3g", name,
                            desc, sqrt(err2 / ref2), rope_rel_tol(out->dtype));
}

/* The reference rotation of every row of `in` [nnz, H, D] (its uploaded values). pos[i] and
 * kind[i] per token: 0 = no position (copy), 1 = computed angles at pos[i], 2 = table row pos[i]
 * (NaN when outside the table). */
static double *rope_reference(const field_t *in, const cinfer__ref_rope_t *rope, const int64_t *pos,
                              const uint8_t *kind, const double *table, int64_t table_rows) {
    const int64_t nnz = in->shape[0], H = in->shape[1], D = in->shape[2];
    double *ref = cinfer_test_xmalloc((size_t)in->count * sizeof(double));
    double *x = cinfer_test_xmalloc((size_t)D * sizeof(double));
    const cinfer__ref_strided3_t src = field_ref3(in);
    for (int64_t i = 0; i < nnz; i++) {
        for (int64_t h = 0; h < H; h++) {
            for (int64_t d = 0; d < D; d++)
                x[d] = cinfer__ref_load(src.dtype, src.data,
                                        i * src.stride_token + h * src.stride_head + d);
            double *out = ref + (i * H + h) * D;
            if (kind[i] == 0) {
                memcpy(out, x, (size_t)D * sizeof(double));
            } else if (kind[i] == 1) {
                assert_int_equal(cinfer__ref_rope_row(rope, D, (double)pos[i], x, out),
                                 CINFER__REF_OK);
            } else {
                const int valid = pos[i] >= 0 && pos[i] < table_rows;
                assert_int_equal(
                    cinfer__ref_rope_row_table(rope->rotary_dim, rope->interleave, D,
                                               valid ? table + pos[i] * rope->rotary_dim : NULL,
                                               valid, x, out),
                    CINFER__REF_OK);
            }
        }
    }
    free(x);
    return ref;
}

/* The position inputs of one case, on the host and the device. */
typedef struct rope_positions {
    int64_t batch, rows;
    int32_t *indptr, *offsets, *pos_ids;
    int64_t *pos;
    uint8_t *kind;
    double *table; /* [rows, R] as float32-exact doubles */
    field_t f_indptr, f_offsets, f_pos_ids, f_table;
} rope_positions_t;

static void rope_positions_make(rope_positions_t *p, const rope_case_t *rc, int64_t rotary_dim,
                                cinfer_test_rng *rng) {
    memset(p, 0, sizeof *p);
    const int64_t nnz = rc->nnz;
    p->pos = cinfer_test_xmalloc((size_t)nnz * sizeof(int64_t));
    p->kind = cinfer_test_xmalloc((size_t)nnz);
    if (rc->mode == ROPE_RAGGED || rc->mode == ROPE_LLAMA31) {
        /* Up to 6 requests (some empty) over the tokens, with one uncovered token before them and
         * two after when bad_positions is set. */
        const int64_t lead = rc->bad_positions && nnz >= 3 ? 1 : 0;
        const int64_t tail = rc->bad_positions && nnz >= 3 ? 2 : 0;
        p->batch = 1 + (int64_t)cinfer_test_rng_below(rng, 6);
        p->indptr = cinfer_test_xmalloc((size_t)(p->batch + 1) * sizeof(int32_t));
        p->offsets = cinfer_test_xmalloc((size_t)p->batch * sizeof(int32_t));
        p->indptr[0] = (int32_t)lead;
        for (int64_t b = 0; b < p->batch; b++) {
            const int64_t left = nnz - tail - p->indptr[b];
            const int64_t len =
                b == p->batch - 1 ? left : (int64_t)cinfer_test_rng_below(rng, (uint64_t)left + 1);
            p->indptr[b + 1] = p->indptr[b] + (int32_t)len;
            /* request 0 starts at position 0 */
            p->offsets[b] = b ? (int32_t)cinfer_test_rng_below(rng, (uint64_t)rc->max_pos + 1) : 0;
        }
        assert_int_equal(cinfer__ref_rope_ragged_positions(p->batch, p->indptr, p->offsets, nnz,
                                                           p->pos, p->kind),
                         CINFER__REF_OK);
        field_i32(&p->f_indptr, p->indptr, p->batch + 1);
        field_i32(&p->f_offsets, p->offsets, p->batch);
        return;
    }
    p->pos_ids = cinfer_test_xmalloc((size_t)(nnz ? nnz : 1) * sizeof(int32_t));
    if (rc->mode == ROPE_TABLE)
        p->rows = rc->max_pos + 1;
    for (int64_t i = 0; i < nnz; i++) {
        int64_t v = (int64_t)cinfer_test_rng_below(rng, (uint64_t)rc->max_pos + 1);
        if (i == 0)
            v = 0; /* position 0 (no rotation) in every case with tokens */
        if (rc->mode != ROPE_TABLE && i % 7 == 3)
            v = -v; /* any int32 is a position */
        if (rc->mode == ROPE_TABLE && rc->bad_positions && i % 5 == 2)
            v = i % 2 ? -1 - v : p->rows + v; /* outside the table, on either side */
        p->pos_ids[i] = (int32_t)v;
        p->pos[i] = v;
        p->kind[i] = rc->mode == ROPE_TABLE ? 2 : 1;
    }
    field_i32(&p->f_pos_ids, p->pos_ids, nnz);
    if (rc->mode != ROPE_TABLE)
        return;
    /* A table of plausible angles: row p, pair j holds cos and sin of p * 1e4^(-2j/R). */
    const int64_t half = rotary_dim / 2, shape[2] = {p->rows, rotary_dim};
    const layout_t padded_rows = {{0, 4}, {0, 0}, 0};
    field_make(&p->f_table, CINFER__DT_F32, 2, shape,
               rc->in_layout == &PADDED_3D ? &padded_rows : &COMPACT);
    p->table = cinfer_test_xmalloc((size_t)(p->rows * rotary_dim) * sizeof(double));
    for (int64_t r = 0; r < p->rows; r++) {
        for (int64_t j = 0; j < half; j++) {
            const double a = (double)r * pow(1e4, -2.0 * (double)j / (double)rotary_dim);
            field_set(&p->f_table, r * rotary_dim + j, cos(a));
            field_set(&p->f_table, r * rotary_dim + half + j, sin(a));
        }
    }
    for (int64_t e = 0; e < p->rows * rotary_dim; e++)
        p->table[e] = field_get(&p->f_table, e);
    field_upload(&p->f_table);
}

static void rope_positions_free(rope_positions_t *p) {
    free(p->indptr);
    free(p->offsets);
    free(p->pos_ids);
    free(p->pos);
    free(p->kind);
    free(p->table);
    if (p->f_indptr.host) {
        field_free(&p->f_indptr);
        field_free(&p->f_offsets);
    }
    if (p->f_pos_ids.host)
        field_free(&p->f_pos_ids);
    if (p->f_table.host)
        field_free(&p->f_table);
}

static void run_rope_case(const rope_case_t *rc, uint64_t seed) {
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    const int llama = rc->mode == ROPE_LLAMA31 || rc->mode == ROPE_LLAMA31_POS_IDS;
    cinfer_rope_options_t o = CINFER_ROPE_OPTIONS_INIT;
    if (llama) {
        const cinfer_rope_options_t l = CINFER_LLAMA31_ROPE_OPTIONS_INIT;
        o = l;
    }
    o.rotary_dim = (int)rc->rotary_dim;
    o.interleave = rc->interleave;
    if (rc->rope_scale)
        o.rope_scale = (float)rc->rope_scale;
    if (rc->rope_theta)
        o.rope_theta = (float)rc->rope_theta;
    if (rc->low_freq_factor)
        o.low_freq_factor = (float)rc->low_freq_factor;
    if (rc->high_freq_factor)
        o.high_freq_factor = (float)rc->high_freq_factor;
    if (rc->old_context_len)
        o.old_context_len = rc->old_context_len;
    const int64_t R = rc->rotary_dim ? rc->rotary_dim : rc->head_dim;

    const int64_t q_shape[3] = {rc->nnz, rc->hq, rc->head_dim};
    const int64_t k_shape[3] = {rc->nnz, rc->hk, rc->head_dim};
    field_t q, k, qo, ko;
    field_make(&q, rc->dtype, 3, q_shape, rc->in_layout);
    field_make(&k, rc->dtype, 3, k_shape, rc->in_layout);
    field_fill(&q, &rng, -2.0, 2.0);
    field_fill(&k, &rng, -2.0, 2.0);
    field_upload(&q);
    field_upload(&k);
    if (!rc->in_place) {
        field_make(&qo, rc->dtype, 3, q_shape, rc->out_layout);
        field_make(&ko, rc->dtype, 3, k_shape, rc->out_layout);
        field_upload(&qo); /* poisoned */
        field_upload(&ko);
    }
    rope_positions_t p;
    rope_positions_make(&p, rc, R, &rng);

    DLTensor *Q = &q.tensor.t, *K = &k.tensor.t;
    DLTensor *QO = rc->in_place == 0 ? &qo.tensor.t : rc->in_place == 2 ? Q : NULL;
    DLTensor *KO = rc->in_place == 0 ? &ko.tensor.t : rc->in_place == 2 ? K : NULL;
    switch (rc->mode) {
    case ROPE_RAGGED:
        CINFER_TEST_OK(cinfer_apply_rope(ctx, &o, Q, K, QO, KO, &p.f_indptr.tensor.t,
                                         &p.f_offsets.tensor.t, stream));
        break;
    case ROPE_LLAMA31:
        CINFER_TEST_OK(cinfer_apply_llama31_rope(ctx, &o, Q, K, QO, KO, &p.f_indptr.tensor.t,
                                                 &p.f_offsets.tensor.t, stream));
        break;
    case ROPE_POS_IDS:
        CINFER_TEST_OK(
            cinfer_apply_rope_pos_ids(ctx, &o, Q, K, QO, KO, &p.f_pos_ids.tensor.t, stream));
        break;
    case ROPE_LLAMA31_POS_IDS:
        CINFER_TEST_OK(cinfer_apply_llama31_rope_pos_ids(ctx, &o, Q, K, QO, KO,
                                                         &p.f_pos_ids.tensor.t, stream));
        break;
    case ROPE_TABLE:
        CINFER_TEST_OK(cinfer_apply_rope_with_cos_sin_cache(
            ctx, Q, K, QO, KO, &p.f_pos_ids.tensor.t, &p.f_table.tensor.t, rc->interleave, stream));
        break;
    }
    CINFER_TEST_SYNC(stream);

    cinfer__ref_rope_t rope;
    memset(&rope, 0, sizeof rope);
    rope.rotary_dim = R;
    rope.interleave = rc->interleave != 0;
    rope.rope_theta = o.rope_theta;
    rope.rope_scale = o.rope_scale;
    rope.llama31 = llama;
    rope.low_freq_factor = o.low_freq_factor;
    rope.high_freq_factor = o.high_freq_factor;
    rope.old_context_len = o.old_context_len;
    double *q_ref = rope_reference(&q, &rope, p.pos, p.kind, p.table, p.rows);
    double *k_ref = rope_reference(&k, &rope, p.pos, p.kind, p.table, p.rows);
    char desc[256];
    snprintf(desc, sizeof desc, "%s (seed 0x%016" PRIx64 ")", rc->desc, seed);
    expect_rope(rc->in_place ? &q : &qo, &q, q_ref, R, "q_out", desc);
    expect_rope(rc->in_place ? &k : &ko, &k, k_ref, R, "k_out", desc);
    if (!rc->in_place) {
        field_expect_kept(&q, "q", desc);
        field_expect_kept(&k, "k", desc);
        field_free(&qo);
        field_free(&ko);
    }
    free(q_ref);
    free(k_ref);
    rope_positions_free(&p);
    field_free(&q);
    field_free(&k);
}

static void test_rope_sweep(void **state) {
    (void)state;
    const cinfer__dtype_t F16 = CINFER__DT_F16, BF16 = CINFER__DT_BF16;
    /* mode, dtype, nnz, hq, hk, D, R, interleave, in_place, in/out layouts, max_pos, scale,
     * theta, bad_positions, description, Llama 3.1's low / high frequency factors and old
     * context length */
    const rope_case_t cases[] = {
        {ROPE_RAGGED, BF16, 300, 8, 2, 128, 0, 0, 0, &COMPACT, &COMPACT, 100000, 0, 0, 0,
         "ragged bf16 D 128, out of place", 0, 0, 0},
        {ROPE_RAGGED, F16, 200, 4, 4, 64, 32, 1, 1, &PADDED_3D, NULL, 5000, 0, 0, 1,
         "ragged f16 partial 32 of 64, interleaved, in place, uncovered tokens", 0, 0, 0},
        {ROPE_POS_IDS, BF16, 150, 4, 2, 128, 64, 0, 0, &PADDED_3D, &ODD_STRIDE_3D, 70000, 0, 0, 0,
         "pos_ids partial 64 of 128 into 8-byte-off rows (element path)", 0, 0, 0},
        {ROPE_POS_IDS, F16, 100, 2, 1, 256, 0, 1, 2, &COMPACT, NULL, 1 << 24, 0, 0, 0,
         "pos_ids D 256 interleaved, in place through the same tensors, positions to 2^24", 0, 0,
         0},
        {ROPE_LLAMA31, BF16, 250, 8, 2, 128, 0, 0, 0, &COMPACT, &PADDED_3D, 131072, 0, 0, 1,
         "Llama 3.1 ragged, defaults", 0, 0, 0},
        {ROPE_LLAMA31_POS_IDS, F16, 120, 4, 1, 128, 0, 1, 1, &COMPACT, NULL, 131072, 2.0, 1e4, 0,
         "Llama 3.1 pos_ids interleaved, in place, scale 2 theta 1e4", 0, 0, 0},
        {ROPE_LLAMA31_POS_IDS, BF16, 100, 4, 2, 128, 0, 0, 0, &COMPACT, &COMPACT, 131072, 0, 0, 0,
         "Llama 3.1 pos_ids, factors 2 and 8, old context 4096", 2.0, 8.0, 4096},
        {ROPE_LLAMA31, F16, 80, 2, 1, 64, 32, 0, 0, &COMPACT, &COMPACT, 40000, 16.0, 5e5, 0,
         "Llama 3.1 ragged, partial 32 of 64, scale 16, factors 1.5 and 3, old context 2048", 1.5,
         3.0, 2048},
        {ROPE_TABLE, BF16, 200, 8, 2, 128, 0, 0, 0, &COMPACT, &COMPACT, 4095, 0, 0, 0,
         "cos/sin table R 128", 0, 0, 0},
        {ROPE_TABLE, F16, 100, 2, 2, 64, 32, 1, 1, &PADDED_3D, NULL, 1000, 0, 0, 0,
         "cos/sin table R 32 of 64 interleaved, in place, padded table rows", 0, 0, 0},
        {ROPE_TABLE, BF16, 60, 2, 1, 128, 64, 0, 0, &COMPACT, &COMPACT, 500, 0, 0, 1,
         "cos/sin table with positions outside it", 0, 0, 0},
        {ROPE_POS_IDS, BF16, 90, 3, 1, 80, 24, 0, 0, &COMPACT, &COMPACT, 9000, 0, 0, 0,
         "R 24 of 80 (element path)", 0, 0, 0},
        {ROPE_RAGGED, F16, 64, 4, 0, 72, 0, 1, 0, &COMPACT, &COMPACT, 3000, 0, 0, 0,
         "ragged D 72 interleaved, no k heads", 0, 0, 0},
        {ROPE_POS_IDS, BF16, 70, 2, 2, 64, 0, 0, 0, &SHIFTED, &COMPACT, 2000, 0, 0, 0,
         "pos_ids from a 2-byte-shifted q and k (element path)", 0, 0, 0},
        {ROPE_POS_IDS, F16, 40, 2, 1, 512, 0, 0, 0, &COMPACT, &COMPACT, 50000, 0, 0, 0,
         "D 512, 256 pairs", 0, 0, 0},
        {ROPE_TABLE, BF16, 30, 1, 1, 6, 4, 1, 0, &COMPACT, &COMPACT, 100, 0, 0, 0,
         "D 6, R 4 interleaved (element path)", 0, 0, 0},
        {ROPE_RAGGED, BF16, 128, 4, 2, 128, 0, 0, 0, &COMPACT, &COMPACT, 200000, 2.5, 5e5, 0,
         "ragged scale 2.5 theta 5e5", 0, 0, 0},
        {ROPE_POS_IDS, F16, 33, 1, 1, 2, 0, 0, 0, &COMPACT, &COMPACT, 100, 0, 0, 0,
         "one pair per row", 0, 0, 0},
        {ROPE_POS_IDS, BF16, 1, 32, 8, 128, 0, 0, 1, &COMPACT, NULL, 8191, 0, 0, 0,
         "one decode token, 32 + 8 heads, in place", 0, 0, 0},
        {ROPE_POS_IDS, BF16, 0, 4, 2, 128, 0, 0, 0, &COMPACT, &COMPACT, 10, 0, 0, 0, "no tokens", 0,
         0, 0},
        /* 4 units x 9 rows = 36 threads a token: 3 tokens fill 108 of a block's threads, and
         * the spare ones must not touch the next block's first token (in place, a second
         * rotation of the same elements). */
        {ROPE_RAGGED, F16, 90, 8, 1, 128, 64, 0, 1, &COMPACT, NULL, 5000, 0, 0, 0,
         "ragged f16 partial 64 of 128, in place, 8 + 1 heads (block not a multiple)", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_rope_case(&cases[i], cinfer_test_seed() + 4000 + i);
}

/* Bad arguments: a precise status naming the argument, and nothing written. */
static void test_rope_argument_errors(void **state) {
    (void)state;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 4100);
    const int64_t qs[3] = {4, 2, 64}, ks[3] = {4, 1, 64}, k5[3] = {5, 1, 64}, k32[3] = {4, 1, 32};
    field_t q, k, qo, kn, kd, q32, pos, pos5, indptr, offsets, table, table5, table16, big;
    field_make(&q, CINFER__DT_BF16, 3, qs, &COMPACT);
    field_make(&k, CINFER__DT_BF16, 3, ks, &COMPACT);
    field_make(&qo, CINFER__DT_BF16, 3, qs, &COMPACT);
    field_make(&kn, CINFER__DT_BF16, 3, k5, &COMPACT);
    field_make(&kd, CINFER__DT_BF16, 3, k32, &COMPACT);
    field_make(&q32, CINFER__DT_F32, 3, qs, &COMPACT);
    field_fill(&q, &rng, -1, 1);
    field_fill(&k, &rng, -1, 1);
    field_upload(&q);
    field_upload(&k);
    field_upload(&qo);
    const int32_t p4[4] = {0, 1, 2, 3}, p5[5] = {0, 1, 2, 3, 4}, ip[2] = {0, 4}, off[1] = {0};
    field_i32(&pos, p4, 4);
    field_i32(&pos5, p5, 5);
    field_i32(&indptr, ip, 2);
    field_i32(&offsets, off, 1);
    const int64_t ts[2] = {16, 64}, ts5[2] = {16, 5}, bs[3] = {4, 1, 2048};
    field_make(&table, CINFER__DT_F32, 2, ts, &COMPACT);
    field_make(&table5, CINFER__DT_F32, 2, ts5, &COMPACT);
    field_make(&table16, CINFER__DT_F16, 2, ts, &COMPACT);
    field_make(&big, CINFER__DT_BF16, 3, bs, &COMPACT);
    const cinfer_status_t INVALID = CINFER_STATUS_INVALID_ARGUMENT;
    DLTensor *Q = &q.tensor.t, *K = &k.tensor.t, *QO = &qo.tensor.t, *P = &pos.tensor.t;
    cinfer_rope_options_t o = CINFER_ROPE_OPTIONS_INIT;

    expect_error(cinfer_apply_rope_pos_ids(NULL, &o, Q, K, NULL, NULL, P, stream), INVALID, "ctx",
                 "ctx NULL");
    cinfer_rope_options_t bad = o;
    bad.size = 8;
    expect_error(cinfer_apply_rope_pos_ids(ctx, &bad, Q, K, NULL, NULL, P, stream), INVALID,
                 "options", "options size 8");
    bad = o;
    bad.rotary_dim = 3;
    expect_error(cinfer_apply_rope_pos_ids(ctx, &bad, Q, K, NULL, NULL, P, stream), INVALID,
                 "options->rotary_dim", "rotary_dim 3");
    bad.rotary_dim = 66;
    expect_error(cinfer_apply_rope_pos_ids(ctx, &bad, Q, K, NULL, NULL, P, stream), INVALID,
                 "options->rotary_dim", "rotary_dim 66 > head dim 64");
    bad = o;
    bad.interleave = 2;
    expect_error(cinfer_apply_rope_pos_ids(ctx, &bad, Q, K, NULL, NULL, P, stream), INVALID,
                 "options->interleave", "interleave 2");
    bad = o;
    bad.rope_scale = 0.0f;
    expect_error(cinfer_apply_rope_pos_ids(ctx, &bad, Q, K, NULL, NULL, P, stream), INVALID,
                 "options->rope_scale", "rope_scale 0");
    bad = o;
    bad.rope_theta = -1.0f;
    expect_error(cinfer_apply_rope_pos_ids(ctx, &bad, Q, K, NULL, NULL, P, stream), INVALID,
                 "options->rope_theta", "rope_theta -1");
    cinfer_rope_options_t l = CINFER_LLAMA31_ROPE_OPTIONS_INIT;
    l.high_freq_factor = 1.0f;
    expect_error(cinfer_apply_llama31_rope_pos_ids(ctx, &l, Q, K, NULL, NULL, P, stream), INVALID,
                 "options->high_freq_factor", "high_freq_factor 1 = low_freq_factor");
    expect_error(cinfer_apply_rope_pos_ids(ctx, &o, &q32.tensor.t, K, NULL, NULL, P, stream),
                 INVALID, "q", "q float32");
    expect_error(cinfer_apply_rope_pos_ids(ctx, &o, Q, &kn.tensor.t, NULL, NULL, P, stream),
                 INVALID, "k", "k with 5 tokens for 4");
    expect_error(cinfer_apply_rope_pos_ids(ctx, &o, Q, &kd.tensor.t, NULL, NULL, P, stream),
                 INVALID, "k", "k with head dim 32 for 64");
    expect_error(cinfer_apply_rope_pos_ids(ctx, &o, Q, K, &kn.tensor.t, NULL, P, stream), INVALID,
                 "q_out", "q_out of k's shape");
    /* q_out over q's memory with other strides. */
    cinfer_test_tensor alias;
    const int64_t odd[3] = {64, 256, 1};
    cinfer_test_tensor_init(&alias, &q.buf, 0, 0, CINFER__DT_BF16, 3, qs, odd);
    expect_error(cinfer_apply_rope_pos_ids(ctx, &o, Q, K, &alias.t, NULL, P, stream), INVALID,
                 "q_out", "q_out aliasing q with other strides");
    expect_error(cinfer_apply_rope_pos_ids(ctx, &o, Q, K, QO, NULL, &pos5.tensor.t, stream),
                 INVALID, "pos_ids", "pos_ids [5] for 4 tokens");
    expect_error(cinfer_apply_rope(ctx, &o, Q, K, QO, NULL, &q.tensor.t, &offsets.tensor.t, stream),
                 INVALID, "indptr", "indptr bf16");
    expect_error(
        cinfer_apply_rope(ctx, &o, Q, K, QO, NULL, &indptr.tensor.t, &pos.tensor.t, stream),
        INVALID, "offsets", "offsets [4] for a batch of 1");
    expect_error(
        cinfer_apply_rope_with_cos_sin_cache(ctx, Q, K, QO, NULL, P, &table16.tensor.t, 0, stream),
        INVALID, "cos_sin_cache", "cos_sin_cache f16");
    expect_error(
        cinfer_apply_rope_with_cos_sin_cache(ctx, Q, K, QO, NULL, P, &table5.tensor.t, 0, stream),
        INVALID, "cos_sin_cache", "cos_sin_cache width 5");
    expect_error(cinfer_apply_rope_with_cos_sin_cache(ctx, Q, &kd.tensor.t, NULL, NULL, P,
                                                      &table.tensor.t, 0, stream),
                 INVALID, "k", "k with head dim 32");
    expect_error(cinfer_apply_rope_with_cos_sin_cache(ctx, Q, K, QO, NULL, &pos5.tensor.t,
                                                      &table.tensor.t, 0, stream),
                 INVALID, "positions", "positions [5] for 4 tokens");
    expect_error(
        cinfer_apply_rope_with_cos_sin_cache(ctx, Q, K, QO, NULL, P, &table.tensor.t, 3, stream),
        INVALID, "interleave", "interleave 3");
    expect_error(
        cinfer_apply_rope_pos_ids(ctx, &o, &big.tensor.t, &big.tensor.t, NULL, NULL, P, stream),
        CINFER_STATUS_UNSUPPORTED, "q", "head dim 2048");
    field_expect_kept(&q, "q", "argument errors");
    field_expect_kept(&k, "k", "argument errors");
    field_expect_kept(&qo, "q_out", "argument errors");
    field_t *all[] = {&q,    &k,      &qo,      &kn,    &kd,     &q32,     &pos,
                      &pos5, &indptr, &offsets, &table, &table5, &table16, &big};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        field_free(all[i]);
}

/* ---------------------------------------------------------------------------------------------
 * packbits and segment_packbits
 * ------------------------------------------------------------------------------------------- */

/* Random bytes, half of them 0 and the others any nonzero value (all of which mean true). */
static void fill_bools(field_t *f, cinfer_test_rng *rng) {
    for (int64_t e = 0; e < f->phys_count; e++) {
        const uint64_t r = cinfer_test_rng_next(rng);
        f->host[f->shift + e] = r & 1 ? (unsigned char)(1 + (r >> 8) % 255) : 0;
    }
}

static void expect_u8(field_t *f, const uint8_t *want, int64_t n, const char *name,
                      const char *desc) {
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&f->buf));
    field_download(f);
    for (int64_t i = 0; i < n; i++) {
        const unsigned got = f->host[f->shift + field_phys(f, i)];
        if (got != want[i])
            cinfer_test_fail_at(__FILE__, __LINE__,
                                "%s of %s: byte %" PRId64 " is 0x%02x, "
                                "expected 0x%02x",
                                name, desc, i, got, want[i]);
    }
}

static void test_packbits(void **state) {
    (void)state;
    static const int64_t lengths[] = {1, 7, 8, 9, 127, 128, 129, 1000, 2053, 4096, 20000};
    /* x at a 16-byte boundary (16-byte path) or one byte off (byte path), y likewise. */
    static const layout_t ONE_OFF = {{0}, {0}, 1};
    int k = 0;
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        for (int shifted = 0; shifted < 2; shifted++) {
            for (int big = 0; big < 2; big++, k++) {
                const uint64_t seed = cinfer_test_seed() + 5000 + (uint64_t)k;
                cinfer_test_rng rng;
                cinfer_test_rng_init(&rng, seed);
                const int64_t n = lengths[li], x_shape[1] = {n}, y_shape[1] = {(n + 7) / 8};
                field_t x, y;
                field_make(&x, CINFER__DT_U8, 1, x_shape, shifted ? &ONE_OFF : &COMPACT);
                field_make(&y, CINFER__DT_U8, 1, y_shape, shifted && big ? &ONE_OFF : &COMPACT);
                fill_bools(&x, &rng);
                field_upload(&x);
                field_upload(&y);
                uint8_t *want = cinfer_test_xmalloc((size_t)y_shape[0]);
                assert_int_equal(cinfer__ref_packbits(field_base(&x, x.host), n, big, want),
                                 CINFER__REF_OK);
                CINFER_TEST_OK(cinfer_packbits(ctx, &x.tensor.t,
                                               big ? CINFER_BITORDER_BIG : CINFER_BITORDER_LITTLE,
                                               &y.tensor.t, stream));
                CINFER_TEST_SYNC(stream);
                char desc[128];
                snprintf(desc, sizeof desc, "packbits n %" PRId64 "%s%s (seed 0x%016" PRIx64 ")", n,
                         shifted ? " shifted" : "", big ? " big" : " little", seed);
                expect_u8(&y, want, y_shape[0], "y", desc);
                field_expect_kept(&x, "x", desc);
                free(want);
                field_free(&x);
                field_free(&y);
            }
        }
    }
    /* n = 0: nothing to do. */
    const int64_t zero[1] = {0};
    field_t x, y;
    field_make(&x, CINFER__DT_U8, 1, zero, &COMPACT);
    field_make(&y, CINFER__DT_U8, 1, zero, &COMPACT);
    CINFER_TEST_OK(cinfer_packbits(ctx, &x.tensor.t, CINFER_BITORDER_LITTLE, &y.tensor.t, stream));
    CINFER_TEST_SYNC(stream);
    field_free(&x);
    field_free(&y);
}

static void test_segment_packbits(void **state) {
    (void)state;
    for (int c = 0; c < 12; c++) {
        const uint64_t seed = cinfer_test_seed() + 5100 + c;
        cinfer_test_rng rng;
        cinfer_test_rng_init(&rng, seed);
        const int big = c % 2;
        /* Batches of 0..40 segments of 0..40 elements (every sixth a multiple of 8, every fifth
         * empty), starting at 0..5; x has 3 elements past the last segment. */
        const int64_t batch = c == 0 ? 0 : (int64_t)cinfer_test_rng_below(&rng, 41);
        int32_t *indptr = cinfer_test_xmalloc((size_t)(batch + 1) * sizeof(int32_t));
        indptr[0] = (int32_t)cinfer_test_rng_below(&rng, 6);
        for (int64_t s = 0; s < batch; s++) {
            int32_t len = (int32_t)cinfer_test_rng_below(&rng, 41);
            if (s % 6 == 1)
                len = len / 8 * 8;
            if (s % 5 == 2)
                len = 0;
            indptr[s + 1] = indptr[s] + len;
        }
        const int64_t n = indptr[batch] + 3;
        int64_t total = 0;
        for (int64_t s = 0; s < batch; s++)
            total += (indptr[s + 1] - indptr[s] + 7) / 8;
        /* Capacity: exactly the packed size, 7 spare bytes, or 2 short (bytes past it dropped). */
        const int64_t cap = c % 3 == 0   ? total
                            : c % 3 == 1 ? total + 7
                                         : (total > 2 ? total - 2 : 0);
        const int64_t x_shape[1] = {n}, y_shape[1] = {cap}, i_shape[1] = {batch + 1};
        field_t x, y, fi, fo;
        field_make(&x, CINFER__DT_U8, 1, x_shape, &COMPACT);
        field_make(&y, CINFER__DT_U8, 1, y_shape, &COMPACT);
        field_make(&fo, CINFER__DT_I32, 1, i_shape, &COMPACT);
        field_i32(&fi, indptr, batch + 1);
        fill_bools(&x, &rng);
        field_upload(&x);
        field_upload(&y);
        field_upload(&fo);
        uint8_t *want = cinfer_test_xmalloc((size_t)cap);
        memset(want, CINFER_TEST_POISON_BYTE, (size_t)cap);
        int32_t *want_indptr = cinfer_test_xmalloc((size_t)(batch + 1) * sizeof(int32_t));
        assert_int_equal(cinfer__ref_segment_packbits(field_base(&x, x.host), n, batch, indptr, big,
                                                      want, cap, want_indptr),
                         CINFER__REF_OK);
        assert_int_equal(want_indptr[batch], total);
        CINFER_TEST_OK(cinfer_segment_packbits(ctx, &x.tensor.t, &fi.tensor.t,
                                               big ? CINFER_BITORDER_BIG : CINFER_BITORDER_LITTLE,
                                               &y.tensor.t, &fo.tensor.t, stream));
        CINFER_TEST_SYNC(stream);
        char desc[160];
        snprintf(desc, sizeof desc,
                 "segment_packbits batch %" PRId64 ", %" PRId64 " packed bytes, capacity %" PRId64
                 "%s (seed 0x%016" PRIx64 ")",
                 batch, total, cap, big ? " big" : " little", seed);
        /* Bytes past the packed size keep the poison. */
        expect_u8(&y, want, cap, "y", desc);
        expect_i32(&fo, want_indptr, batch + 1, "indptr_new", desc);
        field_expect_kept(&x, "x", desc);
        field_expect_kept(&fi, "indptr", desc);
        free(want);
        free(want_indptr);
        free(indptr);
        field_free(&x);
        field_free(&y);
        field_free(&fi);
        field_free(&fo);
    }
}

static void test_packbits_argument_errors(void **state) {
    (void)state;
    const int64_t s9[1] = {9}, s2[1] = {2}, s3[1] = {3}, s33[2] = {3, 3};
    field_t x, y, y3, xh, x2, ip;
    field_make(&x, CINFER__DT_U8, 1, s9, &COMPACT);
    field_make(&y, CINFER__DT_U8, 1, s2, &COMPACT);
    field_make(&y3, CINFER__DT_U8, 1, s3, &COMPACT);
    field_make(&xh, CINFER__DT_F16, 1, s9, &COMPACT);
    field_make(&x2, CINFER__DT_U8, 2, s33, &COMPACT);
    const int32_t indptr[2] = {0, 9};
    field_i32(&ip, indptr, 2);
    const cinfer_status_t INVALID = CINFER_STATUS_INVALID_ARGUMENT;
    const cinfer_bitorder_t L = CINFER_BITORDER_LITTLE;
    expect_error(cinfer_packbits(NULL, &x.tensor.t, L, &y.tensor.t, stream), INVALID, "ctx",
                 "ctx NULL");
    expect_error(cinfer_packbits(ctx, &xh.tensor.t, L, &y.tensor.t, stream), INVALID, "x", "x f16");
    expect_error(cinfer_packbits(ctx, &x2.tensor.t, L, &y.tensor.t, stream), INVALID, "x", "x 2-d");
    expect_error(cinfer_packbits(ctx, &x.tensor.t, L, &y3.tensor.t, stream), INVALID, "y",
                 "y [3] for 9 elements");
    expect_error(cinfer_packbits(ctx, &x.tensor.t, (cinfer_bitorder_t)2, &y.tensor.t, stream),
                 INVALID, "bitorder", "bitorder 2");
    expect_error(cinfer_segment_packbits(ctx, &x.tensor.t, &ip.tensor.t, L, &y.tensor.t,
                                         &y3.tensor.t, stream),
                 INVALID, "indptr_new", "indptr_new uint8");
    expect_error(cinfer_segment_packbits(ctx, &x.tensor.t, &ip.tensor.t, L, &y.tensor.t,
                                         &ip.tensor.t, stream),
                 INVALID, "indptr_new", "indptr_new the same memory as indptr");
    DLTensor shifted = ip.tensor.t; /* indptr's second entry onwards (checked, never launched) */
    shifted.byte_offset += sizeof(int32_t);
    expect_error(
        cinfer_segment_packbits(ctx, &x.tensor.t, &ip.tensor.t, L, &y.tensor.t, &shifted, stream),
        INVALID, "indptr_new", "indptr_new overlapping indptr by one entry");
    expect_error(cinfer_segment_packbits(ctx, &x.tensor.t, &y.tensor.t, L, &y.tensor.t,
                                         &ip.tensor.t, stream),
                 INVALID, "indptr", "indptr uint8");
    /* A shape the library must not read past: a negative size, a NULL shape array. */
    x.tensor.t.shape[0] = -5;
    expect_error(cinfer_packbits(ctx, &x.tensor.t, L, &y.tensor.t, stream), INVALID, "x", "x [-5]");
    field_tensor(&x);
    x.tensor.t.shape = NULL;
    expect_error(cinfer_packbits(ctx, &x.tensor.t, L, &y.tensor.t, stream), INVALID, "x",
                 "x with a NULL shape");
    field_tensor(&x);
    field_expect_kept(&y, "y", "argument errors");
    field_expect_kept(&ip, "indptr", "argument errors");
    field_t *all[] = {&x, &y, &y3, &xh, &x2, &ip};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        field_free(all[i]);
}

/* ---------------------------------------------------------------------------------------------
 * CUDA graphs
 * ------------------------------------------------------------------------------------------- */

/* One step's RoPE and append captured in a CUDA graph after a first (loading) call, replayed on
 * new data in the same buffers: the functions neither allocate nor synchronize, so the replay
 * computes the new step. */
static void test_graph_capture(void **state) {
    (void)state;
    const uint64_t seed = cinfer_test_seed() + 6000;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    const cinfer__cuda_t *cu;
    CINFER_TEST_OK(cinfer__cuda_get(&cu));
    table_t t;
    table_make(&t, &rng, 4, 16, 60, 0);
    const int64_t H = 2, D = 64, q_shape[3] = {t.nnz, 4, D}, kv_shape[3] = {t.nnz, H, D};
    field_t q, k, v, qo, ko;
    field_make(&q, CINFER__DT_BF16, 3, q_shape, &COMPACT);
    field_make(&k, CINFER__DT_BF16, 3, kv_shape, &COMPACT);
    field_make(&v, CINFER__DT_BF16, 3, kv_shape, &COMPACT);
    field_make(&qo, CINFER__DT_BF16, 3, q_shape, &COMPACT);
    field_make(&ko, CINFER__DT_BF16, 3, kv_shape, &COMPACT);
    table_fields_t tf;
    table_fields_make(&tf, &t);
    caches_t c;
    caches_make(&c, &rng, CINFER__DT_BF16, CINFER_KV_LAYOUT_NHD, 0, t.max_pages, 16, H, D, NULL);
    cinfer_rope_options_t ro = CINFER_ROPE_OPTIONS_INIT;
    cinfer_append_options_t ao = CINFER_APPEND_OPTIONS_INIT;
    /* The step: rotate q and k by their positions into q_out and k_out, append k_out and v. */
#define STEP()                                                                                     \
    do {                                                                                           \
        CINFER_TEST_OK(cinfer_apply_rope_pos_ids(ctx, &ro, &q.tensor.t, &k.tensor.t, &qo.tensor.t, \
                                                 &ko.tensor.t, &tf.positions.tensor.t, stream));   \
        CINFER_TEST_OK(cinfer_append_paged_kv_cache(                                               \
            ctx, &ao, &ko.tensor.t, &v.tensor.t, &tf.batch_indices.tensor.t,                       \
            &tf.positions.tensor.t, &c.k.tensor.t, &c.v.tensor.t, &tf.kv_indices.tensor.t,         \
            &tf.kv_indptr.tensor.t, &tf.kv_last.tensor.t, NULL, stream));                          \
    } while (0)
    STEP();
    CINFER_TEST_SYNC(stream);
    CUgraph graph;
    CUgraphExec exec;
    assert_int_equal(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                     CUDA_SUCCESS);
    STEP();
    assert_int_equal(cu->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
#undef STEP
    assert_int_equal(cu->cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    for (int replay = 0; replay < 2; replay++) {
        field_t *fs[3] = {&q, &k, &v};
        for (int i = 0; i < 3; i++) {
            field_fill(fs[i], &rng, -2.0, 2.0);
            field_upload(fs[i]);
        }
        CINFER_TEST_OK(cinfer_test_buf_poison(&qo.buf));
        CINFER_TEST_OK(cinfer_test_buf_poison(&ko.buf));
        memset(qo.before, CINFER_TEST_POISON_BYTE, qo.bytes);
        memset(ko.before, CINFER_TEST_POISON_BYTE, ko.bytes);
        field_upload(&c.k); /* the "before" of this replay */
        field_upload(&c.v);
        assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        CINFER_TEST_SYNC(stream);
        char desc[96];
        snprintf(desc, sizeof desc, "graph replay %d (seed 0x%016" PRIx64 ")", replay, seed);
        cinfer__ref_rope_t rope;
        memset(&rope, 0, sizeof rope);
        rope.rotary_dim = D;
        rope.rope_theta = 1e4;
        rope.rope_scale = 1.0;
        int64_t *pos = cinfer_test_xmalloc((size_t)t.nnz * sizeof(int64_t));
        uint8_t *kind = cinfer_test_xmalloc((size_t)t.nnz);
        for (int64_t i = 0; i < t.nnz; i++) {
            pos[i] = t.positions[i];
            kind[i] = 1;
        }
        double *q_ref = rope_reference(&q, &rope, pos, kind, NULL, 0);
        double *k_ref = rope_reference(&k, &rope, pos, kind, NULL, 0);
        expect_rope(&qo, &q, q_ref, D, "q_out", desc);
        expect_rope(&ko, &k, k_ref, D, "k_out", desc);
        /* The cache holds the rotated k as the GPU rounded it: the reference appends k_out. */
        memcpy(ko.before, ko.host, ko.bytes);
        expect_append(&c, &t, &ko, &v, H, D, 1.0, 1.0, desc);
        free(q_ref);
        free(k_ref);
        free(pos);
        free(kind);
    }
    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    caches_free(&c);
    table_fields_free(&tf);
    field_t *all[] = {&q, &k, &v, &qo, &ko};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        field_free(all[i]);
    table_free(&t);
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

int main(void) {
    int rc = cinfer_test_gpu_setup(&ctx);
    if (rc)
        return rc;
    if (cinfer_test_stream_create(&stream) != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "error: %s\n", cinfer_last_error());
        cinfer_test_gpu_teardown(ctx);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_append_argument_errors, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_append_empty, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_append_sweep, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_append_error_flags, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_append_fp8_special_values, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_batch_indices_positions, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_seq_lens, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_rope_argument_errors, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_rope_sweep, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_packbits_argument_errors, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_packbits, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_segment_packbits, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_graph_capture, cinfer_test_teardown_buffers),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cinfer_test_stream_destroy(stream);
    cinfer_test_gpu_teardown(ctx);
    /* Never 77 by accident: that code means "skipped" to ctest. */
    return failed ? 1 : 0;
}
