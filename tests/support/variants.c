#include "support/variants.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The user variant of the suites: it exercises the query, logits and output transforms, the
 * mask, an unused maybe_ tensor and three scalars, written as a user would. */
static const char user_source[] =
    "#define VARIANT_QUERY_TRANSFORM 1\n"
    "__device__ float variant_query_transform(const cinfer_variant_params *params, float q,\n"
    "                                         int batch_idx, int qo_idx, int qo_head_idx,\n"
    "                                         int dim_idx) {\n"
    "    return q * params->q_mul;\n"
    "}\n"
    "#define VARIANT_LOGITS_TRANSFORM 1\n"
    "__device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,\n"
    "                                          int batch_idx, int qo_idx, int kv_idx,\n"
    "                                          int qo_head_idx, int kv_head_idx) {\n"
    "    return params->cap * tanhf(logit / params->cap);\n"
    "}\n"
    "#define VARIANT_LOGITS_MASK 1\n"
    "__device__ bool variant_logits_mask(const cinfer_variant_params *params, int batch_idx,\n"
    "                                    int qo_idx, int kv_idx, int qo_head_idx,\n"
    "                                    int kv_head_idx) {\n"
    "    if (params->maybe_keep)\n"
    "        return params->maybe_keep[kv_idx] != 0;\n"
    "    return (qo_idx + kv_idx) % 3 != 0;\n"
    "}\n"
    "#define VARIANT_OUTPUT_TRANSFORM 1\n"
    "__device__ float variant_output_transform(const cinfer_variant_params *params, float o,\n"
    "                                          int batch_idx, int qo_idx, int qo_head_idx,\n"
    "                                          int dim_idx) {\n"
    "    return o * params->out_mul;\n"
    "}\n";

static const cinfer_variant_t *user_variant(void) {
    static cinfer_variant_t *v;
    if (!v) {
        const cinfer_param_t params[] = {
            {"maybe_keep", CINFER_PARAM_TENSOR, {kDLUInt, 8, 1}},
            {"q_mul", CINFER_PARAM_SCALAR, {kDLFloat, 32, 1}},
            {"cap", CINFER_PARAM_SCALAR, {kDLFloat, 32, 1}},
            {"out_mul", CINFER_PARAM_SCALAR, {kDLFloat, 32, 1}},
        };
        CINFER_TEST_OK(cinfer_variant_create("test_user", user_source, params, 4, &v));
    }
    return v;
}

static const char *const names[TV_COUNT] = {
    "default",     "sigmoid", "sinks",      "alibi", "alibi (default slopes)",
    "dump_logits", "user",    "custom_mask"};

const tv_kind tv_kinds[TV_COUNT] = {TV_NONE,          TV_SIGMOID, TV_SINKS, TV_ALIBI,
                                    TV_ALIBI_DEFAULT, TV_DUMP,    TV_USER,  TV_MASK};

const char *tv_name(tv_kind kind) {
    return (unsigned)kind < TV_COUNT ? names[kind] : "?";
}

int tv_has_lse(tv_kind kind) {
    return kind != TV_SIGMOID;
}

static void upload_f32(cinfer_test_buf *buf, cinfer_test_tensor *t, const double *x, int n) {
    float f[256];
    for (int i = 0; i < n; i++)
        f[i] = (float)x[i];
    CINFER_TEST_OK(cinfer_test_buf_alloc(buf, sizeof(float) * (size_t)n));
    CINFER_TEST_OK(cinfer_test_buf_upload(buf, 0, f, sizeof(float) * (size_t)n));
    const int64_t shape[1] = {n};
    cinfer_test_tensor_init(t, buf, 0, 0, CINFER__DT_F32, 1, shape, NULL);
}

