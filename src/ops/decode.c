/*
 * Batch and single decode: options -> kernels and workspace size (setup), page table -> schedule
 * (plan, src/sched/decode_plan.c), tensors -> kernel parameters -> launches (run).
 *
 * One function (decode_setup) validates the options, chooses the tiles, loads both kernels and
 * measures how many attention CTAs fit on the device; workspace_size, create and single decode all
 * go through it, so the size they report and the layout they use cannot drift apart.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode_params.h"
#include "jit/jit.h"
#include "ops/decode.h"
#include "ops/options.h"
#include "ops/staging.h"
#include "ops/tensor.h"
#include "sched/decode_plan.h"
#include "variant/variant.h"

/* What the options decide, for one context. */
typedef struct decode_setup {
    cinfer__decode_config_t cfg;
    int head_dim, page_size;
    cinfer_kv_layout_t layout;
    cinfer__dtype_t dtype_q, dtype_kv;
    float q_scale, soft_cap_log2, v_scale, q_in_scale;
    bool rope;                         /* in-kernel RoPE (the CUDA-core kernel) */
    cinfer_pos_rope_params rope_table; /* its frequencies, the RoPE kernel's last parameter */
    cinfer__kernel_t attention, merge;
    const cinfer_variant_t *variant; /* NULL = default attention */
    int tensor_cores;                /* the attention kernel is kernels/decode_tc.cu */
    int attention_threads;           /* its block size: spec warps x 32 */
    unsigned attention_smem;         /* its dynamic shared memory (bytes) */
} decode_setup_t;

/*
 * Chooses the kernel: options->use_tensor_cores = 1 asks for the tensor-core one (UNSUPPORTED if
 * the dtypes or head dim rule it out), 0 for the CUDA-core one; -1 picks the tensor-core kernel
 * wherever it can run, except with in-kernel RoPE (only the CUDA-core kernel rotates q and k).
 * Measured on the H200 (bench/RESULTS.md, 2026-11-29), it was faster on every
 * benchmarked shape: 1.1x on one 4k request, 1.6-1.8x on batches of 16-256 (e.g. 3.88 against
 * 2.27 TB/s at 64 x 4096, 32/8 heads, D = 128), because with the GQA heads as mma rows the dot
 * products and the accumulation no longer compete with the loads for issue slots.
 */
static cinfer_status_t choose_backend(const cinfer_attention_options_t *o, cinfer__dtype_t q,
                                      cinfer__dtype_t kv, int *tensor_cores) {
    const bool fp8 = kv == CINFER__DT_E4M3 || kv == CINFER__DT_E5M2;
    const bool possible = (q == kv || fp8) && (q == CINFER__DT_F16 || q == CINFER__DT_BF16) &&
                          (o->head_dim == 64 || o->head_dim == 128 || o->head_dim == 256);
    if (o->use_tensor_cores < -1 || o->use_tensor_cores > 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->use_tensor_cores = %d, expected -1 (auto), 0 or 1",
                             o->use_tensor_cores);
    /* The tensor-core kernel has no in-kernel RoPE: RoPE runs on the CUDA-core one. */
    if (o->use_tensor_cores == 1 && cinfer__attention_rope(o))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->use_tensor_cores = 1 with pos_encoding_mode = ROPE_LLAMA "
                             "is not supported: the tensor-core decode kernel has no in-kernel "
                             "RoPE; use 0 or -1 (the CUDA-core kernel)");
    if (o->use_tensor_cores == 1 && !possible)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->use_tensor_cores = 1 needs q_dtype fp16 or bf16, kv_dtype "
                             "the same or fp8 (e4m3, e5m2), and head_dim 64, 128 or 256; got q %s, "
                             "kv %s, head_dim %d",
                             cinfer__dtype_name(q), cinfer__dtype_name(kv), o->head_dim);
    *tensor_cores = o->use_tensor_cores == 1 ||
                    (o->use_tensor_cores == -1 && possible && !cinfer__attention_rope(o));
    return CINFER_STATUS_SUCCESS;
}

static cinfer_status_t check_ctx(const cinfer_context_t *ctx) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    return CINFER_STATUS_SUCCESS;
}

/* Query heads per work item: up to 8 on CUDA cores (register arrays), 16 on tensor cores (the
 * rows of one mma tile). */
static int heads_per_cta(const cinfer_attention_options_t *o, int tensor_cores) {
    return cinfer__decode_heads_per_cta(o->num_qo_heads / o->num_kv_heads, tensor_cores ? 16 : 8);
}

