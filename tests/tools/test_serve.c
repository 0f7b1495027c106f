/*
 * The host side of `cinfer bench serve` (tools/serve/): the trace parser, the model presets and
 * the continuous-batching scheduler, whose every step is replayed against a shadow model of the
 * requests: pages never over-committed or shared, page tables consistent with the lengths, pages
 * of a request never moving, the prefill budget respected, every prompt prefilled before its
 * decodes, every request's tokens all scheduled exactly once, admissions first come first served.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"
#include "support/gpu.h"

#define TEXT(s) (s), strlen(s)

static void expect_error(cinfer_status_t st, cinfer_status_t want, const char *const *needles) {
    if (st != want)
        fail_msg("status %s, expected %s (%s)", cinfer_status_name(st), cinfer_status_name(want),
                 cinfer_last_error());
    for (int i = 0; needles[i]; i++)
        if (!strstr(cinfer_last_error(), needles[i]))
            fail_msg("message \"%s\" lacks \"%s\"", cinfer_last_error(), needles[i]);
}
#define EXPECT_ERROR(st, want, ...)                                                                \
    expect_error((st), (want), (const char *const[]){__VA_ARGS__, NULL})

/* ---- traces ---- */

static void trace_parses_the_azure_format(void **state) {
    (void)state;
    const char *text = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                       "2023-11-16 18:15:46.6805900,374,44\r\n"
                       "\r\n"
                       "2023-11-16 18:15:50.9951690,396,109\r\n"
                       "2023-11-17 00:00:00,\"879\", 0"; /* next day, quotes, blank, no newline */
    serve_trace_t t;
    assert_int_equal(serve_trace_parse(TEXT(text), "t.csv", 0, &t), CINFER_STATUS_SUCCESS);
    assert_int_equal(t.count, 3);
    assert_int_equal(t.requests[0].context_tokens, 374);
    assert_int_equal(t.requests[0].generated_tokens, 44);
    assert_true(t.requests[0].arrival_s == 0.0);
    assert_true(t.requests[1].arrival_s > 4.3145 && t.requests[1].arrival_s < 4.3146);
    assert_int_equal(t.requests[2].context_tokens, 879);
    assert_int_equal(t.requests[2].generated_tokens, 0);
    /* 18:15:46.68 to midnight of the next day. */
    assert_true(t.requests[2].arrival_s > 20653.3 && t.requests[2].arrival_s < 20653.4);
    serve_trace_free(&t);
    serve_trace_free(&t); /* freeing twice is a no-op */

    assert_int_equal(serve_trace_parse(TEXT(text), "t.csv", 2, &t), CINFER_STATUS_SUCCESS);
    assert_int_equal(t.count, 2);
    serve_trace_free(&t);
}

static void trace_columns_by_name_and_numeric_times(void **state) {
    (void)state;
    const char *text = "id,generatedtokens,timestamp,contexttokens\n"
                       "a,5,10.5,100\n"
                       "b,6,12,200\n";
    serve_trace_t t;
    assert_int_equal(serve_trace_parse(TEXT(text), "x", 0, &t), CINFER_STATUS_SUCCESS);
    assert_int_equal(t.count, 2);
    assert_int_equal(t.requests[1].context_tokens, 200);
    assert_int_equal(t.requests[1].generated_tokens, 6);
    assert_true(t.requests[1].arrival_s == 1.5);
    serve_trace_free(&t);
}

