/*
 * Parameters of the prefill kernels, shared by the host (src/ops/prefill.c) and the device
 * (kernels/prefill.cu): plain C types only, so both compilers lay the struct out identically.
 *
 * Item i of a grid is one tile of CINFER_TILE_Q query rows of one query head: CTA i of the sm80
 * kernel; the sm90 kernel's persistent grid of G CTAs (at most one per SM) has CTA b take items b,
 * 2G - 1 - b, 2G + b, ... (item_index, kernels/prefill_sm90.cuh). The grid is num_q_tiles *
 * num_qo_heads items, the query head varying fastest (so the query heads of a GQA group, which read
 * the same K/V, run side by side and share it in L2), and the query tiles in decreasing order
 * (under a causal mask the last tiles have the most KV to visit, so they start first and the short
 * ones fill the tail).
 *
 * Batch kernels (CINFER_BATCH) read a work list that the planner (src/sched/prefill_plan.c) wrote
 * into the workspace: grid item i computes query head i % num_qo_heads of work item
 * i / num_qo_heads, one tile of TILE_Q query rows of one request over one chunk of its KV
 * positions; grid items past header->num_work work items are not computed (CUDA-graph mode
 * launches a fixed grid). With GQA packing (CINFER_GQA_PACK = G) the grid multiplies by
 * num_kv_heads instead: grid item i computes the G query heads of KV head i % num_kv_heads for the
 * TILE_Q / G query rows (tokens) of work item i / num_kv_heads. K/V are a ragged
 * [total_kv, Hk, D] tensor (token t of request b at row kv_begin + t) or, with CINFER_PAGED, a
 * paged cache: token t of request b lives in page kv_indices[kv_begin + t / page_size], slot
 * t % page_size.
 *
 * Split-KV: an item whose query tile was split into several KV chunks writes, per (row, head), a
 * float32 partial state (output normalized by its own denominator, base-2 LSE; an empty chunk of a
 * row gives output 0 and LSE -inf) into the workspace instead of out/lse. The decode merge kernel
 * (kernels/decode.cu, CINFER_OP_DECODE_MERGE, with heads_per_cta = 1) then folds them: its
 * "requests" are the plan's query rows, and row r's state for head h and chunk c is in slot
 * partial_base_r + h * num_chunks_r + c.
 *
 * Strides are in elements; every address is computed in 64 bits.
 */
#ifndef CINFER_PREFILL_PARAMS_H
#define CINFER_PREFILL_PARAMS_H

/* The largest qo_len and kv_len the kernel accepts: positions and their differences (j - p_i,
 * p_i - window_left) then fit a 32-bit int. */
#define CINFER_PREFILL_MAX_LEN ((1 << 30) - 1)

/* One tile of query rows of one request over one chunk of its KV positions (all query heads: the
 * grid multiplies by num_qo_heads, or by num_kv_heads with GQA packing). The request's description
 * is repeated in every item, so a CTA reads one 44-byte record. */
typedef struct cinfer_prefill_work {
    int request;  /* batch index */
    int q_begin;  /* first query row of the tile, within the request */
    int qo_begin; /* the request's first row of q, out and lse (qo_indptr[request]) */
    int qo_len;   /* the request's query rows */
    int kv_begin; /* ragged: its first K/V row (kv_indptr[request]); paged: its first page-table
                     entry (kv_indptr[request]) */
    int kv_len;   /* its KV length */
    /* The KV positions [chunk_begin, chunk_end) this item may visit, further limited by the causal
     * mask and the window: [0, kv_len) when the tile is not split; else chunk_begin is a multiple
     * of the kernel's TILE_KV and chunk_end one too or the end of the tile's KV range, so chunks
     * share no KV tile. */
    int chunk_begin, chunk_end;
    int chunk;      /* index of this chunk among its tile's (0 = first: a variant's initial state
                       joins there, once per row) */
    int num_chunks; /* chunks of the tile (1 = not split) */
    int partial;    /* -1: write out and lse; else the slot of (row 0, head 0) of this chunk: row i
                       of the tile, head h writes slot partial + (i * num_qo_heads + h) *
                       num_chunks (packed: row i is the tile's token i) */
} cinfer_prefill_work;

/* Written by plan into the workspace in front of the work list; read by run's kernel, so a
 * captured CUDA graph sees each new plan. */
typedef struct cinfer_prefill_header {
    int num_work;
    int batch_size;
} cinfer_prefill_header;

