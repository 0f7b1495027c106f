/*
 * Parameters of the decode kernels, shared by the host (src/ops/decode.c, src/sched/decode_plan.c)
 * and the device (kernels/decode.cu): plain C types only, so both compilers lay them out alike.
 *
 * A decode step is a list of work items: item = (request, head slice, KV token range), a head slice
 * being one KV head and heads_per_cta of its query heads. CTA i of the attention grid runs item i
 * (for i < header->num_ctas) and then follows the items' `next` links. Items that cover a slice's
 * whole KV range write the output and LSE directly; the pieces of a slice split into several
 * chunks (split-KV) write float32 partial states (v normalized, lse base 2) into the workspace,
 * and the merge kernel folds each slice's partials into the output.
 *
 * All addresses are computed in 64-bit; strides are in elements.
 */
#ifndef CINFER_DECODE_PARAMS_H
#define CINFER_DECODE_PARAMS_H

/* KV tokens per warp tile of the tensor-core decode kernel: 16-bit KV, the k of one P V mma;
 * fp8 KV, twice as many, so that a tile has as many bytes (and a stage as many in flight). */
#define CINFER_DECODE_TC_TOKENS     16
#define CINFER_DECODE_TC_TOKENS_FP8 32
/* Shared memory per CTA that holds Q's mma A fragments with fp8 KV (16 bytes per lane per k step
 * of 16 dims; the fp8 path reads them there instead of keeping them in registers); 0 otherwise. */
#define CINFER_DECODE_TC_Q_BYTES(fp8, head_dim) ((fp8) ? (head_dim) / 16 * 512 : 0)

/* 32 bytes: kernels/decode_tc.cu reads an item as two 16-byte vectors. */
typedef struct cinfer_decode_work {
    int request;    /* batch index */
    int slice;      /* head slice: KV head slice / (group / heads_per_cta), query heads
                       kv_head * group + (slice % (group / heads_per_cta)) * heads_per_cta + ... */
    int kv_begin;   /* first KV position of the chunk (inclusive) */
    int kv_end;     /* last KV position of the chunk (exclusive); kv_begin == kv_end is empty */
    int partial;    /* -1: write out/lse directly; else the chunk's partial slot */
    int page_begin; /* kv_indptr[request] as planned (paged KV; 0 otherwise), so that a kernel
                       reads the request's pages without reading kv_indptr first */
    int kv_len;     /* the request's KV length (query position = kv_len - 1) */
    int next;       /* the CTA's next item, -1 after its last */
} cinfer_decode_work;

/* Where a split's partial states live, for the merge kernel: in decode, one per (request, head
 * slice), at requests[b * units + s] (units = head slices per request), with slot(c) =
 * partial_base + c; in batch prefill's split-KV, one per query row, with slot(h, c) =
 * partial_base + h * num_chunks + c for query head h (heads_per_cta 1). A slot holds heads_per_cta
 * heads of one chunk. */
typedef struct cinfer_decode_request {
    int kv_len;       /* the request's KV length (query position = kv_len - 1) */
    int num_chunks;   /* chunks the KV range was split into; <= 1 means no merge */
    int partial_base; /* first slot */
} cinfer_decode_request;

/* A one-wave plan of one request, outside CUDA-graph mode, in the kernel parameters: CTA i runs
 * piece i % pieces of head slice i / pieces, KV positions kv_begin + (i % pieces) * chunk .. +
 * chunk (clipped to kv_len), with partial slot i when pieces > 1 (else -1): the items the plan
 * writes, computed instead of loaded, so a CTA's first DRAM round trip is its page-table entry's
 * (cinfer_decode_uniform_work). The merge kernel takes its header and request entries from here
 * too (cinfer_decode_uniform_request), so with these parameters no kernel reads the schedule and
 * single decode does not copy it. pieces = 0: read the schedule from the workspace. */
typedef struct cinfer_decode_uniform {
    int pieces; /* per head slice; 0: off */
    int chunk;
    int kv_begin; /* the attended range's start */
    int kv_len;
    int page_begin;  /* kv_indptr[0] (paged), else 0 */
    int merge_warps; /* the header's merge_warps */
} cinfer_decode_uniform;

