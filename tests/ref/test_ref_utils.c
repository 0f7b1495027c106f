/*
 * Tests of the CPU reference of the KV-cache and position utilities (src/ref/ref_utils.c). Every
 * expected number is worked out by hand in the comment next to it, from the definitions in
 * include/cinfer.h and the formats' bit layouts, never by running the reference itself.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ref/ref_utils.h"

#define assert_near(actual, expected, tol)                                                         \
    check_near((actual), (expected), (tol), #actual, __FILE__, __LINE__)

static void check_near(double actual, double expected, double tol, const char *what,
                       const char *file, int line) {
    if (!(fabs(actual - expected) <= tol)) {
        print_error("%s = %.17g, expected %.17g (tolerance %g)\n", what, actual, expected, tol);
        _fail(file, line);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Page-table helpers */
/* ---------------------------------------------------------------------------------------------- */

/* FlashInfer's documented example: append_indptr [0, 1, 3, 6, 10], every request 5 long after the
 * append, so request b's appended tokens are its last (1, 2, 3, 4) positions of 0..4. Two more
 * entries (nnz 12) are covered by no request. */
static void batch_indices_positions_example(void **state) {
    (void)state;
    const int32_t indptr[5] = {0, 1, 3, 6, 10}, seq_lens[4] = {5, 5, 5, 5};
    int32_t b[12], pos[12];
    assert_int_equal(cinfer__ref_batch_indices_positions(4, indptr, seq_lens, 12, b, pos),
                     CINFER__REF_OK);
    const int32_t want_b[12] = {0, 1, 1, 2, 2, 2, 3, 3, 3, 3, -1, -1};
    const int32_t want_pos[12] = {4, 3, 4, 2, 3, 4, 1, 2, 3, 4, -1, -1};
    assert_memory_equal(b, want_b, sizeof want_b);
    assert_memory_equal(pos, want_pos, sizeof want_pos);
}

/* Empty requests are passed over, and a first indptr above 0 leaves the leading entries
 * uncovered: indptr [2, 2, 4, 4, 5] -> entries 2, 3 belong to request 1 (new length 7: positions
 * 5, 6), entry 4 to request 3 (new length 1: position 0); entries 0, 1 to nobody. */
static void batch_indices_positions_empty_requests(void **state) {
    (void)state;
    const int32_t indptr[5] = {2, 2, 4, 4, 5}, seq_lens[4] = {9, 7, 3, 1};
    int32_t b[5], pos[5];
    assert_int_equal(cinfer__ref_batch_indices_positions(4, indptr, seq_lens, 5, b, pos),
                     CINFER__REF_OK);
    const int32_t want_b[5] = {-1, -1, 1, 1, 3}, want_pos[5] = {-1, -1, 5, 6, 0};
    assert_memory_equal(b, want_b, sizeof want_b);
    assert_memory_equal(pos, want_pos, sizeof want_pos);
    assert_int_equal(cinfer__ref_batch_indices_positions(-1, indptr, seq_lens, 5, b, pos),
                     CINFER__REF_EINVAL);
}

/* FlashInfer's append example: 3, 1, 2, 2 pages of 16 with last pages 13, 8, 9, 6 hold
 * 2*16+13 = 45, 0*16+8 = 8, 16+9 = 25, 16+6 = 22 tokens; a request without pages has 0 whatever
 * its last_page_len says; a huge page count saturates at 2^31 - 1. */
static void seq_lens_example(void **state) {
    (void)state;
    const int32_t indptr[7] = {0, 3, 4, 6, 8, 8, 2147483647};
    const int32_t last[6] = {13, 8, 9, 6, 5, 1};
    int32_t lens[6];
    assert_int_equal(cinfer__ref_seq_lens(6, indptr, last, 16, lens), CINFER__REF_OK);
    const int32_t want[6] = {45, 8, 25, 22, 0, 2147483647};
    assert_memory_equal(lens, want, sizeof want);
    assert_int_equal(cinfer__ref_seq_lens(6, indptr, last, 0, lens), CINFER__REF_EINVAL);
}

/* ---------------------------------------------------------------------------------------------- */
/* Cache element encoding */
/* ---------------------------------------------------------------------------------------------- */

