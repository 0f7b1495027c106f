/*
 * The host side of `cinfer bench serve`: request traces, model presets and the continuous-batching
 * scheduler. Pure host C (no driver calls), so the CPU suite tests all of it (tests/tools/
 * test_serve.c) and the GPU loop (tools/cmd_bench.c) only turns each scheduled step into launches.
 *
 * The replay is "saturated": requests join the queue in trace order (the timestamps order them
 * but do not delay them) and are admitted as soon as the scheduler has room, so every step is as
 * full as the KV budget, the batch limit and the prefill budget allow. That measures the attention
 * engine at the load a busy server sees, and makes the sequence of steps deterministic.
 *
 * Every failing function returns a status and sets cinfer_last_error() to a message naming the
 * argument (or trace line), the value and what was expected.
 */
#ifndef CINFER_TOOLS_SERVE_H
#define CINFER_TOOLS_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cinfer.h"

/* ---------------------------------------------------------------------------------------------
 * Traces
 * ------------------------------------------------------------------------------------------- */

/* One request of a trace. */
typedef struct serve_request {
    double arrival_s;         /* seconds after the first request of the trace */
    int32_t context_tokens;   /* prompt length, >= 1 */
    int32_t generated_tokens; /* output length, >= 0 */
} serve_request_t;

typedef struct serve_trace {
    serve_request_t *requests;
    int64_t count;
} serve_trace_t;

/*
 * Parses a CSV trace: a header naming the columns TIMESTAMP, ContextTokens and GeneratedTokens
 * (case-insensitive, in any order, other columns ignored), then one request per line. A timestamp
 * is "YYYY-MM-DD HH:MM:SS[.fraction]" (the Azure LLM inference traces) or a number of seconds.
 * Blank lines are skipped; anything else that does not parse is INVALID_ARGUMENT naming `name`,
 * the line, the column and the value. At most max_rows requests are read (0 = all). A trace
 * without requests is INVALID_ARGUMENT. Free with serve_trace_free.
 */
cinfer_status_t serve_trace_parse(const char *text, size_t len, const char *name, int64_t max_rows,
                                  serve_trace_t *out);

/* Reads the file at path and parses it as above; IO_ERROR naming the path when it cannot be
 * read. */
cinfer_status_t serve_trace_load(const char *path, int64_t max_rows, serve_trace_t *out);

/* Frees the requests; a zeroed trace is a no-op. */
void serve_trace_free(serve_trace_t *trace);

/* ---------------------------------------------------------------------------------------------
 * Model presets: the attention shapes of real models (their published configs)
 * ------------------------------------------------------------------------------------------- */

typedef struct serve_model {
    const char *name;
    int num_qo_heads, num_kv_heads, head_dim;
    int window_left;       /* -1 = none; sliding window of W tokens = W - 1 */
    int window_every;      /* 0: window_left applies to every layer; 2: to even layers only */
    float logits_soft_cap; /* 0 = off */
    const char *source;    /* where the numbers come from */
} serve_model_t;

/* The preset of that name, or NULL. */
const serve_model_t *serve_model_find(const char *name);
/* The presets: *count receives how many. */
const serve_model_t *serve_model_list(int *count);
/* The window_left of layer `layer` (-1 = no window there). */
int serve_model_window(const serve_model_t *model, int layer);

/* ---------------------------------------------------------------------------------------------
 * The continuous-batching scheduler
 * ------------------------------------------------------------------------------------------- */

typedef struct serve_sched_config {
    int page_size;        /* tokens per KV page, >= 1 */
    int64_t num_pages;    /* pages of the KV pool, >= 1, at most 2^31 - 1 */
    int prefill_chunk;    /* prefill tokens per step (all requests together), >= 1 */
    int max_batch;        /* requests running at once (prefilling or decoding), >= 1 */
    int64_t max_requests; /* requests taken from the trace, 0 = all */
    int64_t max_steps;    /* steps to schedule, 0 = until every taken request has finished */
    uint64_t seed;        /* order in which free pages are handed out (scattered like a real
                             allocator's after some churn) */
} serve_sched_config_t;