/* Written by plan into the device workspace; read by run's kernels (so a captured CUDA graph
 * sees each new plan). */
typedef struct cinfer_decode_header {
    int num_work;
    int num_ctas; /* CTAs with items: CTA i < num_ctas starts at item i; the others exit */
    int batch_size;
    int merge_warps; /* warps of the merge kernel per (request, query head): 1, 2 or 4 (other
                        values count as 1) */
} cinfer_decode_header;

typedef struct cinfer_decode_params {
    /* q: [batch, Hq, D] */
    const void *q;
    long long q_stride_n, q_stride_h;
    /* K and V: paged caches (token position t of request b lives in page
     * kv_indices[kv_indptr[b] + t / page_size], slot t % page_size) or, for single decode,
     * one contiguous sequence (page_size ignored, page stride unused). */
    const void *k;
    const void *v;
    long long kv_stride_page, kv_stride_token, kv_stride_head;
    const int *kv_indptr;        /* [batch + 1] */
    const int *kv_indices;       /* [kv_indptr[batch]] */
    const int *kv_last_page_len; /* [batch] */
    int page_size;
    int page_shift; /* log2(page_size) when it is a power of two, else -1 */
    /* out: [batch, Hq, D]; lse: [batch, Hq] float32 base 2, may be NULL */
    void *out;
    long long out_stride_n, out_stride_h;
    float *lse;
    long long lse_stride_n, lse_stride_h;
    /* the schedule */
    const cinfer_decode_header *header;
    const cinfer_decode_work *work;
    const cinfer_decode_request *requests;
    int slice_infos;    /* 1: requests[] holds one entry per (request, head slice) (decode); 0: one
                           per request (or query row: batch prefill's merge) */
    float *partial_o;   /* [slots * heads_per_cta, D] */
    float *partial_lse; /* [slots * heads_per_cta] */
    int num_qo_heads, num_kv_heads;
    int heads_per_cta; /* query heads per work item (the decode kernel's compile-time value) */
    /* logits: s = (q . k) * sm_scale * k_scale, then soft cap; exp2 units inside */
    float q_scale;       /* sm_scale * k_scale * log2(e), or sm_scale * k_scale / cap with cap */
    float soft_cap_log2; /* cap * log2(e) (soft cap only) */
    float v_scale;
    /* Tensor-core kernel with fp8 KV: q is multiplied by q_in_scale before it is converted to fp16
     * (and q_scale is divided by it); 1 otherwise. */
    float q_in_scale;
    cinfer_decode_uniform uniform;
} cinfer_decode_params;

/* Item i of a uniform plan (cinfer_decode_uniform): the host's planner tests find it equal to the
 * item the plan writes. */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__
#else
static inline
#endif
    cinfer_decode_work
    cinfer_decode_uniform_work(const cinfer_decode_uniform *u, int i) {
    cinfer_decode_work w;
    const int piece = i % u->pieces;
    w.request = 0;
    w.slice = i / u->pieces;
    w.kv_begin = u->kv_begin + piece * u->chunk;
    w.kv_end = u->kv_len - w.kv_begin > u->chunk ? w.kv_begin + u->chunk : u->kv_len;
    w.partial = u->pieces > 1 ? i : -1;
    w.page_begin = u->page_begin;
    w.kv_len = u->kv_len;
    w.next = -1;
    return w;
}

/* The schedule's entry for head slice `slice` of a uniform plan's request (requests[slice]): a
 * split slice's pieces take partial slots slice * pieces .. (an item's partial is its index), an
 * unsplit one has none (-1). */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__
#else
static inline
#endif
    cinfer_decode_request
    cinfer_decode_uniform_request(const cinfer_decode_uniform *u, int slice) {
    cinfer_decode_request r;
    r.kv_len = u->kv_len;
    r.num_chunks = u->pieces;
    r.partial_base = u->pieces > 1 ? slice * u->pieces : -1;
    return r;
}

#endif
