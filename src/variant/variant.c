/*
 * Attention variants: creation and checking of declarations, the generated parameter struct,
 * packing of run-time argument lists, and the built-in example variants.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "jit/sources.h"
#include "ops/tensor.h"
#include "variant/variant.h"

/* ---- parameter types ---- */

typedef struct param_type {
    uint8_t code, bits;
    const char *c_type; /* the member's type in the generated struct (tensors: the pointee) */
    const char *name;   /* in messages */
    size_t size;        /* scalar size in bytes (0: not allowed as a scalar) */
} param_type_t;

static const param_type_t param_types[] = {
    {kDLFloat, 16, "cinfer_half_bits", "float16", 0},
    {kDLBfloat, 16, "cinfer_half_bits", "bfloat16", 0},
    {kDLFloat, 32, "float", "float32", 4},
    {kDLFloat, 64, "double", "float64", 8},
    {kDLInt, 32, "int32_t", "int32", 4},
    {kDLInt, 64, "int64_t", "int64", 8},
    {kDLUInt, 32, "uint32_t", "uint32", 4},
    {kDLUInt, 8, "uint8_t", "uint8", 0},
};
#define NUM_PARAM_TYPES (sizeof param_types / sizeof param_types[0])

static const param_type_t *find_type(DLDataType dt) {
    if (dt.lanes != 1)
        return NULL;
    for (size_t i = 0; i < NUM_PARAM_TYPES; i++)
        if (param_types[i].code == dt.code && param_types[i].bits == dt.bits)
            return &param_types[i];
    return NULL;
}

static const char *type_name(DLDataType dt) {
    const param_type_t *t = find_type(dt);
    return t ? t->name : "an unsupported dtype";
}

static bool is_identifier(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n == 0 || n >= max || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
            return false;
    return true;
}

/* C and C++ keywords (NVRTC compiles C++): a parameter becomes a member of the generated struct,
 * so its name must not be one, nor a reserved name (two underscores, or underscore and capital),
 * nor start with cinfer_ (the library's own names). */
static bool is_reserved_name(const char *s) {
    static const char *const keywords[] = {
        "alignas",
        "alignof",
        "and",
        "and_eq",
        "asm",
        "auto",
        "bitand",
        "bitor",
        "bool",
        "break",
        "case",
        "catch",
        "char",
        "char8_t",
        "char16_t",
        "char32_t",
        "class",
        "compl",
        "concept",
        "const",
        "consteval",
        "constexpr",
        "constinit",
        "const_cast",
        "continue",
        "co_await",
        "co_return",
        "co_yield",
        "decltype",
        "default",
        "delete",
        "do",
        "double",
        "dynamic_cast",
        "else",
        "enum",
        "explicit",
        "export",
        "extern",
        "false",
        "float",
        "for",
        "friend",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "mutable",
        "namespace",
        "new",
        "noexcept",
        "not",
        "not_eq",
        "nullptr",
        "operator",
        "or",
        "or_eq",
        "private",
        "protected",
        "public",
        "register",
        "reinterpret_cast",
        "requires",
        "restrict",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "static_assert",
        "static_cast",
        "struct",
        "switch",
        "template",
        "this",
        "thread_local",
        "throw",
        "true",
        "try",
        "typedef",
        "typeid",
        "typename",
        "union",
        "unsigned",
        "using",
        "virtual",
        "void",
        "volatile",
        "wchar_t",
        "while",
        "xor",
        "xor_eq",
        "_Bool",
        "params",
    };
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if (strcmp(s, keywords[i]) == 0)
            return true;
    return (s[0] == '_' && (s[1] == '_' || (s[1] >= 'A' && s[1] <= 'Z'))) ||
           strncmp(s, "cinfer_", 7) == 0;
}

/* ---- hooks the host must know ---- */

/* Occurrences of text in source. */
static int count(const char *source, const char *text) {
    int n = 0;
    for (const char *p = strstr(source, text); p; p = strstr(p + 1, text))
        n++;
    return n;
}

