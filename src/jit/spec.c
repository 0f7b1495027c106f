/*
 * Spec text form, validation and the one renderer (spec -> name, source, options, key).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "jit/sources.h"
#include "jit/spec.h"
#include "variant/variant.h"

/* ---- dtypes ---- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[CINFER__DT_COUNT] = {
    [CINFER__DT_NONE] = {"none", 0}, [CINFER__DT_F16] = {"f16", 2},
    [CINFER__DT_BF16] = {"bf16", 2}, [CINFER__DT_F32] = {"f32", 4},
    [CINFER__DT_E4M3] = {"e4m3", 1}, [CINFER__DT_E5M2] = {"e5m2", 1},
    [CINFER__DT_I32] = {"i32", 4},   [CINFER__DT_U8] = {"u8", 1},
};

const char *cinfer__dtype_name(cinfer__dtype_t dt) {
    return (unsigned)dt < CINFER__DT_COUNT ? dtype_info[dt].name : "invalid";
}

size_t cinfer__dtype_size(cinfer__dtype_t dt) {
    return (unsigned)dt < CINFER__DT_COUNT ? dtype_info[dt].size : 0;
}

/* ---- fields ---- */

enum {
    F_BACKEND = 1u << 0,
    F_DTYPE_Q = 1u << 1,
    F_DTYPE_KV = 1u << 2,
    F_DTYPE_O = 1u << 3,
    F_HD_QK = 1u << 4,
    F_HD_VO = 1u << 5,
    F_LAYOUT = 1u << 6,
    F_PAGED = 1u << 7,
    F_MASK = 1u << 8,
    F_POS = 1u << 9,
    F_FLAGS = 1u << 10,
    F_TILE_Q = 1u << 11,
    F_VARIANT = 1u << 12,
    F_VEC = 1u << 13,
    F_BATCH = 1u << 14,
    F_GQA_PACK = 1u << 15,
    F_TILE_KV = 1u << 16,
    F_WARPS = 1u << 17,
    F_STAGES = 1u << 18,
};

#define F_TILES (F_TILE_Q | F_TILE_KV | F_WARPS | F_STAGES)

enum field_kind { K_DTYPE, K_INT, K_ENUM, K_FLAGS, K_VARIANT };

static const char *const backend_names[] = {"simt", "sm80", "sm90", NULL};
static const char *const layout_names[] = {"nhd", "hnd", NULL};
static const char *const mask_names[] = {"none", "causal", NULL};
static const char *const pos_names[] = {"none", "rope", "alibi", NULL};
/* Bit i of flags is named flag_names[i]. */
static const char *const flag_names[] = {"softcap", "window", NULL};

typedef struct field {
    const char *name;
    uint32_t bit;
    enum field_kind kind;
    size_t offset;
    const char *const *values;
} field_t;

#define FIELD(name, bit, kind, member, values)                                                     \
    { name, bit, kind, offsetof(cinfer__spec_t, member), values }
static const field_t fields[] = {
    FIELD("backend", F_BACKEND, K_ENUM, backend, backend_names),
    FIELD("dtype_q", F_DTYPE_Q, K_DTYPE, dtype_q, NULL),
    FIELD("dtype_kv", F_DTYPE_KV, K_DTYPE, dtype_kv, NULL),
    FIELD("dtype_o", F_DTYPE_O, K_DTYPE, dtype_o, NULL),
    FIELD("head_dim_qk", F_HD_QK, K_INT, head_dim_qk, NULL),
    FIELD("head_dim_vo", F_HD_VO, K_INT, head_dim_vo, NULL),
    FIELD("layout", F_LAYOUT, K_ENUM, layout, layout_names),
    FIELD("paged", F_PAGED, K_INT, paged, NULL),
    FIELD("batch", F_BATCH, K_INT, batch, NULL),
    FIELD("mask", F_MASK, K_ENUM, mask, mask_names),
    FIELD("pos", F_POS, K_ENUM, pos, pos_names),
    FIELD("flags", F_FLAGS, K_FLAGS, flags, flag_names),
    FIELD("tile_q", F_TILE_Q, K_INT, tile_q, NULL),
    FIELD("tile_kv", F_TILE_KV, K_INT, tile_kv, NULL),
    FIELD("warps", F_WARPS, K_INT, warps, NULL),
    FIELD("stages", F_STAGES, K_INT, stages, NULL),
    FIELD("vec", F_VEC, K_INT, vec, NULL),
    FIELD("gqa_pack", F_GQA_PACK, K_INT, gqa_pack, NULL),
    FIELD("variant", F_VARIANT, K_VARIANT, variant, NULL),
};
#define NUM_FIELDS (sizeof fields / sizeof fields[0])

/* The field named by the len bytes at name, or NULL. */
static const field_t *field_named(const char *name, size_t len) {
    for (size_t i = 0; i < NUM_FIELDS; i++)
        if (strlen(fields[i].name) == len && strncmp(fields[i].name, name, len) == 0)
            return &fields[i];
    return NULL;
}

/* ---- families ---- */

typedef struct family {
    const char *name;   /* op name in the text form and kernel names */
    const char *source; /* template file under kernels/ */
    const char *define; /* macro the template switches on */
    uint32_t fields;    /* which spec fields the family uses */
    uint32_t flags;     /* which flags it accepts */
} family_t;

static const family_t families[CINFER__OP_COUNT] = {
    [CINFER__OP_MERGE_STATE] = {"merge_state", "merge.cu", "CINFER_OP_MERGE_STATE",
                                F_DTYPE_O | F_HD_VO | F_VEC, 0},
    [CINFER__OP_MERGE_STATE_IN_PLACE] = {"merge_state_in_place", "merge.cu",
                                         "CINFER_OP_MERGE_STATE_IN_PLACE",
                                         F_DTYPE_O | F_HD_VO | F_VEC, 0},
    [CINFER__OP_MERGE_STATES] = {"merge_states", "merge.cu", "CINFER_OP_MERGE_STATES",
                                 F_DTYPE_O | F_HD_VO | F_VEC, 0},
    [CINFER__OP_DECODE] = {"decode", "decode.cu", "CINFER_OP_DECODE",
                           F_DTYPE_Q | F_DTYPE_KV | F_DTYPE_O | F_HD_QK | F_HD_VO | F_PAGED |
                               F_POS | F_FLAGS | F_TILE_Q | F_TILE_KV | F_WARPS | F_VARIANT,
                           CINFER__FLAG_SOFT_CAP},
    [CINFER__OP_DECODE_MERGE] = {"decode_merge", "decode.cu", "CINFER_OP_DECODE_MERGE",
                                 F_DTYPE_O | F_HD_VO | F_WARPS, 0},
    [CINFER__OP_DECODE_TC] = {"decode_tc", "decode_tc.cu", "CINFER_OP_DECODE_TC",
                              F_DTYPE_Q | F_DTYPE_KV | F_DTYPE_O | F_HD_QK | F_HD_VO | F_PAGED |
                                  F_FLAGS | F_TILE_Q | F_WARPS | F_STAGES | F_VARIANT,
                              CINFER__FLAG_SOFT_CAP},
    [CINFER__OP_PREFILL] = {"prefill", "prefill.cu", "CINFER_OP_PREFILL",
                            F_BACKEND | F_DTYPE_Q | F_DTYPE_KV | F_DTYPE_O | F_HD_QK | F_HD_VO |
                                F_PAGED | F_BATCH | F_MASK | F_POS | F_FLAGS | F_TILES | F_VARIANT |
                                F_GQA_PACK,
                            CINFER__FLAG_SOFT_CAP | CINFER__FLAG_WINDOW},
    [CINFER__OP_APPEND_PAGED_KV_CACHE] = {"append_paged_kv_cache", "append.cu",
                                          "CINFER_OP_APPEND_PAGED_KV_CACHE",
                                          F_DTYPE_KV | F_DTYPE_O | F_HD_VO | F_VEC, 0},
    [CINFER__OP_BATCH_INDICES_POSITIONS] = {"batch_indices_positions", "append.cu",
                                            "CINFER_OP_BATCH_INDICES_POSITIONS", 0, 0},
    [CINFER__OP_SEQ_LENS] = {"seq_lens", "append.cu", "CINFER_OP_SEQ_LENS", 0, 0},
    [CINFER__OP_ROPE] = {"rope", "rope.cu", "CINFER_OP_ROPE", F_DTYPE_O | F_HD_VO | F_VEC, 0},
    [CINFER__OP_ROPE_POS_IDS] = {"rope_pos_ids", "rope.cu", "CINFER_OP_ROPE_POS_IDS",
                                 F_DTYPE_O | F_HD_VO | F_VEC, 0},
    [CINFER__OP_ROPE_COS_SIN_CACHE] = {"rope_cos_sin_cache", "rope.cu",
                                       "CINFER_OP_ROPE_COS_SIN_CACHE", F_DTYPE_O | F_HD_VO | F_VEC,
                                       0},
    [CINFER__OP_PACKBITS] = {"packbits", "packbits.cu", "CINFER_OP_PACKBITS", F_VEC, 0},
    [CINFER__OP_SEGMENT_PACKBITS_INDPTR] = {"segment_packbits_indptr", "packbits.cu",
                                            "CINFER_OP_SEGMENT_PACKBITS_INDPTR", 0, 0},
    [CINFER__OP_SEGMENT_PACKBITS] = {"segment_packbits", "packbits.cu",
                                     "CINFER_OP_SEGMENT_PACKBITS", 0, 0},
    [CINFER__OP_MLA] = {"mla", "mla.cu", "CINFER_OP_MLA",
                        F_DTYPE_Q | F_DTYPE_KV | F_DTYPE_O | F_HD_QK | F_HD_VO | F_MASK | F_TILES |
                            F_GQA_PACK,
                        0},
    [CINFER__OP_MLA_MERGE] = {"mla_merge", "mla.cu", "CINFER_OP_MLA_MERGE", F_DTYPE_O | F_HD_VO, 0},
};

