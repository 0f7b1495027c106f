/*
 * The batch prefill planner (see prefill_plan.h for the rules): argument checks, the tile
 * choice, split-KV chunking, the work list with its merge rows, and the workspace layout. No CUDA
 * calls.
 */
#include <stdlib.h>

#include "sched/decode_plan.h"
#include "sched/prefill_plan.h"

/* ---- argument checks ---- */

/* Checks indptr[0..batch] (name: "qo_indptr" or "kv_indptr") starts >= 0 and never falls. */
static cinfer_status_t check_indptr(const char *name, const int32_t *indptr, int batch_size,
                                    const char *unit) {
    if (!indptr)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s is NULL, expected %d host int32 entries (batch_size + 1, in %s)",
                             name, batch_size + 1, unit);
    if (indptr[0] < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s[0] = %d, expected >= 0 (%s)", name,
                             indptr[0], unit);
    for (int b = 0; b < batch_size; b++)
        if (indptr[b + 1] < indptr[b])
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s is not monotone: %s[%d] = %d < %s[%d] = %d", name, name, b + 1,
                                 indptr[b + 1], name, b, indptr[b]);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__prefill_requests(const cinfer__prefill_plan_config_t *cfg,
                                         const int32_t *qo_indptr, const int32_t *kv_indptr,
                                         const int32_t *kv_last_page_len, int batch_size,
                                         cinfer__prefill_request_t *req) {
    if (batch_size < 0 || batch_size > cfg->max_batch_size)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "batch_size = %d, expected 0..%d (options->max_batch_size)",
                             batch_size, cfg->max_batch_size);
    CINFER__CHECK(check_indptr("qo_indptr", qo_indptr, batch_size, "query rows"));
    CINFER__CHECK(check_indptr("kv_indptr", kv_indptr, batch_size,
                               cfg->paged ? "page-table entries" : "K/V rows"));
    if (cfg->paged && batch_size > 0 && !kv_last_page_len)
        return cinfer__error(
            CINFER_STATUS_INVALID_ARGUMENT,
            "kv_last_page_len is NULL, expected %d host int32 entries (batch_size) for a paged KV",
            batch_size);
    if (!cfg->paged && kv_last_page_len)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "kv_last_page_len is not NULL, expected NULL for a ragged KV (its "
                             "lengths are kv_indptr[b + 1] - kv_indptr[b])");
    const int64_t total = (int64_t)qo_indptr[batch_size] - qo_indptr[0];
    if (total > cfg->max_total_qo)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "qo_indptr[%d] - qo_indptr[0] = %lld query rows, expected at most "
                             "%lld (max_total_qo_tokens of the object)",
                             batch_size, (long long)total, (long long)cfg->max_total_qo);
    for (int b = 0; b < batch_size; b++) {
        const int64_t qo_len = (int64_t)qo_indptr[b + 1] - qo_indptr[b];
        if (qo_len > CINFER_PREFILL_MAX_LEN)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "request %d: qo_len = %lld (qo_indptr[%d] - qo_indptr[%d]), "
                                 "expected at most 2^30 - 1",
                                 b, (long long)qo_len, b + 1, b);
        const int64_t n = (int64_t)kv_indptr[b + 1] - kv_indptr[b];
        int64_t kv_len = n;
        if (cfg->paged && n > 0) {
            const int32_t last = kv_last_page_len[b];
            if (last < 1 || last > cfg->page_size)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "kv_last_page_len[%d] = %d, expected 1..%d (page_size) for a "
                                     "request with %lld pages",
                                     b, last, cfg->page_size, (long long)n);
            kv_len = (n - 1) * cfg->page_size + last;
        }
        if (kv_len > CINFER_PREFILL_MAX_LEN)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "request %d: kv_len = %lld, expected at most 2^30 - 1", b,
                                 (long long)kv_len);
        req[b].qo_begin = qo_indptr[b];
        req[b].qo_len = (int32_t)qo_len;
        req[b].kv_begin = kv_indptr[b];
        req[b].kv_len = (int32_t)kv_len;
    }
    return CINFER_STATUS_SUCCESS;
}

