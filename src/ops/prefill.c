/*
 * Single-request prefill: options and tensor checks, tile choice, spec, launch of the sm80
 * tensor-core kernel (kernels/prefill.cu). Workspace-free: one launch writes out and lse directly.
 */
#include <math.h>
#include <string.h>

#include "jit/jit.h"
#include "ops/prefill.h"
#include "variant/variant.h"
#include "ops/options.h"
#include "ops/tensor.h"
#include "prefill_params.h"

/* ---- options ---- */

/* What prefill reads from the options; page_size, use_cuda_graph, max_batch_size and
 * use_tensor_cores are ignored. */
static cinfer_status_t options_check(const cinfer_attention_options_t *o) {
    const cinfer__dtype_t q = o ? cinfer__dl_dtype(o->q_dtype) : CINFER__DT_NONE;
    char hint[96];
    cinfer__fmt(hint, sizeof hint, "the q_dtype, %s (fp8 KV prefill is not implemented)",
                q == CINFER__DT_BF16 ? "bf16" : "fp16");
    CINFER__CHECK(cinfer__attention_options_check(
        o, CINFER__DTS(q == CINFER__DT_NONE ? CINFER__DT_F16 : q), hint));
    CINFER__CHECK(cinfer__variant_options_check(o));
    /* The kernel steps through the head dim in mma k16 steps and n8 tiles (kernels/prefill.cu);
     * 256 bounds the O accumulators a warp keeps in registers. */
    if (o->head_dim % 16 != 0 || o->head_dim > 256)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->head_dim = %d is not supported by prefill: expected a "
                             "multiple of 16, at most 256",
                             o->head_dim);
    return CINFER_STATUS_SUCCESS;
}

/* ---- tiles ---- */

size_t cinfer__prefill_smem_bytes(int head_dim, const cinfer__prefill_config_t *cfg) {
    const size_t row_chunks = (size_t)head_dim / 8 + (head_dim % 64 ? 1 : 0);
    return 16 * row_chunks * ((size_t)cfg->tile_q + 2 * (size_t)cfg->stages * cfg->tile_kv);
}

/*
 * Register budget first: a warp keeps 16 x D fp32 O accumulators per 16 query rows (D / 2 per
 * lane), plus S (TILE_KV / 2 per lane per 16 rows) and, when they fit, the Q fragments. These
 * compile without local memory for every mask, flag and dtype with NVRTC 13.0 for sm_80 and
 * sm_90a (cuobjdump --dump-resource-usage; registers of the causal bf16 kernel on sm_90a):
 *   D <= 64:  4 warps x 32 rows, KV 32, 3 stages (221); KV 64 spills on sm_90a with a window;
 *   D <= 128: 8 warps x 16 rows, KV 64, 2 stages (214); 32 rows per warp needs KV 32 and 255;
 *   D <= 256: 4 warps x 16 rows, KV 32, 2 stages (246); 208..240, whose padded rows take the
 *             generic copy loop, reach 255 and spill with KV 32, so they use KV 16, 3 stages.
 * 32 rows per warp halves the shared-memory reads per mma; bench_prefill --sweep compares the
 * D = 128 candidates on the GPU. All of these fit the 99 KiB of sm_86/sm_89 as well.
 */