void tv_setup(tv_state *s, tv_kind kind, int hq, cinfer_test_rng *rng, int64_t logits_elems,
              int batch, const int64_t *row_offset, int64_t head_stride, int64_t pos_stride) {
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->hq = hq;
    if (hq > 256)
        fail_msg("tv_setup: at most 256 heads");
    s->list.args = s->args;
    switch (kind) {
    case TV_NONE:
        break;
    case TV_SIGMOID:
        s->variant = cinfer_variant_builtin("sigmoid");
        s->args[0] = CINFER_ARG_F32(0.7f);
        s->args[1] = CINFER_ARG_F32(-0.3f);
        s->list.num_args = 2;
        break;
    case TV_SINKS:
        s->variant = cinfer_variant_builtin("sinks");
        for (int h = 0; h < hq; h++)
            s->sinks[h] = (float)cinfer_test_rng_uniform(rng, -2.0, 4.0);
        upload_f32(&s->d_sinks, &s->t_sinks, s->sinks, hq);
        s->args[0] = CINFER_ARG_TENSOR(&s->t_sinks.t);
        s->list.num_args = 1;
        break;
    case TV_ALIBI:
    case TV_ALIBI_DEFAULT:
        s->variant = cinfer_variant_builtin("alibi");
        if (kind == TV_ALIBI) {
            for (int h = 0; h < hq; h++)
                s->slopes[h] = (float)cinfer_test_rng_uniform(rng, 0.0, 0.2);
            upload_f32(&s->d_slopes, &s->t_slopes, s->slopes, hq);
            s->args[0] = CINFER_ARG_TENSOR(&s->t_slopes.t);
        } else {
            cinfer__ref_alibi_default_slopes(hq, s->slopes);
            s->args[0] = CINFER_ARG_TENSOR(NULL);
        }
        s->args[1] = CINFER_ARG_I32(hq);
        s->list.num_args = 2;
        break;
    case TV_DUMP: {
        s->variant = cinfer_variant_builtin("dump_logits");
        s->logits_elems = logits_elems;
        CINFER_TEST_OK(cinfer_test_buf_alloc(&s->d_logits, sizeof(float) * (size_t)logits_elems));
        CINFER_TEST_OK(cinfer_test_buf_poison(&s->d_logits));
        const int64_t shape[1] = {logits_elems}, rshape[1] = {batch};
        cinfer_test_tensor_init(&s->t_logits, &s->d_logits, 0, 0, CINFER__DT_F32, 1, shape, NULL);
        CINFER_TEST_OK(cinfer_test_buf_alloc(&s->d_row_offset, sizeof(int64_t) * (size_t)batch));
        CINFER_TEST_OK(cinfer_test_buf_upload(&s->d_row_offset, 0, row_offset,
                                              sizeof(int64_t) * (size_t)batch));
        cinfer_test_tensor_init(&s->t_row_offset, &s->d_row_offset, 0, 0, CINFER__DT_NONE, 1,
                                rshape, NULL);
        s->t_row_offset.t.dtype = (DLDataType){kDLInt, 64, 1};
        s->args[0] = CINFER_ARG_TENSOR(&s->t_logits.t);
        s->args[1] = CINFER_ARG_TENSOR(&s->t_row_offset.t);
        s->args[2] = CINFER_ARG_I64(head_stride);
        s->args[3] = CINFER_ARG_I64(pos_stride);
        s->list.num_args = 4;
        break;
    }
    case TV_MASK:
        s->variant = cinfer_variant_builtin("custom_mask");
        s->list.num_args = 3; /* filled by tv_setup_mask */
        break;
    case TV_USER:
        s->variant = user_variant();
        s->args[0] = CINFER_ARG_TENSOR(NULL);
        s->args[1] = CINFER_ARG_F32((float)TV_USER_Q_MUL);
        s->args[2] = CINFER_ARG_F32((float)TV_USER_CAP);
        s->args[3] = CINFER_ARG_F32((float)TV_USER_OUT_MUL);
        s->list.num_args = 4;
        break;
    default:
        fail_msg("tv_setup: unknown kind %d", (int)kind);
    }
}

double tv_max_abs_tol(const tv_state *s, const double *ref, int64_t n) {
    if (s->kind != TV_SIGMOID)
        return 0.05;
    double m = 1.0;
    for (int64_t i = 0; i < n; i++)
        m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
    return 0.05 * m;
}

