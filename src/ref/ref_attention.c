/*
 * The attention core of the CPU reference and its wrappers over strided, ragged and paged
 * memory layouts. The core follows the numbered steps of the contract in ref.h literally, one
 * (query row, head, key) at a time; the wrappers only gather typed elements into contiguous
 * double arrays and call the core once per request, so every layout shares one implementation
 * of the math.
 */
#include "ref/ref.h"
#include "ref/ref_utils.h"

#include <math.h>
#include <stdlib.h>

/*
 * Allocates count doubles (at least one, so that an empty array is still a valid pointer and a
 * NULL return always means failure). Returns NULL when the byte size would not fit in size_t.
 */
static double *cinfer__ref_alloc_doubles(int64_t count) {
    if (count < 0 || (uint64_t)count > SIZE_MAX / sizeof(double)) {
        return NULL;
    }
    return malloc((count > 0 ? (size_t)count : 1) * sizeof(double));
}

/* Multiplies non-negative sizes, failing instead of overflowing int64_t. */
static bool cinfer__ref_mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) {
        return false;
    }
    if (a != 0 && b > INT64_MAX / a) {
        return false;
    }
    *out = a * b;
    return true;
}

/* a * b * c for non-negative sizes, failing instead of overflowing int64_t. */
static bool cinfer__ref_mul3_ok(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t ab;
    return cinfer__ref_mul_ok(a, b, &ab) && cinfer__ref_mul_ok(ab, c, out);
}

static bool cinfer__ref_heads_ok(const cinfer__ref_heads_t *heads) {
    return heads != NULL && heads->num_qo_heads >= 1 && heads->num_kv_heads >= 1 &&
           heads->num_qo_heads % heads->num_kv_heads == 0 && heads->head_dim_qk >= 1 &&
           heads->head_dim_vo >= 1;
}

static bool cinfer__ref_opts_ok(const cinfer__ref_attn_opts_t *opts,
                                const cinfer__ref_heads_t *heads) {
    if (opts == NULL) {
        return false;
    }
    if (opts->window_left < -1) {
        return false;
    }
    /* Written as a negated comparison so that a NaN soft cap is rejected too. */
    if (!(opts->logits_soft_cap >= 0.0)) {
        return false;
    }
    if (opts->rope_llama) {
        if (heads->head_dim_qk % 2 != 0 || heads->head_dim_qk > 1024 || !(opts->rope_theta > 0.0) ||
            !isfinite(opts->rope_theta) || !(opts->rope_scale > 0.0) ||
            !isfinite(opts->rope_scale)) {
            return false;
        }
        if (opts->rope_round != -1 && opts->rope_round != CINFER__REF_DTYPE_F16 &&
            opts->rope_round != CINFER__REF_DTYPE_BF16) {
            return false;
        }
    }
    switch (opts->variant) {
    case CINFER__REF_VARIANT_DEFAULT:
    case CINFER__REF_VARIANT_SIGMOID:
        return true;
    case CINFER__REF_VARIANT_SINKS:
        return opts->sinks != NULL;
    }
    return false;
}

double cinfer__ref_default_sm_scale(int64_t head_dim_qk) {
    if (head_dim_qk <= 0) {
        return NAN;
    }
    return 1.0 / sqrt((double)head_dim_qk);
}

int cinfer__ref_attn_opts_init(cinfer__ref_attn_opts_t *opts, int64_t head_dim_qk) {
    if (opts == NULL || head_dim_qk <= 0) {
        return CINFER__REF_EINVAL;
    }
    opts->sm_scale = cinfer__ref_default_sm_scale(head_dim_qk);
    opts->k_scale = 1.0;
    opts->v_scale = 1.0;
    opts->causal = false;
    opts->window_left = -1;
    opts->custom_mask = NULL;
    opts->logits_soft_cap = 0.0;
    opts->alibi = false;
    opts->alibi_slopes = NULL;
    opts->rope_llama = false;
    opts->rope_theta = 1e4;
    opts->rope_scale = 1.0;
    opts->rope_round = -1;
    opts->variant = CINFER__REF_VARIANT_DEFAULT;
    opts->sigmoid_scale = 1.0;
    opts->sigmoid_bias = 0.0;
    opts->sinks = NULL;
    opts->logits_out = NULL;
    return CINFER__REF_OK;
}

