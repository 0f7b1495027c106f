/*
 * Dtype conversions and the output error metrics of the CPU reference.
 *
 * Every small float format here is handled by one decoder and one encoder driven by a format
 * description (exponent bits, mantissa bits, bias, how the top exponent is used). They work on
 * values, not on bit tricks of a wider format, so that they are an independent check of the
 * conversions the GPU kernels do with intrinsics and bit manipulation.
 */
#include "ref/ref.h"

#include <math.h>
#include <string.h>

/* Layout of a sign-exponent-mantissa float format of at most 32 bits. */
typedef struct {
    int exp_bits;
    int mant_bits;
    int bias;
    /*
     * True for IEEE-style formats, where the all-ones exponent encodes inf (mantissa 0) or NaN.
     * False for e4m3fn, where that exponent holds normal numbers except for the single NaN
     * pattern with an all-ones mantissa, and which has no inf.
     */
    bool has_inf;
    uint32_t nan_bits; /* canonical positive NaN produced by the encoder */
} cinfer__ref_fmt_t;

static const cinfer__ref_fmt_t cinfer__ref_fmt_f16 = {5, 10, 15, true, 0x7E00u};
static const cinfer__ref_fmt_t cinfer__ref_fmt_bf16 = {8, 7, 127, true, 0x7FC0u};
static const cinfer__ref_fmt_t cinfer__ref_fmt_f32 = {8, 23, 127, true, 0x7FC00000u};
static const cinfer__ref_fmt_t cinfer__ref_fmt_e4m3 = {4, 3, 7, false, 0x7Fu};
static const cinfer__ref_fmt_t cinfer__ref_fmt_e5m2 = {5, 2, 15, true, 0x7Eu};

static double cinfer__ref_fmt_decode(const cinfer__ref_fmt_t *f, uint32_t bits) {
    const uint32_t exp_all_ones = (1u << f->exp_bits) - 1u;
    const uint32_t mant_all_ones = (1u << f->mant_bits) - 1u;
    const uint32_t sign = (bits >> (f->exp_bits + f->mant_bits)) & 1u;
    const uint32_t exp_field = (bits >> f->mant_bits) & exp_all_ones;
    const uint32_t mant_field = bits & mant_all_ones;
    double value;

    if (f->has_inf && exp_field == exp_all_ones) {
        value = mant_field == 0 ? INFINITY : NAN;
    } else if (!f->has_inf && exp_field == exp_all_ones && mant_field == mant_all_ones) {
        value = NAN;
    } else if (exp_field == 0) {
        /* Subnormal: no implicit leading one, and the exponent is that of the smallest normal. */
        value = ldexp((double)mant_field, 1 - f->bias - f->mant_bits);
    } else {
        value = ldexp((double)((1u << f->mant_bits) + mant_field),
                      (int)exp_field - f->bias - f->mant_bits);
    }
    return sign ? -value : value;
}

/* Bits of the largest finite magnitude of the format, without sign. */
static uint32_t cinfer__ref_fmt_max_bits(const cinfer__ref_fmt_t *f) {
    const uint32_t exp_all_ones = (1u << f->exp_bits) - 1u;
    const uint32_t mant_all_ones = (1u << f->mant_bits) - 1u;
    if (f->has_inf) {
        return ((exp_all_ones - 1u) << f->mant_bits) | mant_all_ones;
    }
    /* Without inf the top exponent is usable, but its all-ones mantissa is the NaN. */
    return (exp_all_ones << f->mant_bits) | (mant_all_ones - 1u);
}

static uint32_t cinfer__ref_fmt_encode(const cinfer__ref_fmt_t *f, double x) {
    const uint32_t sign = signbit(x) ? 1u << (f->exp_bits + f->mant_bits) : 0u;
    const uint32_t exp_all_ones = (1u << f->exp_bits) - 1u;
    const uint32_t overflow_bits =
        f->has_inf ? sign | (exp_all_ones << f->mant_bits) : sign | cinfer__ref_fmt_max_bits(f);
    const int min_exp = 1 - f->bias; /* exponent of the smallest normal number */
    const double implicit_one = ldexp(1.0, f->mant_bits);
    double a = fabs(x);
    double scaled;
    double rounded;
    double frac;
    int e;
    uint32_t exp_field;
    uint32_t mant_field;

    if (isnan(x)) {
        return f->nan_bits;
    }
    if (isinf(a)) {
        /* IEEE formats keep inf; e4m3fn has none and saturates, as satfinite conversion does. */
        return overflow_bits;
    }
    if (a == 0.0) {
        return sign;
    }

    /* e = floor(log2(a)), exact from frexp; below the normal range the spacing stops shrinking. */
    (void)frexp(a, &e);
    e -= 1;
    if (e < min_exp) {
        e = min_exp;
    }

    /*
     * The representable numbers near a are multiples of 2^(e - mant_bits). Scaling by a power of
     * two is exact, so `scaled` is a with the binary point moved, and rounding it to an integer
     * with ties to even is exactly round-to-nearest-even of a in the target format.
     */
    scaled = ldexp(a, f->mant_bits - e);
    rounded = floor(scaled);
    frac = scaled - rounded;
    if (frac > 0.5 || (frac == 0.5 && fmod(rounded, 2.0) != 0.0)) {
        rounded += 1.0;
    }
    /* Rounding up from just below a power of two carries into the next binade. */
    if (rounded == 2.0 * implicit_one) {
        rounded = implicit_one;
        e += 1;
    }

    if (rounded < implicit_one) {
        /* Subnormal or zero: only possible at e == min_exp. */
        exp_field = 0;
        mant_field = (uint32_t)rounded;
    } else {
        if (e + f->bias > (int)exp_all_ones) {
            return overflow_bits;
        }
        exp_field = (uint32_t)(e + f->bias);
        mant_field = (uint32_t)(rounded - implicit_one);
    }

    /* Compare the magnitude bits with the largest finite pattern to detect overflow. */
    if (((exp_field << f->mant_bits) | mant_field) > cinfer__ref_fmt_max_bits(f)) {
        return overflow_bits;
    }
    return sign | (exp_field << f->mant_bits) | mant_field;
}

