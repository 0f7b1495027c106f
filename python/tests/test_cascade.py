"""MultiLevelCascadeAttentionWrapper: cascade attention over levels of a paged cache equals plain
attention over each request's concatenated KV (float64 reference), for decode and append steps,
two and three levels, empty unique parts; and equals the plain batch prefill wrapper."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
import reference  # noqa: E402

DEV = "cuda"
D = 128


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


class Pool:
    """A paged cache from which pages are handed out in a shuffled order."""

    def __init__(self, num_pages, page_size, hk, dtype, seed, layout="NHD"):
        g = torch.Generator(DEV).manual_seed(seed)
        inner = (page_size, hk, D) if layout == "NHD" else (hk, page_size, D)
        self.cache = torch.randn((num_pages, 2) + inner, generator=g, device=DEV).to(dtype)
        self.free = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.free = self.free.tolist()
        self.page_size = page_size
        self.layout = layout

    def take(self, tokens):
        n = math.ceil(tokens / self.page_size)
        pages, self.free = self.free[:n], self.free[n:]
        return pages, (tokens - (n - 1) * self.page_size) if n else 1

    def tokens(self, pages, length):
        """k, v [length, Hk, D] of a page list."""
        idx = torch.tensor(pages, dtype=torch.long, device=DEV)
        g = self.cache[idx]  # [n, 2, page, Hk, D]
        if self.layout == "HND":
            g = g.transpose(2, 3)  # [n, 2, Hk, page, D] -> [n, 2, page, Hk, D]
        k = g[:, 0].reshape(-1, g.shape[-2], D)[:length]
        v = g[:, 1].reshape(-1, g.shape[-2], D)[:length]
        return k, v


def table(groups):
    """(indptr, indices, last_page_len) of a list of (pages, last)."""
    indptr, indices, last = [0], [], []
    for pages, lp in groups:
        indices += pages
        indptr.append(len(indices))
        last.append(lp)
    return i32(indptr), i32(indices if indices else [0]), i32(last)


@pytest.mark.parametrize("levels,qo_per_request,prefix_pages_n,dtype,layout,page_size",
                         [(2, 1, 40, "f16", "NHD", 16), (2, 5, 40, "f16", "NHD", 16),
                          (3, 1, 40, "f16", "NHD", 16), (3, 4, 40, "f16", "NHD", 16),
                          (2, 1, 301, "f16", "NHD", 16), (3, 2, 200, "f16", "NHD", 16),
                          (2, 1, 60, "bf16", "HND", 16), (3, 3, 90, "bf16", "NHD", 8),
                          (2, 4, 25, "f16", "HND", 32)])
def test_cascade_equals_plain_attention(levels, qo_per_request, prefix_pages_n, dtype, layout,
                                        page_size):
    """Prefixes of 25 to 301 pages (up to 4816 tokens over a few query rows); fp16 and bf16, NHD
    and HND, pages of 8, 16 and 32 tokens."""
    hq, hk, batch = 32, 8, 6
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    prefix_len = prefix_pages_n * page_size  # whole pages, so the plain table can concatenate
    group_len = 3 * page_size  # level 1 of three levels: a prefix per pair of requests
    gen = torch.Generator().manual_seed(levels * 10 + qo_per_request)
    unique = [qo_per_request + int(x) for x in torch.randint(0, 90, (batch,), generator=gen)]
    if qo_per_request == 1:
        unique[2] = 0  # nothing of its own: its query is the prefix's last position
    pool = Pool(prefix_pages_n + 160 * 16 // page_size, page_size, hk, dtype, seed=levels,
                layout=layout)
    prefix_pages, prefix_last = pool.take(prefix_len)
    group = [pool.take(group_len) for _ in range(batch // 2)] if levels == 3 else []
    own = [pool.take(n) for n in unique]

    qo = [qo_per_request] * batch
    if qo_per_request > 1:
        qo[1] = 0  # a request without query rows this step
    qo_indptr = [0]
    for n in qo:
        qo_indptr.append(qo_indptr[-1] + n)
    rows = qo_indptr[-1]
    qo_arr = [i32([0, rows])]
    kv_tables = [table([(prefix_pages, prefix_last)])]
    if levels == 3:
        qo_arr.append(i32([qo_indptr[2 * g] for g in range(batch // 2)] + [rows]))
        kv_tables.append(table(group))
    qo_arr.append(i32(qo_indptr))
    kv_tables.append(table(own))

    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    w = cinfer.MultiLevelCascadeAttentionWrapper(levels, ws, layout)
    w.plan(qo_arr, [t[0] for t in kv_tables], [t[1] for t in kv_tables],
           [t[2] for t in kv_tables], hq, hk, D, page_size, causal=True, q_data_type=dtype)
    q = torch.randn(rows, hq, D, device=DEV).to(dtype)
    out, lse = w.run(q, pool.cache, return_lse=True)
    assert torch.equal(w.run(q, pool.cache), out)

    pk, pv = pool.tokens(prefix_pages, prefix_len)
    ref_out = torch.zeros(rows, hq, D, dtype=torch.float64, device=DEV)
    ref_lse = torch.zeros(rows, hq, dtype=torch.float64, device=DEV)
    plain_groups = []
    for b in range(batch):
        parts_k, parts_v, pages = [pk], [pv], list(prefix_pages)
        if levels == 3:
            gk, gv = pool.tokens(group[b // 2][0], group_len)
            parts_k.append(gk)
            parts_v.append(gv)
            pages += group[b // 2][0]
        ok, ov = pool.tokens(own[b][0], unique[b])
        k = torch.cat(parts_k + [ok])
        v = torch.cat(parts_v + [ov])
        pages += own[b][0]
        plain_groups.append((pages, own[b][1] if own[b][0] else page_size))
        s, e = qo_indptr[b], qo_indptr[b + 1]
        if e > s:
            ref_out[s:e], ref_lse[s:e] = reference.prefill(q[s:e], k, v, causal=True)
    atol, rtol = reference.tolerance(dtype)
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)

    # The same step as one plain batch prefill over the concatenated page tables.
    plain = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout)
    indptr, indices, last = table(plain_groups)
    plain.plan(i32(qo_indptr), indptr, indices, last, hq, hk, D, page_size, causal=True,
               q_data_type=dtype)
    torch.testing.assert_close(plain.run(q, pool.cache).double(), out.double(), atol=atol,
                               rtol=rtol)


def two_level_decode(pool, batch, prefix_pages, own_tokens):
    """A decode step (one query row per request) over a shared prefix and each request's own
    tokens: (the cascade's four per-level lists, the plain table of the concatenated pages)."""
    prefix_last = pool.page_size
    own = [pool.take(n) for n in own_tokens]
    own_table = table(own)
    levels = ([i32([0, batch]), i32(list(range(batch + 1)))],
              [i32([0, len(prefix_pages)]), own_table[0]],
              [i32(prefix_pages), own_table[1]],
              [i32([prefix_last]), own_table[2]])
    plain = table([(prefix_pages + pages, last if pages else pool.page_size)
                   for pages, last in own])
    return levels, plain


def plain_prefill(plain_table, batch, hq, hk, page_size, dtype):
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws)
    w.plan(i32(list(range(batch + 1))), *plain_table, hq, hk, D, page_size, causal=True,
           q_data_type=dtype)
    return w