int cinfer__ref_alibi_default_slopes(int64_t num_heads, double *out) {
    int64_t n = 1;

    if (num_heads < 1 || out == NULL) {
        return CINFER__REF_EINVAL;
    }
    /* n = the largest power of two not above num_heads. */
    while (n * 2 <= num_heads) {
        n *= 2;
    }
    for (int64_t h = 0; h < n; h++) {
        out[h] = pow(2.0, -8.0 * (double)(h + 1) / (double)n);
    }
    /*
     * The paper's recipe for other head counts: the extra heads take every other slope of the
     * 2n-head series, starting with its first, i.e. exponents -8 (2k + 1) / (2n).
     */
    for (int64_t k = 0; k < num_heads - n; k++) {
        out[n + k] = pow(2.0, -8.0 * (double)(2 * k + 1) / (double)(2 * n));
    }
    return CINFER__REF_OK;
}

/* Llama rotate-half RoPE of one head vector x[d] at position pos into out[d]: the RoPE utilities'
 * row (ref_utils.c) over all d dimensions; opts were validated (d even, at most 1024; theta and
 * scale finite and positive), so it cannot fail. */
static void cinfer__ref_rope(double *out, const double *x, int64_t d, double pos, double theta,
                             double scale) {
    const cinfer__ref_rope_t rope = {.rotary_dim = d, .rope_theta = theta, .rope_scale = scale};
    cinfer__ref_rope_row(&rope, d, pos, x, out);
}

/* Logistic function, written in the form whose exponential cannot overflow for either sign. */
static double cinfer__ref_sigmoid(double x) {
    if (x >= 0.0) {
        return 1.0 / (1.0 + exp(-x));
    }
    const double e = exp(x);
    return e / (1.0 + e);
}

