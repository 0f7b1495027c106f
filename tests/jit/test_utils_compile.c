/*
 * The KV-cache and position utility kernels (kernels/append.cu, rope.cu, packbits.cu) compile with
 * NVRTC for sm_80 and sm_90a, without a GPU: every family, every dtype combination the ops can
 * ask for, both vector widths. Also their specs' text form and limits, and the parameter blocks'
 * size against the 4 KiB every driver accepts.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "append_params.h"
#include "jit/jit.h"
#include "packbits_params.h"
#include "rope_params.h"

static cinfer__spec_t parse(const char *text) {
    cinfer__spec_t s;
    if (cinfer__spec_parse(text, &s) != CINFER_STATUS_SUCCESS)
        fail_msg("parse \"%s\": %s", text, cinfer_last_error());
    return s;
}

/* Renders and NVRTC-compiles one spec for one arch; the cubin must be an ELF file that names the
 * rendered entry point. */
static void compile_one(const char *text, const char *arch) {
    cinfer__spec_t s = parse(text);
    cinfer__rendered_t r;
    if (cinfer__spec_render(&s, arch, cinfer__jit_nvrtc_version(), &r) != CINFER_STATUS_SUCCESS)
        fail_msg("render %s for %s: %s", text, arch, cinfer_last_error());
    void *cubin = NULL;
    size_t size = 0;
    double seconds = 0;
    if (cinfer__jit_compile(&r, &cubin, &size, &seconds) != CINFER_STATUS_SUCCESS)
        fail_msg("compile %s for %s: %s", text, arch, cinfer_last_error());
    assert_true(size > 100);
    assert_memory_equal(cubin, "\177ELF", 4);
    const size_t name_len = strlen(r.name);
    bool found = false;
    for (size_t i = 0; i + name_len <= size && !found; i++)
        found = memcmp((const char *)cubin + i, r.name, name_len) == 0;
    if (!found)
        fail_msg("%s for %s: the cubin has no symbol %s", text, arch, r.name);
    free(cubin);
    cinfer__rendered_free(&r);
}

static void compile_all(const char *const *specs, size_t count) {
    const char *archs[] = {"sm_80", "sm_90a"};
    for (size_t i = 0; i < count; i++)
        for (int a = 0; a < 2; a++)
            compile_one(specs[i], archs[a]);
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void append_kernels_compile(void **state) {
    (void)state;
    /* Same dtype (a copy), fp16 <-> bf16 conversion, both fp8 formats; the 16-byte and the
     * element path; head dims of the fast paths, one that only the element path takes, and 1. */
    static const char *const specs[] = {
        "append_paged_kv_cache:dtype_o=bf16,dtype_kv=bf16,head_dim_vo=128,vec=8",
        "append_paged_kv_cache:dtype_o=f16,dtype_kv=f16,head_dim_vo=64,vec=8",
        "append_paged_kv_cache:dtype_o=f16,dtype_kv=bf16,head_dim_vo=256,vec=8",
        "append_paged_kv_cache:dtype_o=bf16,dtype_kv=e4m3,head_dim_vo=128,vec=8",
        "append_paged_kv_cache:dtype_o=f16,dtype_kv=e5m2,head_dim_vo=128,vec=8",
        "append_paged_kv_cache:dtype_o=bf16,dtype_kv=e4m3,head_dim_vo=100,vec=1",
        "append_paged_kv_cache:dtype_o=f16,dtype_kv=f16,head_dim_vo=1,vec=1",
        "append_paged_kv_cache:dtype_o=bf16,dtype_kv=f16,head_dim_vo=576,vec=1",
        "batch_indices_positions",
        "seq_lens",
    };
    compile_all(specs, COUNT(specs));
}

static void rope_kernels_compile(void **state) {
    (void)state;
    static const char *const specs[] = {
        "rope:dtype_o=bf16,head_dim_vo=128,vec=8",
        "rope:dtype_o=f16,head_dim_vo=64,vec=1",
        "rope_pos_ids:dtype_o=f16,head_dim_vo=128,vec=8",
        "rope_pos_ids:dtype_o=bf16,head_dim_vo=80,vec=1",
        "rope_pos_ids:dtype_o=bf16,head_dim_vo=512,vec=8",
        "rope_cos_sin_cache:dtype_o=bf16,head_dim_vo=128,vec=8",
        "rope_cos_sin_cache:dtype_o=f16,head_dim_vo=6,vec=1",
    };
    compile_all(specs, COUNT(specs));
}

static void packbits_kernels_compile(void **state) {
    (void)state;
    static const char *const specs[] = {
        "packbits:vec=8",
        "packbits:vec=1",
        "segment_packbits_indptr",
        "segment_packbits",
    };
    compile_all(specs, COUNT(specs));
}

/* Names, text form and the limits the validator enforces. */
static void specs_render_and_validate(void **state) {
    (void)state;
    cinfer__rendered_t r;
    cinfer__spec_t s =
        parse("append_paged_kv_cache:dtype_o=bf16,dtype_kv=e4m3,head_dim_vo=128,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_SUCCESS);
    assert_string_equal(r.name, "append_paged_kv_cache_kve4m3_bf16_hd128_vec8");
    assert_non_null(strstr(r.source.data, "#define CINFER_OP_APPEND_PAGED_KV_CACHE 1\n"));
    assert_non_null(strstr(r.source.data, "#include \"append.cu\""));
    cinfer__rendered_free(&r);
    char text[256];
    cinfer__spec_format(&s, text, sizeof text);
    assert_string_equal(text,
                        "append_paged_kv_cache:dtype_kv=e4m3,dtype_o=bf16,head_dim_vo=128,vec=8");

    s = parse("rope_cos_sin_cache:dtype_o=f16,head_dim_vo=64,vec=1");
    assert_int_equal(cinfer__spec_render(&s, "sm_80", 13000, &r), CINFER_STATUS_SUCCESS);
    assert_string_equal(r.name, "rope_cos_sin_cache_f16_hd64_vec1");
    cinfer__rendered_free(&r);
    s = parse("segment_packbits");
    assert_int_equal(cinfer__spec_render(&s, "sm_80", 13000, &r), CINFER_STATUS_SUCCESS);
    assert_string_equal(r.name, "segment_packbits");
    cinfer__rendered_free(&r);

    /* A cache dtype the append cannot write, a source dtype it cannot read, a vector width the
     * head dim cannot take. */
    s = parse("append_paged_kv_cache:dtype_o=bf16,dtype_kv=f32,head_dim_vo=128,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "dtype_kv f32"));
    s = parse("append_paged_kv_cache:dtype_o=e4m3,dtype_kv=e4m3,head_dim_vo=128,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
    s = parse("rope:dtype_o=bf16,head_dim_vo=100,vec=8");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_INVALID_ARGUMENT);
    s = parse("packbits:vec=4");
    assert_int_equal(cinfer__spec_render(&s, "sm_90a", 13000, &r), CINFER_STATUS_UNSUPPORTED);
}

/* Kernel parameters travel by value in the launch; 4 KiB is the limit on every driver. */
static void parameter_blocks_fit(void **state) {
    (void)state;
    assert_true(sizeof(cinfer_rope_params) <= 4096);
    assert_true(sizeof(cinfer_append_params) <= 4096);
    assert_true(sizeof(cinfer_packbits_params) <= 4096);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(specs_render_and_validate), cmocka_unit_test(parameter_blocks_fit),
        cmocka_unit_test(append_kernels_compile),    cmocka_unit_test(rope_kernels_compile),
        cmocka_unit_test(packbits_kernels_compile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
