/*
 * The tensor argument checks (src/ops/tensor.c) without a device: a tensor's dims are checked
 * before anything reads its shape (NULL, ndim, a NULL shape array, negative sizes, sizes and
 * strides beyond 2^48 elements), with or without an expected shape, a 0-d tensor's data, and each
 * message names the argument, the value and what was expected.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "ops/tensor.h"
#include "support/gpu.h"

static char storage[64] __attribute__((aligned(16)));

static DLTensor tensor_of(int ndim, int64_t *shape, DLDataTypeCode code, uint8_t bits) {
    return cinfer_test_dl_view(storage, ndim, shape, code, bits);
}

static void expect_invalid_at(int line, cinfer_status_t st, const char *message) {
    if (st != CINFER_STATUS_INVALID_ARGUMENT || !strstr(cinfer_last_error(), message))
        fail_msg("line %d: %s \"%s\", expected CINFER_STATUS_INVALID_ARGUMENT \"...%s...\"", line,
                 cinfer_status_name(st), cinfer_last_error(), message);
}
#define expect_invalid(st, message) expect_invalid_at(__LINE__, st, message)

static void dims_are_checked_before_the_shape_is_read(void **state) {
    (void)state;
    int64_t shape[3] = {2, 3, 4};
    const int64_t want[3] = {2, -1, 4};
    const uint32_t half = CINFER__DTS_HALF;
    DLTensor t = tensor_of(3, shape, kDLFloat, 16);
    assert_int_equal(cinfer__tensor_check(NULL, "v", &t, 3, want, half), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__tensor_check(NULL, "v", &t, 3, NULL, half), CINFER_STATUS_SUCCESS);

    expect_invalid(cinfer__tensor_check(NULL, "v", NULL, 3, want, half), "v is NULL");
    expect_invalid(cinfer__tensor_check(NULL, "v", &t, 2, NULL, half), "v: ndim 3, expected 2");

    /* A negative size, with no expected shape (the call that once read want = NULL) and with
     * one: its own message, the value shown (not as an expected shape's "*"). */
    shape[0] = -4;
    expect_invalid(cinfer__tensor_check(NULL, "v_a", &t, 3, NULL, half),
                   "v_a: shape[0] = -4, expected a size >= 0");
    expect_invalid(cinfer__tensor_check(NULL, "v_a", &t, 3, want, half),
                   "v_a: shape[0] = -4, expected a size >= 0");
    shape[0] = 2;
    shape[2] = INT64_MIN;
    expect_invalid(cinfer__tensor_check_dims("q", &t, 3), "q: shape[2] = -9223372036854775808");
    shape[2] = 4;

    /* A NULL shape array with ndim > 0; ndim 0 needs none. */
    t.shape = NULL;
    expect_invalid(cinfer__tensor_check(NULL, "x", &t, 3, NULL, half),
                   "x: shape is NULL, expected 3 dimensions");
    DLTensor scalar = tensor_of(0, NULL, kDLInt, 32);
    assert_int_equal(
        cinfer__tensor_check(NULL, "flag", &scalar, 0, NULL, CINFER__DTS(CINFER__DT_I32)),
        CINFER_STATUS_SUCCESS);

    /* A negative ndim (a caller that checks against the tensor's own). */
    DLTensor odd = tensor_of(-1, shape, kDLFloat, 16);
    expect_invalid(cinfer__tensor_check(NULL, "m", &odd, odd.ndim, NULL, half),
                   "m: ndim -1, expected >= 0");
}