int cinfer__ref_attention(const cinfer__ref_heads_t *heads, int64_t qo_len, int64_t kv_len,
                          const double *q, const double *k, const double *v,
                          const cinfer__ref_attn_opts_t *opts, double *o, double *lse) {
    const double ln2 = log(2.0);
    int64_t q_count;
    int64_t k_count;
    const double *qr;
    const double *kr;
    double *q_rot = NULL;
    double *k_rot = NULL;
    double *scores = NULL;
    double *weights = NULL;
    bool *kept = NULL;
    double *slopes = NULL;
    int status = CINFER__REF_OK;

    if (!cinfer__ref_heads_ok(heads) || qo_len < 0 || kv_len < 0 ||
        !cinfer__ref_opts_ok(opts, heads)) {
        return CINFER__REF_EINVAL;
    }
    if (qo_len == 0) {
        return CINFER__REF_OK;
    }
    if (q == NULL || o == NULL || (kv_len > 0 && (k == NULL || v == NULL))) {
        return CINFER__REF_EINVAL;
    }

    const int64_t hq = heads->num_qo_heads;
    const int64_t hk = heads->num_kv_heads;
    const int64_t dqk = heads->head_dim_qk;
    const int64_t dvo = heads->head_dim_vo;
    const int64_t group = hq / hk;
    if (!cinfer__ref_mul3_ok(qo_len, hq, dqk, &q_count) ||
        !cinfer__ref_mul3_ok(kv_len, hk, dqk, &k_count)) {
        return CINFER__REF_EINVAL;
    }

    scores = cinfer__ref_alloc_doubles(kv_len);
    weights = cinfer__ref_alloc_doubles(kv_len);
    kept = malloc((kv_len > 0 ? (size_t)kv_len : 1) * sizeof(bool));
    if (scores == NULL || weights == NULL || kept == NULL) {
        status = CINFER__REF_ENOMEM;
        goto out_free;
    }

    /* Step 2: rotate every q and k vector once, at its own absolute position. */
    qr = q;
    kr = k;
    if (opts->rope_llama) {
        q_rot = cinfer__ref_alloc_doubles(q_count);
        k_rot = cinfer__ref_alloc_doubles(k_count);
        if (q_rot == NULL || k_rot == NULL) {
            status = CINFER__REF_ENOMEM;
            goto out_free;
        }
        for (int64_t i = 0; i < qo_len; i++) {
            const double pos = (double)(i + kv_len - qo_len);
            for (int64_t h = 0; h < hq; h++) {
                const int64_t off = (i * hq + h) * dqk;
                cinfer__ref_rope(q_rot + off, q + off, dqk, pos, opts->rope_theta,
                                 opts->rope_scale);
            }
        }
        for (int64_t j = 0; j < kv_len; j++) {
            for (int64_t h = 0; h < hk; h++) {
                const int64_t off = (j * hk + h) * dqk;
                cinfer__ref_rope(k_rot + off, k + off, dqk, (double)j, opts->rope_theta,
                                 opts->rope_scale);
            }
        }
        if (opts->rope_round == CINFER__REF_DTYPE_F16 ||
            opts->rope_round == CINFER__REF_DTYPE_BF16) {
            const bool f16 = opts->rope_round == CINFER__REF_DTYPE_F16;
            for (int64_t i = 0; i < q_count; i++)
                q_rot[i] = f16 ? cinfer__ref_f16_to_double(cinfer__ref_double_to_f16(q_rot[i]))
                               : cinfer__ref_bf16_to_double(cinfer__ref_double_to_bf16(q_rot[i]));
            for (int64_t i = 0; i < k_count; i++)
                k_rot[i] = f16 ? cinfer__ref_f16_to_double(cinfer__ref_double_to_f16(k_rot[i]))
                               : cinfer__ref_bf16_to_double(cinfer__ref_double_to_bf16(k_rot[i]));
        }
        qr = q_rot;
        kr = k_rot;
    }

    if (opts->alibi && opts->alibi_slopes == NULL) {
        slopes = cinfer__ref_alloc_doubles(hq);
        if (slopes == NULL) {
            status = CINFER__REF_ENOMEM;
            goto out_free;
        }
        (void)cinfer__ref_alibi_default_slopes(hq, slopes);
    }

    for (int64_t i = 0; i < qo_len; i++) {
        /* Step 1: the query block is the last qo_len tokens of the request. */
        const int64_t p = i + kv_len - qo_len;

        for (int64_t h = 0; h < hq; h++) {
            const int64_t kvh = h / group;
            const double *qi = qr + (i * hq + h) * dqk;
            double *oi = o + (i * hq + h) * dvo;
            int64_t num_kept = 0;
            double row_max = -INFINITY;

            for (int64_t j = 0; j < kv_len; j++) {
                const double *kj = kr + (j * hk + kvh) * dqk;
                double dot = 0.0;
                double s;
                bool keep = true;

                /* Step 3. */
                for (int64_t d = 0; d < dqk; d++) {
                    dot += qi[d] * kj[d];
                }
                s = dot * opts->sm_scale * opts->k_scale;
                /* Step 4. */
                if (opts->alibi) {
                    const double slope =
                        opts->alibi_slopes != NULL ? opts->alibi_slopes[h] : slopes[h];
                    s += slope * (double)(j - p);
                }
                /* Step 5. */
                if (opts->logits_soft_cap > 0.0) {
                    s = opts->logits_soft_cap * tanh(s / opts->logits_soft_cap);
                }
                /* Step 6: every active mask must keep the element. */
                if (opts->causal && j > p) {
                    keep = false;
                }
                if (opts->window_left >= 0 && j < p - opts->window_left) {
                    keep = false;
                }
                if (opts->custom_mask != NULL && opts->custom_mask[i * kv_len + j] == 0) {
                    keep = false;
                }

                scores[j] = s;
                kept[j] = keep;
                if (keep) {
                    num_kept++;
                    if (s > row_max) {
                        row_max = s;
                    }
                }
                if (opts->logits_out != NULL) {
                    opts->logits_out[(h * qo_len + i) * kv_len + j] = keep ? s : -INFINITY;
                }
            }

            for (int64_t d = 0; d < dvo; d++) {
                oi[d] = 0.0;
            }

            /* Step 7. */
            if (opts->variant == CINFER__REF_VARIANT_SIGMOID) {
                for (int64_t j = 0; j < kv_len; j++) {
                    if (!kept[j]) {
                        continue;
                    }
                    const double w =
                        cinfer__ref_sigmoid(scores[j] * opts->sigmoid_scale + opts->sigmoid_bias);
                    const double *vj = v + (j * hk + kvh) * dvo;
                    for (int64_t d = 0; d < dvo; d++) {
                        oi[d] += w * vj[d];
                    }
                }
                for (int64_t d = 0; d < dvo; d++) {
                    oi[d] *= opts->v_scale;
                }
                /* No normalizer, so no lse: the caller's lse buffer is deliberately untouched. */
                continue;
            }

            /*
             * The sink takes part in the maximum so that exp(sink - max) cannot overflow either;
             * it only ever appears in the denominator.
             */
            const bool has_sink = opts->variant == CINFER__REF_VARIANT_SINKS;
            const double sink = has_sink ? opts->sinks[h] : -INFINITY;
            double m = row_max;
            if (has_sink && sink > m) {
                m = sink;
            }

            /*
             * An empty row (or one whose kept logits are all -inf) has a zero numerator; answer
             * with the defined values instead of computing exp(-inf - -inf) = NaN.
             */
            if (m == -INFINITY || num_kept == 0) {
                if (lse != NULL) {
                    lse[i * hq + h] = has_sink ? sink / ln2 : -INFINITY;
                }
                continue;
            }

            double denom = has_sink ? exp(sink - m) : 0.0;
            for (int64_t j = 0; j < kv_len; j++) {
                weights[j] = kept[j] ? exp(scores[j] - m) : 0.0;
                denom += weights[j];
            }
            for (int64_t j = 0; j < kv_len; j++) {
                if (!kept[j]) {
                    continue;
                }
                const double *vj = v + (j * hk + kvh) * dvo;
                for (int64_t d = 0; d < dvo; d++) {
                    oi[d] += weights[j] * vj[d];
                }
            }
            for (int64_t d = 0; d < dvo; d++) {
                oi[d] = oi[d] / denom * opts->v_scale;
            }
            if (lse != NULL) {
                /* log2(sum exp(s)) = (m + ln(sum exp(s - m))) / ln 2. */
                lse[i * hq + h] = (m + log(denom)) / ln2;
            }
        }
    }

out_free:
    free(slopes);
    free(kept);
    free(weights);
    free(scores);
    free(k_rot);
    free(q_rot);
    return status;
}

