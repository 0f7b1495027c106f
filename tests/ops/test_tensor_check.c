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
                   "v: shape[1] = 1073741824 makes more than 2^48 elements");
    int64_t past[1] = {(INT64_C(1) << 48) + 1};
    t = tensor_of(1, past, kDLUInt, 8);
    expect_invalid(cinfer__tensor_check(NULL, "x", &t, 1, NULL, CINFER__DTS(CINFER__DT_U8)),
                   "x: shape[0] = 281474976710657 makes more than 2^48 elements");
    int64_t empty[3] = {0, INT64_C(1) << 30, INT64_C(1) << 30};
    t = tensor_of(3, empty, kDLFloat, 16);
    expect_invalid(cinfer__tensor_check(NULL, "k", &t, 3, NULL, half), "k: shape[2]");
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dims_are_checked_before_the_shape_is_read),
        cmocka_unit_test(sizes_and_strides_beyond_any_memory_are_refused),
        cmocka_unit_test(written_tensors_have_distinct_elements),
        cmocka_unit_test(a_0d_tensor_holds_one_element),
        cmocka_unit_test(shape_mismatch_messages_show_both_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
