/* Built-in variant "custom_mask": default attention with a boolean mask per request, bit-packed
 * as packbits writes it (bit i of byte k is element 8 k + i, "little" bit order). Query position
 * qo_idx of request b may see key kv_idx when bit
 *   row_offset[b] + qo_idx * row_stride[b] + kv_idx
 * of packed_mask is set. For a request's [qo_len, kv_len] row-major mask starting at byte
 * mask_indptr[b]: row_stride = kv_len and row_offset = 8 mask_indptr[b] - (kv_len - qo_len) kv_len
 * (qo_idx is the absolute, bottom-right aligned position). Parameters: uint8 tensor packed_mask,
 * int64 tensor row_offset [batch], int32 tensor row_stride [batch].
 *
 * The mask is given as bit words (one position at a time is a run of one): a run's bits lie in
 * at most two 4-byte words, counted from the aligned word that holds packed_mask's first byte;
 * both are loaded whole and funnel-shifted into place, the second only when it holds a bit of
 * the run's first count positions. A word read thus always holds a bit of the mask, so reading
 * it whole never leaves the aligned 4-byte words that the mask's bytes occupy (the extra bits
 * are never used). */
#define VARIANT_LOGITS_MASK_BITS 1
__device__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params, int batch_idx,
                                             int qo_idx, int kv_idx, int count, int qo_head_idx,
                                             int kv_head_idx) {
    const uint64_t addr = (uint64_t)params->packed_mask;
    const uint32_t *words = (const uint32_t *)(addr & ~(uint64_t)3);
    const int64_t bit = (int64_t)(addr & 3) * 8 + __ldg(params->row_offset + batch_idx) +
                        (int64_t)qo_idx * __ldg(params->row_stride + batch_idx) + kv_idx;
    const int64_t w = bit >> 5;
    const int shift = (int)(bit & 31);
    const uint32_t lo = __ldg(words + w);
    const uint32_t hi = shift != 0 && 32 - shift < count ? __ldg(words + w + 1) : 0u;
    return __funnelshift_r(lo, hi, (unsigned)shift);
}
