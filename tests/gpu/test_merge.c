/*
 * The merge kernels (cinfer_merge_state, cinfer_merge_state_in_place, cinfer_merge_states)
 * against the float64 CPU reference (src/ref/ref_merge.c).
 *
 * Every tensor is a "field": a view of some shape inside a device allocation that may be larger
 * (padding in any dimension, an offset origin, a data pointer moved by 2 bytes), with canary zones
 * around the allocation. Inputs are random values encoded on the host (round to nearest even) and
 * the reference is given exactly the decoded values the GPU reads. Outputs are poisoned (0xFF,
 * NaN) before each call; afterwards the view must match the reference, every byte of the
 * allocation outside the view must be as it was, every input must be unchanged, and the canaries
 * must be intact.
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

static cinfer_context_t *ctx;
static CUstream stream; /* non-blocking, made in main() */

/* ---------------------------------------------------------------------------------------------
 * Tolerances
 * ------------------------------------------------------------------------------------------- */

/* Values: the outputs are convex combinations of inputs in [-2, 2] computed in fp32 and rounded
 * once, so the error is at most half an ulp of the output dtype at magnitude < 2 plus fp32 noise;
 * the bounds allow two ulps (bf16: 2 * 2^-7; fp16: 2 * 2^-10, rounded up). */
static double rel_l2_tol(cinfer__dtype_t dt) {
    return dt == CINFER__DT_BF16 ? 1e-2 : 2e-3;
}

static double max_abs_tol(cinfer__dtype_t dt) {
    return dt == CINFER__DT_BF16 ? 1.6e-2 : 2e-3;
}

/* LSE: |out - ref| <= LSE_TOL * (1 + |ref|); fp32 rounding of an lse near 20 is ~2e-6. */
#define LSE_TOL 1e-4

/* The merged values have a root mean square of roughly 0.5 or more; a reference norm below
 * 0.05 per element only happens for degenerate tiny cases, where rounding noise would otherwise
 * dominate the relative error. */
#define REF_NORM_FLOOR_PER_ELEMENT 0.05

/* ---------------------------------------------------------------------------------------------
 * Host helpers
 * ------------------------------------------------------------------------------------------- */

/* True when msg names arg as tensor_check and merge.c do: "arg: ..." or "arg is ...", with arg
 * not part of a longer identifier (so "v" does not match "v_a: ..."). */
static int names_argument(const char *msg, const char *arg) {
    size_t len = strlen(arg);
    for (const char *p = strstr(msg, arg); p; p = strstr(p + 1, arg)) {
        int starts = p == msg || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int ends = p[len] == ':' || strncmp(p + len, " is", 3) == 0;
        if (starts && ends)
            return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Fields: a view inside a padded, canary-guarded device allocation, mirrored on the host
 * ------------------------------------------------------------------------------------------- */

/* Layouts (support/field.h); the zero layout is a compact tensor. */
static const layout_t COMPACT = {{0}, {0}, 0};

/* [n, H, D] inside [n + 1, H + 3, D + 8], starting at (1, 2, 8): padding before and after the
 * view in every dim; the 8-element head-dim offset keeps 16-byte alignment. */
static const layout_t PADDED_3D = {{1, 3, 8}, {1, 2, 8}, 0};
/* [n, H] inside [n + 1, H + 5] at (1, 3): a row stride larger than H. */
static const layout_t PADDED_2D = {{1, 5}, {1, 3}, 0};
/* [n, S, H, D] inside [n + 1, S + 1, H + 3, D + 8] at (1, 1, 2, 8). */
static const layout_t PADDED_4D = {{1, 1, 3, 8}, {1, 1, 2, 8}, 0};
/* [n, S, H] inside [n, S + 2, H + 5] at (0, 1, 3). */
static const layout_t PADDED_3D_LSE = {{0, 2, 5}, {0, 1, 3}, 0};
/* Rows of D + 4 elements: for D % 8 == 0 the row stride is 8 bytes off a 16-byte multiple. */
static const layout_t ODD_STRIDE_3D = {{0, 0, 4}, {0, 0, 0}, 0};
static const layout_t ODD_STRIDE_4D = {{0, 0, 0, 4}, {0, 0, 0, 0}, 0};
/* The data pointer moved by 2 bytes: element-aligned, not 16-byte aligned. */
static const layout_t SHIFTED = {{0}, {0}, 2};

/* The view's values as contiguous doubles (malloc'ed), what the reference is given. */
static double *field_exact(const field_t *f) {
    double *x = cinfer_test_xmalloc((size_t)f->count * sizeof *x);
    for (int64_t i = 0; i < f->count; i++)
        x[i] = field_get(f, i);
    return x;
}

/* The view's raw elements, contiguous (malloc'ed), for the comparison helpers. */
static void *field_gather(const field_t *f) {
    unsigned char *raw = cinfer_test_xmalloc((size_t)f->count * f->esize);
    for (int64_t i = 0; i < f->count; i++)
        memcpy(raw + i * f->esize, f->host + f->shift + field_phys(f, i) * f->esize, f->esize);
    return raw;
}

/* Fails unless every payload byte (outside the view only, or all) equals its "before" byte and
 * the canaries are intact. Downloads first. */
static void field_expect_kept(field_t *f, int outside_view_only, const char *name,
                              const char *desc) {
    cinfer_status_t st = cinfer_test_buf_check_canaries(&f->buf);
    if (st != CINFER_STATUS_SUCCESS)
        cinfer_test_fail_at(__FILE__, __LINE__, "%s of %s: %s", name, desc, cinfer_last_error());
    field_download(f);
    for (size_t b = 0; b < f->bytes; b++) {
        int64_t elem = b < f->shift ? -1 : (int64_t)((b - f->shift) / f->esize);
        if (outside_view_only && elem >= 0 && f->inview[elem])
            continue;
        if (f->host[b] != f->before[b])
            cinfer_test_fail_at(__FILE__, __LINE__,
                                "%s of %s: payload byte %zu (allocation element %" PRId64
                                ", %s the view) changed from 0x%02x to 0x%02x",
                                name, desc, b, elem,
                                elem >= 0 && f->inview[elem] ? "inside" : "outside", f->before[b],
                                f->host[b]);
    }
}

/* Downloads an output field and compares its view with ref[count]; checks the rest is kept. */
static void expect_values(field_t *f, const double *ref, const char *name, const char *desc,
                          uint64_t seed) {
    field_expect_kept(f, 1, name, desc);
    void *raw = field_gather(f);
    CINFER_TEST_ASSERT_CLOSE(
        cinfer_test_compare(f->dtype, raw, ref, f->count, rel_l2_tol(f->dtype),
                            max_abs_tol(f->dtype),
                            REF_NORM_FLOOR_PER_ELEMENT * sqrt((double)f->count)),
        name, desc, seed);
    free(raw);
}

static void expect_lse(field_t *f, const double *ref, const char *name, const char *desc,
                       uint64_t seed) {
    field_expect_kept(f, 1, name, desc);
    float *raw = field_gather(f);
    CINFER_TEST_ASSERT_LSE_CLOSE(cinfer_test_compare_lse(raw, ref, f->count, LSE_TOL), name, desc,
                                 seed);
    free(raw);
}

/* ---------------------------------------------------------------------------------------------
 * Input patterns
 * ------------------------------------------------------------------------------------------- */

/*
 * LSE of two states over pairs (row i, head h), r = i * H + h, after random fill in [-20, 20]:
 * every head of rows i % 5 == 2, and pairs r % 10 == 1, are empty in both states (expect
 * (0, -inf)); r % 10 == 4 has only state b and r % 10 == 7 only state a (expect the other state
 * exactly); r % 10 == 9 has equal lse (weights 1/2 each).
 */
static void lse_pattern_two(field_t *la, field_t *lb, int64_t n, int64_t h) {
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < h; j++) {
            int64_t r = i * h + j;
            if (i % 5 == 2 || r % 10 == 1) {
                field_set(la, r, -INFINITY);
                field_set(lb, r, -INFINITY);
            } else if (r % 10 == 4) {
                field_set(la, r, -INFINITY);
            } else if (r % 10 == 7) {
                field_set(lb, r, -INFINITY);
            } else if (r % 10 == 9) {
                field_set(lb, r, field_get(la, r));
            }
        }
    }
}

