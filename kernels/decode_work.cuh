/*
 * Reading the decode schedule's work items (kernels/decode_params.h) in the decode kernels
 * (decode.cu, decode_tc.cu). Both read a CTA's first item beside the header and each next one
 * while the current one runs, so an item's start waits for its page-table entries and KV only.
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
    item.kv_head = a.y;
    item.head_begin = a.z;
    item.kv_begin = a.w;
    item.kv_end = c.x;
    item.partial = c.y;
    item.page_begin = c.z;
    item.kv_len = c.w;
    return item;
}

#endif