cinfer_status_t cinfer__decode_kernel_specs(const cinfer_attention_options_t *o, bool batch,
                                            cinfer__spec_t *attention, cinfer__spec_t *merge,
                                            unsigned *attention_smem) {
    CINFER__CHECK(cinfer__decode_options_check(o, batch));
    CINFER__CHECK(cinfer__variant_options_check(o));
    const cinfer__dtype_t q = cinfer__dl_dtype(o->q_dtype), kv = cinfer__dl_dtype(o->kv_dtype);
    int tensor_cores = 0;
    CINFER__CHECK(choose_backend(o, q, kv, &tensor_cores));
    const int hpc = heads_per_cta(o, tensor_cores);
    cinfer__spec_t *spec = attention;
    cinfer__spec_init(spec, tensor_cores ? CINFER__OP_DECODE_TC : CINFER__OP_DECODE);
    spec->dtype_q = q;
    spec->dtype_kv = kv;
    spec->dtype_o = q;
    spec->head_dim_qk = o->head_dim;
    spec->head_dim_vo = o->head_dim;
    spec->paged = batch ? 1 : 0;
    spec->pos = cinfer__attention_rope(o) ? CINFER__POS_ROPE_LLAMA : CINFER__POS_NONE;
    spec->flags = o->logits_soft_cap > 0 ? CINFER__FLAG_SOFT_CAP : 0;
    spec->variant = o->variant;
    spec->variant_id = cinfer__variant_id(o->variant);
    spec->tile_q = hpc;
    spec->tile_kv = cinfer__decode_tile_kv(hpc);
    spec->warps = tensor_cores ? CINFER__DECODE_TC_WARPS : CINFER__DECODE_WARPS;
    *attention_smem = 0;
    if (tensor_cores) {
        /* Stages of K+V tiles per warp: 2, i.e. 48 KB per 3-warp CTA at D = 128 and 4 CTAs per
         * SM. Measured on the H200 (bench_decode, 2026-11-29, 4-warp CTAs): against 3 stages (96
         * KB, 2 CTAs per SM) the third CTA hides the other two's per-item start and drain, 80%
         * against 75% of the copy ceiling on trace batches of 256, 96% against 88% at 16 x 8192;
         * 2026-11-30, 3-warp CTAs against those 4-warp ones (same run): 64 x 1k 91% against 86%
         * (one wave of 512 items instead of a split stream and its merge), trace batches of 64
         * 89% against 86%, fp8 at 64 x 4k 2% faster, one request of 8k / 32k the same (within
         * 1%). An fp8 tile has twice the tokens of a 16-bit one and as many bytes
         * (kernels/decode_tc.cu), so the stages and the bytes in flight are the same for every KV
         * dtype; fp8 adds Q's fragments (kernels/decode_params.h). */
        const bool fp8 = kv == CINFER__DT_E4M3 || kv == CINFER__DT_E5M2;
        spec->tile_kv = 0;
        spec->stages = 2;
        const unsigned tile_bytes = fp8 ? CINFER_DECODE_TC_TOKENS_FP8 * (unsigned)o->head_dim
                                        : CINFER_DECODE_TC_TOKENS * (unsigned)o->head_dim * 2u;
        const unsigned pipeline = (unsigned)spec->warps * (unsigned)spec->stages * 2u * tile_bytes +
                                  CINFER_DECODE_TC_Q_BYTES(fp8, (unsigned)o->head_dim);
        /* The final merge reuses the buffers: per warp 16 rows x D floats, then (m, l) pairs. */
        const unsigned merge_bytes =
            (unsigned)spec->warps * 16u * ((unsigned)o->head_dim + 2u) * 4u;
        *attention_smem = pipeline > merge_bytes ? pipeline : merge_bytes;
    }
    CINFER__CHECK(cinfer__spec_validate(spec));
    return cinfer__decode_merge_spec(q, o->head_dim, merge);
}

cinfer_status_t cinfer__decode_merge_spec(cinfer__dtype_t dtype, int head_dim,
                                          cinfer__spec_t *spec) {
    cinfer__spec_init(spec, CINFER__OP_DECODE_MERGE);
    spec->dtype_o = dtype;
    spec->head_dim_vo = head_dim;
    spec->warps = CINFER__DECODE_WARPS;
    return cinfer__spec_validate(spec);
}

/*
 * Validates the options (batch: the batch decode fields too), fills the kernel configuration and
 * scales, loads the attention and merge kernels (JIT-compiling on first use) and sets max_ctas to
 * the attention kernel's resident CTAs on the device.
 */
