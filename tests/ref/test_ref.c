/*
 * Tests of the float64 CPU reference (src/ref). Every expected number is derived by hand in the
 * comment next to it, from the format definitions and the math contract in ref.h, never by
 * running the reference itself; the layout tests then check that every wrapper agrees exactly
 * with the core on the same data.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref/ref.h"

/* ---------------------------------------------------------------------------------------------- */
/* Helpers */
/* ---------------------------------------------------------------------------------------------- */

#define LN2 0.69314718055994530942
#define PI  3.14159265358979323846

/* Fails with both values printed when |actual - expected| > tol (and on any NaN). */
#define assert_near(actual, expected, tol)                                                         \
    check_near((actual), (expected), (tol), #actual, __FILE__, __LINE__)

static void check_near(double actual, double expected, double tol, const char *what,
                       const char *file, int line) {
    if (!(fabs(actual - expected) <= tol)) {
        print_error("%s = %.17g, expected %.17g (tolerance %g)\n", what, actual, expected, tol);
        _fail(file, line);
    }
}

#define assert_neg_inf(x) assert_true(isinf(x) && (x) < 0)

static cinfer__ref_heads_t make_heads(int64_t hq, int64_t hk, int64_t dqk, int64_t dvo) {
    cinfer__ref_heads_t h = {hq, hk, dqk, dvo};
    return h;
}

static cinfer__ref_attn_opts_t make_opts(int64_t dqk) {
    cinfer__ref_attn_opts_t o;
    assert_int_equal(cinfer__ref_attn_opts_init(&o, dqk), CINFER__REF_OK);
    return o;
}

/* Deterministic xorshift64 so the layout tests need no seed from the environment. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double rng_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ---------------------------------------------------------------------------------------------- */
/* 1. Dtypes */
/* ---------------------------------------------------------------------------------------------- */

static void test_f16_bits(void **state) {
    (void)state;
    /* 1.0 = 2^0: exponent field 0 + 15 = 01111, mantissa 0 -> 0 01111 0000000000 = 0x3C00. */
    assert_int_equal(cinfer__ref_double_to_f16(1.0), 0x3C00);
    assert_near(cinfer__ref_f16_to_double(0x3C00), 1.0, 0.0);
    /* -2.5 = -1.25 * 2^1: sign 1, exponent 16 = 10000, mantissa .01 -> 1 10000 0100000000. */
    assert_int_equal(cinfer__ref_double_to_f16(-2.5), 0xC100);
    assert_near(cinfer__ref_f16_to_double(0xC100), -2.5, 0.0);
    /* 65504 = (2 - 2^-10) * 2^15: exponent 30 = 11110, mantissa all ones -> 0x7BFF. */
    assert_int_equal(cinfer__ref_double_to_f16(65504.0), 0x7BFF);
    assert_near(cinfer__ref_f16_to_double(0x7BFF), 65504.0, 0.0);
    /* Subnormals are mant * 2^(1 - 15 - 10) = mant * 2^-24. */
    assert_near(cinfer__ref_f16_to_double(0x0001), 5.9604644775390625e-08, 0.0);
    assert_int_equal(cinfer__ref_double_to_f16(5.9604644775390625e-08), 0x0001);
    assert_near(cinfer__ref_f16_to_double(0x03FF), 1023.0 * 5.9604644775390625e-08, 0.0);
    /* The smallest normal is 2^-14 = 6.103515625e-05. */
    assert_near(cinfer__ref_f16_to_double(0x0400), 6.103515625e-05, 0.0);
    assert_true(isinf(cinfer__ref_f16_to_double(0x7C00)));
    assert_neg_inf(cinfer__ref_f16_to_double(0xFC00));
    assert_true(isnan(cinfer__ref_f16_to_double(0x7E00)));
    assert_true(isnan(cinfer__ref_f16_to_double(0x7C01)));

    /* Round to nearest even. The spacing below 65536 is 32, so 65520 is exactly halfway between
       65504 (odd mantissa 0x3FF) and 65536 (the next, even, pattern, which is inf): tie -> inf.
       65519 is below the midpoint -> 65504. */
    assert_int_equal(cinfer__ref_double_to_f16(65519.0), 0x7BFF);
    assert_int_equal(cinfer__ref_double_to_f16(65520.0), 0x7C00);
    assert_int_equal(cinfer__ref_double_to_f16(1e6), 0x7C00);
    assert_int_equal(cinfer__ref_double_to_f16(-1e6), 0xFC00);
    /* 2^-25 is halfway between 0 and the smallest subnormal: tie to even -> +0. */
    assert_int_equal(cinfer__ref_double_to_f16(ldexp(1.0, -25)), 0x0000);
    assert_int_equal(cinfer__ref_double_to_f16(ldexp(1.0, -25) * 1.0000001), 0x0001);
    /* 3 * 2^-25 is halfway between 1 and 2 units of 2^-24: even -> 2 (0x0002). 5 * 2^-25 is
       halfway between 2 and 3 units: even -> 2 again. */
    assert_int_equal(cinfer__ref_double_to_f16(3.0 * ldexp(1.0, -25)), 0x0002);
    assert_int_equal(cinfer__ref_double_to_f16(5.0 * ldexp(1.0, -25)), 0x0002);
    /* Near 1 the spacing is 2^-10: 1 + 2^-11 ties to 1.0 (even), 1 + 3*2^-11 ties to
       1 + 2^-9 (mantissa 2, even). */
    assert_int_equal(cinfer__ref_double_to_f16(1.0 + ldexp(1.0, -11)), 0x3C00);
    assert_int_equal(cinfer__ref_double_to_f16(1.0 + 3.0 * ldexp(1.0, -11)), 0x3C02);
    /* Rounding up from just below 2 carries into the exponent: 2 - 2^-12 -> 2.0 = 0x4000. */
    assert_int_equal(cinfer__ref_double_to_f16(2.0 - ldexp(1.0, -12)), 0x4000);
    assert_int_equal(cinfer__ref_double_to_f16(-0.0), 0x8000);
    assert_int_equal(cinfer__ref_double_to_f16(NAN), 0x7E00);
    assert_int_equal(cinfer__ref_double_to_f16(-INFINITY), 0xFC00);
}

static void test_bf16_bits(void **state) {
    (void)state;
    /* 1.0: exponent 127 = 0x7F, mantissa 0 -> 0 01111111 0000000 = 0x3F80. */
    assert_int_equal(cinfer__ref_double_to_bf16(1.0), 0x3F80);
    /* -2.5 = -1.25 * 2^1: exponent 128 = 10000000, mantissa .0100000 -> 0xC020. */
    assert_int_equal(cinfer__ref_double_to_bf16(-2.5), 0xC020);
    assert_near(cinfer__ref_bf16_to_double(0xC020), -2.5, 0.0);
    /* 0x4049: exponent 128, mantissa 0x49 = 73 -> (1 + 73/128) * 2 = 3.140625, the nearest bf16
       to pi (the neighbours are 3.140625 and 3.15625). */
    assert_near(cinfer__ref_bf16_to_double(0x4049), 3.140625, 0.0);
    assert_int_equal(cinfer__ref_double_to_bf16(3.14159265358979), 0x4049);
    /* Ties: the spacing at 1 is 2^-7. 1 + 2^-8 is halfway between 0x3F80 and 0x3F81 -> 0x3F80
       (even); 1 + 3*2^-8 is halfway between 0x3F81 and 0x3F82 -> 0x3F82; a hair above the first
       tie goes up to 0x3F81. */
    assert_int_equal(cinfer__ref_double_to_bf16(1.0 + ldexp(1.0, -8)), 0x3F80);
    assert_int_equal(cinfer__ref_double_to_bf16(1.0 + 3.0 * ldexp(1.0, -8)), 0x3F82);
    assert_int_equal(cinfer__ref_double_to_bf16(1.0 + ldexp(1.0, -8) + ldexp(1.0, -30)), 0x3F81);
    /* Max finite 0x7F7F = (2 - 2^-7) * 2^127; the overflow midpoint is (2 - 2^-8) * 2^127
       ~ 3.3962e38, so 3.4e38 becomes inf and 3.39e38 stays at the max. */
    assert_near(cinfer__ref_bf16_to_double(0x7F7F), (2.0 - ldexp(1.0, -7)) * ldexp(1.0, 127), 0.0);
    assert_int_equal(cinfer__ref_double_to_bf16(3.4e38), 0x7F80);
    assert_int_equal(cinfer__ref_double_to_bf16(3.39e38), 0x7F7F);
    /* Smallest subnormal: 1 * 2^(1 - 127 - 7) = 2^-133. */
    assert_near(cinfer__ref_bf16_to_double(0x0001), ldexp(1.0, -133), 0.0);
    assert_int_equal(cinfer__ref_double_to_bf16(NAN), 0x7FC0);
}

static void test_f32_bits(void **state) {
    (void)state;
    /* Spacing at 1 is 2^-23: 1 + 2^-24 ties to 1.0, 1 + 3*2^-24 ties to 1 + 2^-22. */
    assert_int_equal(cinfer__ref_double_to_f32(1.0), 0x3F800000u);
    assert_int_equal(cinfer__ref_double_to_f32(1.0 + ldexp(1.0, -24)), 0x3F800000u);
    assert_int_equal(cinfer__ref_double_to_f32(1.0 + 3.0 * ldexp(1.0, -24)), 0x3F800002u);
    assert_int_equal(cinfer__ref_double_to_f32(1e39), 0x7F800000u);
    assert_int_equal(cinfer__ref_double_to_f32(-2.5), 0xC0200000u);

    /* The hardware double -> float conversion rounds to nearest even too, so it is an
       independent oracle for the generic encoder across the whole float range, subnormals
       included. */
    for (int i = 0; i < 20000; i++) {
        const double mant = rng_uniform();
        const int exp2v = (int)(rng_uniform() * 125.0); /* stays inside float range */
        const double x = ldexp(mant, exp2v);
        const float f = (float)x;
        uint32_t want;
        memcpy(&want, &f, sizeof want);
        assert_int_equal(cinfer__ref_double_to_f32(x), want);
        assert_near(cinfer__ref_f32_to_double(want), (double)f, 0.0);
    }
}

static void test_e4m3_bits(void **state) {
    (void)state;
    /* 1.0: exponent 0 + 7 = 0111, mantissa 000 -> 0 0111 000 = 0x38. */
    assert_int_equal(cinfer__ref_double_to_e4m3(1.0), 0x38);
    /* -2.5 = -1.25 * 2^1: exponent 8 = 1000, mantissa .010 -> 1 1000 010 = 0xC2. */
    assert_int_equal(cinfer__ref_double_to_e4m3(-2.5), 0xC2);
    assert_near(cinfer__ref_e4m3_to_double(0xC2), -2.5, 0.0);
    /* 448 = 1.75 * 2^8: exponent 15 = 1111, mantissa 110 -> 0x7E; the top exponent holds normal
       numbers in e4m3fn (0x78 = 2^8 = 256) and only 1111.111 is NaN. */
    assert_int_equal(cinfer__ref_double_to_e4m3(448.0), 0x7E);
    assert_near(cinfer__ref_e4m3_to_double(0x7E), 448.0, 0.0);
    assert_near(cinfer__ref_e4m3_to_double(0x78), 256.0, 0.0);
    assert_true(isnan(cinfer__ref_e4m3_to_double(0x7F)));
    assert_true(isnan(cinfer__ref_e4m3_to_double(0xFF)));
    /* Saturation: everything beyond 448, and inf, becomes +-448. */
    assert_int_equal(cinfer__ref_double_to_e4m3(464.0), 0x7E);
    assert_int_equal(cinfer__ref_double_to_e4m3(500.0), 0x7E);
    assert_int_equal(cinfer__ref_double_to_e4m3(1e9), 0x7E);
    assert_int_equal(cinfer__ref_double_to_e4m3(-1e9), 0xFE);
    assert_int_equal(cinfer__ref_double_to_e4m3(INFINITY), 0x7E);
    assert_int_equal(cinfer__ref_double_to_e4m3(-INFINITY), 0xFE);
    assert_int_equal(cinfer__ref_double_to_e4m3(NAN), 0x7F);
    /* Subnormals are mant * 2^(1 - 7 - 3) = mant * 2^-9; the smallest normal is 2^-6. */
    assert_near(cinfer__ref_e4m3_to_double(0x01), 0.001953125, 0.0);
    assert_near(cinfer__ref_e4m3_to_double(0x07), 7.0 * 0.001953125, 0.0);
    assert_near(cinfer__ref_e4m3_to_double(0x08), 0.015625, 0.0);
    assert_int_equal(cinfer__ref_double_to_e4m3(0.001953125), 0x01);
    /* Ties at spacing 2^-3: 1.0625 -> 1.0 (0x38, even), 1.1875 -> 1.25 (0x3A, even). */
    assert_int_equal(cinfer__ref_double_to_e4m3(1.0625), 0x38);
    assert_int_equal(cinfer__ref_double_to_e4m3(1.1875), 0x3A);
}

/*
 * The sm80 prefill template's e4m3 conversion to fp16 of value / 256 (kernels/dtype.cuh,
 * cinfer_fp8x4_to_f16x2x2_bits: byte permutes with sign fill, a shift by 7 and a mask) must give
 * the fp16 of value / 256, which is exact: checked here for every finite encoding against the
 * float64 decoder (the integer form's formula, per byte, as dtype.cuh computes it per pair).
 */
static void test_e4m3_div256_bits(void **state) {
    (void)state;
    for (unsigned b = 0; b < 256; b++) {
        if ((b & 0x7fu) == 0x7fu)
            continue; /* NaN: the integer form gives +-480 / 256, the converter NaN */
        const double v = cinfer__ref_e4m3_to_double((uint8_t)b) / 256.0;
        const uint16_t want = cinfer__ref_double_to_f16(v);
        assert_near(cinfer__ref_f16_to_double(want), v, 0.0);   /* exact in fp16 */
        const unsigned half = b | ((b & 0x80u) ? 0xff00u : 0u); /* the byte, then its sign */
        const uint16_t got = (uint16_t)((half << 7) & 0xbf80u);
        if (got != want)
            fail_msg("e4m3 0x%02x: integer form 0x%04x, fp16 of value / 256 0x%04x", b, got, want);
    }
}

static void test_e5m2_bits(void **state) {
    (void)state;
    /* 57344 = 1.75 * 2^15: exponent 30 = 11110, mantissa 11 -> 0 11110 11 = 0x7B. */
    assert_int_equal(cinfer__ref_double_to_e5m2(57344.0), 0x7B);
    assert_near(cinfer__ref_e5m2_to_double(0x7B), 57344.0, 0.0);
    assert_true(isinf(cinfer__ref_e5m2_to_double(0x7C)));
    assert_neg_inf(cinfer__ref_e5m2_to_double(0xFC));
    assert_true(isnan(cinfer__ref_e5m2_to_double(0x7D)));
    assert_true(isnan(cinfer__ref_e5m2_to_double(0x7F)));
    /* 1.0 = 0 01111 00 = 0x3C; -2.5 = -1.25 * 2^1 = 1 10000 01 = 0xC1. */
    assert_int_equal(cinfer__ref_double_to_e5m2(1.0), 0x3C);
    assert_int_equal(cinfer__ref_double_to_e5m2(-2.5), 0xC1);
    /* The spacing below 65536 is 8192: 61440 is halfway between 57344 (odd mantissa) and the
       even next pattern (inf) -> inf; 61439 stays at 57344. */
    assert_int_equal(cinfer__ref_double_to_e5m2(61439.0), 0x7B);
    assert_int_equal(cinfer__ref_double_to_e5m2(61440.0), 0x7C);
    assert_int_equal(cinfer__ref_double_to_e5m2(-1e6), 0xFC);
    assert_int_equal(cinfer__ref_double_to_e5m2(INFINITY), 0x7C);
    assert_int_equal(cinfer__ref_double_to_e5m2(NAN), 0x7E);
    /* Smallest subnormal: 2^(1 - 15 - 2) = 2^-16. */
    assert_near(cinfer__ref_e5m2_to_double(0x01), ldexp(1.0, -16), 0.0);
}

/* Every non-NaN bit pattern must survive decode -> encode; NaNs must decode to NaN. */
static void test_dtype_round_trip_all_patterns(void **state) {
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        const double f = cinfer__ref_f16_to_double((uint16_t)b);
        const double g = cinfer__ref_bf16_to_double((uint16_t)b);
        if (isnan(f)) {
            assert_int_equal(cinfer__ref_double_to_f16(f), 0x7E00);
        } else {
            assert_int_equal(cinfer__ref_double_to_f16(f), b);
        }
        if (isnan(g)) {
            assert_int_equal(cinfer__ref_double_to_bf16(g), 0x7FC0);
        } else {
            assert_int_equal(cinfer__ref_double_to_bf16(g), b);
        }
    }
    for (uint32_t b = 0; b < 256; b++) {
        const double e4 = cinfer__ref_e4m3_to_double((uint8_t)b);
        const double e5 = cinfer__ref_e5m2_to_double((uint8_t)b);
        if (isnan(e4)) {
            assert_true((b & 0x7F) == 0x7F);
        } else {
            assert_int_equal(cinfer__ref_double_to_e4m3(e4), b);
        }
        if (!isnan(e5)) {
            assert_int_equal(cinfer__ref_double_to_e5m2(e5), b);
        }
    }
}