static void trace_errors_name_the_line_column_and_value(void **state) {
    (void)state;
    serve_trace_t t;
    EXPECT_ERROR(
        serve_trace_parse(TEXT("TIMESTAMP,Context,GeneratedTokens\n1,2,3\n"), "a.csv", 0, &t),
        CINFER_STATUS_INVALID_ARGUMENT, "a.csv", "line 1", "ContextTokens");
    EXPECT_ERROR(serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\n1,abc,3\n"),
                                   "a.csv", 0, &t),
                 CINFER_STATUS_INVALID_ARGUMENT, "line 2", "ContextTokens = \"abc\"", "[1, 2^30)");
    EXPECT_ERROR(
        serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\n1,0,3\n"), "a", 0, &t),
        CINFER_STATUS_INVALID_ARGUMENT, "ContextTokens = \"0\"");
    EXPECT_ERROR(serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\n1,5,3\n2,5,-1\n"),
                                   "a", 0, &t),
                 CINFER_STATUS_INVALID_ARGUMENT, "line 3", "GeneratedTokens = \"-1\"");
    EXPECT_ERROR(
        serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\nnoon,5,3\n"), "a", 0, &t),
        CINFER_STATUS_INVALID_ARGUMENT, "TIMESTAMP = \"noon\"", "YYYY-MM-DD");
    EXPECT_ERROR(serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                        "2023-13-01 00:00:00,5,3\n"),
                                   "a", 0, &t),
                 CINFER_STATUS_INVALID_ARGUMENT, "TIMESTAMP = \"2023-13-01 00:00:00\"");
    EXPECT_ERROR(
        serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\n1,5\n"), "a", 0, &t),
        CINFER_STATUS_INVALID_ARGUMENT, "line 2", "2 fields", "GeneratedTokens");
    EXPECT_ERROR(serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\n"), "a", 0, &t),
                 CINFER_STATUS_INVALID_ARGUMENT, "no requests");
    EXPECT_ERROR(serve_trace_parse(TEXT("\n\n"), "a", 0, &t), CINFER_STATUS_INVALID_ARGUMENT,
                 "empty");
    EXPECT_ERROR(
        serve_trace_parse(TEXT("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n"), "a", -1, &t),
        CINFER_STATUS_INVALID_ARGUMENT, "max_rows = -1");
    assert_null(t.requests);
    assert_int_equal(t.count, 0);
    EXPECT_ERROR(serve_trace_load("/nonexistent/cinfer/trace.csv", 0, &t), CINFER_STATUS_IO_ERROR,
                 "/nonexistent/cinfer/trace.csv", "cannot open");
}

/*
 * Traces mutated from a valid one (pieces inserted: separators, quotes, NUL and CR bytes, numbers
 * past every integer type, dates out of range; ranges deleted or repeated), each in a heap buffer
 * of exactly its length (no terminating NUL), either parse to requests within the documented
 * bounds or fail with INVALID_ARGUMENT and a message. `make test-sanitize` runs this under ASan
 * and UBSan, where a read past the buffer ends the test.
 */
