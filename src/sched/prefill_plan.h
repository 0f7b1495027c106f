/*
 * The batch prefill planner: pure host code (no CUDA calls), unit-tested in CI without a GPU.
 *
 * From the host copies of the indptr arrays (and, for a paged KV, kv_last_page_len) it checks
 * the batch, chooses the query tile, splits long KV ranges into chunks when the batch alone would
 * leave most of the GPU idle (split-KV), and writes the work list the batch prefill kernel reads
 * (kernels/prefill_params.h): one item per (request, tile of tile_q query rows, KV chunk); the
 * grid runs every item for every query head, or with GQA packing for every KV head (below). It
 * also computes the exact workspace layout.
 *
 * The tile rule (cinfer__prefill_choose_tile)
 * -------------------------------------------
 * The kernels of one batch prefill object differ only in their query tile (tile_q rows, 16 or 32
 * per warp). A CTA costs about the same whatever number of its rows are real, so short queries
 * (chunked prefill mixed with decode tokens) want small tiles and long ones big tiles (fewer K/V
 * passes per query row). With avg = ceil(total_qo / requests with qo_len > 0), the plan takes the
 * smallest candidate tile_q >= avg, else the largest (FlashInfer's rule with 16 / 64 / 128 rows;
 * here 32 / 64 / 128 for D <= 128, the smallest tile being two warps, and 256 on eight warps where
 * ops/prefill.c adds the turn-taking tile). In CUDA-graph mode the
 * captured kernel cannot change, so the tile is fixed when the object is created, by the same rule
 * applied to avg = ceil(max_total_qo / max_batch_size). Outside graph mode a plan gives up a
 * largest tile with fewer resident CTAs than the next (the turn-taking 256-row tile) when its
 * chunked plan would fill under 3/4 of them (cinfer__prefill_plan_tile).
 *
 * GQA packing
 * -----------
 * With G = Hq / Hk > 1, an object may pack (kernels/prefill.cu, "GQA packing"): a CTA of T rows
 * then computes all G query heads of one KV head for T / G whole tokens (rounded down), so the
 * grid is items x Hk (cta_heads; Hq unpacked) and tile_q below counts tokens: T / G. The rules of
 * this file work in tokens and CTAs and hold unchanged: the tile rule compares the average tokens
 * per request with T / G (a packed CTA holds T / G tokens of each head of its group); items are
 * tiles of T / G tokens; the split rule counts items x cta_heads CTAs; partial states and merge
 * rows stay per (token, query head), the CTA of KV head k writing the slots of its heads
 * [k G, k G + G). Whether to pack is decided when the object is created (ops/prefill.c: its
 * kernels, and graph mode's captured grid, depend on it): when G >= 2 divides every candidate T.
 * Why that never costs more work: for the same average, the unpacked plan takes tile T' (the
 * smallest holding it, or the largest) and the packed one T with T' <= T <= G T' (T = G T' would
 * hold it too); tiles and G are powers of two, so each packed tile of T / G tokens lies inside
 * one unpacked tile of T' tokens, whose G CTAs (one per head) become G T' / T <= G packed CTAs,
 * each visiting at most that tile's KV range (the causal and window ranges of fewer tokens are
 * narrower) and loading each K/V tile once for G heads instead of once per head; padded rows per
 * (request of L tokens, KV head) are ceil(G L / T) T <= G ceil(L / T') T'. Short queries gain
 * the most: L tokens with G L <= T take one CTA per KV head instead of G mostly empty ones (a
 * cascade's shared prefix, 64 tokens x 32 / 8 heads over 8192 keys: 16 CTAs of 128 full rows,
 * split into 8 chunks each, instead of 32 CTAs of 64 rows split into 8). What packing
 * can lose is parallelism where a plan cannot split (variants without split-KV, KV ranges shorter
 * than two chunks, graph-mode rows past R): fewer CTAs of more rows each, on small problems. A G
 * that does not divide T (3, 5, 6, 7) would leave T mod G rows of every packed tile empty, up to
 * 1 / 16 of the work at T = 64 and G = 5 on long queries, so those objects stay unpacked.
 *
 * The KV range of a query tile
 * ----------------------------
 * The tile of rows [q, q + r) of a request visits the KV positions [b, e) that some of its rows
 * keep: e = min(kv_len, q + r + kv_len - qo_len) under the bottom-right causal mask, else kv_len;
 * b = max(0, q + kv_len - qo_len - window_left) with a window, else 0 (the kernel's own limits,
 * not rounded to KV tiles; e <= b: nothing kept, the CTA only writes zeros and LSE -inf).
 *
 * The split-KV rule (cinfer__prefill_plan_chunks)
 * -----------------------------------------------
 * Unsplit, a plan runs items x cta_heads CTAs (items = sum_b ceil(qo_len_b / T); cta_heads = Hq,
 * or Hk packed). A few tiles over a long KV (a cascade's shared prefix: 64 query rows of one group
 * over 8192 positions, 32 heads unpacked: 32 CTAs) leave most SMs idle. With max_ctas = the chosen
 * kernel's resident CTAs on the device (SMs x blocks per SM, from the occupancy API when the object
 * is sized and created):
 * - never for variants whose partial states cannot be merged (no softmax, output transform), nor
 *   when items x cta_heads >= max_ctas (one chunk per tile already fills a wave), nor in CUDA-graph
 * mode when qo_indptr[batch] exceeds the merge's fixed rows (below);
 * - else all tiles share one chunk size C, a multiple of A = max(CINFER__PREFILL_CHUNK_ALIGN,
 *   tile_kv) and at least CINFER__PREFILL_CHUNK_MIN: the tile with range [b, e) has
 *   n = max(1, ceil((e - b') / C)) chunks with b' = b rounded down to A, chunk c covering
 *   [b' + c C, min(b' + (c + 1) C, e)), and C is the smallest such size with
 *   sum_tiles n x cta_heads <= max_ctas (binary search; the sum is non-increasing in C). When that
 * C leaves every tile one chunk, nothing is split. So a split plan runs at most one wave of
 * resident CTAs, its longest CTA is as short as that allows, and chunk edges are KV-tile edges (no
 * KV tile is visited by two chunks; the causal and window masks stay where they were). A row that
 * keeps none of a chunk's positions (causal: a chunk past the row's position) gets an empty partial
 * state (0, LSE -inf): weight 0 in the merge.
 *
 * CUDA-graph mode
 * ---------------
 * A captured run replays the launches of the plan it was captured after: the kernel (the tile,
 * fixed at create), the grids and every address are those of the capture; only the workspace's
 * contents change with later plans. So graph mode splits by the same rule, inside bounds fixed
 * at create: the attention grid is max(work_bound(T), I) x cta_heads for the fixed tile T and
 * I = floor(max_ctas / cta_heads) (every unsplit plan, and every split one, fits; CTAs past the
 * plan's items exit), and the merge kernel is launched after it by every run, with a grid for R =
 * min(I x T, max_total_qo) rows; it reads the plan's row count from its header in the workspace, 0
 * when the plan did not split (every block then exits). The merge's rows are the absolute rows of
 * q/out from row 0 (rows before qo_indptr[0] are skipped), because the output address a captured
 * merge writes through cannot move with a later plan's qo_indptr[0]: a graph-mode plan splits only
 * when qo_indptr[batch] <= R, which every split plan with qo_indptr[0] = 0 satisfies (its rows lie
 * in at most I tiles of T rows, and there are at most max_total_qo of them); a plan with rows
 * further out runs unsplit (correct, not faster).
 *
 * Partial states and the merge
 * ----------------------------
 * A split tile of r rows and n chunks takes r x Hq x n consecutive slots from partial_base P
 * (tiles in work-list creation order): row i, head h, chunk c is slot P + (i Hq + h) n + c. Its
 * items carry partial = P + c; items of unsplit tiles carry -1 and write out/lse directly. The
 * decode merge kernel (kernels/decode.cu, heads_per_cta = 1) folds the slots: its "requests" are
 * query rows (entry {kv_len, n, P + i Hq n} for a split row, {kv_len, 1, -1}, which it skips, for
 * the others): the plan's rows from qo_indptr[0] outside graph mode, the rows [0,
 * qo_indptr[batch]) in graph mode (rows before qo_indptr[0]: {0, 1, -1}); its header's
 * batch_size is the number of those rows.
 *
 * The work list and the workspace bound
 * -------------------------------------
 * Unsplit, a request of qo_len rows has ceil(qo_len / tile_q) items (none when qo_len is 0), so
 *   items = sum_b ceil(qo_len_b / T) <= floor((total_qo + batch * (T - 1)) / T),
 * the work bound of the smallest candidate tile. A split plan has at most
 * I = floor(max_ctas / cta_heads) items (its CTAs fit one wave), so at most
 * I x Hq x min(tile_q, max_total_qo) partial states (the CTAs of an item write at most that many
 * rows of each head) and, since every row is in one of its at
 * most I unsplit tiles, at most min(I x tile_q, max_total_qo) merge rows (graph mode: R above,
 * which bounds its absolute rows by construction). The workspace holds the larger of the bounds
 * over the candidate tiles (graph mode: the fixed tile's), so any plan fits.
 * Items are sorted by the KV positions their CTA visits (the range above, cut to the item's
 * chunk), longest first, ties in (request, row, chunk) order: the long CTAs start first and the
 * short ones fill the tail of the last wave.
 */
