/*
 * MLA over a paged latent cache (include/cinfer.h, "MLA"): option checks, the kernels
 * (kernels/mla.cu), and create / plan / run on batch prefill's planner (sched/prefill_plan.h)
 * with GQA packing: the kernel's 16 rows hold G = min(H, 16) query heads of 16 / G tokens, so the
 * planner sees H query heads in H / G groups ("KV heads" that all read the one latent KV).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jit/jit.h"
#include "mla_params.h"
#include "ops/decode.h"
#include "ops/mla.h"
#include "ops/options.h"
#include "ops/prefill.h"
#include "ops/staging.h"
#include "ops/tensor.h"
#include "sched/prefill_plan.h"

/* The kernel's shape (kernels/mla.cu): KV tiles of 16 positions in 4 stages (97 KiB of shared
 * memory, 2 CTAs per SM). H200, bench/mla.py, 2026-12-01, against tiles of 32 in 2 stages / 32 in
 * 3 / 16 in 2: 64 x 4096 at H 16, 2.99-3.12 TB/s against 3.03-3.04 / 2.91 / 3.23-3.25; 512 x
 * 1024, 3.49 against 3.37-3.38 / 3.04 / 2.72; H 128 within 2% but 16 in 2 (10-15% slower). */
enum {
    MLA_CKV = 512,
    MLA_KPE = 64,
    MLA_ROWS = 16,
    MLA_TILE_KV = 16,
    MLA_WARPS = 4,
    MLA_STAGES = 4,
    /* The merge kernel: a CTA of 128 threads per (row, head, slice of the columns), with up to
     * 16 slices so that rows x heads x slices reaches MLA_MERGE_CTAS. */
    MLA_MERGE_THREADS = 128,
    MLA_MERGE_MAX_GROUPS = 16,
    MLA_MERGE_CTAS = 1024,
    /* Split-KV chunks down to 128 positions (8 KV tiles; batch prefill's floor is 512): such a
     * chunk reads 147 KB of latent cache against the 18 KB Q tile and the 32 KB partial state its
     * CTA adds, and one 32k request fills a wave (256 chunks for 264 CTA slots on the H200) where
     * 512-position chunks would leave three quarters of the slots empty. Measured with 512: 64 x
     * 4096 at H 16 ran at 2.51-3.02 TB/s against 2.97-3.04 (tiles of 32 in 2 stages both). */
    MLA_CHUNK_FLOOR = 128,
};

/* The attention kernel an object loads: the mma.sync kernel (16 rows: G = min(H, 16) heads of
 * 16 / G tokens), or on sm_90a for H a multiple of 64 the warpgroup kernel (kernels/mla_sm90.cuh:
 * 64 heads of one token, so the latent cache is read once per 64 heads, not per 16). */
typedef struct mla_shape {
    int rows, tile_kv, warps, stages, group;
} mla_shape_t;

/* The warpgroup kernel's shape: KV tiles of 32 positions in 4 stages, 8 warps. */
enum { MLA_WIDE_ROWS = 64, MLA_WIDE_TILE_KV = 32, MLA_WIDE_WARPS = 8, MLA_WIDE_STAGES = 4 };

static bool test_no_sm90;

void cinfer__mla_test_no_sm90(bool on) {
    test_no_sm90 = on;
}

/* The query heads a CTA's rows pack per token in the mma.sync kernel: min(H, 16); 0 when H is
 * neither a multiple of 16 nor a divisor of it. */
static int mla_group(int num_heads) {
    if (num_heads >= MLA_ROWS)
        return num_heads % MLA_ROWS == 0 ? MLA_ROWS : 0;
    return num_heads >= 1 && MLA_ROWS % num_heads == 0 ? num_heads : 0;
}