static void trace_mutations_parse_or_fail_cleanly(void **state) {
    (void)state;
    static const char valid[] = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                "2023-11-16 18:15:46.6805900,374,44\n"
                                "2023-11-16 18:15:50.9951690,396,109\n"
                                "2023-11-16 18:15:51.0000000,879,0\n"
                                "2023-11-16 18:16:03.1200000,91,2012\n";
    /* Pieces to insert; the last is one NUL byte. */
    static const char *pieces[] = {",",
                                   "\n",
                                   "\r\n",
                                   "\"",
                                   "-",
                                   "0",
                                   "-1",
                                   ".",
                                   "1e308",
                                   "nan",
                                   "inf",
                                   "2147483648",
                                   "99999999999999999999999",
                                   " ",
                                   "2023-13-45 25:61:61.9",
                                   "1969-12-31 23:59:59",
                                   "%s%n",
                                   "TIMESTAMP",
                                   "\xff",
                                   "0x1f",
                                   "\0"};
    const size_t num_pieces = sizeof pieces / sizeof pieces[0];
    cinfer_test_rng rng; /* a fixed seed: the same traces on every run */
    cinfer_test_rng_init(&rng, 0xD1B54A32D192ED03ull);
    int parsed = 0, refused = 0;
    char text[1024];
    for (int iter = 0; iter < 4000; iter++) {
        size_t len = sizeof valid - 1;
        memcpy(text, valid, len);
        const int edits = 1 + (int)cinfer_test_rng_below(&rng, 3);
        for (int e = 0; e < edits; e++) {
            const size_t at = cinfer_test_rng_below(&rng, len + 1);
            const uint64_t kind = cinfer_test_rng_below(&rng, 4);
            char next[1024];
            size_t n = 0;
            const char *digit =
                memchr(text + at, '0' + (int)cinfer_test_rng_below(&rng, 10), len - at);
            if (kind == 3 && digit) { /* another number in place of a run of digits */
                static const char *numbers[] = {"0",    "1",     "9",          "60",
                                                "2023", "65536", "2147483647", "2147483648"};
                const char *num =
                    numbers[cinfer_test_rng_below(&rng, sizeof numbers / sizeof numbers[0])];
                const size_t d0 = (size_t)(digit - text);
                size_t d1 = d0;
                while (d1 < len && text[d1] >= '0' && text[d1] <= '9')
                    d1++;
                if (len - (d1 - d0) + strlen(num) > sizeof next)
                    continue;
                memcpy(next, text, d0);
                memcpy(next + d0, num, strlen(num));
                memcpy(next + d0 + strlen(num), text + d1, len - d1);
                n = len - (d1 - d0) + strlen(num);
            } else if (kind == 0 || kind == 3) { /* insert a piece */
                const size_t p = cinfer_test_rng_below(&rng, num_pieces);
                const size_t plen = p == num_pieces - 1 ? 1 : strlen(pieces[p]);
                if (len + plen > sizeof next)
                    continue;
                memcpy(next, text, at);
                memcpy(next + at, pieces[p], plen);
                memcpy(next + at + plen, text + at, len - at);
                n = len + plen;
            } else if (kind == 1) { /* delete up to 8 bytes */
                const size_t r = 1 + cinfer_test_rng_below(&rng, 8);
                const size_t d = r < len - at ? r : len - at;
                memcpy(next, text, at);
                memcpy(next + at, text + at + d, len - at - d);
                n = len - d;
            } else { /* repeat up to 40 bytes from elsewhere */
                const size_t from = cinfer_test_rng_below(&rng, len + 1);
                size_t r = 1 + cinfer_test_rng_below(&rng, 40);
                r = from + r > len ? len - from : r;
                if (len + r > sizeof next)
                    continue;
                memcpy(next, text, at);
                memcpy(next + at, text + from, r);
                memcpy(next + at + r, text + at, len - at);
                n = len + r;
            }
            memcpy(text, next, n);
            len = n;
        }
        char *exact = malloc(len ? len : 1);
        assert_non_null(exact);
        memcpy(exact, text, len);
        serve_trace_t t = {0};
        const cinfer_status_t st = serve_trace_parse(exact, len, "mutated", 0, &t);
        free(exact);
        if (st != CINFER_STATUS_SUCCESS) {
            if (st != CINFER_STATUS_INVALID_ARGUMENT || !cinfer_last_error()[0])
                fail_msg("mutation %d: status %s, message \"%s\"", iter, cinfer_status_name(st),
                         cinfer_last_error());
            refused++;
            continue;
        }
        parsed++;
        assert_true(t.count >= 1);
        for (int64_t i = 0; i < t.count; i++) {
            const serve_request_t *r = &t.requests[i];
            if (!(r->context_tokens >= 1 && r->generated_tokens >= 0 &&
                  r->arrival_s == r->arrival_s))
                fail_msg("mutation %d, request %lld: context %d, generated %d, arrival %g", iter,
                         (long long)i, r->context_tokens, r->generated_tokens, r->arrival_s);
        }
        serve_trace_free(&t);
    }
    printf("mutated traces: %d parsed, %d refused\n", parsed, refused);
    assert_true(parsed > 200);
    assert_true(refused > 200);
}

