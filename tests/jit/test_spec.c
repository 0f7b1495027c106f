/* Spec text form, rendering (name, source, key) and NVRTC compiles without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jit/aot.h"
#include "jit/jit.h"
#include "jit/sources.h"
#include "support/gpu.h"

static cinfer__spec_t parse(const char *text) {
    cinfer__spec_t s;
    cinfer_status_t st = cinfer__spec_parse(text, &s);
    if (st != CINFER_STATUS_SUCCESS)
        fail_msg("parse \"%s\": %s", text, cinfer_last_error());
    return s;
}

static void render(const cinfer__spec_t *s, const char *arch, cinfer__rendered_t *r) {
    cinfer_status_t st = cinfer__spec_render(s, arch, 13000, r);
    if (st != CINFER_STATUS_SUCCESS)
        fail_msg("render: %s", cinfer_last_error());
}

/* Compiles r with NVRTC and fails unless a cubin comes out and NVRTC's log is empty (no warning,
 * no ptxas remark); what names the spec in the messages. */
static void compile_quietly(const cinfer__rendered_t *r, const char *what) {
    void *cubin = NULL;
    size_t size = 0;
    double seconds = -1;
    if (cinfer__jit_compile(r, &cubin, &size, &seconds) != CINFER_STATUS_SUCCESS)
        fail_msg("%s: %s", what, cinfer_last_error());
    if (cinfer__jit_last_log()[0])
        fail_msg("%s: NVRTC's log is not empty:\n%s", what, cinfer__jit_last_log());
    assert_memory_equal(cubin, "\177ELF", 4);
    free(cubin);
}

static void text_form_round_trips(void **state) {
    (void)state;
    const char *texts[] = {"merge_states:dtype_o=bf16,head_dim_vo=128,vec=8",
                           "merge_state:dtype_o=f16,head_dim_vo=7,vec=1",
                           "merge_state_in_place:dtype_o=bf16,head_dim_vo=512,vec=8"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        cinfer__spec_t s = parse(texts[i]);
        char back[512];
        cinfer__spec_format(&s, back, sizeof back);
        assert_string_equal(back, texts[i]);
        cinfer__spec_t again = parse(back);
        assert_memory_equal(&s, &again, sizeof s);
    }
    /* Aliases set those of their fields the family has. */
    cinfer__spec_t a = parse("merge_states:dtype=bf16,head_dim=64,vec=8");
    cinfer__spec_t b = parse("merge_states:dtype_o=bf16,head_dim_vo=64,vec=8");
    assert_memory_equal(&a, &b, sizeof a);
    /* DLPack / PyTorch dtype names parse to the same spec. */
    cinfer__spec_t c = parse("merge_states:dtype=bfloat16,head_dim=64,vec=8");
    assert_memory_equal(&b, &c, sizeof b);
    cinfer__spec_t d = parse("decode:dtype_q=float16,dtype_kv=float8_e4m3fn,dtype_o=float16");
    assert_int_equal(d.dtype_kv, CINFER__DT_E4M3);
    assert_int_equal(d.dtype_q, CINFER__DT_F16);
    /* A dtype left out is written "none", which parses back to it (found by the mutation test). */
    cinfer__spec_t e = parse("decode_tc:dtype_q=f16,head_dim=128");
    char text[512];
    cinfer__spec_format(&e, text, sizeof text);
    assert_non_null(strstr(text, "dtype_o=none"));
    cinfer__spec_t f = parse(text);
    assert_memory_equal(&e, &f, sizeof e);
}