const char *cinfer__op_name(cinfer__op_t op) {
    return (unsigned)op < CINFER__OP_COUNT ? families[op].name : NULL;
}

void cinfer__spec_init(cinfer__spec_t *spec, cinfer__op_t op) {
    memset(spec, 0, sizeof *spec);
    spec->op = op;
}

/* The variant field is a pointer (with its id alongside); get/set carry the pointer as an
 * integer so normalize can copy it like the other fields. */
static int64_t get_field(const cinfer__spec_t *spec, const field_t *f) {
    const char *p = (const char *)spec + f->offset;
    if (f->bit == F_VARIANT)
        return (int64_t)(intptr_t)spec->variant;
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void set_field(cinfer__spec_t *spec, const field_t *f, int64_t value) {
    char *p = (char *)spec + f->offset;
    if (f->bit == F_VARIANT) {
        spec->variant = (const cinfer_variant_t *)(intptr_t)value;
        spec->variant_id = cinfer__variant_id(spec->variant);
        return;
    }
    int32_t v = (int32_t)value;
    memcpy(p, &v, sizeof v);
}

void cinfer__spec_normalize(cinfer__spec_t *spec) {
    if ((unsigned)spec->op >= CINFER__OP_COUNT)
        return;
    const family_t *fam = &families[spec->op];
    cinfer__spec_t clean;
    cinfer__spec_init(&clean, spec->op);
    for (size_t i = 0; i < NUM_FIELDS; i++)
        if (fam->fields & fields[i].bit)
            set_field(&clean, &fields[i], get_field(spec, &fields[i]));
    clean.flags &= fam->flags;
    *spec = clean;
}

/* ---- text form ---- */

/* names (NULL-terminated) joined by ", " into dst. */
static void join_names(const char *const *names, char *dst, size_t cap) {
    dst[0] = '\0';
    for (int k = 0; names[k]; k++) {
        const size_t used = strlen(dst);
        cinfer__fmt(dst + used, cap - used, "%s%s", k ? ", " : "", names[k]);
    }
}

static int find_name(const char *const *names, const char *text, size_t len) {
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == len && strncmp(names[i], text, len) == 0)
            return i;
    return -1;
}

/* A dtype's name; "none" is the unset dtype (what cinfer__spec_format writes for it). */
static int find_dtype(const char *text, size_t len) {
    for (int i = 0; i < CINFER__DT_COUNT; i++)
        if (strlen(dtype_info[i].name) == len && strncmp(dtype_info[i].name, text, len) == 0)
            return i;
    /* The names DLPack and PyTorch users write. */
    static const struct {
        const char *alias;
        cinfer__dtype_t dt;
    } aliases[] = {{"float16", CINFER__DT_F16},     {"bfloat16", CINFER__DT_BF16},
                   {"float32", CINFER__DT_F32},     {"int32", CINFER__DT_I32},
                   {"uint8", CINFER__DT_U8},        {"float8_e4m3fn", CINFER__DT_E4M3},
                   {"float8_e5m2", CINFER__DT_E5M2}};
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strlen(aliases[i].alias) == len && strncmp(aliases[i].alias, text, len) == 0)
            return (int)aliases[i].dt;
    return -1;
}

static cinfer_status_t parse_value(const field_t *f, const char *v, size_t len, int64_t *out) {
    if (f->kind == K_DTYPE) {
        int dt = find_dtype(v, len);
        if (dt < 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "unknown dtype \"%.*s\" (expected f16, bf16, f32, e4m3, e5m2, "
                                 "i32 or u8, or float16, bfloat16, float32, float8_e4m3fn, "
                                 "float8_e5m2, int32, uint8)",
                                 (int)len, v);
        *out = dt;
        return CINFER_STATUS_SUCCESS;
    }
    if (f->kind == K_ENUM) {
        int i = find_name(f->values, v, len);
        if (i < 0 && f->bit == F_MASK && len == 6 && strncmp(v, "custom", 6) == 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "\"custom\" is not a mask of the spec (expected none or causal): "
                                 "a custom mask is data given at run time, through the custom_mask "
                                 "variant (prefill: variant=custom_mask)");
        if (i < 0) {
            char names[96];
            join_names(f->values, names, sizeof names);
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "unknown value \"%.*s\" (expected one of %s)", (int)len, v, names);
        }
        *out = i;
        return CINFER_STATUS_SUCCESS;
    }
    if (f->kind == K_VARIANT) {
        if (len == 4 && strncmp(v, "none", 4) == 0) {
            *out = 0;
            return CINFER_STATUS_SUCCESS;
        }
        const cinfer_variant_t *var = cinfer__variant_builtin(v, len);
        if (!var)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "unknown variant \"%.*s\" (expected none or a built-in: sigmoid, "
                                 "sinks, alibi, dump_logits, custom_mask)",
                                 (int)len, v);
        *out = (int64_t)(intptr_t)var;
        return CINFER_STATUS_SUCCESS;
    }
    if (f->kind == K_FLAGS) {
        /* Flags are joined with '+', e.g. flags=softcap+window; "none" is the empty set. */
        int64_t bits = 0;
        const char *p = v, *end = v + len;
        while (p < end) {
            const char *q = memchr(p, '+', (size_t)(end - p));
            size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
            if (!(n == 4 && strncmp(p, "none", 4) == 0)) {
                int i = find_name(flag_names, p, n);
                if (i < 0) {
                    char names[96];
                    join_names(flag_names, names, sizeof names);
                    return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                         "unknown flag \"%.*s\" (expected none, or flags joined by "
                                         "'+' of %s)",
                                         (int)n, p, names);
                }
                bits |= 1ll << i;
            }
            p += n + (q ? 1 : 0);
        }
        *out = bits;
        return CINFER_STATUS_SUCCESS;
    }
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "bad number \"%.*s\"", (int)len, v);
    memcpy(buf, v, len);
    buf[len] = '\0';
    char *endp;
    long long n = strtoll(buf, &endp, 10);
    if (*endp || n < 0 || n > (1ll << 31) - 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "\"%s\" is not a number in [0, 2^31)",
                             buf);
    *out = n;
    return CINFER_STATUS_SUCCESS;
}

