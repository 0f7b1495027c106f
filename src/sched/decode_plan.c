/*
 * The decode planner (see decode_plan.h for the rules): options and page-table checks, split-KV
 * chunking, the work list and the workspace layout. No CUDA calls.
 */
#include <math.h>
#include <stdlib.h>

#include "ops/options.h"
#include "sched/decode_plan.h"

/* kernels/decode_tc.cu loads a work item as two 16-byte vectors. */
_Static_assert(sizeof(cinfer_decode_work) == 32, "cinfer_decode_work must stay 32 bytes");

/* ---- tile choices ---- */

int cinfer__decode_heads_per_cta(int group, int limit) {
    for (int h = limit; h > 1; h--)
        if (group % h == 0)
            return h;
    return 1;
}

int cinfer__decode_tile_kv(int heads_per_cta) {
    return heads_per_cta <= 4 ? 4 : 2;
}

int cinfer__decode_units(const cinfer__decode_config_t *cfg) {
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    return cfg->num_kv_heads * (group / cfg->heads_per_cta);
}

int cinfer__decode_merge_rows(int head_dim) {
    (void)head_dim;
    return CINFER__DECODE_WARPS;
}

/* ---- argument checks ---- */

cinfer_status_t cinfer__decode_options_check(const cinfer_attention_options_t *o, bool batch) {
    CINFER__CHECK(cinfer__attention_options_check(
        o, CINFER__DTS_HALF | CINFER__DTS(CINFER__DT_E4M3) | CINFER__DTS(CINFER__DT_E5M2),
        "fp16, bf16, fp8 e4m3 (code 10, 8 bits) or fp8 e5m2 (code 12, 8 bits)"));
    /* The decode kernel gives each lane 8 elements of a row (16-byte loads) and a row at most one
     * warp (kernels/decode.cu). */
    if (o->head_dim % 8 != 0 || o->head_dim > 256)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->head_dim = %d is not supported by decode: expected a "
                             "multiple of 8, at most 256",
                             o->head_dim);
    if (!batch)
        return CINFER_STATUS_SUCCESS;
    if (o->page_size < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->page_size = %d, expected 1..256", o->page_size);
    if (o->page_size > 256)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->page_size = %d is not supported, expected 1..256",
                             o->page_size);
    if (o->use_cuda_graph != 0 && o->use_cuda_graph != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->use_cuda_graph = %d, expected 0 or 1", o->use_cuda_graph);
    if (o->max_batch_size < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->max_batch_size = %d, expected >= 1", o->max_batch_size);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__decode_kv_lens(const int32_t *kv_indptr, const int32_t *kv_last_page_len,
                                       int batch_size, int max_batch_size, int page_size,
                                       int32_t *kv_len) {
    if (batch_size < 0 || batch_size > max_batch_size)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "batch_size = %d, expected 0..%d (options->max_batch_size)",
                             batch_size, max_batch_size);
    if (!kv_indptr)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "kv_indptr is NULL, expected %d host int32 entries (batch_size + 1)",
                             batch_size + 1);
    if (batch_size > 0 && !kv_last_page_len)
        return cinfer__error(
            CINFER_STATUS_INVALID_ARGUMENT,
            "kv_last_page_len is NULL, expected %d host int32 entries (batch_size)", batch_size);
    if (kv_indptr[0] < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "kv_indptr[0] = %d, expected >= 0 (an offset into kv_indices)",
                             kv_indptr[0]);
    for (int b = 0; b < batch_size; b++) {
        const int64_t pages = (int64_t)kv_indptr[b + 1] - kv_indptr[b];
        if (pages < 0)
            return cinfer__error(
                CINFER_STATUS_INVALID_ARGUMENT,
                "kv_indptr is not monotone: kv_indptr[%d] = %d < kv_indptr[%d] = %d", b + 1,
                kv_indptr[b + 1], b, kv_indptr[b]);
        if (pages == 0) {
            kv_len[b] = 0;
            continue;
        }
        const int32_t last = kv_last_page_len[b];
        if (last < 1 || last > page_size)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "kv_last_page_len[%d] = %d, expected 1..%d (page_size) for a "
                                 "request with %lld pages",
                                 b, last, page_size, (long long)pages);
        const int64_t len = (pages - 1) * page_size + last;
        if (len > INT32_MAX)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "request %d: kv_len = %lld (%lld pages of %d) exceeds 2^31 - 1", b,
                                 (long long)len, (long long)pages, page_size);
        kv_len[b] = (int32_t)len;
    }
    return CINFER_STATUS_SUCCESS;
}