/* True when a line of the source is "#define NAME VALUE" (spaces allowed around '#'). */
static bool defines(const char *source, const char *name, const char *value) {
    const size_t name_len = strlen(name), value_len = strlen(value);
    for (const char *line = source; line && *line;) {
        const char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '#') {
            p++;
            while (*p == ' ' || *p == '\t')
                p++;
            if (strncmp(p, "define", 6) == 0 && (p[6] == ' ' || p[6] == '\t')) {
                p += 6;
                while (*p == ' ' || *p == '\t')
                    p++;
                if (strncmp(p, name, name_len) == 0 &&
                    (p[name_len] == ' ' || p[name_len] == '\t')) {
                    p += name_len;
                    while (*p == ' ' || *p == '\t')
                        p++;
                    if (strncmp(p, value, value_len) == 0 &&
                        !isalnum((unsigned char)p[value_len]) && p[value_len] != '_')
                        return true;
                }
            }
        }
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return false;
}

/* ---- creation ---- */

static cinfer_status_t init_variant(cinfer_variant_t *v, const char *name, const char *source,
                                    const cinfer_param_t *params, int num_params) {
    if (!name)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "variant name is NULL, expected a C identifier of 1..%d characters",
                             CINFER__VARIANT_NAME_MAX - 1);
    if (!is_identifier(name, CINFER__VARIANT_NAME_MAX))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "variant name \"%s\": expected a C identifier of 1..%d characters",
                             name, CINFER__VARIANT_NAME_MAX - 1);
    if (!source)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "variant %s: source is NULL", name);
    if (num_params < 0 || num_params > CINFER__VARIANT_MAX_PARAMS)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "variant %s: num_params = %d, expected 0..%d", name, num_params,
                             CINFER__VARIANT_MAX_PARAMS);
    if (num_params > 0 && !params)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "variant %s: params is NULL with num_params = %d", name, num_params);
    cinfer__fmt(v->name, sizeof v->name, "%s", name);
    v->num_params = num_params;
    size_t offset = 0, align_max = 4;
    bool seen_scalar = false;
    for (int i = 0; i < num_params; i++) {
        const cinfer_param_t *p = &params[i];
        if (!p->name)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "variant %s: params[%d].name is NULL, expected a C identifier of "
                                 "1..%d characters",
                                 name, i, CINFER__VARIANT_NAME_MAX - 1);
        if (!is_identifier(p->name, CINFER__VARIANT_NAME_MAX))
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "variant %s: params[%d].name \"%s\": expected a C identifier of "
                                 "1..%d characters",
                                 name, i, p->name, CINFER__VARIANT_NAME_MAX - 1);
        if (is_reserved_name(p->name))
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "variant %s: params[%d].name \"%s\" is a C/C++ keyword or a "
                                 "reserved name (it becomes a struct member)",
                                 name, i, p->name);
        for (int j = 0; j < i; j++)
            if (strcmp(params[j].name, p->name) == 0)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "variant %s: params[%d].name \"%s\" repeats params[%d]", name,
                                     i, p->name, j);
        const param_type_t *t = find_type(p->dtype);
        if (p->kind == CINFER_PARAM_TENSOR) {
            if (seen_scalar)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "variant %s: params[%d] (tensor %s) follows a scalar; "
                                     "declare every tensor before the scalars",
                                     name, i, p->name);
            if (!t)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "variant %s: params[%d] (tensor %s): dtype (code %u, %u bits, "
                                     "%u lanes) is not supported (float16, bfloat16, float32, "
                                     "float64, int32, int64, uint32, uint8)",
                                     name, i, p->name, p->dtype.code, p->dtype.bits,
                                     p->dtype.lanes);
            offset = (offset + 7) & ~(size_t)7;
            v->offsets[i] = offset;
            offset += 8;
            align_max = 8;
        } else if (p->kind == CINFER_PARAM_SCALAR) {
            seen_scalar = true;
            if (!t || t->size == 0)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "variant %s: params[%d] (scalar %s): dtype (code %u, %u bits, "
                                     "%u lanes) is not supported (float32, float64, int32, int64, "
                                     "uint32)",
                                     name, i, p->name, p->dtype.code, p->dtype.bits,
                                     p->dtype.lanes);
            offset = (offset + t->size - 1) & ~(t->size - 1);
            v->offsets[i] = offset;
            offset += t->size;
            if (t->size > align_max)
                align_max = t->size;
        } else {
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "variant %s: params[%d] (%s): kind = %d, expected "
                                 "CINFER_PARAM_TENSOR (1) or CINFER_PARAM_SCALAR (2)",
                                 name, i, p->name, (int)p->kind);
        }
        cinfer__fmt(v->param_names[i], sizeof v->param_names[i], "%s", p->name);
        v->params[i] = *p;
        v->params[i].name = v->param_names[i];
    }
    /* A struct without members holds one int (C++ gives an empty struct size 1). */
    v->struct_bytes = num_params ? (offset + align_max - 1) & ~(align_max - 1) : 4;
    v->source = strdup(source);
    if (!v->source)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "variant %s: out of memory", name);
    v->hooks =
        (defines(source, "VARIANT_USE_SOFTMAX", "0") ? CINFER__VARIANT_NO_SOFTMAX : 0) |
        (defines(source, "VARIANT_OUTPUT_TRANSFORM", "1") ? CINFER__VARIANT_OUTPUT_TRANSFORM : 0) |
        (defines(source, "VARIANT_ALIBI_SLOPE", "1") ? CINFER__VARIANT_ALIBI_SLOPE : 0);
    if ((v->hooks & CINFER__VARIANT_NO_SOFTMAX) ||
        defines(source, "VARIANT_LOGITS_TRANSFORM", "1") ||
        defines(source, "VARIANT_LOGITS_MASK", "1") ||
        defines(source, "VARIANT_LOGITS_MASK_BITS", "1") ||
        defines(source, "VARIANT_LOGITS_MASK_ROW", "1") || (v->hooks & CINFER__VARIANT_ALIBI_SLOPE))
        v->hooks |= CINFER__VARIANT_LOGITS;
    if (!strstr(source, "VARIANT_LOGITS_TRANSFORM") && !strstr(source, "VARIANT_QUERY_TRANSFORM") &&
        !strstr(source, "VARIANT_OUTPUT_TRANSFORM") && !strstr(source, "VARIANT_USE_SOFTMAX") &&
        (!strstr(source, "VARIANT_LOGITS_MASK") ||
         (defines(source, "VARIANT_LOGITS_MASK_ROW", "1") &&
          count(source, "VARIANT_LOGITS_MASK") == count(source, "VARIANT_LOGITS_MASK_ROW"))))
        v->hooks |= CINFER__VARIANT_SM90;
    XXH3_state_t *h = XXH3_createState();
    if (!h) {
        free(v->source);
        v->source = NULL;
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "variant %s: out of memory", name);
    }
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, v->name, strlen(v->name) + 1);
    for (int i = 0; i < num_params; i++) {
        XXH3_64bits_update(h, v->param_names[i], strlen(v->param_names[i]) + 1);
        const uint32_t code[4] = {(uint32_t)params[i].kind, params[i].dtype.code,
                                  params[i].dtype.bits, params[i].dtype.lanes};
        XXH3_64bits_update(h, code, sizeof code);
    }
    XXH3_64bits_update(h, v->source, strlen(v->source));
    v->id = XXH3_64bits_digest(h);
    if (v->id == 0)
        v->id = 1; /* 0 means default attention */
    XXH3_freeState(h);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_variant_create(const char *name, const char *source,
                                      const cinfer_param_t *params, int num_params,
                                      cinfer_variant_t **out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "cinfer_variant_create: out is NULL");
    *out = NULL;
    cinfer_variant_t *v = calloc(1, sizeof *v);
    if (!v)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "cinfer_variant_create: out of memory");
    cinfer_status_t st = init_variant(v, name, source, params, num_params);
    if (st != CINFER_STATUS_SUCCESS) {
        free(v);
        return st;
    }
    *out = v;
    return CINFER_STATUS_SUCCESS;
}