/* The fields of family fam as text, ", "-separated, and its flags joined by '+' ("none" if none).
 */
static void family_fields_text(const family_t *fam, char *dst, size_t cap) {
    dst[0] = '\0';
    for (size_t i = 0; i < NUM_FIELDS; i++)
        if (fam->fields & fields[i].bit) {
            const size_t n = strlen(dst);
            cinfer__fmt(dst + n, cap - n, "%s%s", n ? ", " : "", fields[i].name);
        }
    if (!dst[0])
        cinfer__fmt(dst, cap, "none");
}

static void format_value(const field_t *f, int64_t v, char *dst, size_t cap);

static void family_flags_text(const family_t *fam, char *dst, size_t cap) {
    format_value(field_named("flags", strlen("flags")), fam->flags, dst, cap);
}

/* An error of a field's value, said again with the spec it came from and the field as written. */
static cinfer_status_t in_spec(cinfer_status_t status, const char *text, const char *key,
                               size_t key_len) {
    char why[1024];
    cinfer__fmt(why, sizeof why, "%s", cinfer_last_error());
    return cinfer__error(status, "spec \"%s\", field %.*s: %s", text, (int)key_len, key, why);
}

/* The parser; *given (when not NULL) gets the bits of the fields the text sets, directly or
 * through an alias. */
static cinfer_status_t parse_text(const char *text, cinfer__spec_t *spec, uint32_t *given) {
    if (given)
        *given = 0;
    if (!text)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "spec text is NULL");
    const char *colon = strchr(text, ':');
    size_t op_len = colon ? (size_t)(colon - text) : strlen(text);
    int op = -1;
    for (int i = 0; i < CINFER__OP_COUNT; i++)
        if (strlen(families[i].name) == op_len && strncmp(families[i].name, text, op_len) == 0)
            op = i;
    if (op < 0) {
        char known[512] = "";
        for (int i = 0; i < CINFER__OP_COUNT; i++) {
            size_t n = strlen(known);
            cinfer__fmt(known + n, sizeof known - n, "%s%s", i ? ", " : "", families[i].name);
        }
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "spec \"%s\": unknown operation \"%.*s\" (known: %s)", text,
                             (int)op_len, text, known);
    }
    cinfer__spec_init(spec, (cinfer__op_t)op);
    const family_t *fam = &families[op];
    /* The fields set so far (dtype and head_dim set several): a field set twice, directly or
     * through an alias, is an error (which value would win is not obvious). So is an empty item
     * (",,", a comma at the end, or nothing after the colon), as in the tool's --arch lists: a
     * field may have been lost there. */
    const char *seen[64], *seen_by[64]; /* a field, and the key that set it */
    size_t seen_len[64], seen_by_len[64], num_seen = 0;
    static const char *const dtype_fields[] = {"dtype_q", "dtype_kv", "dtype_o", NULL};
    static const char *const head_dim_fields[] = {"head_dim_qk", "head_dim_vo", NULL};
    for (const char *p = colon ? colon + 1 : NULL; p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        const char *next = comma ? comma + 1 : NULL;
        if (n == 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "spec \"%s\": empty field at column %d (expected FIELD=VALUE "
                                 "items after the colon, separated by one comma, none after the "
                                 "last)",
                                 text, (int)(p - text) + 1);
        const char *eq = memchr(p, '=', n);
        if (!eq)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "spec \"%s\": \"%.*s\" is not FIELD=VALUE", text, (int)n, p);
        size_t key_len = (size_t)(eq - p);
        const char *const *targets = key_len == 5 && strncmp(p, "dtype", 5) == 0 ? dtype_fields
                                     : key_len == 8 && strncmp(p, "head_dim", 8) == 0
                                         ? head_dim_fields
                                         : NULL;
        /* A field the operation does not have is an error (it would change nothing); an alias
         * sets those of its fields the operation has, and at least one. */
        const field_t *f = NULL;
        if (!targets) {
            f = field_named(p, key_len);
            if (!f)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "spec \"%s\": unknown field \"%.*s\"", text, (int)key_len, p);
        }
        bool applies = false;
        for (int k = 0; targets ? targets[k] != NULL : k < 1; k++) {
            const field_t *t = targets ? field_named(targets[k], strlen(targets[k])) : f;
            applies = applies || (fam->fields & t->bit);
        }
        if (!applies) {
            char have[256];
            family_fields_text(fam, have, sizeof have);
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "spec \"%s\": field %.*s does not apply to %s (its fields: %s)",
                                 text, (int)key_len, p, fam->name, have);
        }
        for (int k = 0; targets ? targets[k] != NULL : k < 1; k++) {
            const char *name = targets ? targets[k] : p;
            const size_t len = targets ? strlen(name) : key_len;
            if (targets && !(fam->fields & field_named(name, len)->bit))
                continue;
            for (size_t i = 0; i < num_seen; i++)
                if (seen_len[i] == len && strncmp(seen[i], name, len) == 0) {
                    const bool alias = targets || seen_by_len[i] != len;
                    return cinfer__error(
                        CINFER_STATUS_INVALID_ARGUMENT,
                        "spec \"%s\": field %.*s is set twice, by %.*s= and by %.*s=%s", text,
                        (int)len, name, (int)seen_by_len[i], seen_by[i], (int)key_len, p,
                        alias ? " (dtype= sets dtype_q, dtype_kv and dtype_o, head_dim= sets "
                                "head_dim_qk and head_dim_vo: give the fields one by one)"
                              : "");
                }
            if (num_seen == sizeof seen / sizeof seen[0])
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "spec \"%s\": more than %zu fields", text,
                                     sizeof seen / sizeof seen[0]);
            seen[num_seen] = name;
            seen_by[num_seen] = p;
            seen_by_len[num_seen] = key_len;
            seen_len[num_seen++] = len;
            if (given)
                *given |= field_named(name, len)->bit;
        }
        const char *value = eq + 1;
        size_t value_len = n - key_len - 1;
        int64_t v;
        if (key_len == 5 && strncmp(p, "dtype", 5) == 0) {
            cinfer_status_t st = parse_value(&fields[1], value, value_len, &v);
            if (st != CINFER_STATUS_SUCCESS)
                return in_spec(st, text, p, key_len);
            spec->dtype_q = spec->dtype_kv = spec->dtype_o = (cinfer__dtype_t)v;
        } else if (key_len == 8 && strncmp(p, "head_dim", 8) == 0) {
            cinfer_status_t st = parse_value(&fields[4], value, value_len, &v);
            if (st != CINFER_STATUS_SUCCESS)
                return in_spec(st, text, p, key_len);
            spec->head_dim_qk = spec->head_dim_vo = (int32_t)v;
        } else {
            cinfer_status_t st = parse_value(f, value, value_len, &v);
            if (st != CINFER_STATUS_SUCCESS)
                return in_spec(st, text, p, key_len);
            if (f->kind == K_FLAGS && (v & ~(int64_t)fam->flags)) {
                char unused[96], have[96];
                format_value(f, v & ~(int64_t)fam->flags, unused, sizeof unused);
                family_flags_text(fam, have, sizeof have);
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "spec \"%s\": flags %s do not apply to %s (its flags: %s)",
                                     text, unused, fam->name, have);
            }
            set_field(spec, f, v);
        }
        p = next;
    }
    cinfer__spec_normalize(spec);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__spec_parse(const char *text, cinfer__spec_t *spec) {
    return parse_text(text, spec, NULL);
}

