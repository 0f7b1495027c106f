/*
 * In-kernel RoPE in the attention options, without a device: validation of pos_encoding_mode,
 * rope_scale, rope_theta and the head dim (each error naming the field, its value and what was
 * expected), the decode backend choice (RoPE runs on the CUDA-core kernel), the combinations that
 * are rejected, the length limit, the specs the options turn into, and the kernels' frequency
 * table.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ops/decode.h"
#include "ops/options.h"
#include "ops/prefill.h"

/* Llama-3-8B-like decode options with RoPE on. */
static cinfer_attention_options_t rope_options(void) {
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = 32;
    o.num_kv_heads = 8;
    o.head_dim = 128;
    o.max_batch_size = 16;
    o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
    o.rope_scale = 8.0f;
    o.rope_theta = 5e5f;
    return o;
}

/* The decode specs' status for o, and the last error containing `expect` when it fails. */
static cinfer_status_t decode_specs(const cinfer_attention_options_t *o,
                                    cinfer__spec_t *attention) {
    cinfer__spec_t merge;
    unsigned smem = 0;
    return cinfer__decode_kernel_specs(o, true, attention, &merge, &smem);
}

static void expect_error(cinfer_status_t got, cinfer_status_t want, const char *const *parts) {
    assert_int_equal(got, want);
    for (int i = 0; parts[i]; i++)
        if (!strstr(cinfer_last_error(), parts[i]))
            fail_msg("error \"%s\" does not mention \"%s\"", cinfer_last_error(), parts[i]);
}

static void init_macro_defaults(void **state) {
    (void)state;
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    assert_int_equal(o.version, 4);
    assert_int_equal(o.size, sizeof o);
    assert_int_equal(o.head_dim_vo, 0);
    o.head_dim = 96;
    assert_int_equal(cinfer__attention_head_dim_vo(&o), 96);
    assert_int_equal(o.pos_encoding_mode, CINFER_POS_ENCODING_NONE);
    assert_true(o.rope_scale == 1.0f && o.rope_theta == 1e4f);
    assert_false(cinfer__attention_rope(&o));
    o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
    assert_true(cinfer__attention_rope(&o));
}

static void bad_fields_are_named(void **state) {
    (void)state;
    cinfer__spec_t s;
    cinfer_attention_options_t o = rope_options();
    o.rope_scale = 0.0f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_scale = 0", "> 0", NULL});
    o.rope_scale = -2.0f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_scale = -2", NULL});
    o.rope_scale = NAN;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_scale", "finite", NULL});
    o = rope_options();
    o.rope_theta = 0.0f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_theta = 0", "> 0", NULL});
    o.rope_theta = INFINITY;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_theta = inf", NULL});
    /* Finite fields whose float32 products in the kernels would not be: the frequencies 1 /
     * rope_scale, the logit scale sm_scale x k_scale (x log2(e), x 256 for e4m3), v_scale x 256. */
    o = rope_options();
    o.rope_scale = 1e-45f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_scale = 1.4013e-45",
                                       "times CINFER_ROPE_MAX_LEN positions overflows", NULL});
    o.rope_scale = 1e-36f; /* 1 / rope_scale is a float, 2^24 times it not */
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_scale = 1e-36", NULL});
    o.rope_scale = 1e-30f;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    o.rope_scale = 1.6e-32f; /* pair 0 fits; with rope_theta < 1 the last pair's does not */
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    o.rope_theta = 0.1f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"rope_theta = 0.1", NULL});
    o = rope_options();
    o.sm_scale = 3.4e38f;
    o.k_scale = 3.4e38f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->sm_scale x k_scale", "overflows", NULL});
    o.k_scale = 1e-30f;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    o.sm_scale = 0.0f;
    o.k_scale = 1e38f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->sm_scale x k_scale", NULL});
    /* With a soft cap the logit scale is over the cap, and the cap times log2(e) a float. */
    o = rope_options();
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    o.logits_soft_cap = 1e-40f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"with logits_soft_cap = ", "overflows", NULL});
    o.logits_soft_cap = 3e38f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->logits_soft_cap = 3e+38", "2^127.4", NULL});
    o.logits_soft_cap = 30.0f;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    o = rope_options();
    o.v_scale = 3e36f;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->v_scale = 3e+36", "below 2^120", NULL});
    o = rope_options();
    o.pos_encoding_mode = (cinfer_pos_encoding_t)2;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->pos_encoding_mode = 2", "ROPE_LLAMA (1)", NULL});
    /* A head dim decode runs without RoPE but whose halves are not whole 8-element vectors. */
    o = rope_options();
    o.head_dim = 40;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"options->head_dim = 40", "multiple of 16", NULL});
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    /* Without RoPE its fields are not read. */
    o = rope_options();
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    o.rope_scale = 0.0f;
    o.rope_theta = NAN;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.pos, CINFER__POS_NONE);
    /* Options of the previous version (before the RoPE fields) are refused, not misread. */
    o = rope_options();
    o.version = 2;
    o.size = offsetof(cinfer_attention_options_t, pos_encoding_mode);
    expect_error(decode_specs(&o, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"version 2", "CINFER_ATTENTION_OPTIONS_INIT", NULL});
}

