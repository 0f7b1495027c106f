/*
 * The continuous-batching scheduler of `cinfer bench serve` (serve.h explains the policy).
 *
 * State: the running requests in admission order (a request keeps its slot until it finishes),
 * a free list of page indices, and a count of pages reserved for the running requests' whole
 * lives. A step is built in three passes: decodes (requests whose prompt is done), prefill chunks
 * of running prompts (oldest first), then admissions from the queue; the step's arrays list the
 * prefill requests first, then the decodes, because the GPU loop hands the two groups to
 * different kernels over one page table.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve.h"

typedef struct seq {
    int64_t request;    /* trace index */
    int32_t context;    /* prompt tokens */
    int32_t decodes;    /* decode steps it needs: max(G, 1) - 1 */
    int32_t prefilled;  /* prompt tokens in the cache */
    int32_t decoded;    /* decode steps done */
    int32_t kv_len;     /* tokens in the cache */
    int32_t reserved;   /* pages promised for its whole life */
    int32_t num_pages;  /* pages handed out so far */
    int32_t *pages;     /* [reserved] */
    int32_t step_chunk; /* tokens appended in the step being built (0 = not in it) */
} seq_t;

struct serve_sched {
    serve_sched_config_t cfg;
    const serve_trace_t *trace;
    int64_t num_requests; /* taken from the trace */
    int64_t next_request; /* first not admitted */

    int32_t *free_pages; /* stack of free page indices */
    int64_t num_free;
    int64_t reserved; /* pages promised to running requests */

    seq_t *running; /* [max_batch], admission order */
    int num_running;
    int64_t retired_total; /* requests freed so far */

    /* The step's arrays (capacity max_batch requests, num_pages entries). */
    int64_t *request;
    int32_t *append_indptr, *qo_indptr, *kv_len, *kv_indptr, *kv_indices, *last;
    seq_t **order; /* [max_batch] the step's requests: prefill first, then decode */

    serve_sched_stats_t stats;
};

int64_t serve_request_final_kv(const serve_request_t *r) {
    return (int64_t)r->context_tokens + (r->generated_tokens > 1 ? r->generated_tokens - 1 : 0);
}

static int64_t pages_for(int64_t tokens, int page_size) {
    return (tokens + page_size - 1) / page_size;
}

static uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void serve_sched_destroy(serve_sched_t *s) {
    if (!s)
        return;
    for (int i = 0; s->running && i < s->num_running; i++)
        free(s->running[i].pages);
    free(s->running);
    free(s->free_pages);
    free(s->request);
    free(s->append_indptr);
    free(s->qo_indptr);
    free(s->kv_len);
    free(s->kv_indptr);
    free(s->kv_indices);
    free(s->last);
    free(s->order);
    free(s);
}