/* The shape for num_heads (checked by options_check) on a device of arch. */
static mla_shape_t mla_shape(int num_heads, const char *arch) {
    if (!test_no_sm90 && strcmp(arch, "sm_90a") == 0 && num_heads % MLA_WIDE_ROWS == 0)
        return (mla_shape_t){MLA_WIDE_ROWS, MLA_WIDE_TILE_KV, MLA_WIDE_WARPS, MLA_WIDE_STAGES,
                             MLA_WIDE_ROWS};
    return (mla_shape_t){MLA_ROWS, MLA_TILE_KV, MLA_WARPS, MLA_STAGES, mla_group(num_heads)};
}

/* Dynamic shared memory of the attention kernel. mma.sync: the Q tile and the KV stages (rows of
 * 576 elements padded by 16 bytes), and each warp's partial logits of a tile (16 rows of TILE_KV
 * floats padded by 8). Warpgroup: 1 KiB of alignment, the Q tile and the stages as blocks of 64
 * columns (128 bytes a row), and the two published P tiles (64 x TILE_KV 16-bit values each) and
 * row maxima (64 floats each). */
static size_t mla_smem(const mla_shape_t *sh) {
    const size_t dims = MLA_CKV + MLA_KPE;
    if (sh->rows == MLA_WIDE_ROWS)
        return 1024 + dims * 2 * ((size_t)sh->rows + (size_t)sh->stages * sh->tile_kv) +
               2 * (size_t)sh->rows * (sh->tile_kv * 2 + 4);
    const size_t row = dims * 2 + 16;
    return row * ((size_t)sh->rows + (size_t)sh->stages * sh->tile_kv) +
           (size_t)sh->warps * sh->rows * (sh->tile_kv + 8) * 4;
}