/* ---- workspace ---- */

static size_t align_up(size_t n) {
    return (n + CINFER__DECODE_ALIGN - 1) / CINFER__DECODE_ALIGN * CINFER__DECODE_ALIGN;
}

void cinfer__decode_layout(int work_capacity, int request_capacity, int slot_capacity,
                           int heads_per_cta, int head_dim, cinfer__decode_layout_t *out) {
    out->work_capacity = work_capacity;
    out->request_capacity = request_capacity;
    out->slot_capacity = slot_capacity;
    const size_t slot_heads = (size_t)slot_capacity * (size_t)heads_per_cta;
    out->requests_offset = align_up(sizeof(cinfer_decode_header));
    out->work_offset =
        out->requests_offset + align_up((size_t)request_capacity * sizeof(cinfer_decode_request));
    out->schedule_bytes = out->work_offset + (size_t)work_capacity * sizeof(cinfer_decode_work);
    out->partial_o_offset = align_up(out->schedule_bytes);
    out->partial_lse_offset =
        out->partial_o_offset + align_up(slot_heads * (size_t)head_dim * sizeof(float));
    out->total_bytes = out->partial_lse_offset + align_up(slot_heads * sizeof(float));
}

cinfer_status_t cinfer__decode_batch_layout(const cinfer__decode_config_t *cfg, int head_dim,
                                            cinfer__decode_layout_t *out) {
    const int64_t unsplit = (int64_t)cfg->max_batch_size * cinfer__decode_units(cfg);
    const int64_t work = unsplit + CINFER__DECODE_BALANCED_SPLIT * (int64_t)cfg->max_ctas;
    const int64_t slots = 2 * CINFER__DECODE_BALANCED_SPLIT * (int64_t)cfg->max_ctas;
    if (work > INT32_MAX || slots > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->max_batch_size = %d x %d head slices per request + %d "
                             "CTAs = %lld work items exceeds 2^31 - 1",
                             cfg->max_batch_size, cinfer__decode_units(cfg), cfg->max_ctas,
                             (long long)work);
    cinfer__decode_layout((int)work, cfg->max_batch_size, (int)slots, cfg->heads_per_cta, head_dim,
                          out);
    return CINFER_STATUS_SUCCESS;
}

/* ---- planning ---- */

/* Positions a request attends: all kv_len, or the last window_left + 1 of them. */
static int64_t attended(const cinfer__decode_config_t *cfg, int32_t kv_len) {
    const int64_t w = cfg->window_left;
    return (w >= 0 && kv_len > w + 1) ? w + 1 : kv_len;
}

static int64_t chunks_of(int64_t attended_len, int64_t chunk) {
    return attended_len <= chunk ? 1 : (attended_len + chunk - 1) / chunk;
}

/* items(C) / units: the chunk count summed over requests. */
static int64_t count_chunks(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                            int64_t chunk) {
    int64_t n = 0;
    for (int b = 0; b < batch; b++)
        n += chunks_of(attended(cfg, kv_len[b]), chunk);
    return n;
}

/* Descending order of int64 values. */
static int compare_desc(const void *a, const void *b);

/*
 * The estimated step time of chunk C, in tokens: the largest per-CTA sum of item lengths plus
 * CINFER__DECODE_ITEM_TOKENS per item, for the order and assignment cinfer__decode_plan_build
 * gives (items longest first, dealt out in snake order over bands of max_ctas). len[] (batch
 * entries) and load[] (max_ctas entries) are scratch.
 */
