/*
 * The decode planner (see decode_plan.h for the rules): options and page-table checks, split-KV
 * chunking, the work list and the workspace layout. No CUDA calls.
 */
#include <stdlib.h>
#include <string.h>

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
    CINFER__CHECK(cinfer__attention_same_head_dims(o, batch ? "batch decode" : "single decode"));
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

void cinfer__decode_layout(int work_capacity, int info_capacity, int slot_capacity,
                           int heads_per_cta, int head_dim, cinfer__decode_layout_t *out) {
    out->work_capacity = work_capacity;
    out->info_capacity = info_capacity;
    out->slot_capacity = slot_capacity;
    const size_t slot_heads = (size_t)slot_capacity * (size_t)heads_per_cta;
    out->infos_offset = align_up(sizeof(cinfer_decode_header));
    out->work_offset =
        out->infos_offset + align_up((size_t)info_capacity * sizeof(cinfer_decode_request));
    out->schedule_bytes = out->work_offset + (size_t)work_capacity * sizeof(cinfer_decode_work);
    out->partial_o_offset = align_up(out->schedule_bytes);
    out->partial_lse_offset =
        out->partial_o_offset + align_up(slot_heads * (size_t)head_dim * sizeof(float));
    out->total_bytes = out->partial_lse_offset + align_up(slot_heads * sizeof(float));
}