static void format_value(const field_t *f, int64_t v, char *dst, size_t cap) {
    if (f->kind == K_DTYPE) {
        cinfer__fmt(dst, cap, "%s", cinfer__dtype_name((cinfer__dtype_t)v));
    } else if (f->kind == K_ENUM) {
        /* A spec built in code may hold a value past the names (validation refuses it). */
        int64_t count = 0;
        while (f->values[count])
            count++;
        cinfer__fmt(dst, cap, "%s", v >= 0 && v < count ? f->values[v] : "invalid");
    } else if (f->kind == K_VARIANT) {
        const cinfer_variant_t *var = (const cinfer_variant_t *)(intptr_t)v;
        cinfer__fmt(dst, cap, "%s", var ? cinfer_variant_name(var) : "none");
    } else if (f->kind == K_FLAGS) {
        dst[0] = '\0';
        for (int i = 0; flag_names[i]; i++) {
            if (!(v & (1ll << i)))
                continue;
            size_t n = strlen(dst);
            cinfer__fmt(dst + n, cap - n, "%s%s", n ? "+" : "", flag_names[i]);
        }
        if (!dst[0])
            cinfer__fmt(dst, cap, "none");
    } else {
        cinfer__fmt(dst, cap, "%lld", (long long)v);
    }
}

void cinfer__spec_format(const cinfer__spec_t *spec, char *dst, size_t cap) {
    if ((unsigned)spec->op >= CINFER__OP_COUNT) {
        cinfer__fmt(dst, cap, "invalid");
        return;
    }
    const family_t *fam = &families[spec->op];
    size_t n = 0;
    cinfer__fmt(dst, cap, "%s", fam->name);
    n = strlen(dst);
    char sep = ':';
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        if (!(fam->fields & fields[i].bit))
            continue;
        char value[96];
        format_value(&fields[i], get_field(spec, &fields[i]), value, sizeof value);
        cinfer__fmt(dst + n, cap - n, "%c%s=%s", sep, fields[i].name, value);
        n = strlen(dst);
        sep = ',';
    }
}

/* ---- validation ---- */

static bool is_value_dtype(cinfer__dtype_t dt) {
    return dt == CINFER__DT_F16 || dt == CINFER__DT_BF16;
}

static bool in_range(int32_t v, int32_t lo, int32_t hi) {
    return v >= lo && v <= hi;
}

/* decode's and decode_tc's paged: a switch, 0 or 1 (prefill checks it with batch). */
static cinfer_status_t paged_check(const cinfer__spec_t *spec, const family_t *fam) {
    if (!in_range(spec->paged, 0, 1))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: paged %d, expected 0 or 1",
                             fam->name, (int)spec->paged);
    return CINFER_STATUS_SUCCESS;
}

/* Limits of the CUDA-core decode kernel (kernels/decode.cu): 16-byte rows of 8 elements per lane,
 * at most one warp per row (D <= 256), register arrays of tile_q heads x tile_kv tokens. */
static cinfer_status_t validate_decode(const cinfer__spec_t *spec, const family_t *fam) {
    if (spec->head_dim_vo % 8 != 0 || spec->head_dim_vo > 256)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head dim %d is not supported (a multiple of 8, at most 256)",
                             fam->name, (int)spec->head_dim_vo);
    if (!in_range(spec->warps, 1, 8))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: warps %d outside [1, 8]",
                             fam->name, (int)spec->warps);
    if (spec->op == CINFER__OP_DECODE_MERGE)
        return CINFER_STATUS_SUCCESS;
    if (!is_value_dtype(spec->dtype_q) || spec->dtype_o != spec->dtype_q)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: dtype_q %s / dtype_o %s: q must be f16 or bf16 and out the same",
                             fam->name, cinfer__dtype_name(spec->dtype_q),
                             cinfer__dtype_name(spec->dtype_o));
    if (!is_value_dtype(spec->dtype_kv) && spec->dtype_kv != CINFER__DT_E4M3 &&
        spec->dtype_kv != CINFER__DT_E5M2)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: dtype_kv %s is not supported (f16, bf16, e4m3, e5m2)", fam->name,
                             cinfer__dtype_name(spec->dtype_kv));
    if (spec->head_dim_qk != spec->head_dim_vo)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head_dim_qk %d != head_dim_vo %d is not supported by decode",
                             fam->name, (int)spec->head_dim_qk, (int)spec->head_dim_vo);
    if (!in_range(spec->tile_q, 1, 8) || !in_range(spec->tile_kv, 1, 8))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: tile_q %d / tile_kv %d outside [1, 8]", fam->name,
                             (int)spec->tile_q, (int)spec->tile_kv);
    return paged_check(spec, fam);
}

/*
 * Limits of the sm90 prefill kernel (kernels/prefill_sm90.cuh), for now: q = out of one 16-bit
 * dtype, K/V of it or fp8 (e4m3, e5m2; not at 192 / 128), D = 64, 128 or 256 (or D_qk / D_vo =
 * 192 / 128), no mask or causal, no RoPE; soft cap and window; default attention or a variant of
 * ALiBi slopes, masks in row form and state inits (CINFER__VARIANT_SM90), not with a soft cap;
 * single or batch (ragged or paged; GQA packing by a divisor of tile_q); tile_q 64 or 128 (one or
 * two consumer warpgroups: warps 4 or 8, a producer warpgroup is added at launch), tile_kv 128 (64
 * at D = 256, 64 or 128 at 192 / 128), 2 or 3 stages, within 227 KiB of shared memory
 * (cinfer__spec_sm90_prefill_smem). The page sizes it copies are the host's to check (prefill.c).
 */