void cinfer__prefill_default_config(int head_dim, int max_smem, cinfer__prefill_config_t *cfg) {
    if (head_dim <= 64) {
        *cfg = (cinfer__prefill_config_t){.tile_q = 128, .tile_kv = 32, .warps = 4, .stages = 3};
    } else if (head_dim <= 128) {
        *cfg = (cinfer__prefill_config_t){.tile_q = 128, .tile_kv = 64, .warps = 8, .stages = 2};
    } else if (head_dim <= 192 || head_dim % 64 == 0) {
        *cfg = (cinfer__prefill_config_t){.tile_q = 64, .tile_kv = 32, .warps = 4, .stages = 2};
    } else {
        *cfg = (cinfer__prefill_config_t){.tile_q = 64, .tile_kv = 16, .warps = 4, .stages = 3};
    }
    /* Shrink until the tiles fit the device: stages, then KV rows, then query rows. */
    while (cinfer__prefill_smem_bytes(head_dim, cfg) > (size_t)max_smem) {
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

/* The default tiles on a device allowing max_smem_optin bytes of shared memory per block. */
static void device_config(int head_dim, int max_smem_optin, cinfer__prefill_config_t *cfg) {
    /* Leave room for the static shared memory the toolchain may reserve (1 KiB on sm_90a). */
    cinfer__prefill_default_config(head_dim, max_smem_optin - 1024, cfg);
}

void cinfer__prefill_context_config(const cinfer_context_t *ctx, int head_dim,
                                    cinfer__prefill_config_t *cfg) {
    device_config(head_dim, ctx->max_smem_per_block_optin, cfg);
}

/* ---- spec ---- */

/* The kernel's spec for checked options, a causal flag and tiles. */
static cinfer_status_t build_spec(const cinfer_attention_options_t *o, int causal,
                                  const cinfer__prefill_config_t *cfg, cinfer__spec_t *spec) {
    const cinfer__dtype_t dtype = cinfer__dl_dtype(o->q_dtype);
    cinfer__spec_init(spec, CINFER__OP_PREFILL);
    spec->backend = CINFER__BACKEND_SM80;
    spec->dtype_q = spec->dtype_kv = spec->dtype_o = dtype;
    spec->head_dim_qk = spec->head_dim_vo = (int32_t)o->head_dim;
    spec->mask = causal ? CINFER__MASK_CAUSAL : CINFER__MASK_NONE;
    spec->flags = (o->logits_soft_cap > 0 ? CINFER__FLAG_SOFT_CAP : 0) |
                  (o->window_left >= 0 ? CINFER__FLAG_WINDOW : 0);
    spec->tile_q = cfg->tile_q;
    spec->tile_kv = cfg->tile_kv;
    spec->warps = cfg->warps;
    spec->stages = cfg->stages;
    spec->variant = o->variant;
    spec->variant_id = cinfer__variant_id(o->variant);
    return cinfer__spec_validate(spec);
}

/*
 * The spec of the kernel cinfer_single_prefill loads for these options and causal flag, with the
 * default tiles of a device allowing max_smem_optin bytes of shared memory per block: what
 * ahead-of-time builds compile. Validates the options.
 */
cinfer_status_t cinfer__prefill_kernel_spec(const cinfer_attention_options_t *o, int causal,
                                            int max_smem_optin, cinfer__spec_t *spec) {
    CINFER__CHECK(options_check(o));
    if (causal != 0 && causal != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "causal = %d, expected 0 or 1",
                             causal);
    cinfer__prefill_config_t cfg;
    device_config(o->head_dim, max_smem_optin, &cfg);
    return build_spec(o, causal, &cfg, spec);
}

/* ---- tensors ---- */

/*
 * Checks one tensor argument: NULL and ndim, dtype, shape with -1 = any (`origin` says where the
 * expected shape comes from), then contiguity of the last dim, data and device.
 */
static cinfer_status_t check_tensor(const cinfer_context_t *ctx, const char *arg, const DLTensor *t,
                                    int ndim, const int64_t *shape, cinfer__dtype_t dtype,
                                    const char *origin) {
    if (!t)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s is NULL", arg);
    if (t->ndim != ndim)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: ndim %d, expected %d (%s)", arg,
                             t->ndim, ndim, origin);
    const cinfer__dtype_t dt = cinfer__tensor_dtype(t);
    if (dt != dtype)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: dtype %s (code %u, %u bits, %u lanes), expected %s", arg,
                             dt ? cinfer__dtype_name(dt) : "unsupported", t->dtype.code,
                             t->dtype.bits, t->dtype.lanes, cinfer__dtype_name(dtype));
    for (int i = 0; i < ndim; i++) {
        if (shape[i] >= 0 && t->shape[i] != shape[i]) {
            char got[128], want[128];
            cinfer__shape_string(got, sizeof got, ndim, t->shape);
            cinfer__shape_string(want, sizeof want, ndim, shape);
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: shape %s, expected %s (%s)",
                                 arg, got, want, origin);
        }
    }
    return cinfer__tensor_check(ctx, arg, t, ndim, shape, CINFER__DTS(dtype));
}