static void decode_runs_rope_on_cuda_cores(void **state) {
    (void)state;
    cinfer__spec_t s;
    cinfer_attention_options_t o = rope_options();
    /* Auto: the tensor-core kernel would take these options without RoPE. */
    o.use_tensor_cores = -1;
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.op, CINFER__OP_DECODE_TC);
    o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.op, CINFER__OP_DECODE);
    assert_int_equal(s.pos, CINFER__POS_ROPE_LLAMA);
    o.use_tensor_cores = 0;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.op, CINFER__OP_DECODE);
    o.use_tensor_cores = 1;
    expect_error(decode_specs(&o, &s), CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"use_tensor_cores = 1", "ROPE_LLAMA", NULL});
    /* fp8 KV: the CUDA-core kernel rotates the dequantized K. */
    o.use_tensor_cores = -1;
    o.kv_dtype = (DLDataType){10, 8, 1} /* float8_e4m3fn */;
    assert_int_equal(decode_specs(&o, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.op, CINFER__OP_DECODE);
    assert_int_equal(s.dtype_kv, CINFER__DT_E4M3);
    assert_int_equal(s.pos, CINFER__POS_ROPE_LLAMA);
    /* Single decode too. */
    cinfer__spec_t merge;
    unsigned smem;
    o = rope_options();
    assert_int_equal(cinfer__decode_kernel_specs(&o, false, &s, &merge, &smem),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(s.op, CINFER__OP_DECODE);
    assert_int_equal(s.pos, CINFER__POS_ROPE_LLAMA);
    assert_int_equal(merge.pos, CINFER__POS_NONE);
}

static void prefill_specs_carry_rope(void **state) {
    (void)state;
    cinfer_attention_options_t o = rope_options();
    cinfer__spec_t s;
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.pos, CINFER__POS_ROPE_LLAMA);
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.pos, CINFER__POS_NONE);
    /* Every kernel a batch prefill may load (all tiles, ragged and paged). */
    o = rope_options();
    for (int paged = 0; paged < 2; paged++) {
        cinfer__spec_t specs[8];
        int n = 0;
        assert_int_equal(cinfer__batch_prefill_aot_specs(
                             &o, paged ? CINFER_KV_STORAGE_PAGED : CINFER_KV_STORAGE_RAGGED, 0,
                             "sm_90a", 227 * 1024, specs, &n),
                         CINFER_STATUS_SUCCESS);
        assert_true(n >= 2);
        for (int i = 0; i < n; i++)
            assert_int_equal(specs[i].pos, specs[i].op == CINFER__OP_PREFILL
                                               ? CINFER__POS_ROPE_LLAMA
                                               : CINFER__POS_NONE);
    }
    /* fp8 KV with RoPE: rejected by name (prefill rotates 16-bit K tiles). */
    o.kv_dtype = (DLDataType){12, 8, 1} /* float8_e5m2 */;
    expect_error(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"kv_dtype e5m2", "ROPE_LLAMA", NULL});
    o = rope_options();
    o.rope_theta = -1.0f;
    expect_error(cinfer__prefill_kernel_spec(&o, 0, 227 * 1024, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"options->rope_theta = -1", NULL});
}

