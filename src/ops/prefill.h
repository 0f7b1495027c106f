/*
 * Prefill attention: the internal side of cinfer_single_prefill and of batch prefill
 * (src/ops/prefill.c), the tile configuration of the sm80 kernel (kernels/prefill.cu), and a
 * variant of the single call with explicit tiles for benchmarks and tests.
 */
#ifndef CINFER_OPS_PREFILL_H
#define CINFER_OPS_PREFILL_H

#include <stdbool.h>

#include "cinfer.h"
#include "cuda/context.h"
#include "jit/spec.h"
#include "ops/staging.h"
#include "sched/prefill_plan.h"

/* Tiles of a prefill kernel (the spec's tile_q, tile_kv, warps and stages) and its backend. */
typedef struct cinfer__prefill_config {
    int tile_q;  /* query rows per CTA: 16 or 32 per warp (sm90: 64 per consumer warpgroup) */
    int tile_kv; /* KV rows per pipeline stage: 16, 32, 64 or 128 (sm90: 128, 64 at D = 256) */
    int warps;   /* 1, 2, 4 or 8 (sm90: the consumer warps, 4 or 8; a producer warpgroup is
                    added at launch) */
    int stages;  /* K/V tiles buffered in shared memory: 2..4 (sm90: 2..3) */
    bool sm90;   /* the sm90 kernel (kernels/prefill_sm90.cuh) instead of the sm80 one */
} cinfer__prefill_config_t;

/* Threads per CTA of a prefill kernel of tiles cfg. */
int cinfer__prefill_threads(const cinfer__prefill_config_t *cfg);

/* Tests and benchmarks only: while on, single prefill never takes the sm90 kernel (the sm80
 * template's choices, as on other archs). Not thread-safe. */
void cinfer__prefill_test_no_sm90(bool on);

/* The sm90 prefill kernel's tiles at head dims head_dim / head_dim_vo (two consumer warpgroups of
 * 64 rows; KV tiles of 128 rows in 3 stages; at D = 256 of 64 rows in 2 stages; at 192 / 128 of 128
 * rows in 2 stages). */
void cinfer__prefill_sm90_config(int head_dim, int head_dim_vo, cinfer__prefill_config_t *cfg);

/* Dynamic shared memory of the sm90 kernel of tiles cfg (kernels/prefill_sm90.cuh's layout): 1 KiB
 * of alignment, the Q tile (two at D = 64) and `stages` K and V tiles, unpadded rows of each
 * matrix's head dim. */
size_t cinfer__prefill_sm90_smem_bytes(int head_dim, int head_dim_vo,
                                       const cinfer__prefill_config_t *cfg);

/* Dynamic shared memory of the kernel for head dim d (kernels/prefill.cu's layout): the Q tile
 * and `stages` K and V tiles, rows of d / 8 16-byte chunks padded by one chunk. */
size_t cinfer__prefill_smem_bytes(int head_dim, const cinfer__prefill_config_t *cfg);

/* The same for K/V of kv_dtype: 16-bit rows as above, or fp8 stages of rows of d / 16 chunks
 * padded to an odd count plus one 16-bit K and V tile, which each fp8 tile is converted into (the
 * Q tile stays 16-bit). Tiles are chosen to fit the larger of the 16-bit and the fp8 size (fp8
 * takes 32 bytes per KV row more with 2 stages and an even d / 16, less otherwise), so both
 * kernels run with the same tiles. */
size_t cinfer__prefill_kv_smem_bytes(int head_dim, cinfer__dtype_t kv_dtype,
                                     const cinfer__prefill_config_t *cfg);

/*
 * The default tiles for head_dim (a multiple of 16, at most 256) that fit max_smem bytes of
 * shared memory per block (the device's opt-in limit): see the function for the reasoning behind
 * each choice.
 */
void cinfer__prefill_default_config(int head_dim, int max_smem, cinfer__prefill_config_t *cfg);