static void cache_encode_fp8(void **state) {
    (void)state;
    /* e4m3 (bias 7): 1.5 = 1.100b * 2^0 -> 0 0111 100 = 0x3C; -0.75 = -1.100b * 2^-1 -> 0xB4. */
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, 1.5), 0x3C);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, -0.75), 0xB4);
    /* 448 is the largest finite (0x7E); 500 and +inf saturate to it, -1e9 to -448 (0xFE). */
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, 500.0), 0x7E);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, INFINITY), 0x7E);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, -1e9), 0xFE);
    /* Subnormals step 2^-9 = 0.001953125: 0.001 is 0.512 steps -> 1 step (0x01); 0.0029296875 is
     * exactly 1.5 steps -> ties to even, 2 steps (0x02). NaN -> 0x7F. */
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, 0.001), 0x01);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, 0.0029296875), 0x02);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E4M3, NAN), 0x7F);
    /* e5m2 (bias 15): 1.5 = 1.10b -> 0 01111 10 = 0x3E; 57344 = 1.11b * 2^15 = 0x7B, the largest
     * finite; 60000 rounds to it, 61440 (the midpoint to 65536) ties to the even 65536, i.e.
     * overflows, and like 1e6 and inf saturates to 0x7B; -1e6 to 0xFB. NaN -> 0x7E. */
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, 1.5), 0x3E);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, 57344.0), 0x7B);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, 60000.0), 0x7B);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, 61440.0), 0x7B);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, 1e6), 0x7B);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, INFINITY), 0x7B);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, -1e6), 0xFB);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_E5M2, NAN), 0x7E);
    /* 16-bit caches round like the reference encoders: 1 + 2^-11 is a tie between 1 and the next
     * fp16 1 + 2^-10, to even: 1.0 = 0x3C00; bf16 1.5 = 0x3FC0. */
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_F16, 1.0 + 0x1p-11), 0x3C00);
    assert_int_equal(cinfer__ref_cache_encode(CINFER__REF_DTYPE_BF16, 1.5), 0x3FC0);
}

/* ---------------------------------------------------------------------------------------------- */
/* Paged KV append */
/* ---------------------------------------------------------------------------------------------- */

/* fp16 bits of small exact values: 1 = 0x3C00, 2 = 0x4000, 3 = 0x4200, 4 = 0x4400, 5 = 0x4500,
 * 6 = 0x4600, 7 = 0x4700, 8 = 0x4800. */
static const uint16_t F16[9] = {0x0000, 0x3C00, 0x4000, 0x4200, 0x4400,
                                0x4500, 0x4600, 0x4700, 0x4800};

/*
 * Page size 2, one head, head dim 2, NHD caches of 4 pages [4, 2, 1, 2]; request 0 owns pages
 * (3, 1), request 1 owns page 0 (page 2 is nobody's). Tokens:
 *   0: request 0 position 0 -> page 3 slot 0;  1: request 0 position 3 -> page 1 slot 1;
 *   2: request 1 position 1 -> page 0 slot 1;  3: padding (-1), skipped silently;
 *   4: request 1 position 2 -> outside its 1 page * 2 slots: POSITION;
 *   5: request 2 -> outside the batch of 2: BATCH_INDEX;  6: position -1: POSITION.
 * K row of token i is (i + 1, i + 2) scaled by 1 (i <= 6 keeps them exact), V row is (8 - i, 1).
 */
