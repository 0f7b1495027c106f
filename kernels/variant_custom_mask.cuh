/* Built-in variant "custom_mask": default attention with a boolean mask per request, bit-packed
 * as packbits writes it (bit i of byte k is element 8 k + i, "little" bit order). Query position
 * qo_idx of request b may see key kv_idx when bit
 *   row_offset[b] + qo_idx * row_stride[b] + kv_idx
 * of packed_mask is set. For a request's [qo_len, kv_len] row-major mask starting at byte
 * mask_indptr[b]: row_stride = kv_len and row_offset = 8 mask_indptr[b] - (kv_len - qo_len) kv_len
 * (qo_idx is the absolute, bottom-right aligned position). Parameters: uint8 tensor packed_mask,
 * int64 tensor row_offset [batch], int32 tensor row_stride [batch]. */
#define VARIANT_LOGITS_MASK 1
__device__ bool variant_logits_mask(const cinfer_variant_params *params, int batch_idx, int qo_idx,
                                    int kv_idx, int qo_head_idx, int kv_head_idx) {
    const int64_t bit =
        params->row_offset[batch_idx] + (int64_t)qo_idx * params->row_stride[batch_idx] + kv_idx;
    return (params->packed_mask[bit >> 3] >> (bit & 7)) & 1;
}