static void bad_text_names_the_problem(void **state) {
    (void)state;
    cinfer__spec_t s;
    assert_int_equal(cinfer__spec_parse("nonsense:dtype=bf16", &s), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "unknown operation \"nonsense\""));
    assert_non_null(strstr(cinfer_last_error(), "merge_states"));
    assert_int_equal(cinfer__spec_parse("merge_states:colour=red", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "unknown field \"colour\""));
    assert_int_equal(cinfer__spec_parse("merge_states:dtype=f64", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "f64"));
    assert_int_equal(cinfer__spec_parse("merge_states:head_dim=-3", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_int_equal(cinfer__spec_parse("merge_states:head_dim", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "FIELD=VALUE"));
    assert_int_equal(cinfer__spec_parse(NULL, &s), CINFER_STATUS_INVALID_ARGUMENT);
    /* A value's error names the spec and the field as written (dtype sets three fields). */
    assert_int_equal(cinfer__spec_parse("merge_states:dtype=bf17,head_dim=64", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(
        strstr(cinfer_last_error(), "spec \"merge_states:dtype=bf17,head_dim=64\", field dtype: "));
    assert_non_null(strstr(cinfer_last_error(), "\"bf17\""));
    /* A field set twice is an error naming both keys. */
    assert_int_equal(cinfer__spec_parse("merge_states:dtype=bf16,dtype=f16", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(
        strstr(cinfer_last_error(), "field dtype_o is set twice, by dtype= and by dtype="));
    assert_non_null(strstr(cinfer_last_error(), "give the fields one by one"));
    /* the alias first or second, each named */
    assert_int_equal(cinfer__spec_parse("decode:dtype_kv=e4m3,dtype=bf16", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(
        strstr(cinfer_last_error(), "field dtype_kv is set twice, by dtype_kv= and by dtype="));
    assert_int_equal(cinfer__spec_parse("decode:dtype=bf16,dtype_kv=e4m3", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(
        strstr(cinfer_last_error(), "field dtype_kv is set twice, by dtype= and by dtype_kv="));
    assert_non_null(strstr(cinfer_last_error(), "dtype= sets dtype_q, dtype_kv and dtype_o"));
    assert_int_equal(cinfer__spec_parse("prefill:head_dim=128,head_dim_qk=192", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(),
                           "field head_dim_qk is set twice, by head_dim= and by head_dim_qk="));
    assert_int_equal(cinfer__spec_parse("merge_states:vec=8,vec=1", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "field vec is set twice, by vec= and by vec="));
    assert_null(strstr(cinfer_last_error(), "one by one"));
    /* A field, an alias or a flag the operation does not have is an error that lists what it
     * has (it would change nothing: the kernel of the spec without it). */
    assert_int_equal(
        cinfer__spec_parse("merge_states:dtype=bf16,head_dim=64,vec=8,variant=sinks", &s),
        CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(),
                           "field variant does not apply to merge_states (its fields: dtype_o, "
                           "head_dim_vo, vec)"));
    assert_int_equal(cinfer__spec_parse("decode:dtype=bf16,head_dim=128,stages=2", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "field stages does not apply to decode"));
    assert_int_equal(cinfer__spec_parse("packbits:dtype=bf16", &s), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "(its fields: vec)"));
    assert_int_equal(cinfer__spec_parse("seq_lens:head_dim=64", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "(its fields: none)"));
    assert_int_equal(cinfer__spec_parse("decode:flags=softcap+window", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(
        strstr(cinfer_last_error(), "flags window do not apply to decode (its flags: softcap)"));
    assert_int_equal(cinfer__spec_parse("prefill:flags=softcap+bogus", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "field flags: unknown flag \"bogus\" (expected"));
    assert_non_null(strstr(cinfer_last_error(), "'+' of softcap, window)"));
    /* A custom mask is run-time data, the custom_mask variant's: mask= has no such value. */
    assert_int_equal(cinfer__spec_parse("prefill:backend=sm80,mask=custom", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(),
                           "spec \"prefill:backend=sm80,mask=custom\", field mask: \"custom\" is "
                           "not a mask of the spec (expected none or causal)"));
    assert_non_null(strstr(cinfer_last_error(), "variant=custom_mask"));
    assert_int_equal(cinfer__spec_parse("mla:mask=sliding", &s), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "(expected one of none, causal)"));
    /* An empty item is an error naming its column, wherever it is (a field may have been lost
     * there), as an empty item of the tool's --arch lists is. */
    static const struct {
        const char *text;
        const char *column;
    } empty[] = {{"merge_states:dtype=bf16,,head_dim=64,vec=8", "column 25"},
                 {"merge_states:dtype=bf16,head_dim=64,vec=8,", "column 43"},
                 {"merge_states:,dtype=bf16,head_dim=64,vec=8", "column 14"},
                 {"seq_lens:", "column 10"}};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        assert_int_equal(cinfer__spec_parse(empty[i].text, &s), CINFER_STATUS_INVALID_ARGUMENT);
        char expected[256];
        snprintf(expected, sizeof expected, "spec \"%s\": empty field at %s (expected FIELD=VALUE",
                 empty[i].text, empty[i].column);
        if (!strstr(cinfer_last_error(), expected))
            fail_msg("\"%s\": %s", empty[i].text, cinfer_last_error());
    }
    /* An operation without fields needs no colon. */
    cinfer__spec_t a = parse("seq_lens");
    assert_int_equal(a.op, CINFER__OP_SEQ_LENS);
}

/* Through cinfer__spec_parse_valid, a field the text leaves out is "not given" (INVALID_ARGUMENT,
 * with what to write), and one it gives as 0 is out of range (its value and the range). */
static void missing_fields_are_told_from_zeros(void **state) {
    (void)state;
    cinfer__spec_t s;
    static const struct {
        const char *text;
        cinfer_status_t status;
        const char *message;
    } cases[] = {
        {"merge_states:dtype=bf16,vec=8", CINFER_STATUS_INVALID_ARGUMENT,
         "merge_states: head_dim_vo is not given (head_dim_vo=N; head_dim=N sets every head dim"},
        {"merge_states:dtype=bf16,head_dim=0,vec=8", CINFER_STATUS_UNSUPPORTED,
         "merge_states: head_dim_vo 0 is out of range [1, 1024]"},
        {"merge_states:dtype=bf16,head_dim=64", CINFER_STATUS_INVALID_ARGUMENT,
         "merge_states: vec is not given (vec=1 or vec=8"},
        {"merge_states:dtype=bf16,head_dim=64,vec=0", CINFER_STATUS_UNSUPPORTED,
         "merge_states: vec 0 is not supported (1 or 8)"},
        {"merge_states:head_dim=64,vec=8", CINFER_STATUS_INVALID_ARGUMENT,
         "merge_states: dtype_o is not given (dtype_o=f16 or =bf16"},
        {"merge_states:dtype=none,head_dim=64,vec=8", CINFER_STATUS_UNSUPPORTED,
         "merge_states: dtype_o none is not supported (f16 or bf16)"},
        {"decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4",
         CINFER_STATUS_INVALID_ARGUMENT, "decode: warps is not given (warps=N)"},
        {"decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=0",
         CINFER_STATUS_INVALID_ARGUMENT, "decode: warps 0 outside [1, 8]"},
        {"decode:dtype=bf16,head_dim=128,paged=1,tile_q=0,tile_kv=4,warps=4",
         CINFER_STATUS_INVALID_ARGUMENT, "decode: tile_q 0 / tile_kv 4 outside [1, 8]"},
        {"decode_tc:dtype=bf16,head_dim=128,tile_q=4,warps=3,stages=0",
         CINFER_STATUS_INVALID_ARGUMENT, "stages 0 (2..4)"},
        {"prefill:dtype=bf16,head_dim=128,tile_q=64,tile_kv=64,warps=4,stages=2",
         CINFER_STATUS_INVALID_ARGUMENT, "prefill: backend is not given (backend=sm80"},
        {"prefill:backend=simt,dtype=bf16,head_dim=128,tile_q=64,tile_kv=64,warps=4,stages=2",
         CINFER_STATUS_UNSUPPORTED, "prefill: backend simt is not implemented (sm80, sm90)"},
        {"prefill:backend=sm80,dtype=bf16,head_dim=128,tile_q=64,tile_kv=64,warps=0,stages=2",
         CINFER_STATUS_INVALID_ARGUMENT, "prefill: warps 0, expected 1, 2, 4 or 8"},
        {"mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,tile_q=16,tile_kv=32,warps=4",
         CINFER_STATUS_INVALID_ARGUMENT, "mla: stages is not given (stages=N)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const cinfer_status_t st = cinfer__spec_parse_valid(cases[i].text, &s);
        char prefix[512];
        snprintf(prefix, sizeof prefix, "spec \"%s\": ", cases[i].text);
        if (st != cases[i].status || strncmp(cinfer_last_error(), prefix, strlen(prefix)) != 0 ||
            !strstr(cinfer_last_error(), cases[i].message))
            fail_msg("\"%s\": status %d, \"%s\"; expected %d, \"%s\"", cases[i].text, (int)st,
                     cinfer_last_error(), (int)cases[i].status, cases[i].message);
        /* an out-of-range value is not called missing */
        if (cases[i].status == CINFER_STATUS_UNSUPPORTED || strstr(cases[i].message, " 0"))
            assert_null(strstr(cinfer_last_error(), "not given"));
    }
    /* A complete spec passes, as it is: the same spec cinfer__spec_parse gives. */
    assert_int_equal(cinfer__spec_parse_valid("merge_states:dtype=bf16,head_dim=64,vec=8", &s),
                     CINFER_STATUS_SUCCESS);
    cinfer__spec_t t = parse("merge_states:dtype=bf16,head_dim=64,vec=8");
    assert_memory_equal(&s, &t, sizeof s);
    /* Parse errors are the parser's. */
    assert_int_equal(cinfer__spec_parse_valid("merge_states:dtype=bf16,,head_dim=64,vec=8", &s),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "empty field at column 25"));
}

/* Arch names: the form NVRTC takes, and sm_80 at least, in the renderer as in the tool. */
static void archs_are_checked_for_form_and_minimum(void **state) {
    (void)state;
    assert_int_equal(cinfer__arch_number("sm_80"), 80);
    assert_int_equal(cinfer__arch_number("sm_90a"), 90);
    assert_int_equal(cinfer__arch_number("sm_100f"), 100);
    assert_int_equal(cinfer__arch_number("sm_120a"), 120);
    static const char *const malformed[] = {"sm_8",  "sm_1000", "sm_90b", "compute_90", "sm_",
                                            "SM_90", "sm_90aa", "",       "sm_-80"};
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++)
        assert_int_equal(cinfer__arch_number(malformed[i]), -1);
    assert_int_equal(cinfer__arch_number(NULL), -1);

    cinfer__spec_t s = parse("merge_states:dtype=bf16,head_dim=128,vec=8");
    cinfer__rendered_t r;
    static const char *const old[] = {"sm_75", "sm_70", "sm_61", "sm_50"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        assert_int_equal(cinfer__spec_render(&s, old[i], 13000, &r), CINFER_STATUS_UNSUPPORTED);
        char expected[128];
        snprintf(expected, sizeof expected, "arch: %s is older than sm_80", old[i]);
        assert_non_null(strstr(cinfer_last_error(), expected));
    }
    assert_int_equal(cinfer__spec_render(&s, "compute_90", 13000, &r),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "arch: \"compute_90\" is not an arch of the form"));
    assert_int_equal(cinfer__spec_render(&s, NULL, 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_int_equal(cinfer__arch_check("sm_86", "--arch"), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__arch_check("sm_75", "--arch"), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "--arch: sm_75 is older than sm_80"));
    static const char *const fine[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100f"};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        render(&s, fine[i], &r);
        cinfer__rendered_free(&r);
    }
}

/*
 * Spec texts mutated from valid ones (pieces inserted: separators, names, numbers past every
 * integer type, printf directives, bytes outside ASCII; ranges deleted or repeated) either fail to
 * parse with INVALID_ARGUMENT and a message, or parse to a spec whose text form parses back to
 * the same spec; validating and rendering a spec that parses returns a status, and a message with
 * any status but SUCCESS. `make test-sanitize` runs this under ASan and UBSan, where any read past
 * a buffer or overflowing conversion on the way ends the test.
 */
static void mutated_texts_parse_or_fail_cleanly(void **state) {
    (void)state;
    static const char *valid[] = {
        "merge_states:dtype=bf16,head_dim=128,vec=8",
        "decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=4",
        "decode_tc:dtype_q=f16,dtype_kv=e4m3,dtype_o=f16,head_dim=128,paged=1,tile_q=4,warps=3,"
        "stages=2,variant=sinks",
        "prefill:backend=sm90,dtype=bf16,head_dim=128,mask=causal,tile_q=128,tile_kv=128,warps=8,"
        "stages=3,flags=softcap+window",
        "prefill:backend=sm80,dtype_q=f16,dtype_kv=e5m2,dtype_o=f16,head_dim_qk=192,head_dim_vo="
        "128,"
        "batch=1,paged=1,variant=custom_mask,gqa_pack=4,pos=rope",
        "mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,mask=causal,tile_q=64,tile_kv=64,warps=8,"
        "stages=2,gqa_pack=64",
        "append_paged_kv_cache:dtype_kv=e4m3,dtype_o=bf16,head_dim_vo=128,vec=8",
        "rope_cos_sin_cache:dtype=f16,head_dim=64,vec=8",
        "packbits:vec=4",
        "segment_packbits",
    };
    static const char *pieces[] = {
        ":",
        ",",
        "=",
        "+",
        "-",
        "0",
        "-1",
        "2147483648",
        "-9223372036854775809",
        "99999999999999999999999",
        "1e9",
        "0x10",
        " ",
        "\t",
        "%s%n%x",
        "\xc3\xa9",
        "\x7f",
        "dtype",
        "head_dim",
        "variant=",
        "flags=none+",
        "mask=custom",
        "backend=sm90",
        "::",
        "=,",
        "tile_q=64,tile_q=64",
    };
    const size_t num_valid = sizeof valid / sizeof valid[0];
    const size_t num_pieces = sizeof pieces / sizeof pieces[0];
    cinfer_test_rng rng; /* a fixed seed: the same texts on every run */
    cinfer_test_rng_init(&rng, 0x9E3779B97F4A7C15ull);
    int parsed = 0, refused = 0;
    for (int iter = 0; iter < 10000; iter++) {
        char text[1024];
        cinfer__fmt(text, sizeof text, "%s", valid[cinfer_test_rng_below(&rng, num_valid)]);
        const int edits = 1 + (int)cinfer_test_rng_below(&rng, 4);
        for (int e = 0; e < edits; e++) {
            const size_t len = strlen(text), at = cinfer_test_rng_below(&rng, len + 1);
            const uint64_t kind = cinfer_test_rng_below(&rng, 5);
            char next[1024];
            const char *comma = strchr(text + at, ',');
            const char *digit = strpbrk(text + at, "0123456789");
            if (kind == 3 && comma) { /* drop the item after a comma */
                const char *end = strchr(comma + 1, ',');
                cinfer__fmt(next, sizeof next, "%.*s%s", (int)(comma - text), text, end ? end : "");
            } else if (kind == 4 && digit) { /* another number in place of one */
                static const char *numbers[] = {"0",  "1",   "3",     "7",          "16",
                                                "64", "256", "65536", "2147483647", "4294967296"};
                const size_t n = strspn(digit, "0123456789");
                cinfer__fmt(
                    next, sizeof next, "%.*s%s%s", (int)(digit - text), text,
                    numbers[cinfer_test_rng_below(&rng, sizeof numbers / sizeof numbers[0])],
                    digit + n);
            } else if (kind == 0) { /* insert a piece */
                cinfer__fmt(next, sizeof next, "%.*s%s%s", (int)at, text,
                            pieces[cinfer_test_rng_below(&rng, num_pieces)], text + at);
            } else if (kind == 1) { /* delete up to 8 bytes */
                const size_t n = 1 + cinfer_test_rng_below(&rng, 8);
                cinfer__fmt(next, sizeof next, "%.*s%s", (int)at, text,
                            text + (at + n < len ? at + n : len));
            } else if (kind == 2) { /* repeat up to 12 bytes from elsewhere */
                const size_t from = cinfer_test_rng_below(&rng, len + 1);
                const int n = 1 + (int)cinfer_test_rng_below(&rng, 12);
                cinfer__fmt(next, sizeof next, "%.*s%.*s%s", (int)at, text, n, text + from,
                            text + at);
            } else {
                continue; /* no comma or digit after `at` */
            }
            memcpy(text, next, sizeof text);
        }
        cinfer__spec_t spec;
        const cinfer_status_t st = cinfer__spec_parse(text, &spec);
        if (st != CINFER_STATUS_SUCCESS) {
            if (st != CINFER_STATUS_INVALID_ARGUMENT || !cinfer_last_error()[0])
                fail_msg("\"%s\": status %d, message \"%s\"", text, (int)st, cinfer_last_error());
            refused++;
            continue;
        }
        parsed++;
        char back[1024];
        cinfer__spec_format(&spec, back, sizeof back);
        cinfer__spec_t again;
        if (cinfer__spec_parse(back, &again) != CINFER_STATUS_SUCCESS)
            fail_msg("\"%s\" parsed, its text form \"%s\" did not: %s", text, back,
                     cinfer_last_error());
        if (memcmp(&spec, &again, sizeof spec) != 0)
            fail_msg("\"%s\" and its text form \"%s\" parse to different specs", text, back);
        if (cinfer__spec_validate(&spec) != CINFER_STATUS_SUCCESS && !cinfer_last_error()[0])
            fail_msg("\"%s\": validation failed without a message", text);
        cinfer__rendered_t r;
        const char *arch = (iter & 1) ? "sm_90a" : "sm_80";
        if (cinfer__spec_render(&spec, arch, 13000, &r) != CINFER_STATUS_SUCCESS &&
            !cinfer_last_error()[0])
            fail_msg("\"%s\": rendering failed without a message", text);
        cinfer__rendered_free(&r);
    }
    printf("mutated spec texts: %d parsed, %d refused\n", parsed, refused);
    /* Both outcomes occur often enough for the test to mean something. */
    assert_true(parsed > 1000);
    assert_true(refused > 1000);
}

static void validation_rejects_unsupported_specs(void **state) {
    (void)state;
    cinfer__rendered_t r;
    cinfer__spec_t s = parse("merge_states:dtype=f32,head_dim=128,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "dtype_o f32"));
    s = parse("merge_states:dtype=bf16,head_dim=100,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "head_dim_vo % 8"));
    s = parse("merge_states:dtype=bf16,head_dim=128"); /* vec is required */
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "vec is not given (vec=1 or vec=8: elements"));
    /* A spec without its text cannot tell 0 from left out: a required 0 is "not given" (the
     * parser's cinfer__spec_parse_valid tells them apart). */
    s = parse("merge_states:dtype=bf16,head_dim=0,vec=1");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "merge_states: head_dim_vo is not given"));
    s = parse("merge_states:dtype=bf16,head_dim=2048,vec=1");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "head_dim_vo 2048 is out of range [1, 1024]"));
    s = parse("merge_states:dtype=bf16,head_dim=64,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "gfx90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "sm_XY"));
    /* prefill's backend has no default: its absence is named, as every missing field's is. */
    s = parse("prefill:dtype=bf16,head_dim=128");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(),
                           "prefill: backend is not given (backend=sm80, or backend=sm90 for "
                           "sm_90a)"));
    /* Any other field left out that has no default is named as such, not as a bad value. */
    s = parse("prefill:backend=sm80,dtype=bf16,head_dim=128,tile_q=64,tile_kv=64,stages=2");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "prefill: warps is not given (warps=N)"));
    s = parse("decode:dtype=bf16,head_dim=128,tile_q=4,tile_kv=4");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "decode: warps is not given (warps=N)"));
    s = parse("merge_states:head_dim=128,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "merge_states: dtype_o is not given (dtype_o=f16"));
    /* decode's paged is 0 or 1, as prefill's */
    s = parse("decode:dtype=bf16,head_dim=128,paged=2,tile_q=4,tile_kv=4,warps=4");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "decode: paged 2, expected 0 or 1"));
    s = parse("decode_tc:dtype=bf16,head_dim=128,paged=3,tile_q=4,warps=3,stages=2");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "decode_tc: paged 3, expected 0 or 1"));
}

