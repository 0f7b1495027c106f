/*
 * The decode planner: pure host code (no CUDA calls), unit-tested in CI without a GPU.
 *
 * From the KV length of every request it computes the schedule the decode kernels read
 * (kernels/decode_params.h): the split-KV chunking, one work item per (request, head slice, chunk),
 * the per-request merge information, and the workspace layout that holds them plus the float32
 * partial states of split requests. It also holds the argument checks of the decode API that need
 * no device (options, page table), so CI can test them.
 *
 * Vocabulary
 * ----------
 * - group = Hq / Hk (GQA); HPC = heads per CTA, the query heads one work item computes (a divisor
 *   of group); a head slice is one KV head and HPC of its query heads, so a request has
 *   units = Hk * (group / HPC) slices. Slice s covers KV head s / (group / HPC) and query heads
 *   kv_head * group + (s % (group / HPC)) * HPC + [0, HPC).
 * - Attended range of a request: [kv_len - a, kv_len) with a = kv_len, or a = min(kv_len, w + 1)
 *   with a sliding window w = window_left >= 0 (decode's query sits at position kv_len - 1, so
 *   positions before kv_len - 1 - w are masked; the planner skips them instead of masking them).
 * - max_ctas: CTAs of the attention kernel resident at once on the device (SMs x blocks per SM).
 *
 * The chunking rule (cinfer__decode_plan_chunks)
 * ----------------------------------------------
 * All requests share one chunk size C (a multiple of CINFER__DECODE_CHUNK_ALIGN). A request with
 * a attended positions has max(1, ceil(a / C)) chunks, and the plan has
 * items(C) = sum_b units * max(1, ceil(a_b / C)) work items. Two regimes:
 * - batch_size * units <= max_ctas: the smallest C with items(C) <= max_ctas (binary search;
 *   items is non-increasing in C), so the whole step is one wave of resident CTAs and the longest
 *   item is as short as one wave allows.
 * - batch_size * units > max_ctas (one chunk per request already fills a wave): the persistent
 *   grid walks the items (longest first, dealt to the CTAs in snake order), so what matters is
 *   that the busiest CTA has little more than its fair share, S = T * units / max_ctas tokens
 *   with T = sum_b a_b. The planner estimates the step as the busiest CTA's sum of (item length
 *   + CINFER__DECODE_ITEM_TOKENS) under that order, for S rounded up to the alignment and the
 *   chunks that cut the longest request into 1, 2, ... pieces, down to the lower limit
 *   max(S / CINFER__DECODE_BALANCED_SPLIT, CINFER__DECODE_BALANCED_MIN) rounded up to the
 *   alignment, and takes the shortest (ties: the longer chunk). A batch of short requests with a
 *   few long ones (real traffic) splits the long ones, which otherwise run on their few CTAs long
 *   after the rest have finished; a uniform batch of 1.3 waves of items is cut rather than leave
 *   70% of the CTAs idle during the second wave.
 *
 * Consequences the workspace relies on, for a batch of at most max_batch_size requests (with
 * F = CINFER__DECODE_BALANCED_SPLIT): in the first regime items <= max_ctas and partial slots <=
 * items. In the second, C >= S / F gives units * T / C <= F * max_ctas, so items <= units *
 * (batch + T / C) <= max_batch_size * units + F * max_ctas, and, since each split request has
 * a_b > C (so their number is below T / C), slots <= units * (T / C + split requests) <
 * 2 * F * max_ctas. Hence:
 *   work items    <= max_batch_size * units + F * max_ctas
 *   partial slots <= 2 * F * max_ctas
 */
#ifndef CINFER_SCHED_DECODE_PLAN_H
#define CINFER_SCHED_DECODE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "decode_params.h"

/* Chunk sizes are multiples of this many tokens and at least this long: a chunk of 64 tokens is
 * 2 steps of the 128-thread kernel at D = 128 (8 token rows x 4 tokens per step), so a shorter
 * chunk would spend more on its partial-state write and merge than on attention. */
#define CINFER__DECODE_CHUNK_ALIGN 64
/* The shortest chunk of the balanced regime: 256 tokens keep the partial-state write and merge
 * (4 heads x D floats per item) under 2% of the item's KV bytes at D = 128. */
#define CINFER__DECODE_BALANCED_MIN 256

/* The balanced regime's chunks are at least 1 / this of a CTA's share of the step. */
#define CINFER__DECODE_BALANCED_SPLIT 4
/* What one work item costs besides its tokens, in tokens, in the balanced regime's estimate: the
 * item's start (work item, page table and first tiles, a DRAM round trip or two) and the partial
 * state's write, about 2 us at a CTA's share of the bandwidth with 3 CTAs per SM. */
#define CINFER__DECODE_ITEM_TOKENS 64