/*
 * LSE of num_states states [n, S, H]: all states empty for rows i % 5 == 2 and pairs
 * r % 10 == 1; exactly one non-empty state (k = r / 10 % S) for r % 10 == 4; otherwise each state
 * is empty with probability 1/5.
 */
static void lse_pattern_many(field_t *l, cinfer_test_rng *rng, int64_t n, int64_t s, int64_t h) {
    if (s == 0)
        return;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < h; j++) {
            int64_t r = i * h + j;
            for (int64_t k = 0; k < s; k++) {
                int empty;
                if (i % 5 == 2 || r % 10 == 1)
                    empty = 1;
                else if (r % 10 == 4)
                    empty = k != (r / 10) % s;
                else
                    empty = cinfer_test_rng_below(rng, 5) == 0;
                if (empty)
                    field_set(l, (i * s + k) * h + j, -INFINITY);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * merge_state
 * ------------------------------------------------------------------------------------------- */

typedef struct state_case {
    cinfer__dtype_t dtype;
    int64_t n, h, d;
    const layout_t *v_a, *lse_a, *v_b, *lse_b, *v_out, *lse_out;
    int alias;          /* 0: separate outputs; 1: outputs are (v_a, lse_a); 2: (v_b, lse_b) */
    int legacy_stream;  /* run on the NULL stream instead of the test stream */
    const char *layout; /* for messages */
} state_case;

/* A case with compact tensors, separate outputs, on the test stream. */
static state_case state_compact(cinfer__dtype_t dtype, int64_t n, int64_t h, int64_t d,
                                const char *layout) {
    state_case c = {dtype,    n,        h,        d, &COMPACT, &COMPACT, &COMPACT,
                    &COMPACT, &COMPACT, &COMPACT, 0, 0,        layout};
    return c;
}

static void run_merge_state(const state_case *c, uint64_t seed) {
    char desc[256];
    cinfer_test_rng rng;
    field_t va, la, vb, lb, vo_own, lo_own;
    field_t *vo = &vo_own, *lo = &lo_own;
    const int64_t vshape[3] = {c->n, c->h, c->d}, lshape[2] = {c->n, c->h};
    CUstream s = c->legacy_stream ? NULL : stream;

    snprintf(desc, sizeof desc, "merge_state %s n=%" PRId64 " H=%" PRId64 " D=%" PRId64 " %s%s%s",
             cinfer__dtype_name(c->dtype), c->n, c->h, c->d, c->layout,
             c->alias == 1   ? ", out aliases a"
             : c->alias == 2 ? ", out aliases b"
                             : "",
             c->legacy_stream ? ", NULL stream" : "");
    cinfer_test_rng_init(&rng, seed);
    field_make(&va, c->dtype, 3, vshape, c->v_a);
    field_make(&la, CINFER__DT_F32, 2, lshape, c->lse_a);
    field_make(&vb, c->dtype, 3, vshape, c->v_b);
    field_make(&lb, CINFER__DT_F32, 2, lshape, c->lse_b);
    field_fill(&va, &rng, -2.0, 2.0);
    field_fill(&vb, &rng, -2.0, 2.0);
    field_fill(&la, &rng, -20.0, 20.0);
    field_fill(&lb, &rng, -20.0, 20.0);
    lse_pattern_two(&la, &lb, c->n, c->h);
    field_upload(&va);
    field_upload(&la);
    field_upload(&vb);
    field_upload(&lb);
    if (c->alias == 1) {
        vo = &va, lo = &la;
    } else if (c->alias == 2) {
        vo = &vb, lo = &lb;
    } else {
        field_make(&vo_own, c->dtype, 3, vshape, c->v_out);
        field_make(&lo_own, CINFER__DT_F32, 2, lshape, c->lse_out);
    }

    double *xa = field_exact(&va), *xla = field_exact(&la);
    double *xb = field_exact(&vb), *xlb = field_exact(&lb);
    double *rv = cinfer_test_xmalloc((size_t)va.count * sizeof *rv),
           *rl = cinfer_test_xmalloc((size_t)la.count * sizeof *rl);
    assert_int_equal(cinfer__ref_merge_state(c->n, c->h, c->d, xa, xla, xb, xlb, rv, rl),
                     CINFER__REF_OK);

    CINFER_TEST_OK(cinfer_merge_state(ctx, &va.tensor.t, &la.tensor.t, &vb.tensor.t, &lb.tensor.t,
                                      &vo->tensor.t, &lo->tensor.t, s));
    CINFER_TEST_SYNC(s);

    expect_values(vo, rv, "v_out", desc, seed);
    expect_lse(lo, rl, "lse_out", desc, seed);
    if (c->alias != 1) {
        field_expect_kept(&va, 0, "v_a", desc);
        field_expect_kept(&la, 0, "lse_a", desc);
    }
    if (c->alias != 2) {
        field_expect_kept(&vb, 0, "v_b", desc);
        field_expect_kept(&lb, 0, "lse_b", desc);
    }

    free(xa), free(xla), free(xb), free(xlb), free(rv), free(rl);
    field_free(&va), field_free(&la), field_free(&vb), field_free(&lb);
    if (c->alias == 0)
        field_free(&vo_own), field_free(&lo_own);
}

static const cinfer__dtype_t DTYPES[] = {CINFER__DT_F16, CINFER__DT_BF16};
static const int64_t HEAD_DIMS[] = {1, 7, 64, 100, 128, 256, 512};
static const int64_t ROWS[] = {1, 3, 257};
static const int64_t HEADS[] = {1, 5, 32};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Every dtype x head dim x rows x heads, compact tensors. */
static void test_merge_state_sweep(void **state) {
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(HEAD_DIMS); b++)
            for (size_t c = 0; c < COUNT(ROWS); c++)
                for (size_t d = 0; d < COUNT(HEADS); d++) {
                    state_case sc =
                        state_compact(DTYPES[a], ROWS[c], HEADS[d], HEAD_DIMS[b], "compact");
                    run_merge_state(&sc, cinfer_test_seed() + 1000 + k++);
                }
}

/* Views into padded allocations (strides > shape, offset origins), vector and scalar paths. */
static void test_merge_state_strided(void **state) {
    static const int64_t dims[] = {7, 64, 128, 256};
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(dims); b++) {
            state_case padded = state_compact(DTYPES[a], 257, 5, dims[b], "padded views");
            /* Only v_b/lse_b padded: each tensor's own strides are used, not v_a's for all. */
            state_case mixed =
                state_compact(DTYPES[a], 3, 32, dims[b], "v_b/lse_b padded, others compact");
            /* Rows 8 bytes off a 16-byte multiple: the vector path must not be taken. */
            state_case odd = state_compact(DTYPES[a], 3, 5, dims[b], "v_a row stride D+4");
            padded.v_a = padded.v_b = padded.v_out = &PADDED_3D;
            padded.lse_a = padded.lse_b = padded.lse_out = &PADDED_2D;
            mixed.v_b = &PADDED_3D;
            mixed.lse_b = &PADDED_2D;
            odd.v_a = &ODD_STRIDE_3D;
            run_merge_state(&padded, cinfer_test_seed() + 2000 + k++);
            run_merge_state(&mixed, cinfer_test_seed() + 2000 + k++);
            run_merge_state(&odd, cinfer_test_seed() + 2000 + k++);
        }
}