#ifndef CINFER_SCHED_PREFILL_PLAN_H
#define CINFER_SCHED_PREFILL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "decode_params.h"
#include "prefill_params.h"

/* Every region of the workspace starts on this boundary (the cudaMalloc alignment). */
#define CINFER__PREFILL_ALIGN 256
/* Candidate query tiles of one object (kernels loaded at create). */
#define CINFER__PREFILL_MAX_TILES 4
/* Chunk edges are multiples of this many KV positions (and of the kernel's tile_kv, when larger):
 * 64 is a multiple of every KV tile the batch kernels use (16, 32, 64), so no KV tile straddles
 * two chunks. */
#define CINFER__PREFILL_CHUNK_ALIGN 64
/* The shortest chunk: 512 positions are 8 to 32 KV tiles, so what a CTA pays besides its KV tiles
 * (the Q tile load and pipeline fill, worth a tile or two; the partial state of tile_q x D floats
 * it writes and the merge reads back) stays a small part of its time. An estimate, not yet a
 * measurement: bench/cascade.py with other --prefix lengths shows where splitting stops paying. */
#define CINFER__PREFILL_CHUNK_MIN 512
/* Work per query row of a tile smaller than the largest, relative to the largest (16 rows per warp
 * read each K/V fragment for half the rows of the largest tile's 32): an estimate from the 16k
 * tile sweep (bench/RESULTS.md, session 3: 296 TFLOP/s for 64 rows on 2 warps against 374 for
 * 128 on 4), for cinfer__prefill_single_tile. */
