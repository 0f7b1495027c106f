/*
 * Request traces (CSV) and the model presets of `cinfer bench serve`.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"
#include "serve.h"

/* The columns a trace must have, by name. */
enum { COL_TIMESTAMP, COL_CONTEXT, COL_GENERATED, NUM_COLS };
static const char *const column_names[NUM_COLS] = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};
/* Far more columns than a trace has; a line with more is still read (the rest are ignored). */
#define MAX_FIELDS 64

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (Howard Hinnant's
 * days_from_civil), so timestamps convert without the C library's time-zone handling. */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "YYYY-MM-DD HH:MM:SS[.frac]" or a plain number, as seconds; false if it is neither. */
static bool parse_time(const char *text, double *seconds) {
    int y, mo, d, h, mi, n = 0;
    double s;
    if (sscanf(text, "%d-%d-%d %d:%d:%lf%n", &y, &mo, &d, &h, &mi, &s, &n) == 6 &&
        text[n] == '\0') {
        if (mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 ||
            !(s >= 0 && s < 61))
            return false;
        *seconds = (double)days_from_civil(y, mo, d) * 86400.0 + h * 3600.0 + mi * 60.0 + s;
        return true;
    }
    char *end;
    errno = 0;
    const double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno || !isfinite(v))
        return false;
    *seconds = v;
    return true;
}

/* A decimal integer in [lo, hi]; false otherwise. */
static bool parse_int(const char *text, long lo, long hi, int32_t *out) {
    char *end;
    errno = 0;
    const long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno || v < lo || v > hi)
        return false;
    *out = (int32_t)v;
    return true;
}

/* Splits line (modified in place) at commas into fields with surrounding blanks and quotes
 * removed; returns the number of fields (at most MAX_FIELDS). */
static int split(char *line, char **fields) {
    int n = 0;
    char *p = line;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        while (*p == ' ' || *p == '\t' || *p == '"')
            p++;
        char *end = p + strlen(p);
        while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '"' || end[-1] == '\r' ||
                           end[-1] == '\n'))
            *--end = '\0';
        if (n < MAX_FIELDS)
            fields[n++] = p;
        if (!comma)
            return n;
        p = comma + 1;
    }
}

static bool blank(const char *line) {
    for (; *line; line++)
        if (!isspace((unsigned char)*line))
            return false;
    return true;
}

cinfer_status_t serve_trace_parse(const char *text, size_t len, const char *name, int64_t max_rows,
                                  serve_trace_t *out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    memset(out, 0, sizeof *out);
    if (!text || !name)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "trace text or name is NULL");
    if (max_rows < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "max_rows = %lld, expected >= 0 (0 = all)", (long long)max_rows);
    char *copy = malloc(len + 1);
    if (!copy)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "%s: out of host memory", name);
    memcpy(copy, text, len);
    copy[len] = '\0';

    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    int col[NUM_COLS] = {-1, -1, -1};
    bool have_header = false;
    int64_t cap = 0, line_no = 0;
    double first_time = 0;
    char *fields[MAX_FIELDS];
    char *save = NULL;
    for (char *line = copy; line && (max_rows == 0 || out->count < max_rows); line = save) {
        char *nl = strchr(line, '\n');
        save = nl ? nl + 1 : NULL;
        if (nl)
            *nl = '\0';
        line_no++;
        if (blank(line))
            continue;
        const int n = split(line, fields);
        if (!have_header) {
            for (int i = 0; i < n; i++)
                for (int c = 0; c < NUM_COLS; c++)
                    if (strcasecmp(fields[i], column_names[c]) == 0 && col[c] < 0)
                        col[c] = i;
            for (int c = 0; c < NUM_COLS; c++)
                if (col[c] < 0) {
                    st = cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                       "%s: line %lld: the header has no column \"%s\", expected "
                                       "the columns TIMESTAMP, ContextTokens, GeneratedTokens",
                                       name, (long long)line_no, column_names[c]);
                    goto out_free;
                }
            have_header = true;
            continue;
        }
        for (int c = 0; c < NUM_COLS; c++)
            if (col[c] >= n) {
                st = cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                   "%s: line %lld: %d fields, expected at least %d (column %s)",
                                   name, (long long)line_no, n, col[c] + 1, column_names[c]);
                goto out_free;
            }
        serve_request_t r;
        double t;
        if (!parse_time(fields[col[COL_TIMESTAMP]], &t)) {
            st = cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                               "%s: line %lld: TIMESTAMP = \"%s\", expected \"YYYY-MM-DD "
                               "HH:MM:SS[.fraction]\" or a number of seconds",
                               name, (long long)line_no, fields[col[COL_TIMESTAMP]]);
            goto out_free;
        }
        if (!parse_int(fields[col[COL_CONTEXT]], 1, INT32_MAX / 2, &r.context_tokens)) {
            st = cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                               "%s: line %lld: ContextTokens = \"%s\", expected an integer in "
                               "[1, 2^30)",
                               name, (long long)line_no, fields[col[COL_CONTEXT]]);
            goto out_free;
        }
        if (!parse_int(fields[col[COL_GENERATED]], 0, INT32_MAX / 2, &r.generated_tokens)) {
            st = cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                               "%s: line %lld: GeneratedTokens = \"%s\", expected an integer in "
                               "[0, 2^30)",
                               name, (long long)line_no, fields[col[COL_GENERATED]]);
            goto out_free;
        }
        if (out->count == 0)
            first_time = t;
        r.arrival_s = t - first_time;
        if (out->count == cap) {
            cap = cap ? 2 * cap : 1024;
            serve_request_t *grown = realloc(out->requests, sizeof *grown * (size_t)cap);
            if (!grown) {
                st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "%s: out of host memory", name);
                goto out_free;
            }
            out->requests = grown;
        }
        out->requests[out->count++] = r;
    }
    if (!have_header)
        st = cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                           "%s: empty, expected a header with the columns TIMESTAMP, "
                           "ContextTokens, GeneratedTokens and one request per line",
                           name);
    else if (out->count == 0)
        st = cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                           "%s: a header but no requests, expected at least one line after it",
                           name);