static void trace_loads_the_bundled_azure_trace(void **state) {
    (void)state;
    const char *src = getenv("CINFER_TEST_SOURCE_DIR");
    if (!src || !src[0])
        skip();
    char path[4096];
    snprintf(path, sizeof path, "%s/bench/data/azure_llm_trace_2023_conv.csv", src);
    serve_trace_t t;
    assert_int_equal(serve_trace_load(path, 0, &t), CINFER_STATUS_SUCCESS);
    assert_int_equal(t.count, 19366);
    assert_int_equal(t.requests[0].context_tokens, 374);
    assert_int_equal(t.requests[t.count - 1].context_tokens, 197);
    assert_int_equal(t.requests[t.count - 1].generated_tokens, 183);
    for (int64_t i = 1; i < t.count; i++)
        assert_true(t.requests[i].arrival_s >= t.requests[i - 1].arrival_s);
    serve_trace_free(&t);
}

/* ---- model presets ---- */

static void models_match_their_configs(void **state) {
    (void)state;
    int n = 0;
    const serve_model_t *all = serve_model_list(&n);
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++) {
        assert_ptr_equal(serve_model_find(all[i].name), &all[i]);
        assert_int_equal(all[i].num_qo_heads % all[i].num_kv_heads, 0);
    }
    assert_null(serve_model_find("gpt-5"));
    const serve_model_t *m = serve_model_find("llama3-70b-tp8");
    assert_int_equal(m->num_qo_heads, 8);
    assert_int_equal(m->num_kv_heads, 1);
    m = serve_model_find("qwen2.5-7b");
    assert_int_equal(m->num_qo_heads, 28);
    assert_int_equal(m->num_kv_heads, 4);
    m = serve_model_find("mistral-7b");
    assert_int_equal(serve_model_window(m, 0), 4095);
    assert_int_equal(serve_model_window(m, 1), 4095);
    m = serve_model_find("gemma2-9b");
    assert_int_equal(m->head_dim, 256);
    assert_true(m->logits_soft_cap == 50.0f);
    assert_int_equal(serve_model_window(m, 0), 4095);
    assert_int_equal(serve_model_window(m, 1), -1);
    assert_int_equal(serve_model_window(m, 2), 4095);
    assert_int_equal(serve_model_window(serve_model_find("llama3-8b"), 3), -1);
}

/* ---- the scheduler ---- */

static serve_trace_t make_trace(int n, uint64_t seed) {
    serve_trace_t t = {calloc((size_t)n, sizeof(serve_request_t)), n};
    assert_non_null(t.requests);
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t.requests[i].context_tokens = 1 + (int32_t)((seed >> 33) % 3000);
        t.requests[i].generated_tokens = (int32_t)((seed >> 13) % 300);
        t.requests[i].arrival_s = i;
    }
    /* Edge cases: a one-token prompt, outputs of 0 and 1 token, a prompt of exactly a page. */
    t.requests[0].context_tokens = 1;
    t.requests[1].generated_tokens = 0;
    t.requests[2].generated_tokens = 1;
    t.requests[3].context_tokens = 16;
    return t;
}