static cinfer_status_t options_check(const cinfer_mla_options_t *o, int causal,
                                     int64_t max_total_qo) {
    if (!o)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "options is NULL");
    if (o->size < sizeof *o || o->version != CINFER_MLA_OPTIONS_VERSION)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options: size %zu / version %u, expected at least %zu / %u (start "
                             "from CINFER_MLA_OPTIONS_INIT)",
                             o->size, o->version, sizeof *o, CINFER_MLA_OPTIONS_VERSION);
    if (o->num_heads < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->num_heads = %d, expected >= 1", o->num_heads);
    if (mla_group(o->num_heads) == 0)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->num_heads = %d is not supported by MLA: expected a multiple "
                             "of 16, or 1, 2, 4 or 8",
                             o->num_heads);
    if (o->head_dim_ckv != MLA_CKV || o->head_dim_kpe != MLA_KPE)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->head_dim_ckv = %d, head_dim_kpe = %d: MLA supports 512 and "
                             "64 (DeepSeek-V2/V3)",
                             o->head_dim_ckv, o->head_dim_kpe);
    if (o->page_size < 1 || o->page_size > 256)
        return cinfer__error(o->page_size < 1 ? CINFER_STATUS_INVALID_ARGUMENT
                                              : CINFER_STATUS_UNSUPPORTED,
                             "options->page_size = %d, expected 1..256", o->page_size);
    const cinfer__dtype_t q = cinfer__dl_dtype(o->q_dtype), kv = cinfer__dl_dtype(o->kv_dtype);
    if (q != CINFER__DT_F16 && q != CINFER__DT_BF16)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->q_dtype (code %u, %u bits, %u lanes) is not supported by "
                             "MLA: expected fp16 or bf16",
                             o->q_dtype.code, o->q_dtype.bits, o->q_dtype.lanes);
    if (kv != q)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->kv_dtype (code %u, %u bits, %u lanes) is not supported by "
                             "MLA: expected the q_dtype (%s)",
                             o->kv_dtype.code, o->kv_dtype.bits, o->kv_dtype.lanes,
                             cinfer__dtype_name(q));
    /* the kernels' logit scale, sm_scale x log2(e), is a float32 */
    if (!(o->sm_scale > 0.0f) || !((double)o->sm_scale * 1.4426950408889634 <= FLT_MAX))
        return cinfer__error(
            CINFER_STATUS_INVALID_ARGUMENT,
            "options->sm_scale = %g, expected a finite value > 0 and below 2^127.4 "
            "(MLA has no default scale)",
            (double)o->sm_scale);
    if (o->use_cuda_graph != 0 && o->use_cuda_graph != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->use_cuda_graph = %d, expected 0 or 1", o->use_cuda_graph);
    if (o->max_batch_size < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->max_batch_size = %d, expected >= 1", o->max_batch_size);
    if (causal != 0 && causal != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "causal = %d, expected 0 or 1",
                             causal);
    if (max_total_qo < 1 || max_total_qo > INT32_MAX)
        return cinfer__error(
            max_total_qo < 1 ? CINFER_STATUS_INVALID_ARGUMENT : CINFER_STATUS_UNSUPPORTED,
            "max_total_qo_tokens = %lld, expected 1 .. 2^31 - 1", (long long)max_total_qo);
    return CINFER_STATUS_SUCCESS;
}

/* The kernels' specs for checked options and the kernel shape. */
static cinfer_status_t build_specs(const cinfer_mla_options_t *o, int causal, const mla_shape_t *sh,
                                   cinfer__spec_t *attention, cinfer__spec_t *merge) {
    const cinfer__dtype_t dtype = cinfer__dl_dtype(o->q_dtype);
    cinfer__spec_init(attention, CINFER__OP_MLA);
    attention->dtype_q = attention->dtype_kv = attention->dtype_o = dtype;
    attention->head_dim_qk = MLA_CKV + MLA_KPE;
    attention->head_dim_vo = MLA_CKV;
    attention->mask = causal ? CINFER__MASK_CAUSAL : CINFER__MASK_NONE;
    attention->tile_q = sh->rows;
    attention->tile_kv = sh->tile_kv;
    attention->warps = sh->warps;
    attention->stages = sh->stages;
    attention->gqa_pack = sh->group > 1 ? sh->group : 0;
    cinfer__spec_init(merge, CINFER__OP_MLA_MERGE);
    merge->dtype_o = dtype;
    merge->head_dim_vo = MLA_CKV;
    CINFER__CHECK(cinfer__spec_validate(attention));
    return cinfer__spec_validate(merge);
}

cinfer_status_t cinfer__batch_mla_specs(const cinfer_mla_options_t *o, int causal, const char *arch,
                                        cinfer__spec_t *attention, cinfer__spec_t *merge) {
    CINFER__CHECK(options_check(o, causal, 1));
    const mla_shape_t sh = mla_shape(o->num_heads, arch);
    return build_specs(o, causal, &sh, attention, merge);
}

typedef struct mla_setup {
    cinfer__prefill_plan_config_t cfg;
    cinfer__prefill_layout_t layout;
    cinfer__dtype_t dtype;
    cinfer__kernel_t kernel, merge;
    mla_shape_t shape;
    size_t smem;
} mla_setup_t;

static cinfer_status_t mla_setup(cinfer_context_t *ctx, const cinfer_mla_options_t *o, int causal,
                                 int64_t max_total_qo, mla_setup_t *s) {
    memset(s, 0, sizeof *s);
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    CINFER__CHECK(options_check(o, causal, max_total_qo));
    s->shape = mla_shape(o->num_heads, ctx->arch);
    const mla_shape_t *sh = &s->shape;
    const int g = sh->group;
    s->dtype = cinfer__dl_dtype(o->q_dtype);
    cinfer__spec_t spec, merge;
    CINFER__CHECK(build_specs(o, causal, sh, &spec, &merge));
    s->smem = mla_smem(sh);
    if (s->smem > (size_t)ctx->max_smem_per_block_optin)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "the MLA kernel needs %zu bytes of shared memory; the device allows "
                             "%d per block",
                             s->smem, ctx->max_smem_per_block_optin);
    CINFER__CHECK(cinfer__jit_kernel(ctx, &spec, &s->kernel));
    CINFER__CHECK(cinfer__context_activate(ctx));
    CINFER__CU(ctx->cu,
               cuFuncSetAttribute(s->kernel.function,
                                  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)s->smem),
               "setting the MLA kernel's shared memory size");
    int per_sm = 0;
    CINFER__CU(ctx->cu,
               cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, s->kernel.function,
                                                           sh->warps * 32, s->smem),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor (MLA kernel)");
    CINFER__CHECK(cinfer__jit_kernel(ctx, &merge, &s->merge));

    cinfer__prefill_plan_config_t *c = &s->cfg;
    c->num_qo_heads = o->num_heads;
    c->num_kv_heads = o->num_heads / g;
    c->head_dim = MLA_CKV;
    c->causal = causal;
    c->window_left = -1;
    c->paged = true;
    c->page_size = o->page_size;
    c->max_batch_size = o->max_batch_size;
    c->max_total_qo = max_total_qo;
    c->graph = o->use_cuda_graph;
    c->group = g;
    c->chunk_floor = MLA_CHUNK_FLOOR;
    c->num_tiles = 1;
    c->tile_q[0] = sh->rows / g;
    c->tile_kv[0] = sh->tile_kv;
    const int64_t ctas = (int64_t)ctx->num_sms * per_sm;
    c->max_ctas[0] = ctas > INT32_MAX ? INT32_MAX : (int)ctas;
    return cinfer__prefill_batch_layout(c, &s->layout);
}