/* Warps of both decode kernels (4 x 32 = 128 threads per block). */
#define CINFER__DECODE_WARPS 4
/* Chunks one merge warp takes per step at most (kernels/decode.cu: 32 / (D / 8) lane groups x 4
 * loads in flight, 8 at D = 128): beyond it a request's merge gets more warps. */
#define CINFER__DECODE_MERGE_WARP_CHUNKS 8

/* Every region of the workspace starts on this boundary (the cudaMalloc alignment). */
#define CINFER__DECODE_ALIGN 256

/* The fixed part of a decode planner: from the options and the device. */
typedef struct cinfer__decode_config {
    int num_qo_heads;   /* Hq */
    int num_kv_heads;   /* Hk; Hq % Hk == 0 */
    int heads_per_cta;  /* HPC, a divisor of group: at most 8 (CUDA cores) or 16 (tensor cores) */
    int max_ctas;       /* resident CTAs of the attention kernel, >= 1 */
    int max_batch_size; /* requests a plan may hold, >= 1 */
    int window_left;    /* -1 = off */
    bool graph;         /* CUDA-graph mode: grids fixed for max_batch_size */
    bool no_split;      /* every request in one chunk (variants without softmax or with an
                           output transform: their partial states cannot be merged) */
} cinfer__decode_config_t;

/* ---- tile choices ---- */

/* HPC: the largest divisor of group that is at most 8 (group 12 -> 6, 16 -> 8, 11 -> 1). Eight
 * heads keep the kernel's q/accumulator registers (8 heads x 8 floats each) and its shared merge
 * buffer (ROWS x 8 x D floats, 33 KiB at D = 128) inside the static 48 KiB limit. */
int cinfer__decode_heads_per_cta(int group, int limit);

/* U, tokens per thread per step: 4 when HPC <= 4, else 2, so HPC x U logits stay at 16 registers
 * and two steps of K/V loads stay in flight. */
int cinfer__decode_tile_kv(int heads_per_cta);

/* Head slices per request: Hk * (group / HPC). */
int cinfer__decode_units(const cinfer__decode_config_t *cfg);

/* (request, query head) pairs per block of the merge kernel: one per warp (kernels/decode.cu),
 * whatever the head dim. */
int cinfer__decode_merge_rows(int head_dim);

/* ---- argument checks that need no device ---- */

/*
 * Checks attention options for decode (shared by batch and single decode): struct size/version,
 * heads, head dim, dtypes, scales, window; with batch = true also page_size, use_cuda_graph and
 * max_batch_size (single decode ignores them). INVALID_ARGUMENT or UNSUPPORTED with a message
 * naming the field ("options->num_kv_heads = 3: ..."), or SUCCESS.
 */
cinfer_status_t cinfer__decode_options_check(const cinfer_attention_options_t *options, bool batch);

/*
 * KV length of each request from the host page table: kv_len[b] = (pages - 1) * page_size +
 * kv_last_page_len[b], 0 for a request without pages (its last_page_len is then ignored).
 * Checks 0 <= batch_size <= max_batch_size, kv_indptr[0] >= 0, kv_indptr monotone, last_page_len
 * in [1, page_size] for requests with pages, and kv_len <= 2^31 - 1. kv_last_page_len may be NULL
 * when batch_size is 0. INVALID_ARGUMENT with a message naming the argument, the index and the
 * value; kv_len (batch_size entries) is then partly written.
 */
cinfer_status_t cinfer__decode_kv_lens(const int32_t *kv_indptr, const int32_t *kv_last_page_len,
                                       int batch_size, int max_batch_size, int page_size,
                                       int32_t *kv_len);

/* ---- workspace ---- */

/*
 * Byte layout of the workspace. The schedule (header, request infos, work items) comes first and
 * in that order, so plan copies one contiguous prefix (header .. its last work item) from host to
 * device; the float32 partial states follow. Every region starts on CINFER__DECODE_ALIGN bytes and
 * is padded to it:
 *   header      @ 0                     align(sizeof(cinfer_decode_header))
 *   requests    @ requests_offset       align(request_capacity * sizeof(cinfer_decode_request))
 *   work        @ work_offset           align(work_capacity * sizeof(cinfer_decode_work))
 *   partial_o   @ partial_o_offset      align(slot_capacity * HPC * head_dim * 4)
 *   partial_lse @ partial_lse_offset    align(slot_capacity * HPC * 4)
 *   total_bytes = partial_lse_offset + its aligned size
 */
typedef struct cinfer__decode_layout {
    int work_capacity, request_capacity, slot_capacity;
    size_t requests_offset, work_offset, partial_o_offset, partial_lse_offset;
    size_t schedule_bytes; /* work_offset + work_capacity * sizeof(cinfer_decode_work) */
    size_t total_bytes;
} cinfer__decode_layout_t;