/* ---- tiles and counts ---- */

static int tile_for_average(const cinfer__prefill_plan_config_t *cfg, int64_t avg) {
    for (int i = 0; i < cfg->num_tiles; i++)
        if (cfg->tile_q[i] >= avg)
            return i;
    return cfg->num_tiles - 1;
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

int cinfer__prefill_choose_tile(const cinfer__prefill_plan_config_t *cfg, int64_t total_qo,
                                int64_t requests) {
    if (cfg->graph)
        return tile_for_average(cfg, ceil_div(cfg->max_total_qo, cfg->max_batch_size));
    return tile_for_average(cfg, requests > 0 ? ceil_div(total_qo, requests) : 0);
}

int64_t cinfer__prefill_work_bound(const cinfer__prefill_plan_config_t *cfg, int tile_q) {
    /* Each of the requests adds at most tile_q - 1 rows of padding to its last tile. */
    return (cfg->max_total_qo + (int64_t)cfg->max_batch_size * (tile_q - 1)) / tile_q;
}

int64_t cinfer__prefill_cta_heads(const cinfer__prefill_plan_config_t *cfg) {
    return cfg->group > 1 ? cfg->num_qo_heads / cfg->group : cfg->num_qo_heads;
}

int64_t cinfer__prefill_split_items(const cinfer__prefill_plan_config_t *cfg, int tile) {
    if (cfg->no_split || (cfg->graph && tile != cinfer__prefill_choose_tile(cfg, 0, 0)))
        return 0;
    return cfg->max_ctas[tile] / cinfer__prefill_cta_heads(cfg);
}

bool cinfer__prefill_may_split(const cinfer__prefill_plan_config_t *cfg) {
    for (int i = 0; i < cfg->num_tiles; i++)
        if (cinfer__prefill_split_items(cfg, i) > 0)
            return true;
    return false;
}

int64_t cinfer__prefill_row_bound(const cinfer__prefill_plan_config_t *cfg) {
    int64_t rows = 0;
    for (int i = 0; i < cfg->num_tiles; i++) {
        const int64_t r = cinfer__prefill_split_items(cfg, i) * cfg->tile_q[i];
        rows = r > rows ? r : rows;
    }
    return rows < cfg->max_total_qo ? rows : cfg->max_total_qo;
}

/* ---- workspace ---- */

static size_t align_up(size_t n) {
    return (n + CINFER__PREFILL_ALIGN - 1) / CINFER__PREFILL_ALIGN * CINFER__PREFILL_ALIGN;
}

cinfer_status_t cinfer__prefill_batch_layout(const cinfer__prefill_plan_config_t *cfg,
                                             cinfer__prefill_layout_t *out) {
    int64_t work = cinfer__prefill_work_bound(cfg, cfg->tile_q[0]);
    const int64_t cta_heads = cinfer__prefill_cta_heads(cfg);
    if (work > INT32_MAX || work * cta_heads > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "max_total_qo_tokens = %lld and options->max_batch_size = %d allow "
                             "%lld query tiles of %d rows, x %lld CTAs per tile (heads) is more "
                             "CTAs than one launch allows (2^31 - 1)",
                             (long long)cfg->max_total_qo, cfg->max_batch_size, (long long)work,
                             cfg->tile_q[0], (long long)cta_heads);
    /* A split plan with tile i has at most items = floor(max_ctas / cta_heads) work items (its
     * CTAs fit one wave), each writing at most min(tile_q, max_total_qo) rows x Hq partial states
     * over its CTAs, and, as
     * every row is in one of at most `items` unsplit tiles, items x tile_q merge rows
     * (prefill_plan.h; graph mode: only the fixed tile has split items). */
    int64_t states = 0;
    const int64_t rows = cinfer__prefill_row_bound(cfg);
    for (int i = 0; i < cfg->num_tiles; i++) {
        const int64_t items = cinfer__prefill_split_items(cfg, i);
        work = items > work ? items : work;
        const int64_t t_states =
            items * cfg->num_qo_heads *
            (cfg->tile_q[i] < cfg->max_total_qo ? cfg->tile_q[i] : cfg->max_total_qo);
        states = t_states > states ? t_states : states;
    }
    if (states > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "split-KV: %lld partial states exceed 2^31 - 1", (long long)states);
    out->work_capacity = (int)work;
    out->row_capacity = (int)rows;
    out->state_capacity = (int)states;
    out->work_offset = align_up(sizeof(cinfer_prefill_header));
    out->merge_offset = out->work_offset + align_up((size_t)work * sizeof(cinfer_prefill_work));
    out->rows_offset = out->merge_offset + (rows > 0 ? align_up(sizeof(cinfer_decode_header)) : 0);
    out->schedule_bytes = rows > 0 ? out->rows_offset + (size_t)rows * sizeof(cinfer_decode_request)
                                   : out->work_offset + (size_t)work * sizeof(cinfer_prefill_work);
    out->partial_o_offset = align_up(out->schedule_bytes);
    out->partial_lse_offset =
        out->partial_o_offset + align_up((size_t)states * (size_t)cfg->head_dim * sizeof(float));
    out->total_bytes = out->partial_lse_offset + align_up((size_t)states * sizeof(float));
    return CINFER_STATUS_SUCCESS;
}

/* ---- planning ---- */

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

static int64_t max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

void cinfer__prefill_tile_range(const cinfer__prefill_plan_config_t *cfg, int32_t qo_len,
                                int32_t kv_len, int32_t q_begin, int tile_q, int64_t *begin,
                                int64_t *end) {
    const int64_t rows = min64((int64_t)qo_len - q_begin, tile_q);
    const int64_t delta = (int64_t)kv_len - qo_len;
    *end = kv_len;
    *begin = 0;
    if (cfg->causal)
        *end = min64(*end, q_begin + rows + delta);
    if (cfg->window_left >= 0)
        *begin = max64(*begin, q_begin + delta - cfg->window_left);
}

int cinfer__prefill_single_tile(const cinfer__prefill_plan_config_t *cfg, int32_t qo_len,
                                int32_t kv_len, const int64_t *slots) {
    int best = cfg->num_tiles - 1;
    double best_time = -1.0;
    for (int i = cfg->num_tiles - 1; i >= 0; i--) {
        if (slots[i] <= 0)
            continue;
        const int tile_q = cfg->tile_q[i];
        const double speed = i == cfg->num_tiles - 1 ? 1.0 : CINFER__PREFILL_SMALL_TILE_SPEED;
        double longest = 0.0, total = 0.0;
        for (int32_t q = 0; q < qo_len; q += tile_q) {
            int64_t begin, end;
            cinfer__prefill_tile_range(cfg, qo_len, kv_len, q, tile_q, &begin, &end);
            /* whole KV tiles, as the kernel visits them */
            const int64_t tiles =
                end > begin ? ceil_div(end, cfg->tile_kv[i]) - begin / cfg->tile_kv[i] : 0;
            const double work = (double)(tiles * cfg->tile_kv[i]) * tile_q / speed;
            longest = work > longest ? work : longest;
            total += work;
        }
        total *= cfg->num_qo_heads;
        const double mean = total / (double)slots[i];
        const double time = longest > mean ? longest : mean;
        if (best_time < 0.0 || time < best_time) {
            best_time = time;
            best = i;
        }
    }
    return best;
}

int64_t cinfer__prefill_item_cost(const cinfer__prefill_plan_config_t *cfg,
                                  const cinfer_prefill_work *item, int tile_q) {
    int64_t begin, end;
    cinfer__prefill_tile_range(cfg, item->qo_len, item->kv_len, item->q_begin, tile_q, &begin,
                               &end);
    begin = max64(begin, item->chunk_begin);
    end = min64(end, item->chunk_end);
    return end > begin ? end - begin : 0;
}

/* The chunk alignment of tile index `tile`: A = max(CINFER__PREFILL_CHUNK_ALIGN, tile_kv). */
static int64_t chunk_align(const cinfer__prefill_plan_config_t *cfg, int tile) {
    return cfg->tile_kv[tile] > CINFER__PREFILL_CHUNK_ALIGN ? cfg->tile_kv[tile]
                                                            : CINFER__PREFILL_CHUNK_ALIGN;
}

/* A tile's chunked range: [b', e) with b' = b rounded down to align; empty (length 0) when the
 * tile keeps nothing. */
static int64_t chunked_length(const cinfer__prefill_plan_config_t *cfg,
                              const cinfer__prefill_request_t *r, int32_t q, int tile_q,
                              int64_t align, int64_t *first) {
    int64_t begin, end;
    cinfer__prefill_tile_range(cfg, r->qo_len, r->kv_len, q, tile_q, &begin, &end);
    *first = begin / align * align;
    return end > begin ? end - *first : 0;
}

/* Chunks of a tile whose chunked range has `len` positions: max(1, ceil(len / chunk)); chunk 0
 * stands for "not split". */
static int64_t chunks_of(int64_t len, int64_t chunk) {
    return chunk <= 0 || len <= chunk ? 1 : (len + chunk - 1) / chunk;
}

/* Work items with chunk size `chunk` (0: unsplit). */
static int64_t count_items(const cinfer__prefill_plan_config_t *cfg,
                           const cinfer__prefill_request_t *req, int batch, int tile,
                           int64_t chunk) {
    const int tile_q = cfg->tile_q[tile];
    const int64_t align = chunk_align(cfg, tile);
    int64_t n = 0, first;
    for (int b = 0; b < batch; b++)
        for (int32_t q = 0; q < req[b].qo_len; q += tile_q)
            n += chunks_of(chunked_length(cfg, &req[b], q, tile_q, align, &first), chunk);
    return n;
}

cinfer_status_t cinfer__prefill_plan_chunks(const cinfer__prefill_plan_config_t *cfg,
                                            const cinfer__prefill_request_t *req, int batch_size,
                                            int tile, cinfer__prefill_chunking_t *out) {
    const int tile_q = cfg->tile_q[tile];
    const int64_t align = chunk_align(cfg, tile), heads = cfg->num_qo_heads;
    const int64_t cta_heads = cinfer__prefill_cta_heads(cfg);
    const int64_t unsplit = count_items(cfg, req, batch_size, tile, 0);
    /* Graph mode: the merge's rows are absolute, within its fixed range (prefill_plan.h). */
    const int64_t qo_end =
        batch_size > 0 ? (int64_t)req[batch_size - 1].qo_begin + req[batch_size - 1].qo_len : 0;
    const bool rows_fit = !cfg->graph || qo_end <= cinfer__prefill_row_bound(cfg);
    int64_t chunk = 0;
    if (cinfer__prefill_split_items(cfg, tile) > 0 && rows_fit &&
        unsplit * cta_heads < cfg->max_ctas[tile]) {
        int64_t max_len = 0, first;
        for (int b = 0; b < batch_size; b++)
            for (int32_t q = 0; q < req[b].qo_len; q += tile_q)
                max_len = max64(max_len, chunked_length(cfg, &req[b], q, tile_q, align, &first));
        /* Candidates C = k * align, k in [lo, hi]; at hi every tile is one chunk, so
         * items(hi * align) x cta_heads = unsplit x cta_heads <= max_ctas holds throughout the
         * search. */
        const int64_t min_chunk = max64(
            cfg->min_chunk, cfg->chunk_floor > 0 ? cfg->chunk_floor : CINFER__PREFILL_CHUNK_MIN);
        int64_t lo = (min_chunk + align - 1) / align;
        const int64_t k_max = (max_len + align - 1) / align;
        int64_t hi = k_max;
        if (lo < hi) {
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (count_items(cfg, req, batch_size, tile, mid * align) * cta_heads <=
                    cfg->max_ctas[tile])
                    hi = mid;
                else
                    lo = mid + 1;
            }
            if (hi < k_max)
                chunk = hi * align;
        }
    }
    int64_t work = 0, states = 0, max_chunks = 0, first;
    for (int b = 0; b < batch_size; b++)
        for (int32_t q = 0; q < req[b].qo_len; q += tile_q) {
            const int64_t n =
                chunks_of(chunked_length(cfg, &req[b], q, tile_q, align, &first), chunk);
            work += n;
            if (n > 1)
                states += min64((int64_t)req[b].qo_len - q, tile_q) * heads * n;
            max_chunks = max64(max_chunks, n);
        }
    if (work > INT32_MAX || states > INT32_MAX)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "prefill plan: %lld work items / %lld partial states exceed 2^31 - 1",
                             (long long)work, (long long)states);
    const bool split = max_chunks > 1;
    const int64_t rows = !split ? 0 : cfg->graph ? qo_end : qo_end - req[0].qo_begin;
    out->chunk_size = split ? (int)chunk : 0;
    out->num_work = (int)work;
    out->num_states = (int)states;
    out->num_rows = (int)rows;
    out->max_chunks = (int)max_chunks;
    out->split = split;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__prefill_plan_tile(const cinfer__prefill_plan_config_t *cfg,
                                          const cinfer__prefill_request_t *req, int batch_size,
                                          int *tile, cinfer__prefill_chunking_t *chunking) {
    int64_t total_qo = 0, requests = 0;
    for (int b = 0; b < batch_size; b++) {
        total_qo += req[b].qo_len;
        requests += req[b].qo_len > 0;
    }
    int t = cinfer__prefill_choose_tile(cfg, total_qo, requests);
    CINFER__CHECK(cinfer__prefill_plan_chunks(cfg, req, batch_size, t, chunking));
    const int64_t cta_heads = cinfer__prefill_cta_heads(cfg);
    if (!cfg->graph && t > 0 && cfg->max_ctas[t] > 0 && cfg->max_ctas[t] < cfg->max_ctas[t - 1] &&
        (int64_t)chunking->num_work * cta_heads * 4 < (int64_t)cfg->max_ctas[t] * 3) {
        cinfer__prefill_chunking_t smaller;
        CINFER__CHECK(cinfer__prefill_plan_chunks(cfg, req, batch_size, t - 1, &smaller));
        if (smaller.num_work > chunking->num_work) {
            t--;
            *chunking = smaller;
        }
    }
    *tile = t;
    return CINFER_STATUS_SUCCESS;
}