static void rendering_is_consistent(void **state) {
    (void)state;
    cinfer__spec_t s = parse("merge_states:dtype=bf16,head_dim=128,vec=8");
    cinfer__rendered_t r;
    render(&s, "sm_90a", &r);
    assert_string_equal(r.name, "merge_states_bf16_hd128_vec8");
    assert_non_null(
        strstr(r.source.data, "#define CINFER_KERNEL_NAME merge_states_bf16_hd128_vec8\n"));
    assert_non_null(strstr(r.source.data, "#define CINFER_OP_MERGE_STATES 1\n"));
    assert_non_null(strstr(r.source.data, "#define CINFER_DTYPE_O 2\n"));
    assert_non_null(strstr(r.source.data, "#define CINFER_HEAD_DIM_VO 128\n"));
    assert_non_null(strstr(r.source.data, "#include \"merge.cu\""));
    /* The key holds every input of the compile. */
    assert_non_null(strstr(r.key.data, "arch sm_90a"));
    assert_non_null(strstr(r.key.data, "nvrtc 13000"));
    assert_non_null(strstr(r.key.data, cinfer_version_string()));
    assert_non_null(strstr(r.key.data, "--gpu-architecture=sm_90a"));
    assert_non_null(strstr(r.key.data, r.source.data));
    char sources[32];
    cinfer__fmt(sources, sizeof sources, "sources %016llx", cinfer__kernel_sources_hash());
    assert_non_null(strstr(r.key.data, sources));
    assert_int_equal(strlen(r.key_hash), 32);
    assert_int_equal(strncmp(r.file_stem, r.name, strlen(r.name)), 0);
    assert_non_null(strstr(r.file_stem, r.key_hash));
    /* The same spec renders the same key, every time. */
    cinfer__rendered_t again;
    render(&s, "sm_90a", &again);
    assert_string_equal(r.key.data, again.key.data);
    assert_string_equal(r.key_hash, again.key_hash);
    cinfer__rendered_free(&again);
    cinfer__rendered_free(&r);
}

