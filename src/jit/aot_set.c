/*
 * The sets of kernel specs built ahead of time (`cinfer aot --set NAME`).
 *
 * A set is a table of attention layer shapes crossed with dtypes and with the operations below.
 * Each operation turns the attention options of a layer into kernel specs through the function
 * the operation itself calls when it is created, so a set cannot drift from what the library
 * loads: a change of tiles or kernel choice changes the bundle with it.
 *
 * MLA (DeepSeek-V2/V3's latent attention, its own options) has a short table of its own below.
 *
 * The KV-cache writes a serving step makes between layers are covered too: append_paged_kv_cache
 * for each layer's dtype and head dim (16-byte rows, as aligned tensors take), and the page-table
 * helpers get_seq_lens and get_batch_indices_positions (one kernel each), so a server with
 * CINFER_JIT=off can fill its cache.
 *
 * Not covered: in-kernel RoPE (pos = rope) and custom variants (whose source is the user's); both
 * are compiled on first use. A new operation adds one row to
 * `operations`; a new model family adds rows to `default_layers`. The public merge operations
 * (cinfer_merge_state*) are not covered either: their spec depends on the alignment of the caller's
 * tensors and is built inside src/ops/merge.c, which has no spec function yet.
 */
#include <stdlib.h>
#include <string.h>

#include "jit/aot.h"
#include "ops/append.h"
#include "ops/decode.h"
#include "ops/mla.h"
#include "ops/options.h"
#include "ops/prefill.h"

/* ---- the layers ---- */

/*
 * One kind of attention layer. Models that alternate sliding-window (local) and full (global)
 * layers have a row for each. Only the ratio qo_heads / kv_heads (the GQA group), the head dim,
 * the soft cap being on and the window being on select kernels; the head counts are the models'
 * own, for the reader. Tensor parallelism divides both counts and keeps the group, up to as many
 * GPUs as KV heads.
 */
typedef struct layer {
    const char *models; /* examples of models with this layer, for the reader */
    int qo_heads, kv_heads, head_dim;
    float soft_cap;  /* logits soft cap; 0 = off */
    int window_left; /* sliding window: positions attended besides the query's own; -1 = off */
} layer_t;

/* The serving shapes of Llama, Qwen, Mistral and Gemma (the models' config.json files). */
static const layer_t default_layers[] = {
    /* models                                       Hq   Hk    D  soft cap  window_left */
    {"Llama 3.1/3.3 8B, Mistral 7B v0.3, Nemo 12B", 32, 8, 128, 0.0f, -1},
    {"Llama 3.1/3.3 70B, Qwen2.5 72B, Qwen3 32B", 64, 8, 128, 0.0f, -1},
    {"Llama 3.1 405B, Qwen3 235B-A22B", 128, 8, 128, 0.0f, -1},
    {"Llama 3.2 1B", 32, 8, 64, 0.0f, -1},
    {"Llama 3.2 3B", 24, 8, 128, 0.0f, -1},
    {"Llama 2 7B (MHA)", 32, 32, 128, 0.0f, -1},
    {"Mistral 7B v0.1 (sliding window 4096)", 32, 8, 128, 0.0f, 4095},
    {"Qwen2.5 0.5B", 14, 2, 64, 0.0f, -1},
    {"Qwen2.5 1.5B", 12, 2, 128, 0.0f, -1},
    {"Qwen2.5 3B, Qwen3 30B-A3B", 16, 2, 128, 0.0f, -1},
    {"Qwen2.5 7B", 28, 4, 128, 0.0f, -1},
    {"Qwen2.5 14B/32B, Qwen3 14B", 40, 8, 128, 0.0f, -1},
    {"Qwen3 0.6B/1.7B", 16, 8, 128, 0.0f, -1},
    {"Gemma 2B (MQA)", 8, 1, 256, 0.0f, -1},
    {"Gemma 7B (MHA)", 16, 16, 256, 0.0f, -1},
    {"Gemma 2 2B/9B, local layers", 16, 8, 256, 50.0f, 4095},
    {"Gemma 2 2B/9B, global layers", 16, 8, 256, 50.0f, -1},
    {"Gemma 2 27B, local layers", 32, 16, 128, 50.0f, 4095},
    {"Gemma 2 27B, global layers", 32, 16, 128, 50.0f, -1},
    {"Gemma 3 1B, local layers", 4, 1, 256, 0.0f, 511},
    {"Gemma 3 1B, global layers", 4, 1, 256, 0.0f, -1},
    {"Gemma 3 4B/12B, local layers", 16, 8, 256, 0.0f, 1023},
    {"Gemma 3 4B/12B, global layers", 16, 8, 256, 0.0f, -1},
    {"Gemma 3 27B, local layers", 32, 16, 128, 0.0f, 1023},
    {"Gemma 3 27B, global layers", 32, 16, 128, 0.0f, -1},
};

