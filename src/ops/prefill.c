/*
 * Prefill: options and tensor checks, tile choice, specs and launches of the sm80 tensor-core
 * kernel (kernels/prefill.cu). Single prefill is workspace-free: one launch writes out and lse
 * directly. Batch prefill (ragged or paged K/V) follows batch decode's create / plan / run: the
 * planner (src/sched/prefill_plan.c) writes a work list into a caller-owned workspace, splitting
 * the KV of a few long query tiles into chunks (split-KV) when they alone would leave most of the
 * GPU idle; run then folds the chunks' float32 partial states with batch decode's merge kernel.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode_params.h"
#include "jit/jit.h"
#include "ops/decode.h"
#include "ops/options.h"
#include "ops/prefill.h"
#include "ops/staging.h"
#include "ops/tensor.h"
#include "prefill_params.h"
#include "sched/decode_plan.h"
#include "sched/prefill_plan.h"
#include "variant/variant.h"

/* ---- options ---- */

static bool is_fp8(cinfer__dtype_t dt) {
    return dt == CINFER__DT_E4M3 || dt == CINFER__DT_E5M2;
}

static void set_scales(const cinfer_attention_options_t *o, bool exact_e4m3,
                       cinfer_prefill_params *p);

/* The least kernel q_scale (set_scales) a variant with an ALiBi slope hook runs with: the kernels
 * hold the bias in q . k units, slope (j - i) / q_scale, in float32, finite for |slope| up to 2^32
 * and |j - i| below 2^31 (include/cinfer.h, VARIANT_ALIBI_SLOPE). */
#define ALIBI_MIN_Q_SCALE 0x1p-64

static cinfer_status_t alibi_scale_check(const cinfer_attention_options_t *o) {
    if (!o->variant || !(o->variant->hooks & CINFER__VARIANT_ALIBI_SLOPE))
        return CINFER_STATUS_SUCCESS;
    cinfer_prefill_params p;
    set_scales(o, true, &p); /* the smaller q_scale of the two e4m3 forms */
    if (p.q_scale >= ALIBI_MIN_Q_SCALE)
        return CINFER_STATUS_SUCCESS;
    return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                         "options->sm_scale = %g and k_scale = %g with the ALiBi slopes of variant "
                         "%s: the prefill kernels' logit scale q_scale = %g, expected at least "
                         "2^-64 = %g (the bias slope (j - i) / q_scale must stay finite in float)",
                         (double)o->sm_scale, (double)o->k_scale, o->variant->name,
                         (double)p.q_scale, ALIBI_MIN_Q_SCALE);
}

/* What prefill reads from the options; page_size, use_cuda_graph, max_batch_size and
 * use_tensor_cores are ignored. K/V are of q's dtype or fp8 (e4m3, e5m2; k_scale and v_scale
 * apply to every K/V dtype). */
static cinfer_status_t options_check(const cinfer_attention_options_t *o) {
    const cinfer__dtype_t q = o ? cinfer__dl_dtype(o->q_dtype) : CINFER__DT_NONE;
    /* The kernel rotates K tiles in shared memory as 16-bit values; an fp8 tile would have to be
     * converted first, which this kernel does not do. */
    if (o && o->size >= sizeof *o && o->version == CINFER_ATTENTION_OPTIONS_VERSION &&
        cinfer__attention_rope(o)) {
        const cinfer__dtype_t kv = cinfer__dl_dtype(o->kv_dtype);
        if (is_fp8(kv))
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "options->kv_dtype %s with pos_encoding_mode = ROPE_LLAMA is not "
                                 "supported by prefill: in-kernel RoPE needs fp16 or bf16 K",
                                 cinfer__dtype_name(kv));
    }
    char hint[96];
    cinfer__fmt(hint, sizeof hint,
                "the q_dtype (%s), or fp8 e4m3 or e5m2 (DLPack codes 10 and 12, 8 bits)",
                q == CINFER__DT_BF16 ? "bf16" : "fp16");
    CINFER__CHECK(cinfer__attention_options_check(
        o,
        CINFER__DTS(q == CINFER__DT_NONE ? CINFER__DT_F16 : q) | CINFER__DTS(CINFER__DT_E4M3) |
            CINFER__DTS(CINFER__DT_E5M2),
        hint));
    CINFER__CHECK(cinfer__variant_options_check(o));
    CINFER__CHECK(alibi_scale_check(o));
    /* The kernel steps through the head dim in mma k16 steps and n8 tiles (kernels/prefill.cu);
     * 256 bounds the O accumulators a warp keeps in registers. */
    if (o->head_dim % 16 != 0 || o->head_dim > 256)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->head_dim = %d is not supported by prefill: expected a "
                             "multiple of 16, at most 256",
                             o->head_dim);
    const int vo = cinfer__attention_head_dim_vo(o);
    if (vo % 16 != 0 || vo > 256)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->head_dim_vo = %d is not supported by prefill: expected a "
                             "multiple of 16, at most 256",
                             vo);
    /* D_qk != D_vo: the template runs at the larger dim with zero-filled columns (kernels/
     * prefill.cu, D_QK); its fp8 conversion and RoPE rotate whole rows of one dim. */
    if (vo != o->head_dim && (is_fp8(cinfer__dl_dtype(o->kv_dtype)) || cinfer__attention_rope(o)))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->head_dim_vo = %d != head_dim = %d with %s is not "
                             "supported: D_qk != D_vo takes fp16 or bf16 K/V and no in-kernel RoPE",
                             vo, o->head_dim,
                             cinfer__attention_rope(o) ? "pos_encoding_mode = ROPE_LLAMA"
                                                       : "fp8 K/V");
    return CINFER_STATUS_SUCCESS;
}

/* The head dim the kernels' tiles are sized for: the larger of D_qk and D_vo. */
static int tile_dim(const cinfer_attention_options_t *o) {
    const int vo = cinfer__attention_head_dim_vo(o);
    return o->head_dim > vo ? o->head_dim : vo;
}

/* ---- tiles ---- */

/* Static shared memory the toolchain may reserve per block (1 KiB on sm_90a), which every tile
 * choice below leaves free of its dynamic shared memory. */
#define STATIC_SMEM_RESERVE 1024

size_t cinfer__prefill_smem_bytes(int head_dim, const cinfer__prefill_config_t *cfg) {
    return cinfer__prefill_kv_smem_bytes(head_dim, CINFER__DT_F16, cfg);
}

int cinfer__prefill_threads(const cinfer__prefill_config_t *cfg) {
    return cfg->warps * 32 + (cfg->sm90 ? 128 : 0);
}

size_t cinfer__prefill_kv_smem_bytes(int head_dim, cinfer__dtype_t kv_dtype,
                                     const cinfer__prefill_config_t *cfg) {
    if (cfg->sm90)
        return cinfer__prefill_sm90_smem_bytes(head_dim, head_dim, cfg);
    const size_t row_chunks = (size_t)head_dim / 8 + 1;
    if (!is_fp8(kv_dtype))
        return 16 * row_chunks * ((size_t)cfg->tile_q + 2 * (size_t)cfg->stages * cfg->tile_kv);
    /* fp8 stages, then one 16-bit K and V tile that the kernel converts each fp8 tile into */
    const size_t kv_row_chunks = ((size_t)head_dim / 16) | 1;
    return 16 * (row_chunks * ((size_t)cfg->tile_q + 2 * (size_t)cfg->tile_kv) +
                 kv_row_chunks * 2 * (size_t)cfg->stages * cfg->tile_kv);
}

/* What tiles must fit: the larger of the 16-bit and the fp8 kernel's shared memory, so that one
 * choice of tiles serves every K/V dtype (fp8 takes up to 32 bytes per KV row more with 2 stages,
 * less with more). */
static size_t fit_bytes(int head_dim, const cinfer__prefill_config_t *cfg) {
    const size_t half = cinfer__prefill_smem_bytes(head_dim, cfg);
    const size_t fp8 = cinfer__prefill_kv_smem_bytes(head_dim, CINFER__DT_E4M3, cfg);
    return half > fp8 ? half : fp8;
}

/*
 * Register budget first: a warp keeps 16 x D fp32 O accumulators per 16 query rows (D / 2 per
 * lane), plus S (TILE_KV / 2 per lane per 16 rows) and, when they fit, the Q fragments. These
 * compile without local memory for every mask, flag and dtype with NVRTC 13.0 for sm_80 and
 * sm_90a (cuobjdump --dump-resource-usage; registers of the causal bf16 kernel on sm_90a):
 *   D <= 64:  4 warps x 32 rows, KV 32, 3 stages (186);
 *   D <= 128: 4 warps x 32 rows, KV 64, 2 stages (255, two CTAs of 102 KiB per SM);
 *   D <= 256: 4 warps x 16 rows, KV 32, 2 stages (237); 208..240, whose rows take the generic
 *             copy loop, spilled with KV 32 (before the registers were trimmed), so they use KV
 *             16, 3 stages (213).
 * 32 rows per warp halves the K/V shared-memory reads per mma (the D <= 128 default; 8 warps x
 * 16 rows measured 268 against its 374 TFLOP/s at 16k on the H200). It compiles without local
 * memory except for the custom_mask variant's batch kernels (8 bytes, outside the tile loop) and
 * window + LSE at KV 64 in 3 stages;
 * bench_prefill --sweep compares the candidates on the GPU. With rows padded to D / 8 + 1
 * chunks, the D <= 128 default takes 102 KiB (104 KiB with fp8 K/V: fit_bytes), so on sm_86/sm_89
 * (99 KiB) fit_config runs it with KV 32.
 */
static void fit_config(int head_dim, int max_smem, cinfer__prefill_config_t *cfg);

static cinfer__prefill_config_t test_default;
static bool has_test_default;

void cinfer__prefill_test_default_config(const cinfer__prefill_config_t *cfg) {
    has_test_default = cfg != NULL;
    if (cfg)
        test_default = *cfg;
}

void cinfer__prefill_default_config(int head_dim, int max_smem, cinfer__prefill_config_t *cfg) {
    if (has_test_default) {
        *cfg = test_default;
    } else if (head_dim <= 64) {
        *cfg = (cinfer__prefill_config_t){.tile_q = 128, .tile_kv = 32, .warps = 4, .stages = 3};
    } else if (head_dim <= 128) {
        /* 32 query rows per warp (each K/V fragment feeds two m16 tiles), two CTAs per SM. H200,
         * 16k causal / non-causal, D = 128 (bench_prefill --sweep, 2026-11-29): 373.9 / 363.4
         * TFLOP/s against 268.3 / 271.8 for 128 rows on 8 warps in the same run. */
        *cfg = (cinfer__prefill_config_t){.tile_q = 128, .tile_kv = 64, .warps = 4, .stages = 2};
    } else if (head_dim <= 192 || head_dim % 64 == 0) {
        *cfg = (cinfer__prefill_config_t){.tile_q = 64, .tile_kv = 32, .warps = 4, .stages = 2};
    } else {
        *cfg = (cinfer__prefill_config_t){.tile_q = 64, .tile_kv = 16, .warps = 4, .stages = 3};
    }
    fit_config(head_dim, max_smem, cfg);
}

/* Shrinks tiles until they fit max_smem bytes: stages, then KV rows, then query rows. */
static void fit_config(int head_dim, int max_smem, cinfer__prefill_config_t *cfg) {
    while (fit_bytes(head_dim, cfg) > (size_t)max_smem) {
        if (cfg->stages > 2)
            cfg->stages--;
        else if (cfg->tile_kv > 16)
            cfg->tile_kv /= 2;
        else if (cfg->tile_q > 16 * cfg->warps)
            cfg->tile_q /= 2;
        else if (cfg->warps > 1)
            cfg->warps /= 2, cfg->tile_q /= 2;
        else
            break; /* the launch reports it */
    }
}

/*
 * The batch kernels' tiles, ascending in tile_q: 32 rows (two warps) for short queries, 64 rows
 * (four warps) when the default has more, and the default. The small tiles keep 16 rows per warp
 * (the smallest register footprint) and at most the default's KV tile; their KV rows are capped
 * at 32 (two warps) and 64 (four warps) so that several CTAs share an SM: a two-warp CTA of
 * 32 + 2 x 2 x 32 rows at D = 128 takes 40 KiB, five per SM. NVRTC 13.0 for sm_90a spills
 * one-warp CTAs (16 rows) at D >= 144, and two-warp CTAs with 32 KV rows at D >= 192 (the
 * unrolled copy loops of few threads keep many row addresses live), so two warps are the smallest
 * tile, and above D = 128 it streams 16 KV rows in 3 stages (233..252 registers, no spill).
 */
void cinfer__prefill_batch_configs(int head_dim, int max_smem, cinfer__prefill_config_t *cfgs,
                                   int *num) {
    cinfer__prefill_config_t large;
    cinfer__prefill_default_config(head_dim, max_smem, &large);
    int n = 0;
    const bool wide = head_dim > 128;
    cfgs[n] = (cinfer__prefill_config_t){.tile_q = 32,
                                         .tile_kv = wide                 ? 16
                                                    : large.tile_kv < 32 ? large.tile_kv
                                                                         : 32,
                                         .warps = 2,
                                         .stages = wide ? 3 : large.stages};
    fit_config(head_dim, max_smem, &cfgs[n++]);
    if (large.tile_q > 64) {
        cfgs[n] = (cinfer__prefill_config_t){.tile_q = 64,
                                             .tile_kv = large.tile_kv < 64 ? large.tile_kv : 64,
                                             .warps = 4,
                                             .stages = large.stages};
        fit_config(head_dim, max_smem, &cfgs[n++]);
    }
    if (large.tile_q > 32)
        cfgs[n++] = large;
    *num = n;
}

/* The default tiles on a device allowing max_smem_optin bytes of shared memory per block. */
static void device_config(int head_dim, int max_smem_optin, cinfer__prefill_config_t *cfg) {
    cinfer__prefill_default_config(head_dim, max_smem_optin - STATIC_SMEM_RESERVE, cfg);
}