/*
 * Tests only: while cfg is not NULL, *cfg replaces the default tiles of every head dim (shrunk to
 * fit max_smem as usual) and batch prefill adds no turn-taking tiles, so that the GPU tests can
 * run the batch kernels with other tiles as the largest. Not thread-safe; NULL restores the
 * defaults.
 */
void cinfer__prefill_test_default_config(const cinfer__prefill_config_t *cfg);

/*
 * The tiles of the batch kernels for head_dim within max_smem bytes, ascending in tile_q (32 rows,
 * 64 rows when the default has more, the default): *num (1..3) entries of cfgs[3].
 */
void cinfer__prefill_batch_configs(int head_dim, int max_smem, cinfer__prefill_config_t *cfgs,
                                   int *num);

/* The most specs a batch prefill object loads: four query tiles and the split-KV merge kernel. */
#define CINFER__BATCH_PREFILL_MAX_SPECS 5

/*
 * The specs of the kernels cinfer_batch_prefill_create loads for these arguments on ctx's device
 * (one per candidate tile, or graph mode's one, then the split-KV merge kernel when plans may
 * split): *num_specs (1..5) entries of specs[CINFER__BATCH_PREFILL_MAX_SPECS]. Validates the
 * arguments like create; needs no device beyond ctx's properties.
 */
cinfer_status_t cinfer__batch_prefill_kernel_specs(const cinfer_context_t *ctx,
                                                   const cinfer_attention_options_t *o,
                                                   cinfer_kv_storage_t storage, int causal,
                                                   int64_t max_total_qo, cinfer__spec_t *specs,
                                                   int *num_specs);

/* The specs a batch prefill object (not in CUDA-graph mode) may load on a device of arch allowing
 * max_smem_optin bytes of shared memory per block: one per candidate tile and the merge kernel
 * (unless the variant's states cannot be merged), *num_specs (1..5) entries of
 * specs[CINFER__BATCH_PREFILL_MAX_SPECS]. What ahead-of-time builds compile. */
cinfer_status_t cinfer__batch_prefill_aot_specs(const cinfer_attention_options_t *o,
                                                cinfer_kv_storage_t storage, int causal,
                                                const char *arch, int max_smem_optin,
                                                cinfer__spec_t *specs, int *num_specs);

/* The chunk size of op's current plan in KV positions when it split some query tile's KV
 * (split-KV), else 0 (no plan, or nothing split). For tests and benchmarks. */
int cinfer__batch_prefill_chunk_size(const cinfer_batch_prefill_t *op);

/* Tests and benchmarks only: while on, batch prefill objects sized and created afterwards never
 * split the KV (as for variants whose partial states cannot be merged), so that a benchmark can
 * time the unsplit plan of the same kernel. Not thread-safe; off by default. */
void cinfer__batch_prefill_test_no_split(bool on);

/* Tests: paged sm90 runs at D = 128 and 256 take the maps of caches whose KV heads are not packed
 * (boxes of 8 rows x 64 columns) whatever the strides, while on. */
void cinfer__batch_prefill_test_no_fold(bool on);

/* Tests and benchmarks only: the shortest split-KV chunk (KV positions) of batch prefill objects
 * sized and created afterwards; 0 (the default) or below CINFER__PREFILL_CHUNK_MIN: that minimum
 * (prefill_plan.h). Not thread-safe. */
void cinfer__batch_prefill_test_min_chunk(int positions);

/* Tests and benchmarks only: GQA packing of batch prefill objects sized and created afterwards
 * (prefill_plan.h, "GQA packing"): 0 (the default) packs where it never costs more work (G >= 2
 * dividing every candidate tile's rows), 1 wherever the kernel can (2 <= G <= every tile's rows,
 * e.g. G = 5), -1 never. Not thread-safe. */
void cinfer__batch_prefill_test_pack(int mode);

/* Whether op's current plan runs the sm90 kernel. For tests. */
bool cinfer__batch_prefill_sm90(const cinfer_batch_prefill_t *op);

/* The GQA group op's kernels pack into their rows (G = Hq / Hk), or 1 when op does not pack; 0 for
 * NULL. For tests and benchmarks. */