void cinfer_variant_destroy(cinfer_variant_t *v) {
    if (!v || v->builtin)
        return;
    free(v->source);
    free(v);
}

const char *cinfer_variant_name(const cinfer_variant_t *v) {
    return v ? v->name : NULL;
}

const char *cinfer_variant_source(const cinfer_variant_t *v) {
    return v ? v->source : NULL;
}

const cinfer_param_t *cinfer_variant_params(const cinfer_variant_t *v, int *num_params) {
    if (num_params)
        *num_params = v ? v->num_params : 0;
    return v ? v->params : NULL;
}

/* ---- built-ins ---- */

#define F32                                                                                        \
    { kDLFloat, 32, 1 }
#define I64                                                                                        \
    { kDLInt, 64, 1 }
#define TENSOR CINFER_PARAM_TENSOR
#define SCALAR CINFER_PARAM_SCALAR

static const cinfer_param_t sigmoid_params[] = {{"scale", SCALAR, F32}, {"bias", SCALAR, F32}};
static const cinfer_param_t sinks_params[] = {{"sinks", TENSOR, F32}};
static const cinfer_param_t alibi_params[] = {{"maybe_alibi_slopes", TENSOR, F32},
                                              {"num_heads", SCALAR, {kDLInt, 32, 1}}};