void cinfer__prefill_context_config(const cinfer_context_t *ctx, int head_dim,
                                    cinfer__prefill_config_t *cfg) {
    device_config(head_dim, ctx->max_smem_per_block_optin, cfg);
}

/* ---- spec ---- */

/* The kernel's spec for checked options, a causal flag, tiles and GQA packing (group: the query
 * heads a CTA packs into its rows, batch kernels only; 1 = none). */
static cinfer_status_t build_spec(const cinfer_attention_options_t *o, int causal, bool batch,
                                  bool paged, const cinfer__prefill_config_t *cfg, int group,
                                  cinfer__spec_t *spec) {
    const cinfer__dtype_t dtype = cinfer__dl_dtype(o->q_dtype);
    cinfer__spec_init(spec, CINFER__OP_PREFILL);
    spec->backend = cfg->sm90 ? CINFER__BACKEND_SM90 : CINFER__BACKEND_SM80;
    spec->batch = batch;
    spec->paged = paged;
    spec->dtype_q = spec->dtype_o = dtype;
    spec->dtype_kv = cinfer__dl_dtype(o->kv_dtype);
    spec->head_dim_qk = (int32_t)o->head_dim;
    spec->head_dim_vo = (int32_t)cinfer__attention_head_dim_vo(o);
    spec->mask = causal ? CINFER__MASK_CAUSAL : CINFER__MASK_NONE;
    spec->pos = cinfer__attention_rope(o) ? CINFER__POS_ROPE_LLAMA : CINFER__POS_NONE;
    spec->flags = (o->logits_soft_cap > 0 ? CINFER__FLAG_SOFT_CAP : 0) |
                  (o->window_left >= 0 ? CINFER__FLAG_WINDOW : 0);
    spec->tile_q = cfg->tile_q;
    spec->tile_kv = cfg->tile_kv;
    spec->warps = cfg->warps;
    spec->stages = cfg->stages;
    spec->gqa_pack = group > 1 ? group : 0;
    spec->variant = o->variant;
    spec->variant_id = cinfer__variant_id(o->variant);
    return cinfer__spec_validate(spec);
}

/*
 * The spec of the kernel cinfer_single_prefill loads for these options and causal flag with the
 * default tiles of a device allowing max_smem_optin bytes of shared memory per block (it may take
 * others by the grid: cinfer__prefill_single_specs lists them all, which ahead-of-time builds
 * compile). Validates the options.
 */
cinfer_status_t cinfer__prefill_kernel_spec(const cinfer_attention_options_t *o, int causal,
                                            int max_smem_optin, cinfer__spec_t *spec) {
    CINFER__CHECK(options_check(o));
    if (causal != 0 && causal != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "causal = %d, expected 0 or 1",
                             causal);
    cinfer__prefill_config_t cfg;
    device_config(tile_dim(o), max_smem_optin, &cfg);
    return build_spec(o, causal, false, false, &cfg, 1, spec);
}

/* Single prefill's candidate tiles on a device allowing max_smem_optin bytes of shared memory per
 * block: tiles[0] the default (the largest of batch prefill's candidates) and, when there is one,
 * tiles[1] the next smaller, which choose_single takes for short grids. Returns 1 or 2. */
static int single_tiles(int head_dim, int max_smem_optin, cinfer__prefill_config_t tiles[2]) {
    cinfer__prefill_config_t cands[CINFER__PREFILL_MAX_TILES];
    int n = 0;
    cinfer__prefill_batch_configs(head_dim, max_smem_optin - STATIC_SMEM_RESERVE, cands, &n);
    tiles[0] = cands[n - 1];
    if (n < 2)
        return 1;
    tiles[1] = cands[n - 2];
    return 2;
}

/*
 * Single prefill's turn-taking tiles (kernels/prefill.cu, PINGPONG): 256 query rows on eight warps
 * whose two groups take turns at P V, one CTA per SM. Taken at D = 128 with 16-bit K/V, without
 * in-kernel RoPE and without soft cap, for grids of at least two waves (choose_single). H200, 16k
 * causal / non-causal (bench_prefill --tile, 2026-11-30): 400-404 / 389-393 TFLOP/s against
 * 369-383 / 370-376 for the default tiles in the same runs; the soft cap kernel lost (272-299
 * against 331-343).
 */
static const cinfer__prefill_config_t turn_tiles = {
    .tile_q = 256, .tile_kv = 64, .warps = 8, .stages = 4};

size_t cinfer__prefill_sm90_smem_bytes(int head_dim, int head_dim_vo,
                                       const cinfer__prefill_config_t *cfg) {
    return cinfer__spec_sm90_prefill_smem(head_dim, head_dim_vo, cfg->tile_q, cfg->tile_kv,
                                          cfg->stages);
}

/* The dynamic shared memory of tiles cfg for options of head dims head_dim / head_dim_vo and K/V
 * of kv_dtype: the sm90 kernel's rows have each matrix's own head dim, the sm80 kernel's the larger
 * of the two (tile_dim). */
static size_t tile_smem(int head_dim, int head_dim_vo, cinfer__dtype_t kv_dtype,
                        const cinfer__prefill_config_t *cfg) {
    if (cfg->sm90)
        return cinfer__prefill_sm90_smem_bytes(head_dim, head_dim_vo, cfg);
    return cinfer__prefill_kv_smem_bytes(head_dim > head_dim_vo ? head_dim : head_dim_vo, kv_dtype,
                                         cfg);
}

void cinfer__prefill_turn_config(cinfer__prefill_config_t *cfg) {
    *cfg = turn_tiles;
}

/*
 * The sm90 single-prefill kernel (kernels/prefill_sm90.cuh): two consumer warpgroups of 64 query
 * rows on wgmma, a producer warpgroup issuing TMA copies, KV tiles of 128 rows in 3 stages (225 KiB
 * of shared memory at D = 128, one CTA per SM; at D = 256, whose O takes 128 registers per thread,
 * KV tiles of 64 rows in 2 stages, 193 KiB; at D_qk / D_vo = 192 / 128 KV tiles of 128 rows in 2
 * stages, 209 KiB). Taken on sm_90a at D = 64, 128 or 256, or 192 / 128, with 16-bit q and out
 * of one dtype and K/V of it or fp8 e4m3 / e5m2 (fp8 not at 192 / 128), no RoPE, and default
 * attention (soft cap and window included) or a variant of ALiBi slopes, masks in row form
 * (custom_mask) and state inits only (CINFER__VARIANT_SM90; not with a soft cap), when its grid
 * fills a wave (choose_single) and the tensors suit TMA (tma_ok). H200, S = 16k causal / non-causal
 * (bench_prefill --tile, 2026-11-30): 3 stages 679.8 / 685.7 TFLOP/s, 2 stages 542.2 / 495.6, one
 * consumer warpgroup (64 rows) 386.8 / 369.1; the sm80 turn-taking tiles 401.6 / 390.3 in the same
 * call.
 */
static cinfer__prefill_config_t sm90_config(int head_dim, int head_dim_vo) {
    if (head_dim == 192 && head_dim_vo == 128) /* two stages of 80 KiB and a Q tile of 48 */
        return (cinfer__prefill_config_t){
            .tile_q = 128, .tile_kv = 128, .warps = 8, .stages = 2, .sm90 = true};
    if (head_dim > 128)
        return (cinfer__prefill_config_t){
            .tile_q = 128, .tile_kv = 64, .warps = 8, .stages = 2, .sm90 = true};
    return (cinfer__prefill_config_t){
        .tile_q = 128, .tile_kv = 128, .warps = 8, .stages = 3, .sm90 = true};
}

void cinfer__prefill_sm90_config(int head_dim, int head_dim_vo, cinfer__prefill_config_t *cfg) {
    *cfg = sm90_config(head_dim, head_dim_vo);
}

static bool test_no_sm90;

void cinfer__prefill_test_no_sm90(bool on) {
    test_no_sm90 = on;
}

static bool takes_sm90(const char *arch, const cinfer_attention_options_t *o) {
    const bool soft_cap = o->logits_soft_cap > 0;
    const int vo = cinfer__attention_head_dim_vo(o);
    const cinfer__dtype_t kv = cinfer__dl_dtype(o->kv_dtype);
    return !test_no_sm90 && strcmp(arch, "sm_90a") == 0 &&
           (((o->head_dim == 64 || o->head_dim == 128 || o->head_dim == 256) &&
             vo == o->head_dim) ||
            (o->head_dim == 192 && vo == 128 && !is_fp8(kv))) &&
           (kv == cinfer__dl_dtype(o->q_dtype) || is_fp8(kv)) && !cinfer__attention_rope(o) &&
           (!o->variant || (!soft_cap && (o->variant->hooks & CINFER__VARIANT_SM90)));
}

/* Whether the sm90 kernel copies this K/V storage: a ragged K/V, or pages of a power of two of 8
 * to 256 rows (a tile's pages as whole boxes at 1024-byte multiples, or a longer page in parts). */
static bool sm90_pages_ok(bool paged, int page_size) {
    return !paged || (page_size >= 8 && page_size <= 256 && (page_size & (page_size - 1)) == 0);
}

/* Whether TMA can copy boxes of tensor t (checked by check_aligned: a 16-byte aligned address and
 * 16-byte multiples as strides): its strides must also be positive. */
static bool tma_ok(const DLTensor *t) {
    for (int i = 0; i < t->ndim - 1; i++)
        if (t->shape[i] > 1 && cinfer__tensor_stride(t, i) <= 0)
            return false;
    return true;
}

/*
 * A TMA tensor map of `rank` dims of 16-bit elements (dtype) at base: dims[0] the head dim
 * (contiguous), strides[i] the element stride of dims[i + 1] (a dim of one index may have any, so
 * it takes the row's), boxes of box[] with the 128-byte swizzle (fp8 K/V: bytes, unswizzled;
 * KV_FP8 in kernels/prefill_sm90.cuh); positions past the tensor read as zeros. UNSUPPORTED when a
 * stride is not a positive multiple of 16 bytes.
 */
static cinfer_status_t encode_map(cinfer_context_t *ctx, unsigned long long *map, const void *base,
                                  cinfer__dtype_t dtype, int rank, const int64_t *dims,
                                  const int64_t *strides, const uint32_t *box, const char *what) {
    const int64_t esz = (int64_t)cinfer__dtype_size(dtype);
    cuuint64_t gdims[5], gstrides[4];
    cuuint32_t gbox[5], elem_strides[5];
    for (int i = 0; i < rank; i++) {
        gdims[i] = (cuuint64_t)(dims[i] > 0 ? dims[i] : 1);
        gbox[i] = box[i];
        elem_strides[i] = 1;
        if (i == 0)
            continue;
        const int64_t bytes = dims[i] > 1 ? strides[i - 1] * esz : dims[0] * esz;
        if (bytes <= 0 || bytes % 16 != 0)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "%s: stride %lld bytes; the sm90 prefill kernel's copies need "
                                 "positive multiples of 16",
                                 what, (long long)bytes);
        gstrides[i - 1] = (cuuint64_t)bytes;
    }
    /* fp8 K/V as unswizzled bytes (the kernel converts them: KV_FP8, kernels/prefill_sm90.cuh) */
    const CUtensorMapDataType dt = is_fp8(dtype)              ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : dtype == CINFER__DT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CINFER__CU(ctx->cu,
               cuTensorMapEncodeTiled(
                   (CUtensorMap *)map, dt, (cuuint32_t)rank, (void *)base, gdims, gstrides, gbox,
                   elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   is_fp8(dtype) ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
               what);
    return CINFER_STATUS_SUCCESS;
}

/* The map of a 3-d tensor t as (D, rows, heads): rows dim rows_dim, heads dim heads_dim of t, in
 * boxes of 64 x box_rows x 1; fp8 (D, 1, rows, heads) in boxes of 64 x 2 x box_rows x 1. */
static cinfer_status_t encode_tma(cinfer_context_t *ctx, unsigned long long *map, const DLTensor *t,
                                  int rows_dim, int heads_dim, int box_rows, const char *what) {
    const cinfer__dtype_t dtype = cinfer__tensor_dtype(t);
    if (is_fp8(dtype)) {
        /* (D, 1, rows, heads) in boxes of 64 x 2 x rows x 1: a row's 64 bytes and 64 zeros (the
         * middle dim's other index is out of bounds; the kernel starts odd column blocks at -1 at
         * D = 128 and 256, zeros first), the 128 bytes its fp16 row will take */
        const int64_t dims[4] = {t->shape[2], 1, t->shape[rows_dim], t->shape[heads_dim]};
        const int64_t strides[3] = {t->shape[2], cinfer__tensor_stride(t, rows_dim),
                                    cinfer__tensor_stride(t, heads_dim)};
        const uint32_t box[4] = {64, 2, (uint32_t)box_rows, 1};
        return encode_map(ctx, map, cinfer__tensor_data(t), dtype, 4, dims, strides, box, what);
    }
    const int64_t dims[3] = {t->shape[2], t->shape[rows_dim], t->shape[heads_dim]};
    const int64_t strides[2] = {cinfer__tensor_stride(t, rows_dim),
                                cinfer__tensor_stride(t, heads_dim)};
    const uint32_t box[3] = {64, (uint32_t)box_rows, 1};
    return encode_map(ctx, map, cinfer__tensor_data(t), dtype, 3, dims, strides, box, what);
}

static bool takes_turns(const cinfer_attention_options_t *o) {
    return o->head_dim == 128 && cinfer__attention_head_dim_vo(o) == 128 &&
           !is_fp8(cinfer__dl_dtype(o->kv_dtype)) && !cinfer__attention_rope(o) &&
           !(o->logits_soft_cap > 0);
}

/* Whether options o take the turn-taking tiles and their dynamic shared memory fits a block of a
 * device allowing max_smem_optin bytes (with the static reserve). */