/*
 * The kernel moves rows in 16-byte pieces (cp.async, vector stores): the data address and the
 * byte stride of every dim that has more than one index must keep rows on 16-byte boundaries.
 */
static cinfer_status_t check_aligned(const char *arg, const DLTensor *t) {
    const uintptr_t addr = (uintptr_t)cinfer__tensor_data(t);
    if (addr % 16 != 0)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: data address %p is not 16-byte aligned; prefill moves rows in "
                             "16-byte pieces",
                             arg, (void *)addr);
    for (int i = 0; i < t->ndim - 1; i++) {
        const int64_t stride = cinfer__tensor_stride(t, i);
        if (t->shape[i] > 1 && (stride * 2) % 16 != 0)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "%s: stride of dim %d is %lld elements (%lld bytes), not a "
                                 "multiple of 16 bytes; prefill moves rows in 16-byte pieces",
                                 arg, i, (long long)stride, (long long)(stride * 2));
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

/* The stride of dim i, or 0 when the dim has at most one index (the kernel then never moves
 * along it, and a caller's arbitrary stride there must not matter). */
static long long stride_of(const DLTensor *t, int i) {
    return t->shape[i] > 1 ? (long long)cinfer__tensor_stride(t, i) : 0;
}

/* ---- the call ---- */