static void test_dtype_bulk(void **state) {
    const double src[4] = {1.0, -2.5, 65504.0, 0.1};
    uint16_t raw[4];
    uint8_t raw8[4];
    double back[4];
    (void)state;

    assert_int_equal(cinfer__ref_dtype_size(CINFER__REF_DTYPE_F16), 2);
    assert_int_equal(cinfer__ref_dtype_size(CINFER__REF_DTYPE_F32), 4);
    assert_int_equal(cinfer__ref_dtype_size(CINFER__REF_DTYPE_E4M3), 1);
    assert_int_equal(cinfer__ref_dtype_size((cinfer__ref_dtype_t)99), 0);

    assert_int_equal(cinfer__ref_from_double(CINFER__REF_DTYPE_F16, src, 4, raw), 0);
    assert_int_equal(raw[0], 0x3C00);
    assert_int_equal(raw[1], 0xC100);
    assert_int_equal(raw[2], 0x7BFF);
    /* 0.1 = 1.6 * 2^-4; 1.6 * 1024 = 1638.4 -> mantissa 1638 - 1024 = 614 = 0x266, exponent
       11 = 01011 -> 0 01011 1001100110 = 0x2E66. */
    assert_int_equal(raw[3], 0x2E66);
    assert_int_equal(cinfer__ref_to_double(CINFER__REF_DTYPE_F16, raw, 4, back), 0);
    assert_near(back[1], -2.5, 0.0);
    assert_near(back[3], 1638.0 / 1024.0 / 16.0, 0.0);

    /* e4m3 of 65504 saturates to 448; 0.1 = 1.6 * 2^-4 -> mantissa 1.6 * 8 = 12.8 -> 13 -> 1.625
     * 2^-4 = 0.1015625. */
    assert_int_equal(cinfer__ref_from_double(CINFER__REF_DTYPE_E4M3, src, 4, raw8), 0);
    assert_int_equal(cinfer__ref_to_double(CINFER__REF_DTYPE_E4M3, raw8, 4, back), 0);
    assert_near(back[2], 448.0, 0.0);
    assert_near(back[3], 0.1015625, 0.0);

    assert_int_equal(cinfer__ref_to_double(CINFER__REF_DTYPE_F16, raw, -1, back),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_to_double((cinfer__ref_dtype_t)99, raw, 1, back),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_from_double(CINFER__REF_DTYPE_F16, NULL, 1, raw),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_to_double(CINFER__REF_DTYPE_F16, NULL, 0, NULL), 0);
}

/* ---------------------------------------------------------------------------------------------- */
/* 2. Attention core, hand-computed */
/* ---------------------------------------------------------------------------------------------- */

static void test_attn_softmax_by_hand(void **state) {
    /* q = (1, 0), k0 = (2, 0), k1 = (0, 1): dots 2 and 0; default sm_scale 1/sqrt(2) gives logits
       s = (sqrt 2, 0). softmax = (e^sqrt2, 1) / (e^sqrt2 + 1) = (0.80443, 0.19557), so with
       v0 = (1, 0), v1 = (0, 1) the output is that pair and lse = log2(e^sqrt2 + 1) = 2.35424. */
    const double q[2] = {1, 0};
    const double k[4] = {2, 0, 0, 1};
    const double v[4] = {1, 0, 0, 1};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 2, 2);
    cinfer__ref_attn_opts_t opts = make_opts(2);
    double o[2];
    double lse;
    (void)state;

    assert_near(opts.sm_scale, 0.70710678118654752, 1e-15);
    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q, k, v, &opts, o, &lse), 0);
    const double e = exp(sqrt(2.0));
    assert_near(o[0], e / (e + 1.0), 1e-15);
    assert_near(o[1], 1.0 / (e + 1.0), 1e-15);
    assert_near(o[0], 0.8044296825069569, 1e-15);
    assert_near(lse, 2.354240671709279, 1e-14);
}