static int64_t estimated_step(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                              int64_t chunk, int64_t *len, int64_t *load) {
    const int64_t units = cinfer__decode_units(cfg), band = cfg->max_ctas;
    int64_t full = 0; /* whole chunks of the split requests: the longest items */
    for (int b = 0; b < batch; b++) {
        const int64_t a = attended(cfg, kv_len[b]), n = chunks_of(a, chunk);
        full += (n - 1) * units;
        len[b] = a - (n - 1) * chunk; /* the last (or only) chunk */
    }
    qsort(len, (size_t)batch, sizeof *len, compare_desc);
    for (int64_t c = 0; c < band; c++)
        load[c] = 0;
    int64_t i = 0, worst = 0;
    for (int b = -1; b < batch; b++) {
        const int64_t n = b < 0 ? full : units,
                      cost = (b < 0 ? chunk : len[b]) + CINFER__DECODE_ITEM_TOKENS;
        for (int64_t j = 0; j < n; j++, i++) {
            const int64_t pos = i % band, cta = (i / band) % 2 ? band - 1 - pos : pos;
            load[cta] += cost;
            worst = load[cta] > worst ? load[cta] : worst;
        }
    }
    return worst;
}

/* The chunk of the balanced regime: k * ALIGN for the k in [k_lo, k_max] with the shortest
 * estimated step among the chunks that cut the longest request into 1, 2, ... pieces, each CTA's
 * share of the step (k_share) and the lower limit; ties go to the longer chunk (fewer partial
 * states to merge). Host cost: about 20 estimates of O(work items + batch log batch + max_ctas). */
static cinfer_status_t choose_balanced(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                       int batch, int64_t k_lo, int64_t k_share, int64_t k_max,
                                       int64_t *k_out) {
    int64_t *len = malloc(sizeof(int64_t) * ((size_t)batch + (size_t)cfg->max_ctas));
    if (!len)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "decode plan: no host memory for the chunk choice (%d requests)",
                             batch);
    int64_t *load = len + batch;
    const int64_t align = CINFER__DECODE_CHUNK_ALIGN;
    int64_t best_k = k_max, best = estimated_step(cfg, kv_len, batch, k_max * align, len, load);
    if (k_share < k_max) {
        const int64_t t = estimated_step(cfg, kv_len, batch, k_share * align, len, load);
        if (t < best) {
            best = t;
            best_k = k_share;
        }
    }
    /* Pieces 2..8, then 25% more each time (at most about 20 candidates in all). */
    for (int64_t pieces = 2;; pieces = pieces < 8 ? pieces + 1 : pieces + pieces / 4) {
        int64_t k = (k_max + pieces - 1) / pieces;
        const bool last = k <= k_lo;
        k = last ? k_lo : k;
        const int64_t t = estimated_step(cfg, kv_len, batch, k * align, len, load);
        if (t < best) {
            best = t;
            best_k = k;
        }
        if (last)
            break;
    }
    free(len);
    *k_out = best_k;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__decode_plan_chunks(const cinfer__decode_config_t *cfg,
                                           const int32_t *kv_len, int batch_size,
                                           cinfer__decode_chunking_t *out) {
    if (batch_size < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "batch_size = %d, expected >= 0",
                             batch_size);
    const int64_t units = cinfer__decode_units(cfg);
    int64_t max_len = 0;
    for (int b = 0; b < batch_size; b++) {
        if (kv_len[b] < 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "kv_len[%d] = %d, expected >= 0",
                                 b, kv_len[b]);
        const int64_t a = attended(cfg, kv_len[b]);
        max_len = a > max_len ? a : max_len;
    }
    /* Candidates C = k * ALIGN, k in [1, k_max]; at k_max every request is one chunk. */
    const int64_t align = CINFER__DECODE_CHUNK_ALIGN;
    const int64_t k_max = max_len > align ? (max_len + align - 1) / align : 1;
    int64_t k = k_max;
    if (cfg->no_split) {
        /* k_max: one chunk per request */
    } else if ((int64_t)batch_size * units <= cfg->max_ctas) {
        int64_t lo = 1, hi = k_max; /* items(hi * ALIGN) <= max_ctas holds throughout */
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (count_chunks(cfg, kv_len, batch_size, mid * align) * units <= cfg->max_ctas)
                hi = mid;
            else
                lo = mid + 1;
        }
        k = hi;
    } else {
        /* Balanced regime: the candidate chunk with the shortest estimated step (decode_plan.h). */
        double total = 0;
        for (int b = 0; b < batch_size; b++)
            total += (double)attended(cfg, kv_len[b]);
        const double share = total * (double)units / (double)cfg->max_ctas;
        const double lo = fmax(share / CINFER__DECODE_BALANCED_SPLIT, CINFER__DECODE_BALANCED_MIN);
        const int64_t k_lo = (int64_t)ceil(lo / (double)align);
        const int64_t k_share =
            (int64_t)ceil(fmax(share, CINFER__DECODE_BALANCED_MIN) / (double)align);
        if (k_lo < k_max)
            CINFER__CHECK(choose_balanced(cfg, kv_len, batch_size, k_lo, k_share, k_max, &k));
    }
    const int64_t chunk = k * align;
    int64_t work = 0, slots = 0, max_chunks = batch_size ? 1 : 0;
    for (int b = 0; b < batch_size; b++) {
        const int64_t n = chunks_of(attended(cfg, kv_len[b]), chunk);
        work += n * units;
        if (n > 1)
            slots += n * units;
        max_chunks = n > max_chunks ? n : max_chunks;
    }
    if (work > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "decode plan: %lld work items (batch_size %d x %lld head slices) "
                             "exceeds 2^31 - 1",
                             (long long)work, batch_size, (long long)units);
    out->chunk_size = chunk > INT32_MAX ? INT32_MAX : (int)chunk;
    out->num_work = (int)work;
    out->num_slots = (int)slots;
    out->max_chunks = (int)max_chunks;
    out->split = max_chunks > 1;
    out->merge_warps = cinfer__decode_merge_warps(cfg, batch_size, (int)max_chunks);
    return CINFER_STATUS_SUCCESS;
}