static void append_places_rows_and_flags_errors(void **state) {
    (void)state;
    enum { NNZ = 7 };
    uint16_t k_src[NNZ * 2], v_src[NNZ * 2];
    for (int i = 0; i < NNZ; i++) {
        k_src[2 * i] = F16[i + 1 > 8 ? 8 : i + 1];
        k_src[2 * i + 1] = F16[i + 2 > 8 ? 8 : i + 2];
        v_src[2 * i] = F16[8 - i];
        v_src[2 * i + 1] = F16[1];
    }
    cinfer__ref_strided3_t k, v;
    assert_int_equal(cinfer__ref_strided3_packed(&k, k_src, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, NNZ, 1, 2),
                     CINFER__REF_OK);
    assert_int_equal(cinfer__ref_strided3_packed(&v, v_src, CINFER__REF_DTYPE_F16,
                                                 CINFER__REF_LAYOUT_NHD, NNZ, 1, 2),
                     CINFER__REF_OK);
    const int32_t batch[NNZ] = {0, 0, 1, -1, 1, 2, 0}, pos[NNZ] = {0, 3, 1, 0, 2, 0, -1};
    const int32_t indptr[3] = {0, 2, 3}, indices[3] = {3, 1, 0};
    uint16_t k_cache[4 * 2 * 2], v_cache[4 * 2 * 2];
    memset(k_cache, 0xEE, sizeof k_cache);
    memset(v_cache, 0xEE, sizeof v_cache);
    /* NHD [pages, slots, heads, dim]: page stride 4, slot stride 2, head stride 2, dim 1. */
    const cinfer__ref_paged_out_t kc = {k_cache, CINFER__REF_DTYPE_F16, 4, 2, 2, 1};
    const cinfer__ref_paged_out_t vc = {v_cache, CINFER__REF_DTYPE_F16, 4, 2, 2, 1};
    int32_t flags = 0;
    assert_int_equal(cinfer__ref_append_paged_kv_cache(NNZ, 1, 2, &k, &v, batch, pos, 2, indptr,
                                                       indices, 3, 4, 2, &kc, &vc, 1.0, 1.0,
                                                       &flags),
                     CINFER__REF_OK);
    assert_int_equal(flags,
                     CINFER__REF_APPEND_ERROR_POSITION | CINFER__REF_APPEND_ERROR_BATCH_INDEX);
    /* Token 0 -> page 3 slot 0: K (1, 2), V (8, 1). */
    assert_int_equal(k_cache[3 * 4 + 0], F16[1]);
    assert_int_equal(k_cache[3 * 4 + 1], F16[2]);
    assert_int_equal(v_cache[3 * 4 + 0], F16[8]);
    assert_int_equal(v_cache[3 * 4 + 1], F16[1]);
    /* Token 1 -> page 1 slot 1: K (2, 3), V (7, 1). */
    assert_int_equal(k_cache[1 * 4 + 2], F16[2]);
    assert_int_equal(k_cache[1 * 4 + 3], F16[3]);
    assert_int_equal(v_cache[1 * 4 + 2], F16[7]);
    /* Token 2 -> page 0 slot 1: K (3, 4), V (6, 1). */
    assert_int_equal(k_cache[0 * 4 + 2], F16[3]);
    assert_int_equal(k_cache[0 * 4 + 3], F16[4]);
    assert_int_equal(v_cache[0 * 4 + 2], F16[6]);
    /* Nothing else was written: page 2, page 3 slot 1, page 1 slot 0, page 0 slot 0. */
    const int untouched[8] = {2 * 4, 2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 3 * 4 + 2, 1 * 4, 0, 1};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(k_cache[untouched[i]], 0xEEEE);
        assert_int_equal(v_cache[untouched[i]], 0xEEEE);
    }
}

/* A page-table entry past kv_indices, or a page index past the cache, is a PAGE error. */
static void append_flags_bad_pages(void **state) {
    (void)state;
    const uint16_t src[2] = {F16[1], F16[2]};
    cinfer__ref_strided3_t k;
    cinfer__ref_strided3_packed(&k, src, CINFER__REF_DTYPE_F16, CINFER__REF_LAYOUT_NHD, 1, 1, 2);
    uint16_t cache[2 * 1 * 1 * 2];
    memset(cache, 0xEE, sizeof cache);
    const cinfer__ref_paged_out_t c = {cache, CINFER__REF_DTYPE_F16, 2, 2, 2, 1};
    const int32_t batch[1] = {0}, pos[1] = {1};
    /* Request 0 claims pages [0, 2) of kv_indices but only 1 entry exists: position 1 (page 1
     * with page size 1) reads entry 1, past the end. */
    const int32_t indptr[2] = {0, 2}, indices_short[1] = {0};
    int32_t flags = 0;
    assert_int_equal(cinfer__ref_append_paged_kv_cache(1, 1, 2, &k, &k, batch, pos, 1, indptr,
                                                       indices_short, 1, 2, 1, &c, &c, 1.0, 1.0,
                                                       &flags),
                     CINFER__REF_OK);
    assert_int_equal(flags, CINFER__REF_APPEND_ERROR_PAGE);
    /* Entry 1 exists but names page 5 of a 2-page cache. */
    const int32_t indices_far[2] = {0, 5};
    flags = 0;
    assert_int_equal(cinfer__ref_append_paged_kv_cache(1, 1, 2, &k, &k, batch, pos, 1, indptr,
                                                       indices_far, 2, 2, 1, &c, &c, 1.0, 1.0,
                                                       &flags),
                     CINFER__REF_OK);
    assert_int_equal(flags, CINFER__REF_APPEND_ERROR_PAGE);
    for (int i = 0; i < 4; i++)
        assert_int_equal(cache[i], 0xEEEE);
}

