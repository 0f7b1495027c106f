/*
 * The decode planner (src/sched/decode_plan.c) and the decode API's checks that need no device:
 * coverage of every (request, head slice, KV position) exactly once, chunk limits, empty requests,
 * sliding-window clipping, capacities and partial slots, constant graph-mode grids, the exact
 * workspace layout, page-table and options validation, and 200 random batches from a fixed seed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/decode_plan.h"

/* ---- helpers ---- */

static cinfer__decode_config_t config(int hq, int hk, int max_ctas, int max_batch, int window,
                                      bool graph) {
    cinfer__decode_config_t c;
    memset(&c, 0, sizeof c);
    c.num_qo_heads = hq;
    c.num_kv_heads = hk;
    c.heads_per_cta = cinfer__decode_heads_per_cta(hq / hk, 8);
    c.max_ctas = max_ctas;
    c.max_batch_size = max_batch;
    c.window_left = window;
    c.graph = graph;
    return c;
}

/* A plan in host buffers sized by the batch decode layout, as cinfer_batch_decode_plan makes it. */
typedef struct plan {
    cinfer__decode_layout_t layout;
    cinfer__decode_chunking_t chunking;
    char *host; /* schedule_bytes */
    int64_t *order;
    cinfer_decode_header *header;
    cinfer_decode_request *requests;
    cinfer_decode_work *work;
} plan_t;

static cinfer_status_t make_plan(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                 int batch, plan_t *p) {
    memset(p, 0, sizeof *p);
    assert_int_equal(cinfer__decode_batch_layout(cfg, 128, &p->layout), CINFER_STATUS_SUCCESS);
    p->host = calloc(1, p->layout.schedule_bytes);
    p->order = calloc((size_t)(batch ? batch : 1), sizeof *p->order);
    assert_non_null(p->host);
    assert_non_null(p->order);
    p->header = (cinfer_decode_header *)p->host;
    p->requests = (cinfer_decode_request *)(p->host + p->layout.requests_offset);
    p->work = (cinfer_decode_work *)(p->host + p->layout.work_offset);
    cinfer_status_t st = cinfer__decode_plan_chunks(cfg, kv_len, batch, &p->chunking);
    if (st != CINFER_STATUS_SUCCESS)
        return st;
    const cinfer__decode_schedule_t dst = {p->header,
                                           p->requests,
                                           p->work,
                                           p->layout.request_capacity,
                                           p->layout.work_capacity,
                                           p->layout.slot_capacity,
                                           p->order};
    /* A page table of 16-token pages, so items carry distinct page_begin values. */
    int32_t *indptr = calloc((size_t)batch + 1, sizeof *indptr);
    assert_non_null(indptr);
    for (int b = 0; b < batch; b++)
        indptr[b + 1] = indptr[b] + (kv_len[b] + 15) / 16;
    st = cinfer__decode_plan_build(cfg, kv_len, indptr, batch, &p->chunking, &dst);
    free(indptr);
    return st;
}

static void free_plan(plan_t *p) {
    free(p->host);
    free(p->order);
}

static int64_t attended_len(const cinfer__decode_config_t *cfg, int32_t kv_len) {
    if (cfg->window_left >= 0 && kv_len > (int64_t)cfg->window_left + 1)
        return (int64_t)cfg->window_left + 1;
    return kv_len;
}

/* items(C), computed independently of the planner. */
static int64_t items_for(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                         int64_t chunk) {
    int64_t n = 0;
    for (int b = 0; b < batch; b++) {
        int64_t a = attended_len(cfg, kv_len[b]);
        n += a == 0 ? 1 : (a + chunk - 1) / chunk;
    }
    return n * cinfer__decode_units(cfg);
}

static int group_of(const cinfer__decode_config_t *cfg) {
    return cfg->num_qo_heads / cfg->num_kv_heads;
}

/* The head slice of an item, as the merge kernel derives it from a query head. */
static int slice_of(const cinfer__decode_config_t *cfg, int kv_head, int head_begin) {
    const int group = group_of(cfg), hpc = cfg->heads_per_cta;
    const int head = kv_head * group + head_begin;
    return (head / group) * (group / hpc) + (head % group) / hpc;
}

static int compare_items(const void *a, const void *b) {
    const cinfer_decode_work *x = a, *y = b;
    if (x->request != y->request)
        return x->request < y->request ? -1 : 1;
    if (x->kv_head != y->kv_head)
        return x->kv_head < y->kv_head ? -1 : 1;
    if (x->head_begin != y->head_begin)
        return x->head_begin < y->head_begin ? -1 : 1;
    return (x->kv_begin > y->kv_begin) - (x->kv_begin < y->kv_begin);
}

static int compare_i64_desc(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* decode_plan.h's estimate of a balanced step, computed from every item: the busiest CTA's sum of
 * (length + CINFER__DECODE_ITEM_TOKENS) when the items, longest first, are dealt out in snake order
 * over bands of max_ctas. */
static int64_t step_estimate(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                             int64_t chunk) {
    const int64_t units = cinfer__decode_units(cfg), band = cfg->max_ctas;
    const int64_t n = items_for(cfg, kv_len, batch, chunk);
    int64_t *len = malloc(sizeof(int64_t) * (size_t)n), *load = calloc((size_t)band, 8);
    assert_non_null(len);
    assert_non_null(load);
    int64_t i = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t a = attended_len(cfg, kv_len[b]);
        for (int64_t begin = 0; begin < a || (a == 0 && begin == 0); begin += chunk) {
            const int64_t l = a - begin < chunk ? a - begin : chunk;
            for (int64_t u = 0; u < units; u++)
                len[i++] = l;
            if (a == 0)
                break;
        }
    }
    assert_int_equal(i, n);
    qsort(len, (size_t)n, sizeof *len, compare_i64_desc);
    int64_t worst = 0;
    for (i = 0; i < n; i++) {
        const int64_t pos = i % band, cta = (i / band) % 2 ? band - 1 - pos : pos;
        load[cta] += len[i] + CINFER__DECODE_ITEM_TOKENS;
        worst = load[cta] > worst ? load[cta] : worst;
    }
    free(len);
    free(load);
    return worst;
}

