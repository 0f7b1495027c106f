/*
 * Attention variants without a GPU: declaration checking (every kind of mismatch), the generated
 * parameter struct and its layout, argument packing and its checks, the cache key's dependence on
 * the variant's source, and NVRTC compiles of every built-in variant with every attention kernel
 * family for sm_80 and sm_90a, plus a compile error in user code pointing at the user's line.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/jit.h"
#include "ops/options.h"
#include "ops/prefill.h"
#include "variant/variant.h"

#define F32                                                                                        \
    { kDLFloat, 32, 1 }
#define F64                                                                                        \
    { kDLFloat, 64, 1 }
#define I32                                                                                        \
    { kDLInt, 32, 1 }
#define I64                                                                                        \
    { kDLInt, 64, 1 }
#define BF16                                                                                       \
    { kDLBfloat, 16, 1 }

static void expect_error(cinfer_status_t st, cinfer_status_t want, const char *what) {
    assert_int_equal(st, want);
    if (!strstr(cinfer_last_error(), what))
        fail_msg("message \"%s\" does not name \"%s\"", cinfer_last_error(), what);
}

static void expect_create_error(const char *name, const char *source, const cinfer_param_t *params,
                                int n, const char *what) {
    cinfer_variant_t *v = (cinfer_variant_t *)1;
    expect_error(cinfer_variant_create(name, source, params, n, &v), CINFER_STATUS_INVALID_ARGUMENT,
                 what);
    assert_null(v);
}

static void declarations_are_checked(void **state) {
    (void)state;
    const cinfer_param_t ok[] = {{"t", CINFER_PARAM_TENSOR, F32}, {"s", CINFER_PARAM_SCALAR, F32}};
    expect_create_error(NULL, "", ok, 2, "variant name is NULL");
    expect_create_error("", "", ok, 2, "variant name");
    expect_create_error("9lives", "", ok, 2, "\"9lives\"");
    expect_create_error("has-dash", "", ok, 2, "\"has-dash\"");
    char long_name[80];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    expect_create_error(long_name, "", ok, 2, "C identifier");
    expect_create_error("v", NULL, ok, 2, "source is NULL");
    expect_create_error("v", "", ok, -1, "num_params = -1");
    expect_create_error("v", "", ok, 33, "num_params = 33");
    expect_create_error("v", "", NULL, 1, "params is NULL");
    const cinfer_param_t bad_name[] = {{"a b", CINFER_PARAM_TENSOR, F32}};
    expect_create_error("v", "", bad_name, 1, "params[0].name \"a b\"");
    const cinfer_param_t keyword[] = {{"float", CINFER_PARAM_TENSOR, F32}};
    expect_create_error("v", "", keyword, 1, "\"float\" is a C/C++ keyword");
    const cinfer_param_t reserved[] = {{"__x", CINFER_PARAM_SCALAR, F32}};
    expect_create_error("v", "", reserved, 1, "reserved name");
    const cinfer_param_t ours[] = {{"cinfer_unused_", CINFER_PARAM_SCALAR, F32}};
    expect_create_error("v", "", ours, 1, "reserved name");
    const cinfer_param_t null_name[] = {{NULL, CINFER_PARAM_TENSOR, F32}};
    expect_create_error("v", "", null_name, 1, "params[0].name");
    const cinfer_param_t dup[] = {{"x", CINFER_PARAM_TENSOR, F32}, {"x", CINFER_PARAM_SCALAR, F32}};
    expect_create_error("v", "", dup, 2, "repeats params[0]");
    const cinfer_param_t order[] = {{"s", CINFER_PARAM_SCALAR, F32},
                                    {"t", CINFER_PARAM_TENSOR, F32}};
    expect_create_error("v", "", order, 2, "follows a scalar");
    const cinfer_param_t lanes[] = {{"t", CINFER_PARAM_TENSOR, {kDLFloat, 32, 4}}};
    expect_create_error("v", "", lanes, 1, "params[0] (tensor t): dtype");
    const cinfer_param_t half_scalar[] = {{"s", CINFER_PARAM_SCALAR, BF16}};
    expect_create_error("v", "", half_scalar, 1, "params[0] (scalar s): dtype");
    const cinfer_param_t kind[] = {{"k", (cinfer_param_kind_t)7, F32}};
    expect_create_error("v", "", kind, 1, "kind = 7");
    expect_error(cinfer_variant_create("v", "", ok, 2, NULL), CINFER_STATUS_INVALID_ARGUMENT,
                 "out is NULL");

    cinfer_variant_t *v = NULL;
    assert_int_equal(cinfer_variant_create("fine", "// nothing\n", ok, 2, &v),
                     CINFER_STATUS_SUCCESS);
    assert_string_equal(cinfer_variant_name(v), "fine");
    assert_string_equal(cinfer_variant_source(v), "// nothing\n");
    int n = 0;
    const cinfer_param_t *p = cinfer_variant_params(v, &n);
    assert_int_equal(n, 2);
    assert_string_equal(p[1].name, "s");
    cinfer_variant_destroy(v);
    cinfer_variant_destroy(NULL);
}

static void builtins_exist(void **state) {
    (void)state;
    static const char *const names[] = {"sigmoid", "sinks", "alibi", "dump_logits", "custom_mask"};
    static const int counts[] = {2, 1, 2, 4, 3};
    for (int i = 0; i < 5; i++) {
        const cinfer_variant_t *v = cinfer_variant_builtin(names[i]);
        assert_non_null(v);
        int n = -1;
        cinfer_variant_params(v, &n);
        assert_int_equal(n, counts[i]);
        cinfer_variant_destroy((cinfer_variant_t *)v); /* a no-op for built-ins */
        assert_ptr_equal(cinfer_variant_builtin(names[i]), v);
    }
    assert_null(cinfer_variant_builtin("nope"));
    assert_null(cinfer_variant_builtin(NULL));
    /* The host reads the switches it plans with. */
    assert_true(cinfer_variant_builtin("sigmoid")->hooks & CINFER__VARIANT_NO_SOFTMAX);
    assert_false(cinfer_variant_builtin("sinks")->hooks & CINFER__VARIANT_NO_SOFTMAX);
}

