/*
 * The tensor argument checks (src/ops/tensor.c) without a device: a tensor's dims are checked
 * before anything reads its shape (NULL, ndim, a NULL shape array, negative sizes), with or
 * without an expected shape, and each message names the argument, the value and what was
 * expected.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "ops/tensor.h"

static DLTensor tensor_of(int ndim, int64_t *shape, DLDataTypeCode code, uint8_t bits) {
    static char storage[64] __attribute__((aligned(16)));
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = storage;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.shape = shape;
    t.dtype.code = (uint8_t)code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    return t;
}

static void expect_invalid(cinfer_status_t st, const char *message) {
    assert_int_equal(st, CINFER_STATUS_INVALID_ARGUMENT);
    if (!strstr(cinfer_last_error(), message))
        fail_msg("message \"%s\" lacks \"%s\"", cinfer_last_error(), message);
}

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
    assert_int_equal(cinfer__tensor_check(NULL, "flag", &scalar, 0, NULL,
                                          CINFER__DTS(CINFER__DT_I32)),
                     CINFER_STATUS_SUCCESS);

    /* A negative ndim (a caller that checks against the tensor's own). */
    DLTensor odd = tensor_of(-1, shape, kDLFloat, 16);
    expect_invalid(cinfer__tensor_check(NULL, "m", &odd, odd.ndim, NULL, half),
                   "m: ndim -1, expected >= 0");
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
        cmocka_unit_test(shape_mismatch_messages_show_both_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