/* Descending order of the packed (attended length, index) keys. */
static int compare_desc(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* Longer items first; ties in (kv_begin, request, kv_head, head_begin) order, so plans are
 * deterministic. */
static int compare_items(const void *a, const void *b) {
    const cinfer_decode_work *x = a, *y = b;
    const int lx = x->kv_end - x->kv_begin, ly = y->kv_end - y->kv_begin;
    if (lx != ly)
        return lx > ly ? -1 : 1;
    if (x->kv_begin != y->kv_begin)
        return x->kv_begin < y->kv_begin ? -1 : 1;
    if (x->request != y->request)
        return x->request < y->request ? -1 : 1;
    if (x->kv_head != y->kv_head)
        return x->kv_head < y->kv_head ? -1 : 1;
    return (x->head_begin > y->head_begin) - (x->head_begin < y->head_begin);
}

cinfer_status_t cinfer__decode_plan_build(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                          const int32_t *kv_indptr, int batch_size,
                                          const cinfer__decode_chunking_t *chunking,
                                          const cinfer__decode_schedule_t *dst) {
    if (batch_size > dst->request_capacity || chunking->num_work > dst->work_capacity ||
        chunking->num_slots > dst->slot_capacity)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "decode plan: batch %d / %d items / %d partial slots exceed the "
                             "workspace capacities %d / %d / %d",
                             batch_size, chunking->num_work, chunking->num_slots,
                             dst->request_capacity, dst->work_capacity, dst->slot_capacity);
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    const int hpc = cfg->heads_per_cta, slices_per_head = group / hpc;
    const int units = cinfer__decode_units(cfg);
    const int64_t chunk = chunking->chunk_size;

    /* Request infos; slots are given out in request order. */
    int slot = 0;
    for (int b = 0; b < batch_size; b++) {
        const int64_t n = chunks_of(attended(cfg, kv_len[b]), chunk);
        cinfer_decode_request *r = &dst->requests[b];
        r->kv_len = kv_len[b];
        r->num_chunks = (int)n;
        r->partial_base = n > 1 ? slot : -1;
        if (n > 1)
            slot += (int)n * units;
    }

    /* Longest attended range first; the low 32 bits hold INT32_MAX - b so ties keep index order
     * in the descending sort (lengths are < 2^31, so the key stays positive). */
    for (int b = 0; b < batch_size; b++)
        dst->order[b] = (attended(cfg, kv_len[b]) << 32) | (int64_t)(INT32_MAX - b);
    qsort(dst->order, (size_t)batch_size, sizeof *dst->order, compare_desc);

    int w = 0;
    for (int c = 0; c < chunking->max_chunks; c++) {
        for (int i = 0; i < batch_size; i++) {
            const int b = INT32_MAX - (int)(dst->order[i] & 0xffffffff);
            const cinfer_decode_request *r = &dst->requests[b];
            /* Requests are sorted by attended length, so chunk counts only fall from here on. */
            if (c >= r->num_chunks)
                break;
            const int64_t begin = kv_len[b] - attended(cfg, kv_len[b]) + (int64_t)c * chunk;
            const int64_t end = begin + chunk < kv_len[b] ? begin + chunk : kv_len[b];
            for (int s = 0; s < units; s++) {
                cinfer_decode_work *item = &dst->work[w++];
                item->request = b;
                item->kv_head = s / slices_per_head;
                item->head_begin = (s % slices_per_head) * hpc;
                item->kv_begin = (int)begin;
                item->kv_end = (int)end;
                item->partial = r->num_chunks > 1 ? r->partial_base + s * r->num_chunks + c : -1;
                item->page_begin = kv_indptr ? kv_indptr[b] : 0;
                item->kv_len = kv_len[b];
            }
        }
    }
    if (w != chunking->num_work || slot != chunking->num_slots)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "decode plan: wrote %d items / %d slots, the chunking counted %d / %d",
                             w, slot, chunking->num_work, chunking->num_slots);

    /* Snake order over bands of max_ctas items (see decode_plan.h). It balances the CTAs only if
     * the items fall in length; chunk-major order guarantees that unless the balanced regime split
     * some requests (their later chunks follow shorter whole requests), so sort those plans. */
    const int band = cfg->max_ctas;
    if (chunking->split && w > band)
        qsort(dst->work, (size_t)w, sizeof *dst->work, compare_items);
    for (int64_t lo = band; lo < w; lo += 2 * (int64_t)band) {
        int64_t i = lo, j = (lo + band < w ? lo + band : w) - 1;
        for (; i < j; i++, j--) {
            const cinfer_decode_work t = dst->work[i];
            dst->work[i] = dst->work[j];
            dst->work[j] = t;
        }
    }

    dst->header->num_work = w;
    dst->header->batch_size = batch_size;
    dst->header->merge_warps = chunking->merge_warps;
    return CINFER_STATUS_SUCCESS;
}

