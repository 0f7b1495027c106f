/*
 * apply_rope, apply_rope_pos_ids, their Llama 3.1 forms and apply_rope_with_cos_sin_cache:
 * argument checks, frequencies (float64, on the host), thread mapping and launch of
 * kernels/rope.cu.
 */
#include <math.h>
#include <string.h>

#include "cinfer.h"
#include "jit/jit.h"
#include "ops/tensor.h"
#include "rope_params.h"

#define MAX_HEAD_DIM 1024
#define INT32_LIMIT  2147483647ll

/* True if every row of t starts on a 16-byte boundary. */
static bool rows_aligned16(const DLTensor *t) {
    const int64_t elem = (int64_t)cinfer__dtype_size(cinfer__tensor_dtype(t));
    if ((uintptr_t)cinfer__tensor_data(t) % 16 != 0)
        return false;
    for (int i = 0; i < t->ndim - 1; i++)
        if (t->shape[i] > 1 && (cinfer__tensor_stride(t, i) * elem) % 16 != 0)
            return false;
    return true;
}

static cinfer_status_t check_options(const cinfer_rope_options_t *o, bool llama31) {
    if (o->size < sizeof *o || o->version != CINFER_ROPE_OPTIONS_VERSION)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options: size %zu / version %u; initialize it with %s (size %zu, "
                             "version %u)",
                             o->size, o->version,
                             llama31 ? "CINFER_LLAMA31_ROPE_OPTIONS_INIT"
                                     : "CINFER_ROPE_OPTIONS_INIT",
                             sizeof *o, CINFER_ROPE_OPTIONS_VERSION);
    if (o->rotary_dim < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->rotary_dim = %d, expected 0 (the head dim) or an even "
                             "value >= 2",
                             o->rotary_dim);
    if (o->interleave != 0 && o->interleave != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->interleave = %d, expected 0 (rotate halves) or 1 "
                             "(interleaved pairs)",
                             o->interleave);
    if (!isfinite(o->rope_scale) || o->rope_scale <= 0.0f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->rope_scale = %g, expected a finite value > 0",
                             (double)o->rope_scale);
    if (!isfinite(o->rope_theta) || o->rope_theta <= 0.0f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->rope_theta = %g, expected a finite value > 0",
                             (double)o->rope_theta);
    if (!llama31)
        return CINFER_STATUS_SUCCESS;
    if (!isfinite(o->low_freq_factor) || o->low_freq_factor <= 0.0f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->low_freq_factor = %g, expected a finite value > 0",
                             (double)o->low_freq_factor);
    if (!isfinite(o->high_freq_factor) || o->high_freq_factor <= o->low_freq_factor)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->high_freq_factor = %g, expected a finite value > "
                             "low_freq_factor = %g",
                             (double)o->high_freq_factor, (double)o->low_freq_factor);
    if (!isfinite(o->old_context_len) || o->old_context_len <= 0.0f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->old_context_len = %g, expected a finite value > 0",
                             (double)o->old_context_len);
    return CINFER_STATUS_SUCCESS;
}

/* One call, being assembled. */
typedef struct rope_call {
    cinfer_rope_params p;
    cinfer__dtype_t dtype;
    int64_t head_dim;
    bool vec;
} rope_call_t;

/* An output argument: NULL means in place (the input), else the input's shape and dtype; the
 * tensor written has distinct elements either way. */
static cinfer_status_t check_output(const cinfer_context_t *ctx, const char *arg,
                                    const DLTensor *out, const char *in_arg, const DLTensor *in) {
    if (!out)
        return cinfer__tensor_check_distinct(in_arg, in);
    CINFER__CHECK(
        cinfer__tensor_check(ctx, arg, out, 3, in->shape, CINFER__DTS(cinfer__tensor_dtype(in))));
    return cinfer__tensor_check_distinct(arg, out);
}