#define CINFER__PREFILL_SMALL_TILE_SPEED 0.8

/* The fixed part of a batch prefill planner: from the options and the device. */
typedef struct cinfer__prefill_plan_config {
    int num_qo_heads;     /* Hq >= 1 */
    int num_kv_heads;     /* Hk >= 1 */
    int head_dim;         /* D of the output (partial states are D floats) */
    bool causal;          /* bottom-right aligned causal mask */
    int window_left;      /* -1 = off */
    bool paged;           /* kv_indptr counts pages (else K/V rows) */
    int page_size;        /* paged: tokens per page, 1..256 */
    int max_batch_size;   /* requests a plan may hold, >= 1 */
    int64_t max_total_qo; /* query rows a plan may hold (qo_indptr[batch] - qo_indptr[0]), >= 1 */
    bool graph;           /* CUDA-graph mode: one tile, grids fixed for the maxima (top of file) */
    bool no_split;        /* the variant's partial states cannot be merged (no softmax, output
                             transform): no split-KV */
    int min_chunk;        /* the shortest split chunk in KV positions; 0 or below
                             CINFER__PREFILL_CHUNK_MIN: that minimum (a longer one only ever
                             splits less, within the same layout) */
    int chunk_floor;      /* the object's own shortest chunk in place of CINFER__PREFILL_CHUNK_MIN
                             (0: that constant), a multiple of CINFER__PREFILL_CHUNK_ALIGN
                             (MLA's: src/ops/mla.c) */
    int group;            /* GQA packing: the G = Hq / Hk query heads each CTA packs into its tile
                             rows (Hk CTAs per work item), or 0 or 1: none (Hq CTAs per item) */
    int num_tiles;        /* candidate tiles, 1..CINFER__PREFILL_MAX_TILES */
    int tile_q[CINFER__PREFILL_MAX_TILES];   /* query tokens per work item, ascending: the
                                                kernel's rows, divided by G (rounded down) when
                                                packed */
    int tile_kv[CINFER__PREFILL_MAX_TILES];  /* each tile's KV rows per pipeline step */
    int max_ctas[CINFER__PREFILL_MAX_TILES]; /* each tile's resident CTAs on the device (0:
                                                unknown: never split with that tile, no fill
                                                rule; no_split objects never split) */
} cinfer__prefill_plan_config_t;