static void test_attn_large_logits_are_stable(void **state) {
    /* Logits 1000 and 999 would overflow a naive exp. softmax = (1, e^-1) / (1 + e^-1), and
       lse = (1000 + ln(1 + e^-1)) / ln 2 = 1443.147... */
    const double q[1] = {1};
    const double k[2] = {1000, 999};
    const double v[2] = {1, 0};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o;
    double lse;
    (void)state;

    opts.sm_scale = 1.0;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q, k, v, &opts, &o, &lse), 0);
    assert_near(o, 1.0 / (1.0 + exp(-1.0)), 1e-15);
    assert_near(lse, (1000.0 + log(1.0 + exp(-1.0))) / LN2, 1e-10);
}

static void test_attn_causal_bottom_right(void **state) {
    /* qo_len 2, kv_len 3: p = i + 3 - 2 = 1, 2. All logits are 0 (q = 0), so each row averages
       its kept values. Row 0 keeps j <= 1: (1 + 10) / 2 = 5.5, lse = log2(2) = 1. Row 1 keeps
       all three: 111 / 3 = 37, lse = log2(3). (Top-left alignment would give row 0 = 1.) */
    const double q[2] = {0, 0};
    const double k[3] = {1, 2, 3};
    const double v[3] = {1, 10, 100};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[2];
    double lse[2];
    double logits[6];
    (void)state;

    opts.causal = true;
    opts.logits_out = logits;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 3, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 5.5, 1e-14);
    assert_near(o[1], 37.0, 1e-13);
    assert_near(lse[0], 1.0, 1e-15);
    assert_near(lse[1], log2(3.0), 1e-15);
    /* The dump is [H, qo, kv]: only (row 0, j 2) is masked. */
    assert_near(logits[0], 0.0, 0.0);
    assert_near(logits[1], 0.0, 0.0);
    assert_neg_inf(logits[2]);
    assert_near(logits[5], 0.0, 0.0);
}

static void test_attn_window_left(void **state) {
    /* qo 2, kv 4, p = 2, 3, w = 1 keeps j >= p - 1, values 1, 10, 100, 1000, logits all 0.
       Without causal: row 0 keeps j = 1..3 -> 1110 / 3 = 370, lse log2 3; row 1 keeps j = 2, 3
       -> 550, lse 1. With causal too: row 0 keeps j = 1, 2 -> 55; row 1 keeps 2, 3 -> 550. */
    const double q[2] = {0, 0};
    const double k[4] = {0, 0, 0, 0};
    const double v[4] = {1, 10, 100, 1000};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[2];
    double lse[2];
    (void)state;

    opts.window_left = 1;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 4, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 370.0, 1e-12);
    assert_near(o[1], 550.0, 1e-12);
    assert_near(lse[0], log2(3.0), 1e-15);
    assert_near(lse[1], 1.0, 1e-15);

    opts.causal = true;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 4, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 55.0, 1e-13);
    assert_near(o[1], 550.0, 1e-12);

    /* w = 0 keeps exactly j = p: row 0 -> v2 = 100, row 1 -> v3 = 1000. */
    opts.window_left = 0;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 4, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 100.0, 0.0);
    assert_near(o[1], 1000.0, 0.0);
    assert_near(lse[0], 0.0, 0.0);
}

static void test_attn_qo_longer_than_kv(void **state) {
    /* qo 3, kv 1, causal: p = -2, -1, 0. Rows 0 and 1 keep nothing -> o = 0, lse = -inf. Row 2
       keeps j = 0 with logit q*k = 1 * 2 = 2 (sm_scale 1) -> o = v0 = 7, lse = 2 / ln 2. */
    const double q[3] = {1, 1, 1};
    const double k[1] = {2};
    const double v[1] = {7};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[3] = {NAN, NAN, NAN};
    double lse[3] = {NAN, NAN, NAN};
    (void)state;

    opts.sm_scale = 1.0;
    opts.causal = true;
    assert_int_equal(cinfer__ref_attention(&heads, 3, 1, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 0.0, 0.0);
    assert_near(o[1], 0.0, 0.0);
    assert_neg_inf(lse[0]);
    assert_neg_inf(lse[1]);
    assert_near(o[2], 7.0, 0.0);
    assert_near(lse[2], 2.8853900817779268, 1e-15);
}

static void test_attn_kv_len_zero(void **state) {
    /* No keys at all: o = 0 and lse = -inf; with a sink the denominator is e^sink alone, so
       o = 0 and lse = sink / ln 2; sigmoid gives 0 and leaves lse alone. */
    const double q[4] = {1, 2, 3, 4};
    const double sinks[2] = {1.5, -3.0};
    const cinfer__ref_heads_t heads = make_heads(2, 1, 2, 1);
    cinfer__ref_attn_opts_t opts = make_opts(2);
    double o[2] = {NAN, NAN};
    double lse[2] = {NAN, NAN};
    (void)state;

    assert_int_equal(cinfer__ref_attention(&heads, 1, 0, q, NULL, NULL, &opts, o, lse), 0);
    assert_near(o[0], 0.0, 0.0);
    assert_near(o[1], 0.0, 0.0);
    assert_neg_inf(lse[0]);
    assert_neg_inf(lse[1]);

    opts.variant = CINFER__REF_VARIANT_SINKS;
    opts.sinks = sinks;
    o[0] = o[1] = NAN;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 0, q, NULL, NULL, &opts, o, lse), 0);
    assert_near(o[0], 0.0, 0.0);
    assert_near(lse[0], 1.5 / LN2, 1e-15);
    assert_near(lse[1], -3.0 / LN2, 1e-15);

    opts.variant = CINFER__REF_VARIANT_SIGMOID;
    o[0] = o[1] = NAN;
    lse[0] = lse[1] = 123.0;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 0, q, NULL, NULL, &opts, o, lse), 0);
    assert_near(o[1], 0.0, 0.0);
    assert_near(lse[0], 123.0, 0.0);
}

static void test_attn_soft_cap_and_alibi_order(void **state) {
    /* One key, q*k = 4, sm_scale 1, cap 2: s = 2 tanh(4 / 2) = 1.92806. */
    const double q1[1] = {4};
    const double k1[1] = {1};
    const double v1[1] = {1};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[1];
    double lse[1];
    double logits[2];
    (void)state;

    opts.sm_scale = 1.0;
    opts.logits_soft_cap = 2.0;
    opts.logits_out = logits;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, q1, k1, v1, &opts, o, lse), 0);
    assert_near(logits[0], 1.9280551601516338, 1e-15);
    assert_near(lse[0], 1.9280551601516338 / LN2, 1e-14);

    /* ALiBi is added before the cap. qo 1, kv 2 -> p = 1, q*k = 1, slope 1:
       j = 0: 1 + 1 * (0 - 1) = 0 -> 2 tanh(0) = 0; j = 1: 1 + 0 = 1 -> 2 tanh(0.5) = 0.92423.
       (Capping first would give 2 tanh(0.5) - 1 for j = 0.) */
    const double q_one[1] = {1};
    const double k2[2] = {1, 1};
    const double v2[2] = {1, 1};
    const double slope[1] = {1.0};
    opts.alibi = true;
    opts.alibi_slopes = slope;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q_one, k2, v2, &opts, o, lse), 0);
    assert_near(logits[0], 0.0, 1e-15);
    assert_near(logits[1], 0.9242343145200195, 1e-15);

    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q_one, k2, v2, &opts, o, NULL), 0);
    opts.logits_soft_cap = -1.0;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q_one, k2, v2, &opts, o, lse),
                     CINFER__REF_EINVAL);
}

static void test_alibi_default_slopes(void **state) {
    double s[12];
    (void)state;

    /* H = 8 (a power of two): 2^(-8 (h + 1) / 8) = 2^-1 ... 2^-8. */
    assert_int_equal(cinfer__ref_alibi_default_slopes(8, s), 0);
    const double want8[8] = {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625};
    for (int h = 0; h < 8; h++) {
        assert_near(s[h], want8[h], 1e-17);
    }
    /* H = 6: the paper's get_slopes(6) = get_slopes_power_of_2(4) = [1/4, 1/16, 1/64, 1/256]
       followed by get_slopes(8)[0::2][:2] = [1/2, 1/8]. */
    assert_int_equal(cinfer__ref_alibi_default_slopes(6, s), 0);
    const double want6[6] = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
    for (int h = 0; h < 6; h++) {
        assert_near(s[h], want6[h], 1e-17);
    }
    /* H = 12: the 8-head series, then the 16-head series 2^(-k/2) at k = 1, 3, 5, 7. */
    assert_int_equal(cinfer__ref_alibi_default_slopes(12, s), 0);
    assert_near(s[7], 0.00390625, 1e-17);
    assert_near(s[8], 0.70710678118654752, 1e-15);
    assert_near(s[9], 0.35355339059327376, 1e-15);
    assert_near(s[11], 0.088388347648318440, 1e-15);
    /* H = 1: 2^-8. */
    assert_int_equal(cinfer__ref_alibi_default_slopes(1, s), 0);
    assert_near(s[0], 0.00390625, 1e-17);
    assert_int_equal(cinfer__ref_alibi_default_slopes(0, s), CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_alibi_default_slopes(4, NULL), CINFER__REF_EINVAL);
}

static void test_attn_alibi_default_in_attention(void **state) {
    /* H = 2 with default slopes 2^-4, 2^-8; qo 1, kv 3 -> p = 2, q = 0 so s = slope (j - 2):
       head 0: -0.125, -0.0625, 0; head 1: -1/128, -1/256, 0. */
    const double q[2] = {0, 0};
    const double k[3] = {5, 6, 7};
    const double v[3] = {1, 2, 3};
    const cinfer__ref_heads_t heads = make_heads(2, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[2];
    double logits[6];
    (void)state;

    opts.alibi = true;
    opts.logits_out = logits;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 3, q, k, v, &opts, o, NULL), 0);
    assert_near(logits[0], -0.125, 0.0);
    assert_near(logits[1], -0.0625, 0.0);
    assert_near(logits[2], 0.0, 0.0);
    assert_near(logits[3], -1.0 / 128.0, 0.0);
    assert_near(logits[4], -1.0 / 256.0, 0.0);
}