static cinfer_status_t validate_prefill_sm90(const cinfer__spec_t *spec, const family_t *fam) {
    const bool fp8 = spec->dtype_kv == CINFER__DT_E4M3 || spec->dtype_kv == CINFER__DT_E5M2;
    const bool asym = spec->head_dim_qk == 192 && spec->head_dim_vo == 128;
    if (!is_value_dtype(spec->dtype_q) || (spec->dtype_kv != spec->dtype_q && !fp8) ||
        spec->dtype_o != spec->dtype_q)
        return cinfer__error(
            CINFER_STATUS_UNSUPPORTED,
            "%s (sm90): dtype_q %s / dtype_kv %s / dtype_o %s: expected q and o of one dtype, "
            "f16 or bf16, and K/V of it or fp8 (e4m3, e5m2)",
            fam->name, cinfer__dtype_name(spec->dtype_q), cinfer__dtype_name(spec->dtype_kv),
            cinfer__dtype_name(spec->dtype_o));
    if (fp8 && spec->head_dim_qk != spec->head_dim_vo)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s (sm90): dtype_kv %s with head_dim_qk %d / head_dim_vo %d: fp8 K/V "
                             "is supported with one head dim (64, 128 or 256); give dtype_kv=%s",
                             fam->name, cinfer__dtype_name(spec->dtype_kv), (int)spec->head_dim_qk,
                             (int)spec->head_dim_vo, cinfer__dtype_name(spec->dtype_q));
    if (!asym &&
        ((spec->head_dim_qk != 64 && spec->head_dim_qk != 128 && spec->head_dim_qk != 256) ||
         spec->head_dim_vo != spec->head_dim_qk))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s (sm90): head dims %d / %d, expected 64, 128 or 256 for both, or "
                             "192 / 128",
                             fam->name, (int)spec->head_dim_qk, (int)spec->head_dim_vo);
    if ((spec->batch != 0 && spec->batch != 1) || (spec->paged != 0 && spec->paged != 1) ||
        (spec->paged && !spec->batch))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s (sm90): batch %d / paged %d, expected 0 or 1 each, paged only "
                             "with batch",
                             fam->name, (int)spec->batch, (int)spec->paged);
    if (spec->gqa_pack != 0 &&
        (!spec->batch || spec->gqa_pack < 2 || spec->tile_q % spec->gqa_pack != 0))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s (sm90): gqa_pack %d, expected 0, or a divisor >= 2 of tile_q (%d) "
                             "with batch 1",
                             fam->name, (int)spec->gqa_pack, (int)spec->tile_q);
    if (spec->mask != CINFER__MASK_NONE && spec->mask != CINFER__MASK_CAUSAL)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s (sm90): mask %s is not supported (none, causal)", fam->name,
                             mask_names[(unsigned)spec->mask < 2 ? spec->mask : 0]);
    if (spec->pos != CINFER__POS_NONE ||
        (spec->variant &&
         (!(spec->variant->hooks & CINFER__VARIANT_SM90) || (spec->flags & CINFER__FLAG_SOFT_CAP))))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s (sm90): pos %d / variant %s: expected no position encoding, and "
                             "default attention or a variant of ALiBi slopes, masks in row form "
                             "and state inits only (not with a soft cap)",
                             fam->name, (int)spec->pos,
                             spec->variant ? cinfer_variant_name(spec->variant) : "none");
    /* D = 256 keeps O in 128 registers per thread: S of 64-row K tiles (32 more) fits beside it.
     * At 192 / 128 O takes 64, as at D = 128, and the K/V tiles may have 128 rows or 64. */
    if (!((spec->tile_q == 64 && spec->warps == 4) || (spec->tile_q == 128 && spec->warps == 8)) ||
        (spec->tile_kv != (spec->head_dim_vo > 128 ? 64 : 128) && !(asym && spec->tile_kv == 64)) ||
        !in_range(spec->stages, 2, 3))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s (sm90): tile_q %d / warps %d / tile_kv %d / stages %d, expected "
                             "64 / 4 or 128 / 8, 128 (64 at D = 256, 64 or 128 at 192 / 128), 2..3",
                             fam->name, (int)spec->tile_q, (int)spec->warps, (int)spec->tile_kv,
                             (int)spec->stages);
    const size_t smem = cinfer__spec_sm90_prefill_smem(spec->head_dim_qk, spec->head_dim_vo,
                                                       spec->tile_q, spec->tile_kv, spec->stages);
    if (smem > 227 * 1024)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s (sm90): tile_q %d / tile_kv %d / stages %d at head dims %d / %d "
                             "need %zu bytes of shared memory, more than 227 KiB (fewer stages or "
                             "a smaller tile_kv)",
                             fam->name, (int)spec->tile_q, (int)spec->tile_kv, (int)spec->stages,
                             (int)spec->head_dim_qk, (int)spec->head_dim_vo, smem);
    return CINFER_STATUS_SUCCESS;
}

size_t cinfer__spec_sm90_prefill_smem(int head_dim_qk, int head_dim_vo, int tile_q, int tile_kv,
                                      int stages) {
    /* 1 KiB to align the tiles to the swizzle's 1024 bytes, the Q tile (two at D = 64:
     * kernels/prefill_sm90.cuh, Q_BUFS) and the stages of K and V, rows of 16-bit elements (fp8
     * K/V is converted in place into them), unpadded */
    const size_t q_tiles = head_dim_qk == 64 ? 2 : 1;
    return 1024 + 2 * ((size_t)head_dim_qk * q_tiles * (size_t)tile_q +
                       (size_t)stages * (size_t)tile_kv * (size_t)(head_dim_qk + head_dim_vo));
}

/*
 * Limits of the sm80 prefill kernel (kernels/prefill.cu): q and out of one 16-bit dtype, k and v
 * of the same or fp8 (e4m3, e5m2: stages of rows of head_dim bytes padded to an odd number of
 * chunks, plus one 16-bit K and V tile that each fp8 tile is converted into);
 * head dims in 16-element mma steps; warps of 16 * mma_q query rows (mma_q = tile_q / (16 *
 * warps) in {1, 2}); KV tiles in 16-row mma steps; at least double buffering; and shared memory
 * (Q tile + stages x K and V tiles, rows padded by 16 bytes) within the largest opt-in size of
 * any supported GPU (227 KiB on sm_90); the launch checks the device's.
 */
static cinfer_status_t validate_prefill(const cinfer__spec_t *spec, const family_t *fam) {
    if (spec->backend == CINFER__BACKEND_SM90)
        return validate_prefill_sm90(spec, fam);
    if (spec->backend != CINFER__BACKEND_SM80)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: backend %s is not implemented (sm80, sm90)", fam->name,
                             backend_names[(unsigned)spec->backend < 3 ? spec->backend : 0]);
    const bool fp8 = spec->dtype_kv == CINFER__DT_E4M3 || spec->dtype_kv == CINFER__DT_E5M2;
    if (!is_value_dtype(spec->dtype_q) || (spec->dtype_kv != spec->dtype_q && !fp8) ||
        spec->dtype_o != spec->dtype_q)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: dtype_q %s / dtype_kv %s / dtype_o %s: expected q and o of one "
                             "dtype, f16 or bf16, and kv the same or e4m3 / e5m2",
                             fam->name, cinfer__dtype_name(spec->dtype_q),
                             cinfer__dtype_name(spec->dtype_kv), cinfer__dtype_name(spec->dtype_o));
    if (spec->head_dim_qk % 16 != 0 || !in_range(spec->head_dim_qk, 16, 256) ||
        spec->head_dim_vo % 16 != 0 || !in_range(spec->head_dim_vo, 16, 256))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head dims %d / %d are not supported (multiples of 16, 16..256)",
                             fam->name, (int)spec->head_dim_qk, (int)spec->head_dim_vo);
    /* D_qk != D_vo: the kernel runs at the larger dim with zero-filled columns (kernels/prefill.cu,
     * D_QK), copying 16-bit K/V chunk by chunk; no fp8 K/V, RoPE or GQA packing. */
    if (spec->head_dim_qk != spec->head_dim_vo &&
        (fp8 || spec->pos != CINFER__POS_NONE || spec->gqa_pack != 0))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head_dim_qk %d != head_dim_vo %d is supported with 16-bit K/V, "
                             "no RoPE and no GQA packing",
                             fam->name, (int)spec->head_dim_qk, (int)spec->head_dim_vo);
    if (spec->mask != CINFER__MASK_NONE && spec->mask != CINFER__MASK_CAUSAL)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: mask %s is not supported (none, causal)", fam->name,
                             mask_names[(unsigned)spec->mask < 2 ? spec->mask : 0]);
    if ((spec->batch != 0 && spec->batch != 1) || (spec->paged != 0 && spec->paged != 1))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: batch %d / paged %d, expected 0 or 1 each", fam->name,
                             (int)spec->batch, (int)spec->paged);
    if (spec->paged && !spec->batch)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: paged 1 needs batch 1 (single prefill reads one contiguous K/V)",
                             fam->name);
    const int32_t w = spec->warps;
    if (w != 1 && w != 2 && w != 4 && w != 8)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: warps %d, expected 1, 2, 4 or 8",
                             fam->name, (int)w);
    if (spec->tile_q != 16 * w && spec->tile_q != 32 * w)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: tile_q %d, expected 16 or 32 query rows per warp (%d or %d)",
                             fam->name, (int)spec->tile_q, (int)(16 * w), (int)(32 * w));
    if (spec->tile_kv != 16 && spec->tile_kv != 32 && spec->tile_kv != 64 && spec->tile_kv != 128)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: tile_kv %d, expected 16, 32, 64 or 128", fam->name,
                             (int)spec->tile_kv);
    if (!in_range(spec->stages, 2, 4))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: stages %d outside [2, 4]",
                             fam->name, (int)spec->stages);
    /* A packed tile holds whole tokens: tile_q / G >= 1 of them, each with its G query heads. */
    if (spec->gqa_pack != 0 && (!spec->batch || !in_range(spec->gqa_pack, 2, spec->tile_q)))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: gqa_pack %d, expected 0, or 2..tile_q (%d) with batch 1",
                             fam->name, (int)spec->gqa_pack, (int)spec->tile_q);
    const int64_t dim =
        spec->head_dim_qk > spec->head_dim_vo ? spec->head_dim_qk : spec->head_dim_vo;
    const int64_t chunks = dim / 8 + 1;
    const int64_t kv_chunks = fp8 ? (dim / 16) | 1 : chunks;
    const int64_t smem = 16 * (chunks * (spec->tile_q + (fp8 ? 2 * (int64_t)spec->tile_kv : 0)) +
                               kv_chunks * 2 * (int64_t)spec->stages * spec->tile_kv);
    if (smem > 227 * 1024)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: tiles need %lld bytes of shared memory, more than 227 KiB",
                             fam->name, (long long)smem);
    return CINFER_STATUS_SUCCESS;
}