/* ---- grids ---- */

int cinfer__decode_attention_grid(const cinfer__decode_config_t *cfg, int num_work) {
    if (cfg->graph)
        return cfg->max_ctas;
    return num_work < cfg->max_ctas ? num_work : cfg->max_ctas;
}

int cinfer__decode_merge_warps(const cinfer__decode_config_t *cfg, int batch_size, int max_chunks) {
    if (max_chunks <= CINFER__DECODE_MERGE_WARP_CHUNKS || batch_size < 1)
        return 1;
    if (!cfg->graph)
        return 4;
    const int64_t rows = CINFER__DECODE_WARPS; /* warps per merge block */
    const int64_t capacity =
        ((int64_t)cfg->max_batch_size * cfg->num_qo_heads + rows - 1) / rows * rows;
    for (int warps = 4; warps > 1; warps /= 2)
        if ((int64_t)batch_size * cfg->num_qo_heads * warps <= capacity)
            return warps;
    return 1;
}

int64_t cinfer__decode_merge_grid(const cinfer__decode_config_t *cfg, int head_dim, int batch_size,
                                  bool split, int merge_warps) {
    const int64_t rows = cinfer__decode_merge_rows(head_dim);
    if (cfg->graph)
        return ((int64_t)cfg->max_batch_size * cfg->num_qo_heads + rows - 1) / rows;
    const int64_t warps = split ? (int64_t)batch_size * cfg->num_qo_heads * merge_warps : 0;
    return (warps + rows - 1) / rows;
}
