/* Built-in example variant "alibi" (Press et al., "Train Short, Test Long", 2022): the logit of
 * query position i and key position j in head h gets slope_h * (j - i). Parameters: float32 tensor
 * maybe_alibi_slopes [Hq] (NULL: the paper's slopes for num_heads heads), int32 num_heads.
 * Given as the slope alone, the bias is the kernels' to evaluate: once per query head, and an fma
 * per logit in prefill. */
#define VARIANT_ALIBI_SLOPE 1
__device__ float variant_alibi_slope(const cinfer_variant_params *params, int batch_idx,
                                     int qo_head_idx) {
    if (params->maybe_alibi_slopes)
        return params->maybe_alibi_slopes[qo_head_idx];
    /* n = the largest power of two <= H: heads h < n take 2^(-8 (h + 1) / n); the others take the
     * odd terms of the 2n-head series, 2^(-8 (2 (h - n) + 1) / (2 n)). */
    const int n = 1 << (31 - __clz(params->num_heads));
    const float e = qo_head_idx < n ? 8.0f * (float)(qo_head_idx + 1) / (float)n
                                    : 4.0f * (float)(2 * (qo_head_idx - n) + 1) / (float)n;
    return exp2f(-e);
}