def test_cascade_run_rebinds_its_arguments():
    """run() reuses its argument structs between calls: other q data of the same layout, a
    strided q, the cache as a (k, v) pair, return_lse either way, a second stream; every result
    equals the plain batch prefill over the concatenated pages."""
    hq, hk, page_size, dtype, batch = 32, 8, 16, torch.float16, 6
    pool = Pool(40 + 40, page_size, hk, dtype, seed=11)
    prefix_pages, _ = pool.take(40 * page_size)
    levels, plain_table = two_level_decode(pool, batch, prefix_pages, [17, 33, 0, 80, 5, 64])
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    w = cinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    with pytest.raises(ValueError, match="before plan"):
        w.run(torch.randn(batch, hq, D, device=DEV).to(dtype), pool.cache)
    w.plan(*levels, hq, hk, D, page_size, causal=True, q_data_type=dtype)
    plain = plain_prefill(plain_table, batch, hq, hk, page_size, dtype)
    atol, rtol = reference.tolerance(dtype)

    qs = [torch.randn(batch, hq, D, device=DEV).to(dtype) for _ in range(2)]
    wide = torch.randn(batch, 2 * hq, D, device=DEV).to(dtype)
    strided = wide[:, hq:]  # rows 2 * hq * D apart
    outs = [w.run(q, pool.cache) for q in qs]
    for q, out in zip(qs, outs):
        torch.testing.assert_close(out.double(), plain.run(q, pool.cache).double(), atol=atol,
                                   rtol=rtol)
    assert not torch.equal(outs[0], outs[1])
    out_s = w.run(strided, pool.cache)
    torch.testing.assert_close(out_s.double(), plain.run(strided.contiguous(), pool.cache).double(),
                               atol=atol, rtol=rtol)
    # The same inputs through the other forms give the same bits (the same launches).
    k_cache, v_cache = pool.cache[:, 0], pool.cache[:, 1]
    assert torch.equal(w.run(qs[0].clone(), (k_cache, v_cache)), outs[0])
    out1, lse1 = w.run(qs[1], pool.cache, return_lse=True)
    assert torch.equal(out1, outs[1])
    ref_out, ref_lse = plain.run(qs[1], pool.cache, return_lse=True)
    torch.testing.assert_close(lse1.double(), ref_lse.double(), atol=2e-3, rtol=1e-4)
    assert torch.equal(w.run(qs[0], pool.cache), outs[0])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out_side = w.run(qs[1], pool.cache)
        out_side0 = w.run(qs[0], pool.cache)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out_side, outs[1])
    assert torch.equal(out_side0, outs[0])

    with pytest.raises(ValueError, match="q"):
        w.run(qs[0].cpu(), pool.cache)
    with pytest.raises(ValueError):
        w.run(qs[0][:, :hq // 2], pool.cache)  # heads that contradict the plan (the library's)
    w.reset_workspace_buffer(ws)
    with pytest.raises(ValueError, match="before plan"):
        w.run(qs[0], pool.cache)


def graph_two_levels(ws_bytes, prefix_pages, batch, own_pages):
    """A two-level cascade wrapper in CUDA graph mode: level 0 one group over at most
    ``prefix_pages`` pages, level 1 at most ``batch`` groups over ``own_pages`` pages."""
    def bufs(n):
        return torch.zeros(n, dtype=torch.int32, device=DEV)

    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=DEV)
    return cinfer.MultiLevelCascadeAttentionWrapper(
        2, ws, "NHD", use_cuda_graph=True, qo_indptr_buf_arr=[bufs(2), bufs(batch + 1)],
        paged_kv_indptr_buf_arr=[bufs(2), bufs(batch + 1)],
        paged_kv_indices_buf_arr=[bufs(prefix_pages), bufs(own_pages)],
        paged_kv_last_page_len_buf_arr=[bufs(1), bufs(batch)])


def test_cascade_cuda_graph_replays_follow_later_plans():
    """A captured run replays the plan in force: after a new q and a plan with other own
    lengths, the replay equals an eager run of that plan (bit for bit) and the plain batch
    prefill."""
    hq, hk, page_size, dtype, batch = 32, 8, 16, torch.float16, 6
    pool = Pool(40 + 80, page_size, hk, dtype, seed=12)
    prefix_pages, _ = pool.take(40 * page_size)
    own_capacity = batch * 7  # pages: up to 112 own tokens per request
    w = graph_two_levels(64 << 20, len(prefix_pages), batch, own_capacity)
    q = torch.randn(batch, hq, D, device=DEV).to(dtype)
    atol, rtol = reference.tolerance(dtype)

    levels, plain_table = two_level_decode(pool, batch, prefix_pages, [100, 3, 64, 1, 77, 112])
    w.plan(*levels, hq, hk, D, page_size, causal=True, q_data_type=dtype)
    eager = w.run(q, pool.cache)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w.run(q, pool.cache)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)

    levels, plain_table = two_level_decode(pool, batch, prefix_pages, [5, 90, 0, 33, 16, 48])
    w.plan(*levels, hq, hk, D, page_size, causal=True, q_data_type=dtype)
    q.copy_(torch.randn(batch, hq, D, device=DEV).to(dtype))
    graph.replay()
    eager = w.run(q, pool.cache)
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    plain = plain_prefill(plain_table, batch, hq, hk, page_size, dtype)
    torch.testing.assert_close(out.double(), plain.run(q, pool.cache).double(), atol=atol,
                               rtol=rtol)