static const cinfer_param_t dump_params[] = {{"logits", TENSOR, F32},
                                             {"row_offset", TENSOR, I64},
                                             {"head_stride", SCALAR, I64},
                                             {"pos_stride", SCALAR, I64}};

static const cinfer_param_t mask_params[] = {{"packed_mask", TENSOR, {kDLUInt, 8, 1}},
                                             {"row_offset", TENSOR, I64},
                                             {"row_stride", TENSOR, {kDLInt, 32, 1}}};

/* Each parameter's CINFER__VARIANT_SIZE_* (as cinfer.h documents the built-ins' shapes; a
 * dump_logits and custom_mask request's offsets into logits and packed_mask are device data). */
#define QO_HEADS CINFER__VARIANT_SIZE_QO_HEADS
#define BATCH    CINFER__VARIANT_SIZE_BATCH
static const unsigned char sinks_sizes[] = {QO_HEADS};
static const unsigned char alibi_sizes[] = {QO_HEADS, CINFER__VARIANT_SIZE_POSITIVE};
static const unsigned char dump_sizes[] = {0, BATCH, 0, 0};
static const unsigned char mask_sizes[] = {0, BATCH, BATCH};

static const struct {
    const char *name;
    const char *file;
    const cinfer_param_t *params;
    const unsigned char *sizes; /* NULL: none checked */
    int num_params;
} builtin_table[] = {
    {"sigmoid", "variant_sigmoid.cuh", sigmoid_params, NULL, 2},
    {"sinks", "variant_sinks.cuh", sinks_params, sinks_sizes, 1},
    {"alibi", "variant_alibi.cuh", alibi_params, alibi_sizes, 2},
    {"dump_logits", "variant_dump_logits.cuh", dump_params, dump_sizes, 4},
    {"custom_mask", "variant_custom_mask.cuh", mask_params, mask_sizes, 3},
};
#define NUM_BUILTINS (sizeof builtin_table / sizeof builtin_table[0])

static cinfer_variant_t builtins[NUM_BUILTINS];
static bool builtins_ok[NUM_BUILTINS];
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

static void init_builtins(void) {
    for (size_t i = 0; i < NUM_BUILTINS; i++) {
        const cinfer__source_t *src = cinfer__kernel_source(builtin_table[i].file);
        if (!src)
            continue;
        /* The embedded text is NUL-terminated by cmake/embed.c. */
        builtins_ok[i] =
            init_variant(&builtins[i], builtin_table[i].name, src->text, builtin_table[i].params,
                         builtin_table[i].num_params) == CINFER_STATUS_SUCCESS;
        builtins[i].builtin = true;
        if (builtin_table[i].sizes)
            memcpy(builtins[i].sizes, builtin_table[i].sizes, (size_t)builtin_table[i].num_params);
    }
}

const cinfer_variant_t *cinfer__variant_builtin(const char *name, size_t len) {
    pthread_once(&builtins_once, init_builtins);
    for (size_t i = 0; i < NUM_BUILTINS; i++)
        if (builtins_ok[i] && strlen(builtin_table[i].name) == len &&
            strncmp(builtin_table[i].name, name, len) == 0)
            return &builtins[i];
    return NULL;
}

const cinfer_variant_t *cinfer_variant_builtin(const char *name) {
    return name ? cinfer__variant_builtin(name, strlen(name)) : NULL;
}

/* ---- rendering ---- */