/*
 * An output (the input itself when in place) may be its own input exactly, each thread reading
 * its elements before it writes them, but must not otherwise overlap it, the other input, the
 * other output or the `n` (at most 2) position tables, which other threads read.
 */
static cinfer_status_t check_apart(const DLTensor *q, const DLTensor *k, const DLTensor *q_out,
                                   const DLTensor *k_out, const cinfer__tensor_arg_t *tables,
                                   int n) {
    const char *q_name = q_out ? "q_out" : "q (rotated in place)";
    const char *k_name = k_out ? "k_out" : "k (rotated in place)";
    const DLTensor *qw = q_out ? q_out : q, *kw = k_out ? k_out : k;
    cinfer__tensor_arg_t for_q[5] = {{"q", q, true}, {k_name, kw, false}, {"k", k, false}};
    cinfer__tensor_arg_t for_k[4] = {{"k", k, true}, {"q", q, false}};
    for (int i = 0; i < n; i++)
        for_q[3 + i] = for_k[2 + i] = tables[i];
    CINFER__CHECK(cinfer__tensor_check_disjoint(q_name, qw, for_q, 3 + n));
    return cinfer__tensor_check_disjoint(k_name, kw, for_k, 2 + n);
}

/*
 * Checks q, k and the outputs, then fills the tensors, rotary dim and thread mapping of c->p.
 * rotary_dim: the rotated elements (0 = the head dim); rotary_arg names where it came from.
 */
static cinfer_status_t setup(cinfer_context_t *ctx, const DLTensor *q, const DLTensor *k,
                             DLTensor *q_out, DLTensor *k_out, int64_t rotary_dim,
                             const char *rotary_arg, int interleave, rope_call_t *c) {
    memset(c, 0, sizeof *c);
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    CINFER__CHECK(cinfer__tensor_check(ctx, "q", q, 3, NULL, CINFER__DTS_HALF));
    c->dtype = cinfer__tensor_dtype(q);
    const int64_t nnz = q->shape[0], D = q->shape[2];
    const int64_t k_shape[3] = {nnz, -1, D};
    CINFER__CHECK(cinfer__tensor_check(ctx, "k", k, 3, k_shape, CINFER__DTS(c->dtype)));
    CINFER__CHECK(check_output(ctx, "q_out", q_out, "q", q));
    CINFER__CHECK(check_output(ctx, "k_out", k_out, "k", k));
    if (D < 1 || D > MAX_HEAD_DIM)
        return cinfer__error(D < 1 ? CINFER_STATUS_INVALID_ARGUMENT : CINFER_STATUS_UNSUPPORTED,
                             "q: head dim %lld, expected 1..%d", (long long)D, MAX_HEAD_DIM);
    const int64_t r = rotary_dim ? rotary_dim : D;
    const int64_t r_max = D < 2 * CINFER_ROPE_MAX_PAIRS ? D : 2 * CINFER_ROPE_MAX_PAIRS;
    if (r % 2 != 0 || r < 2 || r > r_max)
        return cinfer__error(
            r > 2 * CINFER_ROPE_MAX_PAIRS && r <= D ? CINFER_STATUS_UNSUPPORTED
                                                    : CINFER_STATUS_INVALID_ARGUMENT,
            "%s = %lld with head dim %lld: expected an even rotary dim in [2, "
            "%lld] (at most the head dim and %d)",
            rotary_arg, (long long)r, (long long)D, (long long)r_max, 2 * CINFER_ROPE_MAX_PAIRS);
    if (q->shape[1] + k->shape[1] > INT32_LIMIT)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "q, k: %lld + %lld heads, at most 2^31 - 1 together",
                             (long long)q->shape[1], (long long)k->shape[1]);
    c->head_dim = D;

    const DLTensor *outs[2] = {q_out ? q_out : q, k_out ? k_out : k};
    const DLTensor *ins[2] = {q, k};
    cinfer_rope_params *p = &c->p;
    for (int i = 0; i < 2; i++) {
        p->in[i] = cinfer__tensor_data(ins[i]);
        p->out[i] = cinfer__tensor_data(outs[i]);
        p->in_stride[i][0] = cinfer__tensor_step(ins[i], 0);
        p->in_stride[i][1] = cinfer__tensor_step(ins[i], 1);
        p->out_stride[i][0] = cinfer__tensor_step(outs[i], 0);
        p->out_stride[i][1] = cinfer__tensor_step(outs[i], 1);
        p->num_heads[i] = (int)ins[i]->shape[1];
    }
    p->nnz = nnz;
    p->rotary_dim = (int)r;
    p->interleave = interleave;

    /* 16-byte units need whole chunks: the halves (or the pairs) and the pass-through part. */
    c->vec = D % 8 == 0 && r % (interleave ? 8 : 16) == 0 && rows_aligned16(q) &&
             rows_aligned16(k) && rows_aligned16(outs[0]) && rows_aligned16(outs[1]);
    const int v = c->vec ? 8 : 1;
    p->rot_units = CINFER_ROPE_ROT_UNITS((int)r, interleave, v);
    /* In place, the elements past the rotary dim are already where they belong. */
    const bool in_place = cinfer__tensor_same(outs[0], q) && cinfer__tensor_same(outs[1], k);
    p->units = p->rot_units + (in_place ? 0 : CINFER_ROPE_PASS_UNITS((int)D, (int)r, v));
    /* A token's threads: one per unit of a row, as many rows at once as the block allows, and
     * several tokens per block when one token's rows need fewer threads than the block has. */
    const int rows = p->num_heads[0] + p->num_heads[1];
    const int block = CINFER_ROPE_BLOCK;
    p->lanes = p->units <= block ? p->units : block;
    p->rows_per_pass = p->units <= block ? block / p->units : 1;
    if (rows > 0 && p->rows_per_pass > rows)
        p->rows_per_pass = rows;
    p->tokens_per_block = block / (p->lanes * p->rows_per_pass);
    return CINFER_STATUS_SUCCESS;
}

