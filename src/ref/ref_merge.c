/*
 * Merging of attention states (v, lse) of the CPU reference, as SEMANTICS.md defines it: the
 * state over the union of two disjoint key sets, with lse in base 2.
 */
#include "ref/ref.h"

#include <math.h>
#include <stdlib.h>

static bool cinfer__ref_merge_sizes_ok(int64_t n, int64_t num_heads, int64_t head_dim) {
    return n >= 0 && num_heads >= 0 && head_dim >= 0;
}

/*
 * Merges count states of one (row, head) from the definition:
 *   s = log2(sum_k 2^s_k),  v = sum_k 2^s_k v_k / 2^s.
 * State k's vector is v + k * v_stride and its lse is s[k * s_stride]. The largest lse m is
 * subtracted before exponentiating, so the weights 2^(s_k - m) lie in [0, 1] and cannot
 * overflow. Every state empty (all lse -inf, or count 0) gives (0, -inf).
 * The sums go to the scratch acc[head_dim] and v_out is written only after every input has been
 * read, so v_out may alias any input vector.
 */
static void cinfer__ref_merge_row(const double *v, int64_t v_stride, const double *s,
                                  int64_t s_stride, int64_t count, int64_t head_dim, double *acc,
                                  double *v_out, double *s_out) {
    double m = -INFINITY;
    double sum = 0.0;

    for (int64_t k = 0; k < count; k++) {
        if (s[k * s_stride] > m) {
            m = s[k * s_stride];
        }
    }
    for (int64_t d = 0; d < head_dim; d++) {
        acc[d] = 0.0;
    }
    if (m == -INFINITY) {
        for (int64_t d = 0; d < head_dim; d++) {
            v_out[d] = 0.0;
        }
        *s_out = -INFINITY;
        return;
    }
    for (int64_t k = 0; k < count; k++) {
        /* An empty state contributes nothing, whatever its v holds (it may be unwritten). */
        if (s[k * s_stride] == -INFINITY) {
            continue;
        }
        const double w = exp2(s[k * s_stride] - m);
        const double *vk = v + k * v_stride;
        sum += w;
        for (int64_t d = 0; d < head_dim; d++) {
            acc[d] += w * vk[d];
        }
    }
    for (int64_t d = 0; d < head_dim; d++) {
        v_out[d] = acc[d] / sum;
    }
    *s_out = m + log2(sum);
}

/*
 * Two-state merge of one (row, head). The two vectors live at unrelated addresses, so they are
 * copied side by side to fit the strided form cinfer__ref_merge_row reads.
 */
static int cinfer__ref_merge_pair(int64_t head_dim, const double *v_a, double s_a,
                                  const double *v_b, double s_b, double *v_out, double *s_out) {
    double *pair = malloc((size_t)(3 * (head_dim > 0 ? head_dim : 1)) * sizeof(double));
    double s_pair[2];

    if (pair == NULL) {
        return CINFER__REF_ENOMEM;
    }
    for (int64_t d = 0; d < head_dim; d++) {
        pair[d] = v_a[d];
        pair[head_dim + d] = v_b[d];
    }
    s_pair[0] = s_a;
    s_pair[1] = s_b;
    cinfer__ref_merge_row(pair, head_dim, s_pair, 1, 2, head_dim, pair + 2 * head_dim, v_out,
                          s_out);
    free(pair);
    return CINFER__REF_OK;
}

int cinfer__ref_merge_state(int64_t n, int64_t num_heads, int64_t head_dim, const double *v_a,
                            const double *s_a, const double *v_b, const double *s_b, double *v_out,
                            double *s_out) {
    if (!cinfer__ref_merge_sizes_ok(n, num_heads, head_dim)) {
        return CINFER__REF_EINVAL;
    }
    if (n * num_heads > 0 &&
        (v_a == NULL || s_a == NULL || v_b == NULL || s_b == NULL || v_out == NULL)) {
        return CINFER__REF_EINVAL;
    }
    for (int64_t r = 0; r < n * num_heads; r++) {
        double s;
        const int status =
            cinfer__ref_merge_pair(head_dim, v_a + r * head_dim, s_a[r], v_b + r * head_dim, s_b[r],
                                   v_out + r * head_dim, &s);
        if (status != CINFER__REF_OK) {
            return status;
        }
        if (s_out != NULL) {
            s_out[r] = s;
        }
    }
    return CINFER__REF_OK;
}

int cinfer__ref_merge_state_in_place(int64_t n, int64_t num_heads, int64_t head_dim, double *v,
                                     double *s, const double *v_other, const double *s_other,
                                     const uint8_t *mask) {
    if (!cinfer__ref_merge_sizes_ok(n, num_heads, head_dim)) {
        return CINFER__REF_EINVAL;
    }
    if (n * num_heads > 0 && (v == NULL || s == NULL || v_other == NULL || s_other == NULL)) {
        return CINFER__REF_EINVAL;
    }
    for (int64_t i = 0; i < n; i++) {
        if (mask != NULL && mask[i] == 0) {
            continue;
        }
        for (int64_t h = 0; h < num_heads; h++) {
            const int64_t r = i * num_heads + h;
            const int status =
                cinfer__ref_merge_pair(head_dim, v + r * head_dim, s[r], v_other + r * head_dim,
                                       s_other[r], v + r * head_dim, &s[r]);
            if (status != CINFER__REF_OK) {
                return status;
            }
        }
    }
    return CINFER__REF_OK;
}

int cinfer__ref_merge_states(int64_t n, int64_t num_states, int64_t num_heads, int64_t head_dim,
                             const double *v, const double *s, double *v_out, double *s_out) {
    double *acc;

    if (!cinfer__ref_merge_sizes_ok(n, num_heads, head_dim) || num_states < 0) {
        return CINFER__REF_EINVAL;
    }
    if (n * num_heads > 0 && (v_out == NULL || (num_states > 0 && (v == NULL || s == NULL)))) {
        return CINFER__REF_EINVAL;
    }
    acc = malloc((size_t)(head_dim > 0 ? head_dim : 1) * sizeof(double));
    if (acc == NULL) {
        return CINFER__REF_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        for (int64_t h = 0; h < num_heads; h++) {
            /* State k of (row i, head h) is at v[((i * S + k) * H + h) * D], s[(i * S + k) * H +
             * h]. */
            const double *v0 = v != NULL ? v + (i * num_states * num_heads + h) * head_dim : NULL;
            const double *s0 = s != NULL ? s + i * num_states * num_heads + h : NULL;
            double s_merged;
            cinfer__ref_merge_row(v0, num_heads * head_dim, s0, num_heads, num_states, head_dim,
                                  acc, v_out + (i * num_heads + h) * head_dim, &s_merged);
            if (s_out != NULL) {
                s_out[i * num_heads + h] = s_merged;
            }
        }
    }
    free(acc);
    return CINFER__REF_OK;
}