int cinfer__batch_prefill_group(const cinfer_batch_prefill_t *op);

/* The default tiles for head_dim on the context's device (what cinfer_single_prefill uses). */
void cinfer__prefill_context_config(const cinfer_context_t *ctx, int head_dim,
                                    cinfer__prefill_config_t *cfg);

/* cinfer_single_prefill with explicit tiles (cfg NULL = the default); UNSUPPORTED when they do not
 * fit the device. */
cinfer_status_t cinfer__single_prefill_config(cinfer_context_t *ctx,
                                              const cinfer_attention_options_t *options, int causal,
                                              const DLTensor *q, const DLTensor *k,
                                              const DLTensor *v, DLTensor *out, DLTensor *lse,
                                              const cinfer_args_t *args,
                                              const cinfer__prefill_config_t *cfg, CUstream stream);

/*
 * The spec of the kernel cinfer_single_prefill loads for these options and causal flag with the
 * default tiles of a device allowing max_smem_optin bytes of shared memory per block (it may take
 * others by the grid: cinfer__prefill_single_specs lists them all, which ahead-of-time builds
 * compile). Validates the options.
 */
cinfer_status_t cinfer__prefill_kernel_spec(const cinfer_attention_options_t *o, int causal,
                                            int max_smem_optin, cinfer__spec_t *spec);

/* Single prefill's turn-taking tiles (256 query rows on eight warps), which it takes at D = 128
 * for grids of two waves or more when the options allow (16-bit K/V, no RoPE, no soft cap). */
void cinfer__prefill_turn_config(cinfer__prefill_config_t *cfg);

/*
 * Every spec cinfer_single_prefill may load for these options and causal flag on a device of arch
 * ("sm_90a", ...) allowing max_smem_optin bytes of shared memory per block: the default tiles'
 * (specs[0]), where there is one the next smaller tile's, which it takes for short grids, where
 * the options allow them the turn-taking tiles', which it takes for long ones, and on sm_90a where
 * the options allow it the sm90 kernel's, which it takes for grids of a wave or more
 * (choose_single in prefill.c). *count: 1 to 4 (specs holds 4).
 */
cinfer_status_t cinfer__prefill_single_specs(const cinfer_attention_options_t *o, int causal,
                                             const char *arch, int max_smem_optin,
                                             cinfer__spec_t *specs, int *count);

/* Writes the schedule of a plan (req, tile and chunking as cinfer__prefill_plan_tile chose them)
 * into staging's next pinned mirror and copies its used parts into the device workspace (layout
 * l) on stream: the merge header and rows of a split plan (graph mode: the header always), then
 * the header and the work list. `what` names the operation in messages. Shared by batch prefill
 * and MLA (ops/mla.c). */
cinfer_status_t cinfer__prefill_stage_schedule(cinfer_context_t *ctx, cinfer__staging_t *staging,
                                               void *workspace, const cinfer__prefill_layout_t *l,
                                               const cinfer__prefill_plan_config_t *cfg,
                                               const cinfer__prefill_request_t *req, int batch_size,
                                               int tile, const cinfer__prefill_chunking_t *chunking,
                                               CUstream stream, const char *what);

/* Tensor checks of the prefill-family run functions (ops/prefill.c), shared with MLA: */
/* shape and dtype (INVALID_ARGUMENT), PLAN_MISMATCH for a shape that contradicts the options or
 * the plan (origin: where the expected shape comes from); */
cinfer_status_t cinfer__prefill_check_planned(const cinfer_context_t *ctx, const char *arg,
                                              const DLTensor *t, int ndim, const int64_t *shape,
                                              cinfer__dtype_t dtype, const char *origin);
/* at least `rows` indices along dim (PLAN_MISMATCH, naming what needs them); */
cinfer_status_t cinfer__prefill_check_rows(const char *arg, const DLTensor *t, int dim,
                                           int64_t rows, const char *what);
/* 16-byte aligned data and row strides (UNSUPPORTED). */
cinfer_status_t cinfer__prefill_check_aligned(const char *arg, const DLTensor *t);

#endif
