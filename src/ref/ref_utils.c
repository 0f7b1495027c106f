/*
 * CPU reference of the KV-cache and position utilities; see ref_utils.h.
 */
#include "ref/ref_utils.h"

#include <math.h>
#include <string.h>

#define REF_PI 3.14159265358979323846

/* ---- paged KV append and page-table helpers ---- */

uint32_t cinfer__ref_cache_encode(cinfer__ref_dtype_t dtype, double x) {
    switch (dtype) {
    case CINFER__REF_DTYPE_F16:
        return cinfer__ref_double_to_f16(x);
    case CINFER__REF_DTYPE_BF16:
        return cinfer__ref_double_to_bf16(x);
    case CINFER__REF_DTYPE_F32:
        return cinfer__ref_double_to_f32(x);
    case CINFER__REF_DTYPE_E4M3:
        /* The encoder already saturates e4m3 (satfinite). */
        return cinfer__ref_double_to_e4m3(x);
    case CINFER__REF_DTYPE_E5M2: {
        /* Saturate what the encoder would turn into inf: values at or above the midpoint between
         * the largest finite value 57344 = 1.75 * 2^15 and the next step 65536 round up. */
        if (isnan(x))
            return cinfer__ref_double_to_e5m2(x);
        const uint8_t sign = signbit(x) ? 0x80 : 0x00;
        if (fabs(x) >= 61440.0)
            return sign | 0x7B;
        return cinfer__ref_double_to_e5m2(x);
    }
    }
    return 0;
}

static void store_bits(cinfer__ref_dtype_t dtype, void *base, int64_t index, uint32_t bits) {
    const size_t size = cinfer__ref_dtype_size(dtype);
    unsigned char *p = (unsigned char *)base + index * (int64_t)size;
    if (size == 1) {
        p[0] = (unsigned char)bits;
    } else if (size == 2) {
        const uint16_t v = (uint16_t)bits;
        memcpy(p, &v, 2);
    } else {
        memcpy(p, &bits, 4);
    }
}

int cinfer__ref_append_paged_kv_cache(
    int64_t nnz, int64_t num_heads, int64_t head_dim, const cinfer__ref_strided3_t *k,
    const cinfer__ref_strided3_t *v, const int32_t *batch_indices, const int32_t *positions,
    int64_t batch_size, const int32_t *kv_indptr, const int32_t *kv_indices, int64_t num_indices,
    int64_t max_pages, int64_t page_size, const cinfer__ref_paged_out_t *k_cache,
    const cinfer__ref_paged_out_t *v_cache, double k_scale, double v_scale, int32_t *error_flags) {
    if (nnz < 0 || num_heads < 0 || head_dim < 0 || batch_size < 0 || num_indices < 0 ||
        max_pages < 0 || page_size < 1 || !(isfinite(k_scale) && k_scale > 0) ||
        !(isfinite(v_scale) && v_scale > 0) || !k || !v || !k_cache || !v_cache || !kv_indptr)
        return CINFER__REF_EINVAL;
    if (nnz > 0 && (!batch_indices || !positions))
        return CINFER__REF_EINVAL;
    for (int64_t i = 0; i < nnz; i++) {
        const int64_t b = batch_indices[i], pos = positions[i];
        int32_t error = 0;
        int64_t page = 0;
        if (b == -1)
            continue;
        if (b < 0 || b >= batch_size) {
            error = CINFER__REF_APPEND_ERROR_BATCH_INDEX;
        } else {
            const int64_t begin = kv_indptr[b], pages = (int64_t)kv_indptr[b + 1] - begin;
            if (pos < 0 || pos >= pages * page_size) {
                error = CINFER__REF_APPEND_ERROR_POSITION;
            } else {
                const int64_t entry = begin + pos / page_size;
                if (entry < 0 || entry >= num_indices || !kv_indices)
                    error = CINFER__REF_APPEND_ERROR_PAGE;
                else if ((page = kv_indices[entry]) < 0 || page >= max_pages)
                    error = CINFER__REF_APPEND_ERROR_PAGE;
            }
        }
        if (error) {
            if (error_flags)
                *error_flags |= error;
            continue;
        }
        const int64_t slot = pos % page_size;
        const cinfer__ref_strided3_t *src[2] = {k, v};
        const cinfer__ref_paged_out_t *dst[2] = {k_cache, v_cache};
        const double scale[2] = {k_scale, v_scale};
        for (int kv = 0; kv < 2; kv++) {
            for (int64_t h = 0; h < num_heads; h++) {
                for (int64_t d = 0; d < head_dim; d++) {
                    const double x =
                        cinfer__ref_load(src[kv]->dtype, src[kv]->data,
                                         i * src[kv]->stride_token + h * src[kv]->stride_head +
                                             d * src[kv]->stride_dim);
                    const int64_t at = page * dst[kv]->stride_page + slot * dst[kv]->stride_slot +
                                       h * dst[kv]->stride_head + d * dst[kv]->stride_dim;
                    store_bits(dst[kv]->dtype, dst[kv]->data, at,
                               cinfer__ref_cache_encode(dst[kv]->dtype, x / scale[kv]));
                }
            }
        }
    }
    return CINFER__REF_OK;
}