static void test_attn_rope(void **state) {
    const cinfer__ref_heads_t heads1 = make_heads(1, 1, 4, 1);
    cinfer__ref_attn_opts_t opts = make_opts(4);
    double o[2];
    double logits[4];
    (void)state;

    /* At position 0 (qo 1, kv 1 -> p = 0, j = 0) cos = 1 and sin = 0 exactly, so RoPE is the
       identity: s = (1, 2, 3, 4) . (5, 6, 7, 8) = 5 + 12 + 21 + 32 = 70 with sm_scale 1. */
    const double q0[4] = {1, 2, 3, 4};
    const double k0[4] = {5, 6, 7, 8};
    const double v0[1] = {1};
    opts.sm_scale = 1.0;
    opts.rope_llama = true;
    opts.logits_out = logits;
    assert_int_equal(cinfer__ref_attention(&heads1, 1, 1, q0, k0, v0, &opts, o, NULL), 0);
    assert_near(logits[0], 70.0, 0.0);

    /* D = 4, theta = 4: pair 0 = (x0, x2) has freq 4^0 = 1, pair 1 = (x1, x3) has freq
       4^(-2/4) = 1/2. rope_scale = 1/pi makes the angle at position 1 pi for pair 0 and pi/2 for
       pair 1. qo 1, kv 2 -> q at p = 1, keys at 0 and 1.
       Head 0: q = (0, 1, 0, 0): pair 1 = (1, 0) turned by +90 degrees -> out1 = 1 cos - 0 sin
       = 0, out3 = 0 cos + 1 sin = 1, so q' = (0, 0, 0, 1).
       Head 1: q = (0, 0, 1, 0): pair 0 = (0, 1) turned by 180 -> q' = (0, 0, -1, 0).
       k0 = (0, 0, 0, 1) at position 0 is unchanged; k1 = (0, 0, 1, 0) at position 1 becomes
       (0, 0, -1, 0) like head 1's q.
       Logits: head 0: (1, 0); head 1: (0, 1) (equal positions keep the plain dot product).
       The interleaved convention would give head 0 logit 0 for k0, and the opposite rotation
       direction would give -1. */
    const cinfer__ref_heads_t heads2 = make_heads(2, 1, 4, 1);
    const double q[8] = {0, 1, 0, 0, 0, 0, 1, 0};
    const double k[8] = {0, 0, 0, 1, 0, 0, 1, 0};
    const double v[2] = {1, 2};
    opts.rope_theta = 4.0;
    opts.rope_scale = 1.0 / PI;
    assert_int_equal(cinfer__ref_attention(&heads2, 1, 2, q, k, v, &opts, o, NULL), 0);
    assert_near(logits[0], 1.0, 1e-15);
    assert_near(logits[1], 0.0, 1e-15);
    assert_near(logits[2], 0.0, 1e-15);
    assert_near(logits[3], 1.0, 1e-15);

    /* The first output of a pair: D = 2 (one pair, freq 1), rope_scale = 2/pi so position 1 is
       +90 degrees. q = (0, 1) at p = 1 -> out0 = 0 cos - 1 sin = -1, out1 = 1 cos + 0 sin = 0,
       q' = (-1, 0). k0 = (1, 0) at position 0 stays -> s0 = -1; k1 = (1, 0) at position 1
       becomes (0, 1) -> s1 = 0. */
    const cinfer__ref_heads_t heads3 = make_heads(1, 1, 2, 1);
    const double q3[2] = {0, 1};
    const double k3[4] = {1, 0, 1, 0};
    opts.rope_theta = 1e4;
    opts.rope_scale = 2.0 / PI;
    assert_int_equal(cinfer__ref_attention(&heads3, 1, 2, q3, k3, v, &opts, o, NULL), 0);
    assert_near(logits[0], -1.0, 1e-15);
    assert_near(logits[1], 0.0, 1e-15);

    /* rope_round: the rotated vectors rounded to a 16-bit dtype. D = 2, scale 1: q = (1, 0) at
       p = 1 turns by 1 radian to (cos 1, sin 1); k = (1, 0) at position 0 stays, so the logit is
       cos 1 = 0.5403023..., in bf16 138 / 256 = 0.5390625, in fp16 1107 / 2048 = 0.54052734375. */
    const double q4[2] = {1, 0};
    opts.rope_scale = 1.0;
    opts.rope_round = -1;
    assert_int_equal(cinfer__ref_attention(&heads3, 1, 2, q4, k3, v, &opts, o, NULL), 0);
    assert_near(logits[0], cos(1.0), 1e-15);
    opts.rope_round = CINFER__REF_DTYPE_BF16;
    assert_int_equal(cinfer__ref_attention(&heads3, 1, 2, q4, k3, v, &opts, o, NULL), 0);
    assert_near(logits[0], 0.5390625, 0.0);
    opts.rope_round = CINFER__REF_DTYPE_F16;
    assert_int_equal(cinfer__ref_attention(&heads3, 1, 2, q4, k3, v, &opts, o, NULL), 0);
    assert_near(logits[0], 0.54052734375, 0.0);
    opts.rope_round = CINFER__REF_DTYPE_E4M3; /* only the 16-bit dtypes */
    assert_int_equal(cinfer__ref_attention(&heads3, 1, 2, q4, k3, v, &opts, o, NULL),
                     CINFER__REF_EINVAL);
    opts.rope_round = -1;

    /* RoPE needs pairs: an odd head dim is rejected. */
    const cinfer__ref_heads_t odd = make_heads(1, 1, 3, 1);
    assert_int_equal(cinfer__ref_attention(&odd, 1, 1, q, k, v, &opts, o, NULL),
                     CINFER__REF_EINVAL);
}

static void test_attn_gqa_mapping(void **state) {
    /* One key, so every head outputs the value of the KV head it reads. Hq 6, Hk 2 (group 3):
       heads 0-2 read KV head 0 (v = 10), heads 3-5 read KV head 1 (v = 20). A head % Hk mapping
       would alternate 10, 20. */
    const double q[6] = {1, 2, 3, 4, 5, 6};
    const double k[2] = {1, -1};
    const double v[2] = {10, 20};
    const cinfer__ref_heads_t heads = make_heads(6, 2, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[6];
    double lse[6];
    (void)state;

    opts.sm_scale = 1.0;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, q, k, v, &opts, o, lse), 0);
    const double want[6] = {10, 10, 10, 20, 20, 20};
    for (int h = 0; h < 6; h++) {
        assert_near(o[h], want[h], 0.0);
    }
    /* lse = s / ln 2 with s = q_h * k_{kv(h)}: head 1 -> 2 * 1 = 2, head 4 -> 5 * -1 = -5. */
    assert_near(lse[1], 2.0 / LN2, 1e-15);
    assert_near(lse[4], -5.0 / LN2, 1e-15);

    const cinfer__ref_heads_t bad = make_heads(3, 2, 1, 1);
    assert_int_equal(cinfer__ref_attention(&bad, 1, 1, q, k, v, &opts, o, lse), CINFER__REF_EINVAL);
}

static void test_attn_sinks(void **state) {
    /* One key with logit 0 (q = 0), v = 6. Head 0 sink 0: o = 6 * 1 / (1 + 1) = 3,
       lse = log2(2) = 1. Head 1 sink ln 3: o = 6 / (3 + 1) = 1.5, lse = log2(4) = 2. */
    const double q[2] = {0, 0};
    const double k[1] = {1};
    const double v[1] = {6};
    const double sinks[2] = {0.0, log(3.0)};
    const cinfer__ref_heads_t heads = make_heads(2, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[4];
    double lse[4];
    (void)state;

    opts.variant = CINFER__REF_VARIANT_SINKS;
    opts.sinks = sinks;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 3.0, 1e-15);
    assert_near(lse[0], 1.0, 1e-15);
    assert_near(o[1], 1.5, 1e-15);
    assert_near(lse[1], 2.0, 1e-15);

    /* A huge sink must not overflow: o = 6 e^0 / (e^1000 + 1) = 0 in double, lse = 1000 / ln 2
       (log2(1 + e^-1000) is far below double resolution). */
    const double big[2] = {1000.0, 1000.0};
    opts.sinks = big;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 0.0, 1e-300);
    assert_near(lse[0], 1000.0 / LN2, 1e-12);

    /* qo 2, kv 1, causal: row 0 has p = -1 and keeps nothing -> o = 0, lse = sink / ln 2;
       row 1 is the first case again. */
    const double q2[4] = {0, 0, 0, 0};
    opts.sinks = sinks;
    opts.causal = true;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 1, q2, k, v, &opts, o, lse), 0);
    assert_near(o[0], 0.0, 0.0);
    assert_near(lse[0], 0.0, 0.0);
    assert_near(lse[1], log(3.0) / LN2, 1e-15);
    assert_near(o[3], 1.5, 1e-15);

    opts.sinks = NULL;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 1, q2, k, v, &opts, o, lse),
                     CINFER__REF_EINVAL);
}

static void test_attn_sigmoid(void **state) {
    /* q = 1, k = (0.5, -0.25), sm_scale 1 -> s = (0.5, -0.25); sigmoid_scale 2, bias -1 ->
       x = (0, -1.5) -> sigmoid = (0.5, 1 / (1 + e^1.5) = 0.182426). With v = (2, 4):
       o = 1 + 4 / (1 + e^1.5) = 1.72970. No normalizer: lse stays at its sentinel. */
    const double q[1] = {1};
    const double k[2] = {0.5, -0.25};
    const double v[2] = {2, 4};
    const uint8_t mask[2] = {1, 0};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[1];
    double lse[1] = {123.0};
    (void)state;

    opts.sm_scale = 1.0;
    opts.variant = CINFER__REF_VARIANT_SIGMOID;
    opts.sigmoid_scale = 2.0;
    opts.sigmoid_bias = -1.0;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 1.0 + 4.0 / (1.0 + exp(1.5)), 1e-15);
    assert_near(o[0], 1.7297020952254254, 1e-15);
    assert_near(lse[0], 123.0, 0.0);

    /* A masked key contributes nothing: only j = 0 remains -> 0.5 * 2 = 1. */
    opts.custom_mask = mask;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 1.0, 1e-15);
}