/* Data pointers moved by 2 bytes: element-aligned but not 16-byte aligned, so the kernel must use
 * scalar accesses (vec = 1) even when D % 8 == 0. */
static void test_merge_state_unaligned(void **state) {
    static const int64_t dims[] = {7, 64, 128};
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(dims); b++) {
            state_case all = state_compact(DTYPES[a], 257, 5, dims[b], "all values 2 bytes off");
            state_case only_b = state_compact(DTYPES[a], 3, 5, dims[b], "v_b 2 bytes off");
            state_case only_out = state_compact(DTYPES[a], 3, 5, dims[b], "v_out 2 bytes off");
            all.v_a = all.v_b = all.v_out = &SHIFTED;
            only_b.v_b = &SHIFTED;
            only_out.v_out = &SHIFTED;
            run_merge_state(&all, cinfer_test_seed() + 3000 + k++);
            run_merge_state(&only_b, cinfer_test_seed() + 3000 + k++);
            run_merge_state(&only_out, cinfer_test_seed() + 3000 + k++);
        }
}

/* v_out/lse_out are the very tensors v_a/lse_a (or v_b/lse_b): same pointers and strides. */
static void test_merge_state_alias(void **state) {
    static const int64_t dims[] = {7, 128, 512};
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(dims); b++)
            for (int alias = 1; alias <= 2; alias++) {
                state_case compact = state_compact(DTYPES[a], 257, 32, dims[b], "compact");
                /* Padded aliased views, on the legacy NULL stream. */
                state_case padded = state_compact(DTYPES[a], 3, 5, dims[b], "padded views");
                compact.alias = padded.alias = alias;
                padded.v_a = padded.v_b = &PADDED_3D;
                padded.lse_a = padded.lse_b = &PADDED_2D;
                padded.legacy_stream = 1;
                run_merge_state(&compact, cinfer_test_seed() + 4000 + k++);
                run_merge_state(&padded, cinfer_test_seed() + 4000 + k++);
            }
}

/* ---------------------------------------------------------------------------------------------
 * merge_state_in_place
 * ------------------------------------------------------------------------------------------- */

enum { MASK_NONE, MASK_MIXED, MASK_ALL_ZERO, MASK_ALL_ONE, MASK_MIXED_BOOL };

typedef struct in_place_case {
    cinfer__dtype_t dtype;
    int64_t n, h, d;
    const layout_t *v, *lse, *v_other, *lse_other;
    int mask;
    const char *layout;
} in_place_case;

static const char *mask_name(int mask) {
    switch (mask) {
    case MASK_MIXED:
        return "mask rows i % 3 != 1";
    case MASK_ALL_ZERO:
        return "mask all 0";
    case MASK_ALL_ONE:
        return "mask all 1";
    case MASK_MIXED_BOOL:
        return "mask rows i % 3 != 1 as DLPack bool";
    default:
        return "no mask";
    }
}

static in_place_case in_place_compact(cinfer__dtype_t dtype, int64_t n, int64_t h, int64_t d,
                                      int mask, const char *layout) {
    in_place_case c = {dtype, n, h, d, &COMPACT, &COMPACT, &COMPACT, &COMPACT, mask, layout};
    return c;
}

static void run_merge_in_place(const in_place_case *c, uint64_t seed) {
    char desc[256];
    cinfer_test_rng rng;
    field_t v, l, vo, lo, m;
    const int64_t vshape[3] = {c->n, c->h, c->d}, lshape[2] = {c->n, c->h}, mshape[1] = {c->n};
    uint8_t *mask = NULL;

    memset(&m, 0, sizeof m);

    snprintf(desc, sizeof desc,
             "merge_state_in_place %s n=%" PRId64 " H=%" PRId64 " D=%" PRId64 " %s, %s",
             cinfer__dtype_name(c->dtype), c->n, c->h, c->d, c->layout, mask_name(c->mask));
    cinfer_test_rng_init(&rng, seed);
    field_make(&v, c->dtype, 3, vshape, c->v);
    field_make(&l, CINFER__DT_F32, 2, lshape, c->lse);
    field_make(&vo, c->dtype, 3, vshape, c->v_other);
    field_make(&lo, CINFER__DT_F32, 2, lshape, c->lse_other);
    field_fill(&v, &rng, -2.0, 2.0);
    field_fill(&vo, &rng, -2.0, 2.0);
    field_fill(&l, &rng, -20.0, 20.0);
    field_fill(&lo, &rng, -20.0, 20.0);
    lse_pattern_two(&l, &lo, c->n, c->h);
    field_upload(&v);
    field_upload(&l);
    field_upload(&vo);
    field_upload(&lo);
    if (c->mask != MASK_NONE) {
        mask = cinfer_test_xmalloc((size_t)c->n);
        for (int64_t i = 0; i < c->n; i++)
            mask[i] = c->mask == MASK_ALL_ZERO  ? 0
                      : c->mask == MASK_ALL_ONE ? 1
                                                : (uint8_t)(i % 3 != 1);
        field_make(&m, CINFER__DT_U8, 1, mshape, &COMPACT);
        for (int64_t i = 0; i < c->n; i++)
            field_set(&m, i, mask[i]);
        field_upload(&m);
        if (c->mask == MASK_MIXED_BOOL)
            m.tensor.t.dtype.code = 6; /* kDLBool in DLPack 1.x, 8 bits */
    }

    double *xv = field_exact(&v), *xl = field_exact(&l);
    double *xvo = field_exact(&vo), *xlo = field_exact(&lo);
    assert_int_equal(cinfer__ref_merge_state_in_place(c->n, c->h, c->d, xv, xl, xvo, xlo, mask),
                     CINFER__REF_OK);

    CINFER_TEST_OK(cinfer_merge_state_in_place(ctx, &v.tensor.t, &l.tensor.t, &vo.tensor.t,
                                               &lo.tensor.t, mask ? &m.tensor.t : NULL, stream));
    CINFER_TEST_SYNC(stream);

    expect_values(&v, xv, "v", desc, seed);
    expect_lse(&l, xl, "lse", desc, seed);
    /* Rows the mask leaves out must be bit-identical, not merely close. */
    for (int64_t i = 0; mask && i < c->n; i++) {
        if (mask[i])
            continue;
        for (int64_t e = 0; e < c->h * c->d; e++) {
            int64_t p = field_phys(&v, i * c->h * c->d + e);
            if (memcmp(v.host + v.shift + p * v.esize, v.before + v.shift + p * v.esize, v.esize) !=
                0)
                cinfer_test_fail_at(
                    __FILE__, __LINE__,
                    "v of %s: masked-out row %" PRId64 " changed at element %" PRId64, desc, i, e);
        }
        for (int64_t j = 0; j < c->h; j++) {
            int64_t p = field_phys(&l, i * c->h + j);
            if (memcmp(l.host + p * 4, l.before + p * 4, 4) != 0)
                cinfer_test_fail_at(
                    __FILE__, __LINE__,
                    "lse of %s: masked-out row %" PRId64 " changed at head %" PRId64, desc, i, j);
        }
    }
    field_expect_kept(&vo, 0, "v_other", desc);
    field_expect_kept(&lo, 0, "lse_other", desc);
    if (mask)
        field_expect_kept(&m, 0, "mask", desc);

    free(xv), free(xl), free(xvo), free(xlo);
    field_free(&v), field_free(&l), field_free(&vo), field_free(&lo);
    if (mask)
        field_free(&m), free(mask);
}