cinfer_status_t cinfer__decode_batch_layout(const cinfer__decode_config_t *cfg, int head_dim,
                                            cinfer__decode_layout_t *out) {
    const int64_t unsplit = (int64_t)cfg->max_batch_size * cinfer__decode_units(cfg);
    const int64_t work = unsplit + (int64_t)cfg->max_ctas;
    const int64_t slots = 2 * (int64_t)cfg->max_ctas;
    if (work > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "options->max_batch_size = %d x %d head slices per request + %d "
                             "CTAs = %lld work items exceeds 2^31 - 1",
                             cfg->max_batch_size, cinfer__decode_units(cfg), cfg->max_ctas,
                             (long long)work);
    cinfer__decode_layout((int)work, (int)unsplit, (int)slots, cfg->heads_per_cta, head_dim, out);
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

/* What a walk of the stream found (cinfer__decode_plan_chunks' fields of the stream regime). */
typedef struct stream_counts {
    int64_t pieces, slots, ctas, max_pieces;
    int64_t last_cost; /* the last lane's cost, tokens + ITEM per piece */
    int64_t max_cost;  /* the costliest lane's */
} stream_counts_t;

/* The stream regime's lanes (decode_plan.h): `width` CTAs side by side take the same KV range
 * of `width` head slices of a request; units / width passes cover a request's slices. */
static void stream_lanes(const cinfer__decode_config_t *cfg, int64_t *width, int64_t *lanes) {
    const int64_t units = cinfer__decode_units(cfg), g = cfg->max_ctas;
    *width = g >= units ? units : 1;
    *lanes = g / *width;
}

/* The stream regime's budget of one lane in tokens (decode_plan.h): the sum over the request
 * passes of (attended + CINFER__DECODE_ITEM_TOKENS), plus CINFER__DECODE_ITEM_TOKENS per cut, over
 * the lanes, rounded up. */
static int64_t stream_share(const cinfer__decode_config_t *cfg, const int32_t *kv_len, int batch,
                            int64_t cuts) {
    int64_t width, lanes;
    stream_lanes(cfg, &width, &lanes);
    const int64_t passes = cinfer__decode_units(cfg) / width;
    int64_t total = cuts * CINFER__DECODE_ITEM_TOKENS;
    for (int b = 0; b < batch; b++)
        total += passes * (attended(cfg, kv_len[b]) + CINFER__DECODE_ITEM_TOKENS);
    return (total + lanes - 1) / lanes;
}

/*
 * Walks the stream of the stream regime (decode_plan.h): requests in batch order, each one's
 * passes (groups of `width` head slices) in order, each pass's attended range [kv_len - a, kv_len)
 * cut into pieces at the lanes' boundaries. A lane takes pieces until its budget (share, plus what
 * the lanes before it left unspent or minus what they overspent) is used up; a piece costs its
 * tokens + CINFER__DECODE_ITEM_TOKENS. A piece that does not fit is cut at a multiple of
 * CINFER__DECODE_CHUNK_ALIGN tokens when both parts keep at least that many (never with
 * cfg->no_split); where the lane's room holds no such cut, a piece over twice the budget gives the
 * lane its first CHUNK_ALIGN tokens only; otherwise it stays whole, on this lane if at least the
 * smaller of itself and CINFER__DECODE_CHUNK_ALIGN tokens fits (no_split: half of it), else on the
 * next. Every lane up to the last one used gets at least one piece, the last lane takes whatever
 * is left. A piece is `width` items, slice pass * width + j on CTA lane * width + j. With `items`
 * non-NULL, writes each item's request, slice, kv_begin, kv_end and kv_len, and its CTA in
 * `next`, in stream order.
 */
static stream_counts_t stream_walk(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                   int batch, int64_t share, cinfer_decode_work *items) {
    int64_t width, lanes;
    stream_lanes(cfg, &width, &lanes);
    const int64_t passes = cinfer__decode_units(cfg) / width;
    const int64_t item = CINFER__DECODE_ITEM_TOKENS, align = CINFER__DECODE_CHUNK_ALIGN;
    stream_counts_t n = {0, 0, 0, 0, 0, 0};
    int64_t lane = 0, left = share, in_lane = 0, cost = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t end = kv_len[b], begin = end - attended(cfg, kv_len[b]);
        for (int64_t pass = 0; pass < passes; pass++) {
            int64_t pos = begin, range_pieces = 0;
            do {
                int64_t take = end - pos;
                const int64_t least = cfg->no_split ? take / 2 : (take < align ? take : align);
                if (lane < lanes - 1 && in_lane > 0 && left - item < least) {
                    lane++; /* not even the least of it fits here (always so once left <= 0) */
                    left += share;
                    in_lane = 0;
                    cost = 0;
                }
                const int64_t room = left - item;
                if (lane < lanes - 1 && !cfg->no_split && take > room && room >= align &&
                    take - room >= align)
                    take = room / align * align;
                else if (lane < lanes - 1 && !cfg->no_split && room < align && take > 2 * share &&
                         take >= 2 * align)
                    take = align; /* a lane with no room for a cut (a budget under ITEM + ALIGN, or
                                     spent by the lanes before it) takes the least piece of a range
                                     over twice the budget, not all of it */
                for (int64_t j = 0; items && j < width; j++) {
                    cinfer_decode_work *it = &items[n.pieces + j];
                    it->request = b;
                    it->slice = (int)(pass * width + j);
                    it->kv_begin = (int)pos;
                    it->kv_end = (int)(pos + take);
                    it->kv_len = kv_len[b];
                    it->next = (int)(lane * width + j);
                }
                n.pieces += width;
                range_pieces++;
                in_lane++;
                left -= take + item;
                cost += take + item;
                n.max_cost = cost > n.max_cost ? cost : n.max_cost;
                pos += take;
            } while (pos < end);
            if (range_pieces > 1)
                n.slots += range_pieces * width;
            n.max_pieces = range_pieces > n.max_pieces ? range_pieces : n.max_pieces;
        }
    }
    n.ctas = n.pieces == 0 ? 0 : (lane + 1) * width; /* a lane is entered only with a piece */
    n.last_cost = cost;
    return n;
}

