/*
 * The decode planner (src/sched/decode_plan.c) and the decode API's checks that need no device:
 * coverage of every (request, head slice, KV position) exactly once, the one-wave chunk rule, the
 * stream regime's CTA lists and balance, empty requests, sliding-window clipping, capacities and
 * partial slots, constant graph-mode grids, the exact workspace layout, page-table and options
 * validation, and 200 random batches from a fixed seed.
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
    c.max_ctas = max_ctas; /* busy_ctas 0: the CUDA-core kernel's rule */
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
    cinfer_decode_header *header;
    cinfer_decode_request *infos; /* [request * units + slice] */
    cinfer_decode_work *work;
} plan_t;

static cinfer_status_t make_plan(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                 int batch, plan_t *p) {
    memset(p, 0, sizeof *p);
    assert_int_equal(cinfer__decode_batch_layout(cfg, 128, &p->layout), CINFER_STATUS_SUCCESS);
    p->host = calloc(1, p->layout.schedule_bytes);
    assert_non_null(p->host);
    p->header = (cinfer_decode_header *)p->host;
    p->infos = (cinfer_decode_request *)(p->host + p->layout.infos_offset);
    p->work = (cinfer_decode_work *)(p->host + p->layout.work_offset);
    cinfer_status_t st = cinfer__decode_plan_chunks(cfg, kv_len, batch, &p->chunking);
    if (st != CINFER_STATUS_SUCCESS)
        return st;
    const cinfer__decode_schedule_t dst = {p->header,
                                           p->infos,
                                           p->work,
                                           p->layout.info_capacity,
                                           p->layout.work_capacity,
                                           p->layout.slot_capacity};
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

static int compare_items(const void *a, const void *b) {
    const cinfer_decode_work *x = a, *y = b;
    if (x->request != y->request)
        return x->request < y->request ? -1 : 1;
    if (x->slice != y->slice)
        return x->slice < y->slice ? -1 : 1;
    return (x->kv_begin > y->kv_begin) - (x->kv_begin < y->kv_begin);
}

/* The cost of each CTA's list (tokens + CINFER__DECODE_ITEM_TOKENS per item) into cost[num_ctas],
 * checking that the lists from items 0 .. num_ctas - 1 visit every item exactly once. */
static void walk_lists(const plan_t *p, int64_t *cost) {
    const int n = p->header->num_work, ctas = p->header->num_ctas;
    unsigned char *seen = calloc((size_t)n + 1, 1);
    assert_non_null(seen);
    int visited = 0;
    for (int c = 0; c < ctas; c++) {
        cost[c] = 0;
        for (int w = c; w >= 0; w = p->work[w].next) {
            assert_true(w < n);
            assert_int_equal(seen[w], 0);
            seen[w] = 1;
            visited++;
            cost[c] += p->work[w].kv_end - p->work[w].kv_begin + CINFER__DECODE_ITEM_TOKENS;
        }
    }
    assert_int_equal(visited, n);
    free(seen);
}

/* Checks every invariant of a plan (see decode_plan.h). */
static void verify_plan(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                        const plan_t *p) {
    const int units = cinfer__decode_units(cfg);
    const cinfer__decode_chunking_t *ch = &p->chunking;
    const int n = p->header->num_work, ctas = p->header->num_ctas;
    const int64_t align = CINFER__DECODE_CHUNK_ALIGN, item_cost = CINFER__DECODE_ITEM_TOKENS;

    /* Header and capacities. */
    assert_int_equal(p->header->batch_size, batch);
    assert_int_equal(n, ch->num_work);
    assert_int_equal(ctas, ch->num_ctas);
    assert_true(n <= p->layout.work_capacity);
    assert_true((int64_t)batch * units <= p->layout.info_capacity);
    assert_true(ch->num_slots <= p->layout.slot_capacity);
    assert_true(ctas <= cfg->max_ctas && ctas <= n);

    int64_t max_att = 0, total = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t a = attended_len(cfg, kv_len[b]);
        max_att = a > max_att ? a : max_att;
        total += a;
    }
    /* The one-wave chunk: the smallest that fits one wave, raised toward
     * CINFER__DECODE_MIN_CHUNK as far as busy_ctas items remain (busy_ctas 0: to it only if its
     * items fill half a wave). */
    const bool fits = (int64_t)batch * units <= cfg->max_ctas;
    int64_t fit = align;
    while (fits && items_for(cfg, kv_len, batch, fit) > cfg->max_ctas)
        fit += align;
    const int64_t k_max_len = max_att > align ? (max_att + align - 1) / align * align : align;
    int64_t want = cfg->no_split ? k_max_len : fit;
    const int64_t up_to =
        CINFER__DECODE_MIN_CHUNK < k_max_len ? CINFER__DECODE_MIN_CHUNK : k_max_len;
    for (int64_t up = up_to; cfg->busy_ctas > 0 && fits && !cfg->no_split && up > fit; up -= align)
        if (items_for(cfg, kv_len, batch, up) >= cfg->busy_ctas) {
            want = up;
            break;
        }
    /* Past it: the fewest items that still number busy_ctas, in the smallest chunk that makes
     * that many, taken if they are nearly all full (their tokens within 1/8 of the attended
     * ones). */
    for (int64_t up = k_max_len;
         cfg->busy_ctas > 0 && fits && !cfg->no_split && up > up_to && up > want; up -= align) {
        const int64_t items = items_for(cfg, kv_len, batch, up);
        if (items >= cfg->busy_ctas) {
            while (up - align > want && items_for(cfg, kv_len, batch, up - align) == items)
                up -= align;
            if (up > up_to && items * up <= units * (total + total / 8))
                want = up;
            break;
        }
    }
    if (cfg->busy_ctas == 0 && fits && !cfg->no_split && fit < up_to &&
        2 * items_for(cfg, kv_len, batch, up_to) >= cfg->max_ctas)
        want = up_to;
    /* The regime: one wave when it fits, unless its longest item at the smallest chunk that fits
     * would cost more than a stream lane's budget and slack and more than the stream's costliest
     * CTA (checked below, where the CTAs' costs are walked). */
    const bool stream = ch->stream;
    assert_true(stream || fits);
    if (stream && fits) {
        assert_false(cfg->no_split);
        const int64_t longest = (fit < max_att ? fit : max_att) + item_cost;
        assert_true(longest > ch->stream_share + align + item_cost);
    }
    if (!stream) {
        /* One wave: one item per CTA; a split plan fits max_ctas with the smallest chunk that
         * does; an unsplit plan has nothing longer than one chunk, or no shorter chunk fits. */
        const int64_t chunk = ch->chunk_size;
        assert_int_equal(ctas, n);
        assert_true(chunk >= align);
        assert_int_equal(chunk % align == 0 || chunk == INT32_MAX, 1);
        assert_int_equal(n, items_for(cfg, kv_len, batch, chunk));
        for (int w = 0; w < n; w++) {
            assert_int_equal(p->work[w].next, -1);
            assert_true(p->work[w].kv_end - p->work[w].kv_begin <= chunk);
        }
        assert_int_equal(chunk, want);
        assert_true(n <= cfg->max_ctas);
        if (!ch->split)
            assert_int_equal(n, (int64_t)batch * units);
    } else {
        /* Stream: within the workspace bounds, and every CTA's cost within a piece's slack of the
         * budget (decode_plan.h). */
        assert_int_equal(ch->chunk_size, 0);
        assert_true(n <= (int64_t)batch * units + cfg->max_ctas);
        assert_true(ch->num_slots <= 2 * (int64_t)cfg->max_ctas);
        if (cfg->no_split)
            assert_false(ch->split);
    }
    int64_t *cost = calloc((size_t)(ctas > 0 ? ctas : 1), sizeof *cost);
    assert_non_null(cost);
    walk_lists(p, cost);
    if (stream && fits) {
        int64_t busiest = 0;
        for (int c = 0; c < ctas; c++)
            busiest = cost[c] > busiest ? cost[c] : busiest;
        assert_true(busiest < (fit < max_att ? fit : max_att) + item_cost);
    }
    if (stream) {
        const int64_t share = ch->stream_share;
        int64_t longest = 0;
        for (int b = 0; b < batch; b++)
            longest =
                attended_len(cfg, kv_len[b]) > longest ? attended_len(cfg, kv_len[b]) : longest;
        const int64_t slack = cfg->no_split ? longest + item_cost : 2 * (align + item_cost);
        for (int c = 0; c < ctas; c++) {
            if (cost[c] > share + slack && share >= 4 * (align + item_cost))
                fail_msg("CTA %d costs %lld, budget %lld + slack %lld", c, (long long)cost[c],
                         (long long)share, (long long)slack);
            /* Under that budget a lane's room may hold no cut: still at most about twice it. */
            if (!cfg->no_split && cost[c] > 2 * share + slack)
                fail_msg("CTA %d costs %lld, budget %lld (twice it + slack %lld)", c,
                         (long long)cost[c], (long long)share, (long long)slack);
        }
    }
    free(cost);

    /* Items: fields, page_begin, the attended range. */
    for (int w = 0; w < n; w++) {
        const cinfer_decode_work *it = &p->work[w];
        assert_true(it->request >= 0 && it->request < batch);
        assert_true(it->slice >= 0 && it->slice < units);
        const int32_t len = kv_len[it->request];
        assert_int_equal(it->kv_len, len);
        int32_t page_begin = 0; /* make_plan's page table: 16-token pages */
        for (int b = 0; b < it->request; b++)
            page_begin += (kv_len[b] + 15) / 16;
        assert_int_equal(it->page_begin, page_begin);
        assert_true(it->kv_begin >= len - attended_len(cfg, len));
        assert_true(it->kv_begin <= it->kv_end && it->kv_end <= len);
    }

    /* Coverage and slots: per (request, slice) the items tile [kv_len - attended, kv_len) in
     * order (an empty request: one empty item); a slice of one piece writes directly, the c-th
     * piece of a split one takes slot partial_base + c of its info; split pieces but the last are
     * multiples of CINFER__DECODE_CHUNK_ALIGN tokens and the last keeps at least that many. */
    cinfer_decode_work *sorted = malloc(sizeof *sorted * (size_t)(n ? n : 1));
    unsigned char *slot_used = calloc((size_t)p->layout.slot_capacity + 1, 1);
    assert_non_null(sorted);
    assert_non_null(slot_used);
    memcpy(sorted, p->work, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_items);
    int w = 0, slots_seen = 0, split_slices = 0, max_chunks = batch ? 1 : 0;
    for (int b = 0; b < batch; b++) {
        const int64_t begin = kv_len[b] - attended_len(cfg, kv_len[b]);
        for (int s = 0; s < units; s++) {
            const cinfer_decode_request *info = &p->infos[(int64_t)b * units + s];
            assert_int_equal(info->kv_len, kv_len[b]);
            int64_t pos = begin;
            int pieces = 0;
            do {
                assert_true(w < n);
                const cinfer_decode_work *it = &sorted[w++];
                assert_int_equal(it->request, b);
                assert_int_equal(it->slice, s);
                assert_int_equal(it->kv_begin, pos);
                if (info->num_chunks > 1) {
                    assert_int_equal(it->partial, info->partial_base + pieces);
                    assert_true(it->partial >= 0 && it->partial < p->layout.slot_capacity);
                    assert_int_equal(slot_used[it->partial], 0); /* unique */
                    slot_used[it->partial] = 1;
                    slots_seen++;
                    if (stream) {
                        assert_true(it->kv_end - it->kv_begin >= align);
                        if (it->kv_end < kv_len[b])
                            assert_int_equal((it->kv_end - it->kv_begin) % align, 0);
                    }
                } else {
                    assert_int_equal(it->partial, -1);
                }
                pos = it->kv_end;
                pieces++;
            } while (pos < kv_len[b]);
            assert_int_equal(pieces, info->num_chunks);
            if (info->num_chunks > 1)
                split_slices++;
            else
                assert_int_equal(info->partial_base, -1);
            max_chunks = pieces > max_chunks ? pieces : max_chunks;
        }
    }
    assert_int_equal(w, n);
    assert_int_equal(slots_seen, ch->num_slots);
    assert_int_equal(ch->split, split_slices > 0);
    assert_int_equal(ch->max_chunks, max_chunks);
    free(sorted);
    free(slot_used);

    /* The items as kernel parameters: exactly the items written, where the plan allows them. */
    cinfer_decode_uniform u;
    int32_t indptr[2] = {0, (kv_len && batch ? kv_len[0] + 15 : 0) / 16};
    cinfer__decode_plan_uniform(cfg, kv_len, indptr, batch, ch, &u);
    if (!cfg->graph && batch == 1 && !stream) {
        assert_true(u.pieces >= 1);
        assert_int_equal((int64_t)u.pieces * units, n);
        for (int i = 0; i < n; i++) {
            const cinfer_decode_work x = cinfer_decode_uniform_work(&u, i), *it = &p->work[i];
            assert_int_equal(x.request, it->request);
            assert_int_equal(x.slice, it->slice);
            assert_int_equal(x.kv_begin, it->kv_begin);
            assert_int_equal(x.kv_end, it->kv_end);
            assert_int_equal(x.partial, it->partial);
            assert_int_equal(x.page_begin, it->page_begin);
            assert_int_equal(x.kv_len, it->kv_len);
            assert_int_equal(x.next, it->next);
        }
        /* and what the merge kernel reads of the schedule: the header's merge_warps and the
         * slices' entries */
        assert_int_equal(u.merge_warps, p->header->merge_warps);
        assert_int_equal(p->header->batch_size, 1);
        for (int s = 0; s < units; s++) {
            const cinfer_decode_request r = cinfer_decode_uniform_request(&u, s);
            assert_int_equal(r.kv_len, p->infos[s].kv_len);
            assert_int_equal(r.num_chunks, p->infos[s].num_chunks);
            assert_int_equal(r.partial_base, p->infos[s].partial_base);
        }
    } else {
        assert_int_equal(u.pieces, 0);
    }

    /* Grids. */
    const int grid = cinfer__decode_attention_grid(cfg, ctas);
    if (cfg->graph)
        assert_int_equal(grid, cfg->max_ctas);
    else
        assert_int_equal(grid, ctas);
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
                assert_int_equal(l.info_capacity, caps[i][1]);
                assert_int_equal(l.slot_capacity, caps[i][2]);
                assert_int_equal(l.infos_offset, UP(header));
                assert_int_equal(l.work_offset, l.infos_offset + UP(req));
                assert_int_equal(l.schedule_bytes, l.work_offset + work);
                assert_int_equal(l.partial_o_offset, l.work_offset + UP(work));
                assert_int_equal(l.partial_lse_offset, l.partial_o_offset + UP(po));
                assert_int_equal(l.total_bytes, UP(header) + UP(req) + UP(work) + UP(po) + UP(pl));
#undef UP
                /* Every region starts aligned and fits before the next one. */
                assert_int_equal(l.infos_offset % A, 0);
                assert_int_equal(l.work_offset % A, 0);
                assert_int_equal(l.partial_o_offset % A, 0);
                assert_int_equal(l.partial_lse_offset % A, 0);
                assert_true(header <= l.infos_offset);
                assert_true(l.infos_offset + req <= l.work_offset);
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
    /* Work items: unsplit items plus one cut per CTA; infos: one per head slice; slots: two per
     * CTA (decode_plan.h). */
    cinfer__decode_config_t c = config(32, 8, 528, 4, -1, false); /* group 4: HPC 4, 8 units */
    assert_int_equal(cinfer__decode_batch_layout(&c, 128, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, 4 * 8 + 528);
    assert_int_equal(l.info_capacity, 4 * 8);
    assert_int_equal(l.slot_capacity, 2 * 528);
    c = config(32, 8, 528, 256, -1, true);
    assert_int_equal(cinfer__decode_batch_layout(&c, 128, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, 256 * 8 + 528);
    assert_int_equal(l.info_capacity, 256 * 8);
    assert_int_equal(l.slot_capacity, 2 * 528);
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
    for (int s = 0; s < 4; s++) {
        assert_int_equal(p.infos[0 * 4 + s].num_chunks, 1);
        assert_int_equal(p.infos[0 * 4 + s].partial_base, -1);
        assert_int_equal(p.infos[2 * 4 + s].num_chunks, 1);
        assert_true(p.infos[1 * 4 + s].num_chunks > 1);
    }
    int empty = 0;
    for (int w = 0; w < p.header->num_work; w++)
        if (p.work[w].request == 0) {
            empty++;
            assert_int_equal(p.work[w].kv_end - p.work[w].kv_begin, 0);
            assert_int_equal(p.work[w].partial, -1);
        }
    assert_int_equal(empty, 4);
    free_plan(&p);

    /* One empty request: its plan is uniform too (verify_plan checks the parameters against the
     * items), so single decode with kv_len 0 copies no schedule either. */
    plan_and_verify(&c, lens, 1, &p);
    assert_int_equal(p.header->num_work, 4);
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
    const int units = cinfer__decode_units(c);
    for (int b = 0; b < batch; b++) {
        const size_t cells = (size_t)units * (size_t)lens[b];
        unsigned char *cover = calloc(cells + 1, 1);
        assert_non_null(cover);
        for (int w = 0; w < p.header->num_work; w++) {
            const cinfer_decode_work *it = &p.work[w];
            if (it->request != b)
                continue;
            const int s = it->slice;
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

/* The largest cost of a CTA's list, and that no list is empty. */
static int64_t busiest_cta(const plan_t *p) {
    int64_t *cost = calloc((size_t)p->header->num_ctas + 1, sizeof *cost), worst = 0;
    assert_non_null(cost);
    walk_lists(p, cost);
    for (int c = 0; c < p->header->num_ctas; c++) {
        assert_true(cost[c] > 0);
        worst = cost[c] > worst ? cost[c] : worst;
    }
    free(cost);
    return worst;
}

static void long_requests_split_beyond_one_wave(void **state) {
    (void)state;
    plan_t p;
    /* 64 requests of 1000 tokens and one of 20000, 8 slices, 264 CTAs: 520 slices exceed a wave.
     * The stream runs on 33 lanes of 8 CTAs (a request's 8 slices side by side), with a budget
     * between (84000 + 65 * 64) / 33 = 2671.5 (no cut) and (84000 + 65 * 64 + 32 * 64) / 33 =
     * 2733.6 (a cut at every boundary); the long request spans about 7 lanes, and every CTA stays
     * within a piece's slack of the budget (a persistent grid of whole 640-token chunks left the
     * busiest CTA 2960). */
    int32_t lens[65];
    for (int b = 0; b < 64; b++)
        lens[b] = 1000;
    lens[64] = 20000;
    cinfer__decode_config_t c = config(32, 8, 264, 65, -1, false);
    plan_and_verify(&c, lens, 65, &p);
    assert_true(p.chunking.stream && p.chunking.split);
    assert_true(p.chunking.stream_share >= 2672 && p.chunking.stream_share <= 2734);
    assert_int_equal(p.header->num_ctas, 264);
    for (int s = 0; s < 8; s++)
        assert_true(p.infos[64 * 8 + s].num_chunks >= 7);
    assert_true(busiest_cta(&p) <= 2737 + 2 * (64 + 64));
    assert_true(p.header->num_work <= 65 * 8 + 263);
    free_plan(&p);
    /* The same batch with uniform lengths: 520 slices of 1000 tokens on 264 CTAs, each CTA about
     * 1.97 slices' worth; the cuts split some slices in two. */
    lens[64] = 1000;
    plan_and_verify(&c, lens, 65, &p);
    assert_true(p.chunking.split);
    assert_true(p.chunking.max_chunks <= 3);
    assert_true(busiest_cta(&p) <= p.chunking.stream_share + 2 * (64 + 64));
    free_plan(&p);
}

/* 64 requests x 8 slices on 528 CTAs fit one wave: with equal lengths (1k) it is one item per
 * slice and no merge; with one 20k request among 1k ones, the smallest chunk that fits one wave is
 * 6720 tokens (that request in 3 chunks per slice: items of 6784 against a stream lane's ~1.4k),
 * so it streams. With one 2500-token request among 63 of one token, the stream's budget (~101)
 * holds no cut, so its lanes take that range in 64-token pieces and it streams too (one wave would
 * have C = 896, items of up to 960). */
static void mixed_batches_that_fit_one_wave_stream(void **state) {
    (void)state;
    plan_t p;
    int32_t lens[64];
    for (int b = 0; b < 64; b++)
        lens[b] = 1024;
    cinfer__decode_config_t c = config(32, 8, 528, 64, -1, false);
    c.busy_ctas = 256;
    plan_and_verify(&c, lens, 64, &p);
    assert_false(p.chunking.stream);
    assert_false(p.chunking.split);
    assert_int_equal(p.header->num_work, 512);
    free_plan(&p);
    lens[7] = 20000;
    plan_and_verify(&c, lens, 64, &p);
    assert_true(p.chunking.stream);
    assert_true(p.chunking.split);
    assert_true(busiest_cta(&p) <= p.chunking.stream_share + 2 * (64 + 64));
    free_plan(&p);
    /* 63 one-token requests and one of 2500: one wave's longest item would hold 896 tokens; the
     * stream's budget (under CHUNK_ALIGN + ITEM) holds no cut, so its lanes take the long range in
     * 64-token pieces, and it costs less. */
    for (int b = 0; b < 64; b++)
        lens[b] = 1;
    lens[63] = 2500;
    plan_and_verify(&c, lens, 64, &p);
    assert_true(p.chunking.stream);
    assert_true(busiest_cta(&p) < 896 + 64);
    assert_true(busiest_cta(&p) <= 3 * p.chunking.stream_share);
    free_plan(&p);
}

/* busy_ctas: one request of 8k / 4k tokens on 528 CTAs, 256 wanted busy: chunks of 256 / 128
 * tokens (256 items), not the 128 / 64 that the most items in one wave would give; 16k / 32k
 * tokens and 4 x 32k: 512 / 1024 / 4096 (256 items), past CINFER__DECODE_MIN_CHUNK; a batch of
 * one long and many short requests keeps the smallest chunk that fits (the long one's chunks
 * would be few of the items). */
static void one_wave_chunks_keep_busy_ctas(void **state) {
    (void)state;
    plan_t p;
    cinfer__decode_config_t c = config(32, 8, 528, 64, -1, false);
    c.busy_ctas = 256;
    const int32_t eight[] = {8192}, four[] = {4096}, one[] = {1024};
    plan_and_verify(&c, eight, 1, &p);
    assert_int_equal(p.chunking.chunk_size, 256);
    free_plan(&p);
    plan_and_verify(&c, four, 1, &p);
    assert_int_equal(p.chunking.chunk_size, 128);
    free_plan(&p);
    plan_and_verify(&c, one, 1, &p); /* 128 items at most: the smallest chunk */
    assert_int_equal(p.chunking.chunk_size, 64);
    free_plan(&p);
    const int32_t sixteen[] = {16384}, long_one[] = {32768},
                  four_long[] = {32768, 32768, 32768, 32768};
    plan_and_verify(&c, sixteen, 1, &p);
    assert_int_equal(p.chunking.chunk_size, 512);
    assert_int_equal(p.chunking.num_ctas, 256);
    free_plan(&p);
    plan_and_verify(&c, long_one, 1, &p);
    assert_int_equal(p.chunking.chunk_size, 1024);
    assert_int_equal(p.chunking.num_ctas, 256);
    free_plan(&p);
    plan_and_verify(&c, four_long, 4, &p);
    assert_int_equal(p.chunking.chunk_size, 4096);
    free_plan(&p);
    int32_t mixed[40];
    mixed[0] = 32768;
    for (int b = 1; b < 40; b++)
        mixed[b] = 100;
    plan_and_verify(&c, mixed, 40, &p); /* streamed, or in one wave of chunks up to 256 */
    assert_true(p.chunking.stream || p.chunking.chunk_size <= 256);
    free_plan(&p);
    for (int b = 1; b < 40; b++)
        mixed[b] = 3000; /* 320 slices: every chunk size keeps 256 items */
    plan_and_verify(&c, mixed, 40, &p);
    assert_true(p.chunking.stream || p.chunking.chunk_size <= 256);
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
    assert_int_equal(p.infos[0].num_chunks, 66);
    assert_int_equal(p.header->num_work, 66 * 8);
    assert_int_equal(p.chunking.num_slots, 66 * 8);
    free_plan(&p);

    /* A uniform batch of 1.29 waves of slices (64 x 1024 tokens, 8 slices, 396 CTAs): whole
     * slices on a persistent grid would leave the second wave 70% idle; the stream gives each of
     * 49 lanes of 8 CTAs (392; the 8 slices of a request side by side) 1.31 requests' worth, a
     * budget between 64 * (1024 + 64) / 49 = 1421.1 and (64 * (1024 + 64) + 48 * 64) / 49 =
     * 1484.1 tokens. */
    int32_t lens[64];
    for (int b = 0; b < 64; b++)
        lens[b] = 1024;
    c = config(32, 8, 396, 64, -1, false);
    plan_and_verify(&c, lens, 64, &p);
    assert_true(p.chunking.stream && p.chunking.split);
    assert_int_equal(p.header->num_ctas, 392);
    const int64_t share = p.chunking.stream_share;
    assert_true(share >= 1422 && share <= 1485);
    assert_true(busiest_cta(&p) <= share + 2 * (64 + 64));
    /* CTAs 8k .. 8k + 7 run the 8 slices of the same KV ranges. */
    for (int k = 0; k < 49; k++)
        for (int j = 0; j < 8; j++) {
            assert_int_equal(p.work[8 * k + j].slice, j);
            assert_int_equal(p.work[8 * k + j].request, p.work[8 * k].request);
            assert_int_equal(p.work[8 * k + j].kv_begin, p.work[8 * k].kv_begin);
            assert_int_equal(p.work[8 * k + j].kv_end, p.work[8 * k].kv_end);
        }
    free_plan(&p);

    /* Short requests never split below the minimum chunk. */
    const int32_t shorts[] = {64, 10, 1};
    c = config(1, 1, 10000, 3, -1, false);
    plan_and_verify(&c, shorts, 3, &p);
    assert_false(p.chunking.split);
    assert_int_equal(p.chunking.chunk_size, 64);
    free_plan(&p);
}

static void stream_balances_mixed_lengths(void **state) {
    (void)state;
    /* 8 one-slice requests over 4 CTAs: a budget between (3600 + 8 * 64) / 4 = 1028 and
     * (3600 + 8 * 64 + 3 * 64) / 4 = 1076 tokens; the stream cuts at 64-token multiples, so the
     * CTAs' costs stay within 2 * (64 + 64) of it. */
    const int32_t lens[] = {300, 800, 100, 600, 700, 200, 500, 400};
    cinfer__decode_config_t c = config(1, 1, 4, 8, -1, false);
    plan_t p;
    plan_and_verify(&c, lens, 8, &p);
    assert_true(p.chunking.stream);
    assert_true(p.chunking.stream_share >= 1028 && p.chunking.stream_share <= 1076);
    assert_int_equal(p.header->num_ctas, 4);
    assert_true(busiest_cta(&p) <= p.chunking.stream_share + 2 * (64 + 64));
    free_plan(&p);
    /* no_split (variants whose partial states cannot be merged): whole slices, in order. */
    c.no_split = true;
    plan_and_verify(&c, lens, 8, &p);
    assert_false(p.chunking.split);
    assert_int_equal(p.header->num_work, 8);
    for (int w = 0; w < 8; w++)
        assert_int_equal(p.work[w].kv_end - p.work[w].kv_begin, lens[p.work[w].request]);
    free_plan(&p);
    /* One CTA: every piece on it, nothing cut. */
    c = config(1, 1, 1, 8, -1, false);
    plan_and_verify(&c, lens, 8, &p);
    assert_int_equal(p.header->num_ctas, 1);
    assert_false(p.chunking.split);
    free_plan(&p);
}

/* A budget under CHUNK_ALIGN + ITEM (a few one-token requests beyond a wave) leaves a lane no room
 * for a cut: a long range is still cut, into its least pieces, rather than left on one CTA. */
static void a_long_range_is_cut_under_a_small_budget(void **state) {
    (void)state;
    cinfer__decode_config_t c = config(32, 8, 528, 128, -1, false);
    c.heads_per_cta = 4;
    c.busy_ctas = 256;
    int32_t lens[100];
    for (int at = 0; at < 3; at++) {
        for (int i = 0; i < 100; i++)
            lens[i] = 1 + (i * 7) % 5;
        lens[at == 0 ? 0 : at == 1 ? 50 : 99] = 1000;
        plan_t p;
        plan_and_verify(&c, lens, 100, &p); /* verify_plan bounds every CTA */
        assert_true(p.chunking.stream);
        assert_true(p.chunking.stream_share <
                    CINFER__DECODE_CHUNK_ALIGN + CINFER__DECODE_ITEM_TOKENS * 2);
        assert_true(busiest_cta(&p) <= 3 * p.chunking.stream_share);
        free_plan(&p);
    }
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
        const int g = cinfer__decode_attention_grid(&c, p.header->num_ctas);
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
    cinfer_decode_request infos[2];
    cinfer_decode_work work[4];
    const cinfer__decode_schedule_t dst = {&header, infos, work, 2, 4, 4};
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
        c.busy_ctas = iter % 2 ? (max_ctas + 2) / 3 : 0; /* both chunk rules */
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
        balanced += p.chunking.split && p.chunking.stream;
        windows += window >= 0;
        free_plan(&p);
        free(lens);
    }
    /* The seed exercises both regimes, windows and empty requests. */
    assert_true(splits >= 20);
    fprintf(stderr, "random plans: %d split (%d stream), %d unsplit beyond a wave\n", splits,
            balanced, unsplit_big);
    assert_true(unsplit_big >= 20);
    assert_true(balanced >= 10);
    assert_true(windows >= 20);
    assert_true(empties >= 20);

    /* Single requests (the items as kernel parameters, checked by verify_plan). */
    int uniform_split = 0;
    for (int iter = 0; iter < 200; iter++) {
        const int group = groups[rng() % 7], hk = kv_heads[rng() % 4];
        const int max_ctas = ctas[rng() % 7];
        const int window = rng_int(0, 4) == 0 ? rng_int(0, 5000) : -1;
        cinfer__decode_config_t c = config(group * hk, hk, max_ctas, 1, window, rng() % 8 == 0);
        c.busy_ctas = iter % 2 ? (max_ctas + 2) / 3 : 0;
        c.no_split = rng() % 8 == 0;
        const int32_t len = rng_int(0, 9) == 0 ? rng_int(0, 100) : rng_int(0, 200000);
        plan_t p;
        plan_and_verify(&c, &len, 1, &p);
        uniform_split += !c.graph && !p.chunking.stream && p.chunking.split;
        free_plan(&p);
    }
    assert_true(uniform_split >= 50);
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
        cmocka_unit_test(mixed_batches_that_fit_one_wave_stream),
        cmocka_unit_test(one_wave_chunks_keep_busy_ctas),
        cmocka_unit_test(long_requests_split_beyond_one_wave),
        cmocka_unit_test(stream_balances_mixed_lengths),
        cmocka_unit_test(a_long_range_is_cut_under_a_small_budget),
        cmocka_unit_test(graph_mode_grids_are_constant),
        cmocka_unit_test(too_small_capacity_is_an_internal_error),
        cmocka_unit_test(random_batches),
        cmocka_unit_test(public_functions_reject_null_handles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