/* Frequencies of the computed forms, in float64: theta^(-2j/R) / scale, or the Llama 3.1 blend. */
static void fill_freq(cinfer_rope_params *p, const cinfer_rope_options_t *o, bool llama31) {
    const double pi = 3.14159265358979323846;
    const int pairs = p->rotary_dim / 2;
    for (int j = 0; j < pairs; j++) {
        const double base = pow((double)o->rope_theta, -2.0 * j / p->rotary_dim);
        double f = base / o->rope_scale;
        if (llama31) {
            double s = ((double)o->old_context_len * base / (2.0 * pi) - o->low_freq_factor) /
                       ((double)o->high_freq_factor - o->low_freq_factor);
            s = s < 0.0 ? 0.0 : s > 1.0 ? 1.0 : s;
            f = (1.0 - s) * base / o->rope_scale + s * base;
        }
        p->freq[j] = f;
    }
}

static cinfer_status_t launch(cinfer_context_t *ctx, cinfer__op_t op, rope_call_t *c,
                              CUstream stream) {
    const cinfer_rope_params *p = &c->p;
    if (p->nnz == 0 || p->num_heads[0] + p->num_heads[1] == 0)
        return CINFER_STATUS_SUCCESS;
    cinfer__spec_t spec;
    cinfer__spec_init(&spec, op);
    spec.dtype_o = c->dtype;
    spec.head_dim_vo = (int32_t)c->head_dim;
    spec.vec = c->vec ? 8 : 1;
    cinfer__kernel_t k;
    CINFER__CHECK(cinfer__jit_kernel(ctx, &spec, &k));
    CINFER__CHECK(cinfer__context_activate(ctx));
    const int64_t blocks = (p->nnz + p->tokens_per_block - 1) / p->tokens_per_block;
    if (blocks > INT32_LIMIT)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "q: %lld tokens is more than one launch can hold", (long long)p->nnz);
    void *args[] = {&c->p};
    CINFER__CU(ctx->cu,
               cuLaunchKernel(k.function, (unsigned)blocks, 1, 1, CINFER_ROPE_BLOCK, 1, 1, 0,
                              stream, args, NULL),
               "launching the RoPE kernel");
    return CINFER_STATUS_SUCCESS;
}