static void test_attn_kv_scales(void **state) {
    /* q = 1, k = (1, 0), sm_scale 1, k_scale 2 -> s = (2, 0); v = (1, 0), v_scale 0.5:
       o = 0.5 e^2 / (e^2 + 1) = 0.440399, lse = log2(e^2 + 1) = 3.06851 (v_scale does not
       touch lse). */
    const double q[1] = {1};
    const double k[2] = {1, 0};
    const double v[2] = {1, 0};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[1];
    double lse[1];
    (void)state;

    opts.sm_scale = 1.0;
    opts.k_scale = 2.0;
    opts.v_scale = 0.5;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 2, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 0.4403985389889412, 1e-15);
    assert_near(lse[0], 3.068508493859523, 1e-14);
}

static void test_attn_custom_mask(void **state) {
    /* qo 2, kv 2, all logits 0. Mask rows (1, 0) and (0, 1): row 0 sees only v0 = 3, row 1 only
       v1 = 5; one kept logit of 0 -> lse = log2(1) = 0. Adding causal (p = 0, 1) leaves row 0
       with j = 0 dropped by the mask and j = 1 dropped by causal -> empty: 0 and -inf. */
    const double q[2] = {0, 0};
    const double k[2] = {0, 0};
    const double v[2] = {3, 5};
    const uint8_t mask[4] = {1, 0, 0, 1};
    const uint8_t mask2[4] = {0, 1, 1, 1};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    double o[2];
    double lse[2];
    (void)state;

    opts.custom_mask = mask;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 2, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 3.0, 0.0);
    assert_near(o[1], 5.0, 0.0);
    assert_near(lse[0], 0.0, 0.0);

    opts.custom_mask = mask2;
    opts.causal = true;
    assert_int_equal(cinfer__ref_attention(&heads, 2, 2, q, k, v, &opts, o, lse), 0);
    assert_near(o[0], 0.0, 0.0);
    assert_neg_inf(lse[0]);
    assert_near(o[1], 4.0, 1e-15);
    assert_near(lse[1], 1.0, 1e-15);
}

static void test_attn_invalid_arguments(void **state) {
    const double x[4] = {0, 0, 0, 0};
    const cinfer__ref_heads_t heads = make_heads(1, 1, 2, 2);
    cinfer__ref_attn_opts_t opts = make_opts(2);
    double o[4];
    (void)state;

    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, x, x, x, NULL, o, NULL),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_attention(NULL, 1, 1, x, x, x, &opts, o, NULL),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_attention(&heads, -1, 1, x, x, x, &opts, o, NULL),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, x, NULL, x, &opts, o, NULL),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, x, x, x, &opts, NULL, NULL),
                     CINFER__REF_EINVAL);
    opts.window_left = -2;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, x, x, x, &opts, o, NULL),
                     CINFER__REF_EINVAL);
    opts.window_left = -1;
    opts.logits_soft_cap = NAN;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, x, x, x, &opts, o, NULL),
                     CINFER__REF_EINVAL);
    opts.logits_soft_cap = 0.0;
    opts.variant = (cinfer__ref_variant_t)7;
    assert_int_equal(cinfer__ref_attention(&heads, 1, 1, x, x, x, &opts, o, NULL),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_attn_opts_init(NULL, 4), CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_attn_opts_init(&opts, 0), CINFER__REF_EINVAL);
    assert_true(isnan(cinfer__ref_default_sm_scale(0)));
    assert_near(cinfer__ref_default_sm_scale(64), 0.125, 0.0);
}

/* ---------------------------------------------------------------------------------------------- */
/* 3. Layout wrappers: every layout must give exactly the core's answer on the same data */
/* ---------------------------------------------------------------------------------------------- */

#define L_BATCH 4
#define L_HQ    4
#define L_HK    2
#define L_DQK   8
#define L_DVO   4

/* Requests: (qo_len, kv_len) = (2, 5), (1, 0), (3, 7), (4, 3); the last has qo > kv, so with
   causal its first row is fully masked. */
static const int32_t l_qo_indptr[L_BATCH + 1] = {0, 2, 3, 6, 10};
static const int32_t l_kv_indptr[L_BATCH + 1] = {0, 5, 5, 12, 15};
#define L_TOTAL_QO 10
#define L_TOTAL_KV 15

typedef struct {
    uint16_t q[L_TOTAL_QO * L_HQ * L_DQK]; /* fp16 [total_qo, Hq, Dqk] */
    uint16_t k[L_TOTAL_KV * L_HK * L_DQK]; /* fp16 [total_kv, Hk, Dqk] */
    uint16_t v[L_TOTAL_KV * L_HK * L_DVO]; /* fp16 [total_kv, Hk, Dvo] */
    uint8_t mask[2 * 5 + 1 * 0 + 3 * 7 + 4 * 3];
    int32_t mask_indptr[L_BATCH + 1];
} layout_data_t;

static void layout_fill(layout_data_t *d) {
    double x;
    for (size_t i = 0; i < sizeof d->q / sizeof d->q[0]; i++) {
        x = rng_uniform() * 2.0;
        d->q[i] = cinfer__ref_double_to_f16(x);
    }
    for (size_t i = 0; i < sizeof d->k / sizeof d->k[0]; i++) {
        d->k[i] = cinfer__ref_double_to_f16(rng_uniform() * 2.0);
    }
    for (size_t i = 0; i < sizeof d->v / sizeof d->v[0]; i++) {
        d->v[i] = cinfer__ref_double_to_f16(rng_uniform());
    }
    for (size_t i = 0; i < sizeof d->mask; i++) {
        d->mask[i] = rng_uniform() > -0.4 ? 1 : 0;
    }
    d->mask_indptr[0] = 0;
    for (int b = 0; b < L_BATCH; b++) {
        const int32_t qo = l_qo_indptr[b + 1] - l_qo_indptr[b];
        const int32_t kv = l_kv_indptr[b + 1] - l_kv_indptr[b];
        d->mask_indptr[b + 1] = d->mask_indptr[b] + qo * kv;
    }
}

/* The expected answer: decode the ragged buffers and run the core once per request. */
static void layout_expected(const layout_data_t *d, const cinfer__ref_attn_opts_t *opts_in,
                            bool use_mask, double *o, double *lse) {
    const cinfer__ref_heads_t heads = make_heads(L_HQ, L_HK, L_DQK, L_DVO);
    static double q[L_TOTAL_QO * L_HQ * L_DQK];
    static double k[L_TOTAL_KV * L_HK * L_DQK];
    static double v[L_TOTAL_KV * L_HK * L_DVO];
    assert_int_equal(
        cinfer__ref_to_double(CINFER__REF_DTYPE_F16, d->q, L_TOTAL_QO * L_HQ * L_DQK, q), 0);
    assert_int_equal(
        cinfer__ref_to_double(CINFER__REF_DTYPE_F16, d->k, L_TOTAL_KV * L_HK * L_DQK, k), 0);
    assert_int_equal(
        cinfer__ref_to_double(CINFER__REF_DTYPE_F16, d->v, L_TOTAL_KV * L_HK * L_DVO, v), 0);
    for (int b = 0; b < L_BATCH; b++) {
        cinfer__ref_attn_opts_t opts = *opts_in;
        const int32_t q0 = l_qo_indptr[b];
        const int32_t k0 = l_kv_indptr[b];
        opts.custom_mask = use_mask ? d->mask + d->mask_indptr[b] : NULL;
        opts.logits_out = NULL;
        assert_int_equal(cinfer__ref_attention(&heads, l_qo_indptr[b + 1] - q0,
                                               l_kv_indptr[b + 1] - k0, q + q0 * L_HQ * L_DQK,
                                               k + k0 * L_HK * L_DQK, v + k0 * L_HK * L_DVO, &opts,
                                               o + q0 * L_HQ * L_DVO, lse + q0 * L_HQ),
                         0);
    }
}

/* Exact equality, with -inf == -inf, as both sides run the same double arithmetic. */
static void assert_same(const double *a, const double *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!(a[i] == b[i])) {
            print_error("element %lld: %.17g vs %.17g\n", (long long)i, a[i], b[i]);
            fail();
        }
    }
}

/* Writes fp16 element (page, slot, h, d) of a paged cache described by t. */
static void paged_put(const cinfer__ref_paged_t *t, uint16_t *base, int64_t page, int64_t slot,
                      int64_t h, int64_t d, uint16_t bits) {
    base[page * t->stride_page + slot * t->stride_slot + h * t->stride_head + d * t->stride_dim] =
        bits;
}

/*
 * Builds a paged copy of the ragged K/V with pages handed out in a scrambled order, every unused
 * page and every unused slot of a last page filled with fp16 NaN (so that reading a wrong slot
 * would poison the output), and checks batch_paged against the expected answer.
 */