/* One request as planned (host side). */
typedef struct cinfer__prefill_request {
    int32_t qo_begin, qo_len; /* rows of q / out: [qo_begin, qo_begin + qo_len) */
    int32_t kv_begin, kv_len; /* ragged: rows [kv_begin, kv_begin + kv_len); paged: page-table
                                 entries from kv_begin, kv_len tokens */
} cinfer__prefill_request_t;

/* ---- argument checks that need no device ---- */

/*
 * Checks the plan arguments and fills req[batch_size]: 0 <= batch_size <= max_batch_size,
 * qo_indptr and kv_indptr non-NULL, starting >= 0 and non-decreasing, qo_len and kv_len below
 * 2^30 (CINFER_PREFILL_MAX_LEN), qo_indptr[batch] - qo_indptr[0] <= max_total_qo; paged:
 * kv_last_page_len non-NULL (when batch_size > 0) with entries in [1, page_size] for requests
 * with pages, kv_len = (pages - 1) * page_size + last (0 without pages); ragged:
 * kv_last_page_len NULL, kv_len = kv_indptr[b+1] - kv_indptr[b]. INVALID_ARGUMENT with a message
 * naming the argument, the index, the value and what was expected; req is then partly written.
 */
cinfer_status_t cinfer__prefill_requests(const cinfer__prefill_plan_config_t *cfg,
                                         const int32_t *qo_indptr, const int32_t *kv_indptr,
                                         const int32_t *kv_last_page_len, int batch_size,
                                         cinfer__prefill_request_t *req);

/* ---- tiles and counts ---- */

/*
 * Single prefill (one request, no split-KV, no workspace): the query tile with the least estimated
 * time, for cfg's candidates with slots[i] resident CTAs each (0: not a candidate). The kernel
 * runs its tiles heaviest first (the last query tile first under the causal mask), so the time is
 * about max(longest CTA, total work / slots) (the list-scheduling bound), a CTA's work being the
 * KV positions its tile visits x tile_q rows, divided by the candidate's relative speed per row:
 * CINFER__PREFILL_SMALL_TILE_SPEED for every tile but the largest. A short causal prompt then
 * takes smaller tiles: at 1k positions and 32 heads, 256 CTAs of 128 rows fill one wave of 264
 * (132 SMs x 2) and the longest visits 16 KV tiles where the average visits 8.5, so the wave
 * takes twice its mean work; 512 CTAs of 64 rows finish near the mean. Longer or non-causal
 * prompts keep the largest tile (their waves are even). Index into cfg->tile_q.
 */
int cinfer__prefill_single_tile(const cinfer__prefill_plan_config_t *cfg, int32_t qo_len,
                                int32_t kv_len, const int64_t *slots);

/* Index into cfg->tile_q of the tile for total_qo rows over `requests` requests with rows (the
 * rule at the top; graph mode: the fixed tile, whatever the arguments). */
int cinfer__prefill_choose_tile(const cinfer__prefill_plan_config_t *cfg, int64_t total_qo,
                                int64_t requests);

/* The most unsplit work items any plan of at most max_total_qo rows and max_batch_size requests
 * can have with tile_q rows per item: floor((max_total_qo + max_batch_size * (tile_q - 1)) /
 * tile_q). */
int64_t cinfer__prefill_work_bound(const cinfer__prefill_plan_config_t *cfg, int tile_q);