/* ---------------------------------------------------------------------------------------------- */
/* Layout wrappers */
/* ---------------------------------------------------------------------------------------------- */

int cinfer__ref_strided3_packed(cinfer__ref_strided3_t *t, const void *data,
                                cinfer__ref_dtype_t dtype, cinfer__ref_layout_t layout,
                                int64_t num_tokens, int64_t num_heads, int64_t head_dim) {
    if (t == NULL || num_tokens < 0 || num_heads < 0 || head_dim < 0) {
        return CINFER__REF_EINVAL;
    }
    t->data = data;
    t->dtype = dtype;
    t->stride_dim = 1;
    switch (layout) {
    case CINFER__REF_LAYOUT_NHD:
        t->stride_head = head_dim;
        t->stride_token = num_heads * head_dim;
        return CINFER__REF_OK;
    case CINFER__REF_LAYOUT_HND:
        t->stride_token = head_dim;
        t->stride_head = num_tokens * head_dim;
        return CINFER__REF_OK;
    }
    return CINFER__REF_EINVAL;
}

int cinfer__ref_paged_packed(cinfer__ref_paged_t *t, const void *data, cinfer__ref_dtype_t dtype,
                             cinfer__ref_layout_t layout, int64_t page_size, int64_t num_heads,
                             int64_t head_dim) {
    if (t == NULL || page_size < 0 || num_heads < 0 || head_dim < 0) {
        return CINFER__REF_EINVAL;
    }
    t->data = data;
    t->dtype = dtype;
    t->stride_dim = 1;
    t->stride_page = page_size * num_heads * head_dim;
    switch (layout) {
    case CINFER__REF_LAYOUT_NHD:
        t->stride_head = head_dim;
        t->stride_slot = num_heads * head_dim;
        return CINFER__REF_OK;
    case CINFER__REF_LAYOUT_HND:
        t->stride_slot = head_dim;
        t->stride_head = page_size * head_dim;
        return CINFER__REF_OK;
    }
    return CINFER__REF_EINVAL;
}

