/* Built-in variant "custom_mask": default attention with a boolean mask per request, bit-packed
 * as packbits writes it (bit i of byte k is element 8 k + i, "little" bit order). Query position
 * qo_idx of request b may see key kv_idx when bit
 *   row_offset[b] + qo_idx * row_stride[b] + kv_idx
 * of packed_mask is set. For a request's [qo_len, kv_len] row-major mask starting at byte
 * mask_indptr[b]: row_stride = kv_len and row_offset = 8 mask_indptr[b] - (kv_len - qo_len) kv_len
 * (qo_idx is the absolute, bottom-right aligned position). Parameters: uint8 tensor packed_mask,
 * int64 tensor row_offset [batch], int32 tensor row_stride [batch].
 *
 * The mask is given in its row form (VARIANT_LOGITS_MASK_ROW): the words are counted from the
 * aligned word that holds packed_mask's first byte, so its first bit is bit 8 (packed_mask & 3).
 * Kernels read whole aligned 4-byte words that hold a bit of the mask, so reads never leave the
 * aligned words that the mask's bytes occupy (the extra bits are never used). */
#define VARIANT_LOGITS_MASK_ROW 1
__device__ const uint32_t *variant_logits_mask_row(const cinfer_variant_params *params,
                                                   int batch_idx, int qo_idx, int qo_head_idx,
                                                   int kv_head_idx, int64_t *bit) {
    const uint64_t addr = (uint64_t)params->packed_mask;
    *bit = (int64_t)(addr & 3) * 8 + __ldg(params->row_offset + batch_idx) +
           (int64_t)qo_idx * __ldg(params->row_stride + batch_idx);
    return (const uint32_t *)(addr & ~(uint64_t)3);
}