/* fp8 e4m3 destination with k_scale 2 and v_scale 0.5, written through combined-cache strides
 * (V 3 elements after K). The row is 3, 1000, -2^-9 (exact in fp16): see the expected bytes. */
static void append_fp8_with_scales(void **state) {
    (void)state;
    /* fp16: 3 = 0 10000 1000000000; 1000 = 1.953125 * 2^9 = 0 11000 1111010000;
     * -2^-9 = 1 00110 0000000000. */
    const uint16_t src[3] = {0x4200, 0x63D0, 0x9800}; /* 3, 1000, -2^-9 */
    cinfer__ref_strided3_t k;
    cinfer__ref_strided3_packed(&k, src, CINFER__REF_DTYPE_F16, CINFER__REF_LAYOUT_NHD, 1, 1, 3);
    /* One page of one slot, one head: K at element 0, V at element 3. */
    uint8_t cache[6];
    memset(cache, 0xEE, sizeof cache);
    const cinfer__ref_paged_out_t kc = {cache, CINFER__REF_DTYPE_E4M3, 6, 3, 3, 1};
    const cinfer__ref_paged_out_t vc = {cache + 3, CINFER__REF_DTYPE_E4M3, 6, 3, 3, 1};
    const int32_t batch[1] = {0}, pos[1] = {0}, indptr[2] = {0, 1}, indices[1] = {0};
    int32_t flags = 0;
    assert_int_equal(cinfer__ref_append_paged_kv_cache(1, 1, 3, &k, &k, batch, pos, 1, indptr,
                                                       indices, 1, 1, 1, &kc, &vc, 2.0, 0.5,
                                                       &flags),
                     CINFER__REF_OK);
    assert_int_equal(flags, 0);
    /* K: 3/2 = 1.5 -> 0x3C; 1000/2 = 500 -> 0x7E; -2^-9/2 = -2^-10 = half a step: ties to even,
     * 0 steps -> -0 (0x80). V: 3/0.5 = 6 -> 0x4C; 2000 -> 0x7E; -2^-8 = -2 steps -> 0x82. */
    const uint8_t want[6] = {0x3C, 0x7E, 0x80, 0x4C, 0x7E, 0x82};
    assert_memory_equal(cache, want, sizeof want);
    /* A non-positive scale is invalid. */
    assert_int_equal(cinfer__ref_append_paged_kv_cache(1, 1, 3, &k, &k, batch, pos, 1, indptr,
                                                       indices, 1, 1, 1, &kc, &vc, 0.0, 1.0,
                                                       &flags),
                     CINFER__REF_EINVAL);
}

/* ---------------------------------------------------------------------------------------------- */
/* RoPE */
/* ---------------------------------------------------------------------------------------------- */

static cinfer__ref_rope_t plain_rope(int64_t rotary_dim, bool interleave) {
    cinfer__ref_rope_t r;
    memset(&r, 0, sizeof r);
    r.rotary_dim = rotary_dim;
    r.interleave = interleave;
    r.rope_theta = 1e4;
    r.rope_scale = 1.0;
    return r;
}