cinfer_status_t cinfer__decode_plan_chunks(const cinfer__decode_config_t *cfg,
                                           const int32_t *kv_len, int batch_size,
                                           cinfer__decode_chunking_t *out) {
    if (batch_size < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "batch_size = %d, expected >= 0",
                             batch_size);
    const int64_t units = cinfer__decode_units(cfg);
    int64_t max_len = 0, total = 0; /* total: attended tokens of all requests */
    for (int b = 0; b < batch_size; b++) {
        if (kv_len[b] < 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "kv_len[%d] = %d, expected >= 0",
                                 b, kv_len[b]);
        const int64_t a = attended(cfg, kv_len[b]);
        max_len = a > max_len ? a : max_len;
        total += a;
    }
    if ((int64_t)batch_size * units > INT32_MAX)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "decode plan: batch_size %d x %lld head slices exceeds 2^31 - 1",
                             batch_size, (long long)units);
    /* One-wave regime's chunk C = k * ALIGN, k in [1, k_max]; at k_max every request is one chunk:
     * the smallest C with items(C) <= max_ctas (binary search; items(C) is non-increasing in C),
     * raised up to CINFER__DECODE_MIN_CHUNK as far as the items still number busy_ctas (with
     * busy_ctas 0, to it only when its items still fill half a wave). */
    const int64_t align = CINFER__DECODE_CHUNK_ALIGN;
    const bool fits_one_wave = (int64_t)batch_size * units <= cfg->max_ctas;
    int64_t k = 1, k_fit = 1; /* k_fit: before the raise */
    if (fits_one_wave) {
        const int64_t k_max = max_len > align ? (max_len + align - 1) / align : 1;
        k = k_fit = k_max;
        if (!cfg->no_split) {
            int64_t lo = 1; /* items(k * ALIGN) <= max_ctas holds for k = k */
            while (lo < k) {
                const int64_t mid = lo + (k - lo) / 2;
                if (count_chunks(cfg, kv_len, batch_size, mid * align) * units <= cfg->max_ctas)
                    k = mid;
                else
                    lo = mid + 1;
            }
            k_fit = k;
            const int64_t k_min = CINFER__DECODE_MIN_CHUNK / align;
            const int64_t k_up = k_min < k_max ? k_min : k_max;
            if (cfg->busy_ctas > 0) {
                for (int64_t up = k_up; up > k; up--)
                    if (count_chunks(cfg, kv_len, batch_size, up * align) * units >=
                        cfg->busy_ctas) {
                        k = up;
                        break;
                    }
                /* Past CINFER__DECODE_MIN_CHUNK: the fewest items that still number busy_ctas,
                 * in the smallest chunk that makes that many, where those chunks are nearly all
                 * full (their tokens within 1/8 of the attended ones: long requests, not a mix
                 * whose short ones would each take a slot). */
                int64_t kb = k, kb_hi = k_max;
                if (count_chunks(cfg, kv_len, batch_size, kb * align) * units >= cfg->busy_ctas)
                    while (kb < kb_hi) {
                        const int64_t mid = kb + (kb_hi - kb + 1) / 2;
                        if (count_chunks(cfg, kv_len, batch_size, mid * align) * units >=
                            cfg->busy_ctas)
                            kb = mid;
                        else
                            kb_hi = mid - 1;
                    }
                /* then the smallest chunk with as many items: the most even ones */
                const int64_t n_kb = count_chunks(cfg, kv_len, batch_size, kb * align);
                int64_t kc = k + 1;
                while (kc < kb) {
                    const int64_t mid = kc + (kb - kc) / 2;
                    if (count_chunks(cfg, kv_len, batch_size, mid * align) <= n_kb)
                        kb = mid;
                    else
                        kc = mid + 1;
                }
                if (kb > k && kb > k_up && n_kb * kb * align <= total + total / 8)
                    k = kb;
            } else if (k < k_up &&
                       2 * count_chunks(cfg, kv_len, batch_size, k_up * align) * units >=
                           cfg->max_ctas) {
                k = k_up; /* busy_ctas 0: all or nothing, at half a wave */
            }
        }
    }
    /* A batch that fits one wave streams only when the longest item at the smallest chunk that
     * fits would cost more than a stream lane's budget and slack (a batch of mixed lengths that
     * barely fits one wave would leave its longest requests in a few long chunks) and more than
     * the stream's costliest lane (whose budget holds no cut when it is under CHUNK_ALIGN + ITEM:
     * a lane may then take a whole range of up to twice it). */
    const int64_t slack = CINFER__DECODE_CHUNK_ALIGN + CINFER__DECODE_ITEM_TOKENS;
    const int64_t fit_chunk = k_fit * align;
    const int64_t longest_item =
        (fit_chunk < max_len ? fit_chunk : max_len) + CINFER__DECODE_ITEM_TOKENS;
    /* The budget is searched only where the stream may be chosen: beyond one wave, or when that
     * item costs more than the smallest budget the search can return (no cut) and its slack. */
    bool may_stream = !fits_one_wave;
    if (fits_one_wave && !cfg->no_split)
        may_stream = longest_item > stream_share(cfg, kv_len, batch_size, 0) + slack;
    /* Stream regime's budget (decode_plan.h): the smallest between "no cut" and "a cut at every
     * lane boundary" (always enough) that leaves the last lane no more than a piece's slack above
     * it (a binary search over at most CINFER__DECODE_ITEM_TOKENS values). */
    int64_t share = 0;
    if (may_stream) {
        int64_t width, lanes;
        stream_lanes(cfg, &width, &lanes);
        int64_t lo = stream_share(cfg, kv_len, batch_size, 0);
        share = stream_share(cfg, kv_len, batch_size, lanes - 1);
        while (lo < share) {
            const int64_t mid = lo + (share - lo) / 2;
            const stream_counts_t t = stream_walk(cfg, kv_len, batch_size, mid, NULL);
            if (t.ctas < lanes * width || t.last_cost <= mid + slack)
                share = mid;
            else
                lo = mid + 1;
        }
    }
    bool stream = !fits_one_wave;
    stream_counts_t walk = {0, 0, 0, 0, 0, 0};
    if (may_stream && (!fits_one_wave || longest_item > share + slack)) {
        walk = stream_walk(cfg, kv_len, batch_size, share, NULL);
        stream = !fits_one_wave || walk.max_cost < longest_item;
    }
    if (stream) {
        out->stream = true;
        out->stream_share = share;
        out->chunk_size = 0;
        out->num_work = (int)walk.pieces;
        out->num_ctas = (int)walk.ctas;
        out->num_slots = (int)walk.slots;
        out->max_chunks = (int)walk.max_pieces;
    } else {
        const int64_t chunk = k * align;
        int64_t work = 0, slots = 0, max_chunks = batch_size ? 1 : 0;
        for (int b = 0; b < batch_size; b++) {
            const int64_t n = chunks_of(attended(cfg, kv_len[b]), chunk);
            work += n * units;
            if (n > 1)
                slots += n * units;
            max_chunks = n > max_chunks ? n : max_chunks;
        }
        out->stream = false;
        out->stream_share = 0;
        out->chunk_size = chunk > INT32_MAX ? INT32_MAX : (int)chunk;
        out->num_work = (int)work;
        out->num_ctas = (int)work;
        out->num_slots = (int)slots;
        out->max_chunks = (int)max_chunks;
    }
    out->split = out->max_chunks > 1;
    out->merge_warps = cinfer__decode_merge_warps(cfg, batch_size, out->max_chunks);
    return CINFER_STATUS_SUCCESS;
}