/* CTAs per work item: Hk with GQA packing (cfg->group > 1), else Hq. */
int64_t cinfer__prefill_cta_heads(const cinfer__prefill_plan_config_t *cfg);

/* The most work items of a split plan with tile index `tile`: I = floor(max_ctas[tile] /
 * cta_heads); 0 when plans of cfg never split with that tile (no_split; graph mode: a tile other
 * than the fixed one). */
int64_t cinfer__prefill_split_items(const cinfer__prefill_plan_config_t *cfg, int tile);

/* Whether plans of cfg may split the KV at all: some tile has split items. */
bool cinfer__prefill_may_split(const cinfer__prefill_plan_config_t *cfg);

/* The most merge rows of any plan of cfg: min(max over tiles of split_items x tile_q,
 * max_total_qo); 0 when no plan splits. In graph mode R of the top of this file: the fixed row
 * range of the merge kernel, which a split plan's qo_indptr[batch] must not exceed. */
int64_t cinfer__prefill_row_bound(const cinfer__prefill_plan_config_t *cfg);

/* ---- workspace ---- */

/*
 * Byte layout of the workspace. The schedule comes first: the header, the work list, the merge
 * header (a cinfer_decode_header whose batch_size is the plan's merge rows) and the merge rows
 * (cinfer_decode_request, one per query row of a split plan); plan writes them into a host mirror
 * of schedule_bytes and copies the used parts. The float32 partial states follow. Regions start on
 * CINFER__PREFILL_ALIGN bytes; the merge and partial regions are empty when no plan can split:
 *   header      @ 0                   align(sizeof(cinfer_prefill_header))
 *   work        @ work_offset         align(work_capacity * sizeof(cinfer_prefill_work))
 *   merge       @ merge_offset        align(sizeof(cinfer_decode_header)), or 0 bytes
 *   rows        @ rows_offset         align(row_capacity * sizeof(cinfer_decode_request))
 *   partial_o   @ partial_o_offset    align(state_capacity * head_dim * 4)
 *   partial_lse @ partial_lse_offset  align(state_capacity * 4)
 *   total_bytes = partial_lse_offset + its aligned size
 */
typedef struct cinfer__prefill_layout {
    int work_capacity;
    int row_capacity;   /* merge rows: query rows of a split plan */
    int state_capacity; /* partial states: (row, head, chunk) of split tiles */
    size_t work_offset, merge_offset, rows_offset, partial_o_offset, partial_lse_offset;
    size_t schedule_bytes; /* rows_offset + row_capacity * sizeof(cinfer_decode_request), or
                              work_offset + work_capacity * sizeof(cinfer_prefill_work) when
                              row_capacity is 0 */
    size_t total_bytes;
} cinfer__prefill_layout_t;

/* The layout that holds any plan of cfg (the bounds at the top of this file). UNSUPPORTED when a
 * capacity, or a grid of work_capacity x num_qo_heads CTAs, exceeds 2^31 - 1. */
cinfer_status_t cinfer__prefill_batch_layout(const cinfer__prefill_plan_config_t *cfg,
                                             cinfer__prefill_layout_t *out);

/* ---- planning ---- */

/* What the split-KV rule chose for one batch. */
typedef struct cinfer__prefill_chunking {
    int chunk_size; /* C in KV positions; 0 when nothing is split */
    int num_work;   /* work items */
    int num_states; /* partial states: sum over split tiles of rows x Hq x chunks */
    int num_rows;   /* merge rows when split, else 0: qo_indptr[batch] - qo_indptr[0]; graph
                       mode qo_indptr[batch] (absolute rows, top of this file) */
    int max_chunks; /* chunks of the most split tile (1 = nothing split; 0 = no items) */
    bool split;     /* some tile has more than one chunk: the merge kernel must run */
} cinfer__prefill_chunking_t;

/* Applies the split-KV rule (top of this file) to req[batch_size] with tile index `tile`. Pure and
 * cheap: O(tiles x log(max_len / 64)). INTERNAL when a count exceeds 2^31 - 1 (the layout's
 * bounds prevent it for plans of cfg). */
