/*
 * Reading the decode schedule's work items (kernels/decode_params.h) in the decode kernels
 * (decode.cu, decode_tc.cu). Both read a CTA's first item (item blockIdx.x) beside the header and
 * its next one (the item's `next` link) while the current one runs, so an item's start waits for
 * its page-table entries and KV only.
 */
#ifndef CINFER_DECODE_WORK_CUH
#define CINFER_DECODE_WORK_CUH

#include "decode_params.h"

/* Work item w, in two 16-byte loads (the work list is 256-byte aligned, items 32 bytes). */
__device__ __forceinline__ cinfer_decode_work
cinfer_decode_load_work(const cinfer_decode_work *work, int w) {
    const int4 *src = (const int4 *)(work + w);
    const int4 a = src[0], c = src[1];
    cinfer_decode_work item;
    item.request = a.x;
    item.slice = a.y;
    item.kv_begin = a.z;
    item.kv_end = a.w;
    item.partial = c.x;
    item.page_begin = c.y;
    item.kv_len = c.z;
    item.next = c.w;
    return item;
}

/* The CTA's first item and the number of CTAs with items: computed from a uniform plan
 * (decode_params.h), else item blockIdx.x and the header's count, read side by side. The grid
 * never exceeds the work list's capacity, and a CTA at or past num_ctas never uses its item: in
 * graph mode that read may see stale or never-written schedule bytes, which compute-sanitizer's
 * initcheck reports. */
__device__ __forceinline__ cinfer_decode_work
cinfer_decode_first_work(const cinfer_decode_params &p, int *num_ctas) {
    if (p.uniform.pieces > 0) {
        *num_ctas = (int)gridDim.x;
        return cinfer_decode_uniform_work(&p.uniform, (int)blockIdx.x);
    }
    *num_ctas = p.header->num_ctas;
    return cinfer_decode_load_work(p.work, (int)blockIdx.x);
}

/* The schedule's entry of head slice `slice` of request b (decode's one per (request, head slice);
 * slices_per_head = group / heads_per_cta): from a uniform plan's parameters, else the workspace.
 */
__device__ __forceinline__ cinfer_decode_request
cinfer_decode_slice_request(const cinfer_decode_params &p, int b, int slice, int slices_per_head) {
    if (p.uniform.pieces > 0)
        return cinfer_decode_uniform_request(&p.uniform, slice);
    return p.requests[(long long)b * p.num_kv_heads * slices_per_head + slice];
}

/* The first query head of an item's head slice, whose KV head is kv_head (slices_per_head =
 * group / heads_per_cta, kv_head = item->slice / slices_per_head). */
__device__ __forceinline__ int cinfer_decode_item_head(const cinfer_decode_work *item, int kv_head,
                                                       int group, int slices_per_head,
                                                       int heads_per_cta) {
    return kv_head * group + (item->slice - kv_head * slices_per_head) * heads_per_cta;
}

#endif