/* Rotary dim 4, theta 1e4: frequencies 1e4^0 = 1 and 1e4^(-2/4) = 0.01. At position 1:
 *   cos 1 = 0.54030230586813977, sin 1 = 0.84147098480789651,
 *   cos 0.01 = 0.99995000041666526, sin 0.01 = 0.0099998333341666645.
 * Rotate-half, x = (1, 2, 3, 4): pairs (x0, x2) at angle 1 and (x1, x3) at 0.01:
 *   out0 = 1 cos1 - 3 sin1 = -1.9841106485555495,  out2 = 3 cos1 + 1 sin1 = 2.4623779024123156,
 *   out1 = 2 cos.01 - 4 sin.01 = 1.9599006674966639, out3 = 4 cos.01 + 2 sin.01
 * = 4.0197996683349944. Interleaved: pairs (x0, x1) at angle 1 and (x2, x3) at 0.01: out0 = cos1 -
 * 2 sin1 = -1.1426396637476532,    out1 = 2 cos1 + sin1 = 1.9220755965441760, out2 = 3 cos.01 - 4
 * sin.01 = 2.9598506679133294, out3 = 4 cos.01 + 3 sin.01 = 4.0297995016691610. With head dim 6 and
 * rotary dim 4, elements 4, 5 are copied. */
static void rope_rows_by_hand(void **state) {
    (void)state;
    const double x[6] = {1, 2, 3, 4, 5, 6};
    double out[6];
    double f;
    cinfer__ref_rope_t r = plain_rope(4, false);
    assert_int_equal(cinfer__ref_rope_frequency(&r, 1, &f), CINFER__REF_OK);
    assert_near(f, 0.01, 1e-17);
    assert_int_equal(cinfer__ref_rope_row(&r, 6, 1.0, x, out), CINFER__REF_OK);
    assert_near(out[0], -1.9841106485555495, 1e-14);
    assert_near(out[1], 1.9599006674966639, 1e-14);
    assert_near(out[2], 2.4623779024123156, 1e-14);
    assert_near(out[3], 4.0197996683349944, 1e-14);
    assert_near(out[4], 5.0, 0.0);
    assert_near(out[5], 6.0, 0.0);
    r = plain_rope(4, true);
    assert_int_equal(cinfer__ref_rope_row(&r, 6, 1.0, x, out), CINFER__REF_OK);
    assert_near(out[0], -1.1426396637476532, 1e-14);
    assert_near(out[1], 1.9220755965441760, 1e-14);
    assert_near(out[2], 2.9598506679133294, 1e-14);
    assert_near(out[3], 4.0297995016691610, 1e-14);
    assert_near(out[4], 5.0, 0.0);
    /* Position 0 is the identity; rope_scale 2 at position 2 equals scale 1 at position 1. */
    assert_int_equal(cinfer__ref_rope_row(&r, 6, 0.0, x, out), CINFER__REF_OK);
    for (int d = 0; d < 6; d++)
        assert_near(out[d], x[d], 0.0);
    r.rope_scale = 2.0;
    assert_int_equal(cinfer__ref_rope_row(&r, 6, 2.0, x, out), CINFER__REF_OK);
    assert_near(out[0], -1.1426396637476532, 1e-14);
    assert_near(out[3], 4.0297995016691610, 1e-14);
    /* In place. */
    double y[6] = {1, 2, 3, 4, 5, 6};
    r = plain_rope(4, false);
    assert_int_equal(cinfer__ref_rope_row(&r, 6, 1.0, y, y), CINFER__REF_OK);
    assert_near(y[0], -1.9841106485555495, 1e-14);
    assert_near(y[3], 4.0197996683349944, 1e-14);
    /* Odd or too large rotary dims are invalid. */
    r = plain_rope(3, false);
    assert_int_equal(cinfer__ref_rope_row(&r, 6, 1.0, x, out), CINFER__REF_EINVAL);
    r = plain_rope(8, false);
    assert_int_equal(cinfer__ref_rope_row(&r, 6, 1.0, x, out), CINFER__REF_EINVAL);
}

/* Llama 3.1 with rotary dim 8, theta 1e4 (base_j = 10^-j), scale 8, factors 1 and 4, old context
 * 1000: wavelengths 2 pi 10^j = 6.28, 62.8, 628.3, 6283; the band is [1000/4, 1000/1] = [250,
 * 1000]. j = 0, 1 are shorter: keep 1 and 0.1. j = 3 is longer: 0.001 / 8 = 1.25e-4. j = 2 is
 * inside: s = (1000 / 628.31853071795865 - 1) / 3 = 0.19718314364...; f = (1 - s) 0.01 / 8 +
 * s 0.01 = 0.0010035210705 + 0.0019718314364 = 0.0029753525068. */