/* The sort key of qsort's comparator, which cannot take extra arguments: items are sorted on
 * a copy that carries the cost. */
typedef struct keyed_item {
    int64_t cost;
    cinfer_prefill_work item;
} keyed_item_t;

static int compare_items(const void *a, const void *b) {
    const keyed_item_t *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    if (x->item.request != y->item.request)
        return x->item.request < y->item.request ? -1 : 1;
    if (x->item.q_begin != y->item.q_begin)
        return x->item.q_begin < y->item.q_begin ? -1 : 1;
    return (x->item.chunk > y->item.chunk) - (x->item.chunk < y->item.chunk);
}

cinfer_status_t cinfer__prefill_plan_build(const cinfer__prefill_plan_config_t *cfg,
                                           const cinfer__prefill_request_t *req, int batch_size,
                                           int tile, const cinfer__prefill_chunking_t *chunking,
                                           const cinfer__prefill_schedule_t *dst) {
    if (chunking->num_work > dst->work_capacity ||
        (chunking->split && (chunking->num_rows > dst->row_capacity ||
                             chunking->num_states > dst->state_capacity || !dst->merge)))
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "prefill plan: %d work items / %d merge rows / %d partial states "
                             "exceed the workspace capacities %d / %d / %d",
                             chunking->num_work, chunking->split ? chunking->num_rows : 0,
                             chunking->num_states, dst->work_capacity, dst->row_capacity,
                             dst->state_capacity);
    const int tile_q = cfg->tile_q[tile];
    const int64_t align = chunk_align(cfg, tile), heads = cfg->num_qo_heads;
    const int64_t chunk = chunking->split ? chunking->chunk_size : 0;
    const int num_work = chunking->num_work;
    keyed_item_t *keyed = malloc(sizeof *keyed * (size_t)(num_work > 0 ? num_work : 1));
    if (!keyed)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "prefill plan: out of memory for %d work items", num_work);
    /* The merge's row 0: the plan's first row, or row 0 of q/out in graph mode (whose rows
     * before the plan's are skipped). */
    const int32_t row0 = batch_size > 0 && !cfg->graph ? req[0].qo_begin : 0;
    if (chunking->split)
        for (int32_t r = 0; batch_size > 0 && r < req[0].qo_begin - row0; r++)
            dst->rows[r] =
                (cinfer_decode_request){.kv_len = 0, .num_chunks = 1, .partial_base = -1};
    int64_t n = 0, slot = 0;
    for (int b = 0; b < batch_size; b++) {
        for (int32_t q = 0; q < req[b].qo_len; q += tile_q) {
            int64_t first;
            const int64_t len = chunked_length(cfg, &req[b], q, tile_q, align, &first);
            const int64_t chunks = chunks_of(len, chunk);
            const int64_t rows = min64((int64_t)req[b].qo_len - q, tile_q);
            if (n + chunks > num_work)
                break; /* reported below */
            for (int64_t c = 0; c < chunks; c++) {
                keyed_item_t *k = &keyed[n++];
                k->item = (cinfer_prefill_work){
                    .request = b,
                    .q_begin = q,
                    .qo_begin = req[b].qo_begin,
                    .qo_len = req[b].qo_len,
                    .kv_begin = req[b].kv_begin,
                    .kv_len = req[b].kv_len,
                    .chunk_begin = chunks > 1 ? (int)(first + c * chunk) : 0,
                    .chunk_end = chunks > 1 ? (int)min64(first + (c + 1) * chunk, first + len)
                                            : req[b].kv_len,
                    .chunk = (int)c,
                    .num_chunks = (int)chunks,
                    .partial = chunks > 1 ? (int)(slot + c) : -1,
                };
                k->cost = cinfer__prefill_item_cost(cfg, &k->item, tile_q);
            }
            if (chunking->split) {
                /* Merge rows of the tile: split ones name their slots, the others are skipped. */
                for (int64_t i = 0; i < rows; i++) {
                    cinfer_decode_request *r = &dst->rows[req[b].qo_begin - row0 + q + i];
                    r->kv_len = req[b].kv_len;
                    r->num_chunks = (int)chunks;
                    r->partial_base = chunks > 1 ? (int)(slot + i * heads * chunks) : -1;
                }
            }
            if (chunks > 1)
                slot += rows * heads * chunks;
        }
    }
    if (n != num_work || (chunking->split && slot != chunking->num_states)) {
        free(keyed);
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "prefill plan: wrote %lld items / %lld partial states, the chunking "
                             "counted %d / %d",
                             (long long)n, (long long)slot, num_work, chunking->num_states);
    }
    qsort(keyed, (size_t)n, sizeof *keyed, compare_items);
    for (int64_t i = 0; i < n; i++)
        dst->work[i] = keyed[i].item;
    free(keyed);
    dst->header->num_work = (int)n;
    dst->header->batch_size = batch_size;
    if (dst->merge)
        *dst->merge = (cinfer_decode_header){
            .num_work = chunking->split ? chunking->num_states : 0,
            .num_ctas = 0,
            .batch_size = chunking->split ? chunking->num_rows : 0,
            .merge_warps = 1,
        };
    return CINFER_STATUS_SUCCESS;
}

/* ---- grids ---- */

int64_t cinfer__prefill_grid(const cinfer__prefill_plan_config_t *cfg, int tile_q, int num_work) {
    if (cfg->graph) {
        const int64_t unsplit = cinfer__prefill_work_bound(cfg, tile_q);
        const int64_t split =
            cinfer__prefill_split_items(cfg, cinfer__prefill_choose_tile(cfg, 0, 0));
        return (unsplit > split ? unsplit : split) * cinfer__prefill_cta_heads(cfg);
    }
    return (int64_t)num_work * cinfer__prefill_cta_heads(cfg);
}

int64_t cinfer__prefill_merge_grid(const cinfer__prefill_plan_config_t *cfg, int num_rows) {
    const int64_t per_block = cinfer__decode_merge_rows(cfg->head_dim);
    const int64_t rows = cfg->graph ? cinfer__prefill_row_bound(cfg) : num_rows;
    return (rows * cfg->num_qo_heads + per_block - 1) / per_block;
}