cinfer_status_t serve_sched_create(const serve_sched_config_t *c, const serve_trace_t *trace,
                                   serve_sched_t **out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!c || !trace || !trace->requests || trace->count < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "config or trace is NULL or empty, expected a trace of >= 1 request");
    if (c->page_size < 1 || c->page_size > 65536)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "page_size = %d, expected 1..65536",
                             c->page_size);
    if (c->num_pages < 1 || c->num_pages > INT32_MAX)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "num_pages = %lld, expected 1..2^31 - 1 (raise or lower "
                             "--kv-budget-gb)",
                             (long long)c->num_pages);
    if (c->prefill_chunk < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "--prefill-chunk = %d, expected >= 1 token", c->prefill_chunk);
    if (c->max_batch < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "--max-batch = %d, expected >= 1 request", c->max_batch);
    if (c->max_requests < 0 || c->max_steps < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "--requests = %lld, --steps = %lld, expected >= 0 (0 = no limit)",
                             (long long)c->max_requests, (long long)c->max_steps);
    const int64_t n =
        c->max_requests && c->max_requests < trace->count ? c->max_requests : trace->count;
    for (int64_t i = 0; i < n; i++) {
        const int64_t need = pages_for(serve_request_final_kv(&trace->requests[i]), c->page_size);
        if (need > c->num_pages)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "request %lld of the trace (%d context + %d generated tokens) "
                                 "needs %lld pages of %d tokens, the KV pool has %lld: raise "
                                 "--kv-budget-gb or lower --layers",
                                 (long long)i, trace->requests[i].context_tokens,
                                 trace->requests[i].generated_tokens, (long long)need, c->page_size,
                                 (long long)c->num_pages);
    }
    serve_sched_t *s = calloc(1, sizeof *s);
    if (!s)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "scheduler: out of host memory");
    s->cfg = *c;
    s->trace = trace;
    s->num_requests = n;
    s->stats.requests = n;
    const size_t b = (size_t)c->max_batch, p = (size_t)c->num_pages;
    s->free_pages = malloc(sizeof(int32_t) * p);
    s->running = calloc(b, sizeof(seq_t));
    s->request = malloc(sizeof(int64_t) * b);
    s->append_indptr = malloc(sizeof(int32_t) * (b + 1));
    s->qo_indptr = malloc(sizeof(int32_t) * (b + 1));
    s->kv_len = malloc(sizeof(int32_t) * b);
    s->kv_indptr = malloc(sizeof(int32_t) * (b + 1));
    s->kv_indices = malloc(sizeof(int32_t) * p);
    s->last = malloc(sizeof(int32_t) * b);
    s->order = malloc(sizeof(seq_t *) * b);
    if (!s->free_pages || !s->running || !s->request || !s->append_indptr || !s->qo_indptr ||
        !s->kv_len || !s->kv_indptr || !s->kv_indices || !s->last || !s->order) {
        serve_sched_destroy(s);
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "scheduler: out of host memory for %lld pages and %d requests",
                             (long long)c->num_pages, c->max_batch);
    }
    /* A seeded permutation: pages come out scattered over the pool. */
    for (int64_t i = 0; i < c->num_pages; i++)
        s->free_pages[i] = (int32_t)i;
    uint64_t state = c->seed;
    for (int64_t i = c->num_pages - 1; i > 0; i--) {
        const int64_t j = (int64_t)(splitmix(&state) % (uint64_t)(i + 1));
        const int32_t t = s->free_pages[i];
        s->free_pages[i] = s->free_pages[j];
        s->free_pages[j] = t;
    }
    s->num_free = c->num_pages;
    *out = s;
    return CINFER_STATUS_SUCCESS;
}

/* Appends `tokens` to q, handing out pages from its reservation as the KV grows. */
static void grow(serve_sched_t *s, seq_t *q, int32_t tokens) {
    q->kv_len += tokens;
    q->step_chunk = tokens;
    const int64_t need = pages_for(q->kv_len, s->cfg.page_size);
    while (q->num_pages < need)
        q->pages[q->num_pages++] = s->free_pages[--s->num_free];
}

static bool finished(const seq_t *q) {
    return q->prefilled == q->context && q->decoded == q->decodes;
}

/* Frees the requests that finished in the last step, keeping admission order. */
static int retire(serve_sched_t *s) {
    int kept = 0, retired = 0;
    for (int i = 0; i < s->num_running; i++) {
        seq_t *q = &s->running[i];
        if (finished(q)) {
            for (int32_t p = 0; p < q->num_pages; p++)
                s->free_pages[s->num_free++] = q->pages[p];
            s->reserved -= q->reserved;
            free(q->pages);
            retired++;
            continue;
        }
        s->running[kept++] = *q;
    }
    s->num_running = kept;
    return retired;
}