static bool turn_tiles_fit(const cinfer_attention_options_t *o, int max_smem_optin) {
    return takes_turns(o) &&
           cinfer__prefill_smem_bytes(o->head_dim, &turn_tiles) + STATIC_SMEM_RESERVE <=
               (size_t)max_smem_optin;
}

cinfer_status_t cinfer__prefill_single_specs(const cinfer_attention_options_t *o, int causal,
                                             const char *arch, int max_smem_optin,
                                             cinfer__spec_t *specs, int *count) {
    *count = 0;
    CINFER__CHECK(cinfer__prefill_kernel_spec(o, causal, max_smem_optin, &specs[0]));
    *count = 1;
    cinfer__prefill_config_t tiles[2];
    if (single_tiles(tile_dim(o), max_smem_optin, tiles) == 2) {
        CINFER__CHECK(build_spec(o, causal, false, false, &tiles[1], 1, &specs[*count]));
        ++*count;
    }
    if (turn_tiles_fit(o, max_smem_optin)) {
        CINFER__CHECK(build_spec(o, causal, false, false, &turn_tiles, 1, &specs[*count]));
        ++*count;
    }
    const int vo = cinfer__attention_head_dim_vo(o);
    const cinfer__prefill_config_t sm90 = sm90_config(o->head_dim, vo);
    if (takes_sm90(arch, o) &&
        cinfer__prefill_sm90_smem_bytes(o->head_dim, vo, &sm90) + STATIC_SMEM_RESERVE <=
            (size_t)max_smem_optin) {
        CINFER__CHECK(build_spec(o, causal, false, false, &sm90, 1, &specs[*count]));
        ++*count;
    }
    return CINFER_STATUS_SUCCESS;
}

/* ---- tensors ---- */

/* One tensor argument: NULL, ndim, dtype, shape with -1 = any (`origin` says where the expected
 * shape comes from), then contiguity of the last dim, data and device; every error
 * INVALID_ARGUMENT. */
static cinfer_status_t check_tensor(const cinfer_context_t *ctx, const char *arg, const DLTensor *t,
                                    int ndim, const int64_t *shape, cinfer__dtype_t dtype,
                                    const char *origin) {
    return cinfer__tensor_check_as(ctx, arg, t, ndim, shape, dtype, CINFER_STATUS_INVALID_ARGUMENT,
                                   CINFER_STATUS_INVALID_ARGUMENT, origin);
}

/*
 * The kernel moves rows in 16-byte pieces (cp.async, vector stores): the data address and the
 * byte stride of every dim that has more than one index must keep rows on 16-byte boundaries.
 */
cinfer_status_t cinfer__prefill_check_aligned(const char *arg, const DLTensor *t) {
    const int64_t esz = (int64_t)cinfer__dtype_size(cinfer__tensor_dtype(t));
    const uintptr_t addr = (uintptr_t)cinfer__tensor_data(t);
    if (addr % 16 != 0)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: data address %p is not 16-byte aligned; prefill moves rows in "
                             "16-byte pieces",
                             arg, (void *)addr);
    for (int i = 0; i < t->ndim - 1; i++) {
        const int64_t stride = cinfer__tensor_stride(t, i);
        if (t->shape[i] > 1 && (stride * esz) % 16 != 0)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "%s: stride of dim %d is %lld elements (%lld bytes), not a "
                                 "multiple of 16 bytes; prefill moves rows in 16-byte pieces",
                                 arg, i, (long long)stride, (long long)(stride * esz));
    }
    return CINFER_STATUS_SUCCESS;
}

static cinfer_status_t check_len(const char *what, int64_t len) {
    if (len > CINFER_PREFILL_MAX_LEN)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s = %lld is not supported by prefill (at most 2^30 - 1)", what,
                             (long long)len);
    return CINFER_STATUS_SUCCESS;
}

/* The kernel parameters of q [n, Hq, D], out (same shape) and lse [n, Hq] (NULL: not written). */
static void set_q_out_lse(cinfer_prefill_params *p, const DLTensor *q, const DLTensor *out,
                          const DLTensor *lse) {
    p->q = cinfer__tensor_data(q);
    p->q_stride_n = cinfer__tensor_step(q, 0);
    p->q_stride_h = cinfer__tensor_step(q, 1);
    p->out = cinfer__tensor_data(out);
    p->out_stride_n = cinfer__tensor_step(out, 0);
    p->out_stride_h = cinfer__tensor_step(out, 1);
    if (lse) {
        p->lse = cinfer__tensor_data(lse);
        p->lse_stride_n = cinfer__tensor_step(lse, 0);
        p->lse_stride_h = cinfer__tensor_step(lse, 1);
    }
}

/* The copy cursors' step from one KV tile to the next (ragged K/V; paged kernels ignore it). */
static void set_tile_bytes(cinfer_prefill_params *p, int tile_kv, cinfer__dtype_t kv_dtype) {
    const long long esz = (long long)cinfer__dtype_size(kv_dtype);
    p->k_tile_bytes = tile_kv * p->k_stride_n * esz;
    p->v_tile_bytes = tile_kv * p->v_stride_n * esz;
}

/*
 * The scale fields of the params (ops/options.h); v_scale multiplies the output. With fp8 K/V the
 * kernel multiplies q by q_in_scale = sm_scale as it converts it to fp16 (the mmas' dtype), which
 * q_scale then leaves out. The sm80 template's e4m3 fragments hold K/V / 256 (kernels/prefill.cu),
 * which q_scale and v_scale put back; the sm90 kernel's hold e4m3 K/V exactly (exact_e4m3: KV_FP8
 * in kernels/prefill_sm90.cuh).
 */
static void set_scales(const cinfer_attention_options_t *o, bool exact_e4m3,
                       cinfer_prefill_params *p) {
    double sm_scale, q_scale, v_scale = o->v_scale;
    cinfer__attention_logit_scales(o, &sm_scale, &q_scale, &p->soft_cap_log2);
    const cinfer__dtype_t kv = cinfer__dl_dtype(o->kv_dtype);
    p->q_in_scale = 1.0f;
    if (is_fp8(kv)) {
        p->q_in_scale = (float)sm_scale;
        q_scale /= (double)p->q_in_scale;
    }
    if (kv == CINFER__DT_E4M3 && !exact_e4m3) {
        q_scale *= 256.0;
        v_scale *= 256.0;
    }
    p->q_scale = (float)q_scale;
    p->v_scale = (float)v_scale;
    /* The soft cap's fixed softmax maximum m (kernels/prefill.cu, SOFTCAP_FIXED_MAX): P = 2^(x - m)
     * for x in [-2 cap2, 0] stays within [2^lo, 2^hi], normal numbers of the mmas' dtype with room
     * for the sums: bf16 [2^-96, 2^32], fp16 (fp16 q, or fp8 K/V) [2^-14, 2^15]. m = min(0, -lo -
     * 2 cap2), the largest m <= 0 with 2^(-2 cap2 - m) >= 2^lo (P <= 1 where the cap allows); caps
     * with -m > hi keep the running maximum (bf16: cap2 <= 64, a cap up to 44.3; fp16: cap2
     * <= 14.5, a cap up to 10). */
    const bool bf16_p = cinfer__dl_dtype(o->q_dtype) == CINFER__DT_BF16 && !is_fp8(kv);
    const double lo = bf16_p ? -96.0 : -14.0, hi = bf16_p ? 32.0 : 15.0;
    const double width = 2.0 * p->soft_cap_log2, m = -lo - width < 0.0 ? -lo - width : 0.0;
    p->soft_cap_fixed = p->soft_cap_log2 > 0.0f && -m <= hi;
    p->soft_cap_max = p->soft_cap_fixed ? (float)m : 0.0f;
}

/* Checks a loaded kernel's shared memory (smem dynamic bytes for tiles cfg) against the device
 * and opts it in to that much. Activates the context. */
static cinfer_status_t prepare_kernel(cinfer_context_t *ctx, const cinfer__kernel_t *kernel,
                                      const cinfer__prefill_config_t *cfg, size_t smem) {
    CINFER__CHECK(cinfer__context_activate(ctx));
    /* Static shared memory the toolchain reserves (1 KiB on sm_90a) counts against the same
     * per-block limit. */
    int static_smem = 0;
    CINFER__CU(
        ctx->cu,
        cuFuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel->function),
        "querying the prefill kernel's static shared memory");
    if (smem + (size_t)static_smem > (size_t)ctx->max_smem_per_block_optin)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "prefill tiles (tile_q %d, tile_kv %d, stages %d) need %zu + %d bytes "
                             "of shared memory; the device allows %d per block",
                             cfg->tile_q, cfg->tile_kv, cfg->stages, smem, static_smem,
                             ctx->max_smem_per_block_optin);
    /* Above 48 KiB a kernel must opt in to its dynamic shared memory. */
    CINFER__CU(ctx->cu,
               cuFuncSetAttribute(kernel->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  (int)smem),
               "setting the prefill kernel's shared memory size");
    return CINFER_STATUS_SUCCESS;
}

/* Loads (compiling on first use) the single prefill kernel of tiles cfg and opts it in to its
 * shared memory; UNSUPPORTED when the tiles do not fit the device. The kernel is loaded even when
 * there is nothing to do, so a configuration error shows up on the first call, not on the first
 * non-empty one. */
static cinfer_status_t load_single(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                                   int causal, const cinfer__prefill_config_t *cfg,
                                   cinfer__kernel_t *kernel, size_t *smem) {
    *smem = tile_smem(o->head_dim, cinfer__attention_head_dim_vo(o), cinfer__dl_dtype(o->kv_dtype),
                      cfg);
    if (*smem > (size_t)ctx->max_smem_per_block_optin)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "prefill tiles (tile_q %d, tile_kv %d, stages %d) need %zu bytes of "
                             "shared memory; the device allows %d per block",
                             cfg->tile_q, cfg->tile_kv, cfg->stages, *smem,
                             ctx->max_smem_per_block_optin);
    cinfer__spec_t spec;
    CINFER__CHECK(build_spec(o, causal, false, false, cfg, 1, &spec));
    CINFER__CHECK(cinfer__jit_kernel(ctx, &spec, kernel));
    return prepare_kernel(ctx, kernel, cfg, *smem);
}

/* The CTAs to launch for a grid of `items` work items: the sm90 kernel is persistent (one CTA per
 * SM, each looping over items; kernels/prefill_sm90.cuh), the sm80 one takes an item per CTA. */
static int64_t persistent_grid(const cinfer_context_t *ctx, const cinfer__prefill_config_t *cfg,
                               int64_t items) {
    return cfg->sm90 && items > (int64_t)ctx->num_sms ? (int64_t)ctx->num_sms : items;
}

/* Resident CTAs of a loaded prefill kernel on the whole device. */
static cinfer_status_t resident_ctas(cinfer_context_t *ctx, const cinfer__kernel_t *kernel,
                                     const cinfer__prefill_config_t *cfg, size_t smem,
                                     int64_t *ctas) {
    int per_sm = 0;
    CINFER__CU(ctx->cu,
               cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel->function,
                                                           cinfer__prefill_threads(cfg), smem),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor (prefill kernel)");
    *ctas = (int64_t)ctx->num_sms * per_sm;
    return CINFER_STATUS_SUCCESS;
}

/* Loads the kernel of tiles cfg and counts its resident CTAs with errors muted: a candidate that
 * cannot be had (its shared memory, no JIT and not in the AOT bundle, an occupancy query that
 * fails) is a choice not taken, not a failure of the call, and leaves the last error alone. */
static bool try_single(cinfer_context_t *ctx, const cinfer_attention_options_t *o, int causal,
                       const cinfer__prefill_config_t *cfg, cinfer__kernel_t *kernel, size_t *smem,
                       int64_t *slots) {
    cinfer__error_mute();
    cinfer_status_t st = load_single(ctx, o, causal, cfg, kernel, smem);
    if (st == CINFER_STATUS_SUCCESS)
        st = resident_ctas(ctx, kernel, cfg, *smem, slots);
    cinfer__error_unmute();
    return st == CINFER_STATUS_SUCCESS;
}

/* Single prefill's tiles: the turn-taking tiles where takes_turns allows them and their grid is
 * two waves or more; else the default (the largest of batch prefill's candidates) unless its grid
 * is under two waves and the next smaller candidate finishes sooner by
 * cinfer__prefill_single_tile's estimate (a short causal prompt, a short query over a long KV);
 * when the preferred kernel cannot be had (no JIT and not in the AOT bundle) the next choice. */
