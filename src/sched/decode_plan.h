/*
 * The decode planner: pure host code (no CUDA calls), unit-tested in CI without a GPU.
 *
 * From the KV length of every request it computes the schedule the decode kernels read
 * (kernels/decode_params.h): the split-KV pieces, one work item per (request, head slice, KV
 * range), their assignment to CTAs, the per-slice merge information, and the workspace layout that
 * holds them plus the float32 partial states of split slices. It also holds the argument checks of
 * the decode API that need no device (options, page table), so CI can test them.
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
 * The schedule (cinfer__decode_plan_chunks, cinfer__decode_plan_build)
 * -------------------------------------------------------------------
 * Work items are (request, head slice, KV range) pieces; CTA i of the attention grid runs item i
 * and then follows the items' `next` links (kernels/decode_params.h). Two regimes:
 * - One wave, batch_size * units <= max_ctas: all requests share one chunk size C (a multiple of
 *   CINFER__DECODE_CHUNK_ALIGN), the smallest with items(C) = sum_b units * max(1, ceil(a_b / C))
 *   <= max_ctas (binary search; items is non-increasing in C), so the whole step is one wave of
 *   resident CTAs, one item each, and the longest item is as short as one wave allows; C is then
 *   raised, up to CINFER__DECODE_MIN_CHUNK (or the longest request), to the largest size whose
 *   items still number busy_ctas (fewer, longer items pay fewer starts and partial states), and
 *   past it, where the requests are long enough, to the smallest size whose items number the
 *   fewest that are still busy_ctas or more, when those chunks are nearly all full (their
 *   capacity sum_b units * C * chunks_b within 1/8 of the attended tokens: long requests, not a
 *   batch whose short requests would take most of the slots); with busy_ctas 0 (the CUDA-core
 *   kernel) to CINFER__DECODE_MIN_CHUNK itself when its items still fill half a wave, else not
 *   at all. H200, 32/8 heads, bf16, 3-warp CTAs (528 resident), 2026-12-01, same-run A/B
 *   (bench/RESULTS.md, developers' session 28): one request of 32k tokens in 39.6-39.7 us as 256
 *   items of 1024 tokens against 42.1-42.2 as 512 of 512; 16 requests of 1k / 4k / 8k 4% / 2% /
 *   1.3% faster as 256 items.
 *   Chosen unless the longest item at the smallest C costs (tokens + CINFER__DECODE_ITEM_TOKENS)
 *   more than a stream lane's budget B below plus its slack (CHUNK_ALIGN + ITEM) and more than
 *   the stream's costliest lane: then, e.g. one long request among short ones filling most of a
 *   wave, the step streams.
 * - Stream, batch_size * units > max_ctas (one item per slice already fills a wave), or as above:
 *   the CTAs form lanes of W = units CTAs (W = 1 when max_ctas < units), floor(max_ctas / W) lanes;
 *   the W CTAs of a lane run W head slices of a request side by side over the same KV range, so the
 *   K/V rows of one token (adjacent in a page) are read at the same time (slices one by one on a
 *   CTA, read 1/Hk of every row at a time, cost 7% of a 256-request trace step on an H200). The
 *   requests' attended ranges (units / W passes each), request by request, are laid end to end as
 *   one stream of KV tokens and cut into consecutive runs of about equal cost, one per lane, a
 *   piece costing its tokens plus CINFER__DECODE_ITEM_TOKENS (its start and its partial state); the
 *   budget of a lane is B, the smallest integer between ceil(sum (a + ITEM) / lanes) and ceil((sum
 *   (a + ITEM) + (lanes - 1) * ITEM) / lanes) (a cut at every lane boundary, the most there can be:
 *   always enough) whose walk leaves the last lane at most CHUNK_ALIGN + ITEM above B. A range
 *   crossing a lane boundary is cut there (at a multiple of CINFER__DECODE_CHUNK_ALIGN tokens, each
 *   part keeping at least that many; a lane whose room holds no such cut, under a budget below
 *   CHUNK_ALIGN + ITEM or one the lanes before it spent, takes only the first CHUNK_ALIGN tokens
 *   of a range over 2B); so every CTA's cost is within a piece's slack of B (of 2B under such a
 *   small budget) whatever the lengths (a persistent grid dealing whole chunks loses up to one
 *   chunk per CTA: 1.3 waves of items run like 2). With no_split nothing is cut: whole ranges are
 *   dealt in order, each lane within one range of B.
 *
 * Consequences the workspace relies on, for a batch of at most max_batch_size requests: in the
 * one-wave regime items <= max_ctas and partial slots <= items. In the stream regime each of the
 * at most lanes - 1 cuts adds one piece (W items) and makes at most one more range split, so
 *   work items    <= max_batch_size * units + max_ctas
 *   partial slots <= 2 * max_ctas
 * and one info per (request, head slice): max_batch_size * units.
 */
#ifndef CINFER_SCHED_DECODE_PLAN_H
#define CINFER_SCHED_DECODE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "decode_params.h"