/* options->head_dim_vo (D_vo != D_qk): single and batch prefill's specs carry it (batch prefill's
 * tiles unpacked, on the template, its merge at D_vo); decode, and prefill with RoPE or fp8 K/V,
 * refuse it by name. */
static void head_dim_vo_options(void **state) {
    (void)state;
    cinfer_attention_options_t o = rope_options();
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    o.head_dim = 192;
    o.head_dim_vo = 128;
    cinfer__spec_t s;
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_SUCCESS);
    assert_int_equal(s.head_dim_qk, 192);
    assert_int_equal(s.head_dim_vo, 128);
    assert_int_equal(s.backend, CINFER__BACKEND_SM80);
    /* Every kernel single prefill may load on sm_90a: the template only (no sm90 kernel). */
    cinfer__spec_t specs[8];
    int n = 0;
    o.head_dim = 128;
    o.head_dim_vo = 64;
    assert_int_equal(cinfer__prefill_single_specs(&o, 1, "sm_90a", 227 * 1024, specs, &n),
                     CINFER_STATUS_SUCCESS);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        assert_int_equal(specs[i].backend, CINFER__BACKEND_SM80);
        assert_int_equal(specs[i].head_dim_vo, 64);
        assert_false(specs[i].tile_q == 256); /* no turn-taking tiles */
    }
    expect_error(decode_specs(&o, &s), CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"head_dim_vo = 64", "batch decode", NULL});
    o.num_qo_heads = 32;
    o.num_kv_heads = 8;
    for (int storage = 0; storage < 2; storage++) {
        assert_int_equal(cinfer__batch_prefill_aot_specs(&o, (cinfer_kv_storage_t)storage, 1,
                                                         "sm_90a", 227 * 1024, specs, &n),
                         CINFER_STATUS_SUCCESS);
        assert_true(n >= 2);
        for (int i = 0; i < n - 1; i++) {
            assert_int_equal(specs[i].op, CINFER__OP_PREFILL);
            assert_int_equal(specs[i].backend, CINFER__BACKEND_SM80);
            assert_int_equal(specs[i].head_dim_qk, 128);
            assert_int_equal(specs[i].head_dim_vo, 64);
            assert_int_equal(specs[i].gqa_pack, 0);
            assert_int_equal(specs[i].paged, storage);
            assert_false(specs[i].tile_q == 256);
            assert_int_equal(cinfer__spec_validate(&specs[i]), CINFER_STATUS_SUCCESS);
        }
        assert_int_equal(specs[n - 1].op, CINFER__OP_DECODE_MERGE);
        assert_int_equal(specs[n - 1].head_dim_vo, 64);
    }
    o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
    expect_error(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"head_dim_vo = 64", "ROPE_LLAMA", NULL});
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    o.kv_dtype = (DLDataType){10, 8, 1} /* float8_e4m3fn */;
    expect_error(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"head_dim_vo = 64", "fp8", NULL});
    o.kv_dtype = o.q_dtype;
    o.head_dim_vo = 40;
    expect_error(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"head_dim_vo = 40", "multiple of 16", NULL});
    o.head_dim_vo = -3;
    expect_error(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 (const char *const[]){"head_dim_vo = -3", NULL});
}