static void key_changes_with_every_field(void **state) {
    (void)state;
    const char *base = "merge_states:dtype=bf16,head_dim=128,vec=8";
    const char *changed[] = {
        "merge_states:dtype=f16,head_dim=128,vec=8", "merge_states:dtype=bf16,head_dim=64,vec=8",
        "merge_states:dtype=bf16,head_dim=128,vec=1", "merge_state:dtype=bf16,head_dim=128,vec=8",
        "merge_state_in_place:dtype=bf16,head_dim=128,vec=8"};
    cinfer__spec_t s = parse(base);
    cinfer__rendered_t r0, r;
    render(&s, "sm_90a", &r0);
    for (size_t i = 0; i < sizeof changed / sizeof changed[0]; i++) {
        cinfer__spec_t c = parse(changed[i]);
        render(&c, "sm_90a", &r);
        assert_string_not_equal(r.key_hash, r0.key_hash);
        assert_string_not_equal(r.name, r0.name);
        cinfer__rendered_free(&r);
    }
    /* Arch and NVRTC version change the key but not the name. */
    render(&s, "sm_80", &r);
    assert_string_not_equal(r.key_hash, r0.key_hash);
    assert_string_equal(r.name, r0.name);
    cinfer__rendered_free(&r);
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13010, &r), CINFER_STATUS_SUCCESS);
    assert_string_not_equal(r.key_hash, r0.key_hash);
    cinfer__rendered_free(&r);
    cinfer__rendered_free(&r0);
}

