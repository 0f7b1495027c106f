/*
 * In-kernel RoPE in the attention options, without a device: validation of pos_encoding_mode,
 * rope_scale, rope_theta and the head dim (each error naming the field, its value and what was
 * expected), the decode backend choice (RoPE runs on the CUDA-core kernel), the combinations that
 * are rejected, the length limit, and the specs the options turn into.
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
    assert_int_equal(o.version, 3);
    assert_int_equal(o.size, sizeof o);
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
                             227 * 1024, specs, &n),
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(init_macro_defaults),
        cmocka_unit_test(bad_fields_are_named),
        cmocka_unit_test(decode_runs_rope_on_cuda_cores),
        cmocka_unit_test(prefill_specs_carry_rope),
        cmocka_unit_test(lengths_are_limited),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