double cinfer__ref_f16_to_double(uint16_t bits) {
    return cinfer__ref_fmt_decode(&cinfer__ref_fmt_f16, bits);
}

uint16_t cinfer__ref_double_to_f16(double x) {
    return (uint16_t)cinfer__ref_fmt_encode(&cinfer__ref_fmt_f16, x);
}

double cinfer__ref_bf16_to_double(uint16_t bits) {
    return cinfer__ref_fmt_decode(&cinfer__ref_fmt_bf16, bits);
}

uint16_t cinfer__ref_double_to_bf16(double x) {
    return (uint16_t)cinfer__ref_fmt_encode(&cinfer__ref_fmt_bf16, x);
}

double cinfer__ref_f32_to_double(uint32_t bits) {
    return cinfer__ref_fmt_decode(&cinfer__ref_fmt_f32, bits);
}

uint32_t cinfer__ref_double_to_f32(double x) {
    return cinfer__ref_fmt_encode(&cinfer__ref_fmt_f32, x);
}

double cinfer__ref_e4m3_to_double(uint8_t bits) {
    return cinfer__ref_fmt_decode(&cinfer__ref_fmt_e4m3, bits);
}

uint8_t cinfer__ref_double_to_e4m3(double x) {
    return (uint8_t)cinfer__ref_fmt_encode(&cinfer__ref_fmt_e4m3, x);
}

double cinfer__ref_e5m2_to_double(uint8_t bits) {
    return cinfer__ref_fmt_decode(&cinfer__ref_fmt_e5m2, bits);
}

uint8_t cinfer__ref_double_to_e5m2(double x) {
    return (uint8_t)cinfer__ref_fmt_encode(&cinfer__ref_fmt_e5m2, x);
}

size_t cinfer__ref_dtype_size(cinfer__ref_dtype_t dtype) {
    switch (dtype) {
    case CINFER__REF_DTYPE_F16:
    case CINFER__REF_DTYPE_BF16:
        return 2;
    case CINFER__REF_DTYPE_F32:
        return 4;
    case CINFER__REF_DTYPE_E4M3:
    case CINFER__REF_DTYPE_E5M2:
        return 1;
    }
    return 0;
}

double cinfer__ref_load(cinfer__ref_dtype_t dtype, const void *base, int64_t index) {
    const size_t size = cinfer__ref_dtype_size(dtype);
    const unsigned char *p;
    uint16_t u16;
    uint32_t u32;
    uint8_t u8;

    if (size == 0 || base == NULL) {
        return NAN;
    }
    /* The byte offset is formed in 64 bits so large page indices cannot wrap. */
    p = (const unsigned char *)base + index * (int64_t)size;
    switch (dtype) {
    case CINFER__REF_DTYPE_F16:
        memcpy(&u16, p, sizeof u16);
        return cinfer__ref_f16_to_double(u16);
    case CINFER__REF_DTYPE_BF16:
        memcpy(&u16, p, sizeof u16);
        return cinfer__ref_bf16_to_double(u16);
    case CINFER__REF_DTYPE_F32:
        memcpy(&u32, p, sizeof u32);
        return cinfer__ref_f32_to_double(u32);
    case CINFER__REF_DTYPE_E4M3:
        memcpy(&u8, p, sizeof u8);
        return cinfer__ref_e4m3_to_double(u8);
    case CINFER__REF_DTYPE_E5M2:
        memcpy(&u8, p, sizeof u8);
        return cinfer__ref_e5m2_to_double(u8);
    }
    return NAN;
}

int cinfer__ref_to_double(cinfer__ref_dtype_t dtype, const void *src, int64_t n, double *dst) {
    if (n < 0 || cinfer__ref_dtype_size(dtype) == 0) {
        return CINFER__REF_EINVAL;
    }
    if (n > 0 && (src == NULL || dst == NULL)) {
        return CINFER__REF_EINVAL;
    }
    for (int64_t i = 0; i < n; i++) {
        dst[i] = cinfer__ref_load(dtype, src, i);
    }
    return CINFER__REF_OK;
}