/* The ragged forms: indptr [batch_size + 1] and offsets [batch_size]. */
static cinfer_status_t ragged(cinfer_context_t *ctx, const cinfer_rope_options_t *o, bool llama31,
                              const DLTensor *q, const DLTensor *k, DLTensor *q_out,
                              DLTensor *k_out, const DLTensor *indptr, const DLTensor *offsets,
                              CUstream stream) {
    const cinfer_rope_options_t plain = CINFER_ROPE_OPTIONS_INIT;
    const cinfer_rope_options_t llama = CINFER_LLAMA31_ROPE_OPTIONS_INIT;
    if (!o)
        o = llama31 ? &llama : &plain;
    CINFER__CHECK(check_options(o, llama31));
    rope_call_t c;
    CINFER__CHECK(
        setup(ctx, q, k, q_out, k_out, o->rotary_dim, "options->rotary_dim", o->interleave, &c));
    const int64_t any[1] = {-1};
    CINFER__CHECK(cinfer__tensor_check(ctx, "indptr", indptr, 1, any, CINFER__DTS(CINFER__DT_I32)));
    const int64_t batch_size = indptr->shape[0] - 1;
    if (batch_size < 0 || batch_size > INT32_LIMIT - 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "indptr: %lld entries, expected batch_size + 1 with 0 <= batch_size "
                             "< 2^31 - 1",
                             (long long)indptr->shape[0]);
    const int64_t offsets_shape[1] = {batch_size};
    CINFER__CHECK(cinfer__tensor_check(ctx, "offsets", offsets, 1, offsets_shape,
                                       CINFER__DTS(CINFER__DT_I32)));
    const cinfer__tensor_arg_t tables[2] = {{"indptr", indptr, false}, {"offsets", offsets, false}};
    CINFER__CHECK(check_apart(q, k, q_out, k_out, tables, 2));
    c.p.indptr = cinfer__tensor_data(indptr);
    c.p.offsets = cinfer__tensor_data(offsets);
    c.p.batch_size = (int)batch_size;
    fill_freq(&c.p, o, llama31);
    return launch(ctx, CINFER__OP_ROPE, &c, stream);
}

/* The position-id forms: pos_ids [nnz]. */
static cinfer_status_t by_pos_ids(cinfer_context_t *ctx, const cinfer_rope_options_t *o,
                                  bool llama31, const DLTensor *q, const DLTensor *k,
                                  DLTensor *q_out, DLTensor *k_out, const DLTensor *pos_ids,
                                  CUstream stream) {
    const cinfer_rope_options_t plain = CINFER_ROPE_OPTIONS_INIT;
    const cinfer_rope_options_t llama = CINFER_LLAMA31_ROPE_OPTIONS_INIT;
    if (!o)
        o = llama31 ? &llama : &plain;
    CINFER__CHECK(check_options(o, llama31));
    rope_call_t c;
    CINFER__CHECK(
        setup(ctx, q, k, q_out, k_out, o->rotary_dim, "options->rotary_dim", o->interleave, &c));
    const int64_t shape[1] = {q->shape[0]};
    CINFER__CHECK(
        cinfer__tensor_check(ctx, "pos_ids", pos_ids, 1, shape, CINFER__DTS(CINFER__DT_I32)));
    const cinfer__tensor_arg_t table = {"pos_ids", pos_ids, false};
    CINFER__CHECK(check_apart(q, k, q_out, k_out, &table, 1));
    c.p.pos_ids = cinfer__tensor_data(pos_ids);
    fill_freq(&c.p, o, llama31);
    return launch(ctx, CINFER__OP_ROPE_POS_IDS, &c, stream);
}

