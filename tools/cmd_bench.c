/*
 * `cinfer bench serve`: replays a request trace through a continuous-batching loop over a paged
 * KV cache, running every step's attention with the library like a serving engine would, and
 * reports each operation's time against the device's ceilings. `cinfer demo` is a short replay
 * of it with --check.
 *
 * The host side (trace, presets, scheduler) is tools/serve/; this file turns each scheduled step
 * into launches. One step, on one stream:
 *   upload the step's page table; plan prefill and decode once (shared by all layers);
 *   get_seq_lens + get_batch_indices_positions (once);
 *   for every layer: append the new tokens' K/V into that layer's cache, batch prefill (paged,
 *   causal) over the prompt chunks, batch decode over the running requests.
 * Every layer has its own K and V cache (as in an engine, where the layers share one page table
 * but not the memory), so a step reads layers x the KV bytes of one layer, and the KV budget is
 * split over the layers. q, k and v of the new tokens come from seeded random pools (attention
 * cost does not depend on values); layer l reads them from row l on, so the layers' caches differ.
 *
 * Timing: CUDA events around every operation of every layer, summed per operation; the figures
 * are GPU time, host gaps between launches included (the host enqueues a whole step before it
 * waits). steps/s is wall time of the whole loop (scheduling, planning and uploads included,
 * --check excluded).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cuda/context.h"
#include "jit/jit.h"
#include "ops/append.h"
#include "ops/decode.h"
#include "ops/prefill.h"
#include "ref/ref.h"
#include "serve.h"

#define TRACE_FILE "azure_llm_trace_2023_conv.csv"
#define PAGE_SIZE  16
/* The arch kernels are compiled for without a device (the machine most serving runs on). */
#define FALLBACK_ARCH "sm_90a"
/* What the no-device path tells the prefill planner about the device: an H100/H200's opt-in
 * shared memory per block (227 KiB) and SM count. */
#define FALLBACK_SMEM 232448
#define FALLBACK_SMS  132
/* bf16 outputs carry 8 significant bits: a relative L2 error of 1e-2 is the GPU suite's bound. */
#define CHECK_REL_TOL 1e-2
/* Query rows checked at each end of a prefill chunk (the float64 reference is slow). */
#define CHECK_ROWS 8
/* Copy-ceiling buffer: large against the 60 MB L2, small against the KV pool. */
#define COPY_BYTES (1ull << 30)

/* ---------------------------------------------------------------------------------------------
 * Arguments
 * ------------------------------------------------------------------------------------------- */

typedef struct serve_args {
    const serve_model_t *model;
    const char *trace_path; /* NULL: the default trace */
    double kv_budget_gb;
    int prefill_chunk, max_batch, layers, check_every;
    int64_t steps, requests;
    bool check, help, quiet;
    const char *json_path;
    const char *arch; /* no device: compile for this arch */
    uint64_t seed;
} serve_args_t;

static const char *const serve_synopsis =
    "usage: cinfer bench serve [options]\n"
    "\n"
    "Replays a request trace through continuous batching over a paged KV cache (page 16, bf16):\n"
    "each step decodes one token of every running request, prefills prompt chunks within a token\n"
    "budget, and appends the new tokens' K/V, over --layers layers. Reports time per operation,\n"
    "TB/s (decode: KV bytes read; append: bytes moved) and TFLOP/s (prefill: causal FLOPs kept)\n"
    "against the copy bandwidth and bf16 GEMM ceilings measured at start, and steps/s.\n"
    "Without a GPU: says so, replays the schedule on the host, compiles the kernels for --arch.\n"
    "\n"
    "  --model NAME          llama3-8b (default), llama3-70b-tp8, qwen2.5-7b, mistral-7b,\n"
    "                        gemma2-9b\n"
    "  --trace FILE          CSV with TIMESTAMP, ContextTokens, GeneratedTokens (default: the\n"
    "                        Azure LLM inference trace 2023, conversation, CC BY 4.0)\n"
    "  --requests N          requests taken from the trace, 0 = all (default 1024)\n"
    "  --steps N             stop after N steps, 0 = when every request finished (default 0)\n"
    "  --kv-budget-gb G      KV cache of all layers, in GB = 1e9 bytes (default 8)\n"
    "  --prefill-chunk N     prefill tokens per step, all requests together (default 2048)\n"
    "  --max-batch N         requests running at once (default 256)\n"
    "  --layers N            attention layers per step, each with its own cache (default 4)\n"
    "  --check               verify sampled steps against the float64 CPU reference; exit 1 on\n"
    "                        a mismatch\n"
    "  --check-every N       the steps checked: every Nth (default 16)\n"
    "  --json FILE           write every figure and each step's shapes and times\n"
    "  --seed N              page-allocation and data seed (default 1)\n"
    "  --arch ARCH           no device: compile for ARCH, sm_80 or later (default sm_90a;\n"
    "                        checked before the replay starts)\n"
    "  --quiet               no progress line\n";

/* A usage error of `bench serve`: the message, then the options (its synopsis); exit status 2. */
static int serve_usage_error(const char *fmt, ...) CINFER__PRINTF(1, 2);
static int serve_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int status = cli_vusage_error(serve_synopsis, fmt, ap);
    va_end(ap);
    return status;
}

/* A decimal integer option in [lo, hi]. */
static bool int_option(const char *name, const char *text, long long lo, long long hi,
                       long long *out, int *rc) {
    char *end;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno || v < lo || v > hi) {
        *rc = serve_usage_error("%s = \"%s\", expected an integer in [%lld, %lld]", name, text, lo,
                                hi);
        return false;
    }
    *out = v;
    return true;
}

static int parse_serve_args(int argc, char **argv, serve_args_t *a) {
    memset(a, 0, sizeof *a);
    a->model = serve_model_find("llama3-8b");
    a->kv_budget_gb = 8.0;
    a->prefill_chunk = 2048;
    a->max_batch = 256;
    a->layers = 4;
    a->check_every = 16;
    a->requests = 1024;
    a->arch = FALLBACK_ARCH;
    a->seed = 1;
    static const char *const known[] = {
        "--model",     "--trace",  "--requests",    "--steps", "--kv-budget-gb", "--prefill-chunk",
        "--max-batch", "--layers", "--check-every", "--json",  "--seed",         "--arch"};
    enum { NUM_KNOWN = sizeof known / sizeof known[0] };
    /* The value each option was given, so one given twice is named with both. */
    const char *given[NUM_KNOWN] = {NULL};
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (cli_is_help(arg)) {
            a->help = true;
            return CLI_EXIT_OK;
        }
        if (strcmp(arg, "--check") == 0) {
            a->check = true;
            continue;
        }
        if (strcmp(arg, "--quiet") == 0) {
            a->quiet = true;
            continue;
        }
        /* Every other option takes a value: "--name value" or "--name=value". */
        char name[64];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0 || (eq && (size_t)(eq - arg) >= sizeof name))
            return serve_usage_error("unexpected argument \"%s\"", arg);
        if (eq) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        int k = 0;
        while (k < NUM_KNOWN && strcmp(name, known[k]) != 0)
            k++;
        if (k == NUM_KNOWN)
            return serve_usage_error("unknown option \"%s\"", name);
        if (!value) {
            if (i + 1 >= argc)
                return serve_usage_error("%s needs a value", name);
            value = argv[++i];
        }
        if (given[k])
            return serve_usage_error(CLI_GIVEN_TWICE, name, given[k], value);
        given[k] = value;
        long long v = 0;
        int rc = CLI_EXIT_OK;
        if (strcmp(name, "--model") == 0) {
            a->model = serve_model_find(value);
            if (!a->model)
                return serve_usage_error("--model = \"%s\", expected one of llama3-8b, "
                                         "llama3-70b-tp8, qwen2.5-7b, mistral-7b, gemma2-9b",
                                         value);
        } else if (strcmp(name, "--trace") == 0) {
            a->trace_path = value;
        } else if (strcmp(name, "--json") == 0) {
            a->json_path = value;
        } else if (strcmp(name, "--arch") == 0) {
            a->arch = value;
        } else if (strcmp(name, "--kv-budget-gb") == 0) {
            char *end;
            errno = 0;
            const double gb = strtod(value, &end);
            if (end == value || *end || errno || !(gb > 0 && gb <= 1e5))
                return serve_usage_error(
                    "--kv-budget-gb = \"%s\", expected a number of GB in (0, 100000]", value);
            a->kv_budget_gb = gb;
        } else if (strcmp(name, "--requests") == 0) {
            if (!int_option(name, value, 0, INT32_MAX, &v, &rc))
                return rc;
            a->requests = v;
        } else if (strcmp(name, "--steps") == 0) {
            if (!int_option(name, value, 0, INT64_MAX / 2, &v, &rc))
                return rc;
            a->steps = v;
        } else if (strcmp(name, "--prefill-chunk") == 0) {
            if (!int_option(name, value, 1, 1 << 20, &v, &rc))
                return rc;
            a->prefill_chunk = (int)v;
        } else if (strcmp(name, "--max-batch") == 0) {
            if (!int_option(name, value, 1, 1 << 16, &v, &rc))
                return rc;
            a->max_batch = (int)v;
        } else if (strcmp(name, "--layers") == 0) {
            if (!int_option(name, value, 1, 1024, &v, &rc))
                return rc;
            a->layers = (int)v;
        } else if (strcmp(name, "--check-every") == 0) {
            if (!int_option(name, value, 1, INT32_MAX, &v, &rc))
                return rc;
            a->check_every = (int)v;
        } else if (strcmp(name, "--seed") == 0) {
            if (!int_option(name, value, 0, INT64_MAX, &v, &rc))
                return rc;
            a->seed = (uint64_t)v;
        }
    }
    return CLI_EXIT_OK;
}