int cinfer__ref_batch_indices_positions(int64_t batch_size, const int32_t *append_indptr,
                                        const int32_t *seq_lens, int64_t nnz,
                                        int32_t *batch_indices, int32_t *positions) {
    if (batch_size < 0 || nnz < 0 || !append_indptr || (batch_size > 0 && !seq_lens) ||
        (nnz > 0 && (!batch_indices || !positions)))
        return CINFER__REF_EINVAL;
    for (int64_t i = 0; i < nnz; i++) {
        int64_t found = -1;
        for (int64_t b = 0; b < batch_size; b++)
            if (append_indptr[b] <= i && i < append_indptr[b + 1])
                found = b;
        if (found < 0) {
            batch_indices[i] = -1;
            positions[i] = -1;
            continue;
        }
        const int64_t begin = append_indptr[found];
        const int64_t len = (int64_t)append_indptr[found + 1] - begin;
        batch_indices[i] = (int32_t)found;
        positions[i] = (int32_t)(seq_lens[found] - len + (i - begin));
    }
    return CINFER__REF_OK;
}

int cinfer__ref_seq_lens(int64_t batch_size, const int32_t *kv_indptr,
                         const int32_t *kv_last_page_len, int64_t page_size, int32_t *seq_lens) {
    if (batch_size < 0 || page_size < 1 || !kv_indptr ||
        (batch_size > 0 && (!kv_last_page_len || !seq_lens)))
        return CINFER__REF_EINVAL;
    for (int64_t b = 0; b < batch_size; b++) {
        const int64_t pages = (int64_t)kv_indptr[b + 1] - kv_indptr[b];
        int64_t len = pages > 0 ? (pages - 1) * page_size + kv_last_page_len[b] : 0;
        if (len > INT32_MAX)
            len = INT32_MAX;
        if (len < INT32_MIN)
            len = INT32_MIN;
        seq_lens[b] = (int32_t)len;
    }
    return CINFER__REF_OK;
}

/* ---- rotary position embeddings ---- */

static bool rope_valid(const cinfer__ref_rope_t *r) {
    if (!r || r->rotary_dim < 2 || r->rotary_dim % 2 != 0 || !(r->rope_theta > 0) ||
        !(r->rope_scale > 0) || !isfinite(r->rope_theta) || !isfinite(r->rope_scale))
        return false;
    if (r->llama31 &&
        !(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor &&
          r->old_context_len > 0 && isfinite(r->high_freq_factor) && isfinite(r->old_context_len)))
        return false;
    return true;
}

int cinfer__ref_rope_frequency(const cinfer__ref_rope_t *rope, int64_t j, double *freq) {
    if (!rope_valid(rope) || !freq || j < 0 || j >= rope->rotary_dim / 2)
        return CINFER__REF_EINVAL;
    const double base = pow(rope->rope_theta, -2.0 * (double)j / (double)rope->rotary_dim);
    if (!rope->llama31) {
        *freq = base / rope->rope_scale;
        return CINFER__REF_OK;
    }
    const double wavelength = 2.0 * REF_PI / base;
    const double high_freq_wavelength = rope->old_context_len / rope->high_freq_factor;
    const double low_freq_wavelength = rope->old_context_len / rope->low_freq_factor;
    if (wavelength < high_freq_wavelength) {
        *freq = base;
    } else if (wavelength > low_freq_wavelength) {
        *freq = base / rope->rope_scale;
    } else {
        const double s = (rope->old_context_len / wavelength - rope->low_freq_factor) /
                         (rope->high_freq_factor - rope->low_freq_factor);
        *freq = (1.0 - s) * base / rope->rope_scale + s * base;
    }
    return CINFER__REF_OK;
}

/* The two elements of pair j of a row. */
static void pair_elements(int64_t rotary_dim, bool interleave, int64_t j, int64_t *first,
                          int64_t *second) {
    *first = interleave ? 2 * j : j;
    *second = interleave ? 2 * j + 1 : j + rotary_dim / 2;
}