static void lengths_are_limited(void **state) {
    (void)state;
    cinfer_attention_options_t o = rope_options();
    assert_int_equal(cinfer__attention_rope_lens(&o, CINFER_ROPE_MAX_LEN, CINFER_ROPE_MAX_LEN, "x"),
                     CINFER_STATUS_SUCCESS);
    expect_error(cinfer__attention_rope_lens(&o, 1, CINFER_ROPE_MAX_LEN + 1, "request 3"),
                 CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"request 3", "kv_len = 16777217", "16777216", NULL});
    expect_error(cinfer__attention_rope_lens(&o, (int64_t)1 << 30, 5, "cinfer_single_prefill"),
                 CINFER_STATUS_UNSUPPORTED,
                 (const char *const[]){"cinfer_single_prefill", "qo_len = 1073741824", NULL});
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    assert_int_equal(cinfer__attention_rope_lens(&o, (int64_t)1 << 30, (int64_t)1 << 30, "x"),
                     CINFER_STATUS_SUCCESS);
}

/* Bit pattern of a float, so that table entries compare exactly (0.0f and -0.0f differ). */
static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/*
 * The host's frequency table against a float64 recomputation of what the kernels computed in
 * every CTA before (the same expression, entry by entry, bit for bit), against the exact frequency
 * in long double (hi + lo carries 48 bits: within 2^-46 of it, relatively), and zeros past D / 2.
 */
static void frequency_table_matches_float64(void **state) {
    (void)state;
    const struct {
        int head_dim;
        float scale, theta;
    } cases[] = {{128, 1.0f, 1e4f}, {128, 8.0f, 5e5f}, {64, 0.01f, 1e4f},
                 {256, 1.0f, 1e6f}, {16, 2.5f, 10.0f}, {256, 40.0f, 1.5e7f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cinfer_attention_options_t o = rope_options();
        o.head_dim = cases[c].head_dim;
        o.rope_scale = cases[c].scale;
        o.rope_theta = cases[c].theta;
        cinfer_pos_rope_params t;
        memset(&t, 0xff, sizeof t); /* every entry must be written */
        cinfer__attention_rope_params(&o, &t);
        for (int m = 0; m < CINFER_POS_ROPE_MAX_PAIRS; m++) {
            if (m >= o.head_dim / 2) {
                assert_int_equal(float_bits(t.freq[m][0]), 0);
                assert_int_equal(float_bits(t.freq[m][1]), 0);
                continue;
            }
            const double f = pow((double)o.rope_theta, -2.0 * (double)m / (double)o.head_dim) /
                             (6.28318530717958647692 * (double)o.rope_scale);
            const float hi = (float)f, lo = (float)(f - (double)hi);
            if (float_bits(t.freq[m][0]) != float_bits(hi) ||
                float_bits(t.freq[m][1]) != float_bits(lo))
                fail_msg("D %d scale %g theta %g pair %d: (%a, %a), expected (%a, %a)", o.head_dim,
                         (double)o.rope_scale, (double)o.rope_theta, m, (double)t.freq[m][0],
                         (double)t.freq[m][1], (double)hi, (double)lo);
            const long double exact =
                powl((long double)o.rope_theta, -2.0L * m / o.head_dim) /
                (2.0L * 3.141592653589793238462643383279503L * (long double)o.rope_scale);
            const long double sum = (long double)t.freq[m][0] + (long double)t.freq[m][1];
            if (fabsl(sum - exact) > ldexpl(exact, -46))
                fail_msg("D %d pair %d: hi + lo = %La, exact %La", o.head_dim, m, sum, exact);
            /* lo is the rounding error of hi: at most half an ulp of it. */
            assert_true(fabsf(t.freq[m][1]) <= ldexpf(fabsf(hi), -24));
        }
    }
    /* Without RoPE the table is all zeros. */
    cinfer_attention_options_t o = rope_options();
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    cinfer_pos_rope_params t, zero;
    memset(&t, 0xff, sizeof t);
    memset(&zero, 0, sizeof zero);
    cinfer__attention_rope_params(&o, &t);
    assert_memory_equal(&t, &zero, sizeof t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(init_macro_defaults),
        cmocka_unit_test(bad_fields_are_named),
        cmocka_unit_test(decode_runs_rope_on_cuda_cores),
        cmocka_unit_test(prefill_specs_carry_rope),
        cmocka_unit_test(head_dim_vo_options),
        cmocka_unit_test(lengths_are_limited),
        cmocka_unit_test(frequency_table_matches_float64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