static cinfer_status_t decode_setup(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                                    bool batch, decode_setup_t *s) {
    memset(s, 0, sizeof *s);
    cinfer__spec_t spec, merge;
    CINFER__CHECK(cinfer__decode_kernel_specs(o, batch, &spec, &merge, &s->attention_smem));
    s->cfg.num_qo_heads = o->num_qo_heads;
    s->cfg.num_kv_heads = o->num_kv_heads;
    s->dtype_q = spec.dtype_q;
    s->dtype_kv = spec.dtype_kv;
    s->tensor_cores = spec.op == CINFER__OP_DECODE_TC;
    s->cfg.heads_per_cta = spec.tile_q;
    s->cfg.window_left = o->window_left;
    s->cfg.graph = batch && o->use_cuda_graph;
    s->variant = o->variant;
    /* Partial states of variants without softmax or with an output transform cannot be merged. */
    s->cfg.no_split =
        o->variant &&
        (o->variant->hooks & (CINFER__VARIANT_NO_SOFTMAX | CINFER__VARIANT_OUTPUT_TRANSFORM));
    s->cfg.max_batch_size = batch ? o->max_batch_size : 1;
    s->head_dim = o->head_dim;
    s->page_size = batch ? o->page_size : 1;
    s->layout = o->kv_layout;
    s->rope = cinfer__attention_rope(o);
    cinfer__attention_rope_params(o, &s->rope_table);

    /* The kernel works in base-2 logits: q is pre-scaled by q_scale (ops/options.h). */
    double sm_scale, q_scale, v_scale = o->v_scale;
    cinfer__attention_logit_scales(o, &sm_scale, &q_scale, &s->soft_cap_log2);
    /* The CUDA-core kernel's e4m3 decode yields value / 256 exactly (kernels/dtype.cuh); fold the
     * 256 back into both scales. The tensor-core kernel converts exactly. */
    if (s->dtype_kv == CINFER__DT_E4M3 && !s->tensor_cores) {
        q_scale *= 256.0;
        v_scale *= 256.0;
    }
    /* The tensor-core kernel with fp8 KV converts q to fp16 after multiplying it by sm_scale
     * (so large bf16 queries stay finite); the rest of the scale follows the mma. */
    s->q_in_scale = 1.0f;
    if (s->tensor_cores && (s->dtype_kv == CINFER__DT_E4M3 || s->dtype_kv == CINFER__DT_E5M2)) {
        s->q_in_scale = (float)sm_scale;
        q_scale /= (double)s->q_in_scale;
    }
    s->q_scale = (float)q_scale;
    s->v_scale = (float)v_scale;

    const int merge_threads = CINFER__DECODE_WARPS * 32;
    s->attention_threads = spec.warps * 32;
    CINFER__CHECK(cinfer__jit_kernel(ctx, &spec, &s->attention));
    CINFER__CHECK(cinfer__jit_kernel(ctx, &merge, &s->merge));
    if (s->attention.max_threads < s->attention_threads || s->merge.max_threads < merge_threads)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "decode kernels allow %d / %d threads per block, the launches need "
                             "%d / %d",
                             s->attention.max_threads, s->merge.max_threads, s->attention_threads,
                             merge_threads);
    CINFER__CHECK(cinfer__context_activate(ctx));
    if (s->attention_smem > 0) {
        if (s->attention_smem > (unsigned)ctx->max_smem_per_block_optin)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "the tensor-core decode kernel needs %u bytes of shared memory, "
                                 "the device allows %d per block",
                                 s->attention_smem, ctx->max_smem_per_block_optin);
        CINFER__CU(ctx->cu,
                   cuFuncSetAttribute(s->attention.function,
                                      CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      (int)s->attention_smem),
                   "raising the decode kernel's shared memory limit");
    }
    int per_sm = 0;
    CINFER__CU(ctx->cu,
               cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, s->attention.function,
                                                           s->attention_threads, s->attention_smem),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor (decode kernel)");
    const int64_t ctas = (int64_t)ctx->num_sms * per_sm;
    s->cfg.max_ctas = ctas < 1 ? 1 : ctas > INT32_MAX ? INT32_MAX : (int)ctas;
    /* One-wave chunks grow toward CINFER__DECODE_MIN_CHUNK while this many items remain: for the
     * tensor-core kernel the CTAs whose stages hold CINFER__DECODE_BUSY_WARPS warps' K/V tiles
     * in flight (measured at D = 128 only); the CUDA-core kernel keeps the rule it was measured
     * with (0: all or nothing at half a wave). */
    s->cfg.busy_ctas =
        s->tensor_cores ? CINFER__DECODE_BUSY_WARPS / (s->attention_threads / 32) : 0;

    /* The largest merge grid any plan can need must fit one launch. */
    const int64_t merge_blocks = cinfer__decode_merge_grid(
        &(cinfer__decode_config_t){.num_qo_heads = o->num_qo_heads,
                                   .max_batch_size = s->cfg.max_batch_size},
        o->head_dim, s->cfg.max_batch_size, true, 4);
    if (merge_blocks > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->max_batch_size = %d x num_qo_heads = %d needs %lld merge "
                             "blocks, more than one launch allows (2^31 - 1)",
                             s->cfg.max_batch_size, o->num_qo_heads, (long long)merge_blocks);
    return CINFER_STATUS_SUCCESS;
}

/* ---- tensor checks ---- */

/*
 * The kernels read rows with vector loads of `align` bytes: the data address and the byte stride
 * of every dim that has more than one index must keep rows on that boundary.
 */
static cinfer_status_t check_aligned(const char *arg, const DLTensor *t, int64_t align) {
    const int64_t elem = (int64_t)cinfer__dtype_size(cinfer__tensor_dtype(t));
    const uintptr_t addr = (uintptr_t)cinfer__tensor_data(t);
    if (addr % (uintptr_t)align != 0)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: data address %p is not %lld-byte aligned; decode reads rows with "
                             "%lld-byte vector loads",
                             arg, (void *)addr, (long long)align, (long long)align);
    for (int i = 0; i < t->ndim - 1; i++) {
        const int64_t stride = cinfer__tensor_stride(t, i);
        if (t->shape[i] > 1 && (stride * elem) % align != 0)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "%s: stride of dim %d is %lld elements (%lld bytes), not a "
                                 "multiple of %lld bytes; decode reads rows with %lld-byte vector "
                                 "loads",
                                 arg, i, (long long)stride, (long long)(stride * elem),
                                 (long long)align, (long long)align);
    }
    return CINFER_STATUS_SUCCESS;
}

/* Bytes per vector load of K/V: the CUDA-core kernel loads 8 elements (16 bytes of fp16/bf16, 8 of
 * fp8); the tensor-core kernel copies 16-byte chunks of every dtype (kernels/decode_tc.cu). */
static int64_t kv_align(const decode_setup_t *s) {
    return s->tensor_cores ? 16 : 8 * (int64_t)cinfer__dtype_size(s->dtype_kv);
}

static cinfer_status_t check_lse(const cinfer_context_t *ctx, const DLTensor *lse, int ndim,
                                 const int64_t *shape, const char *origin,
                                 cinfer_status_t shape_status) {
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "lse", lse, ndim, shape, CINFER__DT_F32,
                                          CINFER_STATUS_INVALID_ARGUMENT, shape_status, origin));
    CINFER__CHECK(cinfer__tensor_check_distinct("lse", lse));
    if ((uintptr_t)cinfer__tensor_data(lse) % sizeof(float) != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "lse: data address %p is not 4-byte aligned (float32)",
                             cinfer__tensor_data(lse));
    return CINFER_STATUS_SUCCESS;
}

/*
 * K and V share one set of strides in the kernel parameters: v must have k's strides in every
 * dim that has more than one index (the others are only ever indexed at 0).
 */
static cinfer_status_t check_same_strides(const DLTensor *k, const DLTensor *v) {
    for (int i = 0; i < k->ndim - 1; i++) {
        if (k->shape[i] > 1 && cinfer__tensor_stride(k, i) != cinfer__tensor_stride(v, i))
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "v: stride of dim %d is %lld elements, k's is %lld; decode needs "
                                 "K and V with the same strides",
                                 i, (long long)cinfer__tensor_stride(v, i),
                                 (long long)cinfer__tensor_stride(k, i));
    }
    return CINFER_STATUS_SUCCESS;
}

