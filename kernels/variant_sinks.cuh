/* Built-in example variant "sinks" (attention sinks as gpt-oss uses them): one learned logit per
 * query head joins the softmax denominator, with no value, so
 *   o = v_scale * sum_j exp(s_j) v_j / (exp(sink_h) + sum_j exp(s_j)).
 * Parameter: float32 tensor sinks [Hq], natural-log units. */
#define VARIANT_STATE_INIT 1
__device__ void variant_state_init(const cinfer_variant_params *params, int batch_idx, int qo_idx,
                                   int qo_head_idx, float *max_log2, float *denominator) {
    *max_log2 = params->sinks[qo_head_idx] * 1.4426950408889634f;
    *denominator = 1.0f;
}