static cinfer_status_t choose_single(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                                     int causal, int32_t qo_len, int32_t kv_len, bool tma,
                                     cinfer__prefill_config_t *cfg, cinfer__kernel_t *kernel,
                                     size_t *smem) {
    const cinfer__prefill_config_t sm90 =
        sm90_config(o->head_dim, cinfer__attention_head_dim_vo(o));
    const int64_t sm90_grid = ((int64_t)qo_len + sm90.tile_q - 1) / sm90.tile_q * o->num_qo_heads;
    if (tma && takes_sm90(ctx->arch, o) && sm90_grid >= (int64_t)ctx->num_sms) {
        /* The sm90 kernel for grids of a wave or more; where it cannot be had (no JIT and not in
         * the AOT bundle), the choices below. */
        int64_t slots = 0;
        if (try_single(ctx, o, causal, &sm90, kernel, smem, &slots) && slots > 0) {
            *cfg = sm90;
            return CINFER_STATUS_SUCCESS;
        }
    }
    const int64_t turn_grid =
        ((int64_t)qo_len + turn_tiles.tile_q - 1) / turn_tiles.tile_q * o->num_qo_heads;
    if (takes_turns(o) && turn_grid >= 2 * (int64_t)ctx->num_sms) {
        /* The turn-taking tiles for grids of two waves or more (at least one CTA per SM, so no
         * shorter grid loads them); where they cannot be had (their shared memory with a
         * variant's static buffers, no JIT and not in the AOT bundle), the choice below. */
        cinfer__kernel_t turn_kernel;
        size_t turn_smem;
        int64_t turn_slots = 0;
        if (try_single(ctx, o, causal, &turn_tiles, &turn_kernel, &turn_smem, &turn_slots) &&
            turn_slots > 0 && turn_grid >= 2 * turn_slots) {
            *cfg = turn_tiles;
            *kernel = turn_kernel;
            *smem = turn_smem;
            return CINFER_STATUS_SUCCESS;
        }
    }
    cinfer__prefill_config_t tiles[2];
    const int n = single_tiles(tile_dim(o), ctx->max_smem_per_block_optin, tiles);
    *cfg = tiles[0];
    CINFER__CHECK(load_single(ctx, o, causal, cfg, kernel, smem));
    if (n < 2 || qo_len == 0)
        return CINFER_STATUS_SUCCESS;
    int64_t slots[2];
    CINFER__CHECK(resident_ctas(ctx, kernel, cfg, *smem, &slots[1]));
    const int64_t grid = ((int64_t)qo_len + cfg->tile_q - 1) / cfg->tile_q * o->num_qo_heads;
    if (grid >= 2 * slots[1])
        return CINFER_STATUS_SUCCESS;
    const cinfer__prefill_config_t small = tiles[1];
    cinfer__kernel_t small_kernel;
    size_t small_smem;
    /* A smaller kernel that cannot be had (loaded, or its occupancy known) leaves the default. */
    if (!try_single(ctx, o, causal, &small, &small_kernel, &small_smem, &slots[0]))
        return CINFER_STATUS_SUCCESS;
    cinfer__prefill_plan_config_t pc;
    memset(&pc, 0, sizeof pc);
    pc.num_qo_heads = o->num_qo_heads;
    pc.causal = causal != 0;
    pc.window_left = o->window_left;
    pc.num_tiles = 2;
    pc.tile_q[0] = small.tile_q;
    pc.tile_kv[0] = small.tile_kv;
    pc.tile_q[1] = cfg->tile_q;
    pc.tile_kv[1] = cfg->tile_kv;
    if (cinfer__prefill_single_tile(&pc, qo_len, kv_len, slots) == 0) {
        *cfg = small;
        *kernel = small_kernel;
        *smem = small_smem;
    }
    return CINFER_STATUS_SUCCESS;
}

/* ---- the call ---- */

/* Single prefill's checks of its context, options and causal flag. */
static cinfer_status_t single_option_checks(const cinfer_context_t *ctx,
                                            const cinfer_attention_options_t *o, int causal) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    CINFER__CHECK(options_check(o));
    if (causal != 0 && causal != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "causal = %d, expected 0 or 1",
                             causal);
    return CINFER_STATUS_SUCCESS;
}

