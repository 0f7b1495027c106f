/*
 * The attention variants the GPU suites run (the built-ins and one user variant defined here),
 * their run-time arguments on the device, and the matching float64 reference options. Each
 * variant's reference comes from its math (src/ref/ref.h), not from the kernel's hooks.
 */
#ifndef CINFER_TEST_SUPPORT_VARIANTS_H
#define CINFER_TEST_SUPPORT_VARIANTS_H

#include "ref/ref.h"
#include "support/gpu.h"

typedef enum tv_kind {
    TV_NONE,          /* default attention */
    TV_SIGMOID,       /* built-in "sigmoid", scale 0.7, bias -0.3 (no LSE) */
    TV_SINKS,         /* built-in "sinks", random sinks in [-2, 4] */
    TV_ALIBI,         /* built-in "alibi", random slopes in [0, 0.2] */
    TV_ALIBI_DEFAULT, /* built-in "alibi", maybe_alibi_slopes NULL: the paper's slopes */
    TV_DUMP,          /* built-in "dump_logits" */
    TV_USER,          /* the user variant below: every hook but the state init */
    TV_MASK,          /* built-in "custom_mask", a random mask (tv_setup_mask) */
    TV_COUNT
} tv_kind;

/* The user variant's math: q * 0.5, then logit = 20 tanh(logit / 20), keep (qo + kv) % 3 != 0,
 * output * 2. */
#define TV_USER_Q_MUL   0.5
#define TV_USER_CAP     20.0
#define TV_USER_OUT_MUL 2.0
static inline int tv_user_keep(int64_t qo_pos, int64_t kv_pos) {
    return (qo_pos + kv_pos) % 3 != 0;
}

typedef struct tv_state {
    tv_kind kind;
    int hq;
    const cinfer_variant_t *variant; /* NULL for TV_NONE */
    double sinks[256], slopes[256];  /* host values per query head */
    cinfer_test_buf d_sinks, d_slopes, d_logits, d_row_offset, d_mask, d_row_stride;
    cinfer_test_tensor t_sinks, t_slopes, t_logits, t_row_offset, t_mask, t_row_stride;
    uint8_t *mask; /* TV_MASK: the requests' [qo_len, kv_len] masks, concatenated (0 = drop) */
    cinfer_arg_t args[4];
    cinfer_args_t list;
    int64_t logits_elems;
    float *logits; /* host copy after tv_download_logits */
} tv_state;

const char *tv_name(tv_kind kind);

/* tv_kinds[k] == k: stable addresses for cmocka's per-test state (one test function, one entry
 * per variant: TV_CMOCKA_TEST). */
extern const tv_kind tv_kinds[TV_COUNT];

/* A cmocka test entry that calls fn with *state = &tv_kinds[kind], named after the variant. */
#define TV_CMOCKA_TEST(fn, kind, teardown)                                                         \
    { "variant " #kind, fn, NULL, teardown, (void *)&tv_kinds[kind] }

/* A variant without softmax has no LSE. */
int tv_has_lse(tv_kind kind);

/*
 * Sets up kind for hq query heads: the variant, random parameters, device tensors and the
 * argument list. TV_DUMP: a float32 logits buffer of logits_elems elements (NaN-poisoned) and
 * row_offset[batch] (int64) with the given strides, so logit (b, h, qo_pos, kv) lands at
 * row_offset[b] + h * head_stride + qo_pos * pos_stride + kv.
 */
void tv_setup(tv_state *s, tv_kind kind, int hq, cinfer_test_rng *rng, int64_t logits_elems,
              int batch, const int64_t *row_offset, int64_t head_stride, int64_t pos_stride);

/* The largest absolute error to accept on out (0.05 for outputs that are averages of values in
 * [-1, 1]): a variant without softmax sums weighted values, so its outputs and their rounding
 * grow with the sum; the tolerance scales with the largest reference magnitude. */
double tv_max_abs_tol(const tv_state *s, const double *ref, int64_t n);

/* TV_MASK: draws a random mask for requests of these lengths (blocks of rows x positions that
 * are kept whole, dropped whole, or random, keeping 0 < p < 1 of their positions, p drawn per
 * request), packs each request's bits from a byte boundary on, and uploads the mask and the row
 * offsets and strides; s->mask holds the booleans for the reference. Call after tv_setup(TV_MASK)
 * and before run. */
void tv_setup_mask(tv_state *s, cinfer_test_rng *rng, int batch, const int *qo_len,
                   const int *kv_len);

/* The argument list for run (NULL for TV_NONE). */
const cinfer_args_t *tv_args(const tv_state *s);

/* Applies the variant to reference options already set for default attention. head >= 0: the
 * reference is called for that one query head (sinks and slopes of that head); head < 0: for all
 * hq heads. Custom masks (TV_USER) are the caller's: see tv_user_keep. */
void tv_ref_opts(const tv_state *s, int head, cinfer__ref_attn_opts_t *o);

/* Downloads the logits buffer (TV_DUMP) into s->logits. */
void tv_download_logits(tv_state *s);

void tv_free(tv_state *s);

#endif