out_free:
    free(copy);
    if (st != CINFER_STATUS_SUCCESS)
        serve_trace_free(out);
    return st;
}

cinfer_status_t serve_trace_load(const char *path, int64_t max_rows, serve_trace_t *out) {
    if (out)
        memset(out, 0, sizeof *out);
    if (!path)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "trace path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return cinfer__error(CINFER_STATUS_IO_ERROR, "--trace %s: cannot open (%s)", path,
                             strerror(errno));
    cinfer__str_t text = {0};
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        cinfer__str_append(&text, buf, got);
    const bool failed = ferror(f) != 0;
    fclose(f);
    if (failed || text.failed) {
        cinfer__str_free(&text);
        return cinfer__error(failed ? CINFER_STATUS_IO_ERROR : CINFER_STATUS_OUT_OF_MEMORY,
                             "--trace %s: cannot read the file", path);
    }
    const cinfer_status_t st =
        serve_trace_parse(text.data ? text.data : "", text.len, path, max_rows, out);
    cinfer__str_free(&text);
    return st;
}

void serve_trace_free(serve_trace_t *trace) {
    if (!trace)
        return;
    free(trace->requests);
    trace->requests = NULL;
    trace->count = 0;
}

/* ---- model presets ---- */

static const serve_model_t models[] = {
    {"llama3-8b", 32, 8, 128, -1, 0, 0.0f,
     "meta-llama/Meta-Llama-3-8B config.json: 32 attention heads, 8 KV heads, hidden 4096"},
    {"llama3-70b-tp8", 8, 1, 128, -1, 0, 0.0f,
     "meta-llama/Meta-Llama-3-70B config.json (64 heads, 8 KV heads, hidden 8192) on one of 8 "
     "tensor-parallel GPUs"},
    {"qwen2.5-7b", 28, 4, 128, -1, 0, 0.0f,
     "Qwen/Qwen2.5-7B config.json: 28 attention heads, 4 KV heads, hidden 3584"},
    {"mistral-7b", 32, 8, 128, 4095, 0, 0.0f,
     "mistralai/Mistral-7B-v0.1 config.json: 32 heads, 8 KV heads, sliding_window 4096 on every "
     "layer"},
    {"gemma2-9b", 16, 8, 256, 4095, 2, 50.0f,
     "google/gemma-2-9b config.json: 16 heads, 8 KV heads, head_dim 256, "
     "attn_logit_softcapping 50, sliding_window 4096 on even layers (odd layers global)"},
};
#define NUM_MODELS ((int)(sizeof models / sizeof models[0]))

const serve_model_t *serve_model_find(const char *name) {
    for (int i = 0; name && i < NUM_MODELS; i++)
        if (strcmp(models[i].name, name) == 0)
            return &models[i];
    return NULL;
}

const serve_model_t *serve_model_list(int *count) {
    *count = NUM_MODELS;
    return models;
}

int serve_model_window(const serve_model_t *model, int layer) {
    if (model->window_left < 0)
        return -1;
    if (model->window_every == 0)
        return model->window_left;
    return layer % model->window_every == 0 ? model->window_left : -1;
}