bool serve_sched_next(serve_sched_t *s, serve_step_t *step) {
    memset(step, 0, sizeof *step);
    if (s->cfg.max_steps && s->stats.steps >= s->cfg.max_steps)
        return false;
    const int retired = retire(s);
    const int page = s->cfg.page_size;
    int num_prefill = 0, num_decode = 0, admitted = 0;
    int32_t budget = s->cfg.prefill_chunk;

    for (int i = 0; i < s->num_running; i++)
        s->running[i].step_chunk = 0;
    /* Prefill chunks of running prompts, oldest first. */
    for (int i = 0; i < s->num_running && budget > 0; i++) {
        seq_t *q = &s->running[i];
        if (q->prefilled == q->context)
            continue;
        const int32_t chunk =
            q->context - q->prefilled < budget ? q->context - q->prefilled : budget;
        q->prefilled += chunk;
        budget -= chunk;
        grow(s, q, chunk);
        s->order[num_prefill++] = q;
    }
    /* Admissions, first come first served, while there is budget and room for a whole life. */
    while (budget > 0 && s->next_request < s->num_requests && s->num_running < s->cfg.max_batch) {
        const serve_request_t *r = &s->trace->requests[s->next_request];
        const int64_t need = pages_for(serve_request_final_kv(r), page);
        if (s->reserved + need > s->cfg.num_pages)
            break;
        seq_t *q = &s->running[s->num_running];
        memset(q, 0, sizeof *q);
        q->pages = malloc(sizeof(int32_t) * (size_t)need);
        if (!q->pages)
            break; /* out of host memory: admit later (the step still makes progress) */
        q->request = s->next_request++;
        q->context = r->context_tokens;
        q->decodes = r->generated_tokens > 1 ? r->generated_tokens - 1 : 0;
        q->reserved = (int32_t)need;
        s->reserved += need;
        s->num_running++;
        admitted++;
        const int32_t chunk = q->context < budget ? q->context : budget;
        q->prefilled = chunk;
        budget -= chunk;
        grow(s, q, chunk);
        s->order[num_prefill++] = q;
    }
    /* One decode token for every request whose prompt was done before this step. */
    for (int i = 0; i < s->num_running; i++) {
        seq_t *q = &s->running[i];
        if (q->step_chunk || q->prefilled < q->context || q->decoded == q->decodes)
            continue;
        q->decoded++;
        grow(s, q, 1);
        s->order[num_prefill + num_decode++] = q;
    }
    const int batch = num_prefill + num_decode;
    if (batch == 0)
        return false;

    /* The step's arrays, in order. */
    s->append_indptr[0] = s->qo_indptr[0] = s->kv_indptr[0] = 0;
    int64_t used = 0;
    for (int b = 0; b < batch; b++) {
        const seq_t *q = s->order[b];
        s->request[b] = q->request;
        s->append_indptr[b + 1] = s->append_indptr[b] + q->step_chunk;
        if (b < num_prefill)
            s->qo_indptr[b + 1] = s->qo_indptr[b] + q->step_chunk;
        s->kv_len[b] = q->kv_len;
        memcpy(s->kv_indices + s->kv_indptr[b], q->pages, sizeof(int32_t) * (size_t)q->num_pages);
        s->kv_indptr[b + 1] = s->kv_indptr[b] + q->num_pages;
        s->last[b] = q->kv_len - (q->num_pages - 1) * page;
    }
    int64_t finishing = 0;
    for (int i = 0; i < s->num_running; i++) {
        used += s->running[i].num_pages;
        finishing += finished(&s->running[i]);
    }

    serve_sched_stats_t *st = &s->stats;
    step->index = st->steps++;
    step->num_prefill = num_prefill;
    step->num_decode = num_decode;
    step->request = s->request;
    step->append_indptr = s->append_indptr;
    step->qo_indptr = s->qo_indptr;
    step->kv_len = s->kv_len;
    step->kv_indptr = s->kv_indptr;
    step->kv_indices = s->kv_indices;
    step->kv_last_page_len = s->last;
    step->admitted = admitted;
    step->retired = retired;
    step->pages_used = used;
    step->pages_reserved = s->reserved;
    step->queued = s->num_requests - s->next_request;
    st->admitted += admitted;
    s->retired_total += retired;
    st->finished = s->retired_total + finishing;
    step->finished = st->finished;
    st->prefill_tokens += s->qo_indptr[num_prefill];
    st->decode_tokens += num_decode;
    if (s->num_running > st->max_running)
        st->max_running = s->num_running;
    if (used > st->max_pages_used)
        st->max_pages_used = used;
    if (s->kv_indptr[batch] > st->max_step_pages)
        st->max_step_pages = s->kv_indptr[batch];
    return true;
}

void serve_sched_get_stats(const serve_sched_t *s, serve_sched_stats_t *stats) {
    *stats = s->stats;
}