cinfer_status_t cinfer_apply_rope(cinfer_context_t *ctx, const cinfer_rope_options_t *options,
                                  const DLTensor *q, const DLTensor *k, DLTensor *q_out,
                                  DLTensor *k_out, const DLTensor *indptr, const DLTensor *offsets,
                                  CUstream stream) {
    return ragged(ctx, options, false, q, k, q_out, k_out, indptr, offsets, stream);
}

cinfer_status_t cinfer_apply_llama31_rope(cinfer_context_t *ctx,
                                          const cinfer_rope_options_t *options, const DLTensor *q,
                                          const DLTensor *k, DLTensor *q_out, DLTensor *k_out,
                                          const DLTensor *indptr, const DLTensor *offsets,
                                          CUstream stream) {
    return ragged(ctx, options, true, q, k, q_out, k_out, indptr, offsets, stream);
}

cinfer_status_t cinfer_apply_rope_pos_ids(cinfer_context_t *ctx,
                                          const cinfer_rope_options_t *options, const DLTensor *q,
                                          const DLTensor *k, DLTensor *q_out, DLTensor *k_out,
                                          const DLTensor *pos_ids, CUstream stream) {
    return by_pos_ids(ctx, options, false, q, k, q_out, k_out, pos_ids, stream);
}

cinfer_status_t cinfer_apply_llama31_rope_pos_ids(cinfer_context_t *ctx,
                                                  const cinfer_rope_options_t *options,
                                                  const DLTensor *q, const DLTensor *k,
                                                  DLTensor *q_out, DLTensor *k_out,
                                                  const DLTensor *pos_ids, CUstream stream) {
    return by_pos_ids(ctx, options, true, q, k, q_out, k_out, pos_ids, stream);
}

cinfer_status_t cinfer_apply_rope_with_cos_sin_cache(cinfer_context_t *ctx, const DLTensor *q,
                                                     const DLTensor *k, DLTensor *q_out,
                                                     DLTensor *k_out, const DLTensor *positions,
                                                     const DLTensor *cos_sin_cache, int interleave,
                                                     CUstream stream) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    if (interleave != 0 && interleave != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "interleave = %d, expected 0 (rotate halves, is_neox) or 1 "
                             "(interleaved pairs)",
                             interleave);
    CINFER__CHECK(cinfer__tensor_check(ctx, "cos_sin_cache", cos_sin_cache, 2, NULL,
                                       CINFER__DTS(CINFER__DT_F32)));
    /* The table's width is the rotary dim (0 would mean "the head dim" to setup). */
    if (cos_sin_cache->shape[1] == 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "cos_sin_cache: shape [%lld, 0]; its width is the rotary dim, "
                             "expected an even value >= 2",
                             (long long)cos_sin_cache->shape[0]);
    rope_call_t c;
    CINFER__CHECK(setup(ctx, q, k, q_out, k_out, cos_sin_cache->shape[1],
                        "cos_sin_cache: width (the rotary dim)", interleave, &c));
    const int64_t shape[1] = {q->shape[0]};
    CINFER__CHECK(
        cinfer__tensor_check(ctx, "positions", positions, 1, shape, CINFER__DTS(CINFER__DT_I32)));
    const cinfer__tensor_arg_t tables[2] = {{"positions", positions, false},
                                            {"cos_sin_cache", cos_sin_cache, false}};
    CINFER__CHECK(check_apart(q, k, q_out, k_out, tables, 2));
    c.p.pos_ids = cinfer__tensor_data(positions);
    c.p.cos_sin_cache = cinfer__tensor_data(cos_sin_cache);
    c.p.cache_stride = cinfer__tensor_step(cos_sin_cache, 0);
    c.p.cache_rows = cos_sin_cache->shape[0];
    return launch(ctx, CINFER__OP_ROPE_COS_SIN_CACHE, &c, stream);
}