/* One common shape, enough to prove the whole path in CI within seconds. */
static const layer_t ci_layers[] = {
    /* models          Hq  Hk    D  soft cap  window_left */
    {"Llama 3.1 8B", 32, 8, 128, 0.0f, -1},
};

/* ---- the operations ---- */

/* The most specs one operation yields for one layer (batch prefill: one per query tile and the
 * split-KV merge kernel). */
#define MAX_OP_SPECS CINFER__BATCH_PREFILL_MAX_SPECS

/* Fills out with the specs the operation loads for options o on a device of arch allowing
 * max_smem_optin bytes of shared memory per block. */
typedef cinfer_status_t (*op_specs_fn)(const cinfer_attention_options_t *o, const char *arch,
                                       int max_smem_optin, cinfer__spec_t *out, int *count);

static cinfer_status_t batch_decode(const cinfer_attention_options_t *o, const char *arch,
                                    int max_smem_optin, cinfer__spec_t *out, int *count) {
    unsigned smem;
    *count = 2;
    return cinfer__decode_kernel_specs(o, true, &out[0], &out[1], &smem);
}

static cinfer_status_t single_decode(const cinfer_attention_options_t *o, const char *arch,
                                     int max_smem_optin, cinfer__spec_t *out, int *count) {
    unsigned smem;
    *count = 2;
    return cinfer__decode_kernel_specs(o, false, &out[0], &out[1], &smem);
}

static cinfer_status_t single_prefill_causal(const cinfer_attention_options_t *o, const char *arch,
                                             int max_smem_optin, cinfer__spec_t *out, int *count) {
    return cinfer__prefill_single_specs(o, 1, arch, max_smem_optin, out, count);
}

static cinfer_status_t batch_prefill_ragged(const cinfer_attention_options_t *o, const char *arch,
                                            int max_smem_optin, cinfer__spec_t *out, int *count) {
    return cinfer__batch_prefill_aot_specs(o, CINFER_KV_STORAGE_RAGGED, 1, arch, max_smem_optin,
                                           out, count);
}

static cinfer_status_t batch_prefill_paged(const cinfer_attention_options_t *o, const char *arch,
                                           int max_smem_optin, cinfer__spec_t *out, int *count) {
    return cinfer__batch_prefill_aot_specs(o, CINFER_KV_STORAGE_PAGED, 1, arch, max_smem_optin, out,
                                           count);
}

/* The cache write of a layer's new tokens: rows of the layer's dtype into a cache of the same
 * dtype, 16-byte vectors where the head dim allows them (ops/append.c takes those for aligned
 * tensors). */
static cinfer_status_t append_kv(const cinfer_attention_options_t *o, const char *arch,
                                 int max_smem_optin, cinfer__spec_t *out, int *count) {
    (void)arch;
    (void)max_smem_optin;
    const cinfer__dtype_t dt = cinfer__dl_dtype(o->kv_dtype);
    cinfer__append_kernel_spec(dt, dt, o->head_dim, o->head_dim % 8 == 0, &out[0]);
    *count = 1;
    return cinfer__spec_validate(&out[0]);
}