static void kernel_sources_are_embedded(void **state) {
    (void)state;
    assert_true(cinfer__kernel_source_count >= 4);
    const cinfer__source_t *merge = cinfer__kernel_source("merge.cu");
    assert_non_null(merge);
    assert_int_equal(strlen(merge->text), merge->length);
    assert_non_null(strstr(merge->text, "CINFER_KERNEL_NAME"));
    assert_null(cinfer__kernel_source("missing.cu"));
    assert_int_equal(cinfer__kernel_sources_hash(), cinfer__kernel_sources_hash());
}

/* A rendered program from hand-written source, for the trivial and broken compiles. */
static void rendered_from(cinfer__rendered_t *r, const char *name, const char *source,
                          const char *arch) {
    memset(r, 0, sizeof *r);
    cinfer__fmt(r->name, sizeof r->name, "%s", name);
    cinfer__str_puts(&r->source, source);
    cinfer__fmt(r->arch_option, sizeof r->arch_option, "--gpu-architecture=%s", arch);
    r->options[r->num_options++] = "-default-device";
    r->options[r->num_options++] = r->arch_option;
}

static void nvrtc_compiles_without_a_gpu(void **state) {
    (void)state;
    const char *archs[] = {"sm_80", "sm_90a"};
    for (int i = 0; i < 2; i++) {
        cinfer__rendered_t r;
        rendered_from(
            &r, "trivial",
            "extern \"C\" __global__ void trivial(float *x) { x[threadIdx.x] += 1.0f; }\n",
            archs[i]);
        void *cubin = NULL;
        size_t size = 0;
        double seconds = -1;
        cinfer_status_t st = cinfer__jit_compile(&r, &cubin, &size, &seconds);
        if (st != CINFER_STATUS_SUCCESS)
            fail_msg("trivial for %s: %s", archs[i], cinfer_last_error());
        assert_true(size > 100);
        assert_memory_equal(cubin, "\177ELF", 4); /* a cubin is an ELF file */
        assert_true(seconds >= 0);
        free(cubin);
        cinfer__rendered_free(&r);
    }
}

static void compile_errors_carry_the_log(void **state) {
    (void)state;
    cinfer__rendered_t r;
    rendered_from(&r, "broken",
                  "extern \"C\" __global__ void broken(float *x) {\n  x[0] = undeclared_name;\n}\n",
                  "sm_90a");
    void *cubin = NULL;
    size_t size = 0;
    double seconds;
    assert_int_equal(cinfer__jit_compile(&r, &cubin, &size, &seconds), CINFER_STATUS_COMPILE_ERROR);
    assert_non_null(strstr(cinfer_last_error(), "undeclared_name"));
    assert_non_null(strstr(cinfer_last_error(), "broken.cu(2)")); /* the line of the error */
    assert_null(cubin);
    cinfer__rendered_free(&r);
}

/* The tensor-core decode's fp8 path at the head dims the variant matrix does not build (64 with
 * e5m2, 256 with e4m3), for sm_80 (the e4m3 conversion by bit moves) and sm_90a (F2FP). */
static void fp8_tensor_core_decode_compiles(void **state) {
    (void)state;
    const char *specs[] = {
        "decode_tc:dtype_q=f16,dtype_kv=e5m2,dtype_o=f16,head_dim=64,paged=0,tile_q=8,warps=4,"
        "stages=3",
        "decode_tc:dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim=256,paged=1,tile_q=16,"
        "warps=4,stages=2"};
    const char *archs[] = {"sm_80", "sm_90a"};
    for (size_t i = 0; i < 2; i++) {
        for (int a = 0; a < 2; a++) {
            cinfer__spec_t s = parse(specs[i]);
            cinfer__rendered_t r;
            render(&s, archs[a], &r);
            void *cubin = NULL;
            size_t size = 0;
            double seconds;
            if (cinfer__jit_compile(&r, &cubin, &size, &seconds) != CINFER_STATUS_SUCCESS)
                fail_msg("%s for %s: %s", specs[i], archs[a], cinfer_last_error());
            assert_memory_equal(cubin, "\177ELF", 4);
            free(cubin);
            cinfer__rendered_free(&r);
        }
    }
}

/* In-kernel RoPE is the pos field of decode and prefill specs: a compile-time switch in the
 * prelude, the name and the key; kernels without it keep their names. */
static void rope_specs_render_and_compile(void **state) {
    (void)state;
    const char *off = "prefill:backend=sm80,dtype=bf16,head_dim=128,paged=1,batch=1,mask=causal,"
                      "tile_q=128,tile_kv=64,warps=4,stages=2";
    const char *on = "prefill:backend=sm80,dtype=bf16,head_dim=128,paged=1,batch=1,mask=causal,"
                     "pos=rope,tile_q=128,tile_kv=64,warps=4,stages=2";
    cinfer__spec_t s_off = parse(off), s_on = parse(on);
    assert_int_equal(s_off.pos, CINFER__POS_NONE);
    assert_int_equal(s_on.pos, CINFER__POS_ROPE_LLAMA);
    char back[512];
    cinfer__spec_format(&s_on, back, sizeof back);
    assert_non_null(strstr(back, ",pos=rope,"));
    cinfer__spec_t again = parse(back);
    assert_memory_equal(&again, &s_on, sizeof again);
    cinfer__rendered_t r_off, r_on;
    render(&s_off, "sm_90a", &r_off);
    render(&s_on, "sm_90a", &r_on);
    assert_string_equal(r_off.name,
                        "prefill_sm80_qbf16_kvbf16_bf16_hdqk128_hd128_paged_batch_causal_q128_k64_"
                        "w4_s2");
    assert_string_equal(r_on.name, "prefill_sm80_qbf16_kvbf16_bf16_hdqk128_hd128_paged_batch_"
                                   "causal_rope_q128_k64_w4_s2");
    assert_non_null(strstr(r_off.source.data, "#define CINFER_POS 0\n"));
    assert_non_null(strstr(r_on.source.data, "#define CINFER_POS 1\n"));
    assert_string_not_equal(r_off.key_hash, r_on.key_hash);
    cinfer__rendered_free(&r_off);
    cinfer__rendered_free(&r_on);

    /* Validation: ALiBi is a variant, not a pos; RoPE needs whole 8-element halves. */
    cinfer__rendered_t r;
    cinfer__spec_t s = parse("decode:dtype=bf16,head_dim=128,paged=1,pos=alibi,tile_q=4,"
                             "tile_kv=4,warps=4");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "pos alibi"));
    s = parse("decode:dtype=bf16,head_dim=40,paged=1,pos=rope,tile_q=4,tile_kv=4,warps=4");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "head_dim_qk % 16 == 0, got 40"));
    /* Prefill rotates 16-bit K tiles only: RoPE with fp8 K/V is refused before NVRTC. */
    s = parse("prefill:backend=sm80,dtype_q=bf16,dtype_kv=e5m2,dtype_o=bf16,head_dim=128,"
              "batch=0,mask=causal,pos=rope,tile_q=128,tile_kv=64,warps=4,stages=2");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "pos rope with dtype_kv e5m2"));
    /* An unknown name lists the field's names. */
    cinfer__spec_t bad;
    assert_int_equal(cinfer__spec_parse("decode:dtype=bf16,pos=rope_llama", &bad),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(),
                           "field pos: unknown value \"rope_llama\" (expected one of none, "
                           "rope, alibi)"));
    /* The tensor-core decode has no RoPE: the field is not part of its specs. */
    assert_int_equal(
        cinfer__spec_parse("decode_tc:dtype=bf16,head_dim=128,paged=1,pos=rope,tile_q=4,warps=4,"
                           "stages=2",
                           &bad),
        CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "field pos does not apply to decode_tc"));

    /* NVRTC compiles the RoPE kernels: prefill with a chunk column per thread (D = 128), with the
     * generic copies (D = 80, two warps), the smallest head dim (16, one unit per row), and
     * decode with 16-bit and fp8 KV and a token row narrower than a warp (D = 48). */
    const char *specs[] = {
        on,
        "prefill:backend=sm80,dtype=f16,head_dim=80,paged=0,batch=1,mask=none,pos=rope,tile_q=32,"
        "tile_kv=32,warps=2,stages=2",
        "prefill:backend=sm80,dtype=bf16,head_dim=16,batch=0,mask=causal,pos=rope,tile_q=64,"
        "tile_kv=32,warps=4,stages=2",
        "decode:dtype=bf16,head_dim=128,paged=1,pos=rope,tile_q=4,tile_kv=4,warps=4",
        "decode:dtype_q=f16,dtype_kv=e4m3,dtype_o=f16,head_dim=256,paged=0,pos=rope,tile_q=8,"
        "tile_kv=2,warps=4",
        "decode:dtype=f16,head_dim=48,paged=1,pos=rope,tile_q=2,tile_kv=4,warps=4"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        s = parse(specs[i]);
        render(&s, "sm_90a", &r);
        void *cubin = NULL;
        size_t size = 0;
        double seconds;
        if (cinfer__jit_compile(&r, &cubin, &size, &seconds) != CINFER_STATUS_SUCCESS)
            fail_msg("%s: %s", specs[i], cinfer_last_error());
        assert_memory_equal(cubin, "\177ELF", 4);
        free(cubin);
        cinfer__rendered_free(&r);
    }
}