int cinfer__ref_page_table_kv_len(const cinfer__ref_page_table_t *table, int64_t b,
                                  int64_t *kv_len) {
    int64_t num_pages;
    int64_t last;

    if (table == NULL || kv_len == NULL || table->indptr == NULL || b < 0 ||
        b >= table->batch_size) {
        return CINFER__REF_EINVAL;
    }
    num_pages = (int64_t)table->indptr[b + 1] - (int64_t)table->indptr[b];
    if (num_pages < 0) {
        return CINFER__REF_EINVAL;
    }
    if (num_pages == 0) {
        *kv_len = 0;
        return CINFER__REF_OK;
    }
    if (table->last_page_len == NULL) {
        return CINFER__REF_EINVAL;
    }
    last = table->last_page_len[b];
    if (last < 1 || last > table->page_size) {
        return CINFER__REF_EINVAL;
    }
    *kv_len = (num_pages - 1) * table->page_size + last;
    return CINFER__REF_OK;
}

int cinfer__ref_page_table_validate(const cinfer__ref_page_table_t *table) {
    if (table == NULL || table->batch_size < 0 || table->page_size < 1 || table->max_pages < 0 ||
        table->indptr == NULL || (table->batch_size > 0 && table->last_page_len == NULL)) {
        return CINFER__REF_EINVAL;
    }
    if (table->indptr[0] < 0) {
        return CINFER__REF_EINVAL;
    }
    for (int64_t b = 0; b < table->batch_size; b++) {
        int64_t kv_len;
        if (table->indptr[b + 1] < table->indptr[b]) {
            return CINFER__REF_EINVAL;
        }
        if (cinfer__ref_page_table_kv_len(table, b, &kv_len) != CINFER__REF_OK) {
            return CINFER__REF_EINVAL;
        }
    }
    if (table->indptr[table->batch_size] > table->indptr[0] && table->indices == NULL) {
        return CINFER__REF_EINVAL;
    }
    for (int64_t p = table->indptr[0]; p < table->indptr[table->batch_size]; p++) {
        if (table->indices[p] < 0 || (int64_t)table->indices[p] >= table->max_pages) {
            return CINFER__REF_EINVAL;
        }
    }
    return CINFER__REF_OK;
}

static bool cinfer__ref_strided3_ok(const cinfer__ref_strided3_t *t) {
    return t != NULL && t->data != NULL && cinfer__ref_dtype_size(t->dtype) != 0;
}

static bool cinfer__ref_paged_ok(const cinfer__ref_paged_t *t) {
    return t != NULL && t->data != NULL && cinfer__ref_dtype_size(t->dtype) != 0;
}

/* Copies tokens [token_begin, token_begin + num_tokens) of t into dst [num_tokens, heads, dim]. */
static void cinfer__ref_gather_strided(double *dst, const cinfer__ref_strided3_t *t,
                                       int64_t token_begin, int64_t num_tokens, int64_t num_heads,
                                       int64_t head_dim) {
    for (int64_t n = 0; n < num_tokens; n++) {
        for (int64_t h = 0; h < num_heads; h++) {
            for (int64_t d = 0; d < head_dim; d++) {
                const int64_t off =
                    (token_begin + n) * t->stride_token + h * t->stride_head + d * t->stride_dim;
                dst[(n * num_heads + h) * head_dim + d] = cinfer__ref_load(t->dtype, t->data, off);
            }
        }
    }
}