static void check_paged(const layout_data_t *d, cinfer__ref_layout_t layout, int64_t page_size,
                        const cinfer__ref_attn_opts_t *opts, bool use_mask) {
    const cinfer__ref_heads_t heads = make_heads(L_HQ, L_HK, L_DQK, L_DVO);
    int32_t indptr[L_BATCH + 1];
    int32_t last[L_BATCH];
    int32_t indices[L_TOTAL_KV + L_BATCH];
    int64_t total_pages = 0;
    static double want_o[L_TOTAL_QO * L_HQ * L_DVO];
    static double want_lse[L_TOTAL_QO * L_HQ];
    static double got_o[L_TOTAL_QO * L_HQ * L_DVO];
    static double got_lse[L_TOTAL_QO * L_HQ];

    indptr[0] = 0;
    for (int b = 0; b < L_BATCH; b++) {
        const int64_t kv = l_kv_indptr[b + 1] - l_kv_indptr[b];
        const int64_t pages = (kv + page_size - 1) / page_size;
        indptr[b + 1] = indptr[b] + (int32_t)pages;
        /* A request without pages gets a nonsense last_page_len, which must be ignored. */
        last[b] = pages > 0 ? (int32_t)(kv - (pages - 1) * page_size) : 0;
        total_pages += pages;
    }
    /* Two spare pages, and page p of the list gets physical page (7 p + 3) mod max_pages, a
       permutation because 7 is coprime with every max_pages used here. */
    const int64_t max_pages = total_pages + 2;
    assert_true(max_pages % 7 != 0);
    for (int64_t p = 0; p < total_pages; p++) {
        indices[p] = (int32_t)((7 * p + 3) % max_pages);
    }

    const int64_t k_elems = max_pages * page_size * L_HK * L_DQK;
    const int64_t v_elems = max_pages * page_size * L_HK * L_DVO;
    uint16_t *kc = malloc((size_t)k_elems * sizeof(uint16_t));
    uint16_t *vc = malloc((size_t)v_elems * sizeof(uint16_t));
    assert_non_null(kc);
    assert_non_null(vc);
    for (int64_t i = 0; i < k_elems; i++) {
        kc[i] = 0x7E00;
    }
    for (int64_t i = 0; i < v_elems; i++) {
        vc[i] = 0x7E00;
    }
    cinfer__ref_paged_t kt;
    cinfer__ref_paged_t vt;
    assert_int_equal(
        cinfer__ref_paged_packed(&kt, kc, CINFER__REF_DTYPE_F16, layout, page_size, L_HK, L_DQK),
        0);
    assert_int_equal(
        cinfer__ref_paged_packed(&vt, vc, CINFER__REF_DTYPE_F16, layout, page_size, L_HK, L_DVO),
        0);
    for (int b = 0; b < L_BATCH; b++) {
        for (int64_t t = 0; t < l_kv_indptr[b + 1] - l_kv_indptr[b]; t++) {
            const int64_t page = indices[indptr[b] + t / page_size];
            const int64_t slot = t % page_size;
            const int64_t tok = l_kv_indptr[b] + t;
            for (int64_t h = 0; h < L_HK; h++) {
                for (int64_t x = 0; x < L_DQK; x++) {
                    paged_put(&kt, kc, page, slot, h, x, d->k[(tok * L_HK + h) * L_DQK + x]);
                }
                for (int64_t x = 0; x < L_DVO; x++) {
                    paged_put(&vt, vc, page, slot, h, x, d->v[(tok * L_HK + h) * L_DVO + x]);
                }
            }
        }
    }

    cinfer__ref_page_table_t table = {L_BATCH, page_size, max_pages, indptr, indices, last};
    cinfer__ref_strided3_t qt;
    assert_int_equal(cinfer__ref_strided3_packed(&qt, d->q, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, L_TOTAL_QO, L_HQ, L_DQK),
                     0);
    layout_expected(d, opts, use_mask, want_o, want_lse);
    for (size_t i = 0; i < sizeof got_o / sizeof got_o[0]; i++) {
        got_o[i] = NAN;
    }
    assert_int_equal(cinfer__ref_batch_paged(
                         &heads, &qt, l_qo_indptr, &kt, &vt, &table, use_mask ? d->mask : NULL,
                         use_mask ? d->mask_indptr : NULL, opts, got_o, got_lse),
                     0);
    assert_same(got_o, want_o, L_TOTAL_QO * L_HQ * L_DVO);
    assert_same(got_lse, want_lse, L_TOTAL_QO * L_HQ);

    /* Batch decode: qo_indptr NULL means one query row per request (rows 0..3 of q). */
    static double dec_o[L_BATCH * L_HQ * L_DVO];
    static double dec_lse[L_BATCH * L_HQ];
    const int32_t dec_indptr[L_BATCH + 1] = {0, 1, 2, 3, 4};
    cinfer__ref_attn_opts_t dec_opts = *opts;
    assert_int_equal(cinfer__ref_batch_paged(&heads, &qt, NULL, &kt, &vt, &table, NULL, NULL,
                                             &dec_opts, dec_o, dec_lse),
                     0);
    assert_int_equal(cinfer__ref_batch_paged(&heads, &qt, dec_indptr, &kt, &vt, &table, NULL, NULL,
                                             &dec_opts, got_o, got_lse),
                     0);
    assert_same(dec_o, got_o, L_BATCH * L_HQ * L_DVO);
    assert_same(dec_lse, got_lse, L_BATCH * L_HQ);

    free(vc);
    free(kc);
}

static void test_layout_paged_equals_ragged(void **state) {
    static layout_data_t d;
    const cinfer__ref_heads_t heads = make_heads(L_HQ, L_HK, L_DQK, L_DVO);
    cinfer__ref_attn_opts_t opts = make_opts(L_DQK);
    static double want_o[L_TOTAL_QO * L_HQ * L_DVO];
    static double want_lse[L_TOTAL_QO * L_HQ];
    static double got_o[L_TOTAL_QO * L_HQ * L_DVO];
    static double got_lse[L_TOTAL_QO * L_HQ];
    cinfer__ref_strided3_t qt;
    cinfer__ref_strided3_t kt;
    cinfer__ref_strided3_t vt;
    (void)state;

    layout_fill(&d);
    opts.causal = true;
    opts.logits_soft_cap = 5.0;
    assert_int_equal(cinfer__ref_strided3_packed(&qt, d.q, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, L_TOTAL_QO, L_HQ, L_DQK),
                     0);
    assert_int_equal(cinfer__ref_strided3_packed(&kt, d.k, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, L_TOTAL_KV, L_HK, L_DQK),
                     0);
    assert_int_equal(cinfer__ref_strided3_packed(&vt, d.v, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, L_TOTAL_KV, L_HK, L_DVO),
                     0);

    for (int use_mask = 0; use_mask < 2; use_mask++) {
        layout_expected(&d, &opts, use_mask, want_o, want_lse);
        /* The last request (qo 4, kv 3) has p = -1 for its first row: fully masked by causal. */
        assert_near(want_o[6 * L_HQ * L_DVO], 0.0, 0.0);
        assert_neg_inf(want_lse[6 * L_HQ]);

        assert_int_equal(cinfer__ref_batch_ragged(&heads, L_BATCH, &qt, l_qo_indptr, &kt, &vt,
                                                  l_kv_indptr, use_mask ? d.mask : NULL,
                                                  use_mask ? d.mask_indptr : NULL, &opts, got_o,
                                                  got_lse),
                         0);
        assert_same(got_o, want_o, L_TOTAL_QO * L_HQ * L_DVO);
        assert_same(got_lse, want_lse, L_TOTAL_QO * L_HQ);

        check_paged(&d, CINFER__REF_LAYOUT_NHD, 1, &opts, use_mask);
        check_paged(&d, CINFER__REF_LAYOUT_HND, 1, &opts, use_mask);
        check_paged(&d, CINFER__REF_LAYOUT_NHD, 3, &opts, use_mask);
        check_paged(&d, CINFER__REF_LAYOUT_HND, 3, &opts, use_mask);
    }

    /* mask_indptr is honoured, not recomputed: the same masks with 3 padding bytes (all 0)
       after each request must give the unpadded answer. */
    uint8_t padded[sizeof d.mask + 3 * L_BATCH];
    int32_t padded_indptr[L_BATCH + 1];
    memset(padded, 0, sizeof padded);
    for (int b = 0; b <= L_BATCH; b++) {
        padded_indptr[b] = d.mask_indptr[b] + 3 * b;
    }
    for (int b = 0; b < L_BATCH; b++) {
        memcpy(padded + padded_indptr[b], d.mask + d.mask_indptr[b],
               (size_t)(d.mask_indptr[b + 1] - d.mask_indptr[b]));
    }
    layout_expected(&d, &opts, true, want_o, want_lse);
    assert_int_equal(cinfer__ref_batch_ragged(&heads, L_BATCH, &qt, l_qo_indptr, &kt, &vt,
                                              l_kv_indptr, padded, padded_indptr, &opts, got_o,
                                              got_lse),
                     0);
    assert_same(got_o, want_o, L_TOTAL_QO * L_HQ * L_DVO);
    assert_same(got_lse, want_lse, L_TOTAL_QO * L_HQ);

    /* A custom mask is passed as batch arguments, never through opts. */
    opts.custom_mask = d.mask;
    assert_int_equal(cinfer__ref_batch_ragged(&heads, L_BATCH, &qt, l_qo_indptr, &kt, &vt,
                                              l_kv_indptr, NULL, NULL, &opts, got_o, got_lse),
                     CINFER__REF_EINVAL);
}

static void test_layout_logits_dump_concatenated(void **state) {
    /* Batch logits are request blocks [Hq, qo_b, kv_b] back to back: 4 * (2*5 + 0 + 3*7 + 4*3)
       = 172 doubles. Each block must equal the core's dump for that request. */
    static layout_data_t d;
    const cinfer__ref_heads_t heads = make_heads(L_HQ, L_HK, L_DQK, L_DVO);
    cinfer__ref_attn_opts_t opts = make_opts(L_DQK);
    static double logits[172];
    static double one[L_HQ * 4 * 7];
    static double o[L_TOTAL_QO * L_HQ * L_DVO];
    static double q[L_TOTAL_QO * L_HQ * L_DQK];
    static double k[L_TOTAL_KV * L_HK * L_DQK];
    static double v[L_TOTAL_KV * L_HK * L_DVO];
    cinfer__ref_strided3_t qt;
    cinfer__ref_strided3_t kt;
    cinfer__ref_strided3_t vt;
    int64_t offset = 0;
    (void)state;

    layout_fill(&d);
    opts.causal = true;
    assert_int_equal(cinfer__ref_strided3_packed(&qt, d.q, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, L_TOTAL_QO, L_HQ, L_DQK),
                     0);
    assert_int_equal(cinfer__ref_strided3_packed(&kt, d.k, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, L_TOTAL_KV, L_HK, L_DQK),
                     0);
    assert_int_equal(cinfer__ref_strided3_packed(&vt, d.v, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, L_TOTAL_KV, L_HK, L_DVO),
                     0);
    opts.logits_out = logits;
    assert_int_equal(cinfer__ref_batch_ragged(&heads, L_BATCH, &qt, l_qo_indptr, &kt, &vt,
                                              l_kv_indptr, NULL, NULL, &opts, o, NULL),
                     0);

    assert_int_equal(
        cinfer__ref_to_double(CINFER__REF_DTYPE_F16, d.q, L_TOTAL_QO * L_HQ * L_DQK, q), 0);
    assert_int_equal(
        cinfer__ref_to_double(CINFER__REF_DTYPE_F16, d.k, L_TOTAL_KV * L_HK * L_DQK, k), 0);
    assert_int_equal(
        cinfer__ref_to_double(CINFER__REF_DTYPE_F16, d.v, L_TOTAL_KV * L_HK * L_DVO, v), 0);
    for (int b = 0; b < L_BATCH; b++) {
        const int64_t qo = l_qo_indptr[b + 1] - l_qo_indptr[b];
        const int64_t kv = l_kv_indptr[b + 1] - l_kv_indptr[b];
        double ob[4 * L_HQ * L_DVO];
        opts.logits_out = one;
        assert_int_equal(cinfer__ref_attention(&heads, qo, kv, q + l_qo_indptr[b] * L_HQ * L_DQK,
                                               k + l_kv_indptr[b] * L_HK * L_DQK,
                                               v + l_kv_indptr[b] * L_HK * L_DVO, &opts, ob, NULL),
                         0);
        assert_same(logits + offset, one, L_HQ * qo * kv);
        offset += L_HQ * qo * kv;
    }
    assert_int_equal(offset, 172);
}