cinfer_status_t cinfer_batch_mla_workspace_size(cinfer_context_t *ctx,
                                                const cinfer_mla_options_t *options, int causal,
                                                int64_t max_total_qo_tokens, size_t *device_bytes) {
    if (!device_bytes)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "device_bytes is NULL");
    *device_bytes = 0;
    mla_setup_t s;
    CINFER__CHECK(mla_setup(ctx, options, causal, max_total_qo_tokens, &s));
    *device_bytes = s.layout.total_bytes;
    return CINFER_STATUS_SUCCESS;
}

struct cinfer_batch_mla {
    cinfer_context_t *ctx;
    mla_setup_t setup;
    void *workspace;
    cinfer_mla_params base; /* the scale, heads and workspace fields of every launch */
    cinfer__prefill_request_t *requests;
    cinfer__staging_t staging;
    /* the current plan */
    bool planned;
    int num_work, merge_rows;
    bool split;
    int64_t qo_first, qo_end, kv_end;
};

cinfer_status_t cinfer_batch_mla_create(cinfer_context_t *ctx, const cinfer_mla_options_t *options,
                                        int causal, int64_t max_total_qo_tokens, void *workspace,
                                        size_t workspace_bytes, cinfer_batch_mla_t **out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    cinfer_batch_mla_t *op = calloc(1, sizeof *op);
    if (!op)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "MLA: out of memory for the object");
    cinfer_status_t st;
    if ((st = mla_setup(ctx, options, causal, max_total_qo_tokens, &op->setup)) ||
        (st = cinfer__check_workspace(workspace, workspace_bytes, op->setup.layout.total_bytes,
                                      CINFER__PREFILL_ALIGN, "cinfer_batch_mla_workspace_size")))
        goto out_free_op;
    op->ctx = ctx;
    op->workspace = workspace;
    const cinfer__prefill_layout_t *l = &op->setup.layout;
    cinfer_mla_params *p = &op->base;
    char *ws = workspace;
    p->header = (const cinfer_prefill_header *)ws;
    p->work = (const cinfer_prefill_work *)(ws + l->work_offset);
    p->partial_o = l->state_capacity > 0 ? (float *)(ws + l->partial_o_offset) : NULL;
    p->partial_lse = l->state_capacity > 0 ? (float *)(ws + l->partial_lse_offset) : NULL;
    p->merge_header =
        l->row_capacity > 0 ? (const cinfer_decode_header *)(ws + l->merge_offset) : NULL;
    p->merge_rows =
        l->row_capacity > 0 ? (const cinfer_decode_request *)(ws + l->rows_offset) : NULL;
    p->num_heads = options->num_heads;
    p->q_scale = (float)((double)options->sm_scale * 1.4426950408889634);
    p->page_size = options->page_size;
    p->page_shift = cinfer__page_shift(options->page_size);
    op->requests = malloc(sizeof *op->requests * (size_t)options->max_batch_size);
    if (!op->requests) {
        st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "MLA: out of memory for %d requests",
                           options->max_batch_size);
        goto out_free_op;
    }
    if ((st = cinfer__context_activate(ctx)) ||
        (st = cinfer__staging_create(ctx, &op->staging, l->schedule_bytes, CINFER__PREFILL_ALIGN,
                                     "MLA")))
        goto out_free_scratch;
    *out = op;
    return CINFER_STATUS_SUCCESS;