/* Slice infos and partial slots of the items work[0, n), in which each head slice's pieces come in
 * KV order (not necessarily adjacent): a slice of one piece writes directly (partial -1), the
 * c-th piece of a split slice takes slot partial_base + c, bases given out in the order of the
 * slices' first pieces from 0. Also sets page_begin. seen: scratch of batch * units ints.
 * Returns the slots used. */
static int assign_slots(const cinfer__decode_config_t *cfg, const int32_t *kv_indptr,
                        cinfer_decode_work *work, int n, int batch, cinfer_decode_request *infos,
                        int *seen) {
    const int64_t units = cinfer__decode_units(cfg);
    for (int64_t i = 0; i < (int64_t)batch * units; i++) {
        infos[i].num_chunks = 0;
        seen[i] = 0;
    }
    for (int i = 0; i < n; i++)
        infos[(int64_t)work[i].request * units + work[i].slice].num_chunks++;
    int slot = 0;
    for (int i = 0; i < n; i++) {
        const int64_t k = (int64_t)work[i].request * units + work[i].slice;
        cinfer_decode_request *info = &infos[k];
        const int c = seen[k]++;
        if (c == 0) {
            info->kv_len = work[i].kv_len;
            info->partial_base = info->num_chunks > 1 ? slot : -1;
            if (info->num_chunks > 1)
                slot += info->num_chunks;
        }
        work[i].partial = info->num_chunks > 1 ? info->partial_base + c : -1;
        work[i].page_begin = kv_indptr ? kv_indptr[work[i].request] : 0;
    }
    return slot;
}