/* Single prefill's argument checks (everything but the variant's arguments); its lengths. */
static cinfer_status_t single_checks(const cinfer_context_t *ctx,
                                     const cinfer_attention_options_t *o, int causal,
                                     const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                     const DLTensor *out, const DLTensor *lse, int64_t *qo_len_out,
                                     int64_t *kv_len_out) {
    CINFER__CHECK(single_option_checks(ctx, o, causal));
    const cinfer__dtype_t dtype = cinfer__dl_dtype(o->q_dtype);
    const cinfer__dtype_t kv_dtype = cinfer__dl_dtype(o->kv_dtype);
    const int64_t Hq = o->num_qo_heads, Hk = o->num_kv_heads, D = o->head_dim;
    const bool nhd = o->kv_layout == CINFER_KV_LAYOUT_NHD;

    const int64_t q_shape[3] = {-1, Hq, D};
    const char *q_origin = "[qo_len, num_qo_heads, head_dim]: heads and head_dim from the options";
    CINFER__CHECK(check_tensor(ctx, "q", q, 3, q_shape, dtype, q_origin));
    const int64_t qo_len = q->shape[0];
    CINFER__CHECK(check_len("qo_len", qo_len));
    const int64_t k_shape[3] = {nhd ? -1 : Hk, nhd ? Hk : -1, D};
    const char *k_origin = nhd ? "NHD [kv_len, num_kv_heads, head_dim] from the options"
                               : "HND [num_kv_heads, kv_len, head_dim] from the options";
    CINFER__CHECK(check_tensor(ctx, "k", k, 3, k_shape, kv_dtype, k_origin));
    const int64_t kv_len = k->shape[nhd ? 0 : 1];
    CINFER__CHECK(check_len("kv_len", kv_len));
    CINFER__CHECK(cinfer__attention_rope_lens(o, qo_len, kv_len, "cinfer_single_prefill"));
    const int64_t Dvo = cinfer__attention_head_dim_vo(o);
    const int64_t v_shape[3] = {k->shape[0], k->shape[1], Dvo}; /* k's, but for D_vo */
    CINFER__CHECK(
        check_tensor(ctx, "v", v, 3, v_shape, kv_dtype,
                     Dvo == D ? "k's shape" : "k's shape with head_dim_vo from the options"));
    const int64_t out_shape[3] = {qo_len, Hq, Dvo};
    CINFER__CHECK(
        check_tensor(ctx, "out", out, 3, out_shape, dtype,
                     Dvo == D ? "q's shape" : "q's shape with head_dim_vo from the options"));
    CINFER__CHECK(cinfer__variant_lse_check(o->variant, lse, "cinfer_single_prefill"));
    if (lse) {
        const int64_t lse_shape[2] = {qo_len, Hq};
        CINFER__CHECK(check_tensor(ctx, "lse", lse, 2, lse_shape, CINFER__DT_F32,
                                   "[qo_len, num_qo_heads] from q"));
        CINFER__CHECK(cinfer__tensor_check_distinct("lse", lse));
    }
    CINFER__CHECK(cinfer__prefill_check_aligned("q", q));
    CINFER__CHECK(cinfer__prefill_check_aligned("k", k));
    CINFER__CHECK(cinfer__prefill_check_aligned("v", v));
    CINFER__CHECK(cinfer__prefill_check_aligned("out", out));
    CINFER__CHECK(cinfer__tensor_check_distinct("out", out));
    const cinfer__tensor_arg_t tensors[] = {{"out", out, false},
                                            {"lse", lse, false},
                                            {"q", q, false},
                                            {"k", k, false},
                                            {"v", v, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    *qo_len_out = qo_len;
    *kv_len_out = kv_len;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t
cinfer__single_prefill_config(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                              int causal, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                              DLTensor *out, DLTensor *lse, const cinfer_args_t *args,
                              const cinfer__prefill_config_t *tiles, CUstream stream) {
    int64_t qo_len = 0, kv_len = 0;
    CINFER__CHECK(single_checks(ctx, o, causal, q, k, v, out, lse, &qo_len, &kv_len));
    const int64_t Hq = o->num_qo_heads, Hk = o->num_kv_heads;
    const bool nhd = o->kv_layout == CINFER_KV_LAYOUT_NHD;
    const cinfer__dtype_t kv_dtype = cinfer__dl_dtype(o->kv_dtype);

    cinfer__prefill_config_t cfg;
    cinfer__kernel_t kernel;
    size_t smem;
    if (tiles) {
        cfg = *tiles;
        if (cfg.sm90 && !(tma_ok(q) && tma_ok(k) && tma_ok(v)))
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "the sm90 prefill kernel needs positive strides of q, k and v");
        CINFER__CHECK(load_single(ctx, o, causal, &cfg, &kernel, &smem));
    } else {
        CINFER__CHECK(choose_single(ctx, o, causal, (int32_t)qo_len, (int32_t)kv_len,
                                    tma_ok(q) && tma_ok(k) && tma_ok(v), &cfg, &kernel, &smem));
    }
    unsigned char variant_blob[CINFER__VARIANT_MAX_BYTES];
    size_t variant_bytes = 0;
    CINFER__CHECK(cinfer__variant_pack(o->variant, args, o->num_qo_heads, 1, ctx,
                                       "cinfer_single_prefill", variant_blob, &variant_bytes));
    CINFER__CHECK(cinfer__variant_check_disjoint(o->variant, args, out, lse));

    const int64_t num_q_tiles = (qo_len + cfg.tile_q - 1) / cfg.tile_q;
    const int64_t blocks = num_q_tiles * Hq;
    if (blocks > 0x7fffffff)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "qo_len = %lld x num_qo_heads = %lld needs %lld CTAs, more than one "
                             "launch allows (2^31 - 1)",
                             (long long)qo_len, (long long)Hq, (long long)blocks);
    if (blocks == 0)
        return CINFER_STATUS_SUCCESS;

    cinfer_prefill_params p;
    memset(&p, 0, sizeof p);
    set_q_out_lse(&p, q, out, lse);
    p.k = cinfer__tensor_data(k);
    p.v = cinfer__tensor_data(v);
    p.k_stride_n = cinfer__tensor_step(k, nhd ? 0 : 1);
    p.k_stride_h = cinfer__tensor_step(k, nhd ? 1 : 0);
    p.v_stride_n = cinfer__tensor_step(v, nhd ? 0 : 1);
    p.v_stride_h = cinfer__tensor_step(v, nhd ? 1 : 0);
    p.qo_len = (int)qo_len;
    p.kv_len = (int)kv_len;
    p.num_qo_heads = (int)Hq;
    p.num_kv_heads = (int)Hk;
    p.num_q_tiles = (int)num_q_tiles;
    /* A window of kv_len or more masks nothing (p_i - w < 0 for every row), so clamping keeps
     * p_i - w inside an int. */
    p.window_left =
        o->window_left < 0 ? 0 : (o->window_left > kv_len ? (int)kv_len : o->window_left);

    set_scales(o, cfg.sm90, &p);
    set_tile_bytes(&p, cfg.tile_kv, kv_dtype);
    cinfer_pos_rope_params rope;
    cinfer__attention_rope_params(o, &rope);
    /* The RoPE frequency table is the third parameter of RoPE kernels only; the driver reads as
     * many entries as the kernel has parameters. */
    void *kernel_args[] = {&p, variant_blob, &rope};
    cinfer_prefill_tma tma;
    if (cfg.sm90) {
        /* The third parameter of the sm90 kernel: its tensor maps. */
        memset(&tma, 0, sizeof tma);
        CINFER__CHECK(encode_tma(ctx, tma.q, q, 0, 1, cfg.tile_q, "encoding q's tensor map"));
        CINFER__CHECK(encode_tma(ctx, tma.k, k, nhd ? 0 : 1, nhd ? 1 : 0, cfg.tile_kv,
                                 "encoding k's tensor map"));
        CINFER__CHECK(encode_tma(ctx, tma.v, v, nhd ? 0 : 1, nhd ? 1 : 0, cfg.tile_kv,
                                 "encoding v's tensor map"));
        kernel_args[2] = &tma;
    }
    CINFER__CU(ctx->cu,
               cuLaunchKernel(kernel.function, (unsigned)persistent_grid(ctx, &cfg, blocks), 1, 1,
                              (unsigned)cinfer__prefill_threads(&cfg), 1, 1, (unsigned)smem, stream,
                              kernel_args, NULL),
               "launching the prefill kernel");
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_single_prefill(cinfer_context_t *ctx,
                                      const cinfer_attention_options_t *options, int causal,
                                      const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                      DLTensor *out, DLTensor *lse, const cinfer_args_t *args,
                                      CUstream stream) {
    return cinfer__single_prefill_config(ctx, options, causal, q, k, v, out, lse, args, NULL,
                                         stream);
}

/* ---------------------------------------------------------------------------------------------
 * Batch prefill
 * ------------------------------------------------------------------------------------------- */

/* What the options, create's arguments and the device decide (shared by workspace_size and
 * create, so the size one reports is the layout the other uses). */
typedef struct batch_setup {
    cinfer__prefill_plan_config_t cfg;
    cinfer__prefill_config_t tiles[CINFER__PREFILL_MAX_TILES];
    cinfer__prefill_layout_t layout;
    cinfer__dtype_t dtype;    /* q and out */
    cinfer__dtype_t dtype_kv; /* K/V: dtype or fp8 */
    int head_dim;             /* D_qk: q and K */
    int head_dim_vo;          /* D_vo: V, out and the partial states */
    int tile_dim;             /* the larger, which the tiles are sized for (tile_dim) */
    cinfer_kv_layout_t kv_layout;
    const cinfer_variant_t *variant; /* NULL = default attention */
    bool rope;                       /* in-kernel RoPE: plan checks the lengths */
    /* The kernels (load_kernels): the tiles create promises and, when plans may split, the merge
     * kernel. */
    cinfer__kernel_t kernels[CINFER__PREFILL_MAX_TILES], merge;
    size_t smem[CINFER__PREFILL_MAX_TILES];
} batch_setup_t;

/* Whether plans of these options may split the KV: not for variants whose partial states cannot
 * be merged (no softmax: no LSE to weigh them by; an output transform: it applies to the merged
 * output, not to each part). CUDA-graph mode splits within bounds fixed at create
 * (prefill_plan.h). */
static bool splittable(const cinfer__prefill_plan_config_t *cfg) {
    return !cfg->no_split;
}

static bool test_no_split;

void cinfer__batch_prefill_test_no_split(bool on) {
    test_no_split = on;
}

static int test_min_chunk;

void cinfer__batch_prefill_test_min_chunk(int positions) {
    test_min_chunk = positions;
}

static int test_pack;

void cinfer__batch_prefill_test_pack(int mode) {
    test_pack = mode;
}

/*
 * GQA packing (prefill_plan.h, "GQA packing"): the query heads per CTA row group, G = Hq / Hk when
 * G >= 2 divides every candidate tile's rows (then a plan never does more work packed than
 * unpacked, and K/V is loaded once per group), else 1. Every variant packs: the kernel gives each
 * hook its row's own token and query head. cinfer__batch_prefill_test_pack forces either way.
 * D_qk != D_vo never packs (kernels/prefill.cu, D_QK: its packed Q copy takes whole rows).
 */
static int pack_group(const cinfer_attention_options_t *o, const cinfer__prefill_config_t *tiles,
                      int num_tiles) {
    const int g = o->num_qo_heads / o->num_kv_heads;
    if (g < 2 || test_pack < 0 || cinfer__attention_head_dim_vo(o) != o->head_dim)
        return 1;
    for (int i = 0; i < num_tiles; i++)
        if (tiles[i].tile_q < g || (test_pack == 0 && tiles[i].tile_q % g != 0))
            return 1;
    return g;
}

/* batch_setup's device-free part for a device allowing max_smem_optin bytes of shared memory per
 * block: the checks, the planner's configuration without max_ctas, and the layout of unsplit
 * plans (which is the final one when plans cannot split). */
static cinfer_status_t batch_setup_smem(const char *arch, int max_smem_optin,
                                        const cinfer_attention_options_t *o,
                                        cinfer_kv_storage_t storage, int causal,
                                        int64_t max_total_qo, batch_setup_t *s) {
    memset(s, 0, sizeof *s);
    CINFER__CHECK(options_check(o));
    s->variant = o->variant;
    s->rope = cinfer__attention_rope(o);
    if (storage != CINFER_KV_STORAGE_RAGGED && storage != CINFER_KV_STORAGE_PAGED)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "storage = %d, expected CINFER_KV_STORAGE_RAGGED (0) or "
                             "CINFER_KV_STORAGE_PAGED (1)",
                             (int)storage);
    if (causal != 0 && causal != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "causal = %d, expected 0 or 1",
                             causal);
    const bool paged = storage == CINFER_KV_STORAGE_PAGED;
    if (paged && (o->page_size < 1 || o->page_size > 256))
        return cinfer__error(o->page_size < 1 ? CINFER_STATUS_INVALID_ARGUMENT
                                              : CINFER_STATUS_UNSUPPORTED,
                             "options->page_size = %d, expected 1..256", o->page_size);
    if (o->use_cuda_graph != 0 && o->use_cuda_graph != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->use_cuda_graph = %d, expected 0 or 1", o->use_cuda_graph);
    if (o->max_batch_size < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->max_batch_size = %d, expected >= 1", o->max_batch_size);
    if (max_total_qo < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "max_total_qo_tokens = %lld, expected >= 1", (long long)max_total_qo);
    if (max_total_qo > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "max_total_qo_tokens = %lld exceeds 2^31 - 1 (indptr arrays are "
                             "int32)",
                             (long long)max_total_qo);

    cinfer__prefill_plan_config_t *c = &s->cfg;
    c->num_qo_heads = o->num_qo_heads;
    c->num_kv_heads = o->num_kv_heads;
    c->head_dim = cinfer__attention_head_dim_vo(o); /* the partial states' */
    c->causal = causal;
    c->window_left = o->window_left;
    c->paged = paged;
    c->page_size = paged ? o->page_size : 1;
    c->max_batch_size = o->max_batch_size;
    c->max_total_qo = max_total_qo;
    c->graph = o->use_cuda_graph;
    c->min_chunk = test_min_chunk;
    c->no_split = test_no_split ||
                  (o->variant && (o->variant->hooks &
                                  (CINFER__VARIANT_NO_SOFTMAX | CINFER__VARIANT_OUTPUT_TRANSFORM)));
    cinfer__prefill_batch_configs(tile_dim(o), max_smem_optin - STATIC_SMEM_RESERVE, s->tiles,
                                  &c->num_tiles);
    /* The largest candidate, for batches whose query tiles are long on average (a long prompt's
     * chunks, a cascade's shared prefix with its GQA groups packed): on sm_90a where the options
     * and the cache allow, the sm90 kernel in place of the sm80 tile of as many rows; else the
     * turn-taking tiles where single prefill would take them. Neither while a test replaces the
     * default tiles. */
    const cinfer__prefill_config_t largest = s->tiles[c->num_tiles - 1];
    const int vo = cinfer__attention_head_dim_vo(o);
    const cinfer__prefill_config_t sm90 = sm90_config(o->head_dim, vo);
    const bool sm90_ok =
        takes_sm90(arch, o) && sm90_pages_ok(paged, o->page_size) && !has_test_default &&
        cinfer__prefill_sm90_smem_bytes(o->head_dim, vo, &sm90) + STATIC_SMEM_RESERVE <=
            (size_t)max_smem_optin;
    /* Above D = 128 the largest sm80 tile has 64 rows: the sm90 kernel's 128 come after it. */
    bool sm90_added = false;
    if (sm90_ok && largest.tile_q == sm90.tile_q) {
        s->tiles[c->num_tiles - 1] = sm90;
    } else if (sm90_ok && largest.tile_q < sm90.tile_q &&
               c->num_tiles < CINFER__PREFILL_MAX_TILES) {
        s->tiles[c->num_tiles++] = sm90;
        sm90_added = true;
    } else if (turn_tiles_fit(o, max_smem_optin) && !has_test_default &&
               c->num_tiles < CINFER__PREFILL_MAX_TILES &&
               s->tiles[c->num_tiles - 1].tile_q < turn_tiles.tile_q) {
        s->tiles[c->num_tiles++] = turn_tiles;
    }
    c->group = pack_group(o, s->tiles, c->num_tiles);
    /* The sm90 kernel packs whole groups of tokens only (a group forced past the tiles' divisors,
     * cinfer__batch_prefill_test_pack, keeps the sm80 tile). */
    if (s->tiles[c->num_tiles - 1].sm90 && sm90.tile_q % c->group != 0) {
        if (sm90_added)
            c->num_tiles--;
        else
            s->tiles[c->num_tiles - 1] = largest;
    }
    for (int i = 0; i < c->num_tiles; i++) {
        /* The planner counts query tokens per item: a packed tile's rows hold G heads of each. */
        c->tile_q[i] = s->tiles[i].tile_q / c->group;
        c->tile_kv[i] = s->tiles[i].tile_kv;
    }
    s->dtype = cinfer__dl_dtype(o->q_dtype);
    s->dtype_kv = cinfer__dl_dtype(o->kv_dtype);
    s->head_dim = o->head_dim;
    s->head_dim_vo = cinfer__attention_head_dim_vo(o);
    s->tile_dim = tile_dim(o);
    s->kv_layout = o->kv_layout;
    return cinfer__prefill_batch_layout(c, &s->layout);
}

/*
 * Loads the kernels create promises (all tiles, or graph mode's one), opts them in to their
 * shared memory and measures each tile's resident CTAs on the device (max_ctas: the tile choice's
 * fill rule, and where plans may split, the split rule and the workspace bounds); when plans may
 * split, also loads the merge kernel and lays the workspace out again with max_ctas.
 */
static cinfer_status_t load_kernels(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                                    int causal, batch_setup_t *s) {
    const int fixed = s->cfg.graph ? cinfer__prefill_choose_tile(&s->cfg, 0, 0) : -1;
    for (int i = 0; i < s->cfg.num_tiles; i++) {
        if (fixed >= 0 && i != fixed)
            continue;
        const cinfer__prefill_config_t *t = &s->tiles[i];
        s->smem[i] = tile_smem(s->head_dim, s->head_dim_vo, s->dtype_kv, t);
        if (s->smem[i] > (size_t)ctx->max_smem_per_block_optin)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "batch prefill tiles (tile_q %d, tile_kv %d, stages %d) need %zu "
                                 "bytes of shared memory; the device allows %d per block",
                                 t->tile_q, t->tile_kv, t->stages, s->smem[i],
                                 ctx->max_smem_per_block_optin);
        cinfer__spec_t spec;
        CINFER__CHECK(build_spec(o, causal, true, s->cfg.paged, t, s->cfg.group, &spec));
        CINFER__CHECK(cinfer__jit_kernel(ctx, &spec, &s->kernels[i]));
        CINFER__CHECK(prepare_kernel(ctx, &s->kernels[i], t, s->smem[i]));
        /* Objects that never split use it too: the tile choice's fill rule (plan_tile). */
        int64_t ctas = 0;
        CINFER__CHECK(resident_ctas(ctx, &s->kernels[i], t, s->smem[i], &ctas));
        s->cfg.max_ctas[i] = ctas > INT32_MAX ? INT32_MAX : (int)ctas;
    }
    if (!splittable(&s->cfg))
        return CINFER_STATUS_SUCCESS;
    cinfer__spec_t merge;
    CINFER__CHECK(cinfer__decode_merge_spec(s->dtype, s->head_dim_vo, &merge));
    CINFER__CHECK(cinfer__jit_kernel(ctx, &merge, &s->merge));
    if (s->merge.max_threads < CINFER__DECODE_WARPS * 32)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "the merge kernel allows %d threads per block, the launch needs %d",
                             s->merge.max_threads, CINFER__DECODE_WARPS * 32);
    return cinfer__prefill_batch_layout(&s->cfg, &s->layout);
}

/* The options checked and the planner configured for ctx's device; when plans may split, the
 * kernels are loaded too (their occupancy sizes the workspace). */
static cinfer_status_t batch_setup(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                                   cinfer_kv_storage_t storage, int causal, int64_t max_total_qo,
                                   batch_setup_t *s) {
    memset(s, 0, sizeof *s);
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    CINFER__CHECK(batch_setup_smem(ctx->arch, ctx->max_smem_per_block_optin, o, storage, causal,
                                   max_total_qo, s));
    if (splittable(&s->cfg))
        CINFER__CHECK(load_kernels(ctx, o, causal, s));
    return CINFER_STATUS_SUCCESS;
}

/* The specs of batch_setup's kernels: the tiles (or graph mode's one), then the merge kernel when
 * plans may split. */
static cinfer_status_t setup_specs(const cinfer_attention_options_t *o, int causal,
                                   const batch_setup_t *s, cinfer__spec_t *specs, int *num_specs) {
    const int fixed = s->cfg.graph ? cinfer__prefill_choose_tile(&s->cfg, 0, 0) : -1;
    int n = 0;
    for (int i = 0; i < s->cfg.num_tiles; i++)
        if (fixed < 0 || i == fixed)
            CINFER__CHECK(
                build_spec(o, causal, true, s->cfg.paged, &s->tiles[i], s->cfg.group, &specs[n++]));
    if (splittable(&s->cfg))
        CINFER__CHECK(cinfer__decode_merge_spec(s->dtype, s->head_dim_vo, &specs[n++]));
    *num_specs = n;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__batch_prefill_aot_specs(const cinfer_attention_options_t *o,
                                                cinfer_kv_storage_t storage, int causal,
                                                const char *arch, int max_smem_optin,
                                                cinfer__spec_t *specs, int *num_specs) {
    batch_setup_t s;
    CINFER__CHECK(batch_setup_smem(arch, max_smem_optin, o, storage, causal, 1, &s));
    s.cfg.graph = false; /* every tile */
    return setup_specs(o, causal, &s, specs, num_specs);
}

cinfer_status_t cinfer__batch_prefill_kernel_specs(const cinfer_context_t *ctx,
                                                   const cinfer_attention_options_t *o,
                                                   cinfer_kv_storage_t storage, int causal,
                                                   int64_t max_total_qo, cinfer__spec_t *specs,
                                                   int *num_specs) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    batch_setup_t s;
    CINFER__CHECK(batch_setup_smem(ctx->arch, ctx->max_smem_per_block_optin, o, storage, causal,
                                   max_total_qo, &s));
    return setup_specs(o, causal, &s, specs, num_specs);
}

cinfer_status_t cinfer_batch_prefill_workspace_size(cinfer_context_t *ctx,
                                                    const cinfer_attention_options_t *options,
                                                    cinfer_kv_storage_t storage, int causal,
                                                    int64_t max_total_qo_tokens,
                                                    size_t *device_bytes) {
    if (!device_bytes)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "device_bytes is NULL");
    *device_bytes = 0;
    batch_setup_t s;
    CINFER__CHECK(batch_setup(ctx, options, storage, causal, max_total_qo_tokens, &s));
    *device_bytes = s.layout.total_bytes;
    return CINFER_STATUS_SUCCESS;
}

struct cinfer_batch_prefill {
    cinfer_context_t *ctx;
    batch_setup_t setup;
    void *workspace;                  /* device */
    cinfer_prefill_params base;       /* the scale, head and workspace fields of every launch */
    float sm90_q_scale, sm90_v_scale; /* base's q_scale and v_scale for the sm90 tile (they
                                         differ for e4m3 K/V: set_scales) */
    cinfer_pos_rope_params rope;      /* the RoPE kernels' frequency table (their last parameter) */

    /* Plan's host side: scratch of max_batch_size requests and the pinned mirrors of the
     * workspace's schedule (ops/staging.h). */
    cinfer__prefill_request_t *requests;
    cinfer__staging_t staging;

    /* The current plan (what run checks its arguments against). */
    bool planned;
    int batch_size, num_work, tile;
    bool split;       /* the merge kernel runs after the attention kernel */
    int chunk_size;   /* split: KV positions per chunk */
    int merge_rows;   /* split: query rows the merge covers, from qo_indptr[0] (graph mode:
                         from row 0) */
    int64_t qo_first; /* qo_indptr[0] */
    int64_t qo_end;   /* qo_indptr[batch_size]: q and out need this many rows */
    int64_t kv_end;   /* kv_indptr[batch_size]: K/V rows (ragged) or kv_indices entries (paged) */
};

int cinfer__batch_prefill_chunk_size(const cinfer_batch_prefill_t *op) {
    return op && op->planned && op->split ? op->chunk_size : 0;
}

bool cinfer__batch_prefill_sm90(const cinfer_batch_prefill_t *op) {
    return op && op->planned && op->setup.tiles[op->tile].sm90;
}

int cinfer__batch_prefill_group(const cinfer_batch_prefill_t *op) {
    return op ? op->setup.cfg.group : 0;
}

