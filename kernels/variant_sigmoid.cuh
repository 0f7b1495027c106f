/* Built-in example variant "sigmoid" (sigmoid attention): no softmax; each kept position weighs
 * w = 1 / (1 + exp(-(logit * scale + bias))), and o = v_scale * sum_j w_j v_j. Parameters: float
 * scale, float bias. Written like user code: the interface is include/cinfer.h's. */
#define VARIANT_USE_SOFTMAX      0
#define VARIANT_LOGITS_TRANSFORM 1
__device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,
                                          int batch_idx, int qo_idx, int kv_idx, int qo_head_idx,
                                          int kv_head_idx) {
    return 1.0f / (1.0f + __expf(-fmaf(logit, params->scale, params->bias)));
}