static void test_merge_in_place_sweep(void **state) {
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(HEAD_DIMS); b++)
            for (size_t c = 0; c < COUNT(ROWS); c++)
                for (size_t d = 0; d < COUNT(HEADS); d++) {
                    in_place_case ic = in_place_compact(DTYPES[a], ROWS[c], HEADS[d], HEAD_DIMS[b],
                                                        MASK_NONE, "compact");
                    run_merge_in_place(&ic, cinfer_test_seed() + 5000 + k++);
                }
}

static void test_merge_in_place_mask(void **state) {
    static const int masks[] = {MASK_MIXED, MASK_ALL_ZERO, MASK_ALL_ONE, MASK_MIXED_BOOL};
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(HEAD_DIMS); b++)
            for (size_t c = 0; c < COUNT(ROWS); c++)
                for (size_t mi = 0; mi < COUNT(masks); mi++) {
                    in_place_case ic =
                        in_place_compact(DTYPES[a], ROWS[c], 5, HEAD_DIMS[b], masks[mi], "compact");
                    run_merge_in_place(&ic, cinfer_test_seed() + 6000 + k++);
                }
}

static void test_merge_in_place_strided(void **state) {
    static const int64_t dims[] = {7, 64, 128};
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(dims); b++) {
            in_place_case padded =
                in_place_compact(DTYPES[a], 257, 5, dims[b], MASK_MIXED, "padded views");
            in_place_case shifted =
                in_place_compact(DTYPES[a], 257, 5, dims[b], MASK_NONE, "v 2 bytes off");
            in_place_case other_shifted = in_place_compact(DTYPES[a], 3, 32, dims[b], MASK_MIXED,
                                                           "v_other 2 bytes off, lse_other padded");
            in_place_case odd =
                in_place_compact(DTYPES[a], 3, 5, dims[b], MASK_NONE, "v row stride D+4");
            padded.v = padded.v_other = &PADDED_3D;
            padded.lse = padded.lse_other = &PADDED_2D;
            shifted.v = &SHIFTED;
            other_shifted.v_other = &SHIFTED;
            other_shifted.lse_other = &PADDED_2D;
            odd.v = &ODD_STRIDE_3D;
            run_merge_in_place(&padded, cinfer_test_seed() + 7000 + k++);
            run_merge_in_place(&shifted, cinfer_test_seed() + 7000 + k++);
            run_merge_in_place(&other_shifted, cinfer_test_seed() + 7000 + k++);
            run_merge_in_place(&odd, cinfer_test_seed() + 7000 + k++);
        }
}

/* ---------------------------------------------------------------------------------------------
 * merge_states
 * ------------------------------------------------------------------------------------------- */

typedef struct states_case {
    cinfer__dtype_t dtype;
    int64_t n, s, h, d;
    const layout_t *v, *lse, *v_out, *lse_out;
    int no_lse_out; /* pass lse_out = NULL */
    const char *layout;
} states_case;

static states_case states_compact(cinfer__dtype_t dtype, int64_t n, int64_t s, int64_t h, int64_t d,
                                  const char *layout) {
    states_case c = {dtype, n, s, h, d, &COMPACT, &COMPACT, &COMPACT, &COMPACT, 0, layout};
    return c;
}

static void run_merge_states(const states_case *c, uint64_t seed) {
    char desc[256];
    cinfer_test_rng rng;
    field_t v, l, vo, lo;
    const int64_t vshape[4] = {c->n, c->s, c->h, c->d}, lshape[3] = {c->n, c->s, c->h};
    const int64_t oshape[3] = {c->n, c->h, c->d}, loshape[2] = {c->n, c->h};

    snprintf(desc, sizeof desc,
             "merge_states %s n=%" PRId64 " num_states=%" PRId64 " H=%" PRId64 " D=%" PRId64
             " %s%s",
             cinfer__dtype_name(c->dtype), c->n, c->s, c->h, c->d, c->layout,
             c->no_lse_out ? ", lse_out NULL" : "");
    cinfer_test_rng_init(&rng, seed);
    field_make(&v, c->dtype, 4, vshape, c->v);
    field_make(&l, CINFER__DT_F32, 3, lshape, c->lse);
    field_fill(&v, &rng, -2.0, 2.0);
    field_fill(&l, &rng, -20.0, 20.0);
    lse_pattern_many(&l, &rng, c->n, c->s, c->h);
    field_upload(&v);
    field_upload(&l);
    field_make(&vo, c->dtype, 3, oshape, c->v_out);
    field_make(&lo, CINFER__DT_F32, 2, loshape, c->lse_out);

    double *xv = field_exact(&v), *xl = field_exact(&l);
    double *rv = cinfer_test_xmalloc((size_t)vo.count * sizeof *rv),
           *rl = cinfer_test_xmalloc((size_t)lo.count * sizeof *rl);
    assert_int_equal(cinfer__ref_merge_states(c->n, c->s, c->h, c->d, xv, xl, rv, rl),
                     CINFER__REF_OK);

    CINFER_TEST_OK(cinfer_merge_states(ctx, &v.tensor.t, &l.tensor.t, &vo.tensor.t,
                                       c->no_lse_out ? NULL : &lo.tensor.t, stream));
    CINFER_TEST_SYNC(stream);

    expect_values(&vo, rv, "v_out", desc, seed);
    if (c->no_lse_out)
        field_expect_kept(&lo, 0, "lse_out (not passed)", desc);
    else
        expect_lse(&lo, rl, "lse_out", desc, seed);
    field_expect_kept(&v, 0, "v", desc);
    field_expect_kept(&l, 0, "lse", desc);

    free(xv), free(xl), free(rv), free(rl);
    field_free(&v), field_free(&l), field_free(&vo), field_free(&lo);
}