/* The schedule and scale fields of the params, for a workspace with this layout. */
static void fill_schedule(const decode_setup_t *s, const cinfer__decode_layout_t *layout,
                          void *workspace, cinfer_decode_params *p) {
    char *ws = workspace;
    p->header = (const cinfer_decode_header *)ws;
    p->requests = (const cinfer_decode_request *)(ws + layout->infos_offset);
    p->slice_infos = 1;
    p->work = (const cinfer_decode_work *)(ws + layout->work_offset);
    p->partial_o = (float *)(ws + layout->partial_o_offset);
    p->partial_lse = (float *)(ws + layout->partial_lse_offset);
    p->num_qo_heads = s->cfg.num_qo_heads;
    p->num_kv_heads = s->cfg.num_kv_heads;
    p->heads_per_cta = s->cfg.heads_per_cta;
    p->q_scale = s->q_scale;
    p->soft_cap_log2 = s->soft_cap_log2;
    p->v_scale = s->v_scale;
    p->q_in_scale = s->q_in_scale;
}

cinfer_status_t cinfer__launch_merge(const cinfer_context_t *ctx, CUfunction merge, int64_t grid,
                                     unsigned threads, void *params, CUstream stream,
                                     const char *what) {
    void *args[] = {params};
    CUlaunchAttribute pdl = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
    pdl.value.programmaticStreamSerializationAllowed = 1;
    const CUlaunchConfig config = {.gridDimX = (unsigned)grid,
                                   .gridDimY = 1,
                                   .gridDimZ = 1,
                                   .blockDimX = threads,
                                   .blockDimY = 1,
                                   .blockDimZ = 1,
                                   .sharedMemBytes = 0,
                                   .hStream = stream,
                                   .attrs = &pdl,
                                   .numAttrs = ctx->cc_major >= 9 ? 1u : 0u};
    CINFER__CU(ctx->cu, cuLaunchKernelEx(&config, merge, args, NULL), what);
    return CINFER_STATUS_SUCCESS;
}

/* Launches the attention kernel (with the packed variant parameters) and the merge kernel. */
static cinfer_status_t launch(cinfer_context_t *ctx, const decode_setup_t *s,
                              cinfer_decode_params *p, unsigned char *variant_blob,
                              int attention_grid, int64_t merge_grid, CUstream stream) {
    CINFER__CHECK(cinfer__context_activate(ctx));
    /* The RoPE frequency table is the third parameter of RoPE kernels only; the driver reads as
     * many entries as the kernel has parameters. */
    void *attention_args[] = {p, variant_blob, (void *)&s->rope_table};
    const unsigned threads = (unsigned)s->attention_threads;
    if (attention_grid > 0)
        CINFER__CU(ctx->cu,
                   cuLaunchKernel(s->attention.function, (unsigned)attention_grid, 1, 1, threads, 1,
                                  1, s->attention_smem, stream, attention_args, NULL),
                   "launching the decode kernel");
    if (merge_grid > 0)
        CINFER__CHECK(cinfer__launch_merge(ctx, s->merge.function, merge_grid,
                                           CINFER__DECODE_WARPS * 32, p, stream,
                                           "launching the decode merge kernel"));
    return CINFER_STATUS_SUCCESS;
}

/* Where plan writes a schedule of layout l into host memory (a mirror of the workspace's schedule
 * regions). */
static cinfer__decode_schedule_t schedule_in(const cinfer__decode_layout_t *l, char *host) {
    const cinfer__decode_schedule_t dst = {
        .header = (cinfer_decode_header *)host,
        .infos = (cinfer_decode_request *)(host + l->infos_offset),
        .work = (cinfer_decode_work *)(host + l->work_offset),
        .info_capacity = l->info_capacity,
        .work_capacity = l->work_capacity,
        .slot_capacity = l->slot_capacity,
    };
    return dst;
}

static cinfer_status_t check_workspace(const void *workspace, size_t workspace_bytes, size_t need,
                                       const char *size_function) {
    return cinfer__check_workspace(workspace, workspace_bytes, need, CINFER__DECODE_ALIGN,
                                   size_function);
}

/* ---------------------------------------------------------------------------------------------
 * Batch decode
 * ------------------------------------------------------------------------------------------- */

struct cinfer_batch_decode {
    cinfer_context_t *ctx;
    decode_setup_t setup;
    cinfer__decode_layout_t layout;
    void *workspace; /* device */

    /* Plan's host side: the requests' KV lengths (max_batch_size entries), and the pinned mirrors
     * of the workspace's schedule regions (ops/staging.h). */
    int32_t *kv_len;
    cinfer__staging_t staging;

    /* The current plan (what run checks its arguments against). */
    bool planned;
    int batch_size, num_ctas;
    bool split;
    int merge_warps;               /* the plan's merge kernel warps per (request, query head) */
    cinfer_decode_uniform uniform; /* the plan's items as parameters, if it allows */
    int32_t num_pages;             /* kv_indptr[batch_size] */
};