static void sizes_and_strides_beyond_any_memory_are_refused(void **state) {
    (void)state;
    const uint32_t half = CINFER__DTS_HALF;
    /* Sizes whose product overflows int64 (2^34 x 2^30 x ..., the product once wrapped) and one
     * past 2^48 elements; a zero size does not hide a huge product of the others (their compact
     * strides). */
    int64_t huge[4] = {INT64_C(1) << 34, INT64_C(1) << 30, 1, 1};
    DLTensor t = tensor_of(4, huge, kDLBfloat, 16);
    expect_invalid(cinfer__tensor_check(NULL, "v", &t, 4, NULL, half),
                   "v: shape [17179869184, 1073741824, 1, 1] has more than 2^48 elements");
    int64_t past[1] = {(INT64_C(1) << 48) + 1};
    t = tensor_of(1, past, kDLUInt, 8);
    expect_invalid(cinfer__tensor_check(NULL, "x", &t, 1, NULL, CINFER__DTS(CINFER__DT_U8)),
                   "x: shape [281474976710657] has more than 2^48 elements");
    int64_t empty[3] = {0, INT64_C(1) << 30, INT64_C(1) << 30};
    t = tensor_of(3, empty, kDLFloat, 16);
    expect_invalid(cinfer__tensor_check(NULL, "k", &t, 3, NULL, half),
                   "k: shape [0, 1073741824, 1073741824] has more than 2^48");
    int64_t most[2] = {INT64_C(1) << 24, INT64_C(1) << 24};
    t = tensor_of(2, most, kDLFloat, 16);
    assert_int_equal(cinfer__tensor_check_dims("q", &t, 2), CINFER_STATUS_SUCCESS);

    /* Strides that reach past 2^48 elements (their offsets times a tile or an element size would
     * overflow), negative ones included; the last dim's stride 1 and a one-index dim's stride
     * small are fine. */
    int64_t shape[3] = {4, 8, 64}, strides[3] = {INT64_C(1) << 62, 64, 1};
    t = tensor_of(3, shape, kDLFloat, 16);
    t.strides = strides;
    expect_invalid(cinfer__tensor_check(NULL, "k", &t, 3, NULL, half),
                   "k: strides[0] = 4611686018427387904 spans more than 2^48 elements");
    strides[0] = INT64_MIN;
    expect_invalid(cinfer__tensor_check(NULL, "k", &t, 3, NULL, half), "k: strides[0] = -");
    strides[0] = INT64_C(1) << 47; /* 3 x 2^47 > 2^48 */
    expect_invalid(cinfer__tensor_check(NULL, "k", &t, 3, NULL, half), "k: strides[0]");
    strides[0] = 512;
    assert_int_equal(cinfer__tensor_check(NULL, "k", &t, 3, NULL, half), CINFER_STATUS_SUCCESS);
    shape[0] = 1;
    strides[0] = INT64_C(1) << 40;
    assert_int_equal(cinfer__tensor_check(NULL, "k", &t, 3, NULL, half), CINFER_STATUS_SUCCESS);
    /* An empty tensor's strides too (host code multiplies them by its sizes), its empty dim
     * taken as one index. */
    shape[0] = 4;
    shape[1] = 0;
    strides[0] = INT64_C(1) << 62;
    expect_invalid(cinfer__tensor_check_dims("k", &t, 3), "k: strides[0]");
    strides[0] = 512;
    strides[1] = INT64_C(1) << 48;
    assert_int_equal(cinfer__tensor_check_dims("k", &t, 3), CINFER_STATUS_SUCCESS);

    /* A byte_offset past 2^56, or one that carries data past 2^64 (data + byte_offset was once
     * pointer arithmetic that overflowed: found by tests/api's mutations under UBSan). */
    t.strides = NULL;
    t.byte_offset = (UINT64_C(1) << 56) + 2;
    expect_invalid(cinfer__tensor_check_dims("k", &t, 3), "k: byte_offset 72057594037927938");
    t.byte_offset = UINT64_C(1) << 56;
    assert_int_equal(cinfer__tensor_check_dims("k", &t, 3), CINFER_STATUS_SUCCESS);
    t.data = (void *)(UINTPTR_MAX - 63);
    t.byte_offset = 64;
    expect_invalid(cinfer__tensor_check_dims("k", &t, 3), "k: byte_offset 64 with data");
}

/* A tensor a call writes must give each index its own element (its stores would race). */
static void written_tensors_have_distinct_elements(void **state) {
    (void)state;
    int64_t shape[3] = {4, 8, 64}, strides[3] = {512, 64, 1};
    DLTensor t = tensor_of(3, shape, kDLFloat, 16);
    assert_int_equal(cinfer__tensor_check_distinct("out", &t), CINFER_STATUS_SUCCESS); /* compact */
    t.strides = strides;
    assert_int_equal(cinfer__tensor_check_distinct("out", &t), CINFER_STATUS_SUCCESS);
    strides[0] = -4096; /* a reversed, spaced-out dim is distinct too */
    assert_int_equal(cinfer__tensor_check_distinct("out", &t), CINFER_STATUS_SUCCESS);
    strides[0] = 64; /* dims 0 and 1 step alike: out[1, 0] is out[0, 1] */
    expect_invalid(cinfer__tensor_check_distinct("out", &t),
                   "out: strides[1] = 64 lands inside the 256 elements");
    strides[0] = 511; /* one element short of the span */
    expect_invalid(cinfer__tensor_check_distinct("out", &t), "out: strides[0] = 511");
    strides[0] = 0; /* a broadcast dim */
    expect_invalid(cinfer__tensor_check_distinct("out", &t), "out: strides[0] = 0 over 4 indices");
    shape[0] = 1; /* ... of one index never repeats */
    assert_int_equal(cinfer__tensor_check_distinct("out", &t), CINFER_STATUS_SUCCESS);
    int64_t lse_shape[2] = {2, 32}, lse_strides[2] = {2, 1};
    DLTensor lse = tensor_of(2, lse_shape, kDLFloat, 32);
    lse.strides = lse_strides;
    expect_invalid(cinfer__tensor_check_distinct("lse", &lse), "lse: strides[0] = 2");
    lse_strides[0] = 32;
    assert_int_equal(cinfer__tensor_check_distinct("lse", &lse), CINFER_STATUS_SUCCESS);
}