cinfer_status_t
cinfer__single_prefill_config(cinfer_context_t *ctx, const cinfer_attention_options_t *o,
                              int causal, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                              DLTensor *out, DLTensor *lse, const cinfer_args_t *args,
                              const cinfer__prefill_config_t *tiles, CUstream stream) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "ctx is NULL");
    CINFER__CHECK(options_check(o));
    if (causal != 0 && causal != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "causal = %d, expected 0 or 1",
                             causal);
    const cinfer__dtype_t dtype = cinfer__dl_dtype(o->q_dtype);
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
    CINFER__CHECK(check_tensor(ctx, "k", k, 3, k_shape, dtype, k_origin));
    const int64_t kv_len = k->shape[nhd ? 0 : 1];
    CINFER__CHECK(check_len("kv_len", kv_len));
    CINFER__CHECK(check_tensor(ctx, "v", v, 3, k->shape, dtype, "k's shape"));
    const int64_t out_shape[3] = {qo_len, Hq, D};
    CINFER__CHECK(check_tensor(ctx, "out", out, 3, out_shape, dtype, "q's shape"));
    CINFER__CHECK(cinfer__variant_lse_check(o->variant, lse, "cinfer_single_prefill"));
    if (lse) {
        const int64_t lse_shape[2] = {qo_len, Hq};
        CINFER__CHECK(check_tensor(ctx, "lse", lse, 2, lse_shape, CINFER__DT_F32,
                                   "[qo_len, num_qo_heads] from q"));
    }
    CINFER__CHECK(check_aligned("q", q));
    CINFER__CHECK(check_aligned("k", k));
    CINFER__CHECK(check_aligned("v", v));
    CINFER__CHECK(check_aligned("out", out));

    cinfer__prefill_config_t cfg;
    if (tiles)
        cfg = *tiles;
    else
        cinfer__prefill_context_config(ctx, (int)D, &cfg);
    const size_t smem = cinfer__prefill_smem_bytes((int)D, &cfg);
    if (smem > (size_t)ctx->max_smem_per_block_optin)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "prefill tiles (tile_q %d, tile_kv %d, stages %d) need %zu bytes of "
                             "shared memory; the device allows %d per block",
                             cfg.tile_q, cfg.tile_kv, cfg.stages, smem,
                             ctx->max_smem_per_block_optin);

    cinfer__spec_t spec;
    CINFER__CHECK(build_spec(o, causal, &cfg, &spec));
    unsigned char variant_blob[CINFER__VARIANT_MAX_BYTES];
    size_t variant_bytes = 0;
    CINFER__CHECK(cinfer__variant_pack(o->variant, args, ctx, "cinfer_single_prefill", variant_blob,
                                       &variant_bytes));

    const int64_t num_q_tiles = (qo_len + cfg.tile_q - 1) / cfg.tile_q;
    const int64_t blocks = num_q_tiles * Hq;
    if (blocks > 0x7fffffff)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "qo_len = %lld x num_qo_heads = %lld needs %lld CTAs, more than one "
                             "launch allows (2^31 - 1)",
                             (long long)qo_len, (long long)Hq, (long long)blocks);
    /* The kernel is loaded (compiled on first use) even when there is nothing to do, so a
     * configuration error shows up on the first call, not on the first non-empty one. */
    cinfer__kernel_t kernel;
    CINFER__CHECK(cinfer__jit_kernel(ctx, &spec, &kernel));
    if (blocks == 0)
        return CINFER_STATUS_SUCCESS;

    cinfer_prefill_params p;
    memset(&p, 0, sizeof p);
    p.q = cinfer__tensor_data(q);
    p.q_stride_n = stride_of(q, 0);
    p.q_stride_h = stride_of(q, 1);
    p.k = cinfer__tensor_data(k);
    p.v = cinfer__tensor_data(v);
    p.k_stride_n = stride_of(k, nhd ? 0 : 1);
    p.k_stride_h = stride_of(k, nhd ? 1 : 0);
    p.v_stride_n = stride_of(v, nhd ? 0 : 1);
    p.v_stride_h = stride_of(v, nhd ? 1 : 0);
    p.out = cinfer__tensor_data(out);
    p.out_stride_n = stride_of(out, 0);
    p.out_stride_h = stride_of(out, 1);
    if (lse) {
        p.lse = cinfer__tensor_data(lse);
        p.lse_stride_n = stride_of(lse, 0);
        p.lse_stride_h = stride_of(lse, 1);
    }
    p.qo_len = (int)qo_len;
    p.kv_len = (int)kv_len;
    p.num_qo_heads = (int)Hq;
    p.num_kv_heads = (int)Hk;
    p.num_q_tiles = (int)num_q_tiles;
    /* A window of kv_len or more masks nothing (p_i - w < 0 for every row), so clamping keeps
     * p_i - w inside an int. */
    p.window_left =
        o->window_left < 0 ? 0 : (o->window_left > kv_len ? (int)kv_len : o->window_left);

    /* Base-2 logits: q . k * sm_scale * k_scale * log2(e); with a soft cap c the kernel computes
     * c * log2(e) * tanh(q . k * sm_scale * k_scale / c). */
    const double log2e = 1.4426950408889634;
    const double sm_scale = o->sm_scale > 0 ? (double)o->sm_scale : 1.0 / sqrt((double)D);
    double q_scale = sm_scale * o->k_scale;
    if (o->logits_soft_cap > 0) {
        q_scale /= o->logits_soft_cap;
        p.soft_cap_log2 = (float)(o->logits_soft_cap * log2e);
    } else if (!(o->variant && (o->variant->hooks & CINFER__VARIANT_LOGITS))) {
        q_scale *= log2e; /* (logit hooks take natural-log units) */
    }
    p.q_scale = (float)q_scale;
    p.v_scale = o->v_scale;

    CINFER__CHECK(cinfer__context_activate(ctx));
    /* Static shared memory the toolchain reserves (1 KiB on sm_90a) counts against the same
     * per-block limit. */
    int static_smem = 0;
    CINFER__CU(
        ctx->cu,
        cuFuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel.function),
        "querying the prefill kernel's static shared memory");
    if (smem + (size_t)static_smem > (size_t)ctx->max_smem_per_block_optin)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "prefill tiles (tile_q %d, tile_kv %d, stages %d) need %zu + %d bytes "
                             "of shared memory; the device allows %d per block",
                             cfg.tile_q, cfg.tile_kv, cfg.stages, smem, static_smem,
                             ctx->max_smem_per_block_optin);
    /* Above 48 KiB a kernel must opt in to its dynamic shared memory. */
    CINFER__CU(ctx->cu,
               cuFuncSetAttribute(kernel.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  (int)smem),
               "setting the prefill kernel's shared memory size");
    void *kernel_args[] = {&p, variant_blob};
    CINFER__CU(ctx->cu,
               cuLaunchKernel(kernel.function, (unsigned)blocks, 1, 1, (unsigned)(cfg.warps * 32),
                              1, 1, (unsigned)smem, stream, kernel_args, NULL),
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