cinfer_status_t cinfer_batch_decode_workspace_size(cinfer_context_t *ctx,
                                                   const cinfer_attention_options_t *options,
                                                   size_t *device_bytes) {
    if (!device_bytes)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "device_bytes is NULL");
    *device_bytes = 0;
    CINFER__CHECK(check_ctx(ctx));
    decode_setup_t s;
    CINFER__CHECK(decode_setup(ctx, options, true, &s));
    cinfer__decode_layout_t layout;
    CINFER__CHECK(cinfer__decode_batch_layout(&s.cfg, s.head_dim, &layout));
    *device_bytes = layout.total_bytes;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_batch_decode_create(cinfer_context_t *ctx,
                                           const cinfer_attention_options_t *options,
                                           void *workspace, size_t workspace_bytes,
                                           cinfer_batch_decode_t **out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    CINFER__CHECK(check_ctx(ctx));
    cinfer_batch_decode_t *op = calloc(1, sizeof *op);
    if (!op)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "batch decode: out of memory");
    op->ctx = ctx;
    op->workspace = workspace;
    cinfer_status_t st;
    if ((st = decode_setup(ctx, options, true, &op->setup)) ||
        (st = cinfer__decode_batch_layout(&op->setup.cfg, op->setup.head_dim, &op->layout)) ||
        (st = check_workspace(workspace, workspace_bytes, op->layout.total_bytes,
                              "cinfer_batch_decode_workspace_size")))
        goto out_free_op;

    const size_t max_batch = (size_t)op->setup.cfg.max_batch_size;
    op->kv_len = malloc(max_batch * sizeof *op->kv_len);
    if (!op->kv_len) {
        st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                           "batch decode: out of memory for %zu requests", max_batch);
        goto out_free_scratch;
    }

    if ((st = cinfer__context_activate(ctx)))
        goto out_free_scratch;
    if ((st = cinfer__staging_create(ctx, &op->staging, op->layout.schedule_bytes,
                                     CINFER__DECODE_ALIGN, "batch decode")))
        goto out_free_scratch;
    *out = op;
    return CINFER_STATUS_SUCCESS;

out_free_scratch:
    free(op->kv_len);
out_free_op:
    free(op);
    return st;
}

/* In-kernel RoPE rotates at float32 positions: every request's kv_len at most
 * CINFER_ROPE_MAX_LEN. */
static cinfer_status_t check_rope_lens(const int32_t *kv_len, int batch_size) {
    for (int b = 0; b < batch_size; b++)
        if (kv_len[b] > CINFER_ROPE_MAX_LEN)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "request %d: kv_len = %d with in-kernel RoPE: expected at most "
                                 "CINFER_ROPE_MAX_LEN = %d (positions exact in float32)",
                                 b, (int)kv_len[b], CINFER_ROPE_MAX_LEN);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_batch_decode_plan(cinfer_batch_decode_t *op, const int32_t *kv_indptr,
                                         const int32_t *kv_last_page_len, int batch_size,
                                         CUstream stream) {
    if (!op)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    const decode_setup_t *s = &op->setup;
    /* Everything that can reject the arguments runs before the previous plan is touched. */
    CINFER__CHECK(cinfer__decode_kv_lens(kv_indptr, kv_last_page_len, batch_size,
                                         s->cfg.max_batch_size, s->page_size, op->kv_len));
    if (s->rope)
        CINFER__CHECK(check_rope_lens(op->kv_len, batch_size));
    cinfer__decode_chunking_t chunking;
    CINFER__CHECK(cinfer__decode_plan_chunks(&s->cfg, op->kv_len, batch_size, &chunking));

    cinfer_context_t *ctx = op->ctx;
    CINFER__CHECK(cinfer__staging_check_stream(ctx, stream, "cinfer_batch_decode_plan"));
    char *host = NULL;
    CINFER__CHECK(cinfer__staging_next(ctx, &op->staging, &host));
    op->planned = false;
    const cinfer__decode_schedule_t dst = schedule_in(&op->layout, host);
    CINFER__CHECK(
        cinfer__decode_plan_build(&s->cfg, op->kv_len, kv_indptr, batch_size, &chunking, &dst));
    const size_t bytes =
        op->layout.work_offset + (size_t)chunking.num_work * sizeof(cinfer_decode_work);
    CINFER__CHECK(cinfer__staging_copy(ctx, &op->staging, op->workspace, bytes, stream,
                                       "copying the decode schedule to the workspace"));

    op->planned = true;
    op->batch_size = batch_size;
    op->num_ctas = chunking.num_ctas;
    op->split = chunking.split;
    op->merge_warps = chunking.merge_warps;
    cinfer__decode_plan_uniform(&s->cfg, op->kv_len, kv_indptr, batch_size, &chunking,
                                &op->uniform);
    op->num_pages = kv_indptr[batch_size];
    return CINFER_STATUS_SUCCESS;
}