out_free_scratch:
    free(op->requests);
out_free_op:
    free(op);
    return st;
}

cinfer_status_t cinfer_batch_mla_plan(cinfer_batch_mla_t *op, const int32_t *qo_indptr,
                                      const int32_t *kv_indptr, const int32_t *kv_last_page_len,
                                      int batch_size, CUstream stream) {
    if (!op)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    const cinfer__prefill_plan_config_t *cfg = &op->setup.cfg;
    /* Everything that can reject the arguments runs before the previous plan is touched. */
    CINFER__CHECK(cinfer__prefill_requests(cfg, qo_indptr, kv_indptr, kv_last_page_len, batch_size,
                                           op->requests));
    int tile;
    cinfer__prefill_chunking_t chunking;
    CINFER__CHECK(cinfer__prefill_plan_tile(cfg, op->requests, batch_size, &tile, &chunking));
    CINFER__CHECK(cinfer__staging_check_stream(op->ctx, stream, "cinfer_batch_mla_plan"));
    op->planned = false;
    CINFER__CHECK(cinfer__prefill_stage_schedule(op->ctx, &op->staging, op->workspace,
                                                 &op->setup.layout, cfg, op->requests, batch_size,
                                                 tile, &chunking, stream, "MLA"));
    op->planned = true;
    op->num_work = chunking.num_work;
    op->split = chunking.split;
    op->merge_rows = chunking.num_rows;
    op->qo_first = qo_indptr[0];
    op->qo_end = qo_indptr[batch_size];
    op->kv_end = kv_indptr[batch_size];
    return CINFER_STATUS_SUCCESS;
}

bool cinfer__batch_mla_split(const cinfer_batch_mla_t *op) {
    return op && op->planned && op->split;
}