static const int64_t NUM_STATES[] = {0, 1, 2, 3, 7, 64};

static void test_merge_states_sweep(void **state) {
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++) {
        for (size_t b = 0; b < COUNT(HEAD_DIMS); b++) {
            /* Every state count at a moderate size, and the single-row, single-head extreme. */
            for (size_t s = 0; s < COUNT(NUM_STATES); s++) {
                states_case mid =
                    states_compact(DTYPES[a], 3, NUM_STATES[s], 5, HEAD_DIMS[b], "compact");
                states_case one =
                    states_compact(DTYPES[a], 1, NUM_STATES[s], 1, HEAD_DIMS[b], "compact");
                run_merge_states(&mid, cinfer_test_seed() + 8000 + k++);
                run_merge_states(&one, cinfer_test_seed() + 8000 + k++);
            }
            /* Many rows and heads (the reference is O(n S H D), so S stays small here). */
            states_case big = states_compact(DTYPES[a], 257, 3, 32, HEAD_DIMS[b], "compact");
            run_merge_states(&big, cinfer_test_seed() + 8000 + k++);
        }
        states_case many = states_compact(DTYPES[a], 257, 64, 5, 128, "compact");
        run_merge_states(&many, cinfer_test_seed() + 8000 + k++);
    }
}

static void test_merge_states_strided(void **state) {
    static const int64_t dims[] = {7, 64, 128};
    static const int64_t counts[] = {1, 3, 7};
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(dims); b++)
            for (size_t s = 0; s < COUNT(counts); s++) {
                states_case padded =
                    states_compact(DTYPES[a], 257, counts[s], 5, dims[b], "padded views");
                states_case shifted =
                    states_compact(DTYPES[a], 3, counts[s], 5, dims[b], "v 2 bytes off");
                states_case out_shifted =
                    states_compact(DTYPES[a], 3, counts[s], 32, dims[b], "v_out 2 bytes off");
                states_case odd =
                    states_compact(DTYPES[a], 3, counts[s], 5, dims[b], "v row stride D+4");
                padded.v = &PADDED_4D;
                padded.lse = &PADDED_3D_LSE;
                padded.v_out = &PADDED_3D;
                padded.lse_out = &PADDED_2D;
                shifted.v = &SHIFTED;
                out_shifted.v_out = &SHIFTED;
                out_shifted.no_lse_out = 1;
                odd.v = &ODD_STRIDE_4D;
                run_merge_states(&padded, cinfer_test_seed() + 9000 + k++);
                run_merge_states(&shifted, cinfer_test_seed() + 9000 + k++);
                run_merge_states(&out_shifted, cinfer_test_seed() + 9000 + k++);
                run_merge_states(&odd, cinfer_test_seed() + 9000 + k++);
            }
}

/* num_states 0: every output row is (0, -inf), whatever v's data pointer is (even NULL, since the
 * tensor has no elements). */
static void test_merge_states_zero_states(void **state) {
    uint64_t k = 0;
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (size_t b = 0; b < COUNT(HEAD_DIMS); b++)
            for (int null_data = 0; null_data <= 1; null_data++) {
                char desc[256];
                field_t v, l, vo, lo;
                const int64_t n = 3, h = 5, d = HEAD_DIMS[b];
                const int64_t vshape[4] = {n, 0, h, d}, lshape[3] = {n, 0, h};
                const int64_t oshape[3] = {n, h, d}, loshape[2] = {n, h};
                const uint64_t seed = cinfer_test_seed() + 10000 + k++;

                snprintf(desc, sizeof desc, "merge_states %s n=3 num_states=0 H=5 D=%" PRId64 "%s",
                         cinfer__dtype_name(DTYPES[a]), d, null_data ? ", v/lse data NULL" : "");
                field_make(&v, DTYPES[a], 4, vshape, &COMPACT);
                field_make(&l, CINFER__DT_F32, 3, lshape, &COMPACT);
                field_make(&vo, DTYPES[a], 3, oshape, &PADDED_3D);
                field_make(&lo, CINFER__DT_F32, 2, loshape, &PADDED_2D);
                if (null_data)
                    v.tensor.t.data = NULL, l.tensor.t.data = NULL;
                double *rv = cinfer_test_xmalloc((size_t)vo.count * sizeof *rv);
                double *rl = cinfer_test_xmalloc((size_t)lo.count * sizeof *rl);
                for (int64_t i = 0; i < vo.count; i++)
                    rv[i] = 0.0;
                for (int64_t i = 0; i < lo.count; i++)
                    rl[i] = -INFINITY;

                CINFER_TEST_OK(cinfer_merge_states(ctx, &v.tensor.t, &l.tensor.t, &vo.tensor.t,
                                                   &lo.tensor.t, stream));
                CINFER_TEST_SYNC(stream);
                expect_values(&vo, rv, "v_out", desc, seed);
                expect_lse(&lo, rl, "lse_out", desc, seed);
                field_expect_kept(&v, 0, "v", desc);
                field_expect_kept(&l, 0, "lse", desc);

                free(rv), free(rl);
                field_free(&v), field_free(&l), field_free(&vo), field_free(&lo);
            }
}

/* ---------------------------------------------------------------------------------------------
 * Zero rows: success, nothing written
 * ------------------------------------------------------------------------------------------- */

/* n = 0 for all three operations. The allocations are padded by one row, so a write anywhere
 * would land in memory the test watches; a second call passes NULL data pointers, which an empty
 * tensor may have. */