/* Checks every invariant of a plan (see decode_plan.h). */
static void verify_plan(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                        const plan_t *p) {
    const int units = cinfer__decode_units(cfg), group = group_of(cfg), hpc = cfg->heads_per_cta;
    const cinfer__decode_chunking_t *ch = &p->chunking;
    const int n = p->header->num_work;
    const int64_t chunk = ch->chunk_size;

    /* Header and capacities. */
    assert_int_equal(p->header->batch_size, batch);
    assert_int_equal(n, ch->num_work);
    assert_true(n <= p->layout.work_capacity);
    assert_true(batch <= p->layout.request_capacity);
    assert_true(ch->num_slots <= p->layout.slot_capacity);
    assert_int_equal(n, items_for(cfg, kv_len, batch, chunk));
    assert_true(chunk >= CINFER__DECODE_CHUNK_ALIGN);
    assert_int_equal(chunk % CINFER__DECODE_CHUNK_ALIGN == 0 || chunk == INT32_MAX, 1);

    /* The chunking rule (decode_plan.h). */
    int64_t max_att = 0;
    double total = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t a = attended_len(cfg, kv_len[b]);
        max_att = a > max_att ? a : max_att;
        total += (double)a;
    }
    const int64_t align = CINFER__DECODE_CHUNK_ALIGN;
    if ((int64_t)batch * units <= cfg->max_ctas) {
        /* One wave: a split plan fits max_ctas with the smallest chunk that does; an unsplit
         * plan has nothing longer than one chunk, or no shorter chunk fits. */
        if (ch->split) {
            assert_true(n <= cfg->max_ctas);
            if (chunk > align)
                assert_true(items_for(cfg, kv_len, batch, chunk - align) > cfg->max_ctas);
        } else {
            assert_int_equal(n, (int64_t)batch * units);
            if (max_att > align) {
                const int64_t below = (max_att - 1) / align * align;
                assert_true(items_for(cfg, kv_len, batch, below) > cfg->max_ctas);
            }
        }
    } else {
        /* Balanced: a chunk no shorter than the lower limit, whose estimated step is no longer
         * than that of splitting nothing or of cutting at each CTA's share (the rule before the
         * estimate), within the bounds the workspace is sized by. */
        const double share = total * units / cfg->max_ctas;
        const double lo = fmax(share / CINFER__DECODE_BALANCED_SPLIT, CINFER__DECODE_BALANCED_MIN);
        const int64_t k_max = max_att > align ? (max_att + align - 1) / align : 1;
        const int64_t k_lo = (int64_t)ceil(lo / (double)align);
        if (k_lo >= k_max) {
            assert_false(ch->split);
        } else {
            assert_true(chunk >= k_lo * align && chunk <= k_max * align);
            const int64_t t = step_estimate(cfg, kv_len, batch, chunk);
            assert_true(t <= step_estimate(cfg, kv_len, batch, k_max * align));
            const int64_t at_share =
                (int64_t)ceil(fmax(share, CINFER__DECODE_BALANCED_MIN) / (double)align) * align;
            if (at_share < max_att)
                assert_true(t <= step_estimate(cfg, kv_len, batch, at_share));
        }
        assert_true(n <= (int64_t)batch * units + CINFER__DECODE_BALANCED_SPLIT * cfg->max_ctas);
        assert_true(ch->num_slots < 2 * CINFER__DECODE_BALANCED_SPLIT * (int64_t)cfg->max_ctas);
    }

    /* Request infos and partial slots. */
    int split_requests = 0, max_chunks = batch ? 1 : 0;
    for (int b = 0; b < batch; b++) {
        const cinfer_decode_request *r = &p->requests[b];
        const int64_t a = attended_len(cfg, kv_len[b]);
        const int64_t want = a == 0 ? 1 : (a + chunk - 1) / chunk;
        assert_int_equal(r->kv_len, kv_len[b]);
        assert_int_equal(r->num_chunks, want);
        if (r->num_chunks > 1) {
            split_requests++;
            assert_true(r->partial_base >= 0);
            assert_true(r->partial_base + units * r->num_chunks <= ch->num_slots);
        } else {
            assert_int_equal(r->partial_base, -1);
        }
        max_chunks = r->num_chunks > max_chunks ? r->num_chunks : max_chunks;
    }
    assert_int_equal(ch->split, split_requests > 0);
    assert_int_equal(ch->max_chunks, max_chunks);

    unsigned char *slot_used = calloc((size_t)p->layout.slot_capacity + 1, 1);
    assert_non_null(slot_used);
    int slots_seen = 0;
    for (int w = 0; w < n; w++) {
        const cinfer_decode_work *it = &p->work[w];
        assert_true(it->request >= 0 && it->request < batch);
        assert_true(it->kv_head >= 0 && it->kv_head < cfg->num_kv_heads);
        assert_int_equal(it->head_begin % hpc, 0);
        assert_true(it->head_begin >= 0 && it->head_begin + hpc <= group);
        const int32_t len = kv_len[it->request];
        assert_int_equal(it->kv_len, len);
        int32_t page_begin = 0; /* make_plan's page table: 16-token pages */
        for (int b = 0; b < it->request; b++)
            page_begin += (kv_len[b] + 15) / 16;
        assert_int_equal(it->page_begin, page_begin);
        assert_true(it->kv_begin >= len - attended_len(cfg, len));
        assert_true(it->kv_begin <= it->kv_end && it->kv_end <= len);
        assert_true(it->kv_end - it->kv_begin <= chunk);
        const cinfer_decode_request *r = &p->requests[it->request];
        if (r->num_chunks > 1) {
            assert_true(it->partial >= 0 && it->partial < p->layout.slot_capacity);
            assert_int_equal(slot_used[it->partial], 0); /* unique */
            slot_used[it->partial] = 1;
            slots_seen++;
            /* The slot is where the merge kernel looks for this slice and chunk. */
            const int rel = it->partial - r->partial_base;
            assert_int_equal(rel / r->num_chunks, slice_of(cfg, it->kv_head, it->head_begin));
            const int64_t c = (it->kv_begin - (len - attended_len(cfg, len))) / chunk;
            assert_int_equal(rel % r->num_chunks, c);
        } else {
            assert_int_equal(it->partial, -1);
        }
    }
    assert_int_equal(slots_seen, ch->num_slots);
    free(slot_used);

    /* Coverage: per (request, slice) the items tile [kv_len - attended, kv_len) in order, each
     * non-last chunk exactly `chunk` long; an empty request has one empty item. */
    cinfer_decode_work *sorted = malloc(sizeof *sorted * (size_t)(n ? n : 1));
    assert_non_null(sorted);
    memcpy(sorted, p->work, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_items);
    int w = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t begin = kv_len[b] - attended_len(cfg, kv_len[b]);
        for (int s = 0; s < units; s++) {
            const int kv_head = s / (group / hpc), head_begin = (s % (group / hpc)) * hpc;
            int64_t pos = begin;
            int pieces = 0;
            do {
                assert_true(w < n);
                const cinfer_decode_work *it = &sorted[w++];
                assert_int_equal(it->request, b);
                assert_int_equal(it->kv_head, kv_head);
                assert_int_equal(it->head_begin, head_begin);
                assert_int_equal(it->kv_begin, pos);
                if (it->kv_end < kv_len[b])
                    assert_int_equal(it->kv_end - it->kv_begin, chunk);
                pos = it->kv_end;
                pieces++;
            } while (pos < kv_len[b]);
            assert_int_equal(pieces, p->requests[b].num_chunks);
            if (kv_len[b] == 0)
                assert_int_equal(pieces, 1);
        }
    }
    assert_int_equal(w, n);
    free(sorted);

    /* Grids, and the persistent loop's balance: CTA i runs items i, i + G, ...; with the snake
     * order no CTA carries more than the longest item above another. */
    const int grid = cinfer__decode_attention_grid(cfg, n);
    if (cfg->graph)
        assert_int_equal(grid, cfg->max_ctas);
    else
        assert_int_equal(grid, n < cfg->max_ctas ? n : cfg->max_ctas);
    if (grid > 0) {
        int64_t *load = calloc((size_t)grid, sizeof *load), longest = 0;
        assert_non_null(load);
        for (int i = 0; i < n; i++) {
            const int64_t l = p->work[i].kv_end - p->work[i].kv_begin;
            load[i % grid] += l;
            longest = l > longest ? l : longest;
        }
        int64_t lo = load[0], hi = load[0];
        for (int i = 0; i < grid; i++) {
            lo = load[i] < lo ? load[i] : lo;
            hi = load[i] > hi ? load[i] : hi;
        }
        assert_true(hi - lo <= longest);
        free(load);
    }
    /* The merge: warps per (request, head) as the header says, and enough blocks for them. */
    const int mw = ch->merge_warps;
    assert_int_equal(p->header->merge_warps, mw);
    assert_true(mw == 1 || mw == 2 || mw == 4);
    if (ch->max_chunks <= CINFER__DECODE_MERGE_WARP_CHUNKS)
        assert_int_equal(mw, 1);
    else if (!cfg->graph)
        assert_int_equal(mw, 4);
    const int64_t rows = cinfer__decode_merge_rows(128);
    const int64_t merge = cinfer__decode_merge_grid(cfg, 128, batch, ch->split, mw);
    if (cfg->graph) {
        assert_int_equal(merge,
                         ((int64_t)cfg->max_batch_size * cfg->num_qo_heads + rows - 1) / rows);
        assert_true((int64_t)batch * cfg->num_qo_heads * mw <= merge * rows);
        /* The most warps that fit: twice as many would not. */
        if (mw < 4 && ch->max_chunks > CINFER__DECODE_MERGE_WARP_CHUNKS)
            assert_true((int64_t)batch * cfg->num_qo_heads * mw * 2 > merge * rows);
    } else if (ch->split)
        assert_int_equal(merge, ((int64_t)batch * cfg->num_qo_heads * mw + rows - 1) / rows);
    else
        assert_int_equal(merge, 0);
}