/* Fills the K/V fields of params from a paged cache (separate k/v, or combined k with v NULL). */
static cinfer_status_t check_paged_cache(const cinfer_batch_decode_t *op, const DLTensor *k_cache,
                                         const DLTensor *v_cache, cinfer_decode_params *p) {
    const decode_setup_t *s = &op->setup;
    const cinfer_context_t *ctx = op->ctx;
    const bool nhd = s->layout == CINFER_KV_LAYOUT_NHD;
    const int64_t P = s->page_size, Hk = s->cfg.num_kv_heads, D = s->head_dim;
    const int64_t a = nhd ? P : Hk, b = nhd ? Hk : P;
    const char *origin =
        nhd ? "NHD [max_pages, page_size, num_kv_heads, head_dim] from the options"
            : "HND [max_pages, num_kv_heads, page_size, head_dim] from the options";
    const char *origin_combined =
        nhd ? "combined NHD [max_pages, 2, page_size, num_kv_heads, head_dim] from the options "
              "(v_cache is NULL)"
            : "combined HND [max_pages, 2, num_kv_heads, page_size, head_dim] from the options "
              "(v_cache is NULL)";
    const int64_t align = kv_align(s);
    int first; /* the dim of k_cache after the page (and K/V) dims */
    if (v_cache) {
        const int64_t shape[4] = {-1, a, b, D};
        CINFER__CHECK(cinfer__tensor_check_as(ctx, "k_cache", k_cache, 4, shape, s->dtype_kv,
                                              CINFER_STATUS_PLAN_MISMATCH,
                                              CINFER_STATUS_PLAN_MISMATCH, origin));
        const int64_t v_shape[4] = {k_cache->shape[0], a, b, D};
        CINFER__CHECK(cinfer__tensor_check_as(ctx, "v_cache", v_cache, 4, v_shape, s->dtype_kv,
                                              CINFER_STATUS_PLAN_MISMATCH,
                                              CINFER_STATUS_PLAN_MISMATCH, "k_cache's shape"));
        CINFER__CHECK(check_aligned("k_cache", k_cache, align));
        CINFER__CHECK(check_aligned("v_cache", v_cache, align));
        CINFER__CHECK(check_same_strides(k_cache, v_cache));
        p->k = cinfer__tensor_data(k_cache);
        p->v = cinfer__tensor_data(v_cache);
        first = 1;
    } else {
        const int64_t shape[5] = {-1, 2, a, b, D};
        CINFER__CHECK(cinfer__tensor_check_as(ctx, "k_cache", k_cache, 5, shape, s->dtype_kv,
                                              CINFER_STATUS_PLAN_MISMATCH,
                                              CINFER_STATUS_PLAN_MISMATCH, origin_combined));
        CINFER__CHECK(check_aligned("k_cache", k_cache, align));
        p->k = cinfer__tensor_data(k_cache);
        p->v = (const char *)p->k +
               cinfer__tensor_stride(k_cache, 1) * (int64_t)cinfer__dtype_size(s->dtype_kv);
        first = 2;
    }
    p->kv_stride_page = cinfer__tensor_stride(k_cache, 0);
    p->kv_stride_token = cinfer__tensor_stride(k_cache, nhd ? first : first + 1);
    p->kv_stride_head = cinfer__tensor_stride(k_cache, nhd ? first + 1 : first);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_batch_decode_run(cinfer_batch_decode_t *op, const DLTensor *q,
                                        const DLTensor *k_cache, const DLTensor *v_cache,
                                        const DLTensor *kv_indptr, const DLTensor *kv_indices,
                                        const DLTensor *kv_last_page_len, DLTensor *out,
                                        DLTensor *lse, const cinfer_args_t *args, CUstream stream) {
    if (!op)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    if (!op->planned)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "op has no plan: call cinfer_batch_decode_plan before run");
    const decode_setup_t *s = &op->setup;
    const cinfer_context_t *ctx = op->ctx;
    const int64_t B = op->batch_size, Hq = s->cfg.num_qo_heads, D = s->head_dim;
    const char *q_origin = "[batch_size, num_qo_heads, head_dim]: batch_size from the plan, the "
                           "others from the options";
    const int64_t q_shape[3] = {B, Hq, D};
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "q", q, 3, q_shape, s->dtype_q,
                                          CINFER_STATUS_PLAN_MISMATCH, CINFER_STATUS_PLAN_MISMATCH,
                                          q_origin));
    CINFER__CHECK(check_aligned("q", q, 16));

    cinfer_decode_params p;
    memset(&p, 0, sizeof p);
    CINFER__CHECK(check_paged_cache(op, k_cache, v_cache, &p));

    const int64_t indptr_shape[1] = {B + 1}, last_shape[1] = {B}, any[1] = {-1};
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "kv_indptr", kv_indptr, 1, indptr_shape,
                                          CINFER__DT_I32, CINFER_STATUS_INVALID_ARGUMENT,
                                          CINFER_STATUS_PLAN_MISMATCH,
                                          "[batch_size + 1] with batch_size from the plan"));
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "kv_indices", kv_indices, 1, any, CINFER__DT_I32,
                                          CINFER_STATUS_INVALID_ARGUMENT,
                                          CINFER_STATUS_PLAN_MISMATCH, "[kv_indptr[batch_size]]"));
    if (kv_indices->shape[0] < op->num_pages)
        return cinfer__error(CINFER_STATUS_PLAN_MISMATCH,
                             "kv_indices: %lld entries, but the planned kv_indptr[%d] = %d pages",
                             (long long)kv_indices->shape[0], op->batch_size, op->num_pages);
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "kv_last_page_len", kv_last_page_len, 1, last_shape,
                                          CINFER__DT_I32, CINFER_STATUS_INVALID_ARGUMENT,
                                          CINFER_STATUS_PLAN_MISMATCH,
                                          "[batch_size] with batch_size from the plan"));
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "out", out, 3, q_shape, s->dtype_q,
                                          CINFER_STATUS_PLAN_MISMATCH, CINFER_STATUS_PLAN_MISMATCH,
                                          q_origin));
    CINFER__CHECK(check_aligned("out", out, 16));
    CINFER__CHECK(cinfer__tensor_check_distinct("out", out));
    if (lse) {
        const int64_t lse_shape[2] = {B, Hq};
        CINFER__CHECK(check_lse(ctx, lse, 2, lse_shape,
                                "[batch_size, num_qo_heads]: batch_size from the plan, "
                                "num_qo_heads from the options",
                                CINFER_STATUS_PLAN_MISMATCH));
    }
    /* The outputs apart from everything else; nothing may overlap the workspace (the plan's
     * schedule, the partial states the kernels write). */
    const cinfer__tensor_arg_t tensors[] = {{"out", out, false},
                                            {"lse", lse, false},
                                            {"q", q, false},
                                            {"k_cache", k_cache, false},
                                            {"v_cache", v_cache, false},
                                            {"kv_indptr", kv_indptr, false},
                                            {"kv_indices", kv_indices, false},
                                            {"kv_last_page_len", kv_last_page_len, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    CINFER__CHECK(cinfer__tensor_check_workspace(op->workspace, op->layout.total_bytes, tensors,
                                                 CINFER__TENSOR_COUNT(tensors)));
    CINFER__CHECK(cinfer__variant_lse_check(s->variant, lse, "cinfer_batch_decode_run"));
    unsigned char variant_blob[CINFER__VARIANT_MAX_BYTES];
    size_t variant_bytes = 0;
    CINFER__CHECK(cinfer__variant_pack(s->variant, args, Hq, B, ctx, "cinfer_batch_decode_run",
                                       variant_blob, &variant_bytes));
    CINFER__CHECK(cinfer__variant_check_disjoint(s->variant, args, out, lse));

    p.q = cinfer__tensor_data(q);
    p.q_stride_n = cinfer__tensor_stride(q, 0);
    p.q_stride_h = cinfer__tensor_stride(q, 1);
    p.kv_indptr = cinfer__tensor_data(kv_indptr);
    p.kv_indices = cinfer__tensor_data(kv_indices);
    p.kv_last_page_len = cinfer__tensor_data(kv_last_page_len);
    p.page_size = s->page_size;
    p.page_shift = cinfer__page_shift(s->page_size);
    p.out = cinfer__tensor_data(out);
    p.out_stride_n = cinfer__tensor_stride(out, 0);
    p.out_stride_h = cinfer__tensor_stride(out, 1);
    if (lse) {
        p.lse = cinfer__tensor_data(lse);
        p.lse_stride_n = cinfer__tensor_stride(lse, 0);
        p.lse_stride_h = cinfer__tensor_stride(lse, 1);
    }
    fill_schedule(s, &op->layout, op->workspace, &p);
    p.uniform = op->uniform;
    return launch(
        op->ctx, s, &p, variant_blob, cinfer__decode_attention_grid(&s->cfg, op->num_ctas),
        cinfer__decode_merge_grid(&s->cfg, s->head_dim, op->batch_size, op->split, op->merge_warps),
        stream);
}

void cinfer_batch_decode_destroy(cinfer_batch_decode_t *op) {
    if (!op)
        return;
    if (cinfer__context_activate(op->ctx) == CINFER_STATUS_SUCCESS) {
        /* A pinned mirror may still be the source of an enqueued copy. */
        cinfer__staging_destroy(op->ctx, &op->staging);
    }
    free(op->kv_len);
    free(op);
}

/* ---------------------------------------------------------------------------------------------
 * Single decode
 * ------------------------------------------------------------------------------------------- */

/* The chunking and exact workspace layout of one request of kv_len tokens. */
static cinfer_status_t single_plan(const decode_setup_t *s, int32_t kv_len,
                                   cinfer__decode_chunking_t *chunking,
                                   cinfer__decode_layout_t *layout) {
    CINFER__CHECK(cinfer__decode_plan_chunks(&s->cfg, &kv_len, 1, chunking));
    cinfer__decode_layout(chunking->num_work, cinfer__decode_units(&s->cfg), chunking->num_slots,
                          s->cfg.heads_per_cta, s->head_dim, layout);
    return CINFER_STATUS_SUCCESS;
}

/* Builds the schedule of a single decode plan in pageable memory and copies it into the workspace
 * on stream (cinfer__copy_pageable). */
static cinfer_status_t upload_single_schedule(cinfer_context_t *ctx, const decode_setup_t *s,
                                              int32_t kv_len,
                                              const cinfer__decode_chunking_t *chunking,
                                              const cinfer__decode_layout_t *layout,
                                              void *workspace, CUstream stream) {
    char *host = calloc(1, layout->schedule_bytes);
    if (!host)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "single decode: out of memory for a %zu-byte schedule",
                             layout->schedule_bytes);
    const cinfer__decode_schedule_t dst = schedule_in(layout, host);
    cinfer_status_t st = cinfer__decode_plan_build(&s->cfg, &kv_len, NULL, 1, chunking, &dst);
    if (st == CINFER_STATUS_SUCCESS)
        st = cinfer__copy_pageable(ctx, workspace, host, layout->schedule_bytes, stream,
                                   "copying the single decode schedule to the workspace");
    free(host);
    return st;
}