/*
 * The sm90 prefill kernel's specs (kernels/prefill_sm90.cuh): single, batch paged with GQA
 * packing, soft cap with window, the ALiBi variant, a custom mask with a window, D = 64 (single
 * causal; batch with a soft cap on one consumer warpgroup) and D = 256 (64-row K tiles: single
 * with a window, paged batch with a soft cap, a soft cap on one consumer warpgroup), and fp8 K/V
 * (e4m3 paged with GQA packing, e5m2 ragged at D = 256 with a soft cap, single at D = 64 with
 * ALiBi) render with
 * CINFER_BACKEND 2 and compile for sm_90a without warnings that matter here (NVRTC errors would
 * fail); what the kernel does not take is refused by name before NVRTC runs.
 */
static void sm90_prefill_specs(void **state) {
    (void)state;
    static const char *const good[] = {
        "prefill:backend=sm90,dtype=bf16,head_dim=128,mask=causal,tile_q=128,tile_kv=128,warps=8,"
        "stages=3",
        "prefill:backend=sm90,dtype=f16,head_dim=128,batch=1,paged=1,gqa_pack=4,mask=none,"
        "tile_q=128,tile_kv=128,warps=8,stages=3",
        "prefill:backend=sm90,dtype=bf16,head_dim=128,batch=1,mask=causal,flags=softcap+window,"
        "tile_q=64,tile_kv=128,warps=4,stages=2",
        "prefill:backend=sm90,dtype=bf16,head_dim=128,mask=causal,variant=alibi,tile_q=128,"
        "tile_kv=128,warps=8,stages=3",
        "prefill:backend=sm90,dtype=bf16,head_dim=128,batch=1,paged=1,gqa_pack=4,mask=causal,"
        "flags=window,variant=custom_mask,tile_q=128,tile_kv=128,warps=8,stages=3",
        "prefill:backend=sm90,dtype=bf16,head_dim=64,mask=causal,tile_q=128,tile_kv=128,warps=8,"
        "stages=3",
        "prefill:backend=sm90,dtype=f16,head_dim=64,batch=1,mask=none,flags=softcap,tile_q=64,"
        "tile_kv=128,warps=4,stages=2",
        "prefill:backend=sm90,dtype=bf16,head_dim=256,mask=causal,flags=window,tile_q=128,"
        "tile_kv=64,warps=8,stages=2",
        "prefill:backend=sm90,dtype=f16,head_dim=256,batch=1,paged=1,gqa_pack=2,mask=causal,"
        "flags=softcap,tile_q=128,tile_kv=64,warps=8,stages=2",
        "prefill:backend=sm90,dtype=f16,head_dim=256,mask=none,flags=softcap,tile_q=64,"
        "tile_kv=64,warps=4,stages=2",
        "prefill:backend=sm90,dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim=128,batch=1,"
        "paged=1,gqa_pack=4,mask=causal,tile_q=128,tile_kv=128,warps=8,stages=3",
        "prefill:backend=sm90,dtype_q=f16,dtype_kv=e5m2,dtype_o=f16,head_dim=256,batch=1,"
        "mask=none,flags=softcap,tile_q=128,tile_kv=64,warps=8,stages=2",
        "prefill:backend=sm90,dtype_q=bf16,dtype_kv=e5m2,dtype_o=bf16,head_dim=64,batch=1,"
        "mask=causal,variant=alibi,tile_q=64,tile_kv=128,warps=4,stages=2",
        "prefill:backend=sm90,dtype=bf16,head_dim_qk=192,head_dim_vo=128,tile_q=128,tile_kv=64,"
        "warps=8,stages=3",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cinfer__spec_t s = parse(good[i]);
        cinfer__rendered_t r;
        render(&s, "sm_90a", &r);
        assert_non_null(strstr(r.source.data, "#define CINFER_BACKEND 2"));
        assert_non_null(strstr(r.name, "prefill_sm90_"));
        compile_quietly(&r, good[i]);
        cinfer__rendered_free(&r);
    }
    static const struct {
        const char *text;
        cinfer_status_t status;
        const char *names;
    } bad[] = {
        {"prefill:backend=sm90,dtype=bf16,head_dim=192,tile_q=128,tile_kv=64,warps=8,stages=2",
         CINFER_STATUS_UNSUPPORTED, "head dims 192"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=256,tile_q=128,tile_kv=128,warps=8,stages=2",
         CINFER_STATUS_INVALID_ARGUMENT, "tile_kv 128"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=96,tile_q=128,tile_kv=128,warps=8,stages=3",
         CINFER_STATUS_UNSUPPORTED, "head dims 96"},
        {"prefill:backend=sm90,dtype=bf16,head_dim_qk=128,head_dim_vo=64,tile_q=128,tile_kv=128,"
         "warps=8,stages=3",
         CINFER_STATUS_UNSUPPORTED, "head dims 128 / 64"},
        {"prefill:backend=sm90,dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim_qk=192,"
         "head_dim_vo=128,tile_q=128,tile_kv=128,warps=8,stages=2",
         CINFER_STATUS_UNSUPPORTED, "dtype_kv e4m3"},
        {"prefill:backend=sm90,dtype_q=bf16,dtype_kv=i32,dtype_o=bf16,head_dim=128,tile_q=128,"
         "tile_kv=128,warps=8,stages=3",
         CINFER_STATUS_UNSUPPORTED, "dtype_kv i32"},
        {"prefill:backend=sm90,dtype_q=bf16,dtype_kv=e5m2,dtype_o=bf16,head_dim_qk=192,"
         "head_dim_vo=128,tile_q=128,tile_kv=64,warps=8,stages=2",
         CINFER_STATUS_UNSUPPORTED, "head_dim_qk 192 / head_dim_vo 128"},
        {"prefill:backend=sm90,dtype=bf16,head_dim_qk=192,head_dim_vo=128,tile_q=128,tile_kv=128,"
         "warps=8,stages=3",
         CINFER_STATUS_INVALID_ARGUMENT, "more than 227 KiB"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=256,tile_q=128,tile_kv=64,warps=8,stages=3",
         CINFER_STATUS_INVALID_ARGUMENT, "more than 227 KiB"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=128,pos=rope,tile_q=128,tile_kv=128,warps=8,"
         "stages=3",
         CINFER_STATUS_UNSUPPORTED, "pos 1"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=128,variant=sigmoid,tile_q=128,tile_kv=128,"
         "warps=8,stages=3",
         CINFER_STATUS_UNSUPPORTED, "variant sigmoid"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=128,tile_q=256,tile_kv=128,warps=8,stages=3",
         CINFER_STATUS_INVALID_ARGUMENT, "tile_q 256"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=128,tile_q=128,tile_kv=64,warps=8,stages=3",
         CINFER_STATUS_INVALID_ARGUMENT, "tile_kv 64"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=128,tile_q=128,tile_kv=128,warps=8,stages=4",
         CINFER_STATUS_INVALID_ARGUMENT, "stages 4"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=128,batch=1,gqa_pack=3,tile_q=128,tile_kv=128,"
         "warps=8,stages=3",
         CINFER_STATUS_INVALID_ARGUMENT, "gqa_pack 3"},
        {"prefill:backend=sm90,dtype=bf16,head_dim=128,paged=1,batch=0,tile_q=128,tile_kv=128,"
         "warps=8,stages=3",
         CINFER_STATUS_INVALID_ARGUMENT, "paged 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cinfer__spec_t s = parse(bad[i].text);
        cinfer__rendered_t r;
        const cinfer_status_t st = cinfer__spec_render(&s, "sm_90a", 13000, &r);
        if (st != bad[i].status || !strstr(cinfer_last_error(), bad[i].names) ||
            !strstr(cinfer_last_error(), "sm90"))
            fail_msg("%s: status %d, message \"%s\"; expected status %d naming \"%s\"", bad[i].text,
                     (int)st, cinfer_last_error(), (int)bad[i].status, bad[i].names);
    }
}

/*
 * The library's kernels compile without a word from NVRTC: no front-end warning, no ptxas remark
 * (a "Potential Performance Loss", e.g. wgmma serialized, would be one): the ci AOT set for sm_80
 * and sm_90a (every kernel family, both prefill backends).
 */
/* The MLA family (kernels/mla.cu): its limits, and its kernels (attention for packed heads 16 and
 * none, both tile shapes, and the merge) compiling without a note from NVRTC for sm_80 and
 * sm_90a; the warpgroup kernel (64 heads) for sm_90a. */
static void mla_specs(void **state) {
    (void)state;
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"mla:dtype=bf16,head_dim_qk=512,head_dim_vo=512,tile_q=16,tile_kv=16,warps=4,stages=4",
         "head dims 512 / 512"},
        {"mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,tile_q=16,tile_kv=64,warps=4,stages=2",
         "tile_kv 64"},
        {"mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,tile_q=16,tile_kv=16,warps=4,stages=4,"
         "gqa_pack=3",
         "gqa_pack 3"},
        {"mla:dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim_qk=576,head_dim_vo=512,tile_q=16,"
         "tile_kv=16,warps=4,stages=4",
         "dtype_kv e4m3"},
        {"mla_merge:dtype_o=f16,head_dim_vo=256", "head_dim_vo 256"},
        {"mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,tile_q=64,tile_kv=32,warps=4,stages=4,"
         "gqa_pack=64",
         "warps 4"},
        {"mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,tile_q=64,tile_kv=32,warps=8,stages=4,"
         "gqa_pack=16",
         "tile_q 64 (the warpgroup kernel): gqa_pack 16, expected 64"},
        {"mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,tile_q=64,tile_kv=32,warps=8,stages=3,"
         "gqa_pack=64",
         "stages 3, expected 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cinfer__spec_t s = parse(bad[i].text);
        if (cinfer__spec_validate(&s) == CINFER_STATUS_SUCCESS)
            fail_msg("%s: accepted", bad[i].text);
        if (!strstr(cinfer_last_error(), bad[i].why))
            fail_msg("%s: message \"%s\" does not name \"%s\"", bad[i].text, cinfer_last_error(),
                     bad[i].why);
    }
    static const char *const good[] = {
        "mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,mask=causal,tile_q=16,tile_kv=16,warps=4,"
        "stages=4,gqa_pack=16",
        "mla:dtype=f16,head_dim_qk=576,head_dim_vo=512,mask=none,tile_q=16,tile_kv=32,warps=4,"
        "stages=2",
        "mla_merge:dtype_o=bf16,head_dim_vo=512",
    };
    static const char *const archs[] = {"sm_80", "sm_90a"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        for (int a = 0; a < 2; a++) {
            cinfer__spec_t s = parse(good[i]);
            cinfer__rendered_t r;
            render(&s, archs[a], &r);
            char what[256];
            snprintf(what, sizeof what, "%s (%s)", r.name, archs[a]);
            compile_quietly(&r, what);
            cinfer__rendered_free(&r);
        }
    /* The warpgroup kernel (64 heads of a token per CTA): sm_90a only; another arch is refused
     * before NVRTC runs. */
    cinfer__spec_t s = parse("mla:dtype=bf16,head_dim_qk=576,head_dim_vo=512,mask=causal,"
                             "tile_q=64,tile_kv=32,warps=8,stages=4,gqa_pack=64");
    cinfer__rendered_t r;
    render(&s, "sm_90a", &r);
    compile_quietly(&r, "the MLA warpgroup kernel (sm_90a)");
    cinfer__rendered_free(&r);
    assert_int_equal(cinfer__spec_render(&s, "sm_80", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "needs arch sm_90a, not sm_80"));
    cinfer__rendered_free(&r);
    /* The same for the sm90 prefill kernel. */
    s = parse("prefill:dtype=bf16,head_dim=128,backend=sm90,tile_q=128,tile_kv=128,warps=8,"
              "stages=3");
    assert_int_equal(cinfer__spec_render(&s, "sm_86", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "backend sm90 uses wgmma"));
    cinfer__rendered_free(&r);
}

static void library_kernels_compile_quietly(void **state) {
    (void)state;
    static const char *const archs[] = {"sm_80", "sm_90a"};
    for (int a = 0; a < 2; a++) {
        cinfer__spec_t *specs = NULL;
        size_t count = 0;
        assert_int_equal(cinfer__aot_set_specs("ci", archs[a], &specs, &count),
                         CINFER_STATUS_SUCCESS);
        assert_true(count > 0);
        for (size_t i = 0; i < count; i++) {
            cinfer__rendered_t r;
            render(&specs[i], archs[a], &r);
            char what[256];
            snprintf(what, sizeof what, "%s (%s)", r.name, archs[a]);
            compile_quietly(&r, what);
            cinfer__rendered_free(&r);
        }
        free(specs);
    }
}

static void real_kernels_compile_and_cache(void **state) {
    (void)state;
    char dir[] = "/tmp/cinfer-test-spec-XXXXXX";
    assert_non_null(mkdtemp(dir));
    setenv("CINFER_CACHE_DIR", dir, 1);
    unsetenv("CINFER_JIT");
    cinfer__settings_reload();
    const char *specs[] = {"merge_state:dtype=f16,head_dim=100,vec=1",
                           "merge_state_in_place:dtype=bf16,head_dim=64,vec=8",
                           "merge_states:dtype=bf16,head_dim=128,vec=8"};
    const char *archs[] = {"sm_80", "sm_90a"};
    for (size_t i = 0; i < 3; i++) {
        for (int a = 0; a < 2; a++) {
            cinfer__spec_t s = parse(specs[i]);
            void *cubin = NULL;
            size_t size = 0;
            cinfer__jit_source_t from;
            char name[192];
            cinfer_status_t st = cinfer__jit_cubin(&s, archs[a], &cubin, &size, &from, name);
            if (st != CINFER_STATUS_SUCCESS)
                fail_msg("%s for %s: %s", specs[i], archs[a], cinfer_last_error());
            assert_int_equal(from, CINFER__JIT_FROM_COMPILE);
            free(cubin);
            /* The second lookup is a disk hit with the same bytes. */
            void *again = NULL;
            size_t again_size = 0;
            assert_int_equal(cinfer__jit_cubin(&s, archs[a], &again, &again_size, &from, name),
                             CINFER_STATUS_SUCCESS);
            assert_int_equal(from, CINFER__JIT_FROM_DISK);
            assert_int_equal(again_size, size);
            free(again);
        }
    }
    cinfer_jit_stats_t stats = CINFER_JIT_STATS_INIT;
    assert_int_equal(cinfer_jit_get_stats(&stats), CINFER_STATUS_SUCCESS);
    assert_true(stats.misses >= 6);
    assert_true(stats.compiles >= 6);
    assert_true(stats.disk_hits >= 6);
    assert_true(stats.compile_seconds > 0);

    /* With JIT off, cached kernels still load and a new one is NOT_FOUND naming the kernel. */
    setenv("CINFER_JIT", "off", 1);
    cinfer__settings_reload();
    cinfer__spec_t s = parse(specs[0]);
    void *cubin = NULL;
    size_t size;
    assert_int_equal(cinfer__jit_cubin(&s, "sm_80", &cubin, &size, NULL, NULL),
                     CINFER_STATUS_SUCCESS);
    free(cubin);
    cubin = NULL;
    s = parse("merge_states:dtype=f16,head_dim=32,vec=8");
    cinfer_jit_stats_t before = CINFER_JIT_STATS_INIT, after = CINFER_JIT_STATS_INIT;
    assert_int_equal(cinfer_jit_get_stats(&before), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__jit_cubin(&s, "sm_80", &cubin, &size, NULL, NULL),
                     CINFER_STATUS_NOT_FOUND);
    /* A miss that JIT off refuses to compile counts as a miss, not a compile. */
    assert_int_equal(cinfer_jit_get_stats(&after), CINFER_STATUS_SUCCESS);
    assert_int_equal(after.misses, before.misses + 1);
    assert_int_equal(after.compiles, before.compiles);
    assert_non_null(strstr(cinfer_last_error(), "merge_states_f16_hd32_vec8"));
    assert_non_null(strstr(cinfer_last_error(), "CINFER_JIT=off"));
    assert_null(cubin);
    unsetenv("CINFER_JIT");
    cinfer__settings_reload();
    unsigned removed = 0;
    cinfer__cache_clear(dir, &removed);
    rmdir(dir);

    /* A cache folder that cannot exist (below a regular file): compiled in memory, counted. */
    char file[] = "/tmp/cinfer-test-spec-file-XXXXXX";
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    close(fd);
    char below[sizeof file + 8];
    snprintf(below, sizeof below, "%s/cache", file);
    setenv("CINFER_CACHE_DIR", below, 1);
    cinfer__settings_reload();
    assert_int_equal(cinfer_jit_get_stats(&before), CINFER_STATUS_SUCCESS);
    s = parse("merge_state:dtype=bf16,head_dim=16,vec=8");
    assert_int_equal(cinfer__jit_cubin(&s, "sm_80", &cubin, &size, NULL, NULL),
                     CINFER_STATUS_SUCCESS);
    free(cubin);
    assert_int_equal(cinfer_jit_get_stats(&after), CINFER_STATUS_SUCCESS);
    assert_true(after.cache_write_fails > before.cache_write_fails);
    assert_int_equal(after.compiles, before.compiles + 1);
    unlink(file);
    unsetenv("CINFER_CACHE_DIR");
    cinfer__settings_reload();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(text_form_round_trips),
        cmocka_unit_test(bad_text_names_the_problem),
        cmocka_unit_test(missing_fields_are_told_from_zeros),
        cmocka_unit_test(archs_are_checked_for_form_and_minimum),
        cmocka_unit_test(mutated_texts_parse_or_fail_cleanly),
        cmocka_unit_test(validation_rejects_unsupported_specs),
        cmocka_unit_test(rendering_is_consistent),
        cmocka_unit_test(key_changes_with_every_field),
        cmocka_unit_test(kernel_sources_are_embedded),
        cmocka_unit_test(nvrtc_compiles_without_a_gpu),
        cmocka_unit_test(compile_errors_carry_the_log),
        cmocka_unit_test(fp8_tensor_core_decode_compiles),
        cmocka_unit_test(rope_specs_render_and_compile),
        cmocka_unit_test(sm90_prefill_specs),
        cmocka_unit_test(mla_specs),
        cmocka_unit_test(library_kernels_compile_quietly),
        cmocka_unit_test(real_kernels_compile_and_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