/* Rotates every pair by (cos_j, sin_j) and copies the rest; x and out may be the same array. */
static void rotate_row(int64_t rotary_dim, bool interleave, int64_t head_dim, const double *cos_j,
                       const double *sin_j, const double *x, double *out) {
    for (int64_t d = rotary_dim; d < head_dim; d++)
        out[d] = x[d];
    for (int64_t j = 0; j < rotary_dim / 2; j++) {
        int64_t e0, e1;
        pair_elements(rotary_dim, interleave, j, &e0, &e1);
        const double a = x[e0], b = x[e1];
        out[e0] = a * cos_j[j] - b * sin_j[j];
        out[e1] = b * cos_j[j] + a * sin_j[j];
    }
}

int cinfer__ref_rope_row(const cinfer__ref_rope_t *rope, int64_t head_dim, double pos,
                         const double *x, double *out) {
    if (!rope_valid(rope) || head_dim < rope->rotary_dim || !x || !out)
        return CINFER__REF_EINVAL;
    double c[512], s[512];
    if (rope->rotary_dim / 2 > 512)
        return CINFER__REF_EINVAL;
    for (int64_t j = 0; j < rope->rotary_dim / 2; j++) {
        double f;
        if (cinfer__ref_rope_frequency(rope, j, &f) != CINFER__REF_OK)
            return CINFER__REF_EINVAL;
        c[j] = cos(pos * f);
        s[j] = sin(pos * f);
    }
    rotate_row(rope->rotary_dim, rope->interleave, head_dim, c, s, x, out);
    return CINFER__REF_OK;
}

int cinfer__ref_rope_row_table(int64_t rotary_dim, bool interleave, int64_t head_dim,
                               const double *cos_sin, bool valid, const double *x, double *out) {
    if (rotary_dim < 2 || rotary_dim % 2 != 0 || head_dim < rotary_dim || !x || !out ||
        (valid && !cos_sin))
        return CINFER__REF_EINVAL;
    if (!valid) {
        for (int64_t d = 0; d < head_dim; d++)
            out[d] = d < rotary_dim ? NAN : x[d];
        return CINFER__REF_OK;
    }
    rotate_row(rotary_dim, interleave, head_dim, cos_sin, cos_sin + rotary_dim / 2, x, out);
    return CINFER__REF_OK;
}

int cinfer__ref_rope_ragged_positions(int64_t batch_size, const int32_t *indptr,
                                      const int32_t *offsets, int64_t nnz, int64_t *pos,
                                      uint8_t *covered) {
    if (batch_size < 0 || nnz < 0 || !indptr || (batch_size > 0 && !offsets) ||
        (nnz > 0 && (!pos || !covered)))
        return CINFER__REF_EINVAL;
    for (int64_t i = 0; i < nnz; i++) {
        pos[i] = 0;
        covered[i] = 0;
        for (int64_t b = 0; b < batch_size; b++) {
            if (indptr[b] <= i && i < indptr[b + 1]) {
                pos[i] = (int64_t)offsets[b] + (i - indptr[b]);
                covered[i] = 1;
            }
        }
    }
    return CINFER__REF_OK;
}

/* ---- bit packing ---- */

static uint8_t bit_of(int64_t k, bool big) {
    return (uint8_t)(1u << (big ? 7 - k : k));
}

int cinfer__ref_packbits(const uint8_t *x, int64_t n, bool big, uint8_t *y) {
    if (n < 0 || (n > 0 && (!x || !y)))
        return CINFER__REF_EINVAL;
    for (int64_t byte = 0; byte < (n + 7) / 8; byte++)
        y[byte] = 0;
    for (int64_t e = 0; e < n; e++)
        if (x[e])
            y[e / 8] |= bit_of(e % 8, big);
    return CINFER__REF_OK;
}

int cinfer__ref_segment_packbits(const uint8_t *x, int64_t n, int64_t batch_size,
                                 const int32_t *indptr, bool big, uint8_t *y, int64_t y_capacity,
                                 int32_t *indptr_new) {
    if (n < 0 || batch_size < 0 || y_capacity < 0 || !indptr || !indptr_new || (n > 0 && !x) ||
        (y_capacity > 0 && !y))
        return CINFER__REF_EINVAL;
    indptr_new[0] = 0;
    int64_t at = 0;
    for (int64_t s = 0; s < batch_size; s++) {
        const int64_t begin = indptr[s];
        int64_t len = (int64_t)indptr[s + 1] - begin;
        if (len < 0)
            len = 0;
        for (int64_t j = 0; j < (len + 7) / 8; j++, at++) {
            if (at >= y_capacity)
                continue;
            uint8_t byte = 0;
            for (int64_t k = 0; k < 8 && 8 * j + k < len; k++) {
                const int64_t e = begin + 8 * j + k;
                if (e >= 0 && e < n && x[e])
                    byte |= bit_of(k, big);
            }
            y[at] = byte;
        }
        indptr_new[s + 1] = (int32_t)(at > INT32_MAX ? INT32_MAX : at);
    }
    return CINFER__REF_OK;
}
