/*
 * `cinfer compile`: spec text -> cubin in the kernel cache, for one or more archs, and with
 * --load the load of each kernel into a fresh context, timed. Every spec and arch is checked
 * before the first compile, so a typo in the last argument does not cost the compiles before it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cuda/context.h"
#include "jit/jit.h"

/* More archs than any toolkit targets. */
#define MAX_ARCHS 32
/* The arch compiled for without --arch and without a device: the one most serving runs on. */
#define FALLBACK_ARCH "sm_90a"
/* A disk-cache hit into a fresh context (read, cuModuleLoadData, cuModuleGetFunction) is
 * expected within this budget; a slower load is flagged so a regression is visible. */
#define LOAD_BUDGET_MS 5.0

typedef struct compile_args {
    const char *arch_list; /* NULL: the default arch */
    bool load, list_ops, help;
    char **texts; /* the SPEC arguments */
    int num_specs;
} compile_args_t;

/* One parsed spec and its kernel name (the same for every arch). */
typedef struct parsed_spec {
    cinfer__spec_t spec;
    char name[192];
} parsed_spec_t;

static int parse_args(int argc, char **argv, compile_args_t *a) {
    memset(a, 0, sizeof *a);
    a->texts = argv + 1;
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (options_done || arg[0] != '-' || arg[1] == '\0') {
            a->texts[a->num_specs++] = argv[i];
        } else if (strcmp(arg, "--") == 0) {
            options_done = true;
        } else if (cli_is_help(arg)) {
            a->help = true;
            return CLI_EXIT_OK;
        } else if (strcmp(arg, "--arch") == 0 || strncmp(arg, "--arch=", 7) == 0) {
            const char *value = arg[6] == '=' ? arg + 7 : i + 1 < argc ? argv[++i] : NULL;
            if (!value)
                return cli_usage_error("compile", "--arch needs a value, e.g. --arch sm_90a");
            if (a->arch_list)
                return cli_usage_error("compile",
                                       CLI_GIVEN_TWICE " (a comma list holds several archs)",
                                       "--arch", a->arch_list, value);
            a->arch_list = value;
        } else if (strcmp(arg, "--load") == 0) {
            a->load = true;
        } else if (strcmp(arg, "--list-ops") == 0) {
            a->list_ops = true;
        } else {
            return cli_usage_error("compile", "unknown option \"%s\"", arg);
        }
    }
    if (a->list_ops) {
        if (a->num_specs || a->arch_list || a->load)
            return cli_usage_error("compile", "--list-ops takes no other arguments");
        return CLI_EXIT_OK;
    }
    if (a->num_specs == 0)
        return cli_usage_error("compile", "no SPEC given");
    return CLI_EXIT_OK;
}

/* The arch of the device kernels would run on (the context's, else device 0's), else
 * FALLBACK_ARCH. */
static void default_arch(const cinfer_context_t *ctx, char *dst, size_t cap) {
    if (ctx) {
        cinfer__fmt(dst, cap, "%s", ctx->arch);
        return;
    }
    const cinfer__cuda_t *cu;
    cli_device_t d;
    if (cinfer__cuda_get(&cu) == CINFER_STATUS_SUCCESS &&
        cli_device_query(cu, 0, &d) == CINFER_STATUS_SUCCESS && d.cc_major >= 8)
        cinfer__fmt(dst, cap, "%s", d.arch);
    else
        cinfer__fmt(dst, cap, "%s", FALLBACK_ARCH);
}

/* Parses and validates every spec (a field left out told from one given out of range), then
 * renders it once for the first arch, which yields its kernel name. */
static cinfer_status_t parse_specs(const compile_args_t *a, const char *arch, parsed_spec_t *out) {
    for (int i = 0; i < a->num_specs; i++) {
        CINFER__CHECK(cinfer__spec_parse_valid(a->texts[i], &out[i].spec));
        cinfer__rendered_t r;
        cinfer_status_t st = cinfer__spec_render(&out[i].spec, arch, 0, &r);
        if (st != CINFER_STATUS_SUCCESS) {
            /* The arch's checks speak of the kernel family: say which of the specs it was. */
            char why[1024];
            cinfer__fmt(why, sizeof why, "%s", cinfer_last_error());
            return cinfer__error(st, "spec \"%s\": %s", a->texts[i], why);
        }
        cinfer__fmt(out[i].name, sizeof out[i].name, "%s", r.name);
        cinfer__rendered_free(&r);
    }
    return CINFER_STATUS_SUCCESS;
}

