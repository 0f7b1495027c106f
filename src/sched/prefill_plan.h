/*
 * The batch prefill planner: pure host code (no CUDA calls), unit-tested in CI without a GPU.
 *
 * From the host copies of the indptr arrays (and, for a paged KV, kv_last_page_len) it checks
 * the batch, chooses the query tile and writes the work list the batch prefill kernel reads
 * (kernels/prefill_params.h): one item per (request, tile of tile_q query rows); the grid runs
 * every item for every query head. It also computes the exact workspace layout.
 *
 * The tile rule (cinfer__prefill_choose_tile)
 * -------------------------------------------
 * The kernels of one batch prefill object differ only in their query tile (tile_q rows, 16 per
 * warp). A CTA costs about the same whatever number of its rows are real, so short queries
 * (chunked prefill mixed with decode tokens) want small tiles and long ones big tiles (fewer K/V
 * passes per query row). With avg = ceil(total_qo / requests with qo_len > 0), the plan takes the
 * smallest candidate tile_q >= avg, else the largest (FlashInfer's rule with 16 / 64 / 128 rows;
 * here 32 / 64 / 128 for D <= 128, the smallest tile being two warps). In CUDA-graph mode the
 * captured kernel cannot change, so the tile is fixed when the object is created, by the same rule
 * applied to avg = ceil(max_total_qo / max_batch_size).
 *
 * The work list
 * -------------
 * A request of qo_len rows has ceil(qo_len / tile_q) items (none when qo_len is 0), so a plan has
 *   items = sum_b ceil(qo_len_b / T) <= floor((total_qo + batch * (T - 1)) / T)
 * and the workspace, sized for the smallest candidate tile at max_total_qo and max_batch_size,
 * holds any plan. Items are sorted by the KV positions their CTA visits (causal and window
 * limits applied as the kernel applies them), longest first, ties in (request, row) order: the
 * long CTAs start first and the short ones fill the tail of the last wave.
 *
 * Split-KV (several CTAs per query tile over parts of a long KV, merged afterwards) is not done
 * yet: a request with few query rows and a long KV runs on ceil(qo_len / T) x Hq CTAs.
 */
#ifndef CINFER_SCHED_PREFILL_PLAN_H
#define CINFER_SCHED_PREFILL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "prefill_params.h"

/* Every region of the workspace starts on this boundary (the cudaMalloc alignment). */
#define CINFER__PREFILL_ALIGN 256
/* Candidate query tiles of one object (kernels loaded at create). */
#define CINFER__PREFILL_MAX_TILES 3

/* The fixed part of a batch prefill planner: from the options. */
typedef struct cinfer__prefill_plan_config {
    int num_qo_heads;     /* Hq >= 1 */
    int num_kv_heads;     /* Hk >= 1 */
    bool causal;          /* bottom-right aligned causal mask */
    int window_left;      /* -1 = off */
    bool paged;           /* kv_indptr counts pages (else K/V rows) */
    int page_size;        /* paged: tokens per page, 1..256 */
    int max_batch_size;   /* requests a plan may hold, >= 1 */
    int64_t max_total_qo; /* query rows a plan may hold (qo_indptr[batch] - qo_indptr[0]), >= 1 */
    bool graph;           /* CUDA-graph mode: one tile, grid fixed for the maxima */
    int num_tiles;        /* candidate tiles, 1..CINFER__PREFILL_MAX_TILES */
    int tile_q[CINFER__PREFILL_MAX_TILES]; /* ascending, each a multiple of 16 */
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

/* Index into cfg->tile_q of the tile for total_qo rows over `requests` requests with rows (the
 * rule at the top; graph mode: the fixed tile, whatever the arguments). */
int cinfer__prefill_choose_tile(const cinfer__prefill_plan_config_t *cfg, int64_t total_qo,
                                int64_t requests);

/* The most work items any plan of at most max_total_qo rows and max_batch_size requests can
 * have with tile_q rows per item: floor((max_total_qo + max_batch_size * (tile_q - 1)) /
 * tile_q). */
int64_t cinfer__prefill_work_bound(const cinfer__prefill_plan_config_t *cfg, int tile_q);

/* ---- workspace ---- */

/*
 * Byte layout of the workspace: the header, then the work list; both are the schedule plan
 * copies (the header and the items it wrote, one contiguous prefix). Regions start on
 * CINFER__PREFILL_ALIGN bytes:
 *   header @ 0            align(sizeof(cinfer_prefill_header))
 *   work   @ work_offset  align(work_capacity * sizeof(cinfer_prefill_work))
 */
typedef struct cinfer__prefill_layout {
    int work_capacity;
    size_t work_offset;
    size_t schedule_bytes; /* work_offset + work_capacity * sizeof(cinfer_prefill_work) */
    size_t total_bytes;
} cinfer__prefill_layout_t;

/* The layout that holds any plan of cfg (capacity = the work bound of the smallest tile).
 * UNSUPPORTED when the capacity, or the grid of capacity x num_qo_heads CTAs, exceeds
 * 2^31 - 1. */
cinfer_status_t cinfer__prefill_batch_layout(const cinfer__prefill_plan_config_t *cfg,
                                             cinfer__prefill_layout_t *out);

/* ---- planning ---- */

/* Where plan writes the schedule (the host mirror of the workspace's schedule). */
typedef struct cinfer__prefill_schedule {
    cinfer_prefill_header *header;
    cinfer_prefill_work *work; /* [work_capacity] */
    int work_capacity;
} cinfer__prefill_schedule_t;

/*
 * Writes the work list of req[batch_size] with tile_q rows per item into dst (sorted as the top
 * of this file says) and header = {num_work, batch_size}. INTERNAL when the items do not fit
 * work_capacity (the layout prevents it).
 */
cinfer_status_t cinfer__prefill_plan_build(const cinfer__prefill_plan_config_t *cfg,
                                           const cinfer__prefill_request_t *req, int batch_size,
                                           int tile_q, const cinfer__prefill_schedule_t *dst);

/* KV positions the CTA of an item visits (what the sort orders by): the kernel's causal and
 * window limits, not rounded to KV tiles. */
int64_t cinfer__prefill_item_cost(const cinfer__prefill_plan_config_t *cfg,
                                  const cinfer_prefill_work *item, int tile_q);

/* ---- grid ---- */

/* Blocks of the kernel: graph mode work_bound(fixed tile) x Hq (constant; CTAs past the plan's
 * items exit), else num_work x Hq. */
int64_t cinfer__prefill_grid(const cinfer__prefill_plan_config_t *cfg, int tile_q, int num_work);

#endif