static void rope_llama31_frequencies(void **state) {
    (void)state;
    cinfer__ref_rope_t r = plain_rope(8, false);
    r.rope_scale = 8.0;
    r.llama31 = true;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.old_context_len = 1000.0;
    const double s = (1000.0 / (2.0 * 3.14159265358979323846 * 100.0) - 1.0) / 3.0;
    assert_near(s, 0.19718314364, 1e-10);
    const double want[4] = {1.0, 0.1, (1.0 - s) * 0.01 / 8.0 + s * 0.01, 1.25e-4};
    assert_near(want[2], 0.0029753525068, 1e-12);
    for (int j = 0; j < 4; j++) {
        double f;
        assert_int_equal(cinfer__ref_rope_frequency(&r, j, &f), CINFER__REF_OK);
        assert_near(f, want[j], 1e-15 * want[j]);
    }
    /* Equal factors have no band: invalid. */
    r.high_freq_factor = 1.0;
    double f;
    assert_int_equal(cinfer__ref_rope_frequency(&r, 0, &f), CINFER__REF_EINVAL);
}

/* A table row with cos (0.6, 1) and sin (0.8, 0) for rotary dim 4: rotate-half x = (1, 2, 3, 4)
 * gives out0 = 0.6 - 2.4 = -1.8, out2 = 1.8 + 0.8 = 2.6, and pair (x1, x3) unchanged (2, 4);
 * interleaved gives out0 = 0.6 - 1.6 = -1, out1 = 1.2 + 0.8 = 2, (3, 4) unchanged. Without a
 * valid position the rotated part is NaN and the rest copied. */
static void rope_table_rows(void **state) {
    (void)state;
    const double cos_sin[4] = {0.6, 1.0, 0.8, 0.0};
    const double x[5] = {1, 2, 3, 4, 9};
    double out[5];
    assert_int_equal(cinfer__ref_rope_row_table(4, false, 5, cos_sin, true, x, out),
                     CINFER__REF_OK);
    assert_near(out[0], -1.8, 1e-15);
    assert_near(out[1], 2.0, 0.0);
    assert_near(out[2], 2.6, 1e-15);
    assert_near(out[3], 4.0, 0.0);
    assert_near(out[4], 9.0, 0.0);
    assert_int_equal(cinfer__ref_rope_row_table(4, true, 5, cos_sin, true, x, out), CINFER__REF_OK);
    assert_near(out[0], -1.0, 1e-15);
    assert_near(out[1], 2.0, 1e-15);
    assert_near(out[2], 3.0, 0.0);
    assert_near(out[3], 4.0, 0.0);
    assert_int_equal(cinfer__ref_rope_row_table(4, false, 5, NULL, false, x, out), CINFER__REF_OK);
    for (int d = 0; d < 4; d++)
        assert_true(isnan(out[d]));
    assert_near(out[4], 9.0, 0.0);
}

/* indptr [0, 2, 2, 5] with offsets (10, 99, 0): tokens 0, 1 at 10, 11; tokens 2..4 at 0..2;
 * token 5 (nnz 6) is nobody's. */
static void rope_ragged_positions(void **state) {
    (void)state;
    const int32_t indptr[4] = {0, 2, 2, 5}, offsets[3] = {10, 99, 0};
    int64_t pos[6];
    uint8_t covered[6];
    assert_int_equal(cinfer__ref_rope_ragged_positions(3, indptr, offsets, 6, pos, covered),
                     CINFER__REF_OK);
    const int64_t want_pos[6] = {10, 11, 0, 1, 2, 0};
    const uint8_t want_covered[6] = {1, 1, 1, 1, 1, 0};
    assert_memory_equal(pos, want_pos, sizeof want_pos);
    assert_memory_equal(covered, want_covered, sizeof want_covered);
}

/* ---------------------------------------------------------------------------------------------- */
/* Bit packing */
/* ---------------------------------------------------------------------------------------------- */