static cinfer_status_t check_kv_len(int64_t kv_len) {
    if (kv_len < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "kv_len = %lld, expected >= 0",
                             (long long)kv_len);
    if (kv_len > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED, "kv_len = %lld exceeds 2^31 - 1",
                             (long long)kv_len);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_single_decode_workspace_size(cinfer_context_t *ctx,
                                                    const cinfer_attention_options_t *options,
                                                    int64_t kv_len, size_t *device_bytes) {
    if (!device_bytes)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "device_bytes is NULL");
    *device_bytes = 0;
    CINFER__CHECK(check_ctx(ctx));
    CINFER__CHECK(check_kv_len(kv_len));
    decode_setup_t s;
    CINFER__CHECK(decode_setup(ctx, options, false, &s));
    cinfer__decode_chunking_t chunking;
    cinfer__decode_layout_t layout;
    CINFER__CHECK(single_plan(&s, (int32_t)kv_len, &chunking, &layout));
    *device_bytes = layout.total_bytes;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_single_decode(cinfer_context_t *ctx,
                                     const cinfer_attention_options_t *options, const DLTensor *q,
                                     const DLTensor *k, const DLTensor *v, DLTensor *out,
                                     DLTensor *lse, const cinfer_args_t *args, void *workspace,
                                     size_t workspace_bytes, CUstream stream) {
    CINFER__CHECK(check_ctx(ctx));
    decode_setup_t s;
    CINFER__CHECK(decode_setup(ctx, options, false, &s));
    const int64_t Hq = s.cfg.num_qo_heads, Hk = s.cfg.num_kv_heads, D = s.head_dim;
    const bool nhd = s.layout == CINFER_KV_LAYOUT_NHD;
    const char *q_origin = "[num_qo_heads, head_dim] from the options";
    const int64_t q_shape[2] = {Hq, D};
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "q", q, 2, q_shape, s.dtype_q,
                                          CINFER_STATUS_INVALID_ARGUMENT,
                                          CINFER_STATUS_INVALID_ARGUMENT, q_origin));
    CINFER__CHECK(check_aligned("q", q, 16));
    const int64_t k_shape[3] = {nhd ? -1 : Hk, nhd ? Hk : -1, D};
    const char *k_origin = nhd ? "NHD [kv_len, num_kv_heads, head_dim] from the options"
                               : "HND [num_kv_heads, kv_len, head_dim] from the options";
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "k", k, 3, k_shape, s.dtype_kv,
                                          CINFER_STATUS_INVALID_ARGUMENT,
                                          CINFER_STATUS_INVALID_ARGUMENT, k_origin));
    const int64_t kv_len = k->shape[nhd ? 0 : 1];
    CINFER__CHECK(check_kv_len(kv_len));
    CINFER__CHECK(cinfer__attention_rope_lens(options, 1, kv_len, "cinfer_single_decode"));
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "v", v, 3, k->shape, s.dtype_kv,
                                          CINFER_STATUS_INVALID_ARGUMENT,
                                          CINFER_STATUS_INVALID_ARGUMENT, "k's shape"));
    const int64_t align = kv_align(&s);
    CINFER__CHECK(check_aligned("k", k, align));
    CINFER__CHECK(check_aligned("v", v, align));
    CINFER__CHECK(check_same_strides(k, v));
    CINFER__CHECK(cinfer__tensor_check_as(ctx, "out", out, 2, q_shape, s.dtype_q,
                                          CINFER_STATUS_INVALID_ARGUMENT,
                                          CINFER_STATUS_INVALID_ARGUMENT, q_origin));
    CINFER__CHECK(check_aligned("out", out, 16));
    CINFER__CHECK(cinfer__tensor_check_distinct("out", out));
    if (lse) {
        const int64_t lse_shape[1] = {Hq};
        CINFER__CHECK(check_lse(ctx, lse, 1, lse_shape, "[num_qo_heads] from the options",
                                CINFER_STATUS_INVALID_ARGUMENT));
    }
    const cinfer__tensor_arg_t tensors[] = {{"out", out, false},
                                            {"lse", lse, false},
                                            {"q", q, false},
                                            {"k", k, false},
                                            {"v", v, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    CINFER__CHECK(cinfer__variant_lse_check(s.variant, lse, "cinfer_single_decode"));
    unsigned char variant_blob[CINFER__VARIANT_MAX_BYTES];
    size_t variant_bytes = 0;
    CINFER__CHECK(cinfer__variant_pack(s.variant, args, Hq, 1, ctx, "cinfer_single_decode",
                                       variant_blob, &variant_bytes));
    CINFER__CHECK(cinfer__variant_check_disjoint(s.variant, args, out, lse));

    cinfer__decode_chunking_t chunking;
    cinfer__decode_layout_t layout;
    const int32_t len = (int32_t)kv_len;
    CINFER__CHECK(single_plan(&s, len, &chunking, &layout));
    CINFER__CHECK(check_workspace(workspace, workspace_bytes, layout.total_bytes,
                                  "cinfer_single_decode_workspace_size"));
    CINFER__CHECK(cinfer__tensor_check_workspace(workspace, layout.total_bytes, tensors,
                                                 CINFER__TENSOR_COUNT(tensors)));

    cinfer_decode_params p;
    memset(&p, 0, sizeof p);
    cinfer__decode_plan_uniform(&s.cfg, &len, NULL, 1, &chunking, &p.uniform);
    /* A uniform plan travels in the kernels' parameters, and nothing is copied (a plan of more
     * head slices than one wave of CTAs has none). */
    if (p.uniform.pieces == 0) {
        /* A capture would take the pageable copy as an error that invalidates it: refused first. */
        bool capturing = false;
        CINFER__CHECK(cinfer__stream_capturing(ctx, stream, &capturing));
        if (capturing)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "cinfer_single_decode: a plan of %d work items (more than one "
                                 "wave of CTAs) copies its schedule from host memory, which a "
                                 "CUDA graph capture cannot take; capture batch decode in CUDA "
                                 "graph mode instead",
                                 chunking.num_work);
        CINFER__CHECK(upload_single_schedule(ctx, &s, len, &chunking, &layout, workspace, stream));
    }
    /* One request: batch index 0 only, so the batch strides are never multiplied by anything
     * but 0. */
    p.q = cinfer__tensor_data(q);
    p.q_stride_h = cinfer__tensor_stride(q, 0);
    p.k = cinfer__tensor_data(k);
    p.v = cinfer__tensor_data(v);
    p.kv_stride_token = cinfer__tensor_stride(k, nhd ? 0 : 1);
    p.kv_stride_head = cinfer__tensor_stride(k, nhd ? 1 : 0);
    p.page_size = 1;
    p.page_shift = 0;
    p.out = cinfer__tensor_data(out);
    p.out_stride_h = cinfer__tensor_stride(out, 0);
    if (lse) {
        p.lse = cinfer__tensor_data(lse);
        p.lse_stride_h = cinfer__tensor_stride(lse, 0);
    }
    fill_schedule(&s, &layout, workspace, &p);
    return launch(
        ctx, &s, &p, variant_blob, cinfer__decode_attention_grid(&s.cfg, chunking.num_ctas),
        cinfer__decode_merge_grid(&s.cfg, s.head_dim, 1, chunking.split, chunking.merge_warps),
        stream);
}