/*
 * One step: the requests it touches, prefill chunks first, then decodes, and the page table of
 * those requests after this step's tokens are appended (the table attention and append use).
 * Index b runs over [0, num_prefill + num_decode); the prefill requests are b < num_prefill.
 * Arrays stay valid until the next serve_sched_next or serve_sched_destroy.
 */
typedef struct serve_step {
    int64_t index; /* 0, 1, 2, ... */
    int num_prefill, num_decode;
    const int64_t *request;          /* [batch] trace index of each request */
    const int32_t *append_indptr;    /* [batch + 1] new tokens of each request (its chunk, or 1) */
    const int32_t *qo_indptr;        /* [num_prefill + 1] the prefill requests' query rows */
    const int32_t *kv_len;           /* [batch] KV tokens after the append */
    const int32_t *kv_indptr;        /* [batch + 1] page-table entries */
    const int32_t *kv_indices;       /* [kv_indptr[batch]] page indices in [0, num_pages) */
    const int32_t *kv_last_page_len; /* [batch] 1..page_size */
    /* What happened around the step (for progress lines and tests). */
    int admitted;           /* requests admitted by this step */
    int retired;            /* requests that finished before this step and were freed */
    int64_t pages_used;     /* pages owned by requests after this step's allocations */
    int64_t pages_reserved; /* pages promised to running requests (>= pages_used) */
    int64_t queued;         /* requests of the trace not admitted yet */
    int64_t finished;       /* requests finished so far (including those finishing now) */
} serve_step_t;

typedef struct serve_sched serve_sched_t;

/*
 * Creates a scheduler over the first config->max_requests requests of trace (borrowed; it must
 * outlive the scheduler). Requests are admitted first come, first served when the pool has the
 * pages of their whole life (context + generated tokens) unreserved and fewer than max_batch
 * requests run; their pages are then handed out as their KV grows, so no request is ever
 * preempted and the pool is never over-committed. Each step decodes one token of every request
 * whose prompt is done, then spends up to prefill_chunk tokens on prompts, oldest first (chunked
 * prefill), admitting new requests while budget and room remain. The last prefill chunk of a
 * request yields its first output token, so a request of C context and G generated tokens takes
 * at least ceil(C / prefill_chunk) prefill steps (the budget is shared), then G - 1 decode steps
 * (none when G <= 1), and ends with C + max(G, 1) - 1 tokens of KV.
 * INVALID_ARGUMENT names the config field outside its range, or the first request that could
 * never be admitted (its pages exceed the pool), with how much KV budget it would need.
 */
cinfer_status_t serve_sched_create(const serve_sched_config_t *config, const serve_trace_t *trace,
                                   serve_sched_t **out);

/* Schedules the next step into *step. Returns true with a step, false when the replay is over
 * (every request finished, or max_steps reached). */
bool serve_sched_next(serve_sched_t *sched, serve_step_t *step);

/* Totals of the replay so far. */
typedef struct serve_sched_stats {
    int64_t steps;
    int64_t requests; /* taken from the trace */
    int64_t admitted, finished;
    int64_t prefill_tokens; /* query rows of every prefill chunk */
    int64_t decode_tokens;  /* decode query rows */
    int64_t max_running;    /* most requests running in one step */
    int64_t max_pages_used; /* most pages owned at once */
    int64_t max_step_pages; /* most page-table entries in one step */
} serve_sched_stats_t;

void serve_sched_get_stats(const serve_sched_t *sched, serve_sched_stats_t *stats);

/* The KV tokens one request holds at the end of its life: C + max(G, 1) - 1. */
int64_t serve_request_final_kv(const serve_request_t *request);

/* NULL is a no-op. */
void serve_sched_destroy(serve_sched_t *sched);

#endif