static void test_merge_zero_rows(void **state) {
    for (size_t a = 0; a < COUNT(DTYPES); a++)
        for (int null_data = 0; null_data <= 1; null_data++) {
            char desc[128];
            const cinfer__dtype_t dt = DTYPES[a];
            const int64_t h = 5, d = 64, s = 3;
            const int64_t v3[3] = {0, h, d}, l2[2] = {0, h}, v4[4] = {0, s, h, d},
                          l3[3] = {0, s, h};
            const int64_t m1[1] = {0};
            const layout_t row_pad3 = {{1, 0, 0}, {1, 0, 0}, 0};
            const layout_t row_pad2 = {{1, 0}, {1, 0}, 0};
            const layout_t row_pad4 = {{1, 0, 0, 0}, {1, 0, 0, 0}, 0};
            const layout_t row_pad1 = {{4}, {1}, 0};
            field_t f[11];
            enum { VA, LA, VB, LB, VO, LO, M, SV, SL, SO, SLO };

            snprintf(desc, sizeof desc, "zero rows, %s%s", cinfer__dtype_name(dt),
                     null_data ? ", data NULL" : "");
            field_make(&f[VA], dt, 3, v3, &row_pad3);
            field_make(&f[LA], CINFER__DT_F32, 2, l2, &row_pad2);
            field_make(&f[VB], dt, 3, v3, &row_pad3);
            field_make(&f[LB], CINFER__DT_F32, 2, l2, &row_pad2);
            field_make(&f[VO], dt, 3, v3, &row_pad3);
            field_make(&f[LO], CINFER__DT_F32, 2, l2, &row_pad2);
            field_make(&f[M], CINFER__DT_U8, 1, m1, &row_pad1);
            field_make(&f[SV], dt, 4, v4, &row_pad4);
            field_make(&f[SL], CINFER__DT_F32, 3, l3, &row_pad3);
            field_make(&f[SO], dt, 3, v3, &row_pad3);
            field_make(&f[SLO], CINFER__DT_F32, 2, l2, &row_pad2);
            if (null_data)
                for (int i = 0; i < 11; i++)
                    f[i].tensor.t.data = NULL, f[i].tensor.t.byte_offset = 0;

            CINFER_TEST_OK(cinfer_merge_state(ctx, &f[VA].tensor.t, &f[LA].tensor.t,
                                              &f[VB].tensor.t, &f[LB].tensor.t, &f[VO].tensor.t,
                                              &f[LO].tensor.t, stream));
            CINFER_TEST_OK(cinfer_merge_state_in_place(ctx, &f[VA].tensor.t, &f[LA].tensor.t,
                                                       &f[VB].tensor.t, &f[LB].tensor.t,
                                                       &f[M].tensor.t, stream));
            CINFER_TEST_OK(cinfer_merge_states(ctx, &f[SV].tensor.t, &f[SL].tensor.t,
                                               &f[SO].tensor.t, &f[SLO].tensor.t, stream));
            CINFER_TEST_SYNC(stream);
            for (int i = 0; i < 11; i++)
                field_expect_kept(&f[i], 0, "every tensor", desc);
            for (int i = 0; i < 11; i++)
                field_free(&f[i]);
        }
}

/* ---------------------------------------------------------------------------------------------
 * Invalid arguments: INVALID_ARGUMENT naming the argument, nothing written
 * ------------------------------------------------------------------------------------------- */

static void expect_invalid_at(const char *file, int line, cinfer_status_t st, const char *arg,
                              const char *what) {
    const char *msg = cinfer_last_error();
    if (st != CINFER_STATUS_INVALID_ARGUMENT)
        cinfer_test_fail_at(file, line, "%s: expected CINFER_STATUS_INVALID_ARGUMENT, got %s (%s)",
                            what, cinfer_status_name(st), msg);
    if (!names_argument(msg, arg))
        cinfer_test_fail_at(file, line, "%s: the message \"%s\" does not name the argument %s",
                            what, msg, arg);
}

/* Makes the last dim's stride 2 (strides become explicit). */
static void last_stride_two(DLTensor *t, field_t *f) {
    for (int k = 0; k < t->ndim; k++)
        f->tensor.strides[k] = f->stride[k];
    f->tensor.strides[t->ndim - 1] = 2;
    t->strides = f->tensor.strides;
}

static void on_cpu(DLTensor *t) {
    t->device.device_type = kDLCPU;
    t->device.device_id = 0;
}

static void check_all_kept(field_t *f, const char *const *names, int count, const char *what) {
    CINFER_TEST_SYNC(stream);
    for (int i = 0; i < count; i++)
        field_expect_kept(&f[i], 0, names[i], what);
}

/* The fields of a small valid call (n = 3, H = 5, D = 64, fp16), inputs random, outputs poisoned.
 */
static void make_error_fields(field_t *f, int count, const int64_t *const *shapes, const int *ndims,
                              const cinfer__dtype_t *dtypes, const int *is_input) {
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 11000);
    for (int i = 0; i < count; i++) {
        field_make(&f[i], dtypes[i], ndims[i], shapes[i], &COMPACT);
        if (is_input[i]) {
            field_fill(&f[i], &rng, -2.0, 2.0);
            field_upload(&f[i]);
        }
    }
}

/* X(id, argument named in the message, description) */
#define STATE_ERRORS(X)                                                                            \
    X(S_CTX_NULL, "ctx", "ctx NULL")                                                               \
    X(S_VA_NULL, "v_a", "v_a NULL")                                                                \
    X(S_LA_NULL, "lse_a", "lse_a NULL")                                                            \
    X(S_VB_NULL, "v_b", "v_b NULL")                                                                \
    X(S_LB_NULL, "lse_b", "lse_b NULL")                                                            \
    X(S_VO_NULL, "v_out", "v_out NULL")                                                            \
    X(S_LO_NULL, "lse_out", "lse_out NULL")                                                        \
    X(S_VA_NDIM, "v_a", "v_a with ndim 2")                                                         \
    X(S_LB_NDIM, "lse_b", "lse_b with ndim 3")                                                     \
    X(S_VB_SHAPE, "v_b", "v_b [n, H, D + 1]")                                                      \
    X(S_VO_SHAPE, "v_out", "v_out [n - 1, H, D]")                                                  \
    X(S_LA_SHAPE, "lse_a", "lse_a [n, H + 1]")                                                     \
    X(S_LO_SHAPE, "lse_out", "lse_out [n + 1, H]")                                                 \
    X(S_VA_F32, "v_a", "v_a float32")                                                              \
    X(S_VB_BF16, "v_b", "v_b bf16 with v_a fp16")                                                  \
    X(S_VO_F32, "v_out", "v_out float32")                                                          \
    X(S_VA_LANES, "v_a", "v_a fp16 with 2 lanes")                                                  \
    X(S_LA_F16, "lse_a", "lse_a fp16")                                                             \
    X(S_LO_BF16, "lse_out", "lse_out bf16")                                                        \
    X(S_VB_STRIDE, "v_b", "v_b last-dim stride 2")                                                 \
    X(S_LB_STRIDE, "lse_b", "lse_b last-dim stride 2")                                             \
    X(S_VO_CPU, "v_out", "v_out on the CPU")                                                       \
    X(S_LA_CPU, "lse_a", "lse_a on the CPU")                                                       \
    X(S_VA_DEVICE, "v_a", "v_a on another CUDA device id")                                         \
    X(S_VA_DATA_NULL, "v_a", "v_a with NULL data")                                                 \
    X(S_VA_NEGATIVE, "v_a", "v_a [-4, H, D]")                                                      \
    X(S_VB_SHAPE_NULL, "v_b", "v_b with a NULL shape")                                             \
    X(S_LO_NEGATIVE, "lse_out", "lse_out [n, -1]")

enum {
#define X(id, arg, what) id,
    STATE_ERRORS(X)
#undef X
        S_COUNT
};