static void sched_rejects_bad_configs(void **state) {
    (void)state;
    serve_trace_t t = make_trace(8, 1);
    serve_sched_t *s = (serve_sched_t *)&s;
    serve_sched_config_t c = {16, 1000, 512, 8, 0, 0, 1};
    c.page_size = 0;
    EXPECT_ERROR(serve_sched_create(&c, &t, &s), CINFER_STATUS_INVALID_ARGUMENT, "page_size = 0");
    assert_null(s);
    c.page_size = 16;
    c.num_pages = 0;
    EXPECT_ERROR(serve_sched_create(&c, &t, &s), CINFER_STATUS_INVALID_ARGUMENT, "num_pages = 0",
                 "--kv-budget-gb");
    c.num_pages = 1000;
    c.prefill_chunk = 0;
    EXPECT_ERROR(serve_sched_create(&c, &t, &s), CINFER_STATUS_INVALID_ARGUMENT,
                 "--prefill-chunk = 0");
    c.prefill_chunk = 512;
    c.max_batch = 0;
    EXPECT_ERROR(serve_sched_create(&c, &t, &s), CINFER_STATUS_INVALID_ARGUMENT, "--max-batch = 0");
    c.max_batch = 8;
    c.max_steps = -1;
    EXPECT_ERROR(serve_sched_create(&c, &t, &s), CINFER_STATUS_INVALID_ARGUMENT, "--steps = -1");
    c.max_steps = 0;
    t.requests[5].context_tokens = 20000; /* 1250+ pages of a 1000-page pool */
    EXPECT_ERROR(serve_sched_create(&c, &t, &s), CINFER_STATUS_INVALID_ARGUMENT, "request 5",
                 "20000 context", "pages of 16 tokens", "the KV pool has 1000",
                 "raise --kv-budget-gb");
    /* Only the requests taken are checked. */
    c.max_requests = 5;
    assert_int_equal(serve_sched_create(&c, &t, &s), CINFER_STATUS_SUCCESS);
    serve_sched_destroy(s);
    serve_sched_destroy(NULL);
    serve_trace_free(&t);
}

typedef struct shadow {
    int32_t prefilled, decoded, kv;
    int32_t num_pages;
    int32_t *pages;
    bool seen, done;
} shadow_t;