static void plan_and_verify(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                            plan_t *p) {
    assert_int_equal(make_plan(cfg, kv_len, batch, p), CINFER_STATUS_SUCCESS);
    verify_plan(cfg, kv_len, batch, p);
}

static void assert_error(cinfer_status_t st, cinfer_status_t want, const char *needle) {
    assert_int_equal(st, want);
    if (!strstr(cinfer_last_error(), needle))
        fail_msg("message \"%s\" does not contain \"%s\"", cinfer_last_error(), needle);
}

/* ---- tile choices ---- */

static void heads_per_cta_is_largest_divisor_up_to_8(void **state) {
    (void)state;
    static const int table[][2] = {{1, 1},  {2, 2},  {3, 3},  {4, 4},  {5, 5},   {6, 6},
                                   {7, 7},  {8, 8},  {9, 3},  {10, 5}, {11, 1},  {12, 6},
                                   {14, 7}, {16, 8}, {24, 8}, {32, 8}, {128, 8}, {13, 1}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        assert_int_equal(cinfer__decode_heads_per_cta(table[i][0], 8), table[i][1]);
    /* The tensor-core kernel takes up to 16 heads as mma rows. */
    static const int tc[][2] = {{4, 4}, {12, 12}, {16, 16}, {24, 12}, {32, 16}, {64, 16}, {17, 1}};
    for (size_t i = 0; i < sizeof tc / sizeof tc[0]; i++)
        assert_int_equal(cinfer__decode_heads_per_cta(tc[i][0], 16), tc[i][1]);
    assert_int_equal(cinfer__decode_tile_kv(1), 4);
    assert_int_equal(cinfer__decode_tile_kv(4), 4);
    assert_int_equal(cinfer__decode_tile_kv(5), 2);
    assert_int_equal(cinfer__decode_tile_kv(8), 2);
    cinfer__decode_config_t c = config(48, 4, 100, 1, -1, false); /* group 12 -> HPC 6 */
    assert_int_equal(c.heads_per_cta, 6);
    assert_int_equal(cinfer__decode_units(&c), 8);
}

static void merge_rows_are_one_pair_per_warp(void **state) {
    (void)state;
    static const int head_dims[] = {8, 24, 64, 128, 192, 256};
    for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; i++)
        assert_int_equal(cinfer__decode_merge_rows(head_dims[i]), CINFER__DECODE_WARPS);
}

/* ---- workspace ---- */