/* x = 1 0 1 1 0 0 0 1 | 7 (n = 9; any nonzero is true). Little: bits 0, 2, 3, 7 -> 0x8D, then
 * bit 0 -> 0x01. Big: bits 7, 5, 4, 0 -> 0xB1, then bit 7 -> 0x80. */
static void packbits_by_hand(void **state) {
    (void)state;
    const uint8_t x[9] = {1, 0, 1, 1, 0, 0, 0, 1, 7};
    uint8_t y[2];
    assert_int_equal(cinfer__ref_packbits(x, 9, false, y), CINFER__REF_OK);
    assert_int_equal(y[0], 0x8D);
    assert_int_equal(y[1], 0x01);
    assert_int_equal(cinfer__ref_packbits(x, 9, true, y), CINFER__REF_OK);
    assert_int_equal(y[0], 0xB1);
    assert_int_equal(y[1], 0x80);
    assert_int_equal(cinfer__ref_packbits(x, 0, false, NULL), CINFER__REF_OK);
}

/* x (n = 13) = 1 1 0 | 0 1 0 1 0 0 0 0 1 1 with indptr [0, 3, 3, 12]: segments of 3, 0 and 9
 * elements pack into 1, 0 and 2 bytes: indptr_new [0, 1, 1, 3]. Little: segment 0 (1, 1, 0) ->
 * 0x03; segment 2 = x[3..12) = 0 1 0 1 0 0 0 0 | 1 -> 0x0A, 0x01 (x[12] is not in it). Big: 0xC0;
 * 0x50, 0x80. A capacity of 2 bytes drops the third. */
static void segment_packbits_by_hand(void **state) {
    (void)state;
    const uint8_t x[13] = {1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1};
    const int32_t indptr[4] = {0, 3, 3, 12};
    uint8_t y[4];
    int32_t indptr_new[4];
    memset(y, 0xEE, sizeof y);
    assert_int_equal(cinfer__ref_segment_packbits(x, 13, 3, indptr, false, y, 4, indptr_new),
                     CINFER__REF_OK);
    const int32_t want_indptr[4] = {0, 1, 1, 3};
    assert_memory_equal(indptr_new, want_indptr, sizeof want_indptr);
    const uint8_t want_little[4] = {0x03, 0x0A, 0x01, 0xEE};
    assert_memory_equal(y, want_little, sizeof want_little);
    memset(y, 0xEE, sizeof y);
    assert_int_equal(cinfer__ref_segment_packbits(x, 13, 3, indptr, true, y, 2, indptr_new),
                     CINFER__REF_OK);
    const uint8_t want_big[4] = {0xC0, 0x50, 0xEE, 0xEE};
    assert_memory_equal(y, want_big, sizeof want_big);
    assert_memory_equal(indptr_new, want_indptr, sizeof want_indptr);
    /* A segment reaching past x reads zeros there: indptr [10, 15] -> x[10..13) = 0 1 1, then 0s:
     * little 0x06. A decreasing indptr is an empty segment. */
    const int32_t past[2] = {10, 15}, backwards[2] = {5, 2};
    assert_int_equal(cinfer__ref_segment_packbits(x, 13, 1, past, false, y, 4, indptr_new),
                     CINFER__REF_OK);
    assert_int_equal(y[0], 0x06);
    assert_int_equal(indptr_new[1], 1);
    assert_int_equal(cinfer__ref_segment_packbits(x, 13, 1, backwards, false, y, 4, indptr_new),
                     CINFER__REF_OK);
    assert_int_equal(indptr_new[1], 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batch_indices_positions_example),
        cmocka_unit_test(batch_indices_positions_empty_requests),
        cmocka_unit_test(seq_lens_example),
        cmocka_unit_test(cache_encode_fp8),
        cmocka_unit_test(append_places_rows_and_flags_errors),
        cmocka_unit_test(append_flags_bad_pages),
        cmocka_unit_test(append_fp8_with_scales),
        cmocka_unit_test(rope_rows_by_hand),
        cmocka_unit_test(rope_llama31_frequencies),
        cmocka_unit_test(rope_table_rows),
        cmocka_unit_test(rope_ragged_positions),
        cmocka_unit_test(packbits_by_hand),
        cmocka_unit_test(segment_packbits_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