/* Runs the scheduler to the end, checking every step against a shadow of the requests. */
static void replay_and_check(const serve_trace_t *t, const serve_sched_config_t *c) {
    serve_sched_t *s = NULL;
    assert_int_equal(serve_sched_create(c, t, &s), CINFER_STATUS_SUCCESS);
    const int64_t n = c->max_requests && c->max_requests < t->count ? c->max_requests : t->count;
    shadow_t *sh = calloc((size_t)n, sizeof *sh);
    int64_t *owner = malloc(sizeof(int64_t) * (size_t)c->num_pages); /* request owning a page */
    bool *in_step = calloc((size_t)n, sizeof(bool));
    assert_non_null(sh);
    assert_non_null(owner);
    assert_non_null(in_step);
    for (int64_t p = 0; p < c->num_pages; p++)
        owner[p] = -1;
    int64_t next_new = 0, finished = 0, steps = 0, prefill_tokens = 0, decode_tokens = 0;
    serve_step_t st;
    while (serve_sched_next(s, &st)) {
        assert_int_equal(st.index, steps);
        steps++;
        const int batch = st.num_prefill + st.num_decode;
        assert_true(batch >= 1 && batch <= c->max_batch);
        assert_true(st.pages_used <= st.pages_reserved);
        assert_true(st.pages_reserved <= c->num_pages);
        assert_int_equal(st.append_indptr[0], 0);
        assert_int_equal(st.qo_indptr[0], 0);
        assert_int_equal(st.kv_indptr[0], 0);
        assert_true(st.qo_indptr[st.num_prefill] <= c->prefill_chunk);
        int64_t step_pages = 0;
        for (int b = 0; b < batch; b++) {
            const int64_t r = st.request[b];
            assert_true(r >= 0 && r < n);
            assert_false(in_step[r]); /* a request appears once per step */
            in_step[r] = true;
            shadow_t *q = &sh[r];
            assert_false(q->done);
            const serve_request_t *req = &t->requests[r];
            if (!q->seen) { /* first come, first served */
                assert_int_equal(r, next_new);
                next_new++;
                q->seen = true;
                q->pages = malloc(sizeof(int32_t) *
                                  (size_t)(serve_request_final_kv(req) / c->page_size + 2));
                assert_non_null(q->pages);
            }
            const int32_t chunk = st.append_indptr[b + 1] - st.append_indptr[b];
            if (b < st.num_prefill) {
                assert_int_equal(chunk, st.qo_indptr[b + 1] - st.qo_indptr[b]);
                assert_true(chunk >= 1);
                assert_true(q->prefilled + chunk <= req->context_tokens);
                assert_int_equal(q->decoded, 0);
                q->prefilled += chunk;
                prefill_tokens += chunk;
            } else {
                assert_int_equal(chunk, 1);
                assert_int_equal(q->prefilled, req->context_tokens); /* prompt first */
                q->decoded++;
                assert_true(q->decoded <= req->generated_tokens - 1);
                decode_tokens++;
            }
            assert_int_equal(st.kv_len[b], q->kv + chunk);
            q->kv += chunk;
            /* The page table: just enough pages, the old ones first and unmoved. */
            const int32_t pages = st.kv_indptr[b + 1] - st.kv_indptr[b];
            assert_int_equal(pages, (q->kv + c->page_size - 1) / c->page_size);
            assert_int_equal(st.kv_last_page_len[b], q->kv - (pages - 1) * c->page_size);
            assert_true(pages >= q->num_pages);
            for (int32_t p = 0; p < pages; p++) {
                const int32_t page = st.kv_indices[st.kv_indptr[b] + p];
                assert_true(page >= 0 && page < c->num_pages);
                if (p < q->num_pages) {
                    assert_int_equal(page, q->pages[p]);
                } else {
                    assert_int_equal(owner[page], -1); /* never shared, never over-committed */
                    owner[page] = r;
                    q->pages[p] = page;
                }
            }
            q->num_pages = pages;
            step_pages += pages;
        }
        assert_int_equal(st.kv_indptr[batch], step_pages);
        /* Requests that finished with this step give their pages back. */
        int64_t done_now = 0;
        for (int b = 0; b < batch; b++) {
            const int64_t r = st.request[b];
            in_step[r] = false;
            shadow_t *q = &sh[r];
            const int32_t g = t->requests[r].generated_tokens;
            if (q->prefilled == t->requests[r].context_tokens &&
                q->decoded == (g > 1 ? g - 1 : 0)) {
                q->done = true;
                done_now++;
                for (int32_t p = 0; p < q->num_pages; p++)
                    owner[q->pages[p]] = -1;
            }
        }
        finished += done_now;
        assert_int_equal(st.finished, finished);
        assert_int_equal(st.queued, n - next_new);
    }
    /* Every request ran to its end: all of its prompt, then all of its decodes. */
    if (!c->max_steps) {
        assert_int_equal(finished, n);
        for (int64_t r = 0; r < n; r++) {
            const serve_request_t *req = &t->requests[r];
            assert_true(sh[r].done);
            assert_int_equal(sh[r].prefilled, req->context_tokens);
            assert_int_equal(sh[r].kv, serve_request_final_kv(req));
        }
    } else {
        assert_true(steps <= c->max_steps);
    }
    serve_sched_stats_t stats;
    serve_sched_get_stats(s, &stats);
    assert_int_equal(stats.steps, steps);
    assert_int_equal(stats.prefill_tokens, prefill_tokens);
    assert_int_equal(stats.decode_tokens, decode_tokens);
    assert_int_equal(stats.admitted, next_new);
    assert_int_equal(stats.finished, finished);
    assert_true(stats.max_running <= c->max_batch);
    assert_true(stats.max_pages_used <= c->num_pages);
    /* Nothing is scheduled after the end. */
    assert_false(serve_sched_next(s, &st));
    for (int64_t r = 0; r < n; r++)
        free(sh[r].pages);
    free(sh);
    free(owner);
    free(in_step);
    serve_sched_destroy(s);
}

