/* Built-in example variant "dump_logits" (debugging): default attention that also stores every
 * logit the kernel visits, in natural-log units after sm_scale and k_scale, at
 *   logits[row_offset[batch_idx] + qo_head_idx * head_stride + qo_idx * pos_stride + kv_idx].
 * Parameters: float32 tensor logits, int64 tensor row_offset [batch], int64 head_stride, int64
 * pos_stride. Positions a kernel skips (outside the causal mask or window) are not written. */
#define VARIANT_LOGITS_TRANSFORM 1
__device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,
                                          int batch_idx, int qo_idx, int kv_idx, int qo_head_idx,
                                          int kv_head_idx) {
    params->logits[params->row_offset[batch_idx] + qo_head_idx * params->head_stride +
                   (int64_t)qo_idx * params->pos_stride + kv_idx] = logit;
    return logit;
}