static void a_0d_tensor_holds_one_element(void **state) {
    (void)state;
    DLTensor flag = tensor_of(0, NULL, kDLInt, 32);
    flag.data = NULL;
    expect_invalid(
        cinfer__tensor_check(NULL, "error_flag", &flag, 0, NULL, CINFER__DTS(CINFER__DT_I32)),
        "error_flag: data is NULL");
}

static void shape_mismatch_messages_show_both_shapes(void **state) {
    (void)state;
    int64_t shape[3] = {2, 3, 5};
    const int64_t want[3] = {2, -1, 4};
    DLTensor t = tensor_of(3, shape, kDLBfloat, 16);
    expect_invalid(cinfer__tensor_check(NULL, "v_b", &t, 3, want, CINFER__DTS_HALF),
                   "v_b: shape [2, 3, 5], expected [2, *, 4]");
}

/* ---- overlap between tensors ---- */

/* A view at a made-up device address (nothing is dereferenced). */
static DLTensor view_at(uintptr_t at, int ndim, int64_t *shape, int64_t *strides, uint8_t bits) {
    DLTensor t =
        cinfer_test_dl_view((void *)at, ndim, shape, bits == 32 ? kDLFloat : kDLBfloat, bits);
    if (bits == 8)
        t.dtype.code = kDLUInt;
    t.strides = strides;
    return t;
}

static void spans_cover_every_element(void **state) {
    (void)state;
    uintptr_t lo, hi;
    /* compact [4, 8, 64] bf16 from 0x10000 (+ 6 bytes of byte_offset): 4 KiB */
    int64_t shape[3] = {4, 8, 64}, strides[3] = {512, 64, 1};
    DLTensor t = view_at(0x10000, 3, shape, NULL, 16);
    t.byte_offset = 6;
    assert_true(cinfer__tensor_span(&t, &lo, &hi));
    assert_int_equal(lo, 0x10006);
    assert_int_equal(hi, 0x10006 + 4 * 8 * 64 * 2);
    /* a reversed first dim reaches 3 rows below data; a stride-0 dim reaches nowhere */
    t.strides = strides;
    strides[0] = -512;
    strides[1] = 0;
    assert_true(cinfer__tensor_span(&t, &lo, &hi));
    assert_int_equal(lo, 0x10006 - 3 * 512 * 2);
    assert_int_equal(hi, 0x10006 + 64 * 2);
    /* permuted strides: [4, 8, 64] over a [8, 4, 64] buffer */
    strides[0] = 64;
    strides[1] = 256;
    assert_true(cinfer__tensor_span(&t, &lo, &hi));
    assert_int_equal(hi - lo, 4 * 8 * 64 * 2);
    /* an empty tensor occupies nothing, whatever its strides */
    shape[1] = 0;
    assert_false(cinfer__tensor_span(&t, &lo, &hi));
    /* a 0-d tensor is one element */
    DLTensor flag = view_at(0x20000, 0, NULL, NULL, 32);
    assert_true(cinfer__tensor_span(&flag, &lo, &hi));
    assert_int_equal(hi - lo, 4);
}