/* The default trace: installed next to the tool (../share/cinfer), else in the source tree. */
static bool default_trace(char *path, size_t cap, char *tried, size_t tried_cap) {
    char candidates[3][4096];
    int n = 0;
    char exe[4096];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            cinfer__fmt(candidates[n++], sizeof candidates[0], "%s/../%s/cinfer/%s", exe,
                        CINFER_INSTALL_DATADIR, TRACE_FILE);
        }
    }
    snprintf(candidates[n++], sizeof candidates[0], "%s/bench/data/%s", CINFER_SOURCE_DIR,
             TRACE_FILE);
    snprintf(candidates[n++], sizeof candidates[0], "bench/data/%s", TRACE_FILE);
    tried[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (access(candidates[i], R_OK) == 0) {
            snprintf(path, cap, "%s", candidates[i]);
            return true;
        }
        const size_t used = strlen(tried);
        snprintf(tried + used, tried_cap - used, "%s%s", i ? ", " : "", candidates[i]);
    }
    return false;
}

/* ---------------------------------------------------------------------------------------------
 * What a step costs (counted, not measured)
 * ------------------------------------------------------------------------------------------- */

/* Keys one query row at absolute position p keeps under causal masking and window_left. */
static int64_t kept_keys(int64_t p, int window_left) {
    const int64_t keys = p + 1;
    return window_left >= 0 && keys > window_left + 1 ? window_left + 1 : keys;
}

/* (row, key) pairs a prefill chunk of qo rows over kv keys keeps (rows at kv - qo .. kv - 1). */
static double prefill_pairs(int64_t qo, int64_t kv, int window_left) {
    if (window_left < 0) /* a closed form: sum of (kv - qo + i + 1) for i < qo */
        return (double)qo * (double)(kv - qo) + (double)qo * (double)(qo + 1) / 2.0;
    double pairs = 0;
    for (int64_t i = 0; i < qo; i++)
        pairs += (double)kept_keys(kv - qo + i, window_left);
    return pairs;
}

typedef struct step_work {
    double decode_bytes;  /* K and V bytes decode reads, all layers */
    double prefill_flops; /* 4 * D * Hq per kept pair, all layers */
    double append_bytes;  /* K and V rows read and written, all layers */
} step_work_t;

static void count_work(const serve_args_t *a, const serve_step_t *s, step_work_t *w) {
    const serve_model_t *m = a->model;
    const double row_bytes = 2.0 * m->num_kv_heads * m->head_dim; /* one K or V row of bf16 */
    memset(w, 0, sizeof *w);
    for (int l = 0; l < a->layers; l++) {
        const int window = serve_model_window(m, l);
        for (int b = 0; b < s->num_prefill; b++) {
            const int64_t qo = s->qo_indptr[b + 1] - s->qo_indptr[b];
            w->prefill_flops +=
                4.0 * m->head_dim * m->num_qo_heads * prefill_pairs(qo, s->kv_len[b], window);
        }
        for (int b = s->num_prefill; b < s->num_prefill + s->num_decode; b++)
            w->decode_bytes += 2.0 * row_bytes * (double)kept_keys(s->kv_len[b] - 1, window);
        const int batch = s->num_prefill + s->num_decode;
        w->append_bytes += 2.0 * 2.0 * row_bytes * s->append_indptr[batch];
    }
}

/* ---------------------------------------------------------------------------------------------
 * Results and the JSON file
 * ------------------------------------------------------------------------------------------- */

enum { OP_APPEND, OP_PREFILL, OP_DECODE, NUM_OPS };
static const char *const op_names[NUM_OPS] = {"append", "prefill", "decode"};

typedef struct totals {
    double ms[NUM_OPS];
    int64_t calls[NUM_OPS];
    step_work_t work;
    double wall_s, check_s;
    double copy_tbps, gemm_tflops;
    char gemm_source[256], gemm_missing[512];
    char device[256];
    int64_t checked_steps, checked_requests, check_failures, append_mismatches;
    double max_rel_err, max_abs_err;
    int error_flag;
} totals_t;