static cinfer_status_t check_workspace(const void *workspace, size_t workspace_bytes, size_t need,
                                       const char *size_function) {
    return cinfer__check_workspace(workspace, workspace_bytes, need, CINFER__PREFILL_ALIGN,
                                   size_function);
}

/* Where plan writes a schedule of layout l into host memory (a mirror of the workspace's
 * schedule regions). */
static cinfer__prefill_schedule_t schedule_in(const cinfer__prefill_layout_t *l, char *host) {
    const cinfer__prefill_schedule_t dst = {
        .header = (cinfer_prefill_header *)host,
        .work = (cinfer_prefill_work *)(host + l->work_offset),
        .merge = l->row_capacity > 0 ? (cinfer_decode_header *)(host + l->merge_offset) : NULL,
        .rows = (cinfer_decode_request *)(host + l->rows_offset),
        .work_capacity = l->work_capacity,
        .row_capacity = l->row_capacity,
        .state_capacity = l->state_capacity,
    };
    return dst;
}

cinfer_status_t cinfer__prefill_stage_schedule(cinfer_context_t *ctx, cinfer__staging_t *staging,
                                               void *workspace, const cinfer__prefill_layout_t *l,
                                               const cinfer__prefill_plan_config_t *cfg,
                                               const cinfer__prefill_request_t *req, int batch_size,
                                               int tile, const cinfer__prefill_chunking_t *chunking,
                                               CUstream stream, const char *what) {
    CINFER__CHECK(cinfer__context_activate(ctx));
    char *host = NULL;
    CINFER__CHECK(cinfer__staging_next(ctx, staging, &host));
    const cinfer__prefill_schedule_t dst = schedule_in(l, host);
    CINFER__CHECK(cinfer__prefill_plan_build(cfg, req, batch_size, tile, chunking, &dst));
    /* The used parts of the schedule: the merge header and rows (split plans; graph mode: the
     * header always, since every run launches the merge, which reads its row count there), then
     * the header and the work list, whose copy finishes the plan. */
    char msg[96];
    if (chunking->split || (cfg->graph && dst.merge)) {
        cinfer__fmt(msg, sizeof msg, "copying the %s merge rows to the workspace", what);
        CINFER__CHECK(cinfer__staging_copy_range(
            ctx, staging, workspace, l->merge_offset,
            chunking->split ? l->rows_offset - l->merge_offset +
                                  (size_t)chunking->num_rows * sizeof(cinfer_decode_request)
                            : sizeof(cinfer_decode_header),
            stream, msg));
    }
    const size_t bytes = l->work_offset + (size_t)chunking->num_work * sizeof(cinfer_prefill_work);
    cinfer__fmt(msg, sizeof msg, "copying the %s schedule to the workspace", what);
    return cinfer__staging_copy(ctx, staging, workspace, bytes, stream, msg);
}

/* The parameters every run of op launches with (its setup's heads, options' scales and window,
 * the workspace's schedule and partial states). */
static void op_base(cinfer_batch_prefill_t *op, const cinfer_attention_options_t *options) {
    const batch_setup_t *s = &op->setup;
    cinfer_prefill_params *p = &op->base;
    p->num_qo_heads = s->cfg.num_qo_heads;
    p->num_kv_heads = s->cfg.num_kv_heads;
    /* A window of 2^30 - 1 or more masks nothing (positions are below 2^30), so clamping keeps
     * p_i - w inside an int. */
    p->window_left = options->window_left < 0                        ? 0
                     : options->window_left > CINFER_PREFILL_MAX_LEN ? CINFER_PREFILL_MAX_LEN
                                                                     : options->window_left;
    set_scales(options, false, p);
    cinfer_prefill_params sm90;
    set_scales(options, true, &sm90);
    op->sm90_q_scale = sm90.q_scale;
    op->sm90_v_scale = sm90.v_scale;
    cinfer__attention_rope_params(options, &op->rope);
    p->page_size = s->cfg.page_size;
    p->page_shift = cinfer__page_shift(s->cfg.page_size);
    char *ws = op->workspace;
    p->header = (const cinfer_prefill_header *)ws;
    p->work = (const cinfer_prefill_work *)(ws + s->layout.work_offset);
    if (s->layout.state_capacity > 0) {
        p->partial_o = (float *)(ws + s->layout.partial_o_offset);
        p->partial_lse = (float *)(ws + s->layout.partial_lse_offset);
    }
}

cinfer_status_t cinfer_batch_prefill_create(cinfer_context_t *ctx,
                                            const cinfer_attention_options_t *options,
                                            cinfer_kv_storage_t storage, int causal,
                                            int64_t max_total_qo_tokens, void *workspace,
                                            size_t workspace_bytes, cinfer_batch_prefill_t **out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    cinfer_batch_prefill_t *op = calloc(1, sizeof *op);
    if (!op)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "batch prefill: out of memory");
    op->ctx = ctx;
    op->workspace = workspace;
    cinfer_status_t st;
    /* Unsplittable objects load their kernels after the workspace check (their size needs no
     * device); the others have loaded them to size the workspace. */
    if ((st = batch_setup(ctx, options, storage, causal, max_total_qo_tokens, &op->setup)) ||
        (st = check_workspace(workspace, workspace_bytes, op->setup.layout.total_bytes,
                              "cinfer_batch_prefill_workspace_size")) ||
        (!splittable(&op->setup.cfg) && (st = load_kernels(ctx, options, causal, &op->setup))))
        goto out_free_op;

    op_base(op, options);

    op->requests = malloc(sizeof *op->requests * (size_t)op->setup.cfg.max_batch_size);
    if (!op->requests) {
        st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                           "batch prefill: out of memory for %d requests",
                           op->setup.cfg.max_batch_size);
        goto out_free_op;
    }
    if ((st = cinfer__context_activate(ctx)))
        goto out_free_scratch;
    if ((st = cinfer__staging_create(ctx, &op->staging, op->setup.layout.schedule_bytes,
                                     CINFER__PREFILL_ALIGN, "batch prefill")))
        goto out_free_scratch;
    *out = op;
    return CINFER_STATUS_SUCCESS;

out_free_scratch:
    free(op->requests);
out_free_op:
    free(op);
    return st;
}

cinfer_status_t cinfer_batch_prefill_plan(cinfer_batch_prefill_t *op, const int32_t *qo_indptr,
                                          const int32_t *kv_indptr, const int32_t *kv_last_page_len,
                                          int batch_size, CUstream stream) {
    if (!op)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    const cinfer__prefill_plan_config_t *cfg = &op->setup.cfg;
    /* Everything that can reject the arguments runs before the previous plan is touched. */
    CINFER__CHECK(cinfer__prefill_requests(cfg, qo_indptr, kv_indptr, kv_last_page_len, batch_size,
                                           op->requests));
    for (int b = 0; op->setup.rope && b < batch_size; b++) {
        const cinfer__prefill_request_t *r = &op->requests[b];
        if (r->qo_len > CINFER_ROPE_MAX_LEN || r->kv_len > CINFER_ROPE_MAX_LEN)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "request %d: qo_len = %d, kv_len = %d with in-kernel RoPE: "
                                 "expected at most CINFER_ROPE_MAX_LEN = %d each (positions exact "
                                 "in float32)",
                                 b, (int)r->qo_len, (int)r->kv_len, CINFER_ROPE_MAX_LEN);
    }
    int tile;
    cinfer__prefill_chunking_t chunking;
    CINFER__CHECK(cinfer__prefill_plan_tile(cfg, op->requests, batch_size, &tile, &chunking));
    CINFER__CHECK(cinfer__staging_check_stream(op->ctx, stream, "cinfer_batch_prefill_plan"));

    op->planned = false;
    CINFER__CHECK(cinfer__prefill_stage_schedule(op->ctx, &op->staging, op->workspace,
                                                 &op->setup.layout, cfg, op->requests, batch_size,
                                                 tile, &chunking, stream, "batch prefill"));
    op->planned = true;
    op->batch_size = batch_size;
    op->num_work = chunking.num_work;
    op->tile = tile;
    op->split = chunking.split;
    op->chunk_size = chunking.chunk_size;
    op->merge_rows = chunking.num_rows;
    op->qo_first = qo_indptr[0];
    op->qo_end = qo_indptr[batch_size];
    op->kv_end = kv_indptr[batch_size];
    return CINFER_STATUS_SUCCESS;
}

/* check_tensor with PLAN_MISMATCH for a shape that contradicts the options or the plan; NULL,
 * ndim, dtype and device errors stay INVALID_ARGUMENT. */
cinfer_status_t cinfer__prefill_check_planned(const cinfer_context_t *ctx, const char *arg,
                                              const DLTensor *t, int ndim, const int64_t *shape,
                                              cinfer__dtype_t dtype, const char *origin) {
    return cinfer__tensor_check_as(ctx, arg, t, ndim, shape, dtype, CINFER_STATUS_INVALID_ARGUMENT,
                                   CINFER_STATUS_PLAN_MISMATCH, origin);
}

/* A tensor needs at least `rows` indices along dim. */
cinfer_status_t cinfer__prefill_check_rows(const char *arg, const DLTensor *t, int dim,
                                           int64_t rows, const char *what) {
    if (t->shape[dim] < rows)
        return cinfer__error(CINFER_STATUS_PLAN_MISMATCH,
                             "%s: dim %d has %lld entries, but the plan needs %lld (%s)", arg, dim,
                             (long long)t->shape[dim], (long long)rows, what);
    return CINFER_STATUS_SUCCESS;
}

/* K and V of a paged cache share one set of strides in the kernel. */
static cinfer_status_t check_same_strides(const DLTensor *k, const DLTensor *v) {
    for (int i = 0; i < k->ndim - 1; i++)
        if (k->shape[i] > 1 && cinfer__tensor_stride(k, i) != cinfer__tensor_stride(v, i))
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "v: stride of dim %d is %lld elements, k's is %lld; a paged "
                                 "batch prefill needs K and V caches with the same strides",
                                 i, (long long)cinfer__tensor_stride(v, i),
                                 (long long)cinfer__tensor_stride(k, i));
    return CINFER_STATUS_SUCCESS;
}

/* The K/V fields of the params for a ragged K/V. */
static cinfer_status_t ragged_kv(const cinfer_batch_prefill_t *op, const DLTensor *k,
                                 const DLTensor *v, cinfer_prefill_params *p) {
    const batch_setup_t *s = &op->setup;
    const bool nhd = s->kv_layout == CINFER_KV_LAYOUT_NHD;
    const int64_t Hk = s->cfg.num_kv_heads, D = s->head_dim;
    const int64_t shape[3] = {nhd ? -1 : Hk, nhd ? Hk : -1, D};
    const char *origin = nhd ? "NHD [total_kv, num_kv_heads, head_dim] from the options"
                             : "HND [num_kv_heads, total_kv, head_dim] from the options";
    CINFER__CHECK(cinfer__prefill_check_planned(op->ctx, "k", k, 3, shape, s->dtype_kv, origin));
    CINFER__CHECK(cinfer__prefill_check_rows("k", k, nhd ? 0 : 1, op->kv_end,
                                             "K/V rows: kv_indptr[batch_size]"));
    if (!v)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "v is NULL; a ragged K/V needs both k and v (only a paged cache may "
                             "be combined)");
    const int64_t v_shape[3] = {k->shape[0], k->shape[1], s->head_dim_vo}; /* k's, but for D_vo */
    CINFER__CHECK(cinfer__prefill_check_planned(
        op->ctx, "v", v, 3, v_shape, s->dtype_kv,
        s->head_dim_vo == D ? "k's shape" : "k's shape with head_dim_vo from the options"));
    CINFER__CHECK(cinfer__prefill_check_aligned("k", k));
    CINFER__CHECK(cinfer__prefill_check_aligned("v", v));
    p->k = cinfer__tensor_data(k);
    p->v = cinfer__tensor_data(v);
    p->k_stride_n = cinfer__tensor_step(k, nhd ? 0 : 1);
    p->k_stride_h = cinfer__tensor_step(k, nhd ? 1 : 0);
    p->v_stride_n = cinfer__tensor_step(v, nhd ? 0 : 1);
    p->v_stride_h = cinfer__tensor_step(v, nhd ? 1 : 0);
    return CINFER_STATUS_SUCCESS;
}

