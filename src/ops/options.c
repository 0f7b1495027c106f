#include <float.h>
#include <math.h>
#include <string.h>

#include "ops/options.h"
#include "variant/variant.h"

cinfer__dtype_t cinfer__dl_dtype(DLDataType d) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.dtype = d;
    return cinfer__tensor_dtype(&t);
}

static bool finite_at_least(float x, float lo, bool strict) {
    return isfinite(x) && (strict ? x > lo : x >= lo);
}

/* The in-kernel RoPE fields: the mode, and with ROPE_LLAMA its scale, base and head dim (the
 * kernels rotate whole 8-element vectors of each half, so D / 2 must be a multiple of 8). */
static cinfer_status_t rope_check(const cinfer_attention_options_t *o) {
    if (o->pos_encoding_mode != CINFER_POS_ENCODING_NONE &&
        o->pos_encoding_mode != CINFER_POS_ENCODING_ROPE_LLAMA)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->pos_encoding_mode = %d, expected CINFER_POS_ENCODING_NONE "
                             "(0) or CINFER_POS_ENCODING_ROPE_LLAMA (1)",
                             (int)o->pos_encoding_mode);
    if (!cinfer__attention_rope(o))
        return CINFER_STATUS_SUCCESS;
    if (!finite_at_least(o->rope_scale, 0.0f, true))
        return cinfer__error(
            CINFER_STATUS_INVALID_ARGUMENT,
            "options->rope_scale = %g with ROPE_LLAMA, expected a finite value > 0",
            (double)o->rope_scale);
    if (!finite_at_least(o->rope_theta, 0.0f, true))
        return cinfer__error(
            CINFER_STATUS_INVALID_ARGUMENT,
            "options->rope_theta = %g with ROPE_LLAMA, expected a finite value > 0",
            (double)o->rope_theta);
    /* The kernels take position x frequency in float32 (kernels/pos_rope.cuh), the frequencies
     * rope_theta^(-2m / head_dim) / (2 pi rope_scale) of cinfer__attention_rope_params: the
     * largest (pair 0, or the last pair for rope_theta < 1) times CINFER_ROPE_MAX_LEN positions
     * must stay finite. */
    const double f0 = 1.0 / (6.28318530717958647692 * (double)o->rope_scale);
    const double f_last =
        f0 * pow((double)o->rope_theta, -2.0 * (double)(o->head_dim / 2 - 1) / (double)o->head_dim);
    if (!((f0 > f_last ? f0 : f_last) * CINFER_ROPE_MAX_LEN <= FLT_MAX))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->rope_scale = %g, rope_theta = %g with ROPE_LLAMA: the "
                             "largest rotation frequency, %g, times CINFER_ROPE_MAX_LEN positions "
                             "overflows float32; expected a larger rope_scale",
                             (double)o->rope_scale, (double)o->rope_theta,
                             f0 > f_last ? f0 : f_last);
    if (o->head_dim % 16 != 0)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->head_dim = %d with ROPE_LLAMA is not supported: in-kernel "
                             "RoPE needs a multiple of 16 (each rotated half whole 8-element "
                             "vectors)",
                             o->head_dim);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__attention_options_check(const cinfer_attention_options_t *o,
                                                uint32_t kv_dtypes, const char *kv_hint) {
    if (!o)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "options is NULL");
    if (o->size < sizeof *o || o->version != CINFER_ATTENTION_OPTIONS_VERSION)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options: size %zu / version %u; initialize it with "
                             "CINFER_ATTENTION_OPTIONS_INIT (size %zu, version %u)",
                             o->size, o->version, sizeof *o, CINFER_ATTENTION_OPTIONS_VERSION);
    if (o->num_qo_heads < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->num_qo_heads = %d, expected >= 1", o->num_qo_heads);
    if (o->num_kv_heads < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->num_kv_heads = %d, expected >= 1", o->num_kv_heads);
    if (o->num_qo_heads % o->num_kv_heads != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->num_qo_heads = %d is not a multiple of "
                             "options->num_kv_heads = %d (GQA needs Hq %% Hk == 0)",
                             o->num_qo_heads, o->num_kv_heads);
    if (o->head_dim < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->head_dim = %d, expected >= 1", o->head_dim);
    if (o->head_dim_vo < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->head_dim_vo = %d, expected 0 (= head_dim) or >= 1",
                             o->head_dim_vo);
    if (o->kv_layout != CINFER_KV_LAYOUT_NHD && o->kv_layout != CINFER_KV_LAYOUT_HND)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->kv_layout = %d, expected CINFER_KV_LAYOUT_NHD (0) or "
                             "CINFER_KV_LAYOUT_HND (1)",
                             (int)o->kv_layout);
    const cinfer__dtype_t q = cinfer__dl_dtype(o->q_dtype), kv = cinfer__dl_dtype(o->kv_dtype);
    if (q != CINFER__DT_F16 && q != CINFER__DT_BF16)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->q_dtype (code %u, %u bits, %u lanes) is not supported: "
                             "expected fp16 (kDLFloat, 16) or bf16 (kDLBfloat, 16)",
                             o->q_dtype.code, o->q_dtype.bits, o->q_dtype.lanes);
    if (!(kv_dtypes & CINFER__DTS(kv)))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->kv_dtype (code %u, %u bits, %u lanes) is not supported: "
                             "expected %s",
                             o->kv_dtype.code, o->kv_dtype.bits, o->kv_dtype.lanes, kv_hint);
    if (!finite_at_least(o->sm_scale, 0.0f, false))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->sm_scale = %g, expected a finite value >= 0 "
                             "(0 = 1/sqrt(head_dim))",
                             (double)o->sm_scale);
    if (!finite_at_least(o->logits_soft_cap, 0.0f, false))
        return cinfer__error(
            CINFER_STATUS_INVALID_ARGUMENT,
            "options->logits_soft_cap = %g, expected a finite value >= 0 (0 = off)",
            (double)o->logits_soft_cap);
    if (o->window_left < -1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->window_left = %d, expected -1 (off) or >= 0",
                             o->window_left);
    if (!finite_at_least(o->k_scale, 0.0f, true))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->k_scale = %g, expected a finite value > 0",
                             (double)o->k_scale);
    if (!finite_at_least(o->v_scale, 0.0f, true))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->v_scale = %g, expected a finite value > 0",
                             (double)o->v_scale);
    /* The kernels' logit scale is a float32 (cinfer__attention_logit_scales: sm_scale x k_scale,
     * times log2(e) or over the soft cap; over sm_scale where fp8 K/V takes sm_scale into q
     * first; times 256 for e4m3), and so is the soft cap times log2(e). */
    if (!((double)o->logits_soft_cap * 1.4426950408889634 <= FLT_MAX))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->logits_soft_cap = %g, expected below 2^127.4 (the kernels "
                             "take it times log2(e) in float32)",
                             (double)o->logits_soft_cap);
    double sm, q_scale;
    float cap_log2;
    cinfer__attention_logit_scales(o, &sm, &q_scale, &cap_log2);
    if (!((q_scale > q_scale / sm ? q_scale : q_scale / sm) * 256.0 <= FLT_MAX))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->sm_scale x k_scale = %g x %g with logits_soft_cap = %g: the "
                             "kernels' float32 logit scale (times log2(e) or over the cap, and "
                             "256 for e4m3) overflows; expected smaller scales or a larger cap",
                             sm, (double)o->k_scale, (double)o->logits_soft_cap);
    if (!(o->v_scale * 256.0 <= FLT_MAX))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->v_scale = %g, expected below 2^120 (the kernels scale it "
                             "by up to 256 in float32)",
                             (double)o->v_scale);
    return rope_check(o);
}