typedef struct operation {
    const char *name;
    op_specs_fn specs;
} operation_t;

static const operation_t operations[] = {
    {"batch decode, paged KV (attention + split-KV merge)", batch_decode},
    {"single decode, contiguous KV (attention + split-KV merge)", single_decode},
    {"single prefill, causal (the default tiles, the smaller ones of short grids, the sm80 "
     "turn-taking ones and the sm90 kernel of long ones)",
     single_prefill_causal},
    {"batch prefill, ragged KV, causal (one kernel per query tile, split-KV merge)",
     batch_prefill_ragged},
    {"batch prefill, paged KV, causal (one kernel per query tile, split-KV merge)",
     batch_prefill_paged},
    {"append_paged_kv_cache (the layer's dtype and head dim)", append_kv},
};

/* MLA layers: the kernel depends on the query heads a CTA packs per token (min(H, 16); on sm_90a
 * 64 for H a multiple of 64), the dtype and the causal flag (decode rows, and prefill chunks). */
static const int mla_heads[] = {
    16,  /* DeepSeek-V3 / R1 at tensor parallel 8 (128 heads / 8), and every H a multiple of 16 */
    128, /* one GPU: the warpgroup kernel on sm_90a (H a multiple of 64), else the same as 16 */
};

/* ---- the sets ---- */

typedef struct set {
    const char *name;
    const layer_t *layers;
    size_t num_layers;
    const cinfer__dtype_t *dtypes; /* q = kv = out; ends with CINFER__DT_NONE */
    bool mla;                      /* the MLA kernels of mla_heads, causal and not */
} set_t;

static const cinfer__dtype_t half_dtypes[] = {CINFER__DT_F16, CINFER__DT_BF16, CINFER__DT_NONE};
static const cinfer__dtype_t bf16_only[] = {CINFER__DT_BF16, CINFER__DT_NONE};

#define LAYERS(table) table, sizeof table / sizeof table[0]
static const set_t sets[] = {
    {"default", LAYERS(default_layers), half_dtypes, true},
    {"ci", LAYERS(ci_layers), bf16_only, false},
};
#define NUM_SETS (sizeof sets / sizeof sets[0])

const char *cinfer__aot_set_names(void) {
    return "default, ci";
}

/*
 * The opt-in shared memory per block of the smallest device of each arch (CUDA C++ Programming
 * Guide, "Technical Specifications per Compute Capability"): prefill tiles are chosen to fit it,
 * as they are on the device itself. An arch missing here gets the smallest size, 99 KiB, whose
 * tiles fit every device.
 */
static int arch_max_smem_optin(const char *arch) {
    static const struct {
        const char *arch;
        int kib;
    } table[] = {{"sm_80", 163}, {"sm_86", 99},   {"sm_87", 163},  {"sm_89", 99},
                 {"sm_90", 227}, {"sm_90a", 227}, {"sm_100", 227}, {"sm_100a", 227},
                 {"sm_120", 99}, {"sm_120a", 99}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].arch, arch) == 0)
            return table[i].kib * 1024;
    return 99 * 1024;
}

static DLDataType dl_dtype(cinfer__dtype_t dt) {
    DLDataType d = {dt == CINFER__DT_BF16 ? kDLBfloat : kDLFloat, 16, 1};
    return d;
}

static void layer_options(const layer_t *l, cinfer__dtype_t dt, cinfer_attention_options_t *o) {
    const cinfer_attention_options_t init = CINFER_ATTENTION_OPTIONS_INIT;
    *o = init;
    o->num_qo_heads = l->qo_heads;
    o->num_kv_heads = l->kv_heads;
    o->head_dim = l->head_dim;
    o->q_dtype = o->kv_dtype = dl_dtype(dt);
    o->logits_soft_cap = l->soft_cap;
    o->window_left = l->window_left;
}

