/* Built-in example variant "alibi" (Press et al., "Train Short, Test Long", 2022): the logit of
 * query position i and key position j in head h gets slope_h * (j - i). Parameters: float32 tensor
 * maybe_alibi_slopes [Hq] (NULL: the paper's slopes for num_heads heads), int32 num_heads. */
#define VARIANT_LOGITS_TRANSFORM 1

/* (float)d, correctly rounded, on the FMA and integer pipes: each 16-bit half goes through the
 * 1.5 * 2^23 trick (exact below 2^22), and one fma joins them. A plain int-to-float conversion
 * runs on the same quarter-rate unit as exp2, which prefill keeps busy. */
__device__ __forceinline__ float alibi_int_to_float(int d) {
    const float hi = __int_as_float(0x4B400000 + (d >> 16)) - 12582912.0f;
    const float lo = __int_as_float(0x4B400000 + (d & 0xffff)) - 12582912.0f;
    return fmaf(hi, 65536.0f, lo);
}

__device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,
                                          int batch_idx, int qo_idx, int kv_idx, int qo_head_idx,
                                          int kv_head_idx) {
    float slope;
    if (params->maybe_alibi_slopes) {
        slope = params->maybe_alibi_slopes[qo_head_idx];
    } else {
        /* n = the largest power of two <= H: heads h < n take 2^(-8 (h + 1) / n); the others
         * take the odd terms of the 2n-head series, 2^(-8 (2 (h - n) + 1) / (2 n)). */
        const int n = 1 << (31 - __clz(params->num_heads));
        const float e = qo_head_idx < n ? 8.0f * (float)(qo_head_idx + 1) / (float)n
                                        : 4.0f * (float)(2 * (qo_head_idx - n) + 1) / (float)n;
        slope = exp2f(-e);
    }
    return fmaf(slope, alibi_int_to_float(kv_idx - qo_idx), logit);
}
