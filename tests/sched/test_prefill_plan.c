/*
 * The batch prefill planner (src/sched/prefill_plan.c) and the batch prefill API's checks that
 * need no device: the tiles of the batch kernels, the tile rule, every (request, query row, query
 * head) covered exactly once, longest-first order, constant graph-mode grids, the exact workspace
 * (and the bound it relies on), the spec of the kernels, page-table and options validation with
 * messages naming argument, value and expectation, and 300 random batches from a fixed seed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/context.h"
#include "ops/prefill.h"
#include "sched/decode_plan.h"
#include "sched/prefill_plan.h"

/* ---- helpers ---- */

/* The H200's opt-in shared memory per block, less the 1 KiB the toolchain reserves. */
#define H200_SMEM (232448 - 1024)

static cinfer__prefill_plan_config_t config(int hq, int hk, bool causal, int window, bool paged,
                                            int page_size, int max_batch, int64_t max_total,
                                            bool graph) {
    cinfer__prefill_plan_config_t c;
    memset(&c, 0, sizeof c);
    c.num_qo_heads = hq;
    c.num_kv_heads = hk;
    c.head_dim = 128;
    c.causal = causal;
    c.window_left = window;
    c.paged = paged;
    c.page_size = paged ? page_size : 1;
    c.max_batch_size = max_batch;
    c.max_total_qo = max_total;
    c.graph = graph;
    c.num_tiles = 3;
    c.tile_q[0] = 32;
    c.tile_q[1] = 64;
    c.tile_q[2] = 128;
    c.tile_kv[0] = 32;
    c.tile_kv[1] = 64;
    c.tile_kv[2] = 64;
    return c;
}

/* The H200's resident CTAs of the D = 128 batch kernels (132 SMs x 4, 2 and 1 per SM: registers
 * bound the two small tiles, shared memory and registers the large one). */
static void h200_ctas(cinfer__prefill_plan_config_t *c) {
    c->max_ctas[0] = 132 * 4;
    c->max_ctas[1] = 132 * 2;
    c->max_ctas[2] = 132;
}

static void assert_error(cinfer_status_t st, cinfer_status_t want, const char *needle) {
    assert_int_equal(st, want);
    if (!strstr(cinfer_last_error(), needle))
        fail_msg("message \"%s\" does not contain \"%s\"", cinfer_last_error(), needle);
}

/* A plan in host buffers sized by the layout, as cinfer_batch_prefill_plan makes it. */
typedef struct plan {
    cinfer__prefill_layout_t layout;
    cinfer__prefill_request_t *req;
    unsigned char *host;
    cinfer__prefill_schedule_t dst;
    cinfer__prefill_chunking_t chunking;
    int tile; /* index into cfg->tile_q */
} plan_t;

static cinfer_status_t make_plan(const cinfer__prefill_plan_config_t *cfg, const int32_t *qo_indptr,
                                 const int32_t *kv_indptr, const int32_t *last, int batch,
                                 plan_t *p) {
    memset(p, 0, sizeof *p);
    cinfer_status_t st = cinfer__prefill_batch_layout(cfg, &p->layout);
    if (st)
        return st;
    p->req = calloc((size_t)cfg->max_batch_size + 1, sizeof *p->req);
    p->host = calloc(1, p->layout.schedule_bytes);
    assert_non_null(p->req);
    assert_non_null(p->host);
    p->dst.header = (cinfer_prefill_header *)p->host;
    p->dst.work = (cinfer_prefill_work *)(p->host + p->layout.work_offset);
    p->dst.merge = p->layout.row_capacity > 0
                       ? (cinfer_decode_header *)(p->host + p->layout.merge_offset)
                       : NULL;
    p->dst.rows = (cinfer_decode_request *)(p->host + p->layout.rows_offset);
    p->dst.work_capacity = p->layout.work_capacity;
    p->dst.row_capacity = p->layout.row_capacity;
    p->dst.state_capacity = p->layout.state_capacity;
    st = cinfer__prefill_requests(cfg, qo_indptr, kv_indptr, last, batch, p->req);
    if (st)
        return st;
    st = cinfer__prefill_plan_tile(cfg, p->req, batch, &p->tile, &p->chunking);
    if (st)
        return st;
    return cinfer__prefill_plan_build(cfg, p->req, batch, p->tile, &p->chunking, &p->dst);
}

static void free_plan(plan_t *p) {
    free(p->req);
    free(p->host);
    memset(p, 0, sizeof *p);
}

/* Asserts that plan p split with these chunking figures, running `ctas` attention CTAs. */
static void assert_split(const cinfer__prefill_plan_config_t *c, const plan_t *p, int chunk,
                         int work, int max_chunks, int rows, int states, int64_t ctas) {
    assert_true(p->chunking.split);
    assert_int_equal(p->chunking.chunk_size, chunk);
    assert_int_equal(p->chunking.num_work, work);
    assert_int_equal(p->chunking.max_chunks, max_chunks);
    assert_int_equal(p->chunking.num_rows, rows);
    assert_int_equal(p->chunking.num_states, states);
    assert_int_equal(cinfer__prefill_grid(c, c->tile_q[p->tile], p->chunking.num_work), ctas);
}

/* A half-open interval of KV positions that one item visits for one query row. */
typedef struct span {
    int64_t row, begin, end;
} span_t;

static int compare_spans(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    if (x->row != y->row)
        return x->row < y->row ? -1 : 1;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/*
 * Every (request, query row) is in the items of exactly one query tile, and every (request, row,
 * query head) is computed by exactly one CTA of that tile's first chunk (the CTAs of an item as
 * the kernel maps them: one per query head, or with GQA packing one per KV head k, whose row r is
 * the tile's token r / G of query head k G + r % G), and every KV position a row
 * keeps (causal, window, kv_len) is visited by exactly one of them (the kernel visits whole KV
 * tiles from its range cut to its chunk, and masks elements); items carry their request's
 * description, tiles start on multiples of tile_q, chunks on multiples of the alignment, costs
 * never increase, split tiles have distinct partial slots below num_states that the merge rows
 * name, and the grid is what the launch uses.
 */
static void verify_plan(const cinfer__prefill_plan_config_t *cfg, const int32_t *qo_indptr,
                        const int32_t *kv_indptr, const int32_t *last, int batch, const plan_t *p) {
    const int tile_q = cfg->tile_q[p->tile], tile_kv = cfg->tile_kv[p->tile];
    const int64_t align = tile_kv > 64 ? tile_kv : 64, heads = cfg->num_qo_heads;
    const int group = cfg->group > 1 ? cfg->group : 1;
    const int64_t cta_heads = cinfer__prefill_cta_heads(cfg);
    assert_int_equal(cta_heads, heads / group);
    const cinfer__prefill_chunking_t *ch = &p->chunking;
    const int n = p->dst.header->num_work;
    assert_int_equal(n, ch->num_work);
    assert_int_equal(p->dst.header->batch_size, batch);
    assert_true(n <= p->layout.work_capacity);
    assert_true(ch->split || n <= cinfer__prefill_work_bound(cfg, tile_q));
    assert_int_equal(ch->split, ch->max_chunks > 1);
    /* The merge's rows: the plan's from qo_indptr[0], or in graph mode those of out from row 0
     * (the captured merge's output address cannot move with qo_indptr[0]). */
    const int64_t merge_row0 = cfg->graph ? 0 : qo_indptr[0];
    if (ch->split) {
        assert_false(cfg->no_split);
        assert_true((int64_t)n * cta_heads <= cfg->max_ctas[p->tile]);
        assert_true(n <= cinfer__prefill_split_items(cfg, p->tile));
        assert_true(ch->chunk_size >=
                        (cfg->chunk_floor > 0 ? cfg->chunk_floor : CINFER__PREFILL_CHUNK_MIN) &&
                    ch->chunk_size % align == 0);
        assert_true(ch->chunk_size >= cfg->min_chunk);
        assert_true(ch->num_rows <= p->layout.row_capacity);
        assert_true(ch->num_states <= p->layout.state_capacity);
        assert_int_equal(ch->num_rows, qo_indptr[batch] - merge_row0);
        assert_int_equal(p->dst.merge->batch_size, ch->num_rows);
        assert_int_equal(p->dst.merge->num_work, ch->num_states);
        assert_int_equal(p->dst.merge->merge_warps, 1);
        /* Graph mode: rows before the plan's are skipped by the merge. */
        for (int64_t r = 0; r < qo_indptr[0] - merge_row0; r++)
            assert_true(p->dst.rows[r].num_chunks <= 1);
    } else {
        assert_int_equal(ch->chunk_size, 0);
        assert_int_equal(ch->num_states, 0);
        assert_int_equal(ch->num_rows, 0);
        /* A graph-mode merge launch after this plan must do nothing. */
        if (p->dst.merge)
            assert_int_equal(p->dst.merge->batch_size, 0);
    }
    if (cfg->graph && ch->split)
        assert_true(qo_indptr[batch] <= cinfer__prefill_row_bound(cfg));
    const int64_t rows = (int64_t)qo_indptr[batch] - qo_indptr[0];
    int64_t *tile_of_row = malloc(sizeof(int64_t) * ((size_t)rows + 1));
    for (int64_t r = 0; r < rows; r++)
        tile_of_row[r] = -1;
    unsigned char *slot_used = calloc((size_t)ch->num_states + 1, 1);
    unsigned char *computed = calloc((size_t)(rows * heads) + 1, 1);
    int64_t num_spans = 0, cap_spans = 64;
    span_t *spans = malloc(sizeof *spans * (size_t)cap_spans);
    int64_t prev_cost = INT64_MAX;
    for (int i = 0; i < n; i++) {
        const cinfer_prefill_work *w = &p->dst.work[i];
        assert_true(w->request >= 0 && w->request < batch);
        const int b = w->request;
        assert_int_equal(w->qo_begin, qo_indptr[b]);
        assert_int_equal(w->qo_len, qo_indptr[b + 1] - qo_indptr[b]);
        assert_int_equal(w->kv_begin, kv_indptr[b]);
        int64_t kv_len = (int64_t)kv_indptr[b + 1] - kv_indptr[b];
        if (cfg->paged && kv_len > 0)
            kv_len = (kv_len - 1) * cfg->page_size + last[b];
        assert_int_equal(w->kv_len, kv_len);
        assert_true(w->q_begin >= 0 && w->q_begin < w->qo_len && w->q_begin % tile_q == 0);
        assert_true(w->chunk >= 0 && w->chunk < w->num_chunks);
        const int q_rows = w->qo_len - w->q_begin < tile_q ? w->qo_len - w->q_begin : tile_q;
        const int64_t row0 = (int64_t)w->qo_begin + w->q_begin - qo_indptr[0];
        /* The tile's rows belong to it alone (the chunk items of a tile name the same first row).
         */
        for (int r = 0; r < q_rows; r++) {
            if (tile_of_row[row0 + r] >= 0 && tile_of_row[row0 + r] != row0)
                fail_msg("request %d row %d is in two query tiles", b, w->q_begin + r);
            tile_of_row[row0 + r] = row0;
        }
        int64_t tb, te;
        cinfer__prefill_tile_range(cfg, w->qo_len, w->kv_len, w->q_begin, tile_q, &tb, &te);
        if (w->num_chunks == 1) {
            assert_int_equal(w->chunk_begin, 0);
            assert_int_equal(w->chunk_end, w->kv_len);
            assert_int_equal(w->partial, -1);
        } else {
            /* Chunks start on the alignment, end on it or at the tile's range end, and each
             * holds some of the range. */
            assert_true(ch->split);
            assert_int_equal(w->chunk_begin % align, 0);
            assert_true(w->chunk_end % align == 0 || w->chunk_end == te);
            assert_true(w->chunk_end - w->chunk_begin <= ch->chunk_size);
            assert_true(w->chunk_begin < te && w->chunk_end > tb && w->chunk_end <= te);
            assert_true(w->partial >= 0);
        }
        /* The item's CTAs, row by row as the kernel maps them (its rows past q_rows tokens
         * are padding: never stored). */
        for (int64_t k = 0; k < cta_heads; k++)
            for (int r = 0; r < tile_q * group; r++) {
                const int token = r / group;
                const int64_t h = group > 1 ? k * group + r % group : k;
                if (token >= q_rows)
                    continue;
                if (w->chunk == 0 && computed[(row0 + token) * heads + h]++)
                    fail_msg("request %d row %d head %lld is computed twice", b, w->q_begin + token,
                             (long long)h);
                if (w->num_chunks > 1) {
                    const int64_t slot = w->partial + (token * heads + h) * w->num_chunks;
                    assert_true(slot < ch->num_states);
                    if (slot_used[slot]++)
                        fail_msg("partial slot %lld is used twice", (long long)slot);
                }
            }
        if (ch->split) {
            for (int r = 0; r < q_rows; r++) {
                const cinfer_decode_request *m = &p->dst.rows[row0 + r + qo_indptr[0] - merge_row0];
                assert_int_equal(m->kv_len, w->kv_len);
                assert_int_equal(m->num_chunks, w->num_chunks);
                if (w->num_chunks > 1)
                    assert_int_equal(m->partial_base + w->chunk,
                                     w->partial + (int64_t)r * heads * w->num_chunks);
                else
                    assert_int_equal(m->partial_base, -1);
            }
        }
        /* What the kernel visits: its range cut to the chunk, widened to whole KV tiles. */
        const int64_t lo = (tb > w->chunk_begin ? tb : w->chunk_begin) / tile_kv * tile_kv;
        const int64_t hi_raw = te < w->chunk_end ? te : w->chunk_end;
        const int64_t hi = (hi_raw + tile_kv - 1) / tile_kv * tile_kv;
        const int64_t delta = w->kv_len - w->qo_len;
        for (int r = 0; r < q_rows; r++) {
            const int64_t pos = w->q_begin + r + delta;
            int64_t keep_lo = 0, keep_hi = w->kv_len;
            if (cfg->causal && pos + 1 < keep_hi)
                keep_hi = pos + 1;
            if (cfg->window_left >= 0 && pos - cfg->window_left > keep_lo)
                keep_lo = pos - cfg->window_left;
            const int64_t sb = lo > keep_lo ? lo : keep_lo, se = hi < keep_hi ? hi : keep_hi;
            if (se <= sb)
                continue;
            if (num_spans == cap_spans) {
                cap_spans *= 2;
                spans = realloc(spans, sizeof *spans * (size_t)cap_spans);
            }
            spans[num_spans++] = (span_t){row0 + r, sb, se};
        }
        const int64_t cost = cinfer__prefill_item_cost(cfg, w, tile_q);
        assert_true(cost <= prev_cost);
        prev_cost = cost;
    }
    for (int64_t r = 0; r < rows; r++)
        if (tile_of_row[r] < 0)
            fail_msg("row %lld is in no query tile", (long long)r);
    for (int64_t i = 0; i < ch->num_states; i++)
        if (!slot_used[i])
            fail_msg("partial slot %lld is never written", (long long)i);
    for (int64_t i = 0; i < rows * heads; i++)
        if (!computed[i])
            fail_msg("row %lld head %lld is computed by no CTA", (long long)(i / heads),
                     (long long)(i % heads));
    free(computed);
    /* Per row, the visited spans of kept positions tile the row's kept range exactly. */
    qsort(spans, (size_t)num_spans, sizeof *spans, compare_spans);
    int64_t at = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t qo_len = (int64_t)qo_indptr[b + 1] - qo_indptr[b];
        int64_t kv_len = (int64_t)kv_indptr[b + 1] - kv_indptr[b];
        if (cfg->paged && kv_len > 0)
            kv_len = (kv_len - 1) * cfg->page_size + last[b];
        for (int64_t i = 0; i < qo_len; i++) {
            const int64_t row = (int64_t)qo_indptr[b] - qo_indptr[0] + i, pos = i + kv_len - qo_len;
            int64_t keep_lo = 0, keep_hi = kv_len;
            if (cfg->causal && pos + 1 < keep_hi)
                keep_hi = pos + 1;
            if (cfg->window_left >= 0 && pos - cfg->window_left > keep_lo)
                keep_lo = pos - cfg->window_left;
            int64_t next = keep_lo;
            for (; at < num_spans && spans[at].row == row; at++) {
                if (spans[at].begin != next)
                    fail_msg("request %d row %lld: KV positions from %lld visited %s", b,
                             (long long)i, (long long)next,
                             spans[at].begin < next ? "twice" : "by no item");
                next = spans[at].end;
            }
            if (keep_hi > keep_lo && next != keep_hi)
                fail_msg("request %d row %lld: KV positions %lld..%lld visited by no item", b,
                         (long long)i, (long long)next, (long long)keep_hi);
        }
    }
    assert_int_equal(at, num_spans);
    free(spans);
    free(slot_used);
    free(tile_of_row);
    const int64_t grid = cinfer__prefill_grid(cfg, tile_q, n);
    const int64_t merge_grid = cinfer__prefill_merge_grid(cfg, ch->num_rows);
    const int64_t per_block = cinfer__decode_merge_rows(cfg->head_dim);
    if (cfg->graph) {
        /* Constant: the unsplit work bound or one wave of split items, whichever is larger; the
         * merge's rows are the row bound, whatever the plan. */
        const int64_t bound = cinfer__prefill_work_bound(cfg, tile_q);
        const int64_t items = cinfer__prefill_split_items(cfg, p->tile);
        assert_int_equal(grid, (bound > items ? bound : items) * cta_heads);
        assert_int_equal(merge_grid,
                         (cinfer__prefill_row_bound(cfg) * heads + per_block - 1) / per_block);
        assert_int_equal(p->layout.row_capacity, cinfer__prefill_row_bound(cfg));
        assert_true(grid <= (int64_t)p->layout.work_capacity * cta_heads);
    } else {
        assert_int_equal(grid, (int64_t)n * cta_heads);
        assert_int_equal(merge_grid, (ch->num_rows * heads + per_block - 1) / per_block);
    }
    assert_true(grid >= (int64_t)n * cta_heads);
    assert_true(merge_grid * per_block >= ch->num_rows * heads);
}