cinfer_status_t cinfer__decode_plan_build(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                          const int32_t *kv_indptr, int batch_size,
                                          const cinfer__decode_chunking_t *chunking,
                                          const cinfer__decode_schedule_t *dst) {
    const int units = cinfer__decode_units(cfg);
    if ((int64_t)batch_size * units > dst->info_capacity ||
        chunking->num_work > dst->work_capacity || chunking->num_slots > dst->slot_capacity)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "decode plan: %lld slice infos / %d items / %d partial slots exceed "
                             "the workspace capacities %d / %d / %d",
                             (long long)batch_size * units, chunking->num_work, chunking->num_slots,
                             dst->info_capacity, dst->work_capacity, dst->slot_capacity);
    const int n = chunking->num_work;
    const int64_t infos = (int64_t)batch_size * units;
    /* Scratch: a counter per slice, and in the stream regime the items in stream order and a
     * count and an offset per CTA. */
    const int ctas = chunking->num_ctas;
    int *seen =
        malloc(sizeof(int) * (size_t)(infos + (chunking->stream ? 2 * (int64_t)ctas : 0) + 1));
    cinfer_decode_work *stream =
        chunking->stream ? malloc(sizeof *stream * (size_t)(n > 0 ? n : 1)) : NULL;
    if (!seen || (chunking->stream && !stream)) {
        free(seen);
        free(stream);
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "decode plan: no host memory for the schedule of %d work items", n);
    }
    int slots = 0;
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    if (!chunking->stream) {
        /* One wave: every item is a CTA's only one; a slice's chunks adjacent, in KV order. */
        const int64_t chunk = chunking->chunk_size;
        int w = 0;
        for (int b = 0; b < batch_size && st == CINFER_STATUS_SUCCESS; b++) {
            const int64_t a = attended(cfg, kv_len[b]), c_n = chunks_of(a, chunk);
            for (int s = 0; s < units; s++)
                for (int64_t c = 0; c < c_n; c++) {
                    if (w == n) {
                        st = cinfer__error(CINFER_STATUS_INTERNAL,
                                           "decode plan: more items than the %d the chunking "
                                           "counted",
                                           n);
                        break;
                    }
                    cinfer_decode_work *it = &dst->work[w++];
                    const int64_t begin = kv_len[b] - a + c * chunk;
                    it->request = b;
                    it->slice = s;
                    it->kv_begin = (int)begin;
                    it->kv_end = (int)(begin + chunk < kv_len[b] ? begin + chunk : kv_len[b]);
                    it->kv_len = kv_len[b];
                    it->next = -1;
                }
        }
        if (st == CINFER_STATUS_SUCCESS && w != n)
            st = cinfer__error(CINFER_STATUS_INTERNAL,
                               "decode plan: wrote %d items, the chunking counted %d", w, n);
        if (st == CINFER_STATUS_SUCCESS)
            slots = assign_slots(cfg, kv_indptr, dst->work, n, batch_size, dst->infos, seen);
    } else {
        /* Stream: the items in stream order, then CTA c's first item at c and its others after
         * the num_ctas first ones (CTA by CTA, each in stream order), linked in that order. */
        const stream_counts_t got =
            stream_walk(cfg, kv_len, batch_size, chunking->stream_share, stream);
        if (got.pieces != n || got.ctas != ctas)
            st = cinfer__error(CINFER_STATUS_INTERNAL,
                               "decode plan: the stream has %lld items on %lld CTAs, the "
                               "chunking counted %d on %d",
                               (long long)got.pieces, (long long)got.ctas, n, ctas);
        if (st == CINFER_STATUS_SUCCESS) {
            slots = assign_slots(cfg, kv_indptr, stream, n, batch_size, dst->infos, seen);
            int *count = seen + infos, *offset = count + ctas;
            for (int c = 0; c < ctas; c++)
                count[c] = 0;
            for (int j = 0; j < n; j++)
                count[stream[j].next]++;
            int at = ctas; /* the non-first items of the CTAs before c */
            for (int c = 0; c < ctas; c++) {
                offset[c] = at;
                at += count[c] - 1;
                count[c] = 0; /* now: items of CTA c placed so far */
            }
            for (int j = 0; j < n; j++) {
                const int c = stream[j].next, k = count[c]++;
                cinfer_decode_work *it = &dst->work[k == 0 ? c : offset[c] + k - 1];
                *it = stream[j];
                it->next = -2; /* linked below */
            }
            /* Link CTA c's items: c, then offset[c] .. offset[c] + count[c] - 2. */
            for (int c = 0; c < ctas; c++) {
                int prev = c;
                for (int k = 1; k < count[c]; k++) {
                    dst->work[prev].next = offset[c] + k - 1;
                    prev = offset[c] + k - 1;
                }
                dst->work[prev].next = -1;
            }
        }
    }
    free(seen);
    free(stream);
    CINFER__CHECK(st);
    if (slots != chunking->num_slots)
        return cinfer__error(CINFER_STATUS_INTERNAL,
                             "decode plan: used %d partial slots, the chunking counted %d", slots,
                             chunking->num_slots);
    dst->header->num_work = n;
    dst->header->num_ctas = ctas;
    dst->header->batch_size = batch_size;
    dst->header->merge_warps = chunking->merge_warps;
    return CINFER_STATUS_SUCCESS;
}

void cinfer__decode_plan_uniform(const cinfer__decode_config_t *cfg, const int32_t *kv_len,
                                 const int32_t *kv_indptr, int batch_size,
                                 const cinfer__decode_chunking_t *chunking,
                                 cinfer_decode_uniform *out) {
    memset(out, 0, sizeof *out);
    if (cfg->graph || batch_size != 1 || chunking->stream || chunking->chunk_size < 1)
        return;
    const int64_t a = attended(cfg, kv_len[0]);
    out->pieces = (int)chunks_of(a, chunking->chunk_size);
    out->chunk = chunking->chunk_size;
    out->kv_begin = (int)(kv_len[0] - a);
    out->kv_len = kv_len[0];
    out->page_begin = kv_indptr ? kv_indptr[0] : 0;
    out->merge_warps = chunking->merge_warps;
}

/* ---- grids ---- */

int cinfer__decode_attention_grid(const cinfer__decode_config_t *cfg, int num_ctas) {
    if (cfg->graph)
        return cfg->max_ctas;
    return num_ctas < cfg->max_ctas ? num_ctas : cfg->max_ctas;
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