void tv_setup_mask(tv_state *s, cinfer_test_rng *rng, int batch, const int *qo_len,
                   const int *kv_len) {
    int64_t total = 0, bytes = 0;
    for (int b = 0; b < batch; b++) {
        total += (int64_t)qo_len[b] * kv_len[b];
        bytes += ((int64_t)qo_len[b] * kv_len[b] + 7) / 8;
    }
    free(s->mask);
    s->mask = malloc((size_t)total + 1);
    uint8_t *packed = calloc((size_t)bytes + 1, 1);
    int64_t *row_offset = malloc(sizeof(int64_t) * (size_t)(batch + 1));
    int32_t *row_stride = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int64_t at = 0, byte = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t n = (int64_t)qo_len[b] * kv_len[b];
        const double keep = cinfer_test_rng_uniform(rng, 0.2, 0.9);
        /* Blocks of 16..64 rows by 64..256 positions: kept whole, dropped whole or random, so
         * that KV tiles whose positions a warp's rows all keep (prefill then skips the per-element
         * test) and rows that keep nothing occur beside random bits. */
        const int block_rows = 16 << cinfer_test_rng_below(rng, 3);
        const int block_cols = 64 << cinfer_test_rng_below(rng, 3);
        uint8_t kind[64][64]; /* per block: 0 drop, 1 keep, 2 random */
        for (int r = 0; r < 64; r++)
            for (int c = 0; c < 64; c++) {
                const uint64_t k = cinfer_test_rng_below(rng, 8);
                kind[r][c] = k < 3 ? 1 : k < 5 ? 0 : 2;
            }
        for (int64_t i = 0; i < n; i++) {
            const int64_t row = i / kv_len[b], col = i % kv_len[b];
            const int k = kind[row / block_rows % 64][col / block_cols % 64];
            const uint8_t bit = k == 2 ? cinfer_test_rng_uniform(rng, 0.0, 1.0) < keep : (uint8_t)k;
            s->mask[at + i] = bit;
            packed[byte + i / 8] |= (uint8_t)(bit << (i % 8));
        }
        row_stride[b] = kv_len[b];
        row_offset[b] = 8 * byte - (int64_t)(kv_len[b] - qo_len[b]) * kv_len[b];
        at += n;
        byte += (n + 7) / 8;
    }
    /* The mask starts 0..3 bytes past a 4-byte boundary (the kernels read it in aligned words). */
    const size_t shift = (size_t)cinfer_test_rng_below(rng, 4);
    CINFER_TEST_OK(cinfer_test_buf_alloc(&s->d_mask, (size_t)bytes + 1 + shift));
    CINFER_TEST_OK(cinfer_test_buf_upload(&s->d_mask, shift, packed, (size_t)bytes + 1));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&s->d_row_offset, sizeof(int64_t) * (size_t)batch));
    CINFER_TEST_OK(
        cinfer_test_buf_upload(&s->d_row_offset, 0, row_offset, sizeof(int64_t) * (size_t)batch));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&s->d_row_stride, sizeof(int32_t) * (size_t)batch));
    CINFER_TEST_OK(
        cinfer_test_buf_upload(&s->d_row_stride, 0, row_stride, sizeof(int32_t) * (size_t)batch));
    const int64_t mshape[1] = {bytes + 1}, bshape[1] = {batch};
    cinfer_test_tensor_init(&s->t_mask, &s->d_mask, shift, 0, CINFER__DT_U8, 1, mshape, NULL);
    cinfer_test_tensor_init(&s->t_row_offset, &s->d_row_offset, 0, 0, CINFER__DT_NONE, 1, bshape,
                            NULL);
    s->t_row_offset.t.dtype = (DLDataType){kDLInt, 64, 1};
    cinfer_test_tensor_init(&s->t_row_stride, &s->d_row_stride, 0, 0, CINFER__DT_I32, 1, bshape,
                            NULL);
    s->args[0] = CINFER_ARG_TENSOR(&s->t_mask.t);
    s->args[1] = CINFER_ARG_TENSOR(&s->t_row_offset.t);
    s->args[2] = CINFER_ARG_TENSOR(&s->t_row_stride.t);
    s->list.num_args = 3;
    free(packed);
    free(row_offset);
    free(row_stride);
}

const cinfer_args_t *tv_args(const tv_state *s) {
    return s->kind == TV_NONE ? NULL : &s->list;
}

void tv_ref_opts(const tv_state *s, int head, cinfer__ref_attn_opts_t *o) {
    const int h0 = head < 0 ? 0 : head;
    switch (s->kind) {
    case TV_SIGMOID:
        o->variant = CINFER__REF_VARIANT_SIGMOID;
        o->sigmoid_scale = 0.7f; /* the float the kernel got */
        o->sigmoid_bias = -0.3f;
        break;
    case TV_SINKS:
        o->variant = CINFER__REF_VARIANT_SINKS;
        o->sinks = &s->sinks[h0];
        break;
    case TV_ALIBI:
    case TV_ALIBI_DEFAULT:
        o->alibi = true;
        o->alibi_slopes = &s->slopes[h0];
        break;
    case TV_USER:
        o->sm_scale *= TV_USER_Q_MUL;
        o->logits_soft_cap = TV_USER_CAP;
        o->v_scale *= TV_USER_OUT_MUL;
        break;
    default:
        break;
    }
}

void tv_download_logits(tv_state *s) {
    free(s->logits);
    s->logits = malloc(sizeof(float) * (size_t)(s->logits_elems + 1));
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&s->d_logits));
    CINFER_TEST_OK(cinfer_test_buf_download(&s->d_logits, 0, s->logits,
                                            sizeof(float) * (size_t)s->logits_elems));
}

void tv_free(tv_state *s) {
    cinfer_test_buf_free(&s->d_sinks);
    cinfer_test_buf_free(&s->d_slopes);
    cinfer_test_buf_free(&s->d_logits);
    cinfer_test_buf_free(&s->d_row_offset);
    cinfer_test_buf_free(&s->d_mask);
    cinfer_test_buf_free(&s->d_row_stride);
    free(s->logits);
    free(s->mask);
    memset(s, 0, sizeof *s);
}