static void test_layout_single_strided(void **state) {
    /* Request 2 of the layout data (qo 3, kv 7) through cinfer__ref_single, with q taken as a
       slice of a packed QKV tensor [qo, Hq + 2 Hk, D] (token stride (Hq + 2 Hk) * D) and K, V in
       HND layout [Hk, kv, D]. It must equal the core on the same numbers. */
    static layout_data_t d;
    const cinfer__ref_heads_t heads = make_heads(L_HQ, L_HK, L_DQK, L_DQK);
    cinfer__ref_attn_opts_t opts = make_opts(L_DQK);
    enum { QO = 3, KV = 7, HT = L_HQ + 2 * L_HK };
    uint16_t qkv[QO * HT * L_DQK];
    uint16_t k_hnd[L_HK * KV * L_DQK];
    uint16_t v_hnd[L_HK * KV * L_DQK];
    double qd[QO * L_HQ * L_DQK];
    double kd[KV * L_HK * L_DQK];
    double vd[KV * L_HK * L_DQK];
    double want_o[QO * L_HQ * L_DQK];
    double want_lse[QO * L_HQ];
    double got_o[QO * L_HQ * L_DQK];
    double got_lse[QO * L_HQ];
    cinfer__ref_strided3_t qt = {qkv, CINFER__REF_DTYPE_F16, HT * L_DQK, L_DQK, 1};
    cinfer__ref_strided3_t kt;
    cinfer__ref_strided3_t vt;
    (void)state;

    layout_fill(&d);
    for (int i = 0; i < QO * HT * L_DQK; i++) {
        qkv[i] = cinfer__ref_double_to_f16(rng_uniform());
    }
    for (int t = 0; t < KV; t++) {
        for (int h = 0; h < L_HK; h++) {
            for (int x = 0; x < L_DQK; x++) {
                /* K and V both come from the K data, V shifted by one token. */
                k_hnd[(h * KV + t) * L_DQK + x] = d.k[((5 + t) * L_HK + h) * L_DQK + x];
                v_hnd[(h * KV + t) * L_DQK + x] = d.k[((5 + (t + 1) % KV) * L_HK + h) * L_DQK + x];
                kd[(t * L_HK + h) * L_DQK + x] =
                    cinfer__ref_f16_to_double(k_hnd[(h * KV + t) * L_DQK + x]);
                vd[(t * L_HK + h) * L_DQK + x] =
                    cinfer__ref_f16_to_double(v_hnd[(h * KV + t) * L_DQK + x]);
            }
        }
    }
    for (int t = 0; t < QO; t++) {
        for (int h = 0; h < L_HQ; h++) {
            for (int x = 0; x < L_DQK; x++) {
                qd[(t * L_HQ + h) * L_DQK + x] =
                    cinfer__ref_f16_to_double(qkv[(t * HT + h) * L_DQK + x]);
            }
        }
    }
    assert_int_equal(cinfer__ref_strided3_packed(&kt, k_hnd, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_HND, KV, L_HK, L_DQK),
                     0);
    assert_int_equal(cinfer__ref_strided3_packed(&vt, v_hnd, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_HND, KV, L_HK, L_DQK),
                     0);
    opts.causal = true;
    opts.rope_llama = true;
    opts.alibi = true;
    assert_int_equal(cinfer__ref_attention(&heads, QO, KV, qd, kd, vd, &opts, want_o, want_lse), 0);
    assert_int_equal(cinfer__ref_single(&heads, QO, KV, &qt, &kt, &vt, &opts, got_o, got_lse), 0);
    assert_same(got_o, want_o, QO * L_HQ * L_DQK);
    assert_same(got_lse, want_lse, QO * L_HQ);
}

static void test_page_table_validation(void **state) {
    const cinfer__ref_heads_t heads = make_heads(1, 1, 1, 1);
    cinfer__ref_attn_opts_t opts = make_opts(1);
    uint16_t cache[4 * 2] = {0};
    uint16_t qbits[3] = {0};
    double o[3];
    int32_t indptr[4] = {0, 2, 2, 3};
    int32_t indices[3] = {0, 3, 1};
    int32_t last[3] = {1, 0, 2};
    cinfer__ref_page_table_t table = {3, 2, 4, indptr, indices, last};
    cinfer__ref_paged_t kt;
    cinfer__ref_strided3_t qt;
    int64_t kv_len = -1;
    (void)state;

    assert_int_equal(cinfer__ref_paged_packed(&kt, cache, CINFER__REF_DTYPE_F16,
                                              CINFER__REF_LAYOUT_NHD, 2, 1, 1),
                     0);
    assert_int_equal(cinfer__ref_strided3_packed(&qt, qbits, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, 3, 1, 1),
                     0);
    /* Request 1 has no pages, so its last_page_len of 0 is ignored: the table is valid.
       kv_len: request 0 has 2 pages of size 2 with 1 in the last -> 1 * 2 + 1 = 3; request 1
       -> 0; request 2 -> 0 * 2 + 2 = 2. */
    assert_int_equal(cinfer__ref_page_table_validate(&table), 0);
    assert_int_equal(cinfer__ref_page_table_kv_len(&table, 0, &kv_len), 0);
    assert_int_equal(kv_len, 3);
    assert_int_equal(cinfer__ref_page_table_kv_len(&table, 1, &kv_len), 0);
    assert_int_equal(kv_len, 0);
    assert_int_equal(cinfer__ref_page_table_kv_len(&table, 2, &kv_len), 0);
    assert_int_equal(kv_len, 2);
    assert_int_equal(cinfer__ref_page_table_kv_len(&table, 3, &kv_len), CINFER__REF_EINVAL);
    assert_int_equal(
        cinfer__ref_batch_paged(&heads, &qt, NULL, &kt, &kt, &table, NULL, NULL, &opts, o, NULL),
        0);

    /* Each violation on its own is rejected, by the validator and by the batch call. */
    indptr[1] = 4;
    assert_int_equal(cinfer__ref_page_table_validate(&table), CINFER__REF_EINVAL);
    assert_int_equal(
        cinfer__ref_batch_paged(&heads, &qt, NULL, &kt, &kt, &table, NULL, NULL, &opts, o, NULL),
        CINFER__REF_EINVAL);
    indptr[1] = 2;
    indptr[0] = -1;
    assert_int_equal(cinfer__ref_page_table_validate(&table), CINFER__REF_EINVAL);
    indptr[0] = 0;
    last[2] = 0;
    assert_int_equal(cinfer__ref_page_table_validate(&table), CINFER__REF_EINVAL);
    last[2] = 3;
    assert_int_equal(cinfer__ref_page_table_validate(&table), CINFER__REF_EINVAL);
    assert_int_equal(
        cinfer__ref_batch_paged(&heads, &qt, NULL, &kt, &kt, &table, NULL, NULL, &opts, o, NULL),
        CINFER__REF_EINVAL);
    last[2] = 2;
    indices[1] = 4;
    assert_int_equal(cinfer__ref_page_table_validate(&table), CINFER__REF_EINVAL);
    assert_int_equal(
        cinfer__ref_batch_paged(&heads, &qt, NULL, &kt, &kt, &table, NULL, NULL, &opts, o, NULL),
        CINFER__REF_EINVAL);
    indices[1] = -1;
    assert_int_equal(cinfer__ref_page_table_validate(&table), CINFER__REF_EINVAL);
    indices[1] = 3;
    table.page_size = 0;
    assert_int_equal(cinfer__ref_page_table_validate(&table), CINFER__REF_EINVAL);
    table.page_size = 2;
    assert_int_equal(cinfer__ref_page_table_validate(&table), 0);
    assert_int_equal(cinfer__ref_page_table_validate(NULL), CINFER__REF_EINVAL);

    /* A non-monotone qo_indptr is rejected too. */
    const int32_t bad_qo[4] = {0, 2, 1, 3};
    assert_int_equal(
        cinfer__ref_batch_paged(&heads, &qt, bad_qo, &kt, &kt, &table, NULL, NULL, &opts, o, NULL),
        CINFER__REF_EINVAL);
    const int32_t neg_qo[4] = {-1, 0, 1, 2};
    assert_int_equal(
        cinfer__ref_batch_paged(&heads, &qt, neg_qo, &kt, &kt, &table, NULL, NULL, &opts, o, NULL),
        CINFER__REF_EINVAL);
}

/* ---------------------------------------------------------------------------------------------- */
/* 4. Merge */
/* ---------------------------------------------------------------------------------------------- */