cinfer_status_t cinfer__prefill_plan_chunks(const cinfer__prefill_plan_config_t *cfg,
                                            const cinfer__prefill_request_t *req, int batch_size,
                                            int tile, cinfer__prefill_chunking_t *out);

/*
 * The tile and its chunking for a plan (not graph mode: its tile is fixed): the tile rule's
 * choice, unless that tile has fewer resident CTAs than the next smaller one (the turn-taking
 * 256-row tile, one CTA per SM: ops/prefill.c) and its chunked plan would fill under 3/4 of them
 * while the smaller tile's fills more CTAs: few long-tile CTAs leave SMs idle that the smaller
 * tile's twice as many CTAs put to work (H200, one request of 64 tokens over 4096 causal, 4 heads
 * packed per KV head: 64 CTAs of the 256-row tile took 34 us, the 128-row tile's 128 CTAs 25 us;
 * bench_prefill --split, 2026-11-30).
 * *tile indexes cfg->tile_q; graph mode: cinfer__prefill_choose_tile's fixed tile. Errors as
 * cinfer__prefill_plan_chunks.
 */
cinfer_status_t cinfer__prefill_plan_tile(const cinfer__prefill_plan_config_t *cfg,
                                          const cinfer__prefill_request_t *req, int batch_size,
                                          int *tile, cinfer__prefill_chunking_t *chunking);

/* Where plan writes the schedule (the host mirror of the workspace's schedule regions). */
typedef struct cinfer__prefill_schedule {
    cinfer_prefill_header *header;
    cinfer_prefill_work *work;   /* [work_capacity] */
    cinfer_decode_header *merge; /* NULL when row_capacity is 0 */
    cinfer_decode_request *rows; /* [row_capacity] */
    int work_capacity, row_capacity, state_capacity;
} cinfer__prefill_schedule_t;

/*
 * Writes the work list of req[batch_size] with tile index `tile`, chunked as `chunking` (from
 * cinfer__prefill_plan_chunks with the same arguments), into dst, sorted as the top of this file
 * says, with header = {num_work, batch_size}; when dst has a merge region, the merge header
 * {num_states, 0, num_rows, 1} ({0, 0, 0, 1} when nothing is split: a graph-mode merge launch
 * then does nothing) and, when split, the merge rows. INTERNAL when the counts do not fit the
 * capacities (the layout prevents it) or disagree with the chunking.
 */
cinfer_status_t cinfer__prefill_plan_build(const cinfer__prefill_plan_config_t *cfg,
                                           const cinfer__prefill_request_t *req, int batch_size,
                                           int tile, const cinfer__prefill_chunking_t *chunking,
                                           const cinfer__prefill_schedule_t *dst);

/* The KV range [*begin, *end) of the query tile of rows [q_begin, q_begin + tile_q) of a request
 * (the rule at the top: the kernel's causal and window limits, not rounded to KV tiles; empty
 * when *end <= *begin). */
void cinfer__prefill_tile_range(const cinfer__prefill_plan_config_t *cfg, int32_t qo_len,
                                int32_t kv_len, int32_t q_begin, int tile_q, int64_t *begin,
                                int64_t *end);

/* KV positions the CTA of an item visits (what the sort orders by): its tile's range cut to its
 * chunk. */
int64_t cinfer__prefill_item_cost(const cinfer__prefill_plan_config_t *cfg,
                                  const cinfer_prefill_work *item, int tile_q);

/* ---- grids ---- */

/* Blocks of the attention kernel: graph mode max(work_bound(tile_q), split_items(fixed tile)) x
 * cta_heads (constant; CTAs past the plan's items exit), else num_work x cta_heads. */
int64_t cinfer__prefill_grid(const cinfer__prefill_plan_config_t *cfg, int tile_q, int num_work);

/* Blocks of the merge kernel: graph mode ceil(row_bound x Hq / rows per block) whatever the plan
 * (constant; 0 when no plan splits), else ceil(num_rows x Hq / rows per block) for a plan with
 * num_rows merge rows (0 when nothing was split); rows per block =
 * cinfer__decode_merge_rows(head_dim). */
int64_t cinfer__prefill_merge_grid(const cinfer__prefill_plan_config_t *cfg, int num_rows);

#endif