/* The layout for given capacities (each >= 0 and <= 2^31 - 1). */
void cinfer__decode_layout(int work_capacity, int request_capacity, int slot_capacity,
                           int heads_per_cta, int head_dim, cinfer__decode_layout_t *out);

/*
 * The layout of a batch decode object: capacities that hold any plan of up to max_batch_size
 * requests (work = max_batch_size * units + max_ctas, requests = max_batch_size,
 * slots = 2 * max_ctas; see the top of this file). UNSUPPORTED when a capacity exceeds 2^31 - 1.
 */
cinfer_status_t cinfer__decode_batch_layout(const cinfer__decode_config_t *cfg, int head_dim,
                                            cinfer__decode_layout_t *out);

/* ---- planning ---- */

/* What the chunking rule chose for one batch. */
typedef struct cinfer__decode_chunking {
    int chunk_size;  /* C in tokens; a request with attended length <= C is one chunk */
    int num_work;    /* work items */
    int num_slots;   /* partial slots (items of split requests) */
    int max_chunks;  /* chunks of the most split request (1 = nothing split) */
    bool split;      /* some request has more than one chunk: the merge kernel must run */
    int merge_warps; /* merge kernel warps per (request, query head): cinfer__decode_merge_warps */
} cinfer__decode_chunking_t;

/* Applies the chunking rule (top of this file) to kv_len[batch_size]. Pure and cheap: O(batch x
 * log(max_len / 64)). INVALID_ARGUMENT for batch_size < 0 or a negative kv_len; UNSUPPORTED when
 * the counts exceed 2^31 - 1. */
cinfer_status_t cinfer__decode_plan_chunks(const cinfer__decode_config_t *cfg,
                                           const int32_t *kv_len, int batch_size,
                                           cinfer__decode_chunking_t *out);

/* Where plan writes the schedule (the host mirror of the workspace's schedule regions). */
typedef struct cinfer__decode_schedule {
    cinfer_decode_header *header;
    cinfer_decode_request *requests; /* [request_capacity] */
    cinfer_decode_work *work;        /* [work_capacity] */
    int request_capacity, work_capacity, slot_capacity;
    int64_t *order; /* scratch of batch_size entries (the request order) */
} cinfer__decode_schedule_t;

/*
 * Writes the schedule of kv_len[batch_size] chunked as `chunking` (from cinfer__decode_plan_chunks
 * with the same arguments) into dst:
 * - header = {num_work, batch_size, merge_warps};
 * - requests[b] = {kv_len, num_chunks, partial_base}: num_chunks = 1 and partial_base = -1 for a
 *   request in one chunk (written directly, including kv_len 0: one empty item that writes 0 and
 *   LSE -inf); split requests take slots partial_base + slice * num_chunks + chunk, given out in
 *   request order from 0;
 * - every work item carries its request's kv_len and page_begin = kv_indptr[request] (0 when
 *   kv_indptr is NULL: single decode's contiguous KV);
 * - work items in this order: requests sorted by attended length, longest first (ties by index);
 *   chunk index outermost, then request, then head slice; so one request's chunks are spread
 *   through the list and the items of one (request, chunk) are adjacent (they share page-table
 *   reads). When there are more items than max_ctas (nothing split), the kernel's persistent loop
 *   gives CTA i the items i, i + G, i + 2G, ... (G = max_ctas); odd bands of G items are reversed
 *   (snake order), so each CTA pairs long items with short ones and the CTAs' loads even out.
 * INTERNAL if a capacity is too small (the layout prevents it).
 */
cinfer_status_t cinfer__decode_plan_build(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                          const int32_t *kv_indptr, int batch_size,
                                          const cinfer__decode_chunking_t *chunking,
                                          const cinfer__decode_schedule_t *dst);

/* ---- grids ---- */

/* Blocks of the attention kernel: max_ctas in graph mode (constant, spare CTAs exit), else
 * min(num_work, max_ctas) (0 = no launch). */
int cinfer__decode_attention_grid(const cinfer__decode_config_t *cfg, int num_work);

/* Warps of the merge kernel per (request, query head), 1, 2 or 4: one while no request has more
 * than CINFER__DECODE_MERGE_WARP_CHUNKS chunks (a warp's lane groups load them in one step); else
 * 4, and in graph mode the most of 4, 2, 1 whose batch_size * Hq * warps fits the constant grid. */
int cinfer__decode_merge_warps(const cinfer__decode_config_t *cfg, int batch_size, int max_chunks);

/* Blocks of the merge kernel: graph mode ceil(max_batch_size * Hq / rows) always (constant; rows
 * of requests that were not split exit); else ceil(batch_size * Hq * merge_warps / rows) when the
 * plan split some request, 0 otherwise. rows = cinfer__decode_merge_rows(head_dim) (warps per
 * block). */
int64_t cinfer__decode_merge_grid(const cinfer__decode_config_t *cfg, int head_dim, int batch_size,
                                  bool split, int merge_warps);

#endif