static void test_merge_identities(void **state) {
    double v[2];
    double s;
    (void)state;

    /* Merging with an empty state (lse -inf) returns the other state unchanged. */
    const double va[2] = {1, 2};
    const double sa = 3.0;
    const double vb[2] = {100, -100};
    const double empty = -INFINITY;
    assert_int_equal(cinfer__ref_merge_state(1, 1, 2, va, &sa, vb, &empty, v, &s), 0);
    assert_near(v[0], 1.0, 0.0);
    assert_near(v[1], 2.0, 0.0);
    assert_near(s, 3.0, 0.0);
    assert_int_equal(cinfer__ref_merge_state(1, 1, 2, vb, &empty, va, &sa, v, &s), 0);
    assert_near(v[1], 2.0, 0.0);
    assert_near(s, 3.0, 0.0);

    /* Two equal states: lse doubles in linear terms, +1 in log2; v stays. */
    assert_int_equal(cinfer__ref_merge_state(1, 1, 2, va, &sa, va, &sa, v, &s), 0);
    assert_near(v[0], 1.0, 1e-15);
    assert_near(v[1], 2.0, 1e-15);
    assert_near(s, 4.0, 1e-15);

    /* Both empty: (0, -inf), never NaN. */
    assert_int_equal(cinfer__ref_merge_state(1, 1, 2, va, &empty, vb, &empty, v, &s), 0);
    assert_near(v[0], 0.0, 0.0);
    assert_near(v[1], 0.0, 0.0);
    assert_neg_inf(s);

    /* By hand: s_a = 0, s_b = 1 -> weights 1 and 2; s = log2 3; v = (1 * 3 + 2 * 0) / 3 = 1. */
    const double v3[1] = {3};
    const double v0[1] = {0};
    const double s0 = 0.0;
    const double s1 = 1.0;
    assert_int_equal(cinfer__ref_merge_state(1, 1, 1, v3, &s0, v0, &s1, v, &s), 0);
    assert_near(v[0], 1.0, 1e-15);
    assert_near(s, log2(3.0), 1e-15);

    /* Large lse: 2^2000 overflows a double, the stable form does not: s = 2001 + log2 1.5. */
    const double s2000 = 2000.0;
    const double s2001 = 2001.0;
    assert_int_equal(cinfer__ref_merge_state(1, 1, 1, v3, &s2000, v0, &s2001, v, &s), 0);
    assert_near(v[0], 1.0, 1e-15);
    assert_near(s, 2001.0 + log2(1.5), 1e-12);

    /* Output aliasing an input is allowed. */
    double vin[1] = {3};
    double sin0 = 0.0;
    assert_int_equal(cinfer__ref_merge_state(1, 1, 1, vin, &sin0, v0, &s1, vin, &sin0), 0);
    assert_near(vin[0], 1.0, 1e-15);
    assert_near(sin0, log2(3.0), 1e-15);

    assert_int_equal(cinfer__ref_merge_state(-1, 1, 1, va, &sa, vb, &sa, v, &s),
                     CINFER__REF_EINVAL);
    assert_int_equal(cinfer__ref_merge_state(1, 1, 1, NULL, &sa, vb, &sa, v, &s),
                     CINFER__REF_EINVAL);
}

static void test_merge_states_matches_pairwise(void **state) {
    /* n 2 rows, 3 states, H 2, D 3, with an empty state in row 1 head 0. merge_states computes
       the direct formula; folding merge_state pairwise must agree to rounding. */
    enum { N = 2, S = 3, H = 2, D = 3 };
    double v[N * S * H * D];
    double s[N * S * H];
    double out_v[N * H * D];
    double out_s[N * H];
    (void)state;

    for (int i = 0; i < N * S * H * D; i++) {
        v[i] = rng_uniform() * 4.0;
    }
    for (int i = 0; i < N * S * H; i++) {
        s[i] = rng_uniform() * 6.0;
    }
    s[(1 * S + 1) * H + 0] = -INFINITY;
    assert_int_equal(cinfer__ref_merge_states(N, S, H, D, v, s, out_v, out_s), 0);

    for (int i = 0; i < N; i++) {
        for (int h = 0; h < H; h++) {
            double acc_v[D];
            double acc_s = s[(i * S + 0) * H + h];
            for (int d = 0; d < D; d++) {
                acc_v[d] = v[((i * S + 0) * H + h) * D + d];
            }
            for (int k = 1; k < S; k++) {
                assert_int_equal(cinfer__ref_merge_state(1, 1, D, acc_v, &acc_s,
                                                         &v[((i * S + k) * H + h) * D],
                                                         &s[(i * S + k) * H + h], acc_v, &acc_s),
                                 0);
            }
            for (int d = 0; d < D; d++) {
                assert_near(out_v[(i * H + h) * D + d], acc_v[d], 1e-12);
            }
            assert_near(out_s[i * H + h], acc_s, 1e-12);
        }
    }

    /* Zero states merge to (0, -inf). */
    out_v[0] = NAN;
    assert_int_equal(cinfer__ref_merge_states(1, 0, 1, 1, NULL, NULL, out_v, out_s), 0);
    assert_near(out_v[0], 0.0, 0.0);
    assert_neg_inf(out_s[0]);
}

static void test_merge_in_place_mask(void **state) {
    /* Two rows, H 1, D 1. Row 0 (mask 1) merges (2, s 0) with (5, s 0) -> (3.5, 1); row 1
       (mask 0) keeps (7, 4) although its other state would change it. Without a mask both rows
       merge: row 1 becomes ((7 + 1) / 2, 5) = (4, 5). */
    double v[2] = {2, 7};
    double s[2] = {0, 4};
    const double vo[2] = {5, 1};
    const double so[2] = {0, 4};
    const uint8_t mask[2] = {1, 0};
    (void)state;

    assert_int_equal(cinfer__ref_merge_state_in_place(2, 1, 1, v, s, vo, so, mask), 0);
    assert_near(v[0], 3.5, 1e-15);
    assert_near(s[0], 1.0, 1e-15);
    assert_near(v[1], 7.0, 0.0);
    assert_near(s[1], 4.0, 0.0);

    assert_int_equal(cinfer__ref_merge_state_in_place(2, 1, 1, v, s, vo, so, NULL), 0);
    assert_near(v[1], 4.0, 1e-15);
    assert_near(s[1], 5.0, 1e-15);
}

/* ---------------------------------------------------------------------------------------------- */
/* 5. Error metrics */
/* ---------------------------------------------------------------------------------------------- */

static void test_compare(void **state) {
    /* out = (1, 2, 3) in fp16, ref = (1, 2.5, 3): max abs 0.5 at index 1; relative L2
       = 0.5 / sqrt(1 + 6.25 + 9) = 0.5 / sqrt(16.25) = 0.124035. */
    const uint16_t out[3] = {0x3C00, 0x4000, 0x4200};
    const double ref[3] = {1.0, 2.5, 3.0};
    cinfer__ref_error_t err;
    (void)state;

    assert_int_equal(cinfer__ref_compare(CINFER__REF_DTYPE_F16, out, ref, 3, &err), 0);
    assert_near(err.max_abs_err, 0.5, 0.0);
    assert_int_equal(err.max_abs_index, 1);
    assert_near(err.rel_l2_err, 0.12403473458920847, 1e-16);
    assert_int_equal(err.num_nonfinite, 0);

    /* A NaN and an inf in the output are counted and make both errors infinite. */
    const uint16_t bad[3] = {0x3C00, 0x7E00, 0xFC00};
    assert_int_equal(cinfer__ref_compare(CINFER__REF_DTYPE_F16, bad, ref, 3, &err), 0);
    assert_int_equal(err.num_nonfinite, 2);
    assert_true(isinf(err.max_abs_err));
    assert_true(isinf(err.rel_l2_err));

    /* A zero reference falls back to the absolute L2 norm: sqrt(0.5^2 + 0) = 0.5. */
    const float outf[2] = {0.5f, 0.0f};
    const double zero[2] = {0.0, 0.0};
    assert_int_equal(cinfer__ref_compare(CINFER__REF_DTYPE_F32, outf, zero, 2, &err), 0);
    assert_near(err.rel_l2_err, 0.5, 0.0);
    assert_int_equal(cinfer__ref_compare(CINFER__REF_DTYPE_F32, outf, zero, 2, NULL),
                     CINFER__REF_EINVAL);
}

static void test_compare_lse(void **state) {
    /* (-inf vs -inf) equal; (1 vs 1.25) 0.25; (-inf vs 0) mismatch at index 2; (2.5 vs 2.5). */
    const float out[4] = {-INFINITY, 1.0f, -INFINITY, 2.5f};
    const double ref[4] = {-INFINITY, 1.25, 0.0, 2.5};
    cinfer__ref_lse_error_t err;
    (void)state;

    assert_int_equal(cinfer__ref_compare_lse(CINFER__REF_DTYPE_F32, out, ref, 4, &err), 0);
    assert_near(err.max_abs_err, 0.25, 0.0);
    assert_int_equal(err.num_inf_mismatch, 1);
    assert_int_equal(err.num_nan, 0);
    assert_int_equal(err.first_mismatch_index, 2);

    /* Only the matching -inf pairs: a clean pass. */
    assert_int_equal(cinfer__ref_compare_lse(CINFER__REF_DTYPE_F32, out, ref, 2, &err), 0);
    assert_int_equal(err.num_inf_mismatch, 0);
    assert_int_equal(err.first_mismatch_index, -1);

    /* A finite output where the reference is -inf is a mismatch, and NaN is counted apart. */
    const float out2[2] = {0.0f, NAN};
    const double ref2[2] = {-INFINITY, 1.0};
    assert_int_equal(cinfer__ref_compare_lse(CINFER__REF_DTYPE_F32, out2, ref2, 2, &err), 0);
    assert_int_equal(err.num_inf_mismatch, 1);
    assert_int_equal(err.num_nan, 1);
    assert_int_equal(err.first_mismatch_index, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_bits),
        cmocka_unit_test(test_bf16_bits),
        cmocka_unit_test(test_f32_bits),
        cmocka_unit_test(test_e4m3_bits),
        cmocka_unit_test(test_e4m3_div256_bits),
        cmocka_unit_test(test_e5m2_bits),
        cmocka_unit_test(test_dtype_round_trip_all_patterns),
        cmocka_unit_test(test_dtype_bulk),
        cmocka_unit_test(test_attn_softmax_by_hand),
        cmocka_unit_test(test_attn_large_logits_are_stable),
        cmocka_unit_test(test_attn_causal_bottom_right),
        cmocka_unit_test(test_attn_window_left),
        cmocka_unit_test(test_attn_qo_longer_than_kv),
        cmocka_unit_test(test_attn_kv_len_zero),
        cmocka_unit_test(test_attn_soft_cap_and_alibi_order),
        cmocka_unit_test(test_alibi_default_slopes),
        cmocka_unit_test(test_attn_alibi_default_in_attention),
        cmocka_unit_test(test_attn_rope),
        cmocka_unit_test(test_attn_gqa_mapping),
        cmocka_unit_test(test_attn_sinks),
        cmocka_unit_test(test_attn_sigmoid),
        cmocka_unit_test(test_attn_kv_scales),
        cmocka_unit_test(test_attn_custom_mask),
        cmocka_unit_test(test_attn_invalid_arguments),
        cmocka_unit_test(test_layout_paged_equals_ragged),
        cmocka_unit_test(test_layout_logits_dump_concatenated),
        cmocka_unit_test(test_layout_single_strided),
        cmocka_unit_test(test_page_table_validation),
        cmocka_unit_test(test_merge_identities),
        cmocka_unit_test(test_merge_states_matches_pairwise),
        cmocka_unit_test(test_merge_in_place_mask),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_compare_lse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