static void views_of_one_buffer_overlap_only_where_they_share_bytes(void **state) {
    (void)state;
    /* q, k, v slices of a packed [16, 32 + 8 + 8, 128] bf16 QKV tensor: interleaved rows, no
     * shared element. */
    const int64_t row = 48 * 128;
    int64_t qs[3] = {16, 32, 128}, ks[3] = {16, 8, 128}, st[3] = {row, 128, 1};
    DLTensor q = view_at(0x100000, 3, qs, st, 16), k = view_at(0x100000, 3, ks, st, 16);
    DLTensor v = k;
    k.byte_offset = 32 * 128 * 2;
    v.byte_offset = 40 * 128 * 2;
    assert_false(cinfer__tensor_overlap(&q, &k));
    assert_false(cinfer__tensor_overlap(&k, &v));
    assert_false(cinfer__tensor_overlap(&v, &q));
    /* k one element wider, or one element earlier, reaches into q's or v's rows */
    k.byte_offset -= 2;
    assert_true(cinfer__tensor_overlap(&q, &k));
    k.byte_offset += 2;
    ks[1] = 9;
    assert_true(cinfer__tensor_overlap(&k, &v));
    ks[1] = 8;
    /* The K and V halves of a combined NHD cache [4, 2, 16, 8, 128] as two views. */
    int64_t cs[4] = {4, 16, 8, 128}, cst[4] = {2 * 16 * 8 * 128, 8 * 128, 128, 1};
    DLTensor kc = view_at(0x200000, 4, cs, cst, 16), vc = kc;
    vc.byte_offset = 16 * 8 * 128 * 2;
    assert_false(cinfer__tensor_overlap(&kc, &vc));
    assert_true(cinfer__tensor_overlap(&kc, &kc));
    /* the same memory with permuted strides, and 64 bytes into it */
    int64_t vs[3] = {4, 8, 64}, perm[3] = {64, 256, 1};
    DLTensor a = view_at(0x300000, 3, vs, NULL, 16), b = view_at(0x300000, 3, vs, perm, 16);
    assert_true(cinfer__tensor_overlap(&a, &b));
    assert_false(cinfer__tensor_same(&a, &b));
    b.strides = NULL;
    assert_true(cinfer__tensor_same(&a, &b));
    b.byte_offset = 64;
    assert_true(cinfer__tensor_overlap(&a, &b));
    assert_false(cinfer__tensor_same(&a, &b));
    /* an lse [4, 8] float32 placed right after v, and one byte into it */
    int64_t ls[2] = {4, 8};
    DLTensor lse = view_at(0x300000 + 4 * 8 * 64 * 2, 2, ls, NULL, 32);
    assert_false(cinfer__tensor_overlap(&a, &lse));
    lse.data = (char *)lse.data - 4;
    assert_true(cinfer__tensor_overlap(&a, &lse));
    /* Every 4th byte against every odd byte: no byte in common, but with other strides and
     * 2000 rows inside each other's span it is more than the check takes apart, and counts as
     * overlapping (the safe answer). */
    int64_t n4[1] = {2000}, s4[1] = {4}, n2[1] = {4000}, s2[1] = {2};
    DLTensor every4 = view_at(0x400000, 1, n4, s4, 8), odd = view_at(0x400001, 1, n2, s2, 8);
    assert_true(cinfer__tensor_overlap(&every4, &odd));
    n4[0] = 8; /* a few rows are settled exactly */
    assert_false(cinfer__tensor_overlap(&every4, &odd));
    /* an empty tensor overlaps nothing, even at the same address */
    int64_t none[3] = {0, 8, 64};
    DLTensor empty = view_at(0x300000, 3, none, NULL, 16);
    assert_false(cinfer__tensor_overlap(&a, &empty));
}

/* The bytes a small view covers, as a bitmap of the window [origin, origin + 4096). */
static void mark_bytes(const DLTensor *t, uintptr_t origin, unsigned char *bytes) {
    const int64_t esz = t->dtype.bits / 8;
    int64_t idx[3] = {0, 0, 0}, count = 1;
    for (int i = 0; i < t->ndim; i++)
        count *= t->shape[i];
    for (int64_t n = 0; n < count; n++) {
        int64_t rest = n, off = 0;
        for (int i = t->ndim - 1; i >= 0; i--) {
            idx[i] = rest % t->shape[i];
            rest /= t->shape[i];
            off += idx[i] * t->strides[i];
        }
        const uintptr_t at = (uintptr_t)t->data + t->byte_offset + (uintptr_t)(off * esz);
        for (int64_t b = 0; b < esz; b++)
            bytes[at - origin + (uintptr_t)b] = 1;
    }
}

/* Random small views (1-3 dims of 0-3 indices, strides of -9..9 elements in any order, element
 * sizes 1, 2 and 4, byte offsets 0-23) against each other: the overlap test agrees with the bytes
 * the two cover, exactly. */