/* Chunk sizes and cuts are multiples of this many tokens, and a cut piece keeps at least this
 * many: a chunk of 64 tokens is 2 steps of the 128-thread kernel at D = 128 (8 token rows x 4
 * tokens per step) and four 16-token tiles of the tensor-core kernel, so a shorter piece would
 * spend more on its partial-state write and merge than on attention. */
#define CINFER__DECODE_CHUNK_ALIGN 64
/* The chunk the one-wave regime raises shorter chunks toward (busy_ctas). H200, one request, 32/8
 * heads, 2026-11-30, 4-warp tensor-core CTAs: 8k tokens ran in 19.0 us as 344 items of 192 tokens
 * and in 17.5-17.9 us as 256 items of 256 (an item's start, dependent DRAM round trips, and its
 * partial state outweigh the parallelism), but 4k tokens in 13.6 us as 256 items of 128
 * against 14.3 us as 128 of 256, and 1k in 10 us as 128 items of 64 against 13.4 us as 32 of 256
 * (too few CTAs to keep the DRAM busy). */
#define CINFER__DECODE_MIN_CHUNK 256
/* What one work item costs besides its tokens, in tokens, in the stream regime's budget: the
 * item's start (work item, page table and first tiles, a DRAM round trip or two) and the partial
 * state's write, about 2 us at a CTA's share of the bandwidth with 3 CTAs of 4 warps per SM. */
#define CINFER__DECODE_ITEM_TOKENS 64

/* Warps of the CUDA-core decode kernel and of the merge kernel (4 x 32 = 128 threads per block). */
#define CINFER__DECODE_WARPS 4
/* Warps of the tensor-core decode kernel: 3, so that 4 CTAs of 48 KiB (2 stages of 16-bit K+V
 * tiles per warp at D = 128) fit an SM, 528 resident CTAs on an H200. */
#define CINFER__DECODE_TC_WARPS 3
/* Warps of the tensor-core kernel whose K/V stages keep an H200's DRAM busy without more items:
 * 256 CTAs of 3 warps. One request, 32/8 heads, bf16, 2026-11-30 (bench_decode, 3-warp CTAs, 528
 * resident): 8k tokens ran in 19.1 us as 512 items of 128 tokens and in 17.3-17.4 us as 256 of
 * 256, 4k tokens in 15.3 us as 512 of 64 and in 13.5-13.8 us as 256 of 128. */
#define CINFER__DECODE_BUSY_WARPS 768
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
    int busy_ctas;      /* items that keep the DRAM busy by themselves (one-wave chunks grow
                           while at least this many remain: toward CINFER__DECODE_MIN_CHUNK,
                           and past it for long requests; top of this file); 0: they grow to it
                           only if half a wave of items remains, else stay */
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
 * Byte layout of the workspace. The schedule (header, slice infos, work items) comes first and in
 * that order, so plan copies one contiguous prefix (header .. its last work item) from host to
 * device; the float32 partial states follow. Every region starts on CINFER__DECODE_ALIGN bytes and
 * is padded to it:
 *   header      @ 0                     align(sizeof(cinfer_decode_header))
 *   infos       @ infos_offset          align(info_capacity * sizeof(cinfer_decode_request))
 *   work        @ work_offset           align(work_capacity * sizeof(cinfer_decode_work))
 *   partial_o   @ partial_o_offset      align(slot_capacity * HPC * head_dim * 4)
 *   partial_lse @ partial_lse_offset    align(slot_capacity * HPC * 4)
 *   total_bytes = partial_lse_offset + its aligned size
 */
typedef struct cinfer__decode_layout {
    int work_capacity, info_capacity, slot_capacity;
    size_t infos_offset, work_offset, partial_o_offset, partial_lse_offset;
    size_t schedule_bytes; /* work_offset + work_capacity * sizeof(cinfer_decode_work) */
    size_t total_bytes;
} cinfer__decode_layout_t;

/* The layout for given capacities (each >= 0 and <= 2^31 - 1). */
void cinfer__decode_layout(int work_capacity, int info_capacity, int slot_capacity,
                           int heads_per_cta, int head_dim, cinfer__decode_layout_t *out);

/*
 * The layout of a batch decode object: capacities that hold any plan of up to max_batch_size
 * requests (work = max_batch_size * units + max_ctas, infos = max_batch_size * units,
 * slots = 2 * max_ctas; see the top of this file). UNSUPPORTED when a capacity exceeds 2^31 - 1.
 */
cinfer_status_t cinfer__decode_batch_layout(const cinfer__decode_config_t *cfg, int head_dim,
                                            cinfer__decode_layout_t *out);

/* ---- planning ---- */