def test_cascade_cuda_graph_split_prefix_and_decode_level():
    """CUDA graph mode with the benchmark's shape of step (bench/cascade.py): a long shared
    prefix over every request's query row (batch prefill, split-KV inside the grids fixed at
    create) and each request's own tokens as batch decode (the kind the first plan fixed).
    One capture at the buffers' capacity, then plans with fewer requests, another prefix length
    and other own lengths, each replayed and compared with an eager run of that plan (bit for
    bit) and with plain batch prefill over the concatenated pages; a plan that gives the decode
    level a group of two rows is refused, naming the level."""
    hq, hk, page_size, dtype, cap = 32, 8, 16, torch.float16, 8
    pool = Pool(256 + 150 + cap * 7 * 3, page_size, hk, dtype, seed=13)
    prefixes = [pool.take(256 * page_size)[0], pool.take(150 * page_size)[0]]
    w = graph_two_levels(128 << 20, 256, cap, cap * 7)
    atol, rtol = reference.tolerance(dtype)
    q = torch.randn(cap, hq, D, device=DEV).to(dtype)

    levels, plain_table = two_level_decode(pool, cap, prefixes[0], [100, 3, 64, 1, 77, 112, 0, 9])
    w.plan(*levels, hq, hk, D, page_size, causal=True, q_data_type=dtype)
    assert w._graph_kinds == ["prefill", "decode"]
    eager = w.run(q, pool.cache)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w.run(q, pool.cache)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    plain = plain_prefill(plain_table, cap, hq, hk, page_size, dtype)
    torch.testing.assert_close(out.double(), plain.run(q, pool.cache).double(), atol=atol,
                               rtol=rtol)

    steps = [(3, prefixes[1], [40, 0, 111]), (cap, prefixes[0], [1, 2, 3, 4, 5, 6, 7, 8]),
             (1, prefixes[1], [50]), (5, prefixes[0], [16, 32, 48, 64, 80])]
    for batch, prefix, own in steps:
        levels, plain_table = two_level_decode(pool, batch, prefix, own)
        w.plan(*levels, hq, hk, D, page_size, causal=True, q_data_type=dtype)
        q.copy_(torch.randn(cap, hq, D, device=DEV).to(dtype))
        graph.replay()
        eager = w.run(q[:batch], pool.cache)
        torch.cuda.synchronize()
        assert torch.equal(out[:batch], eager), (batch, len(prefix))
        plain = plain_prefill(plain_table, batch, hq, hk, page_size, dtype)
        torch.testing.assert_close(out[:batch].double(),
                                   plain.run(q[:batch], pool.cache).double(), atol=atol,
                                   rtol=rtol)

    levels, _ = two_level_decode(pool, 2, prefixes[0], [5, 6])
    bad = [[levels[0][0], i32([0, 2])], [levels[1][0], i32([0, 1])],
           [levels[2][0], levels[2][1][:1]], [levels[3][0], i32([16])]]
    with pytest.raises(ValueError, match="level 1: qo_indptr.*batch decode"):
        w.plan(*bad, hq, hk, D, page_size, causal=True, q_data_type=dtype)