/* Appends spec unless the list has it already (specs are normalized, so memcmp decides). */
static bool add_unique(cinfer__spec_t *list, size_t *count, const cinfer__spec_t *spec) {
    for (size_t i = 0; i < *count; i++)
        if (memcmp(&list[i], spec, sizeof *spec) == 0)
            return false;
    list[(*count)++] = *spec;
    return true;
}

cinfer_status_t cinfer__aot_set_specs(const char *name, const char *arch, cinfer__spec_t **specs,
                                      size_t *count) {
    if (!specs || !count || !arch)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cinfer__aot_set_specs: arch, specs and count must not be NULL");
    *specs = NULL;
    *count = 0;
    const set_t *set = NULL;
    for (size_t i = 0; i < NUM_SETS && name; i++)
        if (strcmp(sets[i].name, name) == 0)
            set = &sets[i];
    if (!set)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "unknown kernel set \"%s\" (known: %s)", name ? name : "(null)",
                             cinfer__aot_set_names());
    size_t num_dtypes = 0;
    while (set->dtypes[num_dtypes] != CINFER__DT_NONE)
        num_dtypes++;
    const size_t num_ops = sizeof operations / sizeof operations[0];
    const size_t num_mla = sizeof mla_heads / sizeof mla_heads[0];
    cinfer__spec_t *list =
        malloc(((set->num_layers * num_ops * MAX_OP_SPECS + num_mla * 2 * 2) * num_dtypes + 2) *
               sizeof *list);
    if (!list)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "kernel set %s: out of memory", name);
    const int max_smem = arch_max_smem_optin(arch);
    size_t n = 0;
    for (size_t l = 0; l < set->num_layers; l++) {
        for (size_t d = 0; d < num_dtypes; d++) {
            cinfer_attention_options_t o;
            layer_options(&set->layers[l], set->dtypes[d], &o);
            for (size_t op = 0; op < num_ops; op++) {
                cinfer__spec_t out[MAX_OP_SPECS];
                int got = 0;
                cinfer_status_t st = operations[op].specs(&o, arch, max_smem, out, &got);
                if (st != CINFER_STATUS_SUCCESS) {
                    /* A row the library rejects is a bug in this table: say which. */
                    char why[1024];
                    cinfer__fmt(why, sizeof why, "%s", cinfer_last_error());
                    free(list);
                    return cinfer__error(st, "kernel set %s, layer \"%s\" (%s), %s: %s", name,
                                         set->layers[l].models, cinfer__dtype_name(set->dtypes[d]),
                                         operations[op].name, why);
                }
                for (int k = 0; k < got; k++)
                    add_unique(list, &n, &out[k]);
            }
        }
    }
    for (size_t h = 0; set->mla && h < num_mla; h++)
        for (size_t d = 0; d < num_dtypes; d++)
            for (int causal = 0; causal < 2; causal++) {
                cinfer_mla_options_t o = CINFER_MLA_OPTIONS_INIT;
                o.num_heads = mla_heads[h];
                o.q_dtype = o.kv_dtype = dl_dtype(set->dtypes[d]);
                o.sm_scale = 1.0f; /* any valid value: not part of the kernel */
                cinfer__spec_t attention, merge;
                cinfer_status_t st = cinfer__batch_mla_specs(&o, causal, arch, &attention, &merge);
                if (st != CINFER_STATUS_SUCCESS) {
                    char why[1024];
                    cinfer__fmt(why, sizeof why, "%s", cinfer_last_error());
                    free(list);
                    return cinfer__error(st, "kernel set %s, MLA with %d heads (%s): %s", name,
                                         mla_heads[h], cinfer__dtype_name(set->dtypes[d]), why);
                }
                add_unique(list, &n, &attention);
                add_unique(list, &n, &merge);
            }
    /* The page-table helpers: one kernel each, whatever the layers. */
    cinfer__seq_lens_kernel_spec(&list[n]);
    n++;
    cinfer__batch_indices_positions_kernel_spec(&list[n]);
    n++;
    *specs = list;
    *count = n;
    return CINFER_STATUS_SUCCESS;
}