/* What the schedule rule chose for one batch. */
typedef struct cinfer__decode_chunking {
    bool stream;          /* the stream regime (else one wave) */
    int64_t stream_share; /* stream: each CTA's budget B in tokens (top of this file); else 0 */
    int chunk_size;  /* one wave: C in tokens (a slice attending <= C is one chunk); stream: 0 */
    int num_work;    /* work items */
    int num_ctas;    /* CTAs with work (one wave: num_work) */
    int num_slots;   /* partial slots (pieces of split slices) */
    int max_chunks;  /* pieces of the most split slice (1 = nothing split) */
    bool split;      /* some slice has more than one piece: the merge kernel must run */
    int merge_warps; /* merge kernel warps per (request, query head): cinfer__decode_merge_warps */
} cinfer__decode_chunking_t;

/* Applies the schedule rule (top of this file) to kv_len[batch_size]: counts only. Pure and
 * cheap: O(batch x log(max_len / 64)) for the one-wave chunk, and where the stream may be chosen
 * (beyond one wave, or a longest one-wave item past the no-cut budget and its slack) the stream
 * budget's binary search, O(log ITEM) walks of O(items) each.
 * INVALID_ARGUMENT for batch_size < 0 or a negative kv_len; UNSUPPORTED when the counts exceed
 * 2^31 - 1. */
cinfer_status_t cinfer__decode_plan_chunks(const cinfer__decode_config_t *cfg,
                                           const int32_t *kv_len, int batch_size,
                                           cinfer__decode_chunking_t *out);

/* Where plan writes the schedule (the host mirror of the workspace's schedule regions). */
typedef struct cinfer__decode_schedule {
    cinfer_decode_header *header;
    cinfer_decode_request *infos; /* [info_capacity]: one per (request, head slice) */
    cinfer_decode_work *work;     /* [work_capacity] */
    int info_capacity, work_capacity, slot_capacity;
} cinfer__decode_schedule_t;

/*
 * Writes the schedule of kv_len[batch_size] as `chunking` counted it (cinfer__decode_plan_chunks
 * with the same arguments) into dst:
 * - header = {num_work, num_ctas, batch_size, merge_warps};
 * - infos[b * units + s] = {kv_len, num_chunks, partial_base} for head slice s of request b:
 *   num_chunks = 1 and partial_base = -1 for a slice in one piece (written directly, including
 *   kv_len 0: one empty item that writes 0 and LSE -inf); the c-th piece of a split slice takes
 *   slot partial_base + c, bases given out in stream order from 0;
 * - every work item carries its request's kv_len and page_begin = kv_indptr[request] (0 when
 *   kv_indptr is NULL: single decode's contiguous KV);
 * - one wave: item order request, slice, chunk; every `next` -1 (one item per CTA);
 * - stream: CTA c's first piece at item c (c < num_ctas), its other pieces after the first
 *   num_ctas items in stream order, each linked to the following one by `next`.
 * INTERNAL if a capacity is too small (the layout prevents it), OUT_OF_MEMORY without host scratch
 * for the stream's pieces.
 */
cinfer_status_t cinfer__decode_plan_build(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                          const int32_t *kv_indptr, int batch_size,
                                          const cinfer__decode_chunking_t *chunking,
                                          const cinfer__decode_schedule_t *dst);

/*
 * The plan's items as kernel parameters (cinfer_decode_uniform in decode_params.h) when
 * cinfer_decode_uniform_work reproduces them: one request, the one-wave regime, not in graph mode
 * (a captured graph keeps its parameters, so its kernels read every plan from the workspace).
 * Else pieces = 0. With pieces > 0 the header's merge_warps and the request entries
 * (cinfer_decode_uniform_request) come from the parameters too, so the kernels read nothing of
 * the schedule. kv_indptr as for cinfer__decode_plan_build.
 */
void cinfer__decode_plan_uniform(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                 const int32_t *kv_indptr, int batch_size,
                                 const cinfer__decode_chunking_t *chunking,
                                 cinfer_decode_uniform *out);

/* ---- grids ---- */

/* Blocks of the attention kernel: max_ctas in graph mode (constant, CTAs past the plan's num_ctas
 * exit), else num_ctas (0 = no launch). */
int cinfer__decode_attention_grid(const cinfer__decode_config_t *cfg, int num_ctas);

/* Warps of the merge kernel per (request, query head), 1, 2 or 4: one while no slice has more
 * than CINFER__DECODE_MERGE_WARP_CHUNKS pieces (a warp's lane groups load them in one step); else
 * 4, and in graph mode the most of 4, 2, 1 whose batch_size * Hq * warps fits the constant grid. */
int cinfer__decode_merge_warps(const cinfer__decode_config_t *cfg, int batch_size, int max_chunks);

/* Blocks of the merge kernel: graph mode ceil(max_batch_size * Hq / rows) always (constant; rows
 * of slices that were not split exit); else ceil(batch_size * Hq * merge_warps / rows) when the
 * plan split some request, 0 otherwise. rows = cinfer__decode_merge_rows(head_dim) (warps per
 * block). */
int64_t cinfer__decode_merge_grid(const cinfer__decode_config_t *cfg, int head_dim, int batch_size,
                                  bool split, int merge_warps);

#endif
