/*
 * The batch prefill planner (see prefill_plan.h for the rules): argument checks, the tile
 * choice, the work list and the workspace layout. No CUDA calls.
 */
#include <stdlib.h>

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

/* ---- workspace ---- */

static size_t align_up(size_t n) {
    return (n + CINFER__PREFILL_ALIGN - 1) / CINFER__PREFILL_ALIGN * CINFER__PREFILL_ALIGN;
}

cinfer_status_t cinfer__prefill_batch_layout(const cinfer__prefill_plan_config_t *cfg,
                                             cinfer__prefill_layout_t *out) {
    const int64_t work = cinfer__prefill_work_bound(cfg, cfg->tile_q[0]);
    if (work > INT32_MAX || work * cfg->num_qo_heads > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "max_total_qo_tokens = %lld and options->max_batch_size = %d allow "
                             "%lld query tiles of %d rows, x num_qo_heads = %d is more CTAs than "
                             "one launch allows (2^31 - 1)",
                             (long long)cfg->max_total_qo, cfg->max_batch_size, (long long)work,
                             cfg->tile_q[0], cfg->num_qo_heads);
    out->work_capacity = (int)work;
    out->work_offset = align_up(sizeof(cinfer_prefill_header));
    out->schedule_bytes = out->work_offset + (size_t)work * sizeof(cinfer_prefill_work);
    out->total_bytes = align_up(out->schedule_bytes);
    return CINFER_STATUS_SUCCESS;
}

/* ---- planning ---- */

int64_t cinfer__prefill_item_cost(const cinfer__prefill_plan_config_t *cfg,
                                  const cinfer_prefill_work *item, int tile_q) {
    const int64_t rows =
        item->qo_len - item->q_begin < tile_q ? item->qo_len - item->q_begin : tile_q;
    const int64_t delta = (int64_t)item->kv_len - item->qo_len;
    int64_t end = item->kv_len, begin = 0;
    if (cfg->causal && item->q_begin + rows + delta < end)
        end = item->q_begin + rows + delta;
    if (cfg->window_left >= 0 && item->q_begin + delta - cfg->window_left > begin)
        begin = item->q_begin + delta - cfg->window_left;
    return end > begin ? end - begin : 0;
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
    return (x->item.q_begin > y->item.q_begin) - (x->item.q_begin < y->item.q_begin);
}

cinfer_status_t cinfer__prefill_plan_build(const cinfer__prefill_plan_config_t *cfg,
                                           const cinfer__prefill_request_t *req, int batch_size,
                                           int tile_q, const cinfer__prefill_schedule_t *dst) {
    int64_t num_work = 0;
    for (int b = 0; b < batch_size; b++)
        num_work += ceil_div(req[b].qo_len, tile_q);
    if (num_work > dst->work_capacity)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "prefill plan: %lld work items exceed the workspace capacity %d",
                             (long long)num_work, dst->work_capacity);
    keyed_item_t *keyed = malloc(sizeof *keyed * (size_t)(num_work > 0 ? num_work : 1));
    if (!keyed)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "prefill plan: out of memory for %lld work items",
                             (long long)num_work);
    int64_t n = 0;
    for (int b = 0; b < batch_size; b++) {
        for (int32_t q = 0; q < req[b].qo_len; q += tile_q) {
            keyed_item_t *k = &keyed[n++];
            k->item = (cinfer_prefill_work){.request = b,
                                            .q_begin = q,
                                            .qo_begin = req[b].qo_begin,
                                            .qo_len = req[b].qo_len,
                                            .kv_begin = req[b].kv_begin,
                                            .kv_len = req[b].kv_len};
            k->cost = cinfer__prefill_item_cost(cfg, &k->item, tile_q);
        }
    }
    qsort(keyed, (size_t)n, sizeof *keyed, compare_items);
    for (int64_t i = 0; i < n; i++)
        dst->work[i] = keyed[i].item;
    free(keyed);
    dst->header->num_work = (int)n;
    dst->header->batch_size = batch_size;
    return CINFER_STATUS_SUCCESS;
}

/* ---- grid ---- */

int64_t cinfer__prefill_grid(const cinfer__prefill_plan_config_t *cfg, int tile_q, int num_work) {
    if (cfg->graph)
        return cinfer__prefill_work_bound(cfg, tile_q) * cfg->num_qo_heads;
    return (int64_t)num_work * cfg->num_qo_heads;
}