/* The K/V fields of the params for a paged cache (separate k and v, or combined k, v NULL). */
static cinfer_status_t paged_kv(const cinfer_batch_prefill_t *op, const DLTensor *k,
                                const DLTensor *v, const DLTensor *kv_indices,
                                cinfer_prefill_params *p) {
    const batch_setup_t *s = &op->setup;
    const cinfer_context_t *ctx = op->ctx;
    const bool nhd = s->kv_layout == CINFER_KV_LAYOUT_NHD;
    const int64_t P = s->cfg.page_size, Hk = s->cfg.num_kv_heads, D = s->head_dim;
    const int64_t a = nhd ? P : Hk, b = nhd ? Hk : P;
    const bool asym = s->head_dim_vo != D;
    int first; /* the dim of k after the page (and K/V) dims */
    if (!v && asym)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "v is NULL (a combined [max_pages, 2, ...] cache) with head_dim = %d "
                             "!= head_dim_vo = %d: K and V of two head dims need separate caches",
                             (int)D, s->head_dim_vo);
    if (v) {
        const int64_t shape[4] = {-1, a, b, D};
        CINFER__CHECK(cinfer__prefill_check_planned(
            ctx, "k", k, 4, shape, s->dtype_kv,
            nhd ? "NHD [max_pages, page_size, num_kv_heads, head_dim] from the options"
                : "HND [max_pages, num_kv_heads, page_size, head_dim] from the options"));
        const int64_t v_shape[4] = {k->shape[0], a, b, s->head_dim_vo};
        CINFER__CHECK(cinfer__prefill_check_planned(
            ctx, "v", v, 4, v_shape, s->dtype_kv,
            asym ? "k's shape with head_dim_vo from the options" : "k's shape"));
        CINFER__CHECK(cinfer__prefill_check_aligned("k", k));
        CINFER__CHECK(cinfer__prefill_check_aligned("v", v));
        if (!asym) /* D_qk != D_vo kernels take V's own strides */
            CINFER__CHECK(check_same_strides(k, v));
        p->k = cinfer__tensor_data(k);
        p->v = cinfer__tensor_data(v);
        first = 1;
    } else {
        const int64_t shape[5] = {-1, 2, a, b, D};
        CINFER__CHECK(cinfer__prefill_check_planned(
            ctx, "k", k, 5, shape, s->dtype_kv,
            nhd ? "combined NHD [max_pages, 2, page_size, num_kv_heads, head_dim] from the "
                  "options (v is NULL)"
                : "combined HND [max_pages, 2, num_kv_heads, page_size, head_dim] from the "
                  "options (v is NULL)"));
        CINFER__CHECK(cinfer__prefill_check_aligned("k", k));
        p->k = cinfer__tensor_data(k);
        p->v = (const char *)p->k +
               cinfer__tensor_stride(k, 1) * (int64_t)cinfer__dtype_size(s->dtype_kv);
        first = 2;
    }
    /* Every stride is taken as is (a dim of one index is never stepped along except the page
     * dim, whose stride only ever multiplies a page index). */
    p->k_stride_page = p->v_stride_page = cinfer__tensor_stride(k, 0);
    p->k_stride_n = p->v_stride_n = cinfer__tensor_stride(k, nhd ? first : first + 1);
    p->k_stride_h = p->v_stride_h = cinfer__tensor_stride(k, nhd ? first + 1 : first);
    if (asym) {
        p->v_stride_page = cinfer__tensor_stride(v, 0);
        p->v_stride_n = cinfer__tensor_stride(v, nhd ? 1 : 2);
        p->v_stride_h = cinfer__tensor_stride(v, nhd ? 2 : 1);
    }

    const int64_t any[1] = {-1};
    CINFER__CHECK(check_tensor(ctx, "kv_indices", kv_indices, 1, any, CINFER__DT_I32,
                               "[kv_indptr[batch_size]] page indices"));
    CINFER__CHECK(cinfer__prefill_check_rows("kv_indices", kv_indices, 0, op->kv_end,
                                             "page-table entries: kv_indptr[batch_size]"));
    if ((uintptr_t)cinfer__tensor_data(kv_indices) % sizeof(int32_t) != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "kv_indices: data address %p is not 4-byte aligned (int32)",
                             cinfer__tensor_data(kv_indices));
    p->kv_indices = cinfer__tensor_data(kv_indices);
    return CINFER_STATUS_SUCCESS;
}

/* K's and V's maps of a paged cache (p's K/V addresses; K's dims and strides, and V's: the same
 * arrays but at D_qk != D_vo), and with run_box (not NULL) their maps of page runs. */
static cinfer_status_t encode_paged_maps(cinfer_context_t *ctx, const cinfer_prefill_params *p,
                                         cinfer__dtype_t dtype, int rank, const int64_t *dims,
                                         const int64_t *strides, const int64_t *v_dims,
                                         const int64_t *v_strides, const uint32_t *box,
                                         const uint32_t *run_box, cinfer_prefill_tma *tma) {
    CINFER__CHECK(
        encode_map(ctx, tma->k, p->k, dtype, rank, dims, strides, box, "encoding k's tensor map"));
    CINFER__CHECK(encode_map(ctx, tma->v, p->v, dtype, rank, v_dims, v_strides, box,
                             "encoding v's tensor map"));
    if (!run_box)
        return CINFER_STATUS_SUCCESS;
    CINFER__CHECK(encode_map(ctx, tma->k_run, p->k, dtype, rank, dims, strides, run_box,
                             "encoding k's tensor map of page runs"));
    return encode_map(ctx, tma->v_run, p->v, dtype, rank, v_dims, v_strides, run_box,
                      "encoding v's tensor map of page runs");
}

static bool test_no_fold;

void cinfer__batch_prefill_test_no_fold(bool on) {
    test_no_fold = on;
}

/*
 * A paged cache's K and V maps (p holds its checked addresses and strides, k is the K cache for
 * its page count): 4-d, (D, page rows, heads, pages), in boxes of one page (or TILE_KV rows of a
 * longer one) and, for pages shorter than a tile, boxes of a tile's pages (k_run, v_run). At D =
 * 128 and 256 with 16-bit K/V the sm90 kernel interleaves a tile's column blocks by groups of 8
 * rows (KV_INTERLEAVED, kernels/prefill_sm90.cuh; the maps and kv_fold in
 * kernels/prefill_params.h): 5-d maps with the KV head folded in where the heads are packed, so
 * that one box copies a page's rows in every column block; else the 4-d maps in boxes of 8 rows x
 * 64 columns, without page runs. At D_qk / D_vo = 192 / 128 V's maps have V's own head dim and
 * strides. fp8 K/V: 5-d maps (D, 1, page rows, heads, pages) in encode_tma's boxes, of a page or a
 * tile's pages.
 */
static cinfer_status_t paged_tma(const cinfer_batch_prefill_t *op, const DLTensor *k,
                                 const cinfer_prefill_params *p, int tile_kv,
                                 cinfer_prefill_tma *tma) {
    const batch_setup_t *s = &op->setup;
    cinfer_context_t *ctx = op->ctx;
    const int64_t D = s->head_dim, Hk = s->cfg.num_kv_heads, P = s->cfg.page_size;
    const int64_t pages = k->shape[0], rows = P < tile_kv ? P : tile_kv;
    const int64_t n = p->k_stride_n, h = p->k_stride_h, page = p->k_stride_page;
    const bool nhd = s->kv_layout == CINFER_KV_LAYOUT_NHD, runs = P < tile_kv;
    if (is_fp8(s->dtype_kv)) {
        /* (D, 1, page rows, heads, pages): encode_tma's boxes, of a page's rows (or a tile's
         * part of a longer page), or of a tile's pages */
        const int64_t dims[5] = {D, 1, P, Hk, pages};
        const int64_t strides[4] = {D, n, h, page};
        const uint32_t box[5] = {64, 2, (uint32_t)rows, 1, 1};
        const uint32_t run_box[5] = {64, 2, (uint32_t)P, 1, (uint32_t)(tile_kv / P)};
        return encode_paged_maps(ctx, p, s->dtype_kv, 5, dims, strides, dims, strides, box,
                                 runs ? run_box : NULL, tma);
    }
    const bool interleaved = (D == 128 || D == 256) && s->head_dim_vo == D;
    if (interleaved && !test_no_fold && (Hk == 1 || (nhd ? h == D : h == P * n))) {
        /* (64 columns, 8 rows, blocks, groups, pages); the head folded into blocks (NHD) or
         * groups (HND) */
        const int64_t blocks = D / 64;
        const int64_t dims[5] = {64, 8, nhd ? Hk * blocks : blocks, nhd ? P / 8 : Hk * P / 8,
                                 pages};
        const int64_t strides[4] = {n, 64, 8 * n, page};
        const uint32_t box[5] = {64, 8, (uint32_t)blocks, (uint32_t)(rows / 8), 1};
        const uint32_t run_box[5] = {64, 8, (uint32_t)blocks, (uint32_t)(P / 8),
                                     (uint32_t)(tile_kv / P)};
        tma->kv_fold[0] = 1;
        tma->kv_fold[1] = nhd ? (int)blocks : 0;
        tma->kv_fold[2] = nhd ? 0 : (int)(P / 8);
        return encode_paged_maps(ctx, p, s->dtype_kv, 5, dims, strides, dims, strides, box,
                                 runs ? run_box : NULL, tma);
    }
    /* (V of its own head dim and strides at D_qk != D_vo: 192 / 128) */
    const int64_t dims[4] = {D, P, Hk, pages}, v_dims[4] = {s->head_dim_vo, P, Hk, pages};
    const int64_t strides[3] = {n, h, page};
    const int64_t v_strides[3] = {p->v_stride_n, p->v_stride_h, p->v_stride_page};
    const uint32_t box[4] = {64, (uint32_t)(interleaved ? 8 : rows), 1, 1};
    const uint32_t run_box[4] = {64, (uint32_t)P, 1, (uint32_t)(tile_kv / P)};
    return encode_paged_maps(ctx, p, s->dtype_kv, 4, dims, strides, v_dims, v_strides, box,
                             runs && !interleaved ? run_box : NULL, tma);
}

/*
 * The sm90 kernel's tensor maps for a run: q as (D, rows, heads), or packed as (D, heads, rows)
 * with boxes of the G heads of 128 / G tokens (kernels/prefill_sm90.cuh); K and V ragged as (D,
 * rows, heads), paged as paged_tma's. p holds the checked paged K/V addresses and strides (k:
 * the K cache, its page count); a ragged K/V is encoded from k and v themselves.
 */
