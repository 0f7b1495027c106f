/*
 * KV token addressing of the decode kernels (decode.cu, decode_tc.cu): where token t of a request
 * lives in a paged cache (CINFER_PAGED = 1) or in one contiguous sequence (single decode).
 */
#ifndef CINFER_DECODE_KV_CUH
#define CINFER_DECODE_KV_CUH

#include "decode_params.h"

#if CINFER_PAGED
/* Token t of a paged request (page_begin = kv_indptr[request]): its page (the page-table read)
 * and its slot in that page. Power-of-two page sizes avoid the division. */
__device__ __forceinline__ void cinfer_decode_token_page(const cinfer_decode_params &p,
                                                         int page_begin, int t, int *page,
                                                         int *in_page) {
    int page_slot;
    if (p.page_shift >= 0) {
        page_slot = t >> p.page_shift;
        *in_page = t & ((1 << p.page_shift) - 1);
    } else {
        page_slot = t / p.page_size;
        *in_page = t - page_slot * p.page_size;
    }
    *page = p.kv_indices[page_begin + page_slot];
}

/* Element offset of the head-0 row of a page's slot. 64-bit throughout: page indices near
 * 2^31 / page_size are valid. */
__device__ __forceinline__ long long cinfer_decode_slot_offset(const cinfer_decode_params &p,
                                                               int page, int in_page) {
    return (long long)page * p.kv_stride_page + (long long)in_page * p.kv_stride_token;
}
#endif

/* Element offset of token t's head-0 row; page_begin = kv_indptr[request]. */
__device__ __forceinline__ long long cinfer_decode_token_offset(const cinfer_decode_params &p,
                                                                int page_begin, int t) {
#if CINFER_PAGED
    int page, in_page;
    cinfer_decode_token_page(p, page_begin, t, &page, &in_page);
    return cinfer_decode_slot_offset(p, page, in_page);
#else
    return (long long)t * p.kv_stride_token;
#endif
}

#endif