static cinfer_jit_stats_t stats_now(void) {
    cinfer_jit_stats_t s = CINFER_JIT_STATS_INIT;
    cinfer_jit_get_stats(&s);
    return s;
}

/* Gets one cubin and prints its line. */
static cinfer_status_t compile_one(const parsed_spec_t *p, const char *arch, int name_width,
                                   int arch_width) {
    cinfer_jit_stats_t before = stats_now();
    double start = cinfer__now();
    void *cubin = NULL;
    size_t size = 0;
    cinfer__jit_source_t from = CINFER__JIT_FROM_DISK;
    CINFER__CHECK(cinfer__jit_cubin(&p->spec, arch, &cubin, &size, &from, NULL));
    double seconds = cinfer__now() - start;
    free(cubin);
    cinfer_jit_stats_t after = stats_now();
    char how[64];
    if (from == CINFER__JIT_FROM_COMPILE)
        cinfer__fmt(how, sizeof how, "compiled in %.2f s",
                    after.compile_seconds - before.compile_seconds);
    else
        cinfer__fmt(how, sizeof how, "%s (%.1f ms)",
                    from == CINFER__JIT_FROM_AOT ? "AOT bundle" : "cache hit", seconds * 1e3);
    printf("%-*s  %-*s  %-22s  %zu bytes\n", name_width, p->name, arch_width, arch, how, size);
    fflush(stdout);
    return CINFER_STATUS_SUCCESS;
}

/* Loads one kernel into ctx and prints its line with the load time. */
static cinfer_status_t load_one(cinfer_context_t *ctx, const parsed_spec_t *p, int name_width,
                                int arch_width) {
    cinfer_jit_stats_t before = stats_now();
    double start = cinfer__now();
    cinfer__kernel_t kernel;
    CINFER__CHECK(cinfer__jit_kernel(ctx, &p->spec, &kernel));
    double ms = (cinfer__now() - start) * 1e3;
    cinfer_jit_stats_t after = stats_now();
    const char *from = after.misses > before.misses             ? "compiled"
                       : after.disk_hits > before.disk_hits     ? "disk cache"
                       : after.aot_hits > before.aot_hits       ? "AOT bundle"
                       : after.memory_hits > before.memory_hits ? "already loaded"
                                                                : "?";
    bool slow = after.disk_hits > before.disk_hits && ms > LOAD_BUDGET_MS;
    printf("%-*s  %-*s  loaded in %.2f ms (%s), %d registers, up to %d threads", name_width,
           p->name, arch_width, ctx->arch, ms, from, kernel.num_regs, kernel.max_threads);
    if (slow)
        printf("  [over the %.0f ms load budget]", LOAD_BUDGET_MS);
    printf("\n");
    fflush(stdout);
    return CINFER_STATUS_SUCCESS;
}

static int list_ops(void) {
    /* Each operation with the fields its specs take (the canonical text form, values dropped). */
    for (int op = 0; op < CINFER__OP_COUNT; op++) {
        cinfer__spec_t spec;
        cinfer__spec_init(&spec, (cinfer__op_t)op);
        char text[512], fields[512] = "";
        cinfer__spec_format(&spec, text, sizeof text);
        const char *p = strchr(text, ':');
        while (p) {
            const size_t n = strcspn(p + 1, "=");
            const size_t len = strlen(fields);
            cinfer__fmt(fields + len, sizeof fields - len, "%s%.*s", len ? ", " : "", (int)n,
                        p + 1);
            p = strchr(p + 1, ',');
        }
        printf("%-26s %s\n", cinfer__op_name((cinfer__op_t)op), fields[0] ? fields : "(no fields)");
    }
    printf(
        "\nvalues: dtype_q/kv/o f16, bf16, f32, e4m3, e5m2, i32, u8 (or float16, bfloat16, ...;\n"
        "  dtype= sets all three); head_dim_qk/vo numbers (head_dim= sets both); backend simt,\n"
        "  sm80, sm90 (prefill: sm80, or sm90 for sm_90a); mask none, causal (a custom mask is\n"
        "  data given at run time: variant=custom_mask); pos none, rope, alibi (alibi is a\n"
        "  variant); flags none, softcap (decode, decode_tc) or softcap+window (prefill);\n"
        "  variant none or a built-in (sigmoid, sinks, alibi, dump_logits, custom_mask);\n"
        "  paged, batch 0 or 1; tile_q, tile_kv, warps, stages, vec numbers; gqa_pack 0 or the\n"
        "  query heads per KV head a batch prefill CTA packs into its rows (mla: query heads per\n"
        "  token, a power of two up to 16, or 64 with tile_q 64). A field left out is\n"
        "  0, or the first name of its list (none, simt): give every field the family's limits\n"
        "  need (an error names the one that is missing or out of range); a field the family\n"
        "  does not list is an error.\n"
        "\nexamples (Llama-3-8B's heads, bf16):\n"
        "  decode:dtype=bf16,head_dim=128,paged=1,tile_q=4,tile_kv=4,warps=4\n"
        "  decode_tc:dtype=bf16,head_dim=128,paged=1,tile_q=4,warps=3,stages=2\n"
        "  prefill:backend=sm90,dtype=bf16,head_dim=128,mask=causal,tile_q=128,tile_kv=128,\n"
        "    warps=8,stages=3 (one argument, without the line break)\n"
        "  prefill:backend=sm80,dtype=bf16,head_dim=128,batch=1,paged=1,mask=causal,tile_q=64,\n"
        "    tile_kv=64,warps=4,stages=2\n");
    return CLI_EXIT_OK;
}