void cinfer__variant_render(const cinfer_variant_t *v, cinfer__str_t *s) {
    cinfer__str_printf(s,
                       "#define CINFER_VARIANT 1\n#define CINFER_VARIANT_HOST_USE_SOFTMAX %d\n"
                       "#define CINFER_VARIANT_HOST_OUTPUT_TRANSFORM %d\n"
                       "#define CINFER_VARIANT_HOST_LOGITS %d\n",
                       v->hooks & CINFER__VARIANT_NO_SOFTMAX ? 0 : 1,
                       v->hooks & CINFER__VARIANT_OUTPUT_TRANSFORM ? 1 : 0,
                       v->hooks & CINFER__VARIANT_LOGITS ? 1 : 0);
    cinfer__str_puts(s, "#include \"common.cuh\"\n#include \"dtype.cuh\"\n"
                        "typedef struct cinfer_variant_params {\n");
    for (int i = 0; i < v->num_params; i++) {
        const param_type_t *t = find_type(v->params[i].dtype);
        cinfer__str_printf(s, "    %s %s%s;\n", t->c_type,
                           v->params[i].kind == CINFER_PARAM_TENSOR ? "*" : "", v->param_names[i]);
    }
    if (v->num_params == 0)
        cinfer__str_puts(s, "    int cinfer_unused_;\n");
    cinfer__str_printf(s, "} cinfer_variant_params;\n#line 1 \"variant:%s\"\n", v->name);
    cinfer__str_puts(s, v->source);
    cinfer__str_puts(s, "\n");
}

/* ---- argument packing ---- */

static bool is_contiguous(const DLTensor *t) {
    if (!t->strides)
        return true;
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect)
            return false;
        expect *= t->shape[d];
    }
    return true;
}