/* Limits of the MLA kernels (kernels/mla.cu): q, the latent cache and out of one 16-bit dtype,
 * head dims 576 (512 ckv + 64 kpe) and 512, 16 rows on 4 warps over KV tiles of 16 or 32 positions
 * in 2 to 4 stages, G query heads per token a power of two up to 16 (0 = 1); or the warpgroup
 * kernel (sm_90a): 64 rows (G = 64) on 8 warps over tiles of 32 in 4 stages (two steps of two
 * tiles, one per warpgroup). */
static cinfer_status_t validate_mla(const cinfer__spec_t *spec, const family_t *fam) {
    if (spec->op == CINFER__OP_MLA_MERGE) {
        if (spec->head_dim_vo != 512)
            return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                                 "%s: head_dim_vo %d, expected 512 (the ckv part)", fam->name,
                                 (int)spec->head_dim_vo);
        return CINFER_STATUS_SUCCESS;
    }
    if (spec->head_dim_vo != 512 || spec->head_dim_qk != 576)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head dims %d / %d, expected 576 (512 ckv + 64 kpe) / 512",
                             fam->name, (int)spec->head_dim_qk, (int)spec->head_dim_vo);
    if (!is_value_dtype(spec->dtype_q) || spec->dtype_kv != spec->dtype_q ||
        spec->dtype_o != spec->dtype_q)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: dtype_q %s / dtype_kv %s / dtype_o %s: expected one of f16 or "
                             "bf16 for all three",
                             fam->name, cinfer__dtype_name(spec->dtype_q),
                             cinfer__dtype_name(spec->dtype_kv), cinfer__dtype_name(spec->dtype_o));
    if (spec->mask != CINFER__MASK_NONE && spec->mask != CINFER__MASK_CAUSAL)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: mask %s is not supported (none, causal)", fam->name,
                             mask_names[(unsigned)spec->mask < 2 ? spec->mask : 0]);
    const int32_t g = spec->gqa_pack;
    if (spec->tile_q == 64) {
        /* the warpgroup kernel (kernels/mla_sm90.cuh, sm_90a): 64 heads of one token */
        const char *field = NULL, *expected = NULL;
        int32_t value = 0;
        if (spec->tile_kv != 32)
            field = "tile_kv", value = spec->tile_kv, expected = "32";
        else if (spec->warps != 8)
            field = "warps", value = spec->warps, expected = "8";
        else if (spec->stages != 4)
            field = "stages", value = spec->stages, expected = "4";
        else if (g != 64)
            field = "gqa_pack", value = g, expected = "64 (the heads of one token)";
        if (field)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: tile_q 64 (the warpgroup kernel): %s %d, expected %s",
                                 fam->name, field, (int)value, expected);
        return CINFER_STATUS_SUCCESS;
    }
    if (spec->tile_q != 16 || (spec->tile_kv != 16 && spec->tile_kv != 32) || spec->warps != 4 ||
        !in_range(spec->stages, 2, 4))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: tile_q %d / tile_kv %d / warps %d / stages %d, expected 16 / 16 "
                             "or 32 / 4 / 2..4 (or 64 / 32 / 8 / 2..3)",
                             fam->name, (int)spec->tile_q, (int)spec->tile_kv, (int)spec->warps,
                             (int)spec->stages);
    if (g < 0 || g > 16 || (g & (g - 1)) != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: gqa_pack %d, expected 0 or a power of two up to 16", fam->name,
                             (int)g);
    return CINFER_STATUS_SUCCESS;
}

/* Limits of the tensor-core decode kernel (kernels/decode_tc.cu): q and K/V of one 16-bit type
 * (they meet in one mma), or fp8 K/V converted to fp16 mma fragments in registers; rows of 4..32
 * swizzled 16-byte chunks, at most 16 heads as mma rows. */
static cinfer_status_t validate_decode_tc(const cinfer__spec_t *spec, const family_t *fam) {
    const bool fp8 = spec->dtype_kv == CINFER__DT_E4M3 || spec->dtype_kv == CINFER__DT_E5M2;
    if (!is_value_dtype(spec->dtype_q) || (spec->dtype_kv != spec->dtype_q && !fp8) ||
        spec->dtype_o != spec->dtype_q)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: dtype_q %s / dtype_kv %s / dtype_o %s: the tensor-core decode "
                             "needs q and out of one of f16 or bf16, and K/V of the same dtype or "
                             "e4m3 / e5m2",
                             fam->name, cinfer__dtype_name(spec->dtype_q),
                             cinfer__dtype_name(spec->dtype_kv), cinfer__dtype_name(spec->dtype_o));
    if (spec->head_dim_qk != spec->head_dim_vo ||
        (spec->head_dim_vo != 64 && spec->head_dim_vo != 128 && spec->head_dim_vo != 256))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head dims %d/%d: the tensor-core decode supports 64, 128 and 256",
                             fam->name, (int)spec->head_dim_qk, (int)spec->head_dim_vo);
    if (!in_range(spec->tile_q, 1, 16) || !in_range(spec->warps, 1, 8) ||
        !in_range(spec->stages, 2, 4))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: tile_q %d (1..16), warps %d (1..8), stages %d (2..4)", fam->name,
                             (int)spec->tile_q, (int)spec->warps, (int)spec->stages);
    return paged_check(spec, fam);
}

/* The paged KV append (kernels/append.cu) reads f16/bf16 rows (dtype_o, checked above) and
 * writes cache rows of dtype_kv, converting (fp8 with a scale) where the two differ. */
static cinfer_status_t validate_append(const cinfer__spec_t *spec, const family_t *fam) {
    if (!is_value_dtype(spec->dtype_kv) && spec->dtype_kv != CINFER__DT_E4M3 &&
        spec->dtype_kv != CINFER__DT_E5M2)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: dtype_kv %s is not supported (f16, bf16, e4m3, e5m2)", fam->name,
                             cinfer__dtype_name(spec->dtype_kv));
    return CINFER_STATUS_SUCCESS;
}

/* Position encodings the attention kernels apply themselves: none, or RoPE (kernels/pos_rope.cuh),
 * which rotates whole 8-element vectors of each half of the head dim. ALiBi is a variant. */