int cinfer__attention_head_dim_vo(const cinfer_attention_options_t *o) {
    return o->head_dim_vo > 0 ? o->head_dim_vo : o->head_dim;
}

cinfer_status_t cinfer__attention_same_head_dims(const cinfer_attention_options_t *o,
                                                 const char *what) {
    if (cinfer__attention_head_dim_vo(o) == o->head_dim)
        return CINFER_STATUS_SUCCESS;
    return cinfer__error(
        CINFER_STATUS_UNSUPPORTED,
        "options->head_dim_vo = %d with head_dim = %d is not supported by %s: "
        "D_qk != D_vo runs in single and batch prefill (decode steps too, as one query "
        "row per request); expected 0 or head_dim",
        o->head_dim_vo, o->head_dim, what);
}

bool cinfer__attention_rope(const cinfer_attention_options_t *o) {
    return o->pos_encoding_mode == CINFER_POS_ENCODING_ROPE_LLAMA;
}

cinfer_status_t cinfer__attention_rope_lens(const cinfer_attention_options_t *o, int64_t qo_len,
                                            int64_t kv_len, const char *what) {
    if (!cinfer__attention_rope(o))
        return CINFER_STATUS_SUCCESS;
    if (qo_len > CINFER_ROPE_MAX_LEN || kv_len > CINFER_ROPE_MAX_LEN)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: qo_len = %lld, kv_len = %lld with in-kernel RoPE: expected at "
                             "most CINFER_ROPE_MAX_LEN = %d each (positions exact in float32)",
                             what, (long long)qo_len, (long long)kv_len, CINFER_ROPE_MAX_LEN);
    return CINFER_STATUS_SUCCESS;
}

void cinfer__attention_rope_params(const cinfer_attention_options_t *o,
                                   cinfer_pos_rope_params *out) {
    memset(out, 0, sizeof *out);
    if (!cinfer__attention_rope(o))
        return;
    const double two_pi = 6.28318530717958647692;
    const int pairs = o->head_dim / 2;
    for (int m = 0; m < pairs && m < CINFER_POS_ROPE_MAX_PAIRS; m++) {
        /* The expression the kernels evaluated in every CTA before (kernels/pos_rope.cuh). */
        const double f = pow((double)o->rope_theta, -2.0 * (double)m / (double)o->head_dim) /
                         (two_pi * (double)o->rope_scale);
        const float hi = (float)f;
        out->freq[m][0] = hi;
        out->freq[m][1] = (float)(f - (double)hi);
    }
}

void cinfer__attention_logit_scales(const cinfer_attention_options_t *o, double *sm_scale,
                                    double *q_scale, float *soft_cap_log2) {
    const double log2e = 1.4426950408889634;
    *sm_scale = o->sm_scale > 0 ? (double)o->sm_scale : 1.0 / sqrt((double)o->head_dim);
    *q_scale = *sm_scale * o->k_scale;
    *soft_cap_log2 = 0.0f;
    if (o->logits_soft_cap > 0) {
        *q_scale /= o->logits_soft_cap;
        *soft_cap_log2 = (float)(o->logits_soft_cap * log2e);
    } else if (!(o->variant && (o->variant->hooks & CINFER__VARIANT_LOGITS))) {
        *q_scale *= log2e; /* (logit hooks take natural-log units) */
    }
}