/* Two tensors and three scalars: the struct, its layout and the prelude around the source. */
static const cinfer_param_t five[] = {
    {"bias", CINFER_PARAM_TENSOR, F32},  {"maybe_index", CINFER_PARAM_TENSOR, I64},
    {"scale", CINFER_PARAM_SCALAR, F32}, {"theta", CINFER_PARAM_SCALAR, F64},
    {"count", CINFER_PARAM_SCALAR, I32},
};

static void struct_and_prelude(void **state) {
    (void)state;
    cinfer_variant_t *v = NULL;
    assert_int_equal(cinfer_variant_create("five", "// user code\n", five, 5, &v),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(v->offsets[0], 0);
    assert_int_equal(v->offsets[1], 8);
    assert_int_equal(v->offsets[2], 16);
    assert_int_equal(v->offsets[3], 24);
    assert_int_equal(v->offsets[4], 32);
    assert_int_equal(v->struct_bytes, 40);
    cinfer__str_t s = {0};
    cinfer__variant_render(v, &s);
    const char *want = "typedef struct cinfer_variant_params {\n"
                       "    float *bias;\n"
                       "    int64_t *maybe_index;\n"
                       "    float scale;\n"
                       "    double theta;\n"
                       "    int32_t count;\n"
                       "} cinfer_variant_params;\n"
                       "#line 1 \"variant:five\"\n"
                       "// user code\n";
    if (!strstr(s.data, want))
        fail_msg("prelude:\n%s\nlacks:\n%s", s.data, want);
    assert_non_null(strstr(s.data, "#define CINFER_VARIANT 1\n"));
    assert_non_null(strstr(s.data, "#define CINFER_VARIANT_HOST_USE_SOFTMAX 1\n"));
    cinfer__str_free(&s);
    cinfer_variant_destroy(v);
}

static void packing_checks_every_argument(void **state) {
    (void)state;
    cinfer_variant_t *v = NULL;
    assert_int_equal(cinfer_variant_create("five", "", five, 5, &v), CINFER_STATUS_SUCCESS);
    float bias_data[4] = {0};
    int64_t shape[1] = {4};
    DLTensor bias = {bias_data, {kDLCUDA, 0}, 1, F32, shape, NULL, 0};
    cinfer_arg_t a[5] = {CINFER_ARG_TENSOR(&bias), CINFER_ARG_TENSOR(NULL), CINFER_ARG_F32(1.5f),
                         CINFER_ARG_F64(2.5), CINFER_ARG_I32(-7)};
    cinfer_args_t list = {5, a};
    unsigned char blob[CINFER__VARIANT_MAX_BYTES];
    size_t bytes = 0;
    assert_int_equal(cinfer__variant_pack(v, &list, 8, 2, NULL, "op", blob, &bytes),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(bytes, 40);
    void *ptr;
    memcpy(&ptr, blob, sizeof ptr);
    assert_ptr_equal(ptr, bias_data);
    memcpy(&ptr, blob + 8, sizeof ptr);
    assert_null(ptr);
    float f;
    double d;
    int32_t i;
    memcpy(&f, blob + 16, 4);
    memcpy(&d, blob + 24, 8);
    memcpy(&i, blob + 32, 4);
    assert_true(f == 1.5f && d == 2.5 && i == -7);

    /* Count. */
    list.num_args = 4;
    expect_error(cinfer__variant_pack(v, &list, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT,
                 "4 variant argument(s) given, variant five "
                 "declares 5");
    expect_error(cinfer__variant_pack(v, NULL, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "declares 5 (tensor bias");
    list.num_args = 5;
    /* Kind: a scalar where a tensor is declared. */
    a[0] = CINFER_ARG_F32(1.0f);
    expect_error(cinfer__variant_pack(v, &list, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "argument 0 (bias): kind");
    /* NULL only for maybe_. */
    a[0] = CINFER_ARG_TENSOR(NULL);
    expect_error(cinfer__variant_pack(v, &list, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "only parameters named maybe_");
    /* Tensor dtype. */
    DLTensor bias16 = bias;
    bias16.dtype = (DLDataType)BF16;
    a[0] = CINFER_ARG_TENSOR(&bias16);
    expect_error(cinfer__variant_pack(v, &list, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "(tensor bias): dtype bfloat16, expected float32");
    /* Not contiguous. */
    int64_t shape2[2] = {2, 2}, strides2[2] = {4, 1};
    DLTensor strided = {bias_data, {kDLCUDA, 0}, 2, F32, shape2, strides2, 0};
    a[0] = CINFER_ARG_TENSOR(&strided);
    expect_error(cinfer__variant_pack(v, &list, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "not contiguous");
    a[0] = CINFER_ARG_TENSOR(&bias);
    /* Scalar dtype. */
    a[3] = CINFER_ARG_F32(2.5f);
    expect_error(cinfer__variant_pack(v, &list, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "(scalar theta): dtype float32, expected float64");
    a[3] = CINFER_ARG_F64(2.5);
    /* NULL array with a count. */
    cinfer_args_t broken = {5, NULL};
    expect_error(cinfer__variant_pack(v, &broken, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "args->args is NULL");
    /* Default attention takes nothing. */
    expect_error(cinfer__variant_pack(NULL, &list, 8, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "default attention declares 0");
    assert_int_equal(cinfer__variant_pack(NULL, NULL, 8, 2, NULL, "op", blob, &bytes),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(bytes, 4);
    cinfer_variant_destroy(v);
}

/* The built-ins' tensors hold what their kernels index (cinfer.h's shapes, at least num_qo_heads
 * or batch_size elements); ALiBi's num_heads is >= 1. A user variant's tensor of 4 elements
 * passed above with 8 heads: its sizes are its own. */
static void builtin_arguments_are_sized(void **state) {
    (void)state;
    unsigned char blob[CINFER__VARIANT_MAX_BYTES];
    size_t bytes = 0;
    float f32[64] = {0};
    int64_t i64[8] = {0};
    int32_t i32[8] = {0};
    uint8_t u8[8] = {0};
    int64_t n1[1] = {1}, n8[1] = {8}, n32[1] = {32}, n2x4[2] = {2, 4};
    DLTensor one = {f32, {kDLCUDA, 0}, 1, F32, n1, NULL, 0};
    DLTensor heads = {f32, {kDLCUDA, 0}, 1, F32, n32, NULL, 0};
    DLTensor two_d = {f32, {kDLCUDA, 0}, 2, F32, n2x4, NULL, 0};
    DLTensor scalar = {f32, {kDLCUDA, 0}, 0, F32, NULL, NULL, 0};

    const cinfer_variant_t *sinks = cinfer_variant_builtin("sinks");
    cinfer_arg_t a[4] = {CINFER_ARG_TENSOR(&heads)};
    cinfer_args_t list = {1, a};
    assert_int_equal(cinfer__variant_pack(sinks, &list, 32, 1, NULL, "op", blob, &bytes),
                     CINFER_STATUS_SUCCESS);
    expect_error(cinfer__variant_pack(sinks, &list, 33, 1, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT,
                 "op: argument 0 (tensor sinks) of variant sinks: shape [32], expected 1-d "
                 "with at least 33 elements (num_qo_heads)");
    a[0] = CINFER_ARG_TENSOR(&one);
    expect_error(cinfer__variant_pack(sinks, &list, 32, 1, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT,
                 "shape [1], expected 1-d with at least 32 elements");
    a[0] = CINFER_ARG_TENSOR(&two_d);
    expect_error(cinfer__variant_pack(sinks, &list, 8, 1, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT,
                 "shape [2, 4], expected 1-d with at least 8 elements");
    a[0] = CINFER_ARG_TENSOR(&scalar);
    expect_error(cinfer__variant_pack(sinks, &list, 1, 1, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "shape [], expected 1-d with at least 1 elements");

    const cinfer_variant_t *alibi = cinfer_variant_builtin("alibi");
    list.num_args = 2;
    a[0] = CINFER_ARG_TENSOR(NULL);
    a[1] = CINFER_ARG_I32(32);
    assert_int_equal(cinfer__variant_pack(alibi, &list, 32, 1, NULL, "op", blob, &bytes),
                     CINFER_STATUS_SUCCESS);
    a[1] = CINFER_ARG_I32(0);
    expect_error(cinfer__variant_pack(alibi, &list, 32, 1, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT,
                 "argument 1 (scalar num_heads) of variant alibi = 0, expected >= 1");
    a[0] = CINFER_ARG_TENSOR(&one);
    a[1] = CINFER_ARG_I32(4);
    expect_error(cinfer__variant_pack(alibi, &list, 4, 1, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "(tensor maybe_alibi_slopes) of variant alibi");

    /* custom_mask: row_offset and row_stride per request; the mask itself any size. */
    const cinfer_variant_t *mask = cinfer_variant_builtin("custom_mask");
    DLTensor bits = {u8, {kDLCUDA, 0}, 1, {kDLUInt, 8, 1}, n1, NULL, 0};
    DLTensor offsets = {i64, {kDLCUDA, 0}, 1, {kDLInt, 64, 1}, n8, NULL, 0};
    DLTensor strides = {i32, {kDLCUDA, 0}, 1, {kDLInt, 32, 1}, n8, NULL, 0};
    DLTensor short_strides = {i32, {kDLCUDA, 0}, 1, {kDLInt, 32, 1}, n1, NULL, 0};
    cinfer_arg_t m[3] = {CINFER_ARG_TENSOR(&bits), CINFER_ARG_TENSOR(&offsets),
                         CINFER_ARG_TENSOR(&strides)};
    cinfer_args_t mlist = {3, m};
    assert_int_equal(cinfer__variant_pack(mask, &mlist, 32, 8, NULL, "op", blob, &bytes),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__variant_pack(mask, &mlist, 32, 5, NULL, "op", blob, &bytes),
                     CINFER_STATUS_SUCCESS); /* longer than the batch: a graph's buffers */
    expect_error(cinfer__variant_pack(mask, &mlist, 32, 9, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT,
                 "(tensor row_offset) of variant custom_mask: shape [8], expected 1-d with at "
                 "least 9 elements (batch_size)");
    /* dump_logits: row_offset per request; logits any size (device offsets into it). */
    const cinfer_variant_t *dump = cinfer_variant_builtin("dump_logits");
    cinfer_arg_t d[4] = {CINFER_ARG_TENSOR(&one), CINFER_ARG_TENSOR(&offsets), CINFER_ARG_I64(0),
                         CINFER_ARG_I64(0)};
    cinfer_args_t dlist = {4, d};
    assert_int_equal(cinfer__variant_pack(dump, &dlist, 32, 8, NULL, "op", blob, &bytes),
                     CINFER_STATUS_SUCCESS);
    expect_error(cinfer__variant_pack(dump, &dlist, 32, 9, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "(tensor row_offset) of variant dump_logits");
    m[2] = CINFER_ARG_TENSOR(&short_strides);
    expect_error(cinfer__variant_pack(mask, &mlist, 32, 2, NULL, "op", blob, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "(tensor row_stride)");
}

static cinfer__spec_t parse(const char *text) {
    cinfer__spec_t s;
    if (cinfer__spec_parse(text, &s) != CINFER_STATUS_SUCCESS)
        fail_msg("parse \"%s\": %s", text, cinfer_last_error());
    return s;
}

static void key_follows_the_source(void **state) {
    (void)state;
    cinfer_variant_t *a = NULL, *b = NULL, *a2 = NULL;
    assert_int_equal(cinfer_variant_create("same", "// one\n", NULL, 0, &a), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer_variant_create("same", "// two\n", NULL, 0, &b), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer_variant_create("same", "// one\n", NULL, 0, &a2),
                     CINFER_STATUS_SUCCESS);
    assert_true(a->id != b->id);
    assert_true(a->id == a2->id);
    cinfer__spec_t s = parse("prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,tile_q=128,"
                             "tile_kv=64,warps=8,stages=2");
    cinfer__rendered_t ra, rb, ra2, rd;
    s.variant = a, s.variant_id = a->id;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 12000, &ra), CINFER_STATUS_SUCCESS);
    s.variant = b, s.variant_id = b->id;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 12000, &rb), CINFER_STATUS_SUCCESS);
    s.variant = a2, s.variant_id = a2->id;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 12000, &ra2), CINFER_STATUS_SUCCESS);
    s.variant = NULL, s.variant_id = 0;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 12000, &rd), CINFER_STATUS_SUCCESS);
    assert_string_equal(ra.name, rb.name); /* the name says "same"; the key tells them apart */
    assert_string_not_equal(ra.key_hash, rb.key_hash);
    assert_string_equal(ra.key_hash, ra2.key_hash);
    assert_string_not_equal(ra.key_hash, rd.key_hash);
    assert_non_null(strstr(ra.name, "_same"));
    /* A spec whose id does not match its variant is refused; so is a soft cap with a variant. */
    s.variant = a, s.variant_id = b->id;
    assert_int_equal(cinfer__spec_validate(&s), CINFER_STATUS_INVALID_ARGUMENT);
    s.variant_id = a->id;
    s.flags = CINFER__FLAG_SOFT_CAP;
    expect_error(cinfer__spec_validate(&s), CINFER_STATUS_INVALID_ARGUMENT, "soft cap");
    /* The text form names built-ins; unknown names are errors. */
    cinfer__spec_t t = parse("decode:dtype=bf16,head_dim=128,tile_q=4,tile_kv=4,warps=4,"
                             "variant=sinks");
    assert_ptr_equal(t.variant, cinfer_variant_builtin("sinks"));
    char text[512];
    cinfer__spec_format(&t, text, sizeof text);
    assert_non_null(strstr(text, "variant=sinks"));
    cinfer__spec_t u;
    expect_error(cinfer__spec_parse("decode:variant=nope", &u), CINFER_STATUS_INVALID_ARGUMENT,
                 "unknown variant \"nope\"");
    cinfer__rendered_free(&ra);
    cinfer__rendered_free(&rb);
    cinfer__rendered_free(&ra2);
    cinfer__rendered_free(&rd);
    cinfer_variant_destroy(a);
    cinfer_variant_destroy(b);
    cinfer_variant_destroy(a2);
}

/* Compiles s for arch; the library's own kernels (no variant, or a built-in one) must compile
 * without a word from NVRTC (an unused variable in a kernel template, for example). */
static void compile_spec(const cinfer__spec_t *s, const char *arch) {
    cinfer__rendered_t r;
    if (cinfer__spec_render(s, arch, cinfer__jit_nvrtc_version(), &r) != CINFER_STATUS_SUCCESS)
        fail_msg("render for %s: %s", arch, cinfer_last_error());
    void *cubin = NULL;
    size_t size = 0;
    double seconds = 0;
    if (cinfer__jit_compile(&r, &cubin, &size, &seconds) != CINFER_STATUS_SUCCESS)
        fail_msg("compile %s for %s: %s", r.name, arch, cinfer_last_error());
    if ((!s->variant || s->variant->builtin) && cinfer__jit_last_log()[0])
        fail_msg("NVRTC's log of %s for %s: \"%s\"", r.name, arch, cinfer__jit_last_log());
    assert_memory_equal(cubin, "\177ELF", 4);
    free(cubin);
    cinfer__rendered_free(&r);
}

static void compile_spec_text(const char *text, const char *arch) {
    cinfer__spec_t s = parse(text);
    compile_spec(&s, arch);
}

/*
 * Compiles `specs` (sm_80 and sm_90a in turn); then `base` with each built-in variant (with
 * gqa_pack alternating between its own and `alt_pack` when that is nonzero); then each of
 * `user_specs` with a user variant whose query and output transforms depend on `index` ("dim"
 * or "qh"), for sm_80 and sm_90a in turn (one alone: sm_90a).
 */
static void compile_specs_and_variants(const char *const *specs, size_t n, const char *base,
                                       int alt_pack, const char *index,
                                       const char *const *user_specs, size_t n_user) {
    static const char *const archs[] = {"sm_80", "sm_90a"};
    for (size_t i = 0; i < n; i++)
        compile_spec_text(specs[i], archs[i % 2]);
    static const char *const variants[] = {"sigmoid", "sinks", "alibi", "dump_logits",
                                           "custom_mask"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        cinfer__spec_t s = parse(base);
        if (alt_pack && v % 2)
            s.gqa_pack = alt_pack;
        s.variant = cinfer_variant_builtin(variants[v]);
        s.variant_id = s.variant->id;
        compile_spec(&s, archs[v % 2]);
    }
    char source[1024];
    snprintf(source, sizeof source,
             "#define VARIANT_QUERY_TRANSFORM 1\n"
             "__device__ float variant_query_transform(const cinfer_variant_params *params, "
             "float q,\n    int b, int qo, int qh, int dim) { return q * (1.0f + 0.01f * %s); }\n"
             "#define VARIANT_OUTPUT_TRANSFORM 1\n"
             "__device__ float variant_output_transform(const cinfer_variant_params *params, "
             "float o,\n    int b, int qo, int qh, int dim) { return o + 0.5f * %s; }\n",
             index, index);
    cinfer_variant_t *v = NULL;
    assert_int_equal(cinfer_variant_create("dims", source, NULL, 0, &v), CINFER_STATUS_SUCCESS);
    for (size_t i = 0; i < n_user; i++) {
        cinfer__spec_t s = parse(user_specs[i]);
        s.variant = v;
        s.variant_id = v->id;
        compile_spec(&s, archs[(i + (n_user == 1)) % 2]);
    }
    cinfer_variant_destroy(v);
}

static void builtins_compile_with_every_family(void **state) {
    (void)state;
    static const char *const families[] = {
        "decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=4",
        "decode_tc:dtype=f16,head_dim=64,paged=0,tile_q=8,warps=4,stages=3",
        /* fp8 KV: the tensor-core kernel's own path (its e4m3 conversion differs before sm_89). */
        "decode_tc:dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim=128,paged=1,tile_q=4,warps=4,"
        "stages=3",
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,flags=window,tile_q=128,"
        "tile_kv=64,warps=8,stages=2",
    };
    static const char *const variants[] = {"sigmoid", "sinks", "alibi", "dump_logits",
                                           "custom_mask"};
    static const char *const archs[] = {"sm_80", "sm_90a"};
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (size_t v = 0; v < 5; v++)
            for (size_t a = 0; a < 2; a++) {
                cinfer__spec_t s = parse(families[f]);
                s.variant = cinfer_variant_builtin(variants[v]);
                s.variant_id = s.variant->id;
                compile_spec(&s, archs[a]);
            }
}

/* NVRTC's warnings about a variant's source are kept (cinfer__jit_last_log; logged at
 * CINFER_LOG=1), and a built-in variant's kernel has none. */
static void nvrtc_warnings_are_kept(void **state) {
    (void)state;
    cinfer_variant_t *v = NULL;
    assert_int_equal(
        cinfer_variant_create("noisy",
                              "#define VARIANT_LOGITS_TRANSFORM 1\n"
                              "__device__ float variant_logits_transform(\n"
                              "    const cinfer_variant_params *params, float l, int b, int q,\n"
                              "    int k, int qh, int kh) { int never_read = q; return l; }\n",
                              NULL, 0, &v),
        CINFER_STATUS_SUCCESS);
    cinfer__spec_t s = parse("decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=4");
    s.variant = v;
    s.variant_id = v->id;
    compile_spec(&s, "sm_90a");
    if (!strstr(cinfer__jit_last_log(), "never_read"))
        fail_msg("NVRTC's log does not name the unused variable: \"%s\"", cinfer__jit_last_log());
    cinfer_variant_destroy(v);
    s.variant = cinfer_variant_builtin("sinks");
    s.variant_id = s.variant->id;
    compile_spec(&s, "sm_90a"); /* which fails on any NVRTC log of a built-in's kernel */
}

/* A mask given one position at a time, as bit words, both, or as rows of bits in memory (alone
 * and with bit words), and a position bias alone, with a mask (bit words or rows), or before a
 * transform: the host reads each as a logit hook, and each compiles with every family (prefill
 * with one and with two mask words per KV tile). */
static void logit_hooks_compile_with_every_family(void **state) {
    (void)state;
    static const char *const sources[] = {
        "#define VARIANT_LOGITS_MASK 1\n"
        "__device__ bool variant_logits_mask(const cinfer_variant_params *params, int b, int q,\n"
        "                                    int k, int qh, int kh) { return (q + k) % 3 != 0; }\n",
        "#define VARIANT_LOGITS_MASK_BITS 1\n"
        "__device__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params,\n"
        "                                             int b, int q, int k, int count, int qh,\n"
        "                                             int kh) { return 0x55555555u >> (k & 1); }\n",
        "#define VARIANT_LOGITS_MASK 1\n"
        "__device__ bool variant_logits_mask(const cinfer_variant_params *params, int b, int q,\n"
        "                                    int k, int qh, int kh) { return k % 2 == 0; }\n"
        "#define VARIANT_LOGITS_MASK_BITS 1\n"
        "__device__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params,\n"
        "                                             int b, int q, int k, int count, int qh,\n"
        "                                             int kh) { return 0x55555555u >> (k & 1); }\n",
        "#define VARIANT_LOGITS_MASK_ROW 1\n"
        "__device__ const uint32_t *variant_logits_mask_row(const cinfer_variant_params *params,\n"
        "    int b, int q, int qh, int kh, int64_t *bit) {\n"
        "  *bit = 37 * (int64_t)q + 5; return (const uint32_t *)0x1000; }\n",
        "#define VARIANT_LOGITS_MASK_ROW 1\n"
        "__device__ const uint32_t *variant_logits_mask_row(const cinfer_variant_params *params,\n"
        "    int b, int q, int qh, int kh, int64_t *bit) {\n"
        "  *bit = 37 * (int64_t)q + 5; return (const uint32_t *)0x1000; }\n"
        "#define VARIANT_LOGITS_MASK_BITS 1\n"
        "__device__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params,\n"
        "                                             int b, int q, int k, int count, int qh,\n"
        "                                             int kh) { return 0x55555555u >> (k & 1); }\n",
        "#define VARIANT_ALIBI_SLOPE 1\n"
        "__device__ float variant_alibi_slope(const cinfer_variant_params *params, int b,\n"
        "                                     int qh) { return 0.5f / (qh + 1); }\n",
        "#define VARIANT_ALIBI_SLOPE 1\n"
        "__device__ float variant_alibi_slope(const cinfer_variant_params *params, int b,\n"
        "                                     int qh) { return 0.5f / (qh + 1); }\n"
        "#define VARIANT_LOGITS_MASK_ROW 1\n"
        "__device__ const uint32_t *variant_logits_mask_row(const cinfer_variant_params *params,\n"
        "    int b, int q, int qh, int kh, int64_t *bit) {\n"
        "  *bit = 37 * (int64_t)q + 5; return (const uint32_t *)0x1000; }\n",
        "#define VARIANT_ALIBI_SLOPE 1\n"
        "__device__ float variant_alibi_slope(const cinfer_variant_params *params, int b,\n"
        "                                     int qh) { return 0.5f / (qh + 1); }\n"
        "#define VARIANT_LOGITS_MASK_BITS 1\n"
        "__device__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params,\n"
        "                                             int b, int q, int k, int count, int qh,\n"
        "                                             int kh) { return 0x55555555u >> (k & 1); }\n",
        "#define VARIANT_ALIBI_SLOPE 1\n"
        "__device__ float variant_alibi_slope(const cinfer_variant_params *params, int b,\n"
        "                                     int qh) { return 0.5f / (qh + 1); }\n"
        "#define VARIANT_LOGITS_TRANSFORM 1\n"
        "__device__ float variant_logits_transform(const cinfer_variant_params *params,\n"
        "                                          float l, int b, int q, int k, int qh,\n"
        "                                          int kh) { return 0.5f * l; }\n",
    };
    static const char *const families[] = {
        "decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=4",
        "decode_tc:dtype=f16,head_dim=64,paged=0,tile_q=8,warps=4,stages=3",
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,flags=window,tile_q=128,"
        "tile_kv=64,warps=8,stages=2",
        "prefill:backend=sm80,dtype=f16,head_dim=256,paged=1,batch=1,mask=none,tile_q=64,"
        "tile_kv=16,warps=4,stages=3",
        /* GQA packing: every hook with its row's token and query head */
        "prefill:backend=sm80,dtype=bf16,head_dim=128,paged=1,batch=1,mask=causal,flags=window,"
        "tile_q=64,tile_kv=64,warps=4,stages=2,gqa_pack=4",
    };
    /* The sm90 prefill kernel takes the sources of ALiBi slopes and masks in row form alone. */
    static const bool sm90[] = {false, false, false, true, false, true, true, false, false};
    static const char *const sm90_families[] = {
        "prefill:backend=sm90,dtype=bf16,head_dim=128,mask=causal,flags=window,tile_q=128,"
        "tile_kv=128,warps=8,stages=3",
        "prefill:backend=sm90,dtype=f16,head_dim=128,paged=1,batch=1,mask=none,tile_q=128,"
        "tile_kv=128,warps=8,stages=3,gqa_pack=4",
        "prefill:backend=sm90,dtype=bf16,head_dim=64,paged=1,batch=1,mask=causal,tile_q=128,"
        "tile_kv=128,warps=8,stages=3,gqa_pack=4",
        "prefill:backend=sm90,dtype=bf16,head_dim=256,mask=causal,flags=window,tile_q=128,"
        "tile_kv=64,warps=8,stages=2",
    };
    assert_int_equal(sizeof sm90 / sizeof sm90[0], sizeof sources / sizeof sources[0]);
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        cinfer_variant_t *v = NULL;
        assert_int_equal(cinfer_variant_create("logit_hooks", sources[i], NULL, 0, &v),
                         CINFER_STATUS_SUCCESS);
        assert_true(v->hooks & CINFER__VARIANT_LOGITS);
        if (!(v->hooks & CINFER__VARIANT_SM90) != !sm90[i])
            fail_msg("source %zu: the sm90 flag is %d, expected %d", i,
                     !!(v->hooks & CINFER__VARIANT_SM90), sm90[i]);
        for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
            cinfer__spec_t s = parse(families[f]);
            s.variant = v;
            s.variant_id = v->id;
            compile_spec(&s, "sm_90a");
        }
        for (size_t f = 0; sm90[i] && f < sizeof sm90_families / sizeof sm90_families[0]; f++) {
            cinfer__spec_t s = parse(sm90_families[f]);
            s.variant = v;
            s.variant_id = v->id;
            compile_spec(&s, "sm_90a");
        }
        cinfer_variant_destroy(v);
    }
}

/* The custom mask's words travel with the K/V tiles in slots sized by the KV tile (one to four
 * words and a shift, 16 or 32 bytes) and staged per tile in flight: every KV tile width, 16 and
 * 32 query rows per warp, and 3 stages (prefill.cu, MASK_ROWS). */
static void custom_mask_prefill_compiles_for_every_kv_tile(void **state) {
    (void)state;
    static const char *const specs[] = {
        "prefill:backend=sm80,dtype=f16,head_dim=64,mask=none,tile_q=128,tile_kv=128,warps=4,"
        "stages=2",
        "prefill:backend=sm80,dtype=bf16,head_dim=64,mask=causal,batch=1,tile_q=64,tile_kv=32,"
        "warps=4,stages=3",
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,batch=1,paged=1,tile_q=32,"
        "tile_kv=16,warps=2,stages=2",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        cinfer__spec_t s = parse(specs[i]);
        s.variant = cinfer_variant_builtin("custom_mask");
        s.variant_id = s.variant->id;
        compile_spec(&s, "sm_90a");
    }
}

/* The prefill kernel's fp8 K/V path (e4m3, e5m2) for sm_80 and sm_90a: single, ragged and paged;
 * head dims with a chunk column per thread (64, 256), the generic copies (96) and rows of an odd
 * chunk count (48); 16-row KV tiles (two-matrix ldmatrix); soft cap with a window; and through
 * variants: the built-ins, and one with query and output transforms (whose dims the fp8
 * epilogue reorders). */
static void fp8_prefill_compiles(void **state) {
    (void)state;
    static const char *const specs[] = {
        "prefill:backend=sm80,dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim=128,mask=causal,"
        "tile_q=128,tile_kv=64,warps=4,stages=2",
        "prefill:backend=sm80,dtype_q=f16,dtype_kv=e5m2,dtype_o=f16,head_dim=64,mask=none,batch=1,"
        "tile_q=128,tile_kv=32,warps=4,stages=3",
        "prefill:backend=sm80,dtype_q=bf16,dtype_kv=e5m2,dtype_o=bf16,head_dim=256,mask=causal,"
        "batch=1,paged=1,tile_q=32,tile_kv=16,warps=2,stages=3",
        "prefill:backend=sm80,dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim=96,mask=causal,"
        "flags=softcap+window,batch=1,paged=1,tile_q=128,tile_kv=64,warps=4,stages=2",
        "prefill:backend=sm80,dtype_q=f16,dtype_kv=e4m3,dtype_o=f16,head_dim=48,mask=none,"
        "tile_q=64,tile_kv=16,warps=4,stages=3",
    };
    compile_specs_and_variants(specs, sizeof specs / sizeof specs[0],
                               "prefill:backend=sm80,dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,"
                               "head_dim=128,batch=1,mask=causal,tile_q=64,tile_kv=64,warps=4,"
                               "stages=2",
                               0, "dim", (const char *const[]){specs[0], specs[2]}, 2);
}

/* The GQA-packed batch prefill kernels (gqa_pack = G: rows gathered per token and head): groups
 * dividing the tile and not (5, 3), head dims 64 / 128 / 256 and a generic-copy 80, fp16 and bf16,
 * fp8 K/V, RoPE, soft cap and window, the built-in variants, and a variant with query and output
 * transforms, for sm_80 and sm_90a. */
static void gqa_packed_prefill_compiles(void **state) {
    (void)state;
    static const char *const specs[] = {
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,batch=1,paged=1,tile_q=128,"
        "tile_kv=64,warps=4,stages=2,gqa_pack=4",
        "prefill:backend=sm80,dtype=f16,head_dim=64,mask=none,batch=1,tile_q=128,tile_kv=32,"
        "warps=4,stages=3,gqa_pack=8",
        "prefill:backend=sm80,dtype=bf16,head_dim=256,mask=causal,flags=softcap+window,batch=1,"
        "paged=1,tile_q=32,tile_kv=16,warps=2,stages=3,gqa_pack=5",
        "prefill:backend=sm80,dtype=f16,head_dim=80,mask=causal,batch=1,tile_q=64,tile_kv=32,"
        "warps=4,stages=2,gqa_pack=3",
        "prefill:backend=sm80,dtype_q=bf16,dtype_kv=e4m3,dtype_o=bf16,head_dim=128,mask=causal,"
        "batch=1,paged=1,tile_q=128,tile_kv=64,warps=4,stages=2,gqa_pack=2",
        "prefill:backend=sm80,dtype_q=f16,dtype_kv=e5m2,dtype_o=f16,head_dim=128,mask=none,"
        "batch=1,tile_q=64,tile_kv=64,warps=4,stages=2,gqa_pack=5",
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,pos=rope,batch=1,paged=1,"
        "tile_q=128,tile_kv=64,warps=4,stages=2,gqa_pack=4",
        "prefill:backend=sm80,dtype=bf16,head_dim=64,mask=causal,pos=rope,batch=1,tile_q=32,"
        "tile_kv=32,warps=2,stages=3,gqa_pack=32",
    };
    compile_specs_and_variants(specs, sizeof specs / sizeof specs[0],
                               "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,batch=1,"
                               "paged=1,tile_q=128,tile_kv=64,warps=4,stages=2,gqa_pack=4",
                               5, "qh", (const char *const[]){specs[0]}, 1);
}

/* The turn-taking prefill kernels (256 rows on eight warps, PINGPONG in kernels/prefill.cu: named
 * barriers and per-stage mbarriers) for sm_80 and sm_90a, single and batch: both masks, window,
 * the custom mask's row form (copies at the turn's start), GQA packing, the built-in variants and
 * a user variant with query and output transforms. The host takes them on sm_90 only (their
 * shared memory), but the spec is valid for every arch and must compile. */
static void turn_taking_prefill_compiles(void **state) {
    (void)state;
    static const char *const specs[] = {
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,tile_q=256,tile_kv=64,warps=8,"
        "stages=4",
        "prefill:backend=sm80,dtype=f16,head_dim=128,mask=none,flags=window,tile_q=256,"
        "tile_kv=64,warps=8,stages=4",
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,batch=1,paged=1,tile_q=256,"
        "tile_kv=64,warps=8,stages=4,gqa_pack=4",
        "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=none,batch=1,tile_q=256,tile_kv=64,"
        "warps=8,stages=3",
    };
    compile_specs_and_variants(specs, sizeof specs / sizeof specs[0],
                               "prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,"
                               "tile_q=256,tile_kv=64,warps=8,stages=4",
                               0, "dim", (const char *const[]){specs[0], specs[2]}, 2);
}

static void user_compile_error_points_at_the_line(void **state) {
    (void)state;
    cinfer_variant_t *v = NULL;
    assert_int_equal(cinfer_variant_create("oops",
                                           "#define VARIANT_LOGITS_TRANSFORM 1\n"
                                           "__device__ float variant_logits_transform(\n"
                                           "    const cinfer_variant_params *params, float l,\n"
                                           "    int b, int q, int k, int qh, int kh) {\n"
                                           "    return l + undefined_thing;\n"
                                           "}\n",
                                           NULL, 0, &v),
                     CINFER_STATUS_SUCCESS);
    cinfer__spec_t s = parse("decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=4");
    s.variant = v;
    s.variant_id = v->id;
    cinfer__rendered_t r;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", cinfer__jit_nvrtc_version(), &r),
                     CINFER_STATUS_SUCCESS);
    void *cubin = NULL;
    size_t size = 0;
    double seconds = 0;
    expect_error(cinfer__jit_compile(&r, &cubin, &size, &seconds), CINFER_STATUS_COMPILE_ERROR,
                 "variant:oops(5)");
    assert_null(cubin);
    cinfer__rendered_free(&r);
    /* A hook defined without its macro collides with the default. */
    cinfer_variant_t *w = NULL;
    assert_int_equal(cinfer_variant_create("unannounced",
                                           "__device__ bool variant_logits_mask(\n"
                                           "    const cinfer_variant_params *params, int b,\n"
                                           "    int q, int k, int qh, int kh) { return true; }\n",
                                           NULL, 0, &w),
                     CINFER_STATUS_SUCCESS);
    s.variant = w;
    s.variant_id = w->id;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", cinfer__jit_nvrtc_version(), &r),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__jit_compile(&r, &cubin, &size, &seconds), CINFER_STATUS_COMPILE_ERROR);
    cinfer__rendered_free(&r);
    /* So does a bit-word mask defined without its macro. */
    cinfer_variant_t *u = NULL;
    assert_int_equal(
        cinfer_variant_create("unannounced_bits",
                              "__device__ uint32_t variant_logits_mask_bits(\n"
                              "    const cinfer_variant_params *params, int b, int q, int k,\n"
                              "    int count, int qh, int kh) { return ~0u; }\n",
                              NULL, 0, &u),
        CINFER_STATUS_SUCCESS);
    s.variant = u;
    s.variant_id = u->id;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", cinfer__jit_nvrtc_version(), &r),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__jit_compile(&r, &cubin, &size, &seconds), CINFER_STATUS_COMPILE_ERROR);
    cinfer__rendered_free(&r);
    cinfer_variant_destroy(u);
    /* VARIANT_USE_SOFTMAX set in a way the host cannot read is refused at compile time. */
    cinfer_variant_t *x = NULL;
    assert_int_equal(cinfer_variant_create(
                         "sneaky", "#define NO 0\n#define VARIANT_USE_SOFTMAX NO\n", NULL, 0, &x),
                     CINFER_STATUS_SUCCESS);
    s.variant = x;
    s.variant_id = x->id;
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", cinfer__jit_nvrtc_version(), &r),
                     CINFER_STATUS_SUCCESS);
    expect_error(cinfer__jit_compile(&r, &cubin, &size, &seconds), CINFER_STATUS_COMPILE_ERROR,
                 "VARIANT_USE_SOFTMAX");
    cinfer__rendered_free(&r);
    cinfer_variant_destroy(v);
    cinfer_variant_destroy(w);
    cinfer_variant_destroy(x);
}

/* The kernels' logit scales: base 2 for default attention, the soft cap's form, and natural-log
 * units for a variant whose hooks see logits. */
static void logit_scales(void **state) {
    (void)state;
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.head_dim = 64;
    o.k_scale = 2.0f;
    double sm, q;
    float cap = -1.0f;
    cinfer__attention_logit_scales(&o, &sm, &q, &cap);
    assert_true(sm == 0.125 && fabs(q - 0.25 * 1.4426950408889634) < 1e-15 && cap == 0.0f);
    o.logits_soft_cap = 30.0f;
    cinfer__attention_logit_scales(&o, &sm, &q, &cap);
    assert_true(fabs(q - 0.25 / 30.0) < 1e-15);
    assert_true(cap == (float)(30.0 * 1.4426950408889634));
    o.logits_soft_cap = 0.0f;
    o.sm_scale = 0.5f;
    o.variant = cinfer_variant_builtin("alibi"); /* logit hooks: natural-log units */
    cinfer__attention_logit_scales(&o, &sm, &q, &cap);
    assert_true(sm == 0.5 && q == 1.0 && cap == 0.0f);
    o.variant = cinfer_variant_builtin("sinks"); /* no logit hooks: base 2 */
    cinfer__attention_logit_scales(&o, &sm, &q, &cap);
    assert_true(fabs(q - 1.4426950408889634) < 1e-15);
}

/* Prefill holds an ALiBi bias in q . k units (slope / q_scale) in float32: a q_scale below 2^-64
 * is refused by name for variants with the slope hook, and only for them; with fp8 K/V q_scale is
 * the kernel's: k_scale (the sm80 template's is 256 times that for e4m3; the check takes the
 * smaller, the sm90 kernel's). */
static void alibi_needs_a_bounded_scale(void **state) {
    (void)state;
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = 8;
    o.num_kv_heads = 8;
    o.head_dim = 128;
    o.variant = cinfer_variant_builtin("alibi");
    cinfer__spec_t spec;
    o.sm_scale = 1e-19f; /* q_scale 1e-19 >= 2^-64 = 5.4e-20 */
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec), CINFER_STATUS_SUCCESS);
    o.sm_scale = 1e-20f;
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec),
                     CINFER_STATUS_UNSUPPORTED);
    const char *msg = cinfer_last_error();
    assert_non_null(strstr(msg, "options->sm_scale = 1e-20"));
    assert_non_null(strstr(msg, "variant alibi"));
    assert_non_null(strstr(msg, "at least 2^-64"));
    o.sm_scale = 1.0f;
    o.k_scale = 1e-21f; /* q_scale = sm_scale k_scale */
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 0, 227 * 1024, &spec),
                     CINFER_STATUS_UNSUPPORTED);
    /* fp8 K/V: the kernel scales q by sm_scale as it converts it, so q_scale is k_scale and
     * sm_scale does not enter. */
    o.kv_dtype = (DLDataType){10, 8, 1}; /* float8_e4m3fn */
    o.sm_scale = 1e-20f;
    o.k_scale = 1e-19f; /* q_scale 1e-19 */
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec), CINFER_STATUS_SUCCESS);
    o.k_scale = 1e-20f; /* q_scale 1e-20 < 2^-64 (the template's would be 2.56e-18) */
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec),
                     CINFER_STATUS_UNSUPPORTED);
    o.kv_dtype = (DLDataType){12, 8, 1}; /* float8_e5m2 */
    o.k_scale = 1e-19f;                  /* q_scale 1e-19 */
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec), CINFER_STATUS_SUCCESS);
    o.k_scale = 1e-20f;
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec),
                     CINFER_STATUS_UNSUPPORTED);
    o.kv_dtype = o.q_dtype;
    o.k_scale = 1.0f;
    o.sm_scale = 1e-20f;
    o.variant = cinfer_variant_builtin("sinks");
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec), CINFER_STATUS_SUCCESS);
    o.variant = NULL;
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 227 * 1024, &spec), CINFER_STATUS_SUCCESS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(declarations_are_checked),
        cmocka_unit_test(builtins_exist),
        cmocka_unit_test(struct_and_prelude),
        cmocka_unit_test(packing_checks_every_argument),
        cmocka_unit_test(builtin_arguments_are_sized),
        cmocka_unit_test(key_follows_the_source),
        cmocka_unit_test(builtins_compile_with_every_family),
        cmocka_unit_test(logit_hooks_compile_with_every_family),
        cmocka_unit_test(nvrtc_warnings_are_kept),
        cmocka_unit_test(custom_mask_prefill_compiles_for_every_kv_tile),
        cmocka_unit_test(fp8_prefill_compiles),
        cmocka_unit_test(gqa_packed_prefill_compiles),
        cmocka_unit_test(turn_taking_prefill_compiles),
        cmocka_unit_test(user_compile_error_points_at_the_line),
        cmocka_unit_test(logit_scales),
        cmocka_unit_test(alibi_needs_a_bounded_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