/* ---- tiles ---- */

static void batch_tiles_are_ascending_and_fit(void **state) {
    (void)state;
    for (int d = 16; d <= 256; d += 16) {
        for (int smem = 99 * 1024 - 1024; smem <= H200_SMEM; smem += H200_SMEM - 98 * 1024) {
            cinfer__prefill_config_t cfgs[3], def;
            int n = 0;
            cinfer__prefill_batch_configs(d, smem, cfgs, &n);
            cinfer__prefill_default_config(d, smem, &def);
            assert_true(n >= 1 && n <= 3);
            assert_int_equal(cfgs[0].tile_q, 32);
            assert_int_equal(cfgs[0].warps, 2);
            assert_memory_equal(&cfgs[n - 1], &def, sizeof def);
            for (int i = 0; i < n; i++) {
                assert_true(cinfer__prefill_smem_bytes(d, &cfgs[i]) <= (size_t)smem);
                /* The same tiles serve fp8 K/V (fp8 stages plus the 16-bit tiles they become). */
                assert_true(cinfer__prefill_kv_smem_bytes(d, CINFER__DT_E4M3, &cfgs[i]) <=
                            (size_t)smem);
                if (i > 0)
                    assert_true(cfgs[i].tile_q > cfgs[i - 1].tile_q);
                if (i < n - 1) /* the small tiles keep 16 rows per warp */
                    assert_int_equal(cfgs[i].tile_q, 16 * cfgs[i].warps);
                cinfer__spec_t spec;
                cinfer__spec_init(&spec, CINFER__OP_PREFILL);
                spec.backend = CINFER__BACKEND_SM80;
                spec.dtype_q = spec.dtype_kv = spec.dtype_o = CINFER__DT_BF16;
                spec.head_dim_qk = spec.head_dim_vo = d;
                spec.batch = 1;
                spec.paged = 1;
                spec.tile_q = cfgs[i].tile_q;
                spec.tile_kv = cfgs[i].tile_kv;
                spec.warps = cfgs[i].warps;
                spec.stages = cfgs[i].stages;
                if (cinfer__spec_validate(&spec) != CINFER_STATUS_SUCCESS)
                    fail_msg("D %d tile %d: %s", d, i, cinfer_last_error());
            }
        }
    }
}