/* Appends one step's shapes (and times, when measured) to the JSON steps array. */
static void json_step(cinfer__str_t *j, const serve_step_t *s, const double *ms) {
    cinfer__str_printf(j, "%s\n    {\"index\": %lld, \"prefill\": [", s->index ? "," : "",
                       (long long)s->index);
    for (int b = 0; b < s->num_prefill; b++)
        cinfer__str_printf(j, "%s[%d, %d]", b ? ", " : "", s->qo_indptr[b + 1] - s->qo_indptr[b],
                           s->kv_len[b]);
    cinfer__str_puts(j, "], \"decode\": [");
    for (int b = 0; b < s->num_decode; b++)
        cinfer__str_printf(j, "%s%d", b ? ", " : "", s->kv_len[s->num_prefill + b]);
    cinfer__str_puts(j, "]");
    if (ms)
        cinfer__str_printf(j, ", \"ms\": {\"append\": %.6f, \"prefill\": %.6f, \"decode\": %.6f}",
                           ms[OP_APPEND], ms[OP_PREFILL], ms[OP_DECODE]);
    cinfer__str_puts(j, "}");
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* A ratio or a rate as JSON: null when it could not be measured. */
static void json_number(FILE *f, double x) {
    if (isfinite(x) && x > 0)
        fprintf(f, "%.6g", x);
    else
        fputs("null", f);
}

static cinfer_status_t write_json(const char *path, const serve_args_t *a, const char *trace,
                                  int64_t num_pages, const serve_sched_stats_t *stats,
                                  const totals_t *t, bool measured, const cinfer__str_t *steps) {
    FILE *f = fopen(path, "w");
    if (!f)
        return cinfer__error(CINFER_STATUS_IO_ERROR, "--json %s: cannot create (%s)", path,
                             strerror(errno));
    const serve_model_t *m = a->model;
    fprintf(f, "{\n  \"tool\": \"cinfer bench serve\", \"version\": \"%s\",\n  \"device\": ",
            cinfer_version_string());
    if (measured)
        json_string(f, t->device);
    else
        fputs("null", f);
    fprintf(f,
            ",\n  \"model\": {\"name\": \"%s\", \"num_qo_heads\": %d, \"num_kv_heads\": %d, "
            "\"head_dim\": %d, \"logits_soft_cap\": %g, \"dtype\": \"bf16\"},\n",
            m->name, m->num_qo_heads, m->num_kv_heads, m->head_dim, (double)m->logits_soft_cap);
    fputs("  \"layer_window_left\": [", f);
    for (int l = 0; l < a->layers; l++)
        fprintf(f, "%s%d", l ? ", " : "", serve_model_window(m, l));
    fputs("],\n  \"trace\": ", f);
    json_string(f, trace);
    fprintf(f,
            ",\n  \"config\": {\"layers\": %d, \"page_size\": %d, \"num_pages\": %lld, "
            "\"kv_budget_gb\": %g, \"prefill_chunk\": %d, \"max_batch\": %d, \"requests\": %lld, "
            "\"steps\": %lld, \"seed\": %llu},\n",
            a->layers, PAGE_SIZE, (long long)num_pages, a->kv_budget_gb, a->prefill_chunk,
            a->max_batch, (long long)a->requests, (long long)a->steps, (unsigned long long)a->seed);
    fprintf(f,
            "  \"schedule\": {\"steps\": %lld, \"requests\": %lld, \"admitted\": %lld, "
            "\"finished\": %lld, \"prefill_tokens\": %lld, \"decode_tokens\": %lld, "
            "\"max_running\": %lld, \"max_pages_used\": %lld},\n",
            (long long)stats->steps, (long long)stats->requests, (long long)stats->admitted,
            (long long)stats->finished, (long long)stats->prefill_tokens,
            (long long)stats->decode_tokens, (long long)stats->max_running,
            (long long)stats->max_pages_used);
    fputs("  \"ceilings\": {\"copy_tbps\": ", f);
    json_number(f, measured ? t->copy_tbps : 0);
    fputs(", \"gemm_tflops\": ", f);
    json_number(f, measured ? t->gemm_tflops : 0);
    fputs(", \"gemm_source\": ", f);
    json_string(f, t->gemm_source[0] ? t->gemm_source : t->gemm_missing);
    fputs("},\n  \"ops\": {", f);
    const double work[NUM_OPS] = {t->work.append_bytes, t->work.prefill_flops,
                                  t->work.decode_bytes};
    for (int op = 0; op < NUM_OPS; op++) {
        const double s = t->ms[op] * 1e-3;
        const bool flops = op == OP_PREFILL;
        const double rate = measured && s > 0 ? work[op] / s / 1e12 : 0;
        const double ceiling = flops ? t->gemm_tflops : t->copy_tbps;
        fprintf(f, "%s\n    \"%s\": {\"calls\": %lld, \"ms\": ", op ? "," : "", op_names[op],
                (long long)t->calls[op]);
        json_number(f, measured ? t->ms[op] : 0);
        fprintf(f, ", \"%s\": %.6g, \"%s\": ", flops ? "flops" : "bytes", work[op],
                flops ? "tflops" : "tbps");
        json_number(f, rate);
        fputs(", \"of_ceiling\": ", f);
        json_number(f, ceiling > 0 ? rate / ceiling : 0);
        fputs("}", f);
    }
    fputs("\n  },\n  \"wall_s\": ", f);
    json_number(f, measured ? t->wall_s : 0);
    fputs(", \"steps_per_s\": ", f);
    json_number(f, measured && t->wall_s > 0 ? (double)stats->steps / t->wall_s : 0);
    if (a->check && measured)
        fprintf(f,
                ",\n  \"check\": {\"steps\": %lld, \"requests\": %lld, \"failures\": %lld, "
                "\"append_mismatches\": %lld, \"max_rel_l2_err\": %.6g, \"max_abs_err\": %.6g, "
                "\"append_error_flag\": %d, \"passed\": %s}",
                (long long)t->checked_steps, (long long)t->checked_requests,
                (long long)t->check_failures, (long long)t->append_mismatches, t->max_rel_err,
                t->max_abs_err, t->error_flag,
                t->check_failures || t->append_mismatches || t->error_flag ? "false" : "true");
    fprintf(f, ",\n  \"steps\": [%s\n  ]\n}\n", steps->data ? steps->data : "");
    const bool failed = ferror(f) != 0;
    if (fclose(f) != 0 || failed)
        return cinfer__error(CINFER_STATUS_IO_ERROR, "--json %s: cannot write the file", path);
    return CINFER_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Attention options of the replay's layers: one set per distinct window (gemma2 alternates)
 * ------------------------------------------------------------------------------------------- */

static void attention_options(const serve_args_t *a, int window_left,
                              cinfer_attention_options_t *o) {
    const cinfer_attention_options_t init = CINFER_ATTENTION_OPTIONS_INIT;
    *o = init;
    o->num_qo_heads = a->model->num_qo_heads;
    o->num_kv_heads = a->model->num_kv_heads;
    o->head_dim = a->model->head_dim;
    o->page_size = PAGE_SIZE;
    o->logits_soft_cap = a->model->logits_soft_cap;
    o->window_left = window_left;
    o->max_batch_size = a->max_batch;
}

/* The distinct windows of the layers (at most 2) and the index of each layer's. */
static int layer_kinds(const serve_args_t *a, int windows[2], int *kind_of_layer) {
    int n = 0;
    for (int l = 0; l < a->layers; l++) {
        const int w = serve_model_window(a->model, l);
        int k = 0;
        while (k < n && windows[k] != w)
            k++;
        if (k == n)
            windows[n++] = w;
        if (kind_of_layer)
            kind_of_layer[l] = k;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Without a device: the schedule on the host, and the kernels compiled for --arch
 * ------------------------------------------------------------------------------------------- */

/* Specs already compiled by this run (text forms), so kernels shared by the layer kinds (decode
 * does not depend on the window) are listed once. */
#define MAX_COMPILED 16
static char compiled[MAX_COMPILED][1024];
static int num_compiled;

static int compile_one(const cinfer__spec_t *spec, const char *arch) {
    char text[1024];
    cinfer__spec_format(spec, text, sizeof text);
    for (int i = 0; i < num_compiled; i++)
        if (strcmp(compiled[i], text) == 0)
            return CLI_EXIT_OK;
    if (num_compiled < MAX_COMPILED)
        memcpy(compiled[num_compiled++], text, sizeof text);
    void *cubin = NULL;
    size_t size = 0;
    cinfer__jit_source_t from;
    char name[192];
    const double start = cinfer__now();
    if (cinfer__jit_cubin(spec, arch, &cubin, &size, &from, name) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    printf("  %-64s %s in %.2f s, %zu bytes\n", name,
           from == CINFER__JIT_FROM_COMPILE ? "compiled"
           : from == CINFER__JIT_FROM_AOT   ? "from the AOT bundle"
                                            : "cache hit",
           cinfer__now() - start, size);
    free(cubin);
    return CLI_EXIT_OK;
}

static int compile_kernels(const serve_args_t *a) {
    char archs[1][CLI_ARCH_CHARS];
    int num_archs = 0;
    if (cli_parse_archs(a->arch, archs, 1, &num_archs) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    printf("compiling the replay's kernels for %s:\n", archs[0]);
    /* The prefill planner needs the device's shared memory: a stand-in for the target. */
    cinfer_context_t fake;
    memset(&fake, 0, sizeof fake);
    fake.max_smem_per_block_optin = FALLBACK_SMEM;
    fake.num_sms = FALLBACK_SMS;
    cinfer__fmt(fake.arch, sizeof fake.arch, "%s", archs[0]);
    int windows[2];
    const int kinds = layer_kinds(a, windows, NULL);
    for (int k = 0; k < kinds; k++) {
        cinfer_attention_options_t o;
        attention_options(a, windows[k], &o);
        cinfer__spec_t specs[CINFER__BATCH_PREFILL_MAX_SPECS];
        unsigned smem;
        if (cinfer__decode_kernel_specs(&o, true, &specs[0], &specs[1], &smem))
            return cli_fail();
        for (int i = 0; i < 2; i++)
            if (compile_one(&specs[i], archs[0]))
                return CLI_EXIT_FAILED;
        int n = 0;
        if (cinfer__batch_prefill_kernel_specs(&fake, &o, CINFER_KV_STORAGE_PAGED, 1,
                                               a->prefill_chunk, specs, &n))
            return cli_fail();
        for (int i = 0; i < n; i++)
            if (compile_one(&specs[i], archs[0]))
                return CLI_EXIT_FAILED;
    }
    cinfer__spec_t spec;
    cinfer__append_kernel_spec(CINFER__DT_BF16, CINFER__DT_BF16, a->model->head_dim,
                               a->model->head_dim % 8 == 0, &spec);
    if (compile_one(&spec, archs[0]))
        return CLI_EXIT_FAILED;
    cinfer__seq_lens_kernel_spec(&spec);
    if (compile_one(&spec, archs[0]))
        return CLI_EXIT_FAILED;
    cinfer__batch_indices_positions_kernel_spec(&spec);
    if (compile_one(&spec, archs[0]))
        return CLI_EXIT_FAILED;
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The GPU loop
 * ------------------------------------------------------------------------------------------- */

typedef struct attn {
    int window_left;
    CUdeviceptr decode_ws, prefill_ws;
    cinfer_batch_decode_t *decode;
    cinfer_batch_prefill_t *prefill;
} attn_t;

typedef struct gpu {
    cinfer_context_t *ctx;
    const cinfer__cuda_t *cu;
    CUstream stream;
    int num_kinds;
    attn_t attn[2];
    int *kind_of_layer;                 /* [layers] */
    CUdeviceptr *k_cache, *v_cache;     /* [layers] each [num_pages, 16, Hk, D] */
    CUdeviceptr q_pool, k_pool, v_pool; /* [max_new + layers, H, D] random rows */
    CUdeviceptr out;                    /* [layers, max_new, Hq, D] */
    uint16_t *q_host, *k_host, *v_host;
    CUdeviceptr indptr, indices, last, append_indptr, seq_lens, batch_indices, positions, flag;
    CUevent *events; /* [layers * 4 + 1] */
    int64_t max_new, pool_rows, num_pages;
    size_t q_row, kv_row, page_bytes; /* bytes */
} gpu_t;

static DLTensor view(const gpu_t *g, CUdeviceptr p, DLDataType dt, int ndim, int64_t *shape) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.device.device_id = g->ctx->device;
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    return t;
}

static void gpu_free(gpu_t *g, int layers) {
    const cinfer__cuda_t *cu = g->cu;
    if (!cu)
        return;
    if (g->stream)
        cu->cuStreamSynchronize(g->stream);
    for (int k = 0; k < 2; k++) {
        cinfer_batch_decode_destroy(g->attn[k].decode);
        cinfer_batch_prefill_destroy(g->attn[k].prefill);
        if (g->attn[k].decode_ws)
            cu->cuMemFree(g->attn[k].decode_ws);
        if (g->attn[k].prefill_ws)
            cu->cuMemFree(g->attn[k].prefill_ws);
    }
    for (int l = 0; l < layers; l++) {
        if (g->k_cache && g->k_cache[l])
            cu->cuMemFree(g->k_cache[l]);
        if (g->v_cache && g->v_cache[l])
            cu->cuMemFree(g->v_cache[l]);
    }
    CUdeviceptr bufs[] = {g->q_pool,   g->k_pool,  g->v_pool,        g->out,
                          g->indptr,   g->indices, g->last,          g->append_indptr,
                          g->seq_lens, g->flag,    g->batch_indices, g->positions};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            cu->cuMemFree(bufs[i]);
    for (int i = 0; g->events && i < layers * 4 + 1; i++)
        if (g->events[i])
            cu->cuEventDestroy(g->events[i]);
    if (g->stream)
        cu->cuStreamDestroy(g->stream);
    free(g->events);
    free(g->k_cache);
    free(g->v_cache);
    free(g->kind_of_layer);
    free(g->q_host);
    free(g->k_host);
    free(g->v_host);
}

static cinfer_status_t device_alloc(const cinfer__cuda_t *cu, CUdeviceptr *p, size_t bytes,
                                    const char *what) {
    const CUresult res = cu->cuMemAlloc(p, bytes ? bytes : 16);
    if (res != CUDA_SUCCESS) {
        cinfer__cu_error(res, "cuMemAlloc");
        return cinfer__error(res == CUDA_ERROR_OUT_OF_MEMORY ? CINFER_STATUS_OUT_OF_MEMORY
                                                             : CINFER_STATUS_CUDA_ERROR,
                             "allocating %s (%.2f GB): %s", what, (double)bytes / 1e9,
                             cinfer_last_error());
    }
    return CINFER_STATUS_SUCCESS;
}

/* Seeded random bf16 rows in [-1, 1] (the demo's generator). */
static uint16_t *random_rows(uint64_t *state, size_t elems) {
    uint16_t *h = malloc(sizeof(uint16_t) * (elems ? elems : 1));
    for (size_t i = 0; h && i < elems; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        h[i] =
            cinfer__ref_double_to_bf16((double)(*state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
    return h;
}

static cinfer_status_t gpu_setup(gpu_t *g, const serve_args_t *a, int64_t num_pages) {
    const cinfer__cuda_t *cu = g->cu;
    const serve_model_t *m = a->model;
    const int L = a->layers;
    g->num_pages = num_pages;
    g->max_new = (int64_t)a->prefill_chunk + a->max_batch;
    g->pool_rows = g->max_new + L;
    g->q_row = (size_t)m->num_qo_heads * m->head_dim * 2;
    g->kv_row = (size_t)m->num_kv_heads * m->head_dim * 2;
    g->page_bytes = g->kv_row * PAGE_SIZE;
    CINFER__CU(cu, cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING), "creating a stream");
    g->kind_of_layer = calloc((size_t)L, sizeof(int));
    g->k_cache = calloc((size_t)L, sizeof(CUdeviceptr));
    g->v_cache = calloc((size_t)L, sizeof(CUdeviceptr));
    g->events = calloc((size_t)L * 4 + 1, sizeof(CUevent));
    if (!g->kind_of_layer || !g->k_cache || !g->v_cache || !g->events)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "out of host memory");
    int windows[2];
    g->num_kinds = layer_kinds(a, windows, g->kind_of_layer);
    for (int k = 0; k < g->num_kinds; k++) {
        attn_t *at = &g->attn[k];
        at->window_left = windows[k];
        cinfer_attention_options_t o;
        attention_options(a, windows[k], &o);
        size_t bytes = 0;
        CINFER__CHECK(cinfer_batch_decode_workspace_size(g->ctx, &o, &bytes));
        CINFER__CHECK(device_alloc(cu, &at->decode_ws, bytes, "the decode workspace"));
        CINFER__CHECK(cinfer_batch_decode_create(g->ctx, &o, (void *)(uintptr_t)at->decode_ws,
                                                 bytes, &at->decode));
        CINFER__CHECK(cinfer_batch_prefill_workspace_size(g->ctx, &o, CINFER_KV_STORAGE_PAGED, 1,
                                                          a->prefill_chunk, &bytes));
        CINFER__CHECK(device_alloc(cu, &at->prefill_ws, bytes, "the prefill workspace"));
        CINFER__CHECK(
            cinfer_batch_prefill_create(g->ctx, &o, CINFER_KV_STORAGE_PAGED, 1, a->prefill_chunk,
                                        (void *)(uintptr_t)at->prefill_ws, bytes, &at->prefill));
    }
    /* The page-table kernels load on their first call; load them now (compiling on a cold cache)
     * so no compile lands inside the timed steps. */
    {
        cinfer__spec_t specs[3];
        cinfer__append_kernel_spec(CINFER__DT_BF16, CINFER__DT_BF16, a->model->head_dim,
                                   a->model->head_dim % 8 == 0, &specs[0]);
        cinfer__seq_lens_kernel_spec(&specs[1]);
        cinfer__batch_indices_positions_kernel_spec(&specs[2]);
        for (int i = 0; i < 3; i++) {
            cinfer__kernel_t kernel;
            CINFER__CHECK(cinfer__jit_kernel(g->ctx, &specs[i], &kernel));
        }
    }
    const size_t cache_bytes = (size_t)num_pages * g->page_bytes;
    for (int l = 0; l < L; l++) {
        CINFER__CHECK(device_alloc(cu, &g->k_cache[l], cache_bytes, "a layer's K cache"));
        CINFER__CHECK(device_alloc(cu, &g->v_cache[l], cache_bytes, "a layer's V cache"));
        /* Zeros, as a reused cache holds finite values: slots past a request's length that a
         * kernel loads and masks must not be NaN. */
        CINFER__CU(cu, cuMemsetD8(g->k_cache[l], 0, cache_bytes), "clearing the K cache");
        CINFER__CU(cu, cuMemsetD8(g->v_cache[l], 0, cache_bytes), "clearing the V cache");
    }
    uint64_t state = a->seed * 0x9e3779b97f4a7c15ull + 12345;
    const size_t q_elems = (size_t)g->pool_rows * g->q_row / 2,
                 kv_elems = (size_t)g->pool_rows * g->kv_row / 2;
    g->q_host = random_rows(&state, q_elems);
    g->k_host = random_rows(&state, kv_elems);
    g->v_host = random_rows(&state, kv_elems);
    if (!g->q_host || !g->k_host || !g->v_host)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "out of host memory for the q/k/v pools");
    CINFER__CHECK(device_alloc(cu, &g->q_pool, q_elems * 2, "the q pool"));
    CINFER__CHECK(device_alloc(cu, &g->k_pool, kv_elems * 2, "the k pool"));
    CINFER__CHECK(device_alloc(cu, &g->v_pool, kv_elems * 2, "the v pool"));
    CINFER__CU(cu, cuMemcpyHtoD(g->q_pool, g->q_host, q_elems * 2), "uploading q");
    CINFER__CU(cu, cuMemcpyHtoD(g->k_pool, g->k_host, kv_elems * 2), "uploading k");
    CINFER__CU(cu, cuMemcpyHtoD(g->v_pool, g->v_host, kv_elems * 2), "uploading v");
    CINFER__CHECK(device_alloc(cu, &g->out, (size_t)L * g->max_new * g->q_row, "the outputs"));
    const size_t b1 = sizeof(int32_t) * ((size_t)a->max_batch + 1);
    CINFER__CHECK(device_alloc(cu, &g->indptr, b1, "kv_indptr"));
    CINFER__CHECK(device_alloc(cu, &g->append_indptr, b1, "append_indptr"));
    CINFER__CHECK(device_alloc(cu, &g->last, b1, "kv_last_page_len"));
    CINFER__CHECK(device_alloc(cu, &g->seq_lens, b1, "seq_lens"));
    CINFER__CHECK(device_alloc(cu, &g->indices, sizeof(int32_t) * (size_t)num_pages, "indices"));
    CINFER__CHECK(
        device_alloc(cu, &g->batch_indices, sizeof(int32_t) * (size_t)g->max_new, "indices"));
    CINFER__CHECK(device_alloc(cu, &g->positions, sizeof(int32_t) * (size_t)g->max_new, "pos"));
    CINFER__CHECK(device_alloc(cu, &g->flag, sizeof(int32_t), "the append error flag"));
    CINFER__CU(cu, cuMemsetD8(g->flag, 0, sizeof(int32_t)), "clearing the error flag");
    for (int i = 0; i < L * 4 + 1; i++)
        CINFER__CU(cu, cuEventCreate(&g->events[i], 0), "creating events");
    return CINFER_STATUS_SUCCESS;
}

/* Enqueues one step (every layer), waits for it and adds each operation's milliseconds. */
static cinfer_status_t run_step(gpu_t *g, const serve_args_t *a, const serve_step_t *s,
                                double *ms) {
    const cinfer__cuda_t *cu = g->cu;
    const serve_model_t *m = a->model;
    const DLDataType bf16 = {kDLBfloat, 16, 1}, i32 = {kDLInt, 32, 1};
    const int P = s->num_prefill, Dn = s->num_decode, batch = P + Dn;
    const int64_t nnz = s->append_indptr[batch], ptok = s->qo_indptr[P];
    const int64_t entries = s->kv_indptr[batch];
    CUstream st = g->stream;
    CINFER__CU(
        cu, cuMemcpyHtoDAsync(g->indptr, s->kv_indptr, sizeof(int32_t) * (size_t)(batch + 1), st),
        "uploading kv_indptr");
    CINFER__CU(cu,
               cuMemcpyHtoDAsync(g->indices, s->kv_indices, sizeof(int32_t) * (size_t)entries, st),
               "uploading kv_indices");
    CINFER__CU(cu,
               cuMemcpyHtoDAsync(g->last, s->kv_last_page_len, sizeof(int32_t) * (size_t)batch, st),
               "uploading kv_last_page_len");
    CINFER__CU(cu,
               cuMemcpyHtoDAsync(g->append_indptr, s->append_indptr,
                                 sizeof(int32_t) * (size_t)(batch + 1), st),
               "uploading append_indptr");
    for (int k = 0; k < g->num_kinds; k++) {
        if (P)
            CINFER__CHECK(cinfer_batch_prefill_plan(g->attn[k].prefill, s->qo_indptr, s->kv_indptr,
                                                    s->kv_last_page_len, P, st));
        if (Dn)
            CINFER__CHECK(cinfer_batch_decode_plan(g->attn[k].decode, s->kv_indptr + P,
                                                   s->kv_last_page_len + P, Dn, st));
    }
    int64_t sh_b1[1] = {batch + 1}, sh_b[1] = {batch}, sh_nnz[1] = {nnz}, sh_e[1] = {entries};
    int64_t sh_d1[1] = {Dn + 1}, sh_d[1] = {Dn};
    DLTensor indptr = view(g, g->indptr, i32, 1, sh_b1), last = view(g, g->last, i32, 1, sh_b);
    DLTensor indices = view(g, g->indices, i32, 1, sh_e);
    DLTensor append_indptr = view(g, g->append_indptr, i32, 1, sh_b1);
    DLTensor seq_lens = view(g, g->seq_lens, i32, 1, sh_b);
    DLTensor batch_indices = view(g, g->batch_indices, i32, 1, sh_nnz);
    DLTensor positions = view(g, g->positions, i32, 1, sh_nnz);
    int64_t sh_flag[1] = {1};
    DLTensor flag = view(g, g->flag, i32, 1, sh_flag);
    DLTensor dec_indptr = view(g, g->indptr + sizeof(int32_t) * (size_t)P, i32, 1, sh_d1);
    DLTensor dec_last = view(g, g->last + sizeof(int32_t) * (size_t)P, i32, 1, sh_d);
    CUevent *ev = g->events;
    const int L = a->layers;
    CINFER__CU(cu, cuEventRecord(ev[L * 4], st), "recording an event");
    CINFER__CHECK(cinfer_get_seq_lens(g->ctx, &indptr, &last, PAGE_SIZE, &seq_lens, st));
    CINFER__CHECK(cinfer_get_batch_indices_positions(g->ctx, &append_indptr, &seq_lens,
                                                     &batch_indices, &positions, st));
    cinfer_append_options_t ao = CINFER_APPEND_OPTIONS_INIT;
    ao.page_size = PAGE_SIZE;
    const int64_t Hq = m->num_qo_heads, Hk = m->num_kv_heads, D = m->head_dim;
    int64_t sh_cache[4] = {g->num_pages, PAGE_SIZE, Hk, D};
    int64_t sh_kv[3] = {nnz, Hk, D}, sh_pq[3] = {ptok, Hq, D}, sh_dq[3] = {Dn, Hq, D};
    for (int l = 0; l < L; l++) {
        const attn_t *at = &g->attn[g->kind_of_layer[l]];
        DLTensor kc = view(g, g->k_cache[l], bf16, 4, sh_cache);
        DLTensor vc = view(g, g->v_cache[l], bf16, 4, sh_cache);
        DLTensor ak = view(g, g->k_pool + (size_t)l * g->kv_row, bf16, 3, sh_kv);
        DLTensor av = view(g, g->v_pool + (size_t)l * g->kv_row, bf16, 3, sh_kv);
        const CUdeviceptr out = g->out + (size_t)l * g->max_new * g->q_row;
        CINFER__CU(cu, cuEventRecord(ev[l * 4], st), "recording an event");
        CINFER__CHECK(cinfer_append_paged_kv_cache(g->ctx, &ao, &ak, &av, &batch_indices,
                                                   &positions, &kc, &vc, &indices, &indptr, &last,
                                                   &flag, st));
        CINFER__CU(cu, cuEventRecord(ev[l * 4 + 1], st), "recording an event");
        if (P) {
            DLTensor q = view(g, g->q_pool + (size_t)l * g->q_row, bf16, 3, sh_pq);
            DLTensor o = view(g, out, bf16, 3, sh_pq);
            CINFER__CHECK(
                cinfer_batch_prefill_run(at->prefill, &q, &kc, &vc, &indices, &o, NULL, NULL, st));
        }
        CINFER__CU(cu, cuEventRecord(ev[l * 4 + 2], st), "recording an event");
        if (Dn) {
            DLTensor q = view(g, g->q_pool + (size_t)(l + ptok) * g->q_row, bf16, 3, sh_dq);
            DLTensor o = view(g, out + (size_t)ptok * g->q_row, bf16, 3, sh_dq);
            CINFER__CHECK(cinfer_batch_decode_run(at->decode, &q, &kc, &vc, &dec_indptr, &indices,
                                                  &dec_last, &o, NULL, NULL, st));
        }
        CINFER__CU(cu, cuEventRecord(ev[l * 4 + 3], st), "recording an event");
    }
    CINFER__CU(cu, cuEventSynchronize(ev[L * 4 - 1]), "running the step");
    float t;
    /* The page-table helpers (once per step) count as append time. */
    CINFER__CU(cu, cuEventElapsedTime(&t, ev[L * 4], ev[0]), "reading an event");
    ms[OP_APPEND] = t;
    ms[OP_PREFILL] = ms[OP_DECODE] = 0;
    for (int l = 0; l < L; l++) {
        for (int op = 0; op < NUM_OPS; op++) {
            CINFER__CU(cu, cuEventElapsedTime(&t, ev[l * 4 + op], ev[l * 4 + op + 1]),
                       "reading an event");
            ms[op] += t;
        }
    }
    return CINFER_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * --check: sampled requests of a step against the float64 CPU reference
 * ------------------------------------------------------------------------------------------- */

/* Checks request b of step s on layer l: the rows append wrote into the cache equal the k/v pool
 * rows, and the output (the first and last CHECK_ROWS rows of a prefill chunk, the decode row)
 * matches the reference computed from the downloaded pages. */
static cinfer_status_t check_request(gpu_t *g, const serve_args_t *a, const serve_step_t *s, int b,
                                     int l, totals_t *t) {
    const cinfer__cuda_t *cu = g->cu;
    const serve_model_t *m = a->model;
    const int64_t Hq = m->num_qo_heads, Hk = m->num_kv_heads, D = m->head_dim;
    const int64_t chunk = s->append_indptr[b + 1] - s->append_indptr[b], kv = s->kv_len[b];
    const int64_t pages = s->kv_indptr[b + 1] - s->kv_indptr[b];
    const int window = g->attn[g->kind_of_layer[l]].window_left;
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    uint16_t *kp = malloc(g->page_bytes * (size_t)pages),
             *vp = malloc(g->page_bytes * (size_t)pages);
    uint16_t *out = malloc(g->q_row * (size_t)chunk);
    double *ref = malloc(sizeof(double) * (size_t)(2 * CHECK_ROWS) * (size_t)(Hq * D));
    int32_t *local = malloc(sizeof(int32_t) * (size_t)pages);
    if (!kp || !vp || !out || !ref || !local) {
        st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "--check: out of host memory");
        goto out_free;
    }
    for (int64_t p = 0; p < pages; p++) {
        const CUdeviceptr off = (CUdeviceptr)s->kv_indices[s->kv_indptr[b] + p] * g->page_bytes;
        CUresult res =
            cu->cuMemcpyDtoH((char *)kp + p * g->page_bytes, g->k_cache[l] + off, g->page_bytes);
        if (res == CUDA_SUCCESS)
            res = cu->cuMemcpyDtoH((char *)vp + p * g->page_bytes, g->v_cache[l] + off,
                                   g->page_bytes);
        if (res != CUDA_SUCCESS) {
            st = cinfer__cu_error(res, "--check: downloading pages");
            goto out_free;
        }
        local[p] = (int32_t)p;
    }
    const CUdeviceptr out_dev =
        g->out + ((size_t)l * g->max_new + (size_t)s->append_indptr[b]) * g->q_row;
    CUresult res = cu->cuMemcpyDtoH(out, out_dev, g->q_row * (size_t)chunk);
    if (res != CUDA_SUCCESS) {
        st = cinfer__cu_error(res, "--check: downloading the output");
        goto out_free;
    }
    /* The appended rows: token i of the chunk sits at position kv - chunk + i. */
    int64_t mismatches = 0;
    for (int64_t i = 0; i < chunk; i++) {
        const int64_t pos = kv - chunk + i, row = l + s->append_indptr[b] + i;
        const size_t at =
            (size_t)(pos / PAGE_SIZE) * g->page_bytes + (size_t)(pos % PAGE_SIZE) * g->kv_row;
        mismatches += memcmp((char *)kp + at, (char *)g->k_host + row * g->kv_row, g->kv_row) != 0;
        mismatches += memcmp((char *)vp + at, (char *)g->v_host + row * g->kv_row, g->kv_row) != 0;
    }
    t->append_mismatches += mismatches;
    if (mismatches)
        fprintf(stderr,
                "\ncheck FAILED: step %lld layer %d request %lld: %lld of %lld appended K/V rows "
                "differ from the rows given to append\n",
                (long long)s->index, l, (long long)s->request[b], (long long)mismatches,
                2 * (long long)chunk);

    /* Row ranges: [0, r0) and [chunk - r1, chunk), disjoint, together at most 2 CHECK_ROWS. */
    const int64_t r1 = chunk < CHECK_ROWS ? chunk : CHECK_ROWS;
    const int64_t r0 = chunk - r1 < CHECK_ROWS ? chunk - r1 : CHECK_ROWS;
    const cinfer__ref_heads_t heads = {Hq, Hk, D, D};
    cinfer__ref_paged_t kr, vr;
    cinfer__ref_paged_packed(&kr, kp, CINFER__REF_DTYPE_BF16, CINFER__REF_LAYOUT_NHD, PAGE_SIZE, Hk,
                             D);
    cinfer__ref_paged_packed(&vr, vp, CINFER__REF_DTYPE_BF16, CINFER__REF_LAYOUT_NHD, PAGE_SIZE, Hk,
                             D);
    cinfer__ref_attn_opts_t opts;
    cinfer__ref_attn_opts_init(&opts, D);
    opts.causal = true;
    opts.window_left = window;
    opts.logits_soft_cap = m->logits_soft_cap;
    for (int part = 0; part < 2; part++) {
        /* Rows [first, first + rows) of the chunk. The reference puts its rows last in the KV,
         * so the first rows are checked over the KV prefix that ends with them. */
        const int64_t rows = part ? r1 : r0, first = part ? chunk - r1 : 0;
        if (rows == 0)
            continue;
        const int64_t kv_part = kv - chunk + first + rows;
        const int64_t n_pages = (kv_part + PAGE_SIZE - 1) / PAGE_SIZE;
        const int32_t indptr[2] = {0, (int32_t)n_pages};
        const int32_t last = (int32_t)(kv_part - (n_pages - 1) * PAGE_SIZE);
        const cinfer__ref_page_table_t table = {1, PAGE_SIZE, pages, indptr, local, &last};
        const int32_t qo_indptr[2] = {0, (int32_t)rows};
        cinfer__ref_strided3_t q;
        cinfer__ref_strided3_packed(
            &q, (char *)g->q_host + (size_t)(l + s->append_indptr[b] + first) * g->q_row,
            CINFER__REF_DTYPE_BF16, CINFER__REF_LAYOUT_NHD, rows, Hq, D);
        if (cinfer__ref_batch_paged(&heads, &q, qo_indptr, &kr, &vr, &table, NULL, NULL, &opts, ref,
                                    NULL) != CINFER__REF_OK) {
            st = cinfer__error(CINFER_STATUS_INTERNAL,
                               "--check: the CPU reference rejected step %lld request %lld",
                               (long long)s->index, (long long)s->request[b]);
            goto out_free;
        }
        cinfer__ref_error_t err;
        cinfer__ref_compare(CINFER__REF_DTYPE_BF16, (char *)out + (size_t)first * g->q_row, ref,
                            rows * Hq * D, &err);
        if (err.rel_l2_err > t->max_rel_err || isnan(err.rel_l2_err))
            t->max_rel_err = err.rel_l2_err;
        if (err.max_abs_err > t->max_abs_err || isnan(err.max_abs_err))
            t->max_abs_err = err.max_abs_err;
        if (!(err.rel_l2_err <= CHECK_REL_TOL) || err.num_nonfinite) {
            t->check_failures++;
            fprintf(stderr,
                    "\ncheck FAILED: step %lld layer %d request %lld (%s, rows %lld..%lld of "
                    "%lld, kv_len %lld, window_left %d): relative L2 error %.3g (tolerance %.0e), "
                    "max abs error %.3g, %lld non-finite\n",
                    (long long)s->index, l, (long long)s->request[b],
                    b < s->num_prefill ? "prefill" : "decode", (long long)first,
                    (long long)(first + rows - 1), (long long)chunk, (long long)kv, window,
                    err.rel_l2_err, CHECK_REL_TOL, err.max_abs_err, (long long)err.num_nonfinite);
        }
    }
    t->checked_requests++;
out_free:
    free(kp);
    free(vp);
    free(out);
    free(ref);
    free(local);
    return st;
}

/* The first and last prefill request and the first and last decode request, on the first and
 * last layer (the two window kinds of gemma2 when it has more than one layer). */
static cinfer_status_t check_step(gpu_t *g, const serve_args_t *a, const serve_step_t *s,
                                  totals_t *t) {
    int picks[4], n = 0;
    const int batch = s->num_prefill + s->num_decode;
    const int candidates[4] = {0, s->num_prefill - 1, s->num_prefill, batch - 1};
    for (int i = 0; i < 4; i++) {
        const int b = candidates[i];
        const bool prefill = i < 2;
        if (b < 0 || b >= batch || (prefill ? b >= s->num_prefill : b < s->num_prefill))
            continue;
        bool dup = false;
        for (int j = 0; j < n; j++)
            dup |= picks[j] == b;
        if (!dup)
            picks[n++] = b;
    }
    const int layers[2] = {0, a->layers - 1};
    for (int li = 0; li < (a->layers > 1 ? 2 : 1); li++)
        for (int i = 0; i < n; i++)
            CINFER__CHECK(check_request(g, a, s, picks[i], layers[li], t));
    t->checked_steps++;
    return CINFER_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------- */

static void progress(bool tty, const serve_step_t *s, const serve_sched_stats_t *stats,
                     int64_t num_pages, double elapsed, bool final) {
    fprintf(stderr,
            "%sstep %lld: %d prefill + %d decode requests, %lld queued, %lld/%lld finished, "
            "KV pages %.0f%% used, %.0f steps/s%s",
            tty ? "\r" : "", (long long)s->index, s->num_prefill, s->num_decode,
            (long long)s->queued, (long long)s->finished, (long long)stats->requests,
            100.0 * (double)s->pages_used / (double)num_pages,
            elapsed > 0 ? (double)(s->index + 1) / elapsed : 0.0, tty && !final ? "   " : "\n");
    fflush(stderr);
}

static void print_header(const serve_args_t *a, const char *trace, const serve_trace_t *tr,
                         int64_t num_pages) {
    const serve_model_t *m = a->model;
    printf("serve replay: %s (%d/%d heads, D=%d, bf16", m->name, m->num_qo_heads, m->num_kv_heads,
           m->head_dim);
    if (m->logits_soft_cap > 0)
        printf(", soft cap %g", (double)m->logits_soft_cap);
    if (m->window_left >= 0)
        printf(", window %d%s", m->window_left + 1,
               m->window_every ? " on even layers" : " on every layer");
    printf("), %d layer%s, page %d, KV pool %lld pages (%.2f GB over all layers), prefill "
           "chunk %d, max batch %d\n",
           a->layers, a->layers == 1 ? "" : "s", PAGE_SIZE, (long long)num_pages, a->kv_budget_gb,
           a->prefill_chunk, a->max_batch);
    printf("trace: %s (%lld requests%s%s)\n", trace, (long long)tr->count,
           a->requests ? " taken" : "", a->steps ? ", stopping at --steps" : "");
}

static void print_schedule(const serve_sched_stats_t *st) {
    printf("schedule: %lld steps, %lld requests admitted, %lld finished, %lld prefill tokens, "
           "%lld decode tokens, at most %lld running, at most %lld pages used\n",
           (long long)st->steps, (long long)st->admitted, (long long)st->finished,
           (long long)st->prefill_tokens, (long long)st->decode_tokens, (long long)st->max_running,
           (long long)st->max_pages_used);
}

static void print_table(const totals_t *t, const serve_sched_stats_t *st) {
    if (t->gemm_tflops > 0)
        printf("ceilings: copy %.2f TB/s (device-to-device, 1 GiB, read+write); GEMM %.0f TFLOP/s "
               "(%s)\n",
               t->copy_tbps, t->gemm_tflops, t->gemm_source);
    else
        printf("ceilings: copy %.2f TB/s (device-to-device, 1 GiB, read+write); GEMM not measured "
               "(%s)\n",
               t->copy_tbps, t->gemm_missing);
    printf("\n| op | calls | time (ms) | share | work | achieved | of ceiling |\n");
    printf("|---|---|---|---|---|---|---|\n");
    const double total = t->ms[0] + t->ms[1] + t->ms[2];
    for (int op = 0; op < NUM_OPS; op++) {
        const double s = t->ms[op] * 1e-3;
        char work[64], rate[64], ratio[64];
        double r = 0, ceiling = 0;
        if (op == OP_PREFILL) {
            r = s > 0 ? t->work.prefill_flops / s / 1e12 : 0;
            ceiling = t->gemm_tflops;
            snprintf(work, sizeof work, "%.2f TFLOP (causal, kept)", t->work.prefill_flops / 1e12);
            snprintf(rate, sizeof rate, "%.1f TFLOP/s", r);
        } else {
            const double bytes = op == OP_DECODE ? t->work.decode_bytes : t->work.append_bytes;
            r = s > 0 ? bytes / s / 1e12 : 0;
            ceiling = t->copy_tbps;
            snprintf(work, sizeof work, "%.2f GB %s", bytes / 1e9,
                     op == OP_DECODE ? "KV read" : "read+written");
            snprintf(rate, sizeof rate, "%.2f TB/s", r);
        }
        if (ceiling > 0 && r > 0)
            snprintf(ratio, sizeof ratio, "%.0f%% of %s", 100 * r / ceiling,
                     op == OP_PREFILL ? "GEMM" : "copy");
        else
            snprintf(ratio, sizeof ratio, "n/a");
        printf("| %s | %lld | %.2f | %.0f%% | %s | %s | %s |\n", op_names[op],
               (long long)t->calls[op], t->ms[op], total > 0 ? 100 * t->ms[op] / total : 0.0, work,
               rate, ratio);
    }
    printf("\nsteps: %lld in %.2f s = %.1f steps/s (wall: scheduling, planning, uploads and "
           "launches included%s); GPU time %.1f ms\n",
           (long long)st->steps, t->wall_s, t->wall_s > 0 ? (double)st->steps / t->wall_s : 0.0,
           t->check_s > 0 ? ", --check excluded" : "", total);
}

/* Runs the replay on the GPU; returns an exit status. */
static int serve_gpu(cinfer_context_t *ctx, const serve_args_t *a, const char *trace_path,
                     const serve_trace_t *tr, serve_sched_t *sched, int64_t num_pages) {
    gpu_t g;
    memset(&g, 0, sizeof g);
    g.ctx = ctx;
    g.cu = ctx->cu;
    totals_t t;
    memset(&t, 0, sizeof t);
    cinfer__str_t steps_json = {0};
    serve_sched_stats_t stats;
    int rc = CLI_EXIT_FAILED;
    cinfer_status_t st = cinfer__context_activate(ctx);
    if (!st)
        st = gpu_setup(&g, a, num_pages);
    if (st)
        goto out_fail;
    g.cu->cuDeviceGetName(t.device, sizeof t.device, ctx->cu_device);
    print_header(a, trace_path, tr, num_pages);
    printf("device: %s (%s)\n", t.device, ctx->arch);
    fflush(stdout);
    if ((st = cli_copy_ceiling(g.cu, g.stream, COPY_BYTES, &t.copy_tbps)))
        goto out_fail;
    if (cli_gemm_ceiling(g.cu, g.stream, &t.gemm_tflops, t.gemm_source, sizeof t.gemm_source) !=
        CINFER_STATUS_SUCCESS)
        snprintf(t.gemm_missing, sizeof t.gemm_missing, "%s", cinfer_last_error());

    const bool tty = isatty(2) != 0;
    const double start = cinfer__now();
    double last_progress = 0;
    serve_step_t s;
    while (serve_sched_next(sched, &s)) {
        double ms[NUM_OPS];
        if ((st = run_step(&g, a, &s, ms)))
            goto out_fail;
        step_work_t w;
        count_work(a, &s, &w);
        t.work.decode_bytes += w.decode_bytes;
        t.work.prefill_flops += w.prefill_flops;
        t.work.append_bytes += w.append_bytes;
        for (int op = 0; op < NUM_OPS; op++)
            t.ms[op] += ms[op];
        t.calls[OP_APPEND] += a->layers;
        t.calls[OP_PREFILL] += s.num_prefill ? a->layers : 0;
        t.calls[OP_DECODE] += s.num_decode ? a->layers : 0;
        if (a->json_path)
            json_step(&steps_json, &s, ms);
        if (a->check && s.index % a->check_every == 0) {
            const double c0 = cinfer__now();
            if ((st = check_step(&g, a, &s, &t)))
                goto out_fail;
            t.check_s += cinfer__now() - c0;
        }
        const double now = cinfer__now() - start;
        if (!a->quiet && now - last_progress > (tty ? 0.2 : 10.0)) {
            serve_sched_get_stats(sched, &stats);
            progress(tty, &s, &stats, num_pages, now - t.check_s, false);
            last_progress = now;
        }
    }
    t.wall_s = cinfer__now() - start - t.check_s;
    serve_sched_get_stats(sched, &stats);
    if (!a->quiet && tty && stats.steps)
        fputs("\n", stderr);
    int32_t flag = 0;
    CUresult res = g.cu->cuMemcpyDtoH(&flag, g.flag, sizeof flag);
    if (res != CUDA_SUCCESS) {
        st = cinfer__cu_error(res, "reading the append error flag");
        goto out_fail;
    }
    t.error_flag = flag;
    print_schedule(&stats);
    print_table(&t, &stats);
    if (flag)
        printf("append error flag = %d (bits: 1 batch index, 2 position, 4 page out of range): "
               "FAILED\n",
               flag);
    bool ok = flag == 0;
    if (a->check) {
        ok = ok && t.check_failures == 0 && t.append_mismatches == 0;
        printf("check vs float64 CPU reference: %lld steps, %lld request-layers: %s (max relative "
               "L2 error %.2e, tolerance %.0e; max abs error %.2e; %lld appended rows differ)\n",
               (long long)t.checked_steps, (long long)t.checked_requests, ok ? "passed" : "FAILED",
               t.max_rel_err, CHECK_REL_TOL, t.max_abs_err, (long long)t.append_mismatches);
    }
    if (a->json_path) {
        if (steps_json.failed) {
            st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "--json: out of host memory");
            goto out_fail;
        }
        if ((st =
                 write_json(a->json_path, a, trace_path, num_pages, &stats, &t, true, &steps_json)))
            goto out_fail;
        printf("wrote %s\n", a->json_path);
    }
    rc = ok ? CLI_EXIT_OK : CLI_EXIT_FAILED;
    goto out_free;
out_fail:
    if (!a->quiet && isatty(2))
        fputs("\n", stderr);
    rc = cli_fail();
out_free:
    gpu_free(&g, a->layers);
    cinfer__str_free(&steps_json);
    return rc;
}

/* No device: the schedule on the host (and its JSON), then the kernels compiled for --arch. */
static int serve_host(const serve_args_t *a, const char *trace_path, const serve_trace_t *tr,
                      serve_sched_t *sched, int64_t num_pages) {
    printf("no CUDA device found (%s)\n", cinfer_last_error());
    print_header(a, trace_path, tr, num_pages);
    cinfer__str_t steps_json = {0};
    serve_step_t s;
    totals_t t;
    memset(&t, 0, sizeof t);
    snprintf(t.gemm_missing, sizeof t.gemm_missing, "no device");
    while (serve_sched_next(sched, &s)) {
        step_work_t w;
        count_work(a, &s, &w);
        t.work.decode_bytes += w.decode_bytes;
        t.work.prefill_flops += w.prefill_flops;
        t.work.append_bytes += w.append_bytes;
        t.calls[OP_APPEND] += a->layers;
        t.calls[OP_PREFILL] += s.num_prefill ? a->layers : 0;
        t.calls[OP_DECODE] += s.num_decode ? a->layers : 0;
        if (a->json_path)
            json_step(&steps_json, &s, NULL);
    }
    serve_sched_stats_t stats;
    serve_sched_get_stats(sched, &stats);
    print_schedule(&stats);
    printf("work: decode %.2f GB of KV read, prefill %.2f TFLOP (causal, kept), append %.2f GB "
           "read+written\n",
           t.work.decode_bytes / 1e9, t.work.prefill_flops / 1e12, t.work.append_bytes / 1e9);
    int rc = CLI_EXIT_OK;
    if (a->json_path) {
        if (steps_json.failed ||
            write_json(a->json_path, a, trace_path, num_pages, &stats, &t, false, &steps_json)) {
            if (steps_json.failed)
                cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "--json: out of host memory");
            rc = cli_fail();
        } else {
            printf("wrote %s (shapes only)\n", a->json_path);
        }
    }
    cinfer__str_free(&steps_json);
    if (rc == CLI_EXIT_OK)
        rc = compile_kernels(a);
    if (rc == CLI_EXIT_OK)
        printf("run it on a machine with an NVIDIA GPU (sm_80 or later) to time the replay%s\n",
               a->check ? " and check it against the CPU reference (--check needs the GPU's "
                          "results: skipped here)"
                        : "");
    return rc;
}

/*
 * --json FILE must be writable, found out before the replay rather than after it: the file is
 * opened for appending, which creates it when it is missing (*created) and leaves an existing
 * file as it was until the end of the run writes it.
 */
static cinfer_status_t check_json_path(const char *path, bool *created) {
    *created = access(path, F_OK) != 0;
    FILE *f = fopen(path, "a");
    if (!f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "--json %s: cannot create the file (%s); checked before the replay",
                             path, strerror(errno));
    fclose(f);
    return CINFER_STATUS_SUCCESS;
}

static int bench_serve_run(const serve_args_t *a);

static int bench_serve(int argc, char **argv) {
    serve_args_t a;
    int rc = parse_serve_args(argc, argv, &a);
    if (rc != CLI_EXIT_OK)
        return rc;
    if (a.help) {
        printf("cinfer bench serve: replay a request trace through continuous batching\n\n%s",
               serve_synopsis);
        return CLI_EXIT_OK;
    }
    /* What can be checked before the replay (minutes on a GPU) is checked now: the arch the
     * no-device path compiles for, and that the JSON file can be created. */
    char arch[1][CLI_ARCH_CHARS];
    int num_archs = 0;
    if (cli_parse_archs(a.arch, arch, 1, &num_archs) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    bool json_created = false;
    if (a.json_path && check_json_path(a.json_path, &json_created) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    rc = bench_serve_run(&a);
    /* A file created by the check and never written (the run failed first) is not left behind. */
    struct stat st;
    if (json_created && stat(a.json_path, &st) == 0 && st.st_size == 0)
        unlink(a.json_path);
    return rc;
}

/* Everything after the arguments' checks: the trace, the schedule, the replay. */
static int bench_serve_run(const serve_args_t *a) {
    int rc = CLI_EXIT_OK;
    char trace_path[4096], tried[3 * 4096 + 16];
    if (a->trace_path) {
        snprintf(trace_path, sizeof trace_path, "%s", a->trace_path);
    } else if (!default_trace(trace_path, sizeof trace_path, tried, sizeof tried)) {
        cinfer__error(CINFER_STATUS_IO_ERROR,
                      "the default trace %s was not found (tried %s); pass --trace FILE",
                      TRACE_FILE, tried);
        return cli_fail();
    }
    serve_trace_t trace;
    if (serve_trace_load(trace_path, a->requests, &trace) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    /* Pages: the budget over every layer's K and V. */
    const double page_all_layers =
        2.0 * PAGE_SIZE * a->model->num_kv_heads * a->model->head_dim * 2.0 * a->layers;
    const double pages = floor(a->kv_budget_gb * 1e9 / page_all_layers);
    if (pages < 1 || pages > INT32_MAX) {
        serve_trace_free(&trace);
        cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                      "--kv-budget-gb = %g gives %.0f pages of %.0f bytes over %d layers, expected "
                      "1..2^31 - 1 pages",
                      a->kv_budget_gb, pages, page_all_layers, a->layers);
        return cli_fail();
    }
    const serve_sched_config_t cfg = {PAGE_SIZE,   (int64_t)pages, a->prefill_chunk, a->max_batch,
                                      a->requests, a->steps,       a->seed};
    serve_sched_t *sched = NULL;
    if (serve_sched_create(&cfg, &trace, &sched) != CINFER_STATUS_SUCCESS) {
        serve_trace_free(&trace);
        return cli_fail();
    }
    cinfer_context_t *ctx = NULL;
    const cinfer_status_t st = cinfer_context_create(NULL, &ctx);
    if (st == CINFER_STATUS_NO_DEVICE)
        rc = serve_host(a, trace_path, &trace, sched, (int64_t)pages);
    else if (st != CINFER_STATUS_SUCCESS)
        rc = cli_fail();
    else
        rc = serve_gpu(ctx, a, trace_path, &trace, sched, (int64_t)pages);
    cinfer_context_destroy(ctx);
    serve_sched_destroy(sched);
    serve_trace_free(&trace);
    return rc;
}

int cli_bench(int argc, char **argv) {
    if (argc < 2)
        return cli_usage_error("bench", "no benchmark given, expected \"serve\"");
    if (cli_is_help(argv[1]))
        return cli_print_help("bench");
    if (strcmp(argv[1], "serve") != 0)
        return cli_usage_error("bench", "unknown benchmark \"%s\", expected \"serve\"", argv[1]);
    return bench_serve(argc - 2, argv + 2);
}

/* `cinfer demo`: a short checked replay (what `make demo` runs). */
int cli_demo(int argc, char **argv) {
    if (argc > 1)
        return cli_is_help(argv[1])
                   ? cli_print_help("demo")
                   : cli_usage_error("demo", "unexpected argument \"%s\"", argv[1]);
    char *args[] = {"--check", "--steps", "64", "--requests", "256", "--layers", "2"};
    return bench_serve((int)(sizeof args / sizeof args[0]), args);
}