static cinfer_status_t validate_pos(const cinfer__spec_t *spec, const family_t *fam) {
    if (spec->pos != CINFER__POS_NONE && spec->pos != CINFER__POS_ROPE_LLAMA)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: pos %s is not supported (none, rope; ALiBi is the alibi variant)",
                             fam->name, pos_names[(unsigned)spec->pos < 3 ? spec->pos : 0]);
    if (spec->pos == CINFER__POS_ROPE_LLAMA && spec->head_dim_qk % 16 != 0)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: pos rope needs head_dim_qk %% 16 == 0, got %d", fam->name,
                             (int)spec->head_dim_qk);
    /* Prefill rotates K tiles in shared memory as 16-bit values (kernels/prefill.cu). */
    if (spec->pos == CINFER__POS_ROPE_LLAMA && spec->op == CINFER__OP_PREFILL &&
        (spec->dtype_kv == CINFER__DT_E4M3 || spec->dtype_kv == CINFER__DT_E5M2))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: pos rope with dtype_kv %s is not supported (RoPE needs f16 or "
                             "bf16 K/V)",
                             fam->name, cinfer__dtype_name(spec->dtype_kv));
    return CINFER_STATUS_SUCCESS;
}

/* What to write for a required field left out. */
static const char *missing_hint(const field_t *f) {
    if (f->kind == K_DTYPE)
        return "=f16 or =bf16; dtype= sets dtype_q, dtype_kv and dtype_o";
    switch (f->bit) {
    case F_BACKEND:
        return "=sm80, or backend=sm90 for sm_90a";
    case F_HD_QK:
    case F_HD_VO:
        return "=N; head_dim=N sets every head dim of the operation";
    case F_VEC:
        return "=1 or vec=8: elements per access, 8 for rows on 16-byte boundaries";
    default:
        return "=N";
    }
}

/*
 * The checks of cinfer__spec_validate. given holds the bits of the fields the spec's text gave
 * (parse_text), 0 when unknown: a required field that is 0 (or none, or simt) and not among them
 * is "not given" (INVALID_ARGUMENT); one the text gave as 0 goes on to the family's limits,
 * which name the value and the range.
 */
static cinfer_status_t validate(const cinfer__spec_t *spec, uint32_t given) {
    if ((unsigned)spec->op >= CINFER__OP_COUNT)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "spec: invalid operation %d",
                             (int)spec->op);
    const family_t *fam = &families[spec->op];
    /* Fields the family cannot do without, left out: named as such, not as bad values. A
     * prefill's backend (simt is not implemented), the dtypes, head dims, tiles and vec; the
     * other fields have a usable 0 (no mask, not paged, ...). */
    const uint32_t required =
        F_BACKEND | F_DTYPE_Q | F_DTYPE_KV | F_DTYPE_O | F_HD_QK | F_HD_VO | F_TILES | F_VEC;
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        const field_t *f = &fields[i];
        if (!(f->bit & required & fam->fields) || (f->bit & given) || get_field(spec, f) != 0)
            continue;
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: %s is not given (%s%s)",
                             fam->name, f->name, f->name, missing_hint(f));
    }
    if ((fam->fields & F_DTYPE_O) && !is_value_dtype(spec->dtype_o))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: dtype_o %s is not supported (f16 or bf16)", fam->name,
                             cinfer__dtype_name(spec->dtype_o));
    if ((fam->fields & F_HD_VO) && (spec->head_dim_vo < 1 || spec->head_dim_vo > 1024))
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head_dim_vo %d is out of range [1, 1024]", fam->name,
                             (int)spec->head_dim_vo);
    if ((fam->fields & F_VEC) && spec->vec != 1 && spec->vec != 8)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED, "%s: vec %d is not supported (1 or 8)",
                             fam->name, (int)spec->vec);
    if ((fam->fields & F_VEC) && spec->vec == 8 && (fam->fields & F_HD_VO) &&
        spec->head_dim_vo % 8 != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: vec 8 needs head_dim_vo %% 8 == 0, got %d", fam->name,
                             (int)spec->head_dim_vo);
    if (spec->op == CINFER__OP_DECODE || spec->op == CINFER__OP_DECODE_MERGE)
        CINFER__CHECK(validate_decode(spec, fam));
    if (spec->op == CINFER__OP_DECODE_TC)
        CINFER__CHECK(validate_decode_tc(spec, fam));
    if (spec->op == CINFER__OP_PREFILL)
        CINFER__CHECK(validate_prefill(spec, fam));
    if (spec->op == CINFER__OP_APPEND_PAGED_KV_CACHE)
        CINFER__CHECK(validate_append(spec, fam));
    if (spec->op == CINFER__OP_MLA || spec->op == CINFER__OP_MLA_MERGE)
        CINFER__CHECK(validate_mla(spec, fam));
    if (fam->fields & F_POS)
        CINFER__CHECK(validate_pos(spec, fam));
    if (spec->variant && spec->variant_id != cinfer__variant_id(spec->variant))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: variant_id does not match variant %s", fam->name,
                             cinfer_variant_name(spec->variant));
    if (spec->variant && (spec->flags & CINFER__FLAG_SOFT_CAP))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: the soft cap belongs to default attention; variant %s "
                             "transforms logits itself",
                             fam->name, cinfer_variant_name(spec->variant));
    if (spec->flags & ~fam->flags)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: flags 0x%x are not used by this family", fam->name,
                             (unsigned)(spec->flags & ~fam->flags));
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__spec_validate(const cinfer__spec_t *spec) {
    return validate(spec, 0);
}

cinfer_status_t cinfer__spec_parse_valid(const char *text, cinfer__spec_t *spec) {
    uint32_t given = 0;
    CINFER__CHECK(parse_text(text, spec, &given));
    const cinfer_status_t st = validate(spec, given);
    if (st != CINFER_STATUS_SUCCESS) {
        char why[1024];
        cinfer__fmt(why, sizeof why, "%s", cinfer_last_error());
        return cinfer__error(st, "spec \"%s\": %s", text, why);
    }
    return CINFER_STATUS_SUCCESS;
}

/* ---- rendering ---- */

/* The short token of each used field in kernel names, e.g. "bf16", "hd128", "causal". */
static void name_token(const cinfer__spec_t *spec, const field_t *f, char *dst, size_t cap) {
    int64_t v = get_field(spec, f);
    switch (f->bit) {
    case F_DTYPE_Q:
        cinfer__fmt(dst, cap, "q%s", cinfer__dtype_name((cinfer__dtype_t)v));
        break;
    case F_DTYPE_KV:
        cinfer__fmt(dst, cap, "kv%s", cinfer__dtype_name((cinfer__dtype_t)v));
        break;
    case F_DTYPE_O:
        cinfer__fmt(dst, cap, "%s", cinfer__dtype_name((cinfer__dtype_t)v));
        break;
    case F_HD_QK:
        cinfer__fmt(dst, cap, "hdqk%lld", (long long)v);
        break;
    case F_HD_VO:
        cinfer__fmt(dst, cap, "hd%lld", (long long)v);
        break;
    case F_PAGED:
        /* A family with single and batch kernels names the KV storage of its batch ones only. */
        if ((families[spec->op].fields & F_BATCH) && !spec->batch)
            dst[0] = '\0';
        else
            cinfer__fmt(dst, cap, "%s", v ? "paged" : "ragged");
        break;
    case F_BATCH:
        cinfer__fmt(dst, cap, "%s", v ? "batch" : "");
        break;
    case F_FLAGS: {
        char flags[96];
        format_value(f, v, flags, sizeof flags);
        for (char *c = flags; *c; c++)
            if (*c == '+')
                *c = '_';
        cinfer__fmt(dst, cap, "%s", v ? flags : "");
        break;
    }
    case F_TILE_Q:
    case F_TILE_KV:
    case F_WARPS:
    case F_STAGES:
        cinfer__fmt(dst, cap, "%c%lld", f->name[0] == 't' ? f->name[5] : f->name[0], (long long)v);
        break;
    case F_VEC:
        cinfer__fmt(dst, cap, "vec%lld", (long long)v);
        break;
    case F_GQA_PACK:
        /* Unpacked kernels keep their names. */
        if (v)
            cinfer__fmt(dst, cap, "gqa%lld", (long long)v);
        else
            dst[0] = '\0';
        break;
    case F_POS:
        /* No position encoding adds nothing to the name (the names of kernels without one stay
         * what they were before the field was used). */
        cinfer__fmt(dst, cap, "%s", v ? pos_names[v] : "");
        break;
    case F_VARIANT:
        /* Default attention adds nothing to the name; a variant adds its name. */
        cinfer__fmt(dst, cap, "%s",
                    v ? cinfer_variant_name((const cinfer_variant_t *)(intptr_t)v) : "");
        break;
    default:
        format_value(f, v, dst, cap);
        break;
    }
}