cinfer_status_t cinfer_batch_mla_run(cinfer_batch_mla_t *op, const DLTensor *q_nope,
                                     const DLTensor *q_pe, const DLTensor *ckv_cache,
                                     const DLTensor *kpe_cache, const DLTensor *kv_indices,
                                     DLTensor *out, DLTensor *lse, CUstream stream) {
    if (!op)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    if (!op->planned)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "op has no plan: call cinfer_batch_mla_plan before run");
    const mla_setup_t *s = &op->setup;
    const cinfer_context_t *ctx = op->ctx;
    const int64_t H = s->cfg.num_qo_heads, P = s->cfg.page_size;
    const int64_t qn_shape[3] = {-1, H, MLA_CKV};
    CINFER__CHECK(cinfer__prefill_check_planned(ctx, "q_nope", q_nope, 3, qn_shape, s->dtype,
                                                "[total_q, num_heads, 512] from the options"));
    CINFER__CHECK(cinfer__prefill_check_rows("q_nope", q_nope, 0, op->qo_end,
                                             "query rows: qo_indptr[batch_size]"));
    const int64_t qp_shape[3] = {q_nope->shape[0], H, MLA_KPE};
    CINFER__CHECK(cinfer__prefill_check_planned(ctx, "q_pe", q_pe, 3, qp_shape, s->dtype,
                                                "[total_q, num_heads, 64]: q_nope's rows"));
    const int64_t ckv_shape[3] = {-1, P, MLA_CKV};
    CINFER__CHECK(cinfer__prefill_check_planned(ctx, "ckv_cache", ckv_cache, 3, ckv_shape, s->dtype,
                                                "[max_pages, page_size, 512] from the options"));
    const int64_t kpe_shape[3] = {ckv_cache->shape[0], P, MLA_KPE};
    CINFER__CHECK(cinfer__prefill_check_planned(ctx, "kpe_cache", kpe_cache, 3, kpe_shape, s->dtype,
                                                "[max_pages, page_size, 64]: ckv_cache's pages"));
    const int64_t out_shape[3] = {q_nope->shape[0], H, MLA_CKV};
    CINFER__CHECK(
        cinfer__prefill_check_planned(ctx, "out", out, 3, out_shape, s->dtype, "q_nope's shape"));
    if (lse) {
        const int64_t lse_shape[2] = {q_nope->shape[0], H};
        CINFER__CHECK(cinfer__prefill_check_planned(ctx, "lse", lse, 2, lse_shape, CINFER__DT_F32,
                                                    "[total_q, num_heads] from q_nope"));
        CINFER__CHECK(cinfer__tensor_check_distinct("lse", lse));
        if ((uintptr_t)cinfer__tensor_data(lse) % sizeof(float) != 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "lse: data address %p is not 4-byte aligned (float32)",
                                 cinfer__tensor_data(lse));
    }
    const int64_t any[1] = {-1};
    CINFER__CHECK(cinfer__prefill_check_planned(ctx, "kv_indices", kv_indices, 1, any,
                                                CINFER__DT_I32,
                                                "[kv_indptr[batch_size]] page indices"));
    CINFER__CHECK(cinfer__prefill_check_rows("kv_indices", kv_indices, 0, op->kv_end,
                                             "page-table entries: kv_indptr[batch_size]"));
    if ((uintptr_t)cinfer__tensor_data(kv_indices) % sizeof(int32_t) != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "kv_indices: data address %p is not 4-byte aligned (int32)",
                             cinfer__tensor_data(kv_indices));
    CINFER__CHECK(cinfer__prefill_check_aligned("q_nope", q_nope));
    CINFER__CHECK(cinfer__prefill_check_aligned("q_pe", q_pe));
    CINFER__CHECK(cinfer__prefill_check_aligned("ckv_cache", ckv_cache));
    CINFER__CHECK(cinfer__prefill_check_aligned("kpe_cache", kpe_cache));
    CINFER__CHECK(cinfer__prefill_check_aligned("out", out));
    CINFER__CHECK(cinfer__tensor_check_distinct("out", out));
    /* The outputs apart from everything else; nothing may overlap the workspace (the plan's
     * schedule, the partial states the kernels write). */
    const cinfer__tensor_arg_t tensors[] = {{"out", out, false},
                                            {"lse", lse, false},
                                            {"q_nope", q_nope, false},
                                            {"q_pe", q_pe, false},
                                            {"ckv_cache", ckv_cache, false},
                                            {"kpe_cache", kpe_cache, false},
                                            {"kv_indices", kv_indices, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    CINFER__CHECK(cinfer__tensor_check_workspace(op->workspace, s->layout.total_bytes, tensors,
                                                 CINFER__TENSOR_COUNT(tensors)));

    cinfer_mla_params p = op->base;
    p.q_nope = cinfer__tensor_data(q_nope);
    p.q_nope_stride_n = cinfer__tensor_step(q_nope, 0);
    p.q_nope_stride_h = cinfer__tensor_step(q_nope, 1);
    p.q_pe = cinfer__tensor_data(q_pe);
    p.q_pe_stride_n = cinfer__tensor_step(q_pe, 0);
    p.q_pe_stride_h = cinfer__tensor_step(q_pe, 1);
    /* A page's stride multiplies page indices only: taken as is. */
    p.ckv = cinfer__tensor_data(ckv_cache);
    p.ckv_stride_page = cinfer__tensor_stride(ckv_cache, 0);
    p.ckv_stride_n = cinfer__tensor_step(ckv_cache, 1);
    p.kpe = cinfer__tensor_data(kpe_cache);
    p.kpe_stride_page = cinfer__tensor_stride(kpe_cache, 0);
    p.kpe_stride_n = cinfer__tensor_step(kpe_cache, 1);
    p.kv_indices = cinfer__tensor_data(kv_indices);
    p.out = cinfer__tensor_data(out);
    p.out_stride_n = cinfer__tensor_step(out, 0);
    p.out_stride_h = cinfer__tensor_step(out, 1);
    if (lse) {
        p.lse = cinfer__tensor_data(lse);
        p.lse_stride_n = cinfer__tensor_step(lse, 0);
        p.lse_stride_h = cinfer__tensor_step(lse, 1);
    }
    const int64_t blocks = cinfer__prefill_grid(&s->cfg, s->cfg.tile_q[0], op->num_work);
    if (blocks > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "MLA: a grid of %lld CTAs, more than one launch allows (2^31 - 1)",
                             (long long)blocks);
    if (blocks == 0)
        return CINFER_STATUS_SUCCESS;
    /* Graph mode launches the merge whenever plans may split (a fixed grid over R rows from row
     * 0, reading the plan's row count), other plans when split (rows from qo_indptr[0]). Its
     * grid is checked before anything is launched. */
    const bool merge = op->split || (s->cfg.graph && s->layout.row_capacity > 0);
    const int64_t row0 = s->cfg.graph ? 0 : op->qo_first;
    const int64_t rows = s->cfg.graph ? cinfer__prefill_row_bound(&s->cfg) : op->merge_rows;
    /* Column slices per (row, head): one when the pairs alone make MLA_MERGE_CTAS CTAs (each
     * CTA then reads its LSEs once for all 512 columns), up to 16 for a few long rows. */
    int groups = 1;
    while (groups < MLA_MERGE_MAX_GROUPS && rows * H * groups < MLA_MERGE_CTAS)
        groups *= 2;
    p.merge_groups = groups;
    const int64_t merge_blocks = merge ? rows * H * groups : 0;
    if (merge_blocks > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "MLA: a merge grid of %lld CTAs (rows x heads x %d column slices), "
                             "more than one launch allows (2^31 - 1)",
                             (long long)merge_blocks, groups);
    CINFER__CHECK(cinfer__context_activate(op->ctx));
    void *params[] = {&p};
    CINFER__CU(ctx->cu,
               cuLaunchKernel(s->kernel.function, (unsigned)blocks, 1, 1,
                              (unsigned)s->shape.warps * 32, 1, 1, (unsigned)s->smem, stream,
                              params, NULL),
               "launching the MLA kernel");
    if (merge_blocks == 0)
        return CINFER_STATUS_SUCCESS;
    p.out = (char *)p.out + (size_t)(row0 * p.out_stride_n) * cinfer__dtype_size(s->dtype);
    if (p.lse)
        p.lse += row0 * p.lse_stride_n;
    return cinfer__launch_merge(ctx, s->merge.function, merge_blocks, MLA_MERGE_THREADS, &p, stream,
                                "launching the MLA merge kernel");
}

void cinfer_batch_mla_destroy(cinfer_batch_mla_t *op) {
    if (!op)
        return;
    if (cinfer__context_activate(op->ctx) == CINFER_STATUS_SUCCESS)
        cinfer__staging_destroy(op->ctx, &op->staging);
    free(op->requests);
    free(op);
}