static void test_merge_state_errors(void **state) {
    static const char *const args[] = {
#define X(id, arg, what) arg,
        STATE_ERRORS(X)
#undef X
    };
    static const char *const whats[] = {
#define X(id, arg, what) "merge_state: " what,
        STATE_ERRORS(X)
#undef X
    };
    static const char *const names[] = {"v_a", "lse_a", "v_b", "lse_b", "v_out", "lse_out"};
    const int64_t n = 3, h = 5, d = 64;
    const int64_t v3[3] = {n, h, d}, l2[2] = {n, h};
    const int64_t *const shapes[6] = {v3, l2, v3, l2, v3, l2};
    const int ndims[6] = {3, 2, 3, 2, 3, 2}, is_input[6] = {1, 1, 1, 1, 0, 0};
    const cinfer__dtype_t dts[6] = {CINFER__DT_F16, CINFER__DT_F32, CINFER__DT_F16,
                                    CINFER__DT_F32, CINFER__DT_F16, CINFER__DT_F32};
    field_t f[6];

    make_error_fields(f, 6, shapes, ndims, dts, is_input);
    for (int e = 0; e < S_COUNT; e++) {
        DLTensor *t[6];
        cinfer_context_t *c = ctx;
        for (int i = 0; i < 6; i++)
            t[i] = field_tensor(&f[i]);
        switch (e) {
        case S_CTX_NULL:
            c = NULL;
            break;
        case S_VA_NULL:
        case S_LA_NULL:
        case S_VB_NULL:
        case S_LB_NULL:
        case S_VO_NULL:
        case S_LO_NULL:
            t[e - S_VA_NULL] = NULL;
            break;
        case S_VA_NDIM:
            t[0]->ndim = 2, t[0]->shape[1] = h * d;
            break;
        case S_LB_NDIM:
            t[3]->ndim = 3, t[3]->shape[2] = 1;
            break;
        case S_VB_SHAPE:
            t[2]->shape[2] = d + 1;
            break;
        case S_VO_SHAPE:
            t[4]->shape[0] = n - 1;
            break;
        case S_LA_SHAPE:
            t[1]->shape[1] = h + 1;
            break;
        case S_LO_SHAPE:
            t[5]->shape[0] = n + 1;
            break;
        case S_VA_F32:
            t[0]->dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
            break;
        case S_VB_BF16:
            t[2]->dtype = cinfer_test_dl_dtype(CINFER__DT_BF16);
            break;
        case S_VO_F32:
            t[4]->dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
            break;
        case S_VA_LANES:
            t[0]->dtype.lanes = 2;
            break;
        case S_LA_F16:
            t[1]->dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
            break;
        case S_LO_BF16:
            t[5]->dtype = cinfer_test_dl_dtype(CINFER__DT_BF16);
            break;
        case S_VB_STRIDE:
            last_stride_two(t[2], &f[2]);
            break;
        case S_LB_STRIDE:
            last_stride_two(t[3], &f[3]);
            break;
        case S_VO_CPU:
            on_cpu(t[4]);
            break;
        case S_LA_CPU:
            on_cpu(t[1]);
            break;
        case S_VA_DEVICE:
            t[0]->device.device_id = cinfer_test_device() + 1;
            break;
        case S_VA_DATA_NULL:
            t[0]->data = NULL;
            break;
        case S_VA_NEGATIVE:
            t[0]->shape[0] = -4;
            break;
        case S_VB_SHAPE_NULL:
            t[2]->shape = NULL;
            break;
        case S_LO_NEGATIVE:
            t[5]->shape[1] = -1;
            break;
        }
        expect_invalid_at(__FILE__, __LINE__,
                          cinfer_merge_state(c, t[0], t[1], t[2], t[3], t[4], t[5], stream),
                          args[e], whats[e]);
        check_all_kept(f, names, 6, whats[e]);
    }
    for (int i = 0; i < 6; i++)
        field_free(&f[i]);
}

#define IN_PLACE_ERRORS(X)                                                                         \
    X(P_CTX_NULL, "ctx", "ctx NULL")                                                               \
    X(P_V_NULL, "v", "v NULL")                                                                     \
    X(P_L_NULL, "lse", "lse NULL")                                                                 \
    X(P_VO_NULL, "v_other", "v_other NULL")                                                        \
    X(P_LO_NULL, "lse_other", "lse_other NULL")                                                    \
    X(P_V_NDIM, "v", "v with ndim 4")                                                              \
    X(P_VO_SHAPE, "v_other", "v_other [n, H + 1, D]")                                              \
    X(P_LO_SHAPE, "lse_other", "lse_other [n + 1, H]")                                             \
    X(P_L_SHAPE, "lse", "lse [n, H - 1]")                                                          \
    X(P_V_F32, "v", "v float32")                                                                   \
    X(P_VO_BF16, "v_other", "v_other bf16 with v fp16")                                            \
    X(P_L_F16, "lse", "lse fp16")                                                                  \
    X(P_LO_I32, "lse_other", "lse_other int32")                                                    \
    X(P_V_STRIDE, "v", "v last-dim stride 2")                                                      \
    X(P_LO_CPU, "lse_other", "lse_other on the CPU")                                               \
    X(P_V_CPU, "v", "v on the CPU")                                                                \
    X(P_M_F32, "mask", "mask float32")                                                             \
    X(P_M_SHAPE, "mask", "mask [n + 1]")                                                           \
    X(P_M_NDIM, "mask", "mask with ndim 2")                                                        \
    X(P_M_STRIDE, "mask", "mask with stride 2")                                                    \
    X(P_M_CPU, "mask", "mask on the CPU")

enum {
#define X(id, arg, what) id,
    IN_PLACE_ERRORS(X)
#undef X
        P_COUNT
};