static void sched_steps_are_consistent(void **state) {
    (void)state;
    serve_trace_t t = make_trace(300, 7);
    /* Tight pools (pages are the bottleneck), small batches (the batch is), tiny and large
     * prefill budgets, page sizes other than 16. */
    const serve_sched_config_t configs[] = {
        {16, 400, 512, 64, 0, 0, 1},    {16, 100000, 2048, 256, 0, 0, 2},
        {16, 2000, 7, 3, 0, 0, 3},      {1, 9000, 1000, 32, 0, 0, 4},
        {64, 300, 4096, 16, 200, 0, 5}, {16, 3000, 2048, 256, 0, 50, 6},
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        replay_and_check(&t, &configs[i]);
    serve_trace_free(&t);
}

static void sched_replays_the_azure_trace(void **state) {
    (void)state;
    const char *src = getenv("CINFER_TEST_SOURCE_DIR");
    if (!src || !src[0])
        skip();
    char path[4096];
    snprintf(path, sizeof path, "%s/bench/data/azure_llm_trace_2023_conv.csv", src);
    serve_trace_t t;
    assert_int_equal(serve_trace_load(path, 2000, &t), CINFER_STATUS_SUCCESS);
    /* The default of `cinfer bench serve` (8 GB over 4 Llama-3-8B layers), then a pool so small
     * that the longest prompts barely fit. */
    const serve_sched_config_t def = {16, 30517, 2048, 256, 0, 0, 1};
    replay_and_check(&t, &def);
    int64_t longest = 0;
    for (int64_t i = 0; i < t.count; i++) {
        const int64_t pages = (serve_request_final_kv(&t.requests[i]) + 15) / 16;
        longest = pages > longest ? pages : longest;
    }
    const serve_sched_config_t tight = {16, longest + 8, 2048, 256, 0, 0, 9};
    replay_and_check(&t, &tight);
    serve_trace_free(&t);
}

static void sched_is_deterministic_and_seeded(void **state) {
    (void)state;
    serve_trace_t t = make_trace(50, 3);
    serve_sched_config_t c = {16, 5000, 1024, 32, 0, 0, 11};
    serve_sched_t *a = NULL, *b = NULL;
    assert_int_equal(serve_sched_create(&c, &t, &a), CINFER_STATUS_SUCCESS);
    assert_int_equal(serve_sched_create(&c, &t, &b), CINFER_STATUS_SUCCESS);
    serve_step_t sa, sb;
    assert_true(serve_sched_next(a, &sa));
    assert_true(serve_sched_next(b, &sb));
    assert_int_equal(sa.kv_indptr[sa.num_prefill], sb.kv_indptr[sb.num_prefill]);
    assert_memory_equal(sa.kv_indices, sb.kv_indices,
                        sizeof(int32_t) * (size_t)sa.kv_indptr[sa.num_prefill]);
    serve_sched_destroy(b);
    c.seed = 12;
    assert_int_equal(serve_sched_create(&c, &t, &b), CINFER_STATUS_SUCCESS);
    assert_true(serve_sched_next(b, &sb));
    assert_int_equal(sa.kv_indptr[sa.num_prefill], sb.kv_indptr[sb.num_prefill]);
    assert_true(memcmp(sa.kv_indices, sb.kv_indices,
                       sizeof(int32_t) * (size_t)sa.kv_indptr[sa.num_prefill]) != 0);
    /* The first step: prompts admitted in order within the budget, no decodes yet. */
    assert_int_equal(sa.num_decode, 0);
    assert_int_equal(sa.qo_indptr[sa.num_prefill], 1024);
    assert_int_equal(sa.request[0], 0);
    serve_sched_destroy(a);
    serve_sched_destroy(b);
    serve_trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trace_parses_the_azure_format),
        cmocka_unit_test(trace_columns_by_name_and_numeric_times),
        cmocka_unit_test(trace_errors_name_the_line_column_and_value),
        cmocka_unit_test(trace_mutations_parse_or_fail_cleanly),
        cmocka_unit_test(trace_loads_the_bundled_azure_trace),
        cmocka_unit_test(models_match_their_configs),
        cmocka_unit_test(sched_rejects_bad_configs),
        cmocka_unit_test(sched_steps_are_consistent),
        cmocka_unit_test(sched_replays_the_azure_trace),
        cmocka_unit_test(sched_is_deterministic_and_seeded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