/* Copies the kv_len tokens of request b of a paged cache into dst [kv_len, heads, dim]. */
static void cinfer__ref_gather_paged(double *dst, const cinfer__ref_paged_t *t,
                                     const cinfer__ref_page_table_t *table, int64_t b,
                                     int64_t kv_len, int64_t num_heads, int64_t head_dim) {
    for (int64_t n = 0; n < kv_len; n++) {
        /* int64 before any multiplication: page * stride_page can exceed 2^31. */
        const int64_t page = table->indices[(int64_t)table->indptr[b] + n / table->page_size];
        const int64_t slot = n % table->page_size;
        for (int64_t h = 0; h < num_heads; h++) {
            for (int64_t d = 0; d < head_dim; d++) {
                const int64_t off = page * t->stride_page + slot * t->stride_slot +
                                    h * t->stride_head + d * t->stride_dim;
                dst[(n * num_heads + h) * head_dim + d] = cinfer__ref_load(t->dtype, t->data, off);
            }
        }
    }
}

/*
 * Runs the core on one request whose K and V are already gathered: gathers its query rows
 * [q_row, q_row + qo_len) and writes the same rows of o and lse.
 */
static int cinfer__ref_run_request(const cinfer__ref_heads_t *heads,
                                   const cinfer__ref_strided3_t *q, int64_t q_row, int64_t qo_len,
                                   int64_t kv_len, const double *k, const double *v,
                                   const cinfer__ref_attn_opts_t *opts, double *o, double *lse) {
    int64_t q_count;
    double *qd;
    int status;

    if (!cinfer__ref_mul3_ok(qo_len, heads->num_qo_heads, heads->head_dim_qk, &q_count)) {
        return CINFER__REF_EINVAL;
    }
    qd = cinfer__ref_alloc_doubles(q_count);
    if (qd == NULL) {
        return CINFER__REF_ENOMEM;
    }
    cinfer__ref_gather_strided(qd, q, q_row, qo_len, heads->num_qo_heads, heads->head_dim_qk);
    status = cinfer__ref_attention(heads, qo_len, kv_len, qd, k, v, opts,
                                   o + q_row * heads->num_qo_heads * heads->head_dim_vo,
                                   lse != NULL ? lse + q_row * heads->num_qo_heads : NULL);
    free(qd);
    return status;
}

int cinfer__ref_single(const cinfer__ref_heads_t *heads, int64_t qo_len, int64_t kv_len,
                       const cinfer__ref_strided3_t *q, const cinfer__ref_strided3_t *k,
                       const cinfer__ref_strided3_t *v, const cinfer__ref_attn_opts_t *opts,
                       double *o, double *lse) {
    int64_t k_count;
    int64_t v_count;
    double *kd = NULL;
    double *vd = NULL;
    int status;

    if (!cinfer__ref_heads_ok(heads) || qo_len < 0 || kv_len < 0 ||
        !cinfer__ref_opts_ok(opts, heads)) {
        return CINFER__REF_EINVAL;
    }
    if (qo_len == 0) {
        return CINFER__REF_OK;
    }
    if (!cinfer__ref_strided3_ok(q) || o == NULL ||
        (kv_len > 0 && (!cinfer__ref_strided3_ok(k) || !cinfer__ref_strided3_ok(v)))) {
        return CINFER__REF_EINVAL;
    }
    if (!cinfer__ref_mul3_ok(kv_len, heads->num_kv_heads, heads->head_dim_qk, &k_count) ||
        !cinfer__ref_mul3_ok(kv_len, heads->num_kv_heads, heads->head_dim_vo, &v_count)) {
        return CINFER__REF_EINVAL;
    }
    kd = cinfer__ref_alloc_doubles(k_count);
    vd = cinfer__ref_alloc_doubles(v_count);
    if (kd == NULL || vd == NULL) {
        status = CINFER__REF_ENOMEM;
        goto out_free;
    }
    if (kv_len > 0) {
        cinfer__ref_gather_strided(kd, k, 0, kv_len, heads->num_kv_heads, heads->head_dim_qk);
        cinfer__ref_gather_strided(vd, v, 0, kv_len, heads->num_kv_heads, heads->head_dim_vo);
    }
    status = cinfer__ref_run_request(heads, q, 0, qo_len, kv_len, kd, vd, opts, o, lse);

out_free:
    free(vd);
    free(kd);
    return status;
}