int cinfer__ref_from_double(cinfer__ref_dtype_t dtype, const double *src, int64_t n, void *dst) {
    unsigned char *p = dst;
    uint16_t u16;
    uint32_t u32;
    uint8_t u8;

    if (n < 0 || cinfer__ref_dtype_size(dtype) == 0) {
        return CINFER__REF_EINVAL;
    }
    if (n > 0 && (src == NULL || dst == NULL)) {
        return CINFER__REF_EINVAL;
    }
    for (int64_t i = 0; i < n; i++) {
        switch (dtype) {
        case CINFER__REF_DTYPE_F16:
            u16 = cinfer__ref_double_to_f16(src[i]);
            memcpy(p + 2 * i, &u16, sizeof u16);
            break;
        case CINFER__REF_DTYPE_BF16:
            u16 = cinfer__ref_double_to_bf16(src[i]);
            memcpy(p + 2 * i, &u16, sizeof u16);
            break;
        case CINFER__REF_DTYPE_F32:
            u32 = cinfer__ref_double_to_f32(src[i]);
            memcpy(p + 4 * i, &u32, sizeof u32);
            break;
        case CINFER__REF_DTYPE_E4M3:
            u8 = cinfer__ref_double_to_e4m3(src[i]);
            memcpy(p + i, &u8, sizeof u8);
            break;
        case CINFER__REF_DTYPE_E5M2:
            u8 = cinfer__ref_double_to_e5m2(src[i]);
            memcpy(p + i, &u8, sizeof u8);
            break;
        }
    }
    return CINFER__REF_OK;
}

int cinfer__ref_compare(cinfer__ref_dtype_t dtype, const void *out, const double *ref, int64_t n,
                        cinfer__ref_error_t *err) {
    double sq_diff = 0.0;
    double sq_ref = 0.0;
    double norm_diff;
    double norm_ref;

    if (err == NULL || n < 0 || cinfer__ref_dtype_size(dtype) == 0) {
        return CINFER__REF_EINVAL;
    }
    if (n > 0 && (out == NULL || ref == NULL)) {
        return CINFER__REF_EINVAL;
    }
    err->max_abs_err = 0.0;
    err->rel_l2_err = 0.0;
    err->num_nonfinite = 0;
    err->max_abs_index = n > 0 ? 0 : -1;

    for (int64_t k = 0; k < n; k++) {
        const double x = cinfer__ref_load(dtype, out, k);
        double diff;

        if (!isfinite(x)) {
            err->num_nonfinite++;
        }
        /* Equal values (also the same infinity) are exact; anything else non-finite is +inf. */
        if (x == ref[k]) {
            diff = 0.0;
        } else {
            diff = fabs(x - ref[k]);
            if (!isfinite(diff)) {
                diff = INFINITY;
            }
        }
        if (diff > err->max_abs_err) {
            err->max_abs_err = diff;
            err->max_abs_index = k;
        }
        sq_diff += diff * diff;
        if (isfinite(ref[k])) {
            sq_ref += ref[k] * ref[k];
        }
    }

    norm_diff = sqrt(sq_diff);
    norm_ref = sqrt(sq_ref);
    /* A zero reference has no scale to be relative to, so the absolute norm is the honest error. */
    err->rel_l2_err = norm_ref > 0.0 ? norm_diff / norm_ref : norm_diff;
    return CINFER__REF_OK;
}

int cinfer__ref_compare_lse(cinfer__ref_dtype_t dtype, const void *out, const double *ref,
                            int64_t n, cinfer__ref_lse_error_t *err) {
    if (err == NULL || n < 0 || cinfer__ref_dtype_size(dtype) == 0) {
        return CINFER__REF_EINVAL;
    }
    if (n > 0 && (out == NULL || ref == NULL)) {
        return CINFER__REF_EINVAL;
    }
    err->max_abs_err = 0.0;
    err->num_inf_mismatch = 0;
    err->num_nan = 0;
    err->first_mismatch_index = -1;

    for (int64_t k = 0; k < n; k++) {
        const double x = cinfer__ref_load(dtype, out, k);
        const double r = ref[k];
        bool mismatch = false;

        if (isnan(x) || isnan(r)) {
            err->num_nan++;
            mismatch = true;
        } else if (isinf(x) || isinf(r)) {
            /* An empty row has lse -inf on both sides; every other infinity is a real error. */
            if (!(x == -INFINITY && r == -INFINITY)) {
                err->num_inf_mismatch++;
                mismatch = true;
            }
        } else if (fabs(x - r) > err->max_abs_err) {
            err->max_abs_err = fabs(x - r);
        }
        if (mismatch && err->first_mismatch_index < 0) {
            err->first_mismatch_index = k;
        }
    }
    return CINFER__REF_OK;
}