static cinfer_status_t batch_tma(const cinfer_batch_prefill_t *op, const DLTensor *q,
                                 const DLTensor *k, const DLTensor *v,
                                 const cinfer_prefill_params *p, cinfer_prefill_tma *tma) {
    const batch_setup_t *s = &op->setup;
    cinfer_context_t *ctx = op->ctx;
    const int64_t D = s->head_dim, Hq = s->cfg.num_qo_heads;
    const int g = s->cfg.group;
    const int tile_q = s->tiles[op->tile].tile_q, tile_kv = s->tiles[op->tile].tile_kv;
    memset(tma, 0, sizeof *tma);
    if (g > 1) {
        const int64_t dims[3] = {D, Hq, q->shape[0]};
        const int64_t strides[2] = {cinfer__tensor_stride(q, 1), cinfer__tensor_stride(q, 0)};
        const uint32_t box[3] = {64, (uint32_t)g, (uint32_t)(tile_q / g)};
        CINFER__CHECK(encode_map(ctx, tma->q, cinfer__tensor_data(q), s->dtype, 3, dims, strides,
                                 box, "encoding q's tensor map"));
    } else {
        CINFER__CHECK(encode_tma(ctx, tma->q, q, 0, 1, tile_q, "encoding q's tensor map"));
    }
    if (s->cfg.paged) {
        CINFER__CHECK(paged_tma(op, k, p, tile_kv, tma));
    } else {
        /* as single prefill's (NHD or HND) */
        const bool nhd = s->kv_layout == CINFER_KV_LAYOUT_NHD;
        CINFER__CHECK(encode_tma(ctx, tma->k, k, nhd ? 0 : 1, nhd ? 1 : 0, tile_kv,
                                 "encoding k's tensor map"));
        CINFER__CHECK(encode_tma(ctx, tma->v, v, nhd ? 0 : 1, nhd ? 1 : 0, tile_kv,
                                 "encoding v's tensor map"));
    }
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_batch_prefill_run(cinfer_batch_prefill_t *op, const DLTensor *q,
                                         const DLTensor *k, const DLTensor *v,
                                         const DLTensor *kv_indices, DLTensor *out, DLTensor *lse,
                                         const cinfer_args_t *args, CUstream stream) {
    if (!op)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    if (!op->planned)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "op has no plan: call cinfer_batch_prefill_plan before run");
    const batch_setup_t *s = &op->setup;
    const cinfer_context_t *ctx = op->ctx;
    const int64_t Hq = s->cfg.num_qo_heads, D = s->head_dim;
    const int64_t q_shape[3] = {-1, Hq, D};
    const char *q_origin = "[total_q, num_qo_heads, head_dim] from the options";
    CINFER__CHECK(cinfer__prefill_check_planned(ctx, "q", q, 3, q_shape, s->dtype, q_origin));
    CINFER__CHECK(
        cinfer__prefill_check_rows("q", q, 0, op->qo_end, "query rows: qo_indptr[batch_size]"));
    CINFER__CHECK(cinfer__prefill_check_aligned("q", q));
    const int64_t out_shape[3] = {q->shape[0], Hq, s->head_dim_vo};
    CINFER__CHECK(cinfer__prefill_check_planned(
        ctx, "out", out, 3, out_shape, s->dtype,
        s->head_dim_vo == D ? "q's shape" : "q's shape with head_dim_vo from the options"));
    CINFER__CHECK(cinfer__prefill_check_aligned("out", out));
    CINFER__CHECK(cinfer__tensor_check_distinct("out", out));
    if (lse) {
        const int64_t lse_shape[2] = {q->shape[0], Hq};
        CINFER__CHECK(cinfer__prefill_check_planned(ctx, "lse", lse, 2, lse_shape, CINFER__DT_F32,
                                                    "[total_q, num_qo_heads] from q"));
        CINFER__CHECK(cinfer__tensor_check_distinct("lse", lse));
        if ((uintptr_t)cinfer__tensor_data(lse) % sizeof(float) != 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "lse: data address %p is not 4-byte aligned (float32)",
                                 cinfer__tensor_data(lse));
    }
    CINFER__CHECK(cinfer__variant_lse_check(s->variant, lse, "cinfer_batch_prefill_run"));
    unsigned char variant_blob[CINFER__VARIANT_MAX_BYTES];
    size_t variant_bytes = 0;
    CINFER__CHECK(cinfer__variant_pack(s->variant, args, Hq, op->batch_size, ctx,
                                       "cinfer_batch_prefill_run", variant_blob, &variant_bytes));
    CINFER__CHECK(cinfer__variant_check_disjoint(s->variant, args, out, lse));

    cinfer_prefill_params p = op->base;
    if (s->cfg.paged) {
        if (!kv_indices)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "kv_indices is NULL, expected the page indices of a paged KV");
        CINFER__CHECK(paged_kv(op, k, v, kv_indices, &p));
    } else {
        if (kv_indices)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "kv_indices is not NULL, expected NULL for a ragged KV");
        CINFER__CHECK(ragged_kv(op, k, v, &p));
    }
    /* The outputs apart from everything else; nothing may overlap the workspace (the plan's
     * schedule, the partial states the kernels write). */
    const cinfer__tensor_arg_t tensors[] = {{"out", out, false}, {"lse", lse, false},
                                            {"q", q, false},     {"k", k, false},
                                            {"v", v, false},     {"kv_indices", kv_indices, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    CINFER__CHECK(cinfer__tensor_check_workspace(op->workspace, s->layout.total_bytes, tensors,
                                                 CINFER__TENSOR_COUNT(tensors)));
    set_q_out_lse(&p, q, out, lse);

    const int tile = op->tile;
    set_tile_bytes(&p, s->tiles[tile].tile_kv, s->dtype_kv);
    if (s->tiles[tile].sm90) {
        p.q_scale = op->sm90_q_scale;
        p.v_scale = op->sm90_v_scale;
    }
    const int64_t blocks = persistent_grid(
        ctx, &s->tiles[tile], cinfer__prefill_grid(&s->cfg, s->cfg.tile_q[tile], op->num_work));
    if (blocks == 0)
        return CINFER_STATUS_SUCCESS;
    CINFER__CHECK(cinfer__context_activate(op->ctx));
    /* The RoPE frequency table is the third parameter of RoPE kernels only, the tensor maps the
     * sm90 kernel's; the driver reads as many entries as the kernel has parameters. */
    void *params[] = {&p, variant_blob, &op->rope};
    cinfer_prefill_tma tma;
    if (s->tiles[tile].sm90) {
        CINFER__CHECK(batch_tma(op, q, k, v, &p, &tma));
        params[2] = &tma;
    }
    CINFER__CU(ctx->cu,
               cuLaunchKernel(s->kernels[tile].function, (unsigned)blocks, 1, 1,
                              (unsigned)cinfer__prefill_threads(&s->tiles[tile]), 1, 1,
                              (unsigned)s->smem[tile], stream, params, NULL),
               "launching the batch prefill kernel");
    /* Graph mode launches the merge whenever plans may split (its grid is fixed; it reads the
     * plan's row count, 0 when unsplit, from the workspace), other plans only when split. */
    const bool graph_merge = s->cfg.graph && s->layout.row_capacity > 0;
    if (!op->split && !graph_merge)
        return CINFER_STATUS_SUCCESS;

    /* Split-KV: the decode merge kernel folds the partial states into out and lse; its requests
     * are query rows, one query head per slot: the plan's from qo_indptr[0], or in graph mode
     * the rows of out from row 0, an address a later plan cannot move (prefill_plan.h). */
    cinfer_decode_params m;
    memset(&m, 0, sizeof m);
    const char *ws = op->workspace;
    const size_t esz = cinfer__dtype_size(s->dtype);
    const int64_t row0 = s->cfg.graph ? 0 : op->qo_first;
    m.out = (char *)p.out + (size_t)row0 * (size_t)p.out_stride_n * esz;
    m.out_stride_n = p.out_stride_n;
    m.out_stride_h = p.out_stride_h;
    if (p.lse) {
        m.lse = p.lse + row0 * p.lse_stride_n;
        m.lse_stride_n = p.lse_stride_n;
        m.lse_stride_h = p.lse_stride_h;
    }
    m.header = (const cinfer_decode_header *)(ws + s->layout.merge_offset);
    m.requests = (const cinfer_decode_request *)(ws + s->layout.rows_offset);
    m.partial_o = p.partial_o;
    m.partial_lse = p.partial_lse;
    m.num_qo_heads = s->cfg.num_qo_heads;
    m.num_kv_heads = s->cfg.num_kv_heads;
    m.heads_per_cta = 1;
    const int64_t merge_blocks = cinfer__prefill_merge_grid(&s->cfg, op->merge_rows);
    return cinfer__launch_merge(ctx, s->merge.function, merge_blocks, CINFER__DECODE_WARPS * 32, &m,
                                stream, "launching the batch prefill merge kernel");
}

void cinfer_batch_prefill_destroy(cinfer_batch_prefill_t *op) {
    if (!op)
        return;
    if (cinfer__context_activate(op->ctx) == CINFER_STATUS_SUCCESS) {
        /* A pinned mirror may still be the source of an enqueued copy. */
        cinfer__staging_destroy(op->ctx, &op->staging);
    }
    free(op->requests);
    free(op);
}

/* ---------------------------------------------------------------------------------------------
 * Single prefill with a workspace: split-KV through batch prefill's planner and kernels
 * ------------------------------------------------------------------------------------------- */

/*
 * Whether a one-request plan of qo_len x kv_len could split with some candidate tile of s, from
 * s's device-free part (batch_setup_smem), so that calls that cannot split load no batch kernel:
 * a split needs a KV range longer than one minimum chunk and an unsplit grid under the tile's
 * resident CTAs, which are at most what an SM's threads (2048) and shared memory (taken as the
 * per-block opt-in plus 1 KiB) hold.
 */
static bool single_may_split(const cinfer_context_t *ctx, const batch_setup_t *s, int64_t qo_len,
                             int64_t kv_len) {
    if (!splittable(&s->cfg) || kv_len <= CINFER__PREFILL_CHUNK_MIN)
        return false;
    const int64_t cta_heads = cinfer__prefill_cta_heads(&s->cfg);
    for (int i = 0; i < s->cfg.num_tiles; i++) {
        const int64_t ctas = (qo_len + s->cfg.tile_q[i] - 1) / s->cfg.tile_q[i] * cta_heads;
        const size_t smem = tile_smem(s->head_dim, s->head_dim_vo, s->dtype_kv, &s->tiles[i]);
        int64_t per_sm = 2048 / cinfer__prefill_threads(&s->tiles[i]);
        const int64_t by_smem =
            ((int64_t)ctx->max_smem_per_block_optin + 1024) / (int64_t)(smem > 0 ? smem : 1);
        per_sm = by_smem < per_sm ? by_smem : per_sm;
        if (ctas < (int64_t)ctx->num_sms * per_sm)
            return true;
    }
    return false;
}

/*
 * A single prefill of qo_len x kv_len as batch prefill's one ragged request (max_batch_size 1,
 * not in graph mode: the batch options single prefill ignores): op's setup (its kernels loaded)
 * and workspace, the plan's tile and chunking, and whether that plan splits the KV. Batch kernels
 * that cannot be had (not in the AOT bundle under CINFER_JIT=off: NOT_FOUND; tiles whose shared
 * memory the device lacks: UNSUPPORTED), like a variant whose partial states cannot be merged,
 * leave the call unsplit (*split false, SUCCESS): single prefill's own kernel may still run.
 * Other failures are returned.
 */
static cinfer_status_t single_split_plan(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                                         int causal, int64_t qo_len, int64_t kv_len,
                                         cinfer_batch_prefill_t *op, cinfer__prefill_request_t *req,
                                         cinfer__prefill_chunking_t *chunking, bool *split) {
    *split = false;
    if (qo_len < 1 || kv_len < 1)
        return CINFER_STATUS_SUCCESS;
    cinfer_attention_options_t b = *o;
    b.max_batch_size = 1;
    b.use_cuda_graph = 0;
    memset(op, 0, sizeof *op);
    op->ctx = ctx;
    cinfer__error_mute();
    cinfer_status_t st = batch_setup_smem(ctx->arch, ctx->max_smem_per_block_optin, &b,
                                          CINFER_KV_STORAGE_RAGGED, causal, qo_len, &op->setup);
    cinfer__error_unmute();
    if (st == CINFER_STATUS_SUCCESS && !single_may_split(ctx, &op->setup, qo_len, kv_len))
        return CINFER_STATUS_SUCCESS;
    cinfer__error_mute();
    st = batch_setup(ctx, &b, CINFER_KV_STORAGE_RAGGED, causal, qo_len, &op->setup);
    cinfer__error_unmute();
    if (st == CINFER_STATUS_NOT_FOUND || st == CINFER_STATUS_UNSUPPORTED)
        return CINFER_STATUS_SUCCESS;
    if (st != CINFER_STATUS_SUCCESS) /* again, for its message */
        return batch_setup(ctx, &b, CINFER_KV_STORAGE_RAGGED, causal, qo_len, &op->setup);
    if (!splittable(&op->setup.cfg))
        return CINFER_STATUS_SUCCESS;
    const int32_t qo_indptr[2] = {0, (int32_t)qo_len}, kv_indptr[2] = {0, (int32_t)kv_len};
    CINFER__CHECK(cinfer__prefill_requests(&op->setup.cfg, qo_indptr, kv_indptr, NULL, 1, req));
    CINFER__CHECK(cinfer__prefill_plan_tile(&op->setup.cfg, req, 1, &op->tile, chunking));
    *split = chunking->split;
    return CINFER_STATUS_SUCCESS;
}

/* cinfer_single_prefill_workspace_size's checks: single prefill's, on lengths for tensors. */
static cinfer_status_t single_workspace_args(const cinfer_context_t *ctx,
                                             const cinfer_attention_options_t *o, int causal,
                                             int64_t qo_len, int64_t kv_len) {
    CINFER__CHECK(single_option_checks(ctx, o, causal));
    if (qo_len < 0 || kv_len < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s = %lld, expected >= 0",
                             qo_len < 0 ? "qo_len" : "kv_len",
                             (long long)(qo_len < 0 ? qo_len : kv_len));
    CINFER__CHECK(check_len("qo_len", qo_len));
    CINFER__CHECK(check_len("kv_len", kv_len));
    return cinfer__attention_rope_lens(o, qo_len, kv_len, "cinfer_single_prefill_workspace_size");
}

cinfer_status_t cinfer_single_prefill_workspace_size(cinfer_context_t *ctx,
                                                     const cinfer_attention_options_t *options,
                                                     int causal, int64_t qo_len, int64_t kv_len,
                                                     size_t *device_bytes) {
    if (!device_bytes)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "device_bytes is NULL");
    *device_bytes = 0;
    CINFER__CHECK(single_workspace_args(ctx, options, causal, qo_len, kv_len));
    cinfer_batch_prefill_t op;
    cinfer__prefill_request_t req;
    cinfer__prefill_chunking_t chunking;
    bool split = false;
    CINFER__CHECK(
        single_split_plan(ctx, options, causal, qo_len, kv_len, &op, &req, &chunking, &split));
    if (split)
        *device_bytes = op.setup.layout.total_bytes;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_single_prefill_with_workspace(
    cinfer_context_t *ctx, const cinfer_attention_options_t *options, int causal, const DLTensor *q,
    const DLTensor *k, const DLTensor *v, DLTensor *out, DLTensor *lse, const cinfer_args_t *args,
    void *workspace, size_t workspace_bytes, CUstream stream) {
    int64_t qo_len = 0, kv_len = 0;
    CINFER__CHECK(single_checks(ctx, options, causal, q, k, v, out, lse, &qo_len, &kv_len));
    unsigned char variant_blob[CINFER__VARIANT_MAX_BYTES];
    size_t variant_bytes = 0;
    CINFER__CHECK(cinfer__variant_pack(options->variant, args, options->num_qo_heads, 1, ctx,
                                       "cinfer_single_prefill", variant_blob, &variant_bytes));
    cinfer_batch_prefill_t op;
    cinfer__prefill_request_t req;
    cinfer__prefill_chunking_t chunking;
    bool split = false;
    if (workspace || workspace_bytes)
        CINFER__CHECK(
            single_split_plan(ctx, options, causal, qo_len, kv_len, &op, &req, &chunking, &split));
    /* The sm90 kernel's tensor maps need positive strides (single prefill then takes the sm80
     * template). */
    if (split && op.setup.tiles[op.tile].sm90 && !(tma_ok(q) && tma_ok(k) && tma_ok(v)))
        split = false;
    /* A stream capture cannot take the schedule's pageable copy: captured calls run unsplit (a
     * stream whose state cannot be read is taken as capturing). */
    if (split) {
        CINFER__CHECK(cinfer__context_activate(ctx));
        CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
        if (ctx->cu->cuStreamIsCapturing(stream, &capture) != CUDA_SUCCESS ||
            capture != CU_STREAM_CAPTURE_STATUS_NONE)
            split = false;
    }
    if (!split)
        return cinfer__single_prefill_config(ctx, options, causal, q, k, v, out, lse, args, NULL,
                                             stream);
    const cinfer__prefill_layout_t *l = &op.setup.layout;
    CINFER__CHECK(check_workspace(workspace, workspace_bytes, l->total_bytes,
                                  "cinfer_single_prefill_workspace_size"));
    /* Before the schedule's copy writes the workspace: no tensor may lie in it. */
    const cinfer__tensor_arg_t tensors[] = {{"q", q, false},
                                            {"k", k, false},
                                            {"v", v, false},
                                            {"out", out, false},
                                            {"lse", lse, false}};
    CINFER__CHECK(cinfer__tensor_check_workspace(workspace, l->total_bytes, tensors,
                                                 CINFER__TENSOR_COUNT(tensors)));
    op.workspace = workspace;
    op_base(&op, options);

    /* The schedule, built in pageable memory and copied as single decode's is. */
    char *host = calloc(1, l->schedule_bytes);
    if (!host)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "single prefill: out of memory for a %zu-byte schedule",
                             l->schedule_bytes);
    const cinfer__prefill_schedule_t dst = schedule_in(l, host);
    cinfer_status_t st =
        cinfer__prefill_plan_build(&op.setup.cfg, &req, 1, op.tile, &chunking, &dst);
    if (st == CINFER_STATUS_SUCCESS)
        st = cinfer__copy_pageable(ctx, workspace, host, l->schedule_bytes, stream,
                                   "copying the single prefill schedule to the workspace");
    free(host);
    CINFER__CHECK(st);

    op.planned = true;
    op.batch_size = 1;
    op.num_work = chunking.num_work;
    op.split = true;
    op.chunk_size = chunking.chunk_size;
    op.merge_rows = chunking.num_rows;
    op.qo_first = 0;
    op.qo_end = qo_len;
    op.kv_end = kv_len;
    return cinfer_batch_prefill_run(&op, q, k, v, NULL, out, lse, args, stream);
}