/* indptr[0 .. batch_size] starts at a non-negative value and never decreases. */
static bool cinfer__ref_indptr_ok(const int32_t *indptr, int64_t batch_size) {
    if (indptr == NULL || indptr[0] < 0) {
        return false;
    }
    for (int64_t b = 0; b < batch_size; b++) {
        if (indptr[b + 1] < indptr[b]) {
            return false;
        }
    }
    return true;
}

/*
 * Per-request bookkeeping shared by the ragged and paged batch loops: points the request's copy
 * of the options at its slice of the custom mask and of the logits dump, then advances both.
 */
typedef struct {
    const uint8_t *custom_mask;
    const int32_t *mask_indptr;
    int64_t mask_offset;   /* running offset used when mask_indptr is NULL */
    int64_t logits_offset; /* running offset into opts->logits_out */
} cinfer__ref_batch_cursor_t;

static int cinfer__ref_batch_request_opts(cinfer__ref_attn_opts_t *req,
                                          const cinfer__ref_attn_opts_t *opts,
                                          cinfer__ref_batch_cursor_t *cur, int64_t b,
                                          int64_t qo_len, int64_t kv_len, int64_t num_qo_heads) {
    int64_t mask_count;
    int64_t logits_count;

    if (!cinfer__ref_mul_ok(qo_len, kv_len, &mask_count) ||
        !cinfer__ref_mul_ok(mask_count, num_qo_heads, &logits_count)) {
        return CINFER__REF_EINVAL;
    }
    *req = *opts;
    if (cur->custom_mask != NULL) {
        const int64_t start = cur->mask_indptr != NULL ? cur->mask_indptr[b] : cur->mask_offset;
        if (start < 0) {
            return CINFER__REF_EINVAL;
        }
        req->custom_mask = cur->custom_mask + start;
        cur->mask_offset += mask_count;
    }
    if (opts->logits_out != NULL) {
        req->logits_out = opts->logits_out + cur->logits_offset;
        cur->logits_offset += logits_count;
    }
    return CINFER__REF_OK;
}

/* Allocates one request's K and V as doubles [kv_len, Hk, Dqk] and [kv_len, Hk, Dvo]: EINVAL
 * when the sizes overflow, ENOMEM (nothing left allocated) when memory runs out. */
static int cinfer__ref_alloc_kv(const cinfer__ref_heads_t *heads, int64_t kv_len, double **kd,
                                double **vd) {
    int64_t k_count;
    int64_t v_count;

    if (!cinfer__ref_mul3_ok(kv_len, heads->num_kv_heads, heads->head_dim_qk, &k_count) ||
        !cinfer__ref_mul3_ok(kv_len, heads->num_kv_heads, heads->head_dim_vo, &v_count)) {
        return CINFER__REF_EINVAL;
    }
    *kd = cinfer__ref_alloc_doubles(k_count);
    *vd = cinfer__ref_alloc_doubles(v_count);
    if (*kd == NULL || *vd == NULL) {
        free(*vd);
        free(*kd);
        return CINFER__REF_ENOMEM;
    }
    return CINFER__REF_OK;
}