typedef struct cinfer_prefill_params {
    /* q: [qo_len, Hq, D_qk] */
    const void *q;
    long long q_stride_n, q_stride_h;
    /* k: [kv_len, Hk, D_qk], v: [kv_len, Hk, D_vo] through strides (NHD or HND are just
     * different strides); paged: the caches, stride_n steps a slot within a page and stride_page
     * a page (K and V share strides when D_qk == D_vo: those kernels read K's) */
    const void *k;
    const void *v;
    long long k_stride_n, k_stride_h;
    long long v_stride_n, v_stride_h;
    long long k_stride_page, v_stride_page;
    /* ragged (not paged) K/V: bytes from one KV tile's first row to the next's, tile_kv *
     * stride_n * element size (set by the host at launch, so the kernel's copy cursors step by a
     * parameter and no register has to be loaded and shifted each tile) */
    long long k_tile_bytes, v_tile_bytes;
    const int *kv_indices; /* paged: the page table's page indices */
    int page_size;         /* paged: tokens per page */
    int page_shift;        /* paged: log2(page_size) when it is a power of two, else -1 */
    /* batch: the schedule in the workspace, and the split-KV partial states: [slots, D_vo] outputs
     * and [slots] base-2 LSEs (float32) */
    const cinfer_prefill_header *header;
    const cinfer_prefill_work *work;
    float *partial_o;
    float *partial_lse;
    /* out: [qo_len, Hq, D_vo]; lse: [qo_len, Hq] float32 base 2, may be NULL */
    void *out;
    long long out_stride_n, out_stride_h;
    float *lse;
    long long lse_stride_n, lse_stride_h;
    int qo_len, kv_len; /* single prefill (batch kernels take them from the work item) */
    int num_qo_heads, num_kv_heads;
    int num_q_tiles; /* single prefill */
    /* keep j >= p_i - window_left (CINFER_WINDOW kernels); clamped by the host to [0, kv_len]
     * (single) or [0, CINFER_PREFILL_MAX_LEN] (batch), where it masks the same */
    int window_left;
    /* logits in base-2 units: s2 = (q . k) * q_scale with q_scale = sm_scale * k_scale * log2(e);
     * with a soft cap c, q_scale = sm_scale * k_scale / c and s2 = soft_cap_log2 * tanh(q . k *
     * q_scale) with soft_cap_log2 = c * log2(e) */
    float q_scale;
    float soft_cap_log2;
    /* soft cap kernels (kernels/prefill.cu, SOFTCAP_FIXED_MAX): when soft_cap_fixed is 1, every
     * row's softmax subtracts the fixed maximum soft_cap_max (in the units of 2 soft_cap_log2 h,
     * whose range is [-2 soft_cap_log2, 0]) instead of its running maximum */
    int soft_cap_fixed;
    float soft_cap_max;
    float v_scale; /* multiplies the output */
    /* fp8 K/V: q is multiplied by q_in_scale (sm_scale) as it becomes the fp16 mma operand, so
     * that a bf16 q beyond fp16's range stays finite; q_scale is divided by it (and e4m3 scales
     * q_scale and v_scale by 256, kernels/prefill.cu and KV_FP8 in kernels/prefill_sm90.cuh).
     * Unused with 16-bit K/V. */
    float q_in_scale;
} cinfer_prefill_params;

/* The sm90 kernel's TMA tensor maps (kernels/prefill_sm90.cuh), its third parameter: each the
 * 128 bytes of a CUtensorMap the host encodes (cuTensorMapEncodeTiled), 64-byte aligned as the
 * driver wants them. q, k and v are 3-d: (D, rows, heads) with the tensors' own strides, 16-bit
 * elements, boxes of 64 x tile rows x 1 with the 128-byte swizzle. A paged cache's k and v are
 * 4-d, (D, page rows, heads, pages), in boxes of one page (or tile rows of a longer one), and
 * k_run, v_run the same maps in boxes of tile rows / page size pages (pages shorter than a tile;
 * else unused). At D = 128 and 256 with 16-bit K/V (the kernel's KV_INTERLEAVED layout) a paged
 * cache whose KV
 * heads are packed (a head's row right after the previous head's, NHD; a head's page rows right
 * after the previous head's, HND) has 5-d maps instead, (64 columns, 8 rows, column blocks, groups
 * of 8 rows, pages), the KV head folded into the blocks dim (NHD: block kv_head D / 64 + b) or the
 * groups dim (HND: group kv_head page_size / 8 + g), in boxes of every block of a page's (or a
 * tile's part of a longer page's) groups, or of a tile's pages for k_run, v_run; kv_fold = {1,
 * D / 64 or 0, 0 or page_size / 8, 0} then gives the head's first block and group as kv_head x
 * kv_fold[1] and kv_head x kv_fold[2]. Other paged caches keep 4-d maps in boxes of 8 rows x 64
 * columns (kv_fold[0] = 0). fp8 K/V maps are of bytes, unswizzled, with a middle dim of one index
 * after D ((D, 1, rows, heads); paged (D, 1, page rows, heads, pages)) in boxes of 64 x 2 x rows
 * x 1 (paged: x 1 x 1, or x a tile's pages for k_run, v_run): see KV_FP8 in
 * kernels/prefill_sm90.cuh. At D_qk
 * / D_vo = 192 / 128 v's maps have v's own D and strides. */
typedef struct cinfer_prefill_tma {
    unsigned long long q[16] __attribute__((aligned(64)));
    unsigned long long k[16] __attribute__((aligned(64)));
    unsigned long long v[16] __attribute__((aligned(64)));
    unsigned long long k_run[16] __attribute__((aligned(64)));
    unsigned long long v_run[16] __attribute__((aligned(64)));
    int kv_fold[4];
} cinfer_prefill_tma;

#endif