/* The macro each used field defines in the prelude. */
static void define_field(cinfer__str_t *s, const cinfer__spec_t *spec, const field_t *f) {
    if (f->kind == K_VARIANT)
        return; /* rendered with its source, below */
    char upper[32];
    size_t i = 0;
    for (; f->name[i] && i + 1 < sizeof upper; i++)
        upper[i] = (char)(f->name[i] >= 'a' && f->name[i] <= 'z' ? f->name[i] - 32 : f->name[i]);
    upper[i] = '\0';
    if (f->kind == K_FLAGS) {
        for (int b = 0; flag_names[b]; b++) {
            char flag[32];
            size_t j = 0;
            for (; flag_names[b][j] && j + 1 < sizeof flag; j++)
                flag[j] = (char)(flag_names[b][j] - 32);
            flag[j] = '\0';
            cinfer__str_printf(s, "#define CINFER_%s %d\n", flag, (spec->flags >> b) & 1 ? 1 : 0);
        }
        return;
    }
    cinfer__str_printf(s, "#define CINFER_%s %lld\n", upper, (long long)get_field(spec, f));
}

int cinfer__arch_number(const char *arch) {
    if (!arch || strncmp(arch, "sm_", 3) != 0)
        return -1;
    const char *p = arch + 3;
    int n = 0, digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 4; p++, digits++)
        n = n * 10 + (*p - '0');
    if (digits < 2 || digits > 3)
        return -1;
    if (*p == 'a' || *p == 'f')
        p++;
    return *p == '\0' ? n : -1;
}

cinfer_status_t cinfer__arch_check(const char *arch, const char *what) {
    const int number = cinfer__arch_number(arch);
    if (number < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: \"%s\" is not an arch of the form sm_XY, sm_XYa or sm_XYf (e.g. "
                             "sm_80, sm_90a)",
                             what, arch ? arch : "(null)");
    if (number < CINFER__MIN_ARCH)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: %s is older than sm_%d, the oldest arch cinfer's kernels are "
                             "written for (compute capability 8.0: bf16, cp.async, mma.sync)",
                             what, arch, CINFER__MIN_ARCH);
    return CINFER_STATUS_SUCCESS;
}

/* Options every kernel is compiled with; they are part of the key. */
static const char *const base_options[] = {"--std=c++17", "-default-device", "--fmad=true",
                                           "-DCINFER_NVRTC=1"};
#define NUM_BASE_OPTIONS (sizeof base_options / sizeof base_options[0])

cinfer_status_t cinfer__spec_render(const cinfer__spec_t *in, const char *arch, int nvrtc_version,
                                    cinfer__rendered_t *out) {
    memset(out, 0, sizeof *out);
    cinfer__spec_t spec = *in;
    cinfer__spec_normalize(&spec);
    CINFER__CHECK(cinfer__spec_validate(&spec));
    CINFER__CHECK(cinfer__arch_check(arch, "arch"));
    const family_t *fam = &families[spec.op];
    /* Kernels of warpgroup instructions (wgmma) exist in the sm_90a target alone. */
    const bool wgmma = (spec.op == CINFER__OP_PREFILL && spec.backend == CINFER__BACKEND_SM90) ||
                       (spec.op == CINFER__OP_MLA && spec.tile_q == 64);
    if (wgmma && strcmp(arch, "sm_90a") != 0)
        return cinfer__error(
            CINFER_STATUS_UNSUPPORTED, "%s: %s uses wgmma, which needs arch sm_90a, not %s",
            fam->name,
            spec.op == CINFER__OP_MLA ? "tile_q 64 (the warpgroup kernel)" : "backend sm90", arch);

    /* The name: op, then one token per used field, then the arch-independent backend. */
    size_t n = 0;
    cinfer__fmt(out->name, sizeof out->name, "%s", fam->name);
    n = strlen(out->name);
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        if (!(fam->fields & fields[i].bit))
            continue;
        char token[96];
        name_token(&spec, &fields[i], token, sizeof token);
        if (token[0]) {
            cinfer__fmt(out->name + n, sizeof out->name - n, "_%s", token);
            n = strlen(out->name);
        }
    }

    /* The source: the prelude of defines, then the family template. */
    cinfer__str_t *src = &out->source;
    char spec_text[512];
    cinfer__spec_format(&spec, spec_text, sizeof spec_text);
    cinfer__str_printf(src, "/* cinfer kernel %s\n * spec %s */\n", out->name, spec_text);
    cinfer__str_printf(src, "#define CINFER_KERNEL_NAME %s\n#define %s 1\n", out->name,
                       fam->define);
    for (size_t i = 0; i < NUM_FIELDS; i++)
        if (fam->fields & fields[i].bit)
            define_field(src, &spec, &fields[i]);
    if (spec.variant)
        cinfer__variant_render(spec.variant, src);
    cinfer__str_printf(src, "#include \"%s\"\n", fam->source);

    /* NVRTC options. */
    cinfer__fmt(out->arch_option, sizeof out->arch_option, "--gpu-architecture=%s", arch);
    for (size_t i = 0; i < NUM_BASE_OPTIONS; i++)
        out->options[out->num_options++] = base_options[i];
    out->options[out->num_options++] = out->arch_option;

    /* The key covers everything that can change the cubin. */
    cinfer__str_t *key = &out->key;
    cinfer__str_printf(key, "cinfer-kernel-key 1\nlibrary %s\nsources %016llx\nnvrtc %d\narch %s\n",
                       cinfer_version_string(), cinfer__kernel_sources_hash(), nvrtc_version, arch);
    cinfer__str_puts(key, "options");
    for (int i = 0; i < out->num_options; i++)
        cinfer__str_printf(key, " %s", out->options[i]);
    cinfer__str_printf(key, "\nname %s\nsource\n", out->name);
    if (!src->failed)
        cinfer__str_append(key, src->data, src->len);
    if (src->failed || key->failed) {
        cinfer__rendered_free(out);
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "rendering %s: out of memory", out->name);
    }
    XXH128_hash_t h = XXH3_128bits(key->data, key->len);
    cinfer__fmt(out->key_hash, sizeof out->key_hash, "%016llx%016llx", (unsigned long long)h.high64,
                (unsigned long long)h.low64);
    cinfer__fmt(out->file_stem, sizeof out->file_stem, "%s-%s", out->name, out->key_hash);
    return CINFER_STATUS_SUCCESS;
}

void cinfer__rendered_free(cinfer__rendered_t *r) {
    cinfer__str_free(&r->source);
    cinfer__str_free(&r->key);
}