int cinfer__ref_batch_ragged(const cinfer__ref_heads_t *heads, int64_t batch_size,
                             const cinfer__ref_strided3_t *q, const int32_t *qo_indptr,
                             const cinfer__ref_strided3_t *k, const cinfer__ref_strided3_t *v,
                             const int32_t *kv_indptr, const uint8_t *custom_mask,
                             const int32_t *mask_indptr, const cinfer__ref_attn_opts_t *opts,
                             double *o, double *lse) {
    cinfer__ref_batch_cursor_t cur = {custom_mask, mask_indptr, 0, 0};

    if (!cinfer__ref_heads_ok(heads) || batch_size < 0 || !cinfer__ref_opts_ok(opts, heads) ||
        opts->custom_mask != NULL || !cinfer__ref_strided3_ok(q) || !cinfer__ref_strided3_ok(k) ||
        !cinfer__ref_strided3_ok(v) || o == NULL || !cinfer__ref_indptr_ok(qo_indptr, batch_size) ||
        !cinfer__ref_indptr_ok(kv_indptr, batch_size)) {
        return CINFER__REF_EINVAL;
    }

    for (int64_t b = 0; b < batch_size; b++) {
        const int64_t q_row = qo_indptr[b];
        const int64_t qo_len = (int64_t)qo_indptr[b + 1] - q_row;
        const int64_t kv_begin = kv_indptr[b];
        const int64_t kv_len = (int64_t)kv_indptr[b + 1] - kv_begin;
        cinfer__ref_attn_opts_t req;
        double *kd;
        double *vd;
        int status = cinfer__ref_batch_request_opts(&req, opts, &cur, b, qo_len, kv_len,
                                                    heads->num_qo_heads);

        if (status != CINFER__REF_OK) {
            return status;
        }
        status = cinfer__ref_alloc_kv(heads, kv_len, &kd, &vd);
        if (status != CINFER__REF_OK) {
            return status;
        }
        cinfer__ref_gather_strided(kd, k, kv_begin, kv_len, heads->num_kv_heads,
                                   heads->head_dim_qk);
        cinfer__ref_gather_strided(vd, v, kv_begin, kv_len, heads->num_kv_heads,
                                   heads->head_dim_vo);
        status = cinfer__ref_run_request(heads, q, q_row, qo_len, kv_len, kd, vd, &req, o, lse);
        free(vd);
        free(kd);
        if (status != CINFER__REF_OK) {
            return status;
        }
    }
    return CINFER__REF_OK;
}

int cinfer__ref_batch_paged(const cinfer__ref_heads_t *heads, const cinfer__ref_strided3_t *q,
                            const int32_t *qo_indptr, const cinfer__ref_paged_t *k_cache,
                            const cinfer__ref_paged_t *v_cache,
                            const cinfer__ref_page_table_t *table, const uint8_t *custom_mask,
                            const int32_t *mask_indptr, const cinfer__ref_attn_opts_t *opts,
                            double *o, double *lse) {
    cinfer__ref_batch_cursor_t cur = {custom_mask, mask_indptr, 0, 0};

    if (!cinfer__ref_heads_ok(heads) || !cinfer__ref_opts_ok(opts, heads) ||
        opts->custom_mask != NULL || !cinfer__ref_strided3_ok(q) ||
        !cinfer__ref_paged_ok(k_cache) || !cinfer__ref_paged_ok(v_cache) || o == NULL ||
        cinfer__ref_page_table_validate(table) != CINFER__REF_OK) {
        return CINFER__REF_EINVAL;
    }
    if (qo_indptr != NULL && !cinfer__ref_indptr_ok(qo_indptr, table->batch_size)) {
        return CINFER__REF_EINVAL;
    }

    for (int64_t b = 0; b < table->batch_size; b++) {
        /* Without qo_indptr this is batch decode: request b owns exactly query row b. */
        const int64_t q_row = qo_indptr != NULL ? qo_indptr[b] : b;
        const int64_t qo_len = qo_indptr != NULL ? (int64_t)qo_indptr[b + 1] - q_row : 1;
        cinfer__ref_attn_opts_t req;
        int64_t kv_len;
        double *kd;
        double *vd;
        int status;

        if (cinfer__ref_page_table_kv_len(table, b, &kv_len) != CINFER__REF_OK) {
            return CINFER__REF_EINVAL;
        }
        status = cinfer__ref_batch_request_opts(&req, opts, &cur, b, qo_len, kv_len,
                                                heads->num_qo_heads);
        if (status != CINFER__REF_OK) {
            return status;
        }
        status = cinfer__ref_alloc_kv(heads, kv_len, &kd, &vd);
        if (status != CINFER__REF_OK) {
            return status;
        }
        cinfer__ref_gather_paged(kd, k_cache, table, b, kv_len, heads->num_kv_heads,
                                 heads->head_dim_qk);
        cinfer__ref_gather_paged(vd, v_cache, table, b, kv_len, heads->num_kv_heads,
                                 heads->head_dim_vo);
        status = cinfer__ref_run_request(heads, q, q_row, qo_len, kv_len, kd, vd, &req, o, lse);
        free(vd);
        free(kd);
        if (status != CINFER__REF_OK) {
            return status;
        }
    }
    return CINFER__REF_OK;
}