static void test_merge_in_place_errors(void **state) {
    static const char *const args[] = {
#define X(id, arg, what) arg,
        IN_PLACE_ERRORS(X)
#undef X
    };
    static const char *const whats[] = {
#define X(id, arg, what) "merge_state_in_place: " what,
        IN_PLACE_ERRORS(X)
#undef X
    };
    static const char *const names[] = {"v", "lse", "v_other", "lse_other", "mask"};
    const int64_t n = 3, h = 5, d = 64;
    const int64_t v3[3] = {n, h, d}, l2[2] = {n, h}, m1[1] = {n};
    const int64_t *const shapes[5] = {v3, l2, v3, l2, m1};
    const int ndims[5] = {3, 2, 3, 2, 1}, is_input[5] = {1, 1, 1, 1, 0};
    const cinfer__dtype_t dts[5] = {CINFER__DT_F16, CINFER__DT_F32, CINFER__DT_F16, CINFER__DT_F32,
                                    CINFER__DT_U8};
    field_t f[5];

    make_error_fields(f, 5, shapes, ndims, dts, is_input);
    /* An all-ones mask, so a call that wrongly went ahead would change v and lse. */
    for (int64_t i = 0; i < n; i++)
        field_set(&f[4], i, 1);
    field_upload(&f[4]);
    for (int e = 0; e < P_COUNT; e++) {
        DLTensor *t[5];
        cinfer_context_t *c = ctx;
        for (int i = 0; i < 5; i++)
            t[i] = field_tensor(&f[i]);
        switch (e) {
        case P_CTX_NULL:
            c = NULL;
            break;
        case P_V_NULL:
        case P_L_NULL:
        case P_VO_NULL:
        case P_LO_NULL:
            t[e - P_V_NULL] = NULL;
            break;
        case P_V_NDIM:
            t[0]->ndim = 4, t[0]->shape[3] = 1;
            break;
        case P_VO_SHAPE:
            t[2]->shape[1] = h + 1;
            break;
        case P_LO_SHAPE:
            t[3]->shape[0] = n + 1;
            break;
        case P_L_SHAPE:
            t[1]->shape[1] = h - 1;
            break;
        case P_V_F32:
            t[0]->dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
            break;
        case P_VO_BF16:
            t[2]->dtype = cinfer_test_dl_dtype(CINFER__DT_BF16);
            break;
        case P_L_F16:
            t[1]->dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
            break;
        case P_LO_I32:
            t[3]->dtype = cinfer_test_dl_dtype(CINFER__DT_I32);
            break;
        case P_V_STRIDE:
            last_stride_two(t[0], &f[0]);
            break;
        case P_LO_CPU:
            on_cpu(t[3]);
            break;
        case P_V_CPU:
            on_cpu(t[0]);
            break;
        case P_M_F32:
            t[4]->dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
            break;
        case P_M_SHAPE:
            t[4]->shape[0] = n + 1;
            break;
        case P_M_NDIM:
            t[4]->ndim = 2, t[4]->shape[1] = 1;
            break;
        case P_M_STRIDE:
            last_stride_two(t[4], &f[4]);
            break;
        case P_M_CPU:
            on_cpu(t[4]);
            break;
        }
        expect_invalid_at(__FILE__, __LINE__,
                          cinfer_merge_state_in_place(c, t[0], t[1], t[2], t[3], t[4], stream),
                          args[e], whats[e]);
        check_all_kept(f, names, 5, whats[e]);
    }
    for (int i = 0; i < 5; i++)
        field_free(&f[i]);
}

#define STATES_ERRORS(X)                                                                           \
    X(M_CTX_NULL, "ctx", "ctx NULL")                                                               \
    X(M_V_NULL, "v", "v NULL")                                                                     \
    X(M_L_NULL, "lse", "lse NULL")                                                                 \
    X(M_VO_NULL, "v_out", "v_out NULL")                                                            \
    X(M_V_NDIM, "v", "v with ndim 3")                                                              \
    X(M_L_NDIM, "lse", "lse with ndim 2")                                                          \
    X(M_L_SHAPE, "lse", "lse [n, S + 1, H]")                                                       \
    X(M_VO_SHAPE_D, "v_out", "v_out [n, H, D + 1]")                                                \
    X(M_VO_SHAPE_H, "v_out", "v_out [n, H + 1, D]")                                                \
    X(M_LO_SHAPE, "lse_out", "lse_out [n, H + 1]")                                                 \
    X(M_V_F32, "v", "v float32")                                                                   \
    X(M_VO_BF16, "v_out", "v_out bf16 with v fp16")                                                \
    X(M_L_F16, "lse", "lse fp16")                                                                  \
    X(M_LO_F16, "lse_out", "lse_out fp16")                                                         \
    X(M_V_STRIDE, "v", "v last-dim stride 2")                                                      \
    X(M_VO_STRIDE, "v_out", "v_out last-dim stride 2")                                             \
    X(M_V_CPU, "v", "v on the CPU")                                                                \
    X(M_LO_CPU, "lse_out", "lse_out on the CPU")

enum {
#define X(id, arg, what) id,
    STATES_ERRORS(X)
#undef X
        M_COUNT
};

static void test_merge_states_errors(void **state) {
    static const char *const args[] = {
#define X(id, arg, what) arg,
        STATES_ERRORS(X)
#undef X
    };
    static const char *const whats[] = {
#define X(id, arg, what) "merge_states: " what,
        STATES_ERRORS(X)
#undef X
    };
    static const char *const names[] = {"v", "lse", "v_out", "lse_out"};
    const int64_t n = 3, s = 3, h = 5, d = 64;
    const int64_t v4[4] = {n, s, h, d}, l3[3] = {n, s, h}, v3[3] = {n, h, d}, l2[2] = {n, h};
    const int64_t *const shapes[4] = {v4, l3, v3, l2};
    const int ndims[4] = {4, 3, 3, 2}, is_input[4] = {1, 1, 0, 0};
    const cinfer__dtype_t dts[4] = {CINFER__DT_F16, CINFER__DT_F32, CINFER__DT_F16, CINFER__DT_F32};
    field_t f[4];

    make_error_fields(f, 4, shapes, ndims, dts, is_input);
    for (int e = 0; e < M_COUNT; e++) {
        DLTensor *t[4];
        cinfer_context_t *c = ctx;
        for (int i = 0; i < 4; i++)
            t[i] = field_tensor(&f[i]);
        switch (e) {
        case M_CTX_NULL:
            c = NULL;
            break;
        case M_V_NULL:
        case M_L_NULL:
        case M_VO_NULL:
            t[e - M_V_NULL] = NULL;
            break;
        case M_V_NDIM:
            t[0]->ndim = 3, t[0]->shape[2] = h * d;
            break;
        case M_L_NDIM:
            t[1]->ndim = 2, t[1]->shape[1] = s * h;
            break;
        case M_L_SHAPE:
            t[1]->shape[1] = s + 1;
            break;
        case M_VO_SHAPE_D:
            t[2]->shape[2] = d + 1;
            break;
        case M_VO_SHAPE_H:
            t[2]->shape[1] = h + 1;
            break;
        case M_LO_SHAPE:
            t[3]->shape[1] = h + 1;
            break;
        case M_V_F32:
            t[0]->dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
            break;
        case M_VO_BF16:
            t[2]->dtype = cinfer_test_dl_dtype(CINFER__DT_BF16);
            break;
        case M_L_F16:
            t[1]->dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
            break;
        case M_LO_F16:
            t[3]->dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
            break;
        case M_V_STRIDE:
            last_stride_two(t[0], &f[0]);
            break;
        case M_VO_STRIDE:
            last_stride_two(t[2], &f[2]);
            break;
        case M_V_CPU:
            on_cpu(t[0]);
            break;
        case M_LO_CPU:
            on_cpu(t[3]);
            break;
        }
        expect_invalid_at(__FILE__, __LINE__,
                          cinfer_merge_states(c, t[0], t[1], t[2], t[3], stream), args[e],
                          whats[e]);
        check_all_kept(f, names, 4, whats[e]);
    }
    for (int i = 0; i < 4; i++)
        field_free(&f[i]);
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
        cmocka_unit_test_teardown(test_merge_state_errors, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_in_place_errors, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_states_errors, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_zero_rows, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_state_sweep, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_state_strided, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_state_unaligned, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_state_alias, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_in_place_sweep, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_in_place_mask, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_in_place_strided, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_states_sweep, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_states_strided, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(test_merge_states_zero_states, cinfer_test_teardown_buffers),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cinfer_test_stream_destroy(stream);
    cinfer_test_gpu_teardown(ctx);
    /* Never 77 by accident: that code means "skipped" to ctest. */
    return failed ? 1 : 0;
}