/* A built-in's tensor argument i against the run's sizes (sizes[i]; nothing to check for ANY). */
static cinfer_status_t check_size(const cinfer_variant_t *v, int i, const DLTensor *t,
                                  int64_t num_qo_heads, int64_t batch_size, const char *op) {
    const int kind = v->sizes[i];
    if (kind != CINFER__VARIANT_SIZE_QO_HEADS && kind != CINFER__VARIANT_SIZE_BATCH)
        return CINFER_STATUS_SUCCESS;
    const bool heads = kind == CINFER__VARIANT_SIZE_QO_HEADS;
    const int64_t need = heads ? num_qo_heads : batch_size;
    if (t->ndim != 1 || t->shape[0] < need) {
        char got[128];
        cinfer__shape_string(got, sizeof got, t->ndim, t->shape);
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: argument %d (tensor %s) of variant %s: shape %s, expected 1-d "
                             "with at least %lld elements (%s)",
                             op, i, v->params[i].name, v->name, got, (long long)need,
                             heads ? "num_qo_heads" : "batch_size");
    }
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__variant_check_disjoint(const cinfer_variant_t *v, const cinfer_args_t *args,
                                               const DLTensor *out, const DLTensor *lse) {
    const int num_args = args && v ? args->num_args : 0; /* pack checked it against v */
    for (int i = 0; i < num_args; i++) {
        const cinfer_arg_t *a = &args->args[i];
        if (a->kind != CINFER_PARAM_TENSOR || !a->tensor ||
            ((!out || !cinfer__tensor_overlap(out, a->tensor)) &&
             (!lse || !cinfer__tensor_overlap(lse, a->tensor))))
            continue; /* the name is formatted only for the error (run calls pass here) */
        char name[128];
        cinfer__fmt(name, sizeof name, "%s (argument %d of variant %s)", v->param_names[i], i,
                    v->name);
        const cinfer__tensor_arg_t arg = {name, a->tensor, false};
        CINFER__CHECK(cinfer__tensor_check_disjoint("out", out, &arg, 1));
        CINFER__CHECK(cinfer__tensor_check_disjoint("lse", lse, &arg, 1));
    }
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__variant_pack(const cinfer_variant_t *v, const cinfer_args_t *args,
                                     int64_t num_qo_heads, int64_t batch_size,
                                     const cinfer_context_t *ctx, const char *op,
                                     unsigned char blob[CINFER__VARIANT_MAX_BYTES], size_t *bytes) {
    const int num_args = args ? args->num_args : 0;
    const int expected = v ? v->num_params : 0;
    const char *vname = v ? v->name : "default attention";
    memset(blob, 0, CINFER__VARIANT_MAX_BYTES);
    *bytes = v ? v->struct_bytes : 4;
    if (args && num_args > 0 && !args->args)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: args->args is NULL with num_args = %d", op, num_args);
    if (num_args != expected) {
        char list[512] = "";
        for (int i = 0; i < expected; i++) {
            size_t n = strlen(list);
            cinfer__fmt(list + n, sizeof list - n, "%s%s %s", i ? ", " : "",
                        v->params[i].kind == CINFER_PARAM_TENSOR ? "tensor" : "scalar",
                        v->param_names[i]);
        }
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: %d variant argument(s) given, variant %s declares %d%s%s%s", op,
                             num_args, vname, expected, expected ? " (" : "", list,
                             expected ? ")" : "");
    }
    for (int i = 0; i < num_args; i++) {
        const cinfer_arg_t *a = &args->args[i];
        const cinfer_param_t *p = &v->params[i];
        const char *kind = p->kind == CINFER_PARAM_TENSOR ? "tensor" : "scalar";
        if (a->kind != p->kind)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: argument %d (%s): kind %d, expected a %s (kind %d)", op, i,
                                 p->name, (int)a->kind, kind, (int)p->kind);
        if (p->kind == CINFER_PARAM_SCALAR) {
            const param_type_t *t = find_type(p->dtype);
            if (a->dtype.code != p->dtype.code || a->dtype.bits != p->dtype.bits ||
                a->dtype.lanes != 1)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "%s: argument %d (scalar %s): dtype %s, expected %s", op, i,
                                     p->name, type_name(a->dtype), t->name);
            if (v->sizes[i] == CINFER__VARIANT_SIZE_POSITIVE && a->value.i32 < 1)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "%s: argument %d (scalar %s) of variant %s = %d, expected "
                                     ">= 1",
                                     op, i, p->name, v->name, (int)a->value.i32);
            memcpy(blob + v->offsets[i], &a->value, t->size);
            continue;
        }
        const DLTensor *t = a->tensor;
        if (!t) {
            if (strncmp(p->name, "maybe_", 6) != 0)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "%s: argument %d (tensor %s) is NULL; only parameters named "
                                     "maybe_* may be NULL",
                                     op, i, p->name);
            continue; /* the pointer stays NULL */
        }
        if (t->dtype.code != p->dtype.code || t->dtype.bits != p->dtype.bits || t->dtype.lanes != 1)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: argument %d (tensor %s): dtype %s, expected %s", op, i,
                                 p->name, type_name(t->dtype), type_name(p->dtype));
        CINFER__CHECK(cinfer__tensor_check(ctx, p->name, t, t->ndim, NULL, ~0u));
        CINFER__CHECK(check_size(v, i, t, num_qo_heads, batch_size, op));
        if (!is_contiguous(t))
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: argument %d (tensor %s) is not contiguous (expected compact "
                                 "row-major strides)",
                                 op, i, p->name);
        void *ptr = cinfer__tensor_data(t);
        if ((uintptr_t)ptr % (p->dtype.bits / 8u) != 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: argument %d (tensor %s): data %p + byte_offset %llu is not "
                                 "aligned to its %u-byte elements",
                                 op, i, p->name, t->data, (unsigned long long)t->byte_offset,
                                 p->dtype.bits / 8u);
        memcpy(blob + v->offsets[i], &ptr, sizeof ptr);
    }
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__variant_lse_check(const cinfer_variant_t *v, const DLTensor *lse,
                                          const char *op) {
    if (v && lse && (v->hooks & CINFER__VARIANT_NO_SOFTMAX))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: lse given, but variant %s has no softmax (VARIANT_USE_SOFTMAX 0) "
                             "and so no LSE; pass lse = NULL",
                             op, v->name);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__variant_options_check(const cinfer_attention_options_t *o) {
    if (o->variant && o->logits_soft_cap != 0.0f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->logits_soft_cap = %g with variant %s: a custom variant "
                             "transforms logits itself (expected 0)",
                             (double)o->logits_soft_cap, o->variant->name);
    return CINFER_STATUS_SUCCESS;
}
