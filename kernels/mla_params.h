/*
 * Parameters of the MLA kernels (multi-head latent attention, DeepSeek-V2/V3), shared by the host
 * (src/ops/mla.c) and the device (kernels/mla.cu): plain C types only.
 *
 * Every query head h of token i attends over one latent KV shared by all heads: the logit of
 * position j is (q_nope[i, h] . ckv[j] + q_pe[i, h] . kpe[j]) * sm_scale and the output is the
 * softmax-weighted sum of ckv[j] (so D_qk = 512 + 64 = 576 and D_vo = 512). The caches are paged
 * like batch decode's, with one row per token and no head dim: token t of request b is slot
 * t % page_size of page kv_indices[kv_begin + t / page_size].
 *
 * The work list is batch prefill's (src/sched/prefill_plan.h, with GQA packing: a CTA's 16 rows
 * hold G query heads of 16 / G tokens, G = min(H, 16), and the grid multiplies the work items by
 * H / G), and so are the split-KV partial states (row i of a tile, head h, chunk c: slot
 * partial + (i H + h) num_chunks, 512 floats and a base-2 LSE each) and the merge rows, which the
 * MLA merge kernel folds (merge_groups CTAs per (row, head), each a slice of the columns).
 *
 * Strides are in elements; every address is computed in 64 bits.
 */
#ifndef CINFER_MLA_PARAMS_H
#define CINFER_MLA_PARAMS_H

#include "decode_params.h"
#include "prefill_params.h"

typedef struct cinfer_mla_params {
    /* q_nope: [rows, H, 512], q_pe: [rows, H, 64] */
    const void *q_nope;
    long long q_nope_stride_n, q_nope_stride_h;
    const void *q_pe;
    long long q_pe_stride_n, q_pe_stride_h;
    /* ckv: [pages, page_size, 512], kpe: [pages, page_size, 64] */
    const void *ckv;
    long long ckv_stride_page, ckv_stride_n;
    const void *kpe;
    long long kpe_stride_page, kpe_stride_n;
    const int *kv_indices; /* the page table's page indices */
    int page_size;
    int page_shift; /* log2(page_size) when it is a power of two, else -1 */
    /* the schedule and the split-KV partial states in the workspace */
    const cinfer_prefill_header *header;
    const cinfer_prefill_work *work;
    float *partial_o;
    float *partial_lse;
    /* the merge kernel's header and rows (batch_size = merge rows; {kv_len, num_chunks,
     * partial_base} per row, partial_base the slot of (row, head 0, chunk 0)) */
    const cinfer_decode_header *merge_header;
    const cinfer_decode_request *merge_rows;
    /* out: [rows, H, 512]; lse: [rows, H] float32 base 2, may be NULL (the merge kernel's start
     * at its first merge row) */
    void *out;
    long long out_stride_n, out_stride_h;
    float *lse;
    long long lse_stride_n, lse_stride_h;
    int num_heads;
    float q_scale;    /* sm_scale * log2(e): logits in base-2 units */
    int merge_groups; /* the merge kernel's column slices per (row, head): 1, 2, 4, 8 or 16 */
} cinfer_mla_params;

#endif