static void layout_is_exact_and_aligned(void **state) {
    (void)state;
    const int caps[][3] = {{1, 1, 0}, {528, 256, 528}, {4096, 256, 132}, {7, 3, 5}};
    const int hpcs[] = {1, 6, 8};
    const int dims[] = {8, 64, 128, 136, 256};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        for (size_t h = 0; h < sizeof hpcs / sizeof hpcs[0]; h++) {
            for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
                cinfer__decode_layout_t l;
                cinfer__decode_layout(caps[i][0], caps[i][1], caps[i][2], hpcs[h], dims[d], &l);
                const size_t A = CINFER__DECODE_ALIGN;
                const size_t header = sizeof(cinfer_decode_header);
                const size_t req = (size_t)caps[i][1] * sizeof(cinfer_decode_request);
                const size_t work = (size_t)caps[i][0] * sizeof(cinfer_decode_work);
                const size_t po = (size_t)caps[i][2] * (size_t)hpcs[h] * (size_t)dims[d] * 4;
                const size_t pl = (size_t)caps[i][2] * (size_t)hpcs[h] * 4;
#define UP(x) (((x) + A - 1) / A * A)
                assert_int_equal(l.work_capacity, caps[i][0]);
                assert_int_equal(l.request_capacity, caps[i][1]);
                assert_int_equal(l.slot_capacity, caps[i][2]);
                assert_int_equal(l.requests_offset, UP(header));
                assert_int_equal(l.work_offset, l.requests_offset + UP(req));
                assert_int_equal(l.schedule_bytes, l.work_offset + work);
                assert_int_equal(l.partial_o_offset, l.work_offset + UP(work));
                assert_int_equal(l.partial_lse_offset, l.partial_o_offset + UP(po));
                assert_int_equal(l.total_bytes, UP(header) + UP(req) + UP(work) + UP(po) + UP(pl));
#undef UP
                /* Every region starts aligned and fits before the next one. */
                assert_int_equal(l.requests_offset % A, 0);
                assert_int_equal(l.work_offset % A, 0);
                assert_int_equal(l.partial_o_offset % A, 0);
                assert_int_equal(l.partial_lse_offset % A, 0);
                assert_true(header <= l.requests_offset);
                assert_true(l.requests_offset + req <= l.work_offset);
                assert_true(l.work_offset + work <= l.partial_o_offset);
                assert_true(l.partial_o_offset + po <= l.partial_lse_offset);
                assert_true(l.partial_lse_offset + pl <= l.total_bytes);
            }
        }
    }
}