int cli_compile(int argc, char **argv) {
    compile_args_t a;
    int status = parse_args(argc, argv, &a);
    if (status != CLI_EXIT_OK)
        return status;
    if (a.help)
        return cli_print_help("compile");
    if (a.list_ops)
        return list_ops();

    char archs[MAX_ARCHS][CLI_ARCH_CHARS];
    int num_archs = 0;
    if (a.arch_list &&
        cli_parse_archs(a.arch_list, archs, MAX_ARCHS, &num_archs) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    parsed_spec_t *specs = calloc((size_t)a.num_specs, sizeof *specs);
    if (!specs) {
        cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "compile: out of memory");
        return cli_fail();
    }
    cinfer_context_t *ctx = NULL;
    if (parse_specs(&a, num_archs ? archs[0] : FALLBACK_ARCH, specs) != CINFER_STATUS_SUCCESS)
        goto out_destroy_context;
    /* The context comes first so a machine without a device fails before any compile. */
    if (a.load && cinfer_context_create(NULL, &ctx) != CINFER_STATUS_SUCCESS)
        goto out_destroy_context;
    if (!num_archs) {
        default_arch(ctx, archs[0], sizeof archs[0]);
        num_archs = 1;
    }

    int name_width = 0, arch_width = ctx ? (int)strlen(ctx->arch) : 0;
    for (int i = 0; i < a.num_specs; i++) {
        int n = (int)strlen(specs[i].name);
        name_width = n > name_width ? n : name_width;
    }
    for (int j = 0; j < num_archs; j++) {
        int n = (int)strlen(archs[j]);
        arch_width = n > arch_width ? n : arch_width;
    }
    /* NVRTC's version is part of every cache key; loading it here keeps its dlopen out of the
     * first lookup's time. */
    cinfer__jit_nvrtc_version();
    const uint64_t write_failures = cinfer__cache_write_failures();
    for (int i = 0; i < a.num_specs; i++)
        for (int j = 0; j < num_archs; j++)
            if (compile_one(&specs[i], archs[j], name_width, arch_width) != CINFER_STATUS_SUCCESS)
                goto out_destroy_context;
    /* Filling the cache is what compile is for: a cubin it could not store is a failure (the
     * library itself only warns and goes on in memory). */
    if (cinfer__cache_write_failures() != write_failures) {
        cinfer__error(CINFER_STATUS_IO_ERROR,
                      "the kernel cache could not store the cubins (the warning above says why); "
                      "set CINFER_CACHE_DIR to a writable folder");
        goto out_destroy_context;
    }
    for (int i = 0; ctx && i < a.num_specs; i++)
        if (load_one(ctx, &specs[i], name_width, arch_width) != CINFER_STATUS_SUCCESS)
            goto out_destroy_context;
    cinfer_context_destroy(ctx);
    free(specs);
    return CLI_EXIT_OK;

out_destroy_context:
    status = cli_fail();
    cinfer_context_destroy(ctx);
    free(specs);
    return status;
}