static void overlap_matches_the_bytes_covered(void **state) {
    (void)state;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, 0x0E71A9ull);
    const uintptr_t origin = 0x100000, at = origin + 2048;
    static const uint8_t bits[3] = {8, 16, 32};
    int overlapping = 0, interleaved = 0;
    for (int iter = 0; iter < 20000; iter++) {
        int64_t shape[2][3], strides[2][3];
        DLTensor t[2];
        unsigned char bytes[2][4096];
        for (int j = 0; j < 2; j++) {
            const int ndim = 1 + (int)cinfer_test_rng_below(&rng, 3);
            for (int i = 0; i < ndim; i++) {
                shape[j][i] = (int64_t)cinfer_test_rng_below(&rng, 4);
                strides[j][i] = (int64_t)cinfer_test_rng_below(&rng, 19) - 9;
            }
            t[j] = view_at(at, ndim, shape[j], strides[j], bits[cinfer_test_rng_below(&rng, 3)]);
            t[j].byte_offset = cinfer_test_rng_below(&rng, 24);
            memset(bytes[j], 0, sizeof bytes[j]);
            mark_bytes(&t[j], origin, bytes[j]);
        }
        bool shared = false;
        for (int b = 0; b < 4096; b++)
            shared = shared || (bytes[0][b] && bytes[1][b]);
        uintptr_t lo0, hi0, lo1, hi1;
        const bool spans_meet = cinfer__tensor_span(&t[0], &lo0, &hi0) &&
                                cinfer__tensor_span(&t[1], &lo1, &hi1) && lo0 < hi1 && lo1 < hi0;
        overlapping += shared;
        interleaved += spans_meet && !shared;
        if (cinfer__tensor_overlap(&t[0], &t[1]) != shared ||
            cinfer__tensor_overlap(&t[1], &t[0]) != shared)
            fail_msg("iteration %d: overlap %d, but the views %s bytes", iter,
                     (int)cinfer__tensor_overlap(&t[0], &t[1]), shared ? "share" : "share no");
    }
    /* both answers, and spans that meet without a shared byte, came up often */
    assert_true(overlapping > 2500);
    assert_true(interleaved > 1200);
}

static void written_tensors_must_not_overlap_the_others(void **state) {
    (void)state;
    int64_t vs[3] = {4, 8, 64}, ls[2] = {4, 8};
    DLTensor v_a = view_at(0x10000, 3, vs, NULL, 16), v_out = v_a;
    DLTensor lse = view_at(0x20000, 2, ls, NULL, 32);
    const cinfer__tensor_arg_t in_place_ok[] = {{"lse_a", &lse, true}, {"v_a", &v_a, true}};
    const cinfer__tensor_arg_t apart[] = {{"v_a", &v_a, false}};
    /* exactly the input: accepted where in place is, refused where not */
    assert_int_equal(cinfer__tensor_check_disjoint("v_out", &v_out, in_place_ok, 2),
                     CINFER_STATUS_SUCCESS);
    expect_invalid(cinfer__tensor_check_disjoint("v_out", &v_out, apart, 1),
                   "v_out: [0x10000, 0x11000) overlaps v_a [0x10000, 0x11000); the call writes "
                   "v_out, expected it not to overlap v_a");
    /* 64 bytes into it: refused either way, the message offering the exact alias */
    v_out.byte_offset = 64;
    expect_invalid(cinfer__tensor_check_disjoint("v_out", &v_out, in_place_ok, 2),
                   "v_out: [0x10040, 0x11040) overlaps v_a [0x10000, 0x11000); the call writes "
                   "v_out, expected it not to overlap v_a, or to be v_a exactly");
    /* NULL tensors (optional arguments) pass */
    const cinfer__tensor_arg_t none[] = {{"lse", NULL, false}};
    assert_int_equal(cinfer__tensor_check_disjoint("v_out", &v_out, none, 1),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__tensor_check_disjoint("lse", NULL, apart, 1), CINFER_STATUS_SUCCESS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dims_are_checked_before_the_shape_is_read),
        cmocka_unit_test(sizes_and_strides_beyond_any_memory_are_refused),
        cmocka_unit_test(written_tensors_have_distinct_elements),
        cmocka_unit_test(a_0d_tensor_holds_one_element),
        cmocka_unit_test(shape_mismatch_messages_show_both_shapes),
        cmocka_unit_test(spans_cover_every_element),
        cmocka_unit_test(views_of_one_buffer_overlap_only_where_they_share_bytes),
        cmocka_unit_test(overlap_matches_the_bytes_covered),
        cmocka_unit_test(written_tensors_must_not_overlap_the_others),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