/* The GPU tests' override of the default tiles reaches the batch tiles, and NULL restores them. */
static void test_default_tiles_override(void **state) {
    (void)state;
    const cinfer__prefill_config_t wide = {.tile_q = 128, .tile_kv = 64, .warps = 4, .stages = 2};
    cinfer__prefill_config_t def, got, cfgs[3];
    int n = 0;
    cinfer__prefill_default_config(128, H200_SMEM, &def);
    cinfer__prefill_test_default_config(&wide);
    cinfer__prefill_default_config(128, H200_SMEM, &got);
    assert_memory_equal(&got, &wide, sizeof got);
    cinfer__prefill_batch_configs(128, H200_SMEM, cfgs, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(&cfgs[n - 1], &wide, sizeof wide);
    cinfer__prefill_test_default_config(NULL);
    cinfer__prefill_default_config(128, H200_SMEM, &got);
    assert_memory_equal(&got, &def, sizeof got);
}

static void spec_fields_batch_and_paged(void **state) {
    (void)state;
    cinfer__spec_t spec;
    assert_int_equal(cinfer__spec_parse("prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,"
                                        "batch=1,paged=1,tile_q=32,tile_kv=32,warps=2,stages=2",
                                        &spec),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(cinfer__spec_validate(&spec), CINFER_STATUS_SUCCESS);
    cinfer__rendered_t r;
    assert_int_equal(cinfer__spec_render(&spec, "sm_90a", 13000, &r), CINFER_STATUS_SUCCESS);
    assert_non_null(strstr(r.name, "_paged_batch_"));
    assert_non_null(strstr(r.source.data, "#define CINFER_BATCH 1\n"));
    assert_non_null(strstr(r.source.data, "#define CINFER_PAGED 1\n"));
    cinfer__rendered_free(&r);
    /* Single prefill's names carry neither token. */
    spec.batch = 0;
    spec.paged = 0;
    assert_int_equal(cinfer__spec_render(&spec, "sm_90a", 13000, &r), CINFER_STATUS_SUCCESS);
    assert_null(strstr(r.name, "ragged"));
    assert_null(strstr(r.name, "batch"));
    assert_non_null(strstr(r.source.data, "#define CINFER_BATCH 0\n"));
    cinfer__rendered_free(&r);
    spec.paged = 1;
    assert_error(cinfer__spec_validate(&spec), CINFER_STATUS_INVALID_ARGUMENT,
                 "paged 1 needs batch");
    spec.batch = 2;
    assert_error(cinfer__spec_validate(&spec), CINFER_STATUS_INVALID_ARGUMENT, "batch 2");
}

static void tile_is_the_smallest_holding_the_average(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(32, 8, true, -1, false, 1, 64, 1 << 20, false);
    static const int64_t cases[][3] = {
        /* total rows, requests, expected tile index */
        {0, 0, 0},   {1, 1, 0},   {64, 2, 0},       {65, 2, 1},
        {128, 2, 1}, {129, 2, 2}, {64 * 5, 5, 1},   {1000, 1, 2},
        {64, 64, 0}, {33, 1, 1},  {32 * 64, 64, 0}, {32 * 64 + 1, 64, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(cinfer__prefill_choose_tile(&c, cases[i][0], cases[i][1]), cases[i][2]);
    /* Fewer candidates (D = 256: 32 and 64 rows). */
    c.num_tiles = 2;
    assert_int_equal(cinfer__prefill_choose_tile(&c, 1000, 1), 1);
    /* Graph mode: fixed by max_total_qo / max_batch_size, whatever the step. */
    c = config(32, 8, true, -1, false, 1, 64, 64 * 8, true);
    for (int64_t rows = 0; rows < 5000; rows += 777)
        assert_int_equal(cinfer__prefill_choose_tile(&c, rows, 1), 0);
    c = config(32, 8, true, -1, false, 1, 4, 4 * 4096, true);
    assert_int_equal(cinfer__prefill_choose_tile(&c, 1, 1), 2);
}

/* ---- workspace ---- */

/* Single prefill's tile: smaller tiles only where the largest leaves a wave uneven (a short
 * causal prompt); the largest elsewhere, and whenever the smaller one is not a candidate. */
static void single_prefill_tile_by_estimated_time(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(32, 8, true, -1, false, 1, 1, 1 << 20, false);
    const int64_t slots[3] = {0, 264, 264}, only_large[3] = {0, 0, 264};
    assert_int_equal(cinfer__prefill_single_tile(&c, 1024, 1024, slots), 1);
    assert_int_equal(cinfer__prefill_single_tile(&c, 2048, 2048, slots), 2); /* two even waves */
    assert_int_equal(cinfer__prefill_single_tile(&c, 4096, 4096, slots), 2);
    assert_int_equal(cinfer__prefill_single_tile(&c, 16384, 16384, slots), 2);
    assert_int_equal(cinfer__prefill_single_tile(&c, 1024, 1024, only_large), 2);
    /* 512 rows appended to 3.5k cached positions: 4 x 32 CTAs of 128 rows fill half a wave */
    assert_int_equal(cinfer__prefill_single_tile(&c, 512, 4096, slots), 1);
    c.window_left = 1023; /* every row keeps about 1k positions */
    assert_int_equal(cinfer__prefill_single_tile(&c, 16384, 16384, slots), 2);
    c.window_left = -1;
    c.causal = false;
    assert_int_equal(cinfer__prefill_single_tile(&c, 1024, 1024, slots), 2);
    /* nothing to do: any candidate */
    const int t = cinfer__prefill_single_tile(&c, 0, 0, slots);
    assert_true(t == 1 || t == 2);
}

static void layout_is_exact_and_aligned(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(32, 8, true, -1, true, 16, 64, 10000, false);
    /* Zeroed first: the layouts are compared whole below, padding bytes included. */
    cinfer__prefill_layout_t l, g;
    memset(&l, 0, sizeof l);
    memset(&g, 0, sizeof g);
    assert_int_equal(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_SUCCESS);
    /* floor((10000 + 64 * 31) / 32) */
    assert_int_equal(l.work_capacity, (10000 + 64 * 31) / 32);
    assert_int_equal(l.work_offset, CINFER__PREFILL_ALIGN);
    assert_int_equal(l.schedule_bytes,
                     CINFER__PREFILL_ALIGN + (size_t)l.work_capacity * sizeof(cinfer_prefill_work));
    assert_int_equal(l.total_bytes % CINFER__PREFILL_ALIGN, 0);
    assert_true(l.total_bytes >= l.schedule_bytes &&
                l.total_bytes < l.schedule_bytes + CINFER__PREFILL_ALIGN);
    assert_int_equal(sizeof(cinfer_prefill_work), 44);
    assert_int_equal(l.row_capacity, 0);
    assert_int_equal(l.state_capacity, 0);
    /* Without max_ctas (not measured), graph mode or not, nothing splits: the same layout. */
    c.graph = true;
    assert_int_equal(cinfer__prefill_batch_layout(&c, &g), CINFER_STATUS_SUCCESS);
    assert_memory_equal(&g, &l, sizeof g);
    /* Graph mode splits with its fixed tile alone: ceil(10000 / 64) = 157 rows per request on
     * average, so 128 rows, 132 / 32 = 4 items: 4 x 32 x 128 states, 4 x 128 = 512 merge rows. */
    h200_ctas(&c);
    assert_int_equal(cinfer__prefill_choose_tile(&c, 0, 0), 2);
    assert_int_equal(cinfer__prefill_batch_layout(&c, &g), CINFER_STATUS_SUCCESS);
    assert_int_equal(g.work_capacity, l.work_capacity);
    assert_int_equal(g.row_capacity, 512);
    assert_int_equal(g.state_capacity, 4 * 32 * 128);
    assert_int_equal(cinfer__prefill_row_bound(&c), 512);
    assert_int_equal(cinfer__prefill_split_items(&c, 2), 4);
    assert_int_equal(cinfer__prefill_split_items(&c, 0), 0); /* not the fixed tile */
    assert_int_equal(g.total_bytes, g.partial_lse_offset + 4 * 32 * 128 * 4);
    /* Unmergeable variants never split, whatever the device: the unsplit layout. */
    c.no_split = true;
    assert_int_equal(cinfer__prefill_batch_layout(&c, &g), CINFER_STATUS_SUCCESS);
    assert_memory_equal(&g, &l, sizeof g);
    c.graph = false;
    assert_int_equal(cinfer__prefill_batch_layout(&c, &g), CINFER_STATUS_SUCCESS);
    assert_memory_equal(&g, &l, sizeof g);
    /* Split plans: the largest bound over the tiles. Tile 32: 528 / 32 = 16 items, 16 x 32 x 32
     * states, 16 x 32 rows; tile 64: 8 items, 8 x 32 x 64 states, 8 x 64 rows; tile 128: 4, ...
     * all 16384 states and 512 rows; items max(work bound, 16). */
    c.no_split = false;
    assert_int_equal(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, (10000 + 64 * 31) / 32);
    assert_int_equal(l.row_capacity, 512);
    assert_int_equal(l.state_capacity, 16384);
    assert_int_equal(l.merge_offset,
                     CINFER__PREFILL_ALIGN +
                         (l.work_capacity * sizeof(cinfer_prefill_work) + 255) / 256 * 256);
    assert_int_equal(l.rows_offset, l.merge_offset + CINFER__PREFILL_ALIGN);
    assert_int_equal(l.schedule_bytes, l.rows_offset + 512 * sizeof(cinfer_decode_request));
    assert_int_equal(l.partial_o_offset, (l.schedule_bytes + 255) / 256 * 256);
    assert_int_equal(l.partial_lse_offset, l.partial_o_offset + 16384 * 128 * 4);
    assert_int_equal(l.total_bytes, l.partial_lse_offset + 16384 * 4);
    /* Few rows: the states and rows shrink with max_total_qo, the items do not. */
    c.max_total_qo = 3;
    c.max_batch_size = 1;
    assert_int_equal(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, 16);
    assert_int_equal(l.row_capacity, 3);
    assert_int_equal(l.state_capacity, 16 * 32 * 3);
    /* Too many CTAs for one launch. */
    c = config(128, 8, true, -1, false, 1, 1, INT32_MAX, false);
    assert_error(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_UNSUPPORTED, "2^31 - 1");
}

/* The bound is reached: every request one row past a whole number of tiles. */
static void work_bound_is_tight(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(4, 4, false, -1, false, 1, 8, 8 * 33, false);
    c.num_tiles = 1; /* always 32 rows */
    int32_t qo[9], kv[9];
    for (int b = 0; b <= 8; b++) {
        qo[b] = 33 * b;
        kv[b] = 100 * b;
    }
    plan_t p;
    assert_int_equal(make_plan(&c, qo, kv, NULL, 8, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.dst.header->num_work, 16);
    assert_int_equal(cinfer__prefill_work_bound(&c, 32), (8 * 33 + 8 * 31) / 32);
    assert_true(p.dst.header->num_work <= cinfer__prefill_work_bound(&c, 32));
    verify_plan(&c, qo, kv, NULL, 8, &p);
    free_plan(&p);
}

/* ---- plans ---- */

static void ragged_and_paged_lengths(void **state) {
    (void)state;
    /* Paged: 3 requests of 2, 0 and 1 pages of 16; qo_indptr starting at 5. */
    cinfer__prefill_plan_config_t c = config(8, 2, true, -1, true, 16, 4, 1000, false);
    const int32_t qo[] = {5, 25, 26, 26}, kv[] = {3, 5, 5, 6}, last[] = {7, 99, 16};
    plan_t p;
    assert_int_equal(make_plan(&c, qo, kv, last, 3, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.req[0].kv_len, 23);
    assert_int_equal(p.req[1].kv_len, 0); /* no pages: last_page_len ignored */
    assert_int_equal(p.req[2].kv_len, 16);
    assert_int_equal(p.req[0].kv_begin, 3);
    assert_int_equal(p.req[0].qo_begin, 5);
    assert_int_equal(p.req[2].qo_len, 0);
    verify_plan(&c, qo, kv, last, 3, &p);
    free_plan(&p);
    /* Ragged: kv_len is the indptr difference. */
    c = config(8, 2, false, -1, false, 1, 4, 1000, false);
    const int32_t kv2[] = {0, 100, 100, 1000};
    assert_int_equal(make_plan(&c, qo, kv2, NULL, 3, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.req[0].kv_len, 100);
    assert_int_equal(p.req[1].kv_len, 0);
    assert_int_equal(p.req[2].kv_len, 900);
    verify_plan(&c, qo, kv2, NULL, 3, &p);
    free_plan(&p);
}

static void items_sorted_longest_first(void **state) {
    (void)state;
    /* Causal: within a request the last tiles see the most KV; a long request comes first. */
    cinfer__prefill_plan_config_t c = config(4, 1, true, -1, false, 1, 4, 4096, false);
    c.num_tiles = 1;
    const int32_t qo[] = {0, 100, 400, 410}, kv[] = {0, 100, 2400, 2410};
    plan_t p;
    assert_int_equal(make_plan(&c, qo, kv, NULL, 3, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, NULL, 3, &p);
    assert_int_equal(p.dst.work[0].request, 1);
    assert_int_equal(p.dst.work[0].q_begin, 288); /* the last tile of the 300 rows over 2300 keys */
    assert_int_equal(cinfer__prefill_item_cost(&c, &p.dst.work[0], 32), 2300);
    free_plan(&p);
    /* A window caps every item's cost at window + tile rows. */
    c.window_left = 50;
    assert_int_equal(make_plan(&c, qo, kv, NULL, 3, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, NULL, 3, &p);
    for (int i = 0; i < p.dst.header->num_work; i++)
        assert_true(cinfer__prefill_item_cost(&c, &p.dst.work[i], 32) <= 50 + 32);
    free_plan(&p);
    /* qo_len > kv_len under causal: the first rows keep nothing, their items cost 0. */
    c.window_left = -1;
    const int32_t qo2[] = {0, 100}, kv2[] = {0, 10};
    assert_int_equal(make_plan(&c, qo2, kv2, NULL, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo2, kv2, NULL, 1, &p);
    assert_int_equal(cinfer__prefill_item_cost(&c, &p.dst.work[p.dst.header->num_work - 1], 32), 0);
    free_plan(&p);
}

static void empty_batches_and_requests(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(4, 2, true, -1, true, 16, 8, 100, false);
    const int32_t zero[] = {0};
    plan_t p;
    assert_int_equal(make_plan(&c, zero, zero, NULL, 0, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.dst.header->num_work, 0);
    assert_int_equal(cinfer__prefill_grid(&c, 32, 0), 0);
    free_plan(&p);
    const int32_t qo[] = {0, 0, 0, 3}, kv[] = {0, 0, 4, 4}, last[] = {0, 5, 0};
    assert_int_equal(make_plan(&c, qo, kv, last, 3, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.dst.header->num_work, 1); /* only request 2 has rows (and kv_len 0) */
    assert_int_equal(p.dst.work[0].kv_len, 0);
    verify_plan(&c, qo, kv, last, 3, &p);
    free_plan(&p);
}

/* Graph mode: the attention and merge grids never change across plans (random batches over
 * random lengths, split or not), and every plan is still covered exactly once (verify_plan). */
static void graph_mode_grid_is_constant(void **state) {
    (void)state;
    for (int measured = 0; measured < 2; measured++) {
        cinfer__prefill_plan_config_t c = config(32, 8, true, -1, true, 16, 16, 16 * 20, true);
        if (measured)
            h200_ctas(&c); /* else max_ctas unknown: nothing splits, no merge launch */
        const int fixed = cinfer__prefill_choose_tile(&c, 0, 0);
        const int64_t grid = cinfer__prefill_grid(&c, c.tile_q[fixed], 0);
        const int64_t merge_grid = cinfer__prefill_merge_grid(&c, 0);
        assert_true(grid > 0);
        /* 20 rows on average: 32-row tiles, 528 / 32 = 16 items, 16 x 32 = 512 rows, capped at
         * the 320 rows of the object. */
        assert_int_equal(fixed, 0);
        assert_int_equal(cinfer__prefill_row_bound(&c), measured ? 320 : 0);
        assert_int_equal(merge_grid, measured ? 320 * 32 / cinfer__decode_merge_rows(128) : 0);
        unsigned long long s = 12345;
        int splits = 0;
        for (int it = 0; it < 80; it++) {
            int32_t qo[17], kv[17], last[16];
            const int batch = 1 + (int)((s = s * 6364136223846793005ull + 1) >> 33) % 16;
            /* Some plans start at a later row of q: split only while qo_indptr[batch] stays
             * within the merge's 320 rows. */
            qo[0] = it % 3 == 0 ? (int32_t)((s >> 40) % 64) : 0;
            kv[0] = 0;
            const bool few = it % 2 == 0; /* few rows over long KV: the split path */
            const int64_t budget = few ? 40 : c.max_total_qo;
            for (int b = 0; b < batch; b++) {
                s = s * 6364136223846793005ull + 1;
                const int64_t room = budget - (qo[b] - qo[0]);
                const int len = (int)((s >> 33) % (uint64_t)(room / (batch - b) + 1));
                qo[b + 1] = qo[b] + len;
                kv[b + 1] = kv[b] + 1 + (int)((s >> 20) % (few ? 600 : 50));
                last[b] = 1 + (int)((s >> 40) % 16);
            }
            plan_t p;
            assert_int_equal(make_plan(&c, qo, kv, last, batch, &p), CINFER_STATUS_SUCCESS);
            assert_int_equal(p.tile, fixed);
            assert_int_equal(cinfer__prefill_grid(&c, c.tile_q[p.tile], p.dst.header->num_work),
                             grid);
            assert_int_equal(cinfer__prefill_merge_grid(&c, p.chunking.num_rows), merge_grid);
            verify_plan(&c, qo, kv, last, batch, &p);
            splits += p.chunking.split;
            free_plan(&p);
        }
        if (measured)
            assert_true(splits >= 20 && splits < 80);
        else
            assert_int_equal(splits, 0);
    }
}

/* The cascade's shared prefix in graph mode (bench/cascade.py with use_cuda_graph): the level's
 * object holds 64 rows of one group; its plans split as eager ones do, inside the grids fixed at
 * create, and later plans with other rows, offsets and lengths replay the same launches. */
static void graph_mode_cascade_prefix_splits(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(32, 8, false, -1, true, 16, 1, 64, true);
    h200_ctas(&c);
    const int per_block = cinfer__decode_merge_rows(128);
    /* 64 rows per group: the 64-row tile, 264 / 32 = 8 items, 8 x 64 rows capped at 64. */
    assert_int_equal(cinfer__prefill_choose_tile(&c, 0, 0), 1);
    assert_int_equal(cinfer__prefill_row_bound(&c), 64);
    const int32_t qo[] = {0, 64}, kv[] = {0, 512}, last[] = {16};
    plan_t p;
    assert_int_equal(make_plan(&c, qo, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, last, 1, &p);
    assert_true(p.chunking.split);
    assert_int_equal(p.chunking.chunk_size, 1024);
    assert_int_equal(p.chunking.num_work, 8);
    assert_int_equal(p.chunking.num_rows, 64);
    assert_int_equal(p.dst.merge->batch_size, 64);
    assert_int_equal(p.layout.state_capacity, 8 * 32 * 64);
    /* max(work bound 1, 8 items) x 32 heads; 64 rows x 32 heads of merge. */
    assert_int_equal(cinfer__prefill_grid(&c, 64, p.chunking.num_work), 256);
    assert_int_equal(cinfer__prefill_merge_grid(&c, p.chunking.num_rows), 64 * 32 / per_block);
    free_plan(&p);
    /* Fewer rows, another prefix length: the same grids. */
    const int32_t qo2[] = {0, 10}, kv2[] = {0, 300}, last2[] = {7};
    assert_int_equal(make_plan(&c, qo2, kv2, last2, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo2, kv2, last2, 1, &p);
    assert_true(p.chunking.split);
    assert_int_equal(p.chunking.num_rows, 10);
    assert_int_equal(cinfer__prefill_grid(&c, 64, p.chunking.num_work), 256);
    free_plan(&p);
    /* Rows 3..40 of q: the merge's rows are 0..40, rows 0..2 skipped. */
    const int32_t qo3[] = {3, 40};
    assert_int_equal(make_plan(&c, qo3, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo3, kv, last, 1, &p);
    assert_true(p.chunking.split);
    assert_int_equal(p.chunking.num_rows, 40);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(p.dst.rows[r].num_chunks, 1);
        assert_int_equal(p.dst.rows[r].partial_base, -1);
    }
    assert_int_equal(p.dst.rows[3].partial_base, 0);
    assert_int_equal(p.dst.rows[3].num_chunks, 8);
    free_plan(&p);
    /* Rows 10..74 lie past the merge's 64 rows: run whole (correct, not split). */
    const int32_t qo4[] = {10, 74};
    assert_int_equal(make_plan(&c, qo4, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo4, kv, last, 1, &p);
    assert_false(p.chunking.split);
    assert_int_equal(p.dst.merge->batch_size, 0);
    assert_int_equal(p.chunking.num_work, 1);
    free_plan(&p);
    /* No rows at all: nothing to merge, the grids unchanged. */
    const int32_t zero[] = {0};
    assert_int_equal(make_plan(&c, zero, zero, NULL, 0, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.dst.merge->batch_size, 0);
    assert_int_equal(cinfer__prefill_grid(&c, 64, 0), 256);
    free_plan(&p);
}

/* ---- split-KV ---- */

/* The cascade's shared prefix (bench/cascade.py): 64 query rows of one group over 8192 positions,
 * 32/8 heads, D = 128, not causal. Unsplit: one 64-row tile, 32 CTAs on 132 SMs. Split: the
 * 64-row kernel holds 264 CTAs, so 8 chunks of 1024 positions, 256 CTAs. */
static void cascade_prefix_fills_the_gpu(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(32, 8, false, -1, true, 16, 1, 64, false);
    const int32_t qo[] = {0, 64}, kv[] = {0, 512}, last[] = {16};
    plan_t p;
    assert_int_equal(make_plan(&c, qo, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    assert_false(p.chunking.split); /* no max_ctas: never split */
    assert_int_equal(p.dst.header->num_work, 1);
    free_plan(&p);
    h200_ctas(&c);
    assert_int_equal(make_plan(&c, qo, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, last, 1, &p);
    assert_int_equal(p.tile, 1);
    assert_split(&c, &p, 1024, 8, 8, 64, 64 * 32 * 8, 256);
    assert_int_equal(p.dst.header->num_work, 8);
    const int per_block = cinfer__decode_merge_rows(128); /* (row, head) pairs per merge block */
    assert_int_equal(cinfer__prefill_merge_grid(&c, p.chunking.num_rows),
                     (64 * 32 + per_block - 1) / per_block);
    for (int i = 0; i < 8; i++) {
        const cinfer_prefill_work *w = &p.dst.work[i];
        assert_int_equal(w->chunk_end - w->chunk_begin, 1024);
        assert_int_equal(w->chunk_begin, w->chunk * 1024);
        assert_int_equal(w->partial, w->chunk);
        assert_int_equal(w->num_chunks, 8);
    }
    /* Row 5's states for head 3: slots 5 x 32 x 8 + 3 x 8 + c. */
    assert_int_equal(p.dst.rows[5].partial_base, 5 * 32 * 8);
    assert_int_equal(p.dst.rows[5].num_chunks, 8);
    assert_int_equal(p.dst.merge->batch_size, 64);
    free_plan(&p);
}

/* C is the smallest multiple of the alignment (>= the minimum) that keeps the CTAs within one
 * wave; a batch that fills the wave, or short KV, is not split; only long tiles are. */
static void chunk_size_is_the_smallest_that_fits(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(32, 8, false, -1, false, 1, 16, 4096, false);
    h200_ctas(&c);
    plan_t p;
    /* One long request among short ones: 4 x 32 CTAs unsplit, room for 8 items, so the long one
     * takes 5 chunks: ceil(16384 / C) <= 5 first holds at C = 52 x 64 = 3328. */
    const int32_t qo[] = {0, 64, 128, 192, 256}, kv[] = {0, 16384, 16484, 16584, 16684};
    assert_int_equal(make_plan(&c, qo, kv, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, NULL, 4, &p);
    assert_int_equal(p.tile, 1);
    assert_int_equal(p.chunking.chunk_size, 3328);
    assert_int_equal(p.chunking.num_work, 8);
    assert_int_equal(p.chunking.max_chunks, 5);
    assert_int_equal(p.chunking.num_states, 64 * 32 * 5);
    assert_int_equal(p.dst.rows[64].partial_base, -1); /* request 1's rows are not split */
    assert_int_equal(p.dst.rows[64].num_chunks, 1);
    /* Minimal: one alignment step less needs more CTAs than a wave. */
    assert_true((4 * 64 + 3 + 3) * 32 > c.max_ctas[1]); /* ceil(16384 / 3264) = 6 chunks */
    free_plan(&p);
    /* A longer minimum chunk (cinfer__batch_prefill_test_min_chunk) splits less: 4 chunks of
     * 4096; one below the built-in minimum changes nothing. */
    c.min_chunk = 4096;
    assert_int_equal(make_plan(&c, qo, kv, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, NULL, 4, &p);
    assert_int_equal(p.chunking.chunk_size, 4096);
    assert_int_equal(p.chunking.max_chunks, 4);
    assert_int_equal(p.chunking.num_work, 7);
    free_plan(&p);
    c.min_chunk = 100;
    assert_int_equal(make_plan(&c, qo, kv, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.chunking.chunk_size, 3328);
    free_plan(&p);
    /* At least the whole range: not split. */
    c.min_chunk = 16384;
    assert_int_equal(make_plan(&c, qo, kv, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    assert_false(p.chunking.split);
    free_plan(&p);
    c.min_chunk = 0;
    /* The KV range at or below the minimum chunk: not split. */
    const int32_t kv_short[] = {0, 512, 1024, 1536, 2048};
    assert_int_equal(make_plan(&c, qo, kv_short, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    assert_false(p.chunking.split);
    free_plan(&p);
    /* Just past it: the minimum chunk. */
    const int32_t kv_600[] = {0, 600, 1200, 1800, 2400};
    assert_int_equal(make_plan(&c, qo, kv_600, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv_600, NULL, 4, &p);
    assert_int_equal(p.chunking.chunk_size, CINFER__PREFILL_CHUNK_MIN);
    assert_int_equal(p.chunking.num_work, 8);
    free_plan(&p);
    /* An object's own floor (MLA's chunk_floor, 128) in place of the minimum: the smallest
     * multiple of 64 from it whose chunks fit a wave, 320 (2 chunks a request: 8 items x 32
     * heads = 256 CTAs; 256 would take 3, 384 CTAs). */
    c.chunk_floor = 128;
    assert_true(c.max_ctas[1] >= 256 && c.max_ctas[1] < 384);
    assert_int_equal(make_plan(&c, qo, kv_600, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv_600, NULL, 4, &p);
    assert_int_equal(p.chunking.chunk_size, 320);
    assert_int_equal(p.chunking.num_work, 8);
    free_plan(&p);
    c.chunk_floor = 0;
    /* Nine 64-row tiles x 32 heads = 288 CTAs: more than a wave of 264, not split. */
    const int32_t qo9[] = {0, 64, 128, 192, 256, 320, 384, 448, 512, 576};
    const int32_t kv9[] = {0,         16384,     2 * 16384, 3 * 16384, 4 * 16384,
                           5 * 16384, 6 * 16384, 7 * 16384, 8 * 16384, 9 * 16384};
    assert_int_equal(make_plan(&c, qo9, kv9, NULL, 9, &p), CINFER_STATUS_SUCCESS);
    assert_false(p.chunking.split);
    assert_int_equal(p.dst.header->num_work, 9);
    free_plan(&p);
    /* A variant whose states cannot be merged: never split. */
    c.no_split = true;
    assert_int_equal(make_plan(&c, qo, kv, NULL, 4, &p), CINFER_STATUS_SUCCESS);
    assert_false(p.chunking.split);
    free_plan(&p);
}

/* Causal chunks past some rows' positions (rows that keep nothing in a chunk), qo_len > kv_len
 * (rows that keep nothing at all), windows (ranges starting inside a chunk), small tiles. */
static void split_masks_and_edges(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(4, 2, true, -1, false, 1, 8, 4096, false);
    h200_ctas(&c);
    plan_t p;
    /* 128 rows over 2112 positions: the last chunk [2048, 2112) is empty for rows 0..63. */
    const int32_t qo[] = {0, 128}, kv[] = {0, 2112};
    assert_int_equal(make_plan(&c, qo, kv, NULL, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, NULL, 1, &p);
    assert_true(p.chunking.split);
    assert_int_equal(p.chunking.chunk_size, 512);
    assert_int_equal(p.chunking.max_chunks, 5);
    int empty_rows = 0;
    for (int i = 0; i < p.dst.header->num_work; i++) {
        const cinfer_prefill_work *w = &p.dst.work[i];
        if (w->chunk_begin == 2048) {
            assert_int_equal(w->chunk_end, 2112);
            for (int r = 0; r < 128; r++)
                empty_rows += r + 2112 - 128 < 2048;
        }
    }
    assert_int_equal(empty_rows, 64);
    free_plan(&p);
    /* qo_len > kv_len, causal: the first tiles keep nothing (one unsplit item each), the last
     * are long enough to split. */
    const int32_t qo2[] = {0, 1100}, kv2[] = {0, 1000};
    assert_int_equal(make_plan(&c, qo2, kv2, NULL, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo2, kv2, NULL, 1, &p);
    assert_true(p.chunking.split);
    free_plan(&p);
    /* A window: the range starts inside an aligned chunk; the first chunk starts below it. */
    c.window_left = 700;
    const int32_t qo3[] = {0, 64, 65}, kv3[] = {0, 8192, 8192 + 3000};
    assert_int_equal(make_plan(&c, qo3, kv3, NULL, 2, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo3, kv3, NULL, 2, &p);
    assert_true(p.chunking.split);
    for (int i = 0; i < p.dst.header->num_work; i++) {
        const cinfer_prefill_work *w = &p.dst.work[i];
        if (w->request == 0 && w->chunk == 0)
            assert_int_equal(w->chunk_begin, (8128 - 700) / 64 * 64);
    }
    free_plan(&p);
    /* Not causal with a window, and the two-warp tile of 32 rows (kv tiles of 32). */
    c.causal = false;
    c.window_left = 1500;
    const int32_t qo4[] = {0, 20, 40}, kv4[] = {0, 5000, 5100};
    assert_int_equal(make_plan(&c, qo4, kv4, NULL, 2, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo4, kv4, NULL, 2, &p);
    assert_int_equal(p.tile, 0);
    assert_true(p.chunking.split);
    free_plan(&p);
    /* Paged, odd page size, qo_indptr starting past 0: merge rows count from qo_indptr[0]. */
    c = config(8, 8, true, -1, true, 7, 4, 100, false);
    h200_ctas(&c);
    const int32_t qo5[] = {9, 10, 12, 12}, kv5[] = {3, 703, 1003, 1004}, last5[] = {5, 7, 1};
    assert_int_equal(make_plan(&c, qo5, kv5, last5, 3, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo5, kv5, last5, 3, &p);
    assert_true(p.chunking.split);
    assert_int_equal(p.chunking.num_rows, 3);
    free_plan(&p);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void random_batches(void **state) {
    (void)state;
    uint64_t s = 0x5eed;
    int splits = 0, graph_splits = 0;
#define NEXT() lcg(&s)
    for (int it = 0; it < 300; it++) {
        const bool paged = NEXT() % 2, causal = NEXT() % 2, graph = NEXT() % 4 == 0;
        const int page = 1 + (int)(NEXT() % 256);
        const int window = NEXT() % 3 == 0 ? (int)(NEXT() % 500) : -1;
        const int max_batch = 1 + (int)(NEXT() % 64);
        const int batch = (int)(NEXT() % (uint64_t)(max_batch + 1));
        int32_t *qo = calloc((size_t)batch + 1, 4), *kv = calloc((size_t)batch + 1, 4),
                *last = calloc((size_t)batch + 1, 4);
        qo[0] = (int32_t)(NEXT() % 7);
        kv[0] = (int32_t)(NEXT() % 9);
        const int short_queries = NEXT() % 2;
        for (int b = 0; b < batch; b++) {
            const int qo_len = short_queries ? (int)(NEXT() % 20) : (int)(NEXT() % 1100);
            const int kv_len = (int)(NEXT() % (NEXT() % 4 == 0 ? 20000 : 4100));
            qo[b + 1] = qo[b] + qo_len;
            if (paged) {
                const int pages = (kv_len + page - 1) / page;
                kv[b + 1] = kv[b] + pages;
                last[b] = pages ? kv_len - (pages - 1) * page : (int32_t)(NEXT() % 1000);
            } else {
                kv[b + 1] = kv[b] + kv_len;
            }
        }
        const int64_t total = qo[batch] - qo[0];
        cinfer__prefill_plan_config_t c =
            config(1 + (int)(NEXT() % 8), 1, causal, window, paged, page, max_batch,
                   total + (int64_t)(NEXT() % 100) + 1, graph);
        c.num_tiles = 1 + (int)(NEXT() % 3);
        /* Devices from one SM to an H200's worth of resident CTAs; some variants cannot split. */
        for (int t = 0; t < 3; t++)
            c.max_ctas[t] = (int)(NEXT() % 600);
        c.no_split = NEXT() % 8 == 0;
        if (NEXT() % 2)
            c.tile_kv[2] = 128; /* chunks then align to 128 */
        plan_t p;
        if (make_plan(&c, qo, kv, paged ? last : NULL, batch, &p) != CINFER_STATUS_SUCCESS)
            fail_msg("iteration %d: %s", it, cinfer_last_error());
        verify_plan(&c, qo, kv, paged ? last : NULL, batch, &p);
        splits += p.chunking.split;
        graph_splits += p.chunking.split && graph;
        free_plan(&p);
        free(qo);
        free(kv);
        free(last);
    }
#undef NEXT
    /* The split path is exercised, graph mode's too, and most batches are not split. */
    assert_true(splits >= 30 && splits <= 200);
    assert_true(graph_splits >= 5);
}

/* ---- GQA packing ---- */

/* c packing G query heads per KV head (as ops/prefill.c configures it): its kernels' 32-, 64- and
 * 128-row tiles hold floor(rows / G) tokens each, and an item runs Hk CTAs. */
static cinfer__prefill_plan_config_t packed(cinfer__prefill_plan_config_t c, int group) {
    c.group = group;
    for (int i = 0; i < CINFER__PREFILL_MAX_TILES; i++)
        c.tile_q[i] /= group;
    return c;
}

/* The cascade's shared prefix packed: 64 tokens x 4 heads of each of the 8 KV heads are 256 rows,
 * two 128-row tiles of 32 tokens (16 CTAs instead of 32 half-empty ones unpacked); split, the
 * 128-row kernel's 132 resident CTAs take 16 items: 8 chunks of 1024 per tile, 128 CTAs. The
 * partial states and merge rows are those of the unpacked plan (per token and query head). */
static void packed_cascade_prefix(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = packed(config(32, 8, false, -1, true, 16, 1, 64, false), 4);
    const int32_t qo[] = {0, 64}, kv[] = {0, 512}, last[] = {16};
    plan_t p;
    assert_int_equal(cinfer__prefill_cta_heads(&c), 8);
    assert_int_equal(make_plan(&c, qo, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, last, 1, &p);
    assert_int_equal(p.tile, 2);
    assert_false(p.chunking.split); /* no max_ctas: never split */
    assert_int_equal(p.dst.header->num_work, 2);
    assert_int_equal(cinfer__prefill_grid(&c, c.tile_q[p.tile], 2), 16);
    free_plan(&p);
    h200_ctas(&c);
    assert_int_equal(cinfer__prefill_split_items(&c, 2), 16);
    assert_int_equal(make_plan(&c, qo, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, last, 1, &p);
    assert_split(&c, &p, 1024, 16, 8, 64, 64 * 32 * 8, 128);
    assert_int_equal(p.dst.rows[33].partial_base, 32 * 32 * 8 + 1 * 32 * 8);
    free_plan(&p);
    /* Graph mode: the same split inside grids fixed at create (16 items x 8 KV heads). */
    c.graph = true;
    assert_int_equal(cinfer__prefill_choose_tile(&c, 0, 0), 2);
    assert_int_equal(cinfer__prefill_row_bound(&c), 64);
    const int32_t qo2[] = {0, 10}, kv2[] = {0, 300}, last2[] = {7}, qo3[] = {3, 40};
    const int32_t *qos[] = {qo, qo2, qo3}, *kvs[] = {kv, kv2, kv}, *lasts[] = {last, last2, last};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(make_plan(&c, qos[i], kvs[i], lasts[i], 1, &p), CINFER_STATUS_SUCCESS);
        verify_plan(&c, qos[i], kvs[i], lasts[i], 1, &p);
        assert_true(p.chunking.split);
        assert_int_equal(cinfer__prefill_grid(&c, c.tile_q[p.tile], p.chunking.num_work), 128);
        free_plan(&p);
    }
}

/* The same prefix with the turn-taking tiles as a fourth candidate (ops/prefill.c adds them at
 * D = 128 with 16-bit K/V): the 64 tokens x 4 heads of a KV head are one 256-row tile, and its
 * one resident CTA per SM takes 16 items: 16 chunks of 512, 128 CTAs, each K/V position of the
 * prefix read by one CTA instead of two. */
static void packed_cascade_prefix_turn_tiles(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(32, 8, false, -1, true, 16, 1, 64, false);
    c.num_tiles = 4;
    c.tile_q[3] = 256;
    c.tile_kv[3] = 64;
    c = packed(c, 4);
    h200_ctas(&c);
    c.max_ctas[2] = 132 * 2; /* the H200 runs two 128-row CTAs of 102 KiB per SM */
    c.max_ctas[3] = 132;
    assert_int_equal(c.tile_q[3], 64);
    const int32_t qo[] = {0, 64}, kv[] = {0, 512}, last[] = {16};
    plan_t p;
    assert_int_equal(make_plan(&c, qo, kv, last, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv, last, 1, &p);
    assert_int_equal(p.tile, 3);
    assert_split(&c, &p, 512, 16, 16, 64, 64 * 32 * 16, 128);
    free_plan(&p);
    /* A batch whose average is 32 tokens or fewer keeps the 128-row tile. */
    const int32_t qo2[] = {0, 32, 64}, kv2[] = {0, 256, 512}, last2[] = {16, 16};
    c.max_batch_size = 2;
    assert_int_equal(make_plan(&c, qo2, kv2, last2, 2, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo2, kv2, last2, 2, &p);
    assert_int_equal(p.tile, 2);
    free_plan(&p);
    /* 64 tokens over 4096 causal: the 256-row tile would run 8 chunks x 8 KV heads = 64 CTAs,
     * under 3/4 of its 132; the 128-row tile runs 2 tiles x 8 chunks x 8 = 128 (of 264). */
    const int32_t kv3[] = {0, 256}, last3[] = {16};
    c.max_batch_size = 1;
    c.causal = true;
    cinfer__prefill_chunking_t big;
    cinfer__prefill_request_t r = {0, 64, 0, 4096};
    assert_int_equal(cinfer__prefill_plan_chunks(&c, &r, 1, 3, &big), CINFER_STATUS_SUCCESS);
    assert_int_equal(big.num_work, 8);
    assert_int_equal(make_plan(&c, qo, kv3, last3, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv3, last3, 1, &p);
    assert_int_equal(p.tile, 2);
    assert_int_equal(p.chunking.num_work, 16);
    assert_int_equal(cinfer__prefill_grid(&c, c.tile_q[p.tile], p.chunking.num_work), 128);
    free_plan(&p);
    /* A variant that never splits: the same choice on the unsplit plans (the 256-row tile's 8
     * CTAs against the 128-row tile's 16), and none when the resident CTAs are unknown. */
    c.no_split = true;
    assert_int_equal(make_plan(&c, qo, kv3, last3, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv3, last3, 1, &p);
    assert_int_equal(p.tile, 2);
    assert_false(p.chunking.split);
    assert_int_equal(p.chunking.num_work, 2);
    free_plan(&p);
    cinfer__prefill_plan_config_t unknown = c;
    memset(unknown.max_ctas, 0, sizeof unknown.max_ctas);
    assert_int_equal(make_plan(&unknown, qo, kv3, last3, 1, &p), CINFER_STATUS_SUCCESS);
    assert_int_equal(p.tile, 3);
    free_plan(&p);
    c.no_split = false;
    /* Graph mode keeps its fixed tile (the captured kernel cannot change). */
    c.graph = true;
    c.max_batch_size = 1;
    assert_int_equal(cinfer__prefill_choose_tile(&c, 0, 0), 3);
    assert_int_equal(make_plan(&c, qo, kv3, last3, 1, &p), CINFER_STATUS_SUCCESS);
    verify_plan(&c, qo, kv3, last3, 1, &p);
    assert_int_equal(p.tile, 3);
    free_plan(&p);
}

/* The workspace of a packed object: work items of the smallest tile's 8 tokens, split items per
 * Hk CTAs (528 / 8 = 66 of 8 tokens, 33 of 16, 16 of 32), states and rows over those. */
static void packed_layout_is_exact(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c =
        packed(config(32, 8, true, -1, true, 16, 64, 10000, false), 4);
    cinfer__prefill_layout_t l;
    assert_int_equal(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, (10000 + 64 * 7) / 8);
    assert_int_equal(l.state_capacity, 0);
    h200_ctas(&c);
    assert_int_equal(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, (10000 + 64 * 7) / 8);
    assert_int_equal(l.row_capacity, 528);
    assert_int_equal(l.state_capacity, 66 * 32 * 8);
    assert_int_equal(l.total_bytes, l.partial_lse_offset + 66 * 32 * 8 * 4);
    /* G = 32 in a 32-row tile: one token per item, Hk = 1 CTA each. */
    c = packed(config(32, 1, true, -1, false, 1, 4, 100, false), 32);
    assert_int_equal(c.tile_q[0], 1);
    assert_int_equal(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(l.work_capacity, 100);
}

/* Random batches planned packed (G of 2 to 32, some not dividing the tiles, as the test switch
 * allows), graph mode and split-KV included: every (row, head, KV position) exactly once. */
static void packed_random_batches(void **state) {
    (void)state;
    static const int groups[] = {2, 4, 8, 16, 32, 3, 5, 6, 7};
    uint64_t s = 0x9ac4;
    int splits = 0;
#define NEXT() lcg(&s)
    for (int it = 0; it < 200; it++) {
        const bool paged = NEXT() % 2, causal = NEXT() % 2, graph = NEXT() % 4 == 0;
        const int page = 1 + (int)(NEXT() % 64);
        const int window = NEXT() % 3 == 0 ? (int)(NEXT() % 500) : -1;
        const int max_batch = 1 + (int)(NEXT() % 32);
        const int batch = (int)(NEXT() % (uint64_t)(max_batch + 1));
        int32_t *qo = calloc((size_t)batch + 1, 4), *kv = calloc((size_t)batch + 1, 4),
                *last = calloc((size_t)batch + 1, 4);
        qo[0] = (int32_t)(NEXT() % 7);
        const int short_queries = NEXT() % 2;
        for (int b = 0; b < batch; b++) {
            const int qo_len = short_queries ? (int)(NEXT() % 20) : (int)(NEXT() % 700);
            const int kv_len = (int)(NEXT() % (NEXT() % 4 == 0 ? 20000 : 3000));
            qo[b + 1] = qo[b] + qo_len;
            const int pages = paged ? (kv_len + page - 1) / page : kv_len;
            kv[b + 1] = kv[b] + pages;
            last[b] = paged && pages ? kv_len - (pages - 1) * page : 1;
        }
        const int group = groups[NEXT() % (sizeof groups / sizeof groups[0])];
        const int hk = 1 + (int)(NEXT() % 3);
        cinfer__prefill_plan_config_t c =
            packed(config(group * hk, hk, causal, window, paged, page, max_batch,
                          qo[batch] - qo[0] + (int64_t)(NEXT() % 50) + 1, graph),
                   group);
        c.num_tiles = 1 + (int)(NEXT() % 3);
        for (int t = 0; t < 3; t++)
            c.max_ctas[t] = (int)(NEXT() % 600);
        plan_t p;
        if (make_plan(&c, qo, kv, paged ? last : NULL, batch, &p) != CINFER_STATUS_SUCCESS)
            fail_msg("iteration %d: %s", it, cinfer_last_error());
        verify_plan(&c, qo, kv, paged ? last : NULL, batch, &p);
        splits += p.chunking.split;
        free_plan(&p);
        free(qo);
        free(kv);
        free(last);
    }
#undef NEXT
    assert_true(splits >= 20);
}

/*
 * The planner's argument for packing whenever G divides every tile (prefill_plan.h): for any
 * batch, the packed plan's CTAs pad no more rows, visit no more KV positions (summed over CTAs:
 * K/V loaded), and do no more rows x positions (the mmas) than the unpacked plan's.
 */
static void packing_never_costs_more(void **state) {
    (void)state;
    uint64_t s = 0x7e57;
#define NEXT() lcg(&s)
    for (int it = 0; it < 300; it++) {
        const int group = 2 << (NEXT() % 3); /* 2, 4, 8 */
        const bool causal = NEXT() % 2;
        const int window = NEXT() % 3 == 0 ? (int)(NEXT() % 700) : -1;
        const int batch = 1 + (int)(NEXT() % 12);
        int32_t qo[13], kv[13];
        qo[0] = kv[0] = 0;
        const int scale = (int)(NEXT() % 3);
        for (int b = 0; b < batch; b++) {
            const int qo_len = (int)(NEXT() % (scale == 0 ? 8 : scale == 1 ? 80 : 600));
            qo[b + 1] = qo[b] + qo_len;
            kv[b + 1] = kv[b] + qo_len + (int)(NEXT() % 3000);
        }
        const cinfer__prefill_plan_config_t u =
            config(8 * group, 8, causal, window, false, 1, batch, qo[batch] + 1, false);
        cinfer__prefill_plan_config_t pk = packed(u, group);
        const int num_tiles = 1 + (int)(NEXT() % 3);
        pk.num_tiles = num_tiles;
        cinfer__prefill_plan_config_t uu = u;
        uu.num_tiles = num_tiles;
        int64_t rows[2] = {0, 0}, loads[2] = {0, 0}, work[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            const cinfer__prefill_plan_config_t *c = k ? &pk : &uu;
            plan_t p;
            assert_int_equal(make_plan(c, qo, kv, NULL, batch, &p), CINFER_STATUS_SUCCESS);
            verify_plan(c, qo, kv, NULL, batch, &p);
            const int kernel_rows = c->tile_q[p.tile] * (k ? group : 1);
            for (int i = 0; i < p.dst.header->num_work; i++) {
                const int64_t cost =
                    cinfer__prefill_item_cost(c, &p.dst.work[i], c->tile_q[p.tile]);
                rows[k] += kernel_rows * cinfer__prefill_cta_heads(c);
                loads[k] += cost * cinfer__prefill_cta_heads(c);
                work[k] += cost * kernel_rows * cinfer__prefill_cta_heads(c);
            }
            free_plan(&p);
        }
        if (rows[1] > rows[0] || loads[1] > loads[0] || work[1] > work[0])
            fail_msg("iteration %d (G %d): packed rows / loads / work %lld / %lld / %lld, unpacked "
                     "%lld / %lld / %lld",
                     it, group, (long long)rows[1], (long long)loads[1], (long long)work[1],
                     (long long)rows[0], (long long)loads[0], (long long)work[0]);
    }
#undef NEXT
}

/* ---- argument errors ---- */

static void plan_argument_errors(void **state) {
    (void)state;
    cinfer__prefill_plan_config_t c = config(4, 2, true, -1, true, 16, 4, 100, false);
    cinfer__prefill_request_t req[8];
    const int32_t qo[] = {0, 10, 20}, kv[] = {0, 2, 3}, last[] = {16, 1};
    assert_int_equal(cinfer__prefill_requests(&c, qo, kv, last, 2, req), CINFER_STATUS_SUCCESS);
    assert_error(cinfer__prefill_requests(&c, qo, kv, last, 5, req), CINFER_STATUS_INVALID_ARGUMENT,
                 "batch_size = 5, expected 0..4");
    assert_error(cinfer__prefill_requests(&c, qo, kv, last, -1, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "batch_size = -1");
    assert_error(cinfer__prefill_requests(&c, NULL, kv, last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "qo_indptr is NULL, expected 3");
    assert_error(cinfer__prefill_requests(&c, qo, NULL, last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_indptr is NULL");
    assert_error(cinfer__prefill_requests(&c, qo, kv, NULL, 2, req), CINFER_STATUS_INVALID_ARGUMENT,
                 "kv_last_page_len is NULL");
    const int32_t neg[] = {-1, 10, 20};
    assert_error(cinfer__prefill_requests(&c, neg, kv, last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "qo_indptr[0] = -1, expected >= 0");
    const int32_t down[] = {0, 10, 9};
    assert_error(cinfer__prefill_requests(&c, down, kv, last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "qo_indptr[2] = 9 < qo_indptr[1] = 10");
    assert_error(cinfer__prefill_requests(&c, qo, down, last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_indptr is not monotone");
    const int32_t bad_last[] = {17, 1};
    assert_error(cinfer__prefill_requests(&c, qo, kv, bad_last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_last_page_len[0] = 17, expected 1..16");
    const int32_t zero_last[] = {16, 0};
    assert_error(cinfer__prefill_requests(&c, qo, kv, zero_last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_last_page_len[1] = 0");
    const int32_t many[] = {0, 60, 101};
    assert_error(cinfer__prefill_requests(&c, many, kv, last, 2, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "101 query rows, expected at most 100");
    /* Lengths of 2^30 and more. */
    c.max_total_qo = INT32_MAX;
    const int32_t huge_qo[] = {0, 1 << 30};
    const int32_t one[] = {0, 1}, last1[] = {1};
    assert_error(cinfer__prefill_requests(&c, huge_qo, one, last1, 1, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "qo_len = 1073741824");
    const int32_t pages[] = {0, (1 << 26) + 1};
    assert_error(cinfer__prefill_requests(&c, one, pages, last1, 1, req),
                 CINFER_STATUS_INVALID_ARGUMENT, "kv_len = 1073741825");
    /* Ragged: kv_last_page_len must be NULL. */
    c = config(4, 2, true, -1, false, 1, 4, 100, false);
    assert_error(cinfer__prefill_requests(&c, qo, kv, last, 2, req), CINFER_STATUS_INVALID_ARGUMENT,
                 "expected NULL for a ragged KV");
    assert_int_equal(cinfer__prefill_requests(&c, qo, kv, NULL, 2, req), CINFER_STATUS_SUCCESS);
}

static cinfer_attention_options_t good_options(void) {
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = 32;
    o.num_kv_heads = 8;
    o.head_dim = 128;
    o.max_batch_size = 16;
    return o;
}

/* A context with only the properties the setup reads (no device is needed for the size). */
static cinfer_context_t fake_context(void) {
    cinfer_context_t ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.max_smem_per_block_optin = 232448;
    return ctx;
}

/*
 * Objects whose plans cannot split (variants without softmax or with an output transform) size
 * their workspace without a device; the others, CUDA-graph mode included, load their kernels to
 * measure max_ctas (the GPU suite allocates exactly what they report).
 */
static void workspace_size_is_the_layout(void **state) {
    (void)state;
    cinfer_context_t ctx = fake_context();
    cinfer_attention_options_t o = good_options();
    o.variant = cinfer_variant_builtin("sigmoid");
    size_t bytes = 0;
    assert_int_equal(
        cinfer_batch_prefill_workspace_size(&ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 4096, &bytes),
        CINFER_STATUS_SUCCESS);
    /* 32 / 8 heads: packed, four heads per KV head (prefill_plan.h). */
    cinfer__prefill_plan_config_t c = packed(config(32, 8, true, -1, true, 16, 16, 4096, false), 4);
    c.no_split = true;
    cinfer__prefill_layout_t l;
    assert_int_equal(cinfer__prefill_batch_layout(&c, &l), CINFER_STATUS_SUCCESS);
    assert_int_equal(bytes, l.total_bytes);
    /* The unsplit size does not depend on storage or causal, nor on graph mode. */
    size_t other = 0;
    assert_int_equal(
        cinfer_batch_prefill_workspace_size(&ctx, &o, CINFER_KV_STORAGE_RAGGED, 0, 4096, &other),
        CINFER_STATUS_SUCCESS);
    assert_int_equal(other, bytes);
    o.use_cuda_graph = 1;
    assert_int_equal(
        cinfer_batch_prefill_workspace_size(&ctx, &o, CINFER_KV_STORAGE_RAGGED, 0, 4096, &other),
        CINFER_STATUS_SUCCESS);
    assert_int_equal(other, bytes);
    /* Splittable objects, graph mode or not, need the device (this context has none). */
    o.variant = NULL;
    assert_int_not_equal(
        cinfer_batch_prefill_workspace_size(&ctx, &o, CINFER_KV_STORAGE_RAGGED, 0, 4096, &other),
        CINFER_STATUS_SUCCESS);
    /* The kernels create loads: three tiles and the merge kernel, or graph mode's one tile and
     * the merge kernel. */
    cinfer__spec_t specs[CINFER__BATCH_PREFILL_MAX_SPECS];
    int n = 0;
    assert_int_equal(
        cinfer__batch_prefill_kernel_specs(&ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 4096, specs, &n),
        CINFER_STATUS_SUCCESS);
    assert_int_equal(n, 2);
    /* 4096 rows over 16 requests, 256 on average: the turn-taking tile (256 rows of 64 tokens) */
    assert_int_equal(specs[0].tile_q, 256);
    assert_int_equal(specs[0].warps, 8);
    assert_int_equal(specs[0].gqa_pack, 4);
    assert_int_equal(specs[0].batch, 1);
    assert_int_equal(specs[0].paged, 1);
    assert_int_equal(specs[0].mask, CINFER__MASK_CAUSAL);
    assert_int_equal(specs[1].op, CINFER__OP_DECODE_MERGE);
    /* Graph mode with a variant that cannot split: the tile alone. */
    o.variant = cinfer_variant_builtin("sigmoid");
    assert_int_equal(
        cinfer__batch_prefill_kernel_specs(&ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 4096, specs, &n),
        CINFER_STATUS_SUCCESS);
    assert_int_equal(n, 1);
    o.variant = NULL;
    o.use_cuda_graph = 0;
    assert_int_equal(
        cinfer__batch_prefill_kernel_specs(&ctx, &o, CINFER_KV_STORAGE_RAGGED, 0, 4096, specs, &n),
        CINFER_STATUS_SUCCESS);
    /* Four tiles (32, 64 and 128 rows, and the turn-taking 256) and the merge kernel. */
    assert_int_equal(n, 5);
    static const int rows[] = {32, 64, 128, 256};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(specs[i].op, CINFER__OP_PREFILL);
        assert_int_equal(specs[i].tile_q, rows[i]);
        assert_int_equal(specs[i].gqa_pack, 4);
        assert_int_equal(specs[i].paged, 0);
        assert_int_equal(specs[i].mask, CINFER__MASK_NONE);
        assert_int_equal(cinfer__spec_validate(&specs[i]), CINFER_STATUS_SUCCESS);
    }
    assert_int_equal(specs[4].op, CINFER__OP_DECODE_MERGE);
    assert_int_equal(specs[4].head_dim_vo, 128);
    assert_int_equal(specs[4].dtype_o, specs[0].dtype_o);
    /* A variant whose states cannot be merged needs no merge kernel. */
    o.variant = cinfer_variant_builtin("sigmoid");
    assert_int_equal(
        cinfer__batch_prefill_kernel_specs(&ctx, &o, CINFER_KV_STORAGE_RAGGED, 0, 4096, specs, &n),
        CINFER_STATUS_SUCCESS);
    assert_int_equal(n, 4);
    /* Soft cap, fp8 K/V, in-kernel RoPE and other head dims keep the three four-warp tiles. */
    o.variant = NULL;
    for (int k = 0; k < 4; k++) {
        cinfer_attention_options_t x = o;
        if (k == 0)
            x.logits_soft_cap = 30.0f;
        else if (k == 1)
            x.kv_dtype = (DLDataType){10, 8, 1}; /* float8_e4m3fn */
        else if (k == 2)
            x.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
        else
            x.head_dim = 64;
        assert_int_equal(cinfer__batch_prefill_kernel_specs(&ctx, &x, CINFER_KV_STORAGE_RAGGED, 0,
                                                            4096, specs, &n),
                         CINFER_STATUS_SUCCESS);
        assert_int_equal(n, 4);
        assert_int_equal(specs[2].tile_q, 128);
        assert_int_equal(specs[3].op, CINFER__OP_DECODE_MERGE);
    }
}

/* On sm_90a the sm90 kernel replaces the 128-row sm80 tile as the largest candidate (no turn-taking
 * tiles then) at D = 64, 128 and 256 (and D_qk / D_vo = 192 / 128, unpacked), with 16-bit or fp8
 * K/V, a soft cap or not, over a ragged K/V or pages of a power of two of 8..256 rows; other page
 * sizes and other head dims keep the sm80 tiles. */
static void sm90_tile_on_sm90a(void **state) {
    (void)state;
    cinfer_context_t ctx = fake_context();
    snprintf(ctx.arch, sizeof ctx.arch, "sm_90a");
    cinfer_attention_options_t o = good_options();
    cinfer__spec_t specs[CINFER__BATCH_PREFILL_MAX_SPECS];
    int n = 0;
    static const struct {
        cinfer_kv_storage_t storage;
        int page_size;
        float soft_cap;
        int head_dim, sm90;
        int head_dim_vo, fp8; /* 0: head_dim; e4m3 K/V */
    } cases[] = {
        {CINFER_KV_STORAGE_RAGGED, 16, 0.0f, 128, 1, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 16, 0.0f, 128, 1, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 8, 0.0f, 128, 1, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 256, 0.0f, 128, 1, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 4, 0.0f, 128, 0, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 17, 0.0f, 128, 0, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 16, 30.0f, 128, 1, 0, 0},
        {CINFER_KV_STORAGE_RAGGED, 16, 0.0f, 64, 1, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 16, 0.0f, 64, 1, 0, 0},
        {CINFER_KV_STORAGE_RAGGED, 16, 0.0f, 96, 0, 0, 0},
        {CINFER_KV_STORAGE_RAGGED, 16, 0.0f, 256, 1, 0, 0},
        {CINFER_KV_STORAGE_PAGED, 32, 0.0f, 256, 1, 0, 0},
        {CINFER_KV_STORAGE_RAGGED, 16, 0.0f, 192, 0, 0, 0},
        {CINFER_KV_STORAGE_RAGGED, 16, 0.0f, 192, 1, 128, 0},
        {CINFER_KV_STORAGE_PAGED, 16, 0.0f, 192, 1, 128, 0},
        {CINFER_KV_STORAGE_PAGED, 17, 0.0f, 192, 0, 128, 0},
        {CINFER_KV_STORAGE_RAGGED, 16, 0.0f, 128, 1, 0, 1},
        {CINFER_KV_STORAGE_PAGED, 16, 30.0f, 128, 1, 0, 1},
        {CINFER_KV_STORAGE_PAGED, 8, 0.0f, 64, 1, 0, 1},
        {CINFER_KV_STORAGE_PAGED, 64, 0.0f, 256, 1, 0, 1},
        {CINFER_KV_STORAGE_PAGED, 5, 0.0f, 128, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cinfer_attention_options_t x = o;
        x.page_size = cases[i].page_size;
        x.logits_soft_cap = cases[i].soft_cap;
        x.head_dim = cases[i].head_dim;
        x.head_dim_vo = cases[i].head_dim_vo;
        if (cases[i].fp8)
            x.kv_dtype = (DLDataType){10, 8, 1}; /* float8_e4m3fn */
        if (cinfer__batch_prefill_kernel_specs(&ctx, &x, cases[i].storage, 1, 4096, specs, &n) !=
            CINFER_STATUS_SUCCESS)
            fail_msg("case %zu: %s", i, cinfer_last_error());
        int sm90 = 0;
        for (int k = 0; k < n; k++) {
            assert_int_equal(cinfer__spec_validate(&specs[k]), CINFER_STATUS_SUCCESS);
            sm90 += specs[k].backend == CINFER__BACKEND_SM90;
        }
        if (sm90 != cases[i].sm90)
            fail_msg("case %zu: %d sm90 specs, expected %d", i, sm90, cases[i].sm90);
        if (cases[i].sm90) {
            /* 32, 64 and the sm90 128-row tile (KV 64 rows at D = 256; above D = 128 after the
             * sm80 tile of 64 rows that is the largest there), then the merge kernel; D_qk !=
             * D_vo never packs */
            assert_int_equal(n, 4);
            assert_int_equal(specs[2].tile_q, 128);
            assert_int_equal(specs[2].tile_kv, cases[i].head_dim == 256 ? 64 : 128);
            assert_int_equal(specs[2].gqa_pack, cases[i].head_dim_vo ? 0 : 4);
            assert_int_equal(specs[2].dtype_kv, cases[i].fp8 ? CINFER__DT_E4M3 : CINFER__DT_BF16);
            assert_int_equal(specs[3].op, CINFER__OP_DECODE_MERGE);
        }
    }
    /* Variants: ALiBi, sinks and a custom mask take it; sigmoid (no softmax) and dump_logits (a
     * logits transform) keep the sm80 tiles. */
    static const struct {
        const char *name;
        float soft_cap;
        int sm90;
    } variants[] = {{"alibi", 0.0f, 1},
                    {"sinks", 0.0f, 1},
                    {"custom_mask", 0.0f, 1},
                    {"sigmoid", 0.0f, 0},
                    {"dump_logits", 0.0f, 0}};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        cinfer_attention_options_t x = o;
        x.variant = cinfer_variant_builtin(variants[i].name);
        assert_non_null(x.variant);
        x.logits_soft_cap = variants[i].soft_cap;
        if (cinfer__batch_prefill_kernel_specs(&ctx, &x, CINFER_KV_STORAGE_RAGGED, 1, 4096, specs,
                                               &n) != CINFER_STATUS_SUCCESS)
            fail_msg("variant %s, soft cap %g: %s", variants[i].name, (double)variants[i].soft_cap,
                     cinfer_last_error());
        int sm90 = 0;
        for (int k = 0; k < n; k++)
            sm90 += specs[k].backend == CINFER__BACKEND_SM90;
        if (sm90 != variants[i].sm90)
            fail_msg("variant %s, soft cap %g: %d sm90 specs, expected %d", variants[i].name,
                     (double)variants[i].soft_cap, sm90, variants[i].sm90);
    }
    /* A group forced past the tiles' divisors keeps the sm80 tile. */
    o.num_qo_heads = 40;
    cinfer__batch_prefill_test_pack(1);
    assert_int_equal(
        cinfer__batch_prefill_kernel_specs(&ctx, &o, CINFER_KV_STORAGE_RAGGED, 1, 4096, specs, &n),
        CINFER_STATUS_SUCCESS);
    cinfer__batch_prefill_test_pack(0);
    for (int k = 0; k < n; k++)
        assert_int_equal(specs[k].backend == CINFER__BACKEND_SM90, 0);
}

/* GQA packing is decided at create, from the heads and the tiles: G = Hq / Hk >= 2 dividing every
 * candidate tile packs; other G only under the test switch, and never past the smallest tile. */
static void packing_is_decided_at_create(void **state) {
    (void)state;
    cinfer_context_t ctx = fake_context();
    cinfer_attention_options_t o = good_options();
    cinfer__spec_t specs[CINFER__BATCH_PREFILL_MAX_SPECS];
    int n = 0;
    static const struct {
        int hq, hk, mode, want;
    } cases[] = {
        {32, 8, 0, 4},  {32, 8, -1, 0}, {32, 8, 1, 4}, {16, 8, 0, 2}, {64, 8, 0, 8},
        {32, 32, 0, 0}, {32, 32, 1, 0}, {40, 8, 0, 0}, {40, 8, 1, 5}, {21, 3, 1, 7},
        {32, 1, 0, 32}, {64, 1, 0, 0},  {64, 1, 1, 0}, {12, 4, 0, 0}, {12, 4, 1, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        o.num_qo_heads = cases[i].hq;
        o.num_kv_heads = cases[i].hk;
        cinfer__batch_prefill_test_pack(cases[i].mode);
        assert_int_equal(cinfer__batch_prefill_kernel_specs(&ctx, &o, CINFER_KV_STORAGE_PAGED, 1,
                                                            4096, specs, &n),
                         CINFER_STATUS_SUCCESS);
        cinfer__batch_prefill_test_pack(0);
        assert_int_equal(n, 5);
        for (int k = 0; k < 4; k++) {
            if (specs[k].gqa_pack != cases[i].want)
                fail_msg("Hq %d Hk %d mode %d: gqa_pack %d, expected %d", cases[i].hq, cases[i].hk,
                         cases[i].mode, specs[k].gqa_pack, cases[i].want);
            assert_int_equal(cinfer__spec_validate(&specs[k]), CINFER_STATUS_SUCCESS);
        }
    }
    /* Single prefill never packs. */
    o = good_options();
    assert_int_equal(cinfer__prefill_kernel_spec(&o, 1, 232448, &specs[0]), CINFER_STATUS_SUCCESS);
    assert_int_equal(specs[0].gqa_pack, 0);
    /* The spec field: a name token and a define, validated against batch and the tile. */
    cinfer__spec_t spec;
    assert_int_equal(cinfer__spec_parse("prefill:backend=sm80,dtype=bf16,head_dim=128,mask=causal,"
                                        "batch=1,paged=1,tile_q=32,tile_kv=32,warps=2,stages=2,"
                                        "gqa_pack=4",
                                        &spec),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(spec.gqa_pack, 4);
    cinfer__rendered_t r;
    assert_int_equal(cinfer__spec_render(&spec, "sm_90a", 13000, &r), CINFER_STATUS_SUCCESS);
    assert_non_null(strstr(r.name, "_s2_gqa4"));
    assert_non_null(strstr(r.source.data, "#define CINFER_GQA_PACK 4\n"));
    cinfer__rendered_free(&r);
    spec.gqa_pack = 0;
    assert_int_equal(cinfer__spec_render(&spec, "sm_90a", 13000, &r), CINFER_STATUS_SUCCESS);
    assert_null(strstr(r.name, "gqa"));
    assert_non_null(strstr(r.source.data, "#define CINFER_GQA_PACK 0\n"));
    cinfer__rendered_free(&r);
    spec.gqa_pack = 1;
    assert_error(cinfer__spec_validate(&spec), CINFER_STATUS_INVALID_ARGUMENT, "gqa_pack 1");
    spec.gqa_pack = 33;
    assert_error(cinfer__spec_validate(&spec), CINFER_STATUS_INVALID_ARGUMENT, "2..tile_q (32)");
    spec.gqa_pack = 32;
    assert_int_equal(cinfer__spec_validate(&spec), CINFER_STATUS_SUCCESS);
    spec.batch = 0;
    spec.paged = 0;
    assert_error(cinfer__spec_validate(&spec), CINFER_STATUS_INVALID_ARGUMENT, "with batch 1");
}

static void options_rejected_naming_the_field(void **state) {
    (void)state;
    cinfer_context_t ctx = fake_context();
    size_t bytes = 1;
    cinfer_attention_options_t o = good_options();
    /* Accepted options of a variant that cannot split are sized without a device. */
    o.variant = cinfer_variant_builtin("sigmoid");
#define SIZE(opts, storage, causal, total)                                                         \
    cinfer_batch_prefill_workspace_size(&ctx, (opts), (storage), (causal), (total), &bytes)
    assert_error(SIZE(&o, CINFER_KV_STORAGE_PAGED, 2, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "causal = 2, expected 0 or 1");
    assert_int_equal(bytes, 0);
    assert_error(SIZE(&o, (cinfer_kv_storage_t)7, 1, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "storage = 7");
    assert_error(SIZE(&o, CINFER_KV_STORAGE_PAGED, 1, 0), CINFER_STATUS_INVALID_ARGUMENT,
                 "max_total_qo_tokens = 0, expected >= 1");
    assert_error(SIZE(&o, CINFER_KV_STORAGE_PAGED, 1, (int64_t)1 << 32), CINFER_STATUS_UNSUPPORTED,
                 "max_total_qo_tokens = 4294967296");
    assert_error(SIZE(NULL, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "options is NULL");
    cinfer_attention_options_t bad = o;
    bad.page_size = 0;
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "options->page_size = 0, expected 1..256");
    bad.page_size = 257;
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_UNSUPPORTED,
                 "options->page_size = 257");
    /* A ragged KV ignores page_size. */
    assert_int_equal(SIZE(&bad, CINFER_KV_STORAGE_RAGGED, 1, 100), CINFER_STATUS_SUCCESS);
    bad = o;
    bad.max_batch_size = 0;
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "options->max_batch_size = 0, expected >= 1");
    bad = o;
    bad.use_cuda_graph = 2;
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "options->use_cuda_graph = 2");
    bad = o;
    bad.head_dim = 100;
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_UNSUPPORTED,
                 "options->head_dim = 100");
    bad = o;
    bad.kv_dtype = (DLDataType){kDLFloat, 16, 1};
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_UNSUPPORTED,
                 "options->kv_dtype");
    bad = o;
    bad.num_kv_heads = 3;
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "options->num_qo_heads = 32 is not a multiple");
    bad = o;
    bad.variant = cinfer_variant_builtin("alibi");
    bad.logits_soft_cap = 20.0f;
    assert_error(SIZE(&bad, CINFER_KV_STORAGE_PAGED, 1, 100), CINFER_STATUS_INVALID_ARGUMENT,
                 "options->logits_soft_cap = 20 with variant alibi");
#undef SIZE
}

static void public_functions_reject_null_handles(void **state) {
    (void)state;
    cinfer_attention_options_t o = good_options();
    size_t bytes = 1;
    assert_error(
        cinfer_batch_prefill_workspace_size(NULL, &o, CINFER_KV_STORAGE_PAGED, 1, 10, &bytes),
        CINFER_STATUS_INVALID_ARGUMENT, "ctx is NULL");
    assert_int_equal(bytes, 0);
    assert_error(
        cinfer_batch_prefill_workspace_size(NULL, &o, CINFER_KV_STORAGE_PAGED, 1, 10, NULL),
        CINFER_STATUS_INVALID_ARGUMENT, "device_bytes is NULL");
    cinfer_batch_prefill_t *op = (cinfer_batch_prefill_t *)&o;
    assert_error(
        cinfer_batch_prefill_create(NULL, &o, CINFER_KV_STORAGE_PAGED, 1, 10, NULL, 0, &op),
        CINFER_STATUS_INVALID_ARGUMENT, "ctx is NULL");
    assert_null(op);
    assert_error(
        cinfer_batch_prefill_create(NULL, &o, CINFER_KV_STORAGE_PAGED, 1, 10, NULL, 0, NULL),
        CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    /* The workspace is checked before anything is loaded (a variant that cannot split: its
     * size needs no device). */
    cinfer_context_t ctx = fake_context();
    o.variant = cinfer_variant_builtin("sigmoid");
    assert_error(
        cinfer_batch_prefill_create(&ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 10, NULL, 0, &op),
        CINFER_STATUS_INVALID_ARGUMENT, "workspace is NULL");
    assert_error(cinfer_batch_prefill_create(&ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 10,
                                             (void *)(uintptr_t)256, 16, &op),
                 CINFER_STATUS_WORKSPACE_TOO_SMALL, "workspace_bytes = 16, expected at least");
    assert_error(cinfer_batch_prefill_create(&ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 10,
                                             (void *)(uintptr_t)100, 1 << 20, &op),
                 CINFER_STATUS_INVALID_ARGUMENT, "not 256-byte aligned");
    const int32_t indptr[] = {0};
    assert_error(cinfer_batch_prefill_plan(NULL, indptr, indptr, NULL, 0, NULL),
                 CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    assert_error(cinfer_batch_prefill_run(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                 CINFER_STATUS_INVALID_ARGUMENT, "op is NULL");
    cinfer_batch_prefill_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batch_tiles_are_ascending_and_fit),
        cmocka_unit_test(test_default_tiles_override),
        cmocka_unit_test(spec_fields_batch_and_paged),
        cmocka_unit_test(tile_is_the_smallest_holding_the_average),
        cmocka_unit_test(single_prefill_tile_by_estimated_time),
        cmocka_unit_test(layout_is_exact_and_aligned),
        cmocka_unit_test(work_bound_is_tight),
        cmocka_unit_test(ragged_and_paged_lengths),
        cmocka_unit_test(items_sorted_longest_first),
        cmocka_unit_test(empty_batches_and_requests),
        cmocka_unit_test(graph_mode_grid_is_constant),
        cmocka_unit_test(graph_mode_cascade_prefix_splits),
        cmocka_unit_test(cascade_prefix_fills_the_gpu),
        cmocka_unit_test(chunk_size_is_the_smallest_that_fits),
        cmocka_unit_test(split_masks_and_edges),
        cmocka_unit_test(random_batches),
        cmocka_unit_test(packed_cascade_prefix),
        cmocka_unit_test(packed_cascade_prefix_turn_tiles),
        cmocka_unit_test(packed_layout_is_exact),
        cmocka_unit_test(packed_random_batches),
        cmocka_unit_test(packing_never_costs_more),
        cmocka_unit_test(plan_argument_errors),
        cmocka_unit_test(workspace_size_is_the_layout),
        cmocka_unit_test(sm90_tile_on_sm90a),
        cmocka_unit_test(packing_is_decided_at_create),
        cmocka_unit_test(options_rejected_naming_the_field),
        cmocka_unit_test(public_functions_reject_null_handles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