static void batch_layout_capacities(void **state) {
    (void)state;
    cinfer__decode_layout_t l;
    /* Work items: unsplit items plus the balanced regime's extra chunks (F waves); slots: 2F
     * waves (F = CINFER__DECODE_BALANCED_SPLIT). */
    const int f = CINFER__DECODE_BALANCED_SPLIT;
    cinfer__decode_config_t c = config(32, 8, 528, 4, -1, false); /* group 4: HPC 4, 8 units */
    assert_int_equal(cinfer__decode_batch_layout(&c, 128, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, 4 * 8 + f * 528);
    assert_int_equal(l.request_capacity, 4);
    assert_int_equal(l.slot_capacity, 2 * f * 528);
    c = config(32, 8, 528, 256, -1, true);
    assert_int_equal(cinfer__decode_batch_layout(&c, 128, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, 256 * 8 + f * 528);
    assert_int_equal(l.request_capacity, 256);
    assert_int_equal(l.slot_capacity, 2 * f * 528);
    /* Too many items for an int. */
    c = config(1024, 1024, 528, 1 << 30, -1, false);
    assert_error(cinfer__decode_batch_layout(&c, 128, &l), CINFER_STATUS_UNSUPPORTED,
                 "options->max_batch_size");
}

/* ---- page table ---- */

static void kv_lens_from_the_page_table(void **state) {
    (void)state;
    const int32_t indptr[] = {3, 3, 5, 6, 10};
    const int32_t last[] = {999, 7, 16, 1}; /* request 0 has no pages: its 999 is ignored */
    int32_t len[4];
    assert_int_equal(cinfer__decode_kv_lens(indptr, last, 4, 4, 16, len), CINFER_STATUS_SUCCESS);
    assert_int_equal(len[0], 0);
    assert_int_equal(len[1], 16 + 7);
    assert_int_equal(len[2], 16);
    assert_int_equal(len[3], 3 * 16 + 1);
    /* An empty batch needs only kv_indptr[0]. */
    assert_int_equal(cinfer__decode_kv_lens(indptr, NULL, 0, 4, 16, len), CINFER_STATUS_SUCCESS);
}

static void page_table_errors(void **state) {
    (void)state;
    int32_t len[4];
    const int32_t last[] = {1, 1, 1};
    const int32_t good[] = {0, 1, 2, 3};
    assert_error(cinfer__decode_kv_lens(NULL, last, 3, 8, 16, len), CINFER_STATUS_INVALID_ARGUMENT,
                 "kv_indptr is NULL");
    assert_error(cinfer__decode_kv_lens(good, NULL, 3, 8, 16, len), CINFER_STATUS_INVALID_ARGUMENT,
                 "kv_last_page_len is NULL");
    const int32_t negative[] = {-1, 1, 2, 3};
    assert_error(cinfer__decode_kv_lens(negative, last, 3, 8, 16, len),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_indptr[0] = -1");
    const int32_t not_monotone[] = {0, 7, 5, 9};
    assert_error(cinfer__decode_kv_lens(not_monotone, last, 3, 8, 16, len),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_indptr[2] = 5 < kv_indptr[1] = 7");
    const int32_t zero_last[] = {1, 0, 1};
    assert_error(cinfer__decode_kv_lens(good, zero_last, 3, 8, 16, len),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_last_page_len[1] = 0, expected 1..16");
    const int32_t big_last[] = {1, 1, 17};
    assert_error(cinfer__decode_kv_lens(good, big_last, 3, 8, 16, len),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_last_page_len[2] = 17, expected 1..16");
    const int32_t huge[] = {0, INT32_MAX / 100};
    assert_error(cinfer__decode_kv_lens(huge, last, 1, 8, 256, len), CINFER_STATUS_INVALID_ARGUMENT,
                 "request 0: kv_len");
    assert_error(cinfer__decode_kv_lens(good, last, 3, 2, 16, len), CINFER_STATUS_INVALID_ARGUMENT,
                 "batch_size = 3, expected 0..2 (options->max_batch_size)");
    assert_error(cinfer__decode_kv_lens(good, last, -1, 2, 16, len), CINFER_STATUS_INVALID_ARGUMENT,
                 "batch_size = -1");
    /* The largest kv_len that fits is accepted. */
    const int32_t edge[] = {0, (int32_t)((INT32_MAX - 1) / 256 + 1)};
    const int32_t edge_last[] = {(int32_t)(INT32_MAX - (int64_t)(edge[1] - 1) * 256)};
    assert_int_equal(cinfer__decode_kv_lens(edge, edge_last, 1, 1, 256, len),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(len[0], INT32_MAX);
}

/* ---- options ---- */

static cinfer_attention_options_t good_options(void) {
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = 32;
    o.num_kv_heads = 8;
    o.head_dim = 128;
    return o;
}

static void options_accepted(void **state) {
    (void)state;
    cinfer_attention_options_t o = good_options();
    assert_int_equal(cinfer__decode_options_check(&o, true), CINFER_STATUS_SUCCESS);
    o.q_dtype = (DLDataType){kDLFloat, 16, 1};
    o.kv_dtype = (DLDataType){10, 8, 1}; /* e4m3 */
    o.kv_layout = CINFER_KV_LAYOUT_HND;
    o.logits_soft_cap = 30.0f;
    o.window_left = 0;
    o.use_cuda_graph = 1;
    o.head_dim = 8;
    assert_int_equal(cinfer__decode_options_check(&o, true), CINFER_STATUS_SUCCESS);
    o.kv_dtype = (DLDataType){12, 8, 1}; /* e5m2 */
    o.head_dim = 256;
    assert_int_equal(cinfer__decode_options_check(&o, true), CINFER_STATUS_SUCCESS);
    /* Single decode ignores page_size, use_cuda_graph and max_batch_size. */
    o.page_size = 0;
    o.use_cuda_graph = 7;
    o.max_batch_size = 0;
    assert_int_equal(cinfer__decode_options_check(&o, false), CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__decode_options_check(&o, true), CINFER_STATUS_INVALID_ARGUMENT);
}

typedef struct bad_option {
    void (*mutate)(cinfer_attention_options_t *);
    cinfer_status_t status;
    const char *needle;
} bad_option_t;

#define MUTATE(name, ...)                                                                          \
    static void name(cinfer_attention_options_t *o) {                                              \
        __VA_ARGS__;                                                                               \
    }
MUTATE(m_size, o->size = 8)
MUTATE(m_version, o->version = 99)
MUTATE(m_hq, o->num_qo_heads = 0)
MUTATE(m_hk, o->num_kv_heads = -2)
MUTATE(m_gqa, o->num_kv_heads = 5)
MUTATE(m_hd0, o->head_dim = 0)
MUTATE(m_hd12, o->head_dim = 12)
MUTATE(m_hd264, o->head_dim = 264)
MUTATE(m_page0, o->page_size = 0)
MUTATE(m_page512, o->page_size = 512)
MUTATE(m_layout, o->kv_layout = (cinfer_kv_layout_t)2)
MUTATE(m_qf32, o->q_dtype = (DLDataType){kDLFloat, 32, 1})
MUTATE(m_qfp8, o->q_dtype = (DLDataType){10, 8, 1})
MUTATE(m_kvf32, o->kv_dtype = (DLDataType){kDLFloat, 32, 1})
MUTATE(m_kvlanes, o->kv_dtype = (DLDataType){kDLBfloat, 16, 2})
MUTATE(m_scale_neg, o->sm_scale = -1.0f)
MUTATE(m_scale_nan, o->sm_scale = NAN)
MUTATE(m_scale_inf, o->sm_scale = INFINITY)
MUTATE(m_cap_neg, o->logits_soft_cap = -0.5f)
MUTATE(m_cap_nan, o->logits_soft_cap = NAN)
MUTATE(m_window, o->window_left = -2)
MUTATE(m_kscale0, o->k_scale = 0.0f)
MUTATE(m_kscale_inf, o->k_scale = INFINITY)
MUTATE(m_vscale_neg, o->v_scale = -1.0f)
MUTATE(m_graph, o->use_cuda_graph = 2)
MUTATE(m_max_batch, o->max_batch_size = 0)
#undef MUTATE

static void options_rejected_naming_the_field(void **state) {
    (void)state;
    const cinfer_status_t INV = CINFER_STATUS_INVALID_ARGUMENT, UNS = CINFER_STATUS_UNSUPPORTED;
    const bad_option_t cases[] = {
        {m_size, INV, "CINFER_ATTENTION_OPTIONS_INIT"},
        {m_version, INV, "version 99"},
        {m_hq, INV, "options->num_qo_heads = 0"},
        {m_hk, INV, "options->num_kv_heads = -2"},
        {m_gqa, INV, "options->num_qo_heads = 32 is not a multiple of options->num_kv_heads = 5"},
        {m_hd0, INV, "options->head_dim = 0"},
        {m_hd12, UNS, "options->head_dim = 12"},
        {m_hd264, UNS, "options->head_dim = 264"},
        {m_page0, INV, "options->page_size = 0"},
        {m_page512, UNS, "options->page_size = 512"},
        {m_layout, INV, "options->kv_layout = 2"},
        {m_qf32, UNS, "options->q_dtype (code 2, 32 bits"},
        {m_qfp8, UNS, "options->q_dtype (code 10, 8 bits"},
        {m_kvf32, UNS, "options->kv_dtype (code 2, 32 bits"},
        {m_kvlanes, UNS, "options->kv_dtype (code 4, 16 bits, 2 lanes)"},
        {m_scale_neg, INV, "options->sm_scale = -1"},
        {m_scale_nan, INV, "options->sm_scale = nan"},
        {m_scale_inf, INV, "options->sm_scale = inf"},
        {m_cap_neg, INV, "options->logits_soft_cap = -0.5"},
        {m_cap_nan, INV, "options->logits_soft_cap = nan"},
        {m_window, INV, "options->window_left = -2"},
        {m_kscale0, INV, "options->k_scale = 0"},
        {m_kscale_inf, INV, "options->k_scale = inf"},
        {m_vscale_neg, INV, "options->v_scale = -1"},
        {m_graph, INV, "options->use_cuda_graph = 2"},
        {m_max_batch, INV, "options->max_batch_size = 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cinfer_attention_options_t o = good_options();
        cases[i].mutate(&o);
        assert_error(cinfer__decode_options_check(&o, true), cases[i].status, cases[i].needle);
    }
    assert_error(cinfer__decode_options_check(NULL, true), INV, "options is NULL");
}

/* ---- plans ---- */

static void empty_requests_get_one_empty_direct_item(void **state) {
    (void)state;
    cinfer__decode_config_t c = config(16, 4, 132, 8, -1, false); /* group 4: 4 units */
    const int32_t lens[] = {0, 0, 0};
    plan_t p;
    plan_and_verify(&c, lens, 3, &p);
    assert_int_equal(p.header->num_work, 3 * 4);
    assert_false(p.chunking.split);
    for (int w = 0; w < p.header->num_work; w++) {
        assert_int_equal(p.work[w].kv_begin, 0);
        assert_int_equal(p.work[w].kv_end, 0);
        assert_int_equal(p.work[w].partial, -1);
    }
    free_plan(&p);

    /* Next to a split request, an empty one stays a single direct item. */
    const int32_t mixed[] = {0, 100000, 5};
    plan_and_verify(&c, mixed, 3, &p);
    assert_true(p.chunking.split);
    assert_int_equal(p.requests[0].num_chunks, 1);
    assert_int_equal(p.requests[0].partial_base, -1);
    assert_int_equal(p.requests[2].num_chunks, 1);
    assert_true(p.requests[1].num_chunks > 1);
    int empty = 0;
    for (int w = 0; w < p.header->num_work; w++)
        if (p.work[w].request == 0) {
            empty++;
            assert_int_equal(p.work[w].kv_end - p.work[w].kv_begin, 0);
            assert_int_equal(p.work[w].partial, -1);
        }
    assert_int_equal(empty, 4);
    free_plan(&p);

    /* An empty batch: no items, and only graph mode launches anything. */
    plan_and_verify(&c, lens, 0, &p);
    assert_int_equal(p.header->num_work, 0);
    assert_int_equal(cinfer__decode_attention_grid(&c, 0), 0);
    assert_int_equal(cinfer__decode_merge_grid(&c, 128, 0, false, 1), 0);
    free_plan(&p);
}

/* Dense coverage: a counter per (request, slice, position), each attended one hit exactly once. */
static void dense_coverage(const cinfer__decode_config_t *c, const int32_t *lens, int batch) {
    plan_t p;
    plan_and_verify(c, lens, batch, &p);
    const int units = cinfer__decode_units(c), group = group_of(c), hpc = c->heads_per_cta;
    for (int b = 0; b < batch; b++) {
        const size_t cells = (size_t)units * (size_t)lens[b];
        unsigned char *cover = calloc(cells + 1, 1);
        assert_non_null(cover);
        for (int w = 0; w < p.header->num_work; w++) {
            const cinfer_decode_work *it = &p.work[w];
            if (it->request != b)
                continue;
            const int s = it->kv_head * (group / hpc) + it->head_begin / hpc;
            for (int t = it->kv_begin; t < it->kv_end; t++)
                cover[(size_t)s * (size_t)lens[b] + (size_t)t]++;
        }
        const int64_t first = lens[b] - attended_len(c, lens[b]);
        for (int s = 0; s < units; s++)
            for (int t = 0; t < lens[b]; t++)
                assert_int_equal(cover[(size_t)s * (size_t)lens[b] + (size_t)t],
                                 t >= first ? 1 : 0);
        free(cover);
    }
    free_plan(&p);
}

static void every_position_covered_exactly_once(void **state) {
    (void)state;
    const int32_t lens[] = {1, 63, 64, 65, 130, 1000, 2047, 0, 4096, 17};
    cinfer__decode_config_t c = config(40, 8, 132, 16, -1, false); /* group 5: HPC 5 */
    dense_coverage(&c, lens, 10);
    c = config(96, 8, 66, 16, -1, true); /* group 12: HPC 6, 2 slices per KV head */
    dense_coverage(&c, lens, 10);
    c = config(7, 1, 1000, 16, 100, false); /* window 100 */
    dense_coverage(&c, lens, 10);
    c = config(4, 4, 1, 16, -1, false); /* one CTA: nothing splits */
    dense_coverage(&c, lens, 10);
}

static void window_clips_the_attended_range(void **state) {
    (void)state;
    plan_t p;
    const int32_t lens[] = {1000, 50, 0};
    cinfer__decode_config_t c = config(8, 8, 1000, 4, 99, false);
    plan_and_verify(&c, lens, 3, &p);
    for (int w = 0; w < p.header->num_work; w++) {
        const cinfer_decode_work *it = &p.work[w];
        if (it->request == 0)
            assert_true(it->kv_begin >= 900); /* [kv_len - 1 - 99, kv_len) */
        if (it->request == 1)
            assert_true(it->kv_begin >= 0 && it->kv_end <= 50);
    }
    free_plan(&p);

    /* window_left = 0: only the query's own position. */
    c = config(8, 8, 1000, 4, 0, false);
    plan_and_verify(&c, lens, 3, &p);
    for (int w = 0; w < p.header->num_work; w++) {
        const cinfer_decode_work *it = &p.work[w];
        if (it->request == 0) {
            assert_int_equal(it->kv_begin, 999);
            assert_int_equal(it->kv_end, 1000);
        }
    }
    assert_false(p.chunking.split);
    free_plan(&p);

    /* A window wider than the request is no window. */
    c = config(8, 8, 1000, 4, 5000, false);
    plan_and_verify(&c, lens, 3, &p);
    int64_t covered = 0;
    for (int w = 0; w < p.header->num_work; w++)
        if (p.work[w].request == 0)
            covered += p.work[w].kv_end - p.work[w].kv_begin;
    assert_int_equal(covered, 1000 * 8);
    free_plan(&p);
}

static void long_requests_split_beyond_one_wave(void **state) {
    (void)state;
    plan_t p;
    /* 64 requests of 1000 tokens and one of 20000, 8 slices, 264 CTAs: 520 items exceed a wave.
     * Cutting at each CTA's share (84000 * 8 / 264 = 2545.5 -> 2560 tokens) leaves the busiest
     * CTA 4752 tokens' worth (items and their starts, decode_plan.h); 640-token chunks (the long
     * request in 32, the others in 640 + 360) leave it 2960, against a mean of 2545 + 64 x 4.8. */
    int32_t lens[65];
    for (int b = 0; b < 64; b++)
        lens[b] = 1000;
    lens[64] = 20000;
    cinfer__decode_config_t c = config(32, 8, 264, 65, -1, false);
    plan_and_verify(&c, lens, 65, &p);
    assert_int_equal(p.chunking.chunk_size, 640);
    assert_true(p.chunking.split);
    assert_int_equal(p.requests[64].num_chunks, 32);
    assert_int_equal(p.requests[0].num_chunks, 2);
    assert_int_equal(p.header->num_work, (64 * 2 + 32) * 8);
    assert_int_equal(p.chunking.num_slots, (64 * 2 + 32) * 8);
    assert_int_equal(step_estimate(&c, lens, 65, 640), 2960);
    assert_int_equal(step_estimate(&c, lens, 65, 2560), 4752);
    /* The longest items lead (the snake order relies on it). */
    assert_int_equal(p.work[0].kv_end - p.work[0].kv_begin, 640);
    free_plan(&p);
    /* The same batch with uniform lengths splits nothing. */
    lens[64] = 1000;
    plan_and_verify(&c, lens, 65, &p);
    assert_false(p.chunking.split);
    assert_int_equal(p.header->num_work, 65 * 8);
    free_plan(&p);
}

static void chunk_size_is_the_smallest_that_fits_one_wave(void **state) {
    (void)state;
    plan_t p;
    /* One request of 100000 tokens, 8 slices, 528 CTAs: 66 chunks per slice fit, so
     * C = ceil(100000 / 66) rounded up to 64 = 1536 (65.1 -> 66 chunks). */
    const int32_t one[] = {100000};
    cinfer__decode_config_t c = config(32, 8, 528, 1, -1, false);
    plan_and_verify(&c, one, 1, &p);
    assert_int_equal(p.chunking.chunk_size, 1536);
    assert_int_equal(p.requests[0].num_chunks, 66);
    assert_int_equal(p.header->num_work, 66 * 8);
    assert_int_equal(p.chunking.num_slots, 66 * 8);
    free_plan(&p);

    /* Big batch: one chunk per request is already more than one wave; the longest requests are
     * cut only because that shortens the busiest CTA's work (the balanced regime). */
    int32_t lens[64];
    for (int b = 0; b < 64; b++)
        lens[b] = 1000 + 977 * b;
    c = config(32, 8, 132, 64, -1, false);
    plan_and_verify(&c, lens, 64, &p);
    assert_true(p.chunking.split);
    assert_true(step_estimate(&c, lens, 64, p.chunking.chunk_size) <
                step_estimate(&c, lens, 64, 62592));
    free_plan(&p);

    /* A uniform batch of 1.94 waves of items splits nothing (the second wave is nearly full); one
     * of 1.29 waves (64 x 4096 tokens, 8 slices, 396 CTAs) is cut into pieces. */
    for (int b = 0; b < 64; b++)
        lens[b] = 4096;
    c = config(32, 8, 264, 64, -1, false);
    plan_and_verify(&c, lens, 64, &p);
    assert_false(p.chunking.split);
    free_plan(&p);
    c = config(32, 8, 396, 64, -1, false);
    plan_and_verify(&c, lens, 64, &p);
    assert_true(p.chunking.split);
    assert_true(step_estimate(&c, lens, 64, p.chunking.chunk_size) <
                step_estimate(&c, lens, 64, 4096) * 3 / 4);
    free_plan(&p);

    /* Short requests never split below the minimum chunk. */
    const int32_t shorts[] = {64, 10, 1};
    c = config(1, 1, 10000, 3, -1, false);
    plan_and_verify(&c, shorts, 3, &p);
    assert_false(p.chunking.split);
    assert_int_equal(p.chunking.chunk_size, 64);
    free_plan(&p);
}

static void snake_order_balances_the_persistent_loop(void **state) {
    (void)state;
    /* 8 unsplit items over 4 CTAs: sorted 800..100, the second band reversed, so every CTA runs
     * a long and a short item: 800 + 100, 700 + 200, ... */
    const int32_t lens[] = {300, 800, 100, 600, 700, 200, 500, 400};
    cinfer__decode_config_t c = config(1, 1, 4, 8, -1, false);
    plan_t p;
    plan_and_verify(&c, lens, 8, &p);
    assert_false(p.chunking.split);
    int64_t load[4] = {0};
    for (int w = 0; w < 8; w++)
        load[w % 4] += p.work[w].kv_end - p.work[w].kv_begin;
    for (int i = 0; i < 4; i++)
        assert_int_equal(load[i], 900);
    /* The first band is longest first. */
    for (int w = 1; w < 4; w++)
        assert_true(p.work[w - 1].kv_end >= p.work[w].kv_end);
    free_plan(&p);
}

static void chunks_of_a_request_are_interleaved(void **state) {
    (void)state;
    /* Two split requests: chunk index outermost, so the first two (request, chunk) groups are
     * chunk 0 of the longer request, then chunk 0 of the shorter one. */
    const int32_t lens[] = {1000, 3000};
    cinfer__decode_config_t c = config(2, 2, 64, 2, -1, false);
    plan_t p;
    plan_and_verify(&c, lens, 2, &p);
    assert_true(p.chunking.split);
    assert_int_equal(p.work[0].request, 1);
    assert_int_equal(p.work[0].kv_begin, 0);
    assert_int_equal(p.work[2].request, 0);
    assert_int_equal(p.work[2].kv_begin, 0);
    assert_int_equal(p.work[4].request, 1);
    assert_int_equal(p.work[4].kv_begin, p.chunking.chunk_size);
    free_plan(&p);
}

static void graph_mode_grids_are_constant(void **state) {
    (void)state;
    cinfer__decode_config_t c = config(32, 4, 264, 32, -1, true);
    const int32_t a[] = {100000};
    const int32_t b[] = {5, 10, 0, 7, 3, 100};
    int32_t big[32];
    for (int i = 0; i < 32; i++)
        big[i] = 40000 - 1000 * i;
    const int32_t *batches[] = {a, b, big, b};
    const int sizes[] = {1, 6, 32, 0};
    int grid = -1;
    int64_t merge = -1;
    for (int i = 0; i < 4; i++) {
        plan_t p;
        plan_and_verify(&c, batches[i], sizes[i], &p);
        const int g = cinfer__decode_attention_grid(&c, p.header->num_work);
        const int64_t m =
            cinfer__decode_merge_grid(&c, 128, sizes[i], p.chunking.split, p.chunking.merge_warps);
        if (i == 0) {
            grid = g;
            merge = m;
        }
        assert_int_equal(g, grid);
        assert_int_equal(m, merge);
        assert_int_equal(g, 264);
        assert_int_equal(m, (32 * 32 + CINFER__DECODE_WARPS - 1) / CINFER__DECODE_WARPS);
        /* One 100k request: 4 warps per head fit the grid made for 32 requests. */
        if (i == 0)
            assert_int_equal(p.header->merge_warps, 4);
        free_plan(&p);
    }
    /* Non-graph grids follow the plan. */
    c.graph = false;
    assert_int_equal(cinfer__decode_attention_grid(&c, 10), 10);
    assert_int_equal(cinfer__decode_attention_grid(&c, 1000), 264);
    assert_int_equal(cinfer__decode_merge_grid(&c, 128, 3, true, 1),
                     (3 * 32 + CINFER__DECODE_WARPS - 1) / CINFER__DECODE_WARPS);
    assert_int_equal(cinfer__decode_merge_grid(&c, 128, 3, true, 4),
                     3 * 32 * 4 / CINFER__DECODE_WARPS);
    assert_int_equal(cinfer__decode_merge_grid(&c, 128, 3, false, 4), 0);
}

static void too_small_capacity_is_an_internal_error(void **state) {
    (void)state;
    cinfer__decode_config_t c = config(8, 8, 16, 2, -1, false);
    const int32_t lens[] = {10000, 1};
    cinfer__decode_chunking_t ch;
    assert_int_equal(cinfer__decode_plan_chunks(&c, lens, 2, &ch), CINFER_STATUS_SUCCESS);
    cinfer_decode_header header;
    cinfer_decode_request requests[2];
    cinfer_decode_work work[4];
    int64_t order[2];
    const cinfer__decode_schedule_t dst = {&header, requests, work, 2, 4, 4, order};
    assert_error(cinfer__decode_plan_build(&c, lens, NULL, 2, &ch, &dst), CINFER_STATUS_INTERNAL,
                 "exceed the workspace capacities");
    const int32_t negative[] = {-5};
    assert_error(cinfer__decode_plan_chunks(&c, negative, 1, &ch), CINFER_STATUS_INVALID_ARGUMENT,
                 "kv_len[0] = -5");
}

/* ---- randomized ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int rng_int(int lo, int hi) { /* inclusive */
    return lo + (int)(rng() % (uint64_t)(hi - lo + 1));
}

static void random_batches(void **state) {
    (void)state;
    static const int groups[] = {1, 2, 4, 5, 7, 8, 16};
    static const int kv_heads[] = {1, 2, 4, 8};
    static const int ctas[] = {1, 7, 66, 132, 264, 528, 1056};
    int splits = 0, unsplit_big = 0, balanced = 0, windows = 0, empties = 0;
    for (int iter = 0; iter < 200; iter++) {
        const int group = groups[rng() % 7], hk = kv_heads[rng() % 4];
        const int batch = rng_int(1, 256);
        const int max_ctas = rng() % 4 ? ctas[rng() % 7] : rng_int(1, 2000);
        const int r = rng_int(0, 9);
        const int window = r < 2 ? rng_int(0, 5000) : r == 2 ? 0 : -1;
        cinfer__decode_config_t c =
            config(group * hk, hk, max_ctas, batch + rng_int(0, 64), window, rng() % 2);
        int32_t *lens = malloc(sizeof *lens * (size_t)batch);
        assert_non_null(lens);
        const int shape = rng_int(0, 3); /* short, mixed, long, or uniform-ish batches */
        for (int b = 0; b < batch; b++) {
            const int kind = shape == 3 ? 1 : rng_int(0, 9);
            if (kind == 0)
                lens[b] = 0;
            else if (kind < 4 || shape == 0)
                lens[b] = rng_int(1, 200);
            else if (kind < 8 && shape != 2)
                lens[b] = rng_int(1, 8000);
            else
                lens[b] = rng_int(1, 100000);
            empties += lens[b] == 0;
        }
        plan_t p;
        plan_and_verify(&c, lens, batch, &p);
        splits += p.chunking.split;
        unsplit_big += !p.chunking.split && p.header->num_work > max_ctas;
        balanced += p.chunking.split && (int64_t)batch * cinfer__decode_units(&c) > max_ctas;
        windows += window >= 0;
        free_plan(&p);
        free(lens);
    }
    /* The seed exercises both regimes, windows and empty requests. */
    assert_true(splits >= 20);
    fprintf(stderr, "random plans: %d split (%d balanced), %d unsplit beyond a wave\n", splits,
            balanced, unsplit_big);
    assert_true(unsplit_big >= 20);
    assert_true(balanced >= 10);
    assert_true(windows >= 20);
    assert_true(empties >= 20);
}

/* ---- public entry points that fail before touching a device ---- */

static void public_functions_reject_null_handles(void **state) {
    (void)state;
    cinfer_attention_options_t o = good_options();
    size_t bytes = 1;
    assert_error(cinfer_batch_decode_workspace_size(NULL, &o, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "ctx is NULL");
    assert_int_equal(bytes, 0);
    assert_error(cinfer_batch_decode_workspace_size(NULL, &o, NULL), CINFER_STATUS_INVALID_ARGUMENT,
                 "device_bytes is NULL");
    cinfer_batch_decode_t *op = (cinfer_batch_decode_t *)&o;
    assert_error(cinfer_batch_decode_create(NULL, &o, NULL, 0, &op), CINFER_STATUS_INVALID_ARGUMENT,
                 "ctx is NULL");
    assert_null(op);
    assert_error(cinfer_batch_decode_create(NULL, &o, NULL, 0, NULL),
                 CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    const int32_t indptr[] = {0};
    assert_error(cinfer_batch_decode_plan(NULL, indptr, NULL, 0, NULL),
                 CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    assert_error(
        cinfer_batch_decode_run(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
        CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    cinfer_batch_decode_destroy(NULL);
    assert_error(cinfer_single_decode_workspace_size(NULL, &o, 10, &bytes),
                 CINFER_STATUS_INVALID_ARGUMENT, "ctx is NULL");
    assert_error(cinfer_single_decode(NULL, &o, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL),
                 CINFER_STATUS_INVALID_ARGUMENT, "ctx is NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(heads_per_cta_is_largest_divisor_up_to_8),
        cmocka_unit_test(merge_rows_are_one_pair_per_warp),
        cmocka_unit_test(layout_is_exact_and_aligned),
        cmocka_unit_test(batch_layout_capacities),
        cmocka_unit_test(kv_lens_from_the_page_table),
        cmocka_unit_test(page_table_errors),
        cmocka_unit_test(options_accepted),
        cmocka_unit_test(options_rejected_naming_the_field),
        cmocka_unit_test(empty_requests_get_one_empty_direct_item),
        cmocka_unit_test(every_position_covered_exactly_once),
        cmocka_unit_test(window_clips_the_attended_range),
        cmocka_unit_test(chunk_size_is_the_smallest_that_fits_one_wave),
        cmocka_unit_test(long_requests_split_beyond_one_wave),
        cmocka_unit_test(snake_order_balances_the_persistent_loop),
        cmocka_unit_test(chunks_of_a_request_are_interleaved),
        cmocka_unit_test(graph_mode_grids_are_constant),
        cmocka_unit_test(too_small_capacity_is_an_internal_error),
        cmocka_unit_test(random_batches),
        cmocka_unit_test(public_functions_reject_null_handles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
