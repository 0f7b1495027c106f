"""BatchPrefillWithPagedKVCacheWrapper and BatchPrefillWithRaggedKVCacheWrapper against the
float64 reference: random batches with empty requests, qo_len > kv_len under causal, page sizes 1
and 16, GQA, NHD/HND, soft cap, window, sm_scale, LSE, re-plans that grow the C object, CUDA-graph
capture and replay after re-plans, custom masks (FlashInfer's flattened bool layout and
segment_packbits' packed one, fully masked rows, also under CUDA graphs), ALiBi, in-kernel RoPE,
errors."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
import reference  # noqa: E402

DEV = "cuda"
D = 128
WORKSPACE_BYTES = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def workspace():
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)


def lengths(batch, seed, max_qo=40, max_kv=300):
    """(qo_lens, kv_lens) with the edge cases first: an empty request, a request without KV,
    qo_len > kv_len, one query row, a long KV."""
    g = torch.Generator().manual_seed(seed)
    qo = torch.randint(1, max_qo, (batch,), generator=g).tolist()
    kv = [q + int(x) for q, x in zip(qo, torch.randint(0, max_kv, (batch,), generator=g))]
    special = [(0, 17), (5, 0), (30, 7), (1, 1000), (0, 0)]
    for i, (a, b) in enumerate(special[:batch]):
        qo[i * batch // len(special)], kv[i * batch // len(special)] = a, b
    return qo, kv


def indptr(lens, offset=0):
    out = [offset]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


class Paged:
    """A random paged cache holding kv_lens tokens per request, and its page table."""

    def __init__(self, kv_lens, page_size, hk, dtype, layout, combined, seed, spare=7):
        g = torch.Generator(DEV).manual_seed(seed)
        pages = [math.ceil(n / page_size) for n in kv_lens]
        self.max_pages = sum(pages) + spare
        inner = (page_size, hk, D) if layout == "NHD" else (hk, page_size, D)
        kv = torch.randn((self.max_pages, 2) + inner, generator=g, device=DEV).to(dtype)
        self.cache = kv if combined else (kv[:, 0], kv[:, 1])
        self.k, self.v = kv[:, 0], kv[:, 1]
        perm = torch.randperm(self.max_pages, generator=torch.Generator().manual_seed(seed))
        self.indices = perm[: sum(pages)].to(torch.int32)
        self.indptr = indptr(pages)
        self.last = torch.tensor([n - (p - 1) * page_size if p else 1
                                  for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        self.layout, self.kv_lens = layout, kv_lens

    def request(self, b):
        """k, v [kv_len, Hk, D] of request b."""
        pages = self.indices[self.indptr[b]:self.indptr[b + 1]].long().to(DEV)
        out = []
        for c in (self.k, self.v):
            g = c[pages]
            if self.layout == "HND":
                g = g.transpose(1, 2)
            out.append(g.reshape(-1, g.shape[-2], D)[: self.kv_lens[b]])
        return out


class Ragged:
    def __init__(self, kv_lens, hk, dtype, layout, seed):
        g = torch.Generator(DEV).manual_seed(seed)
        total = sum(kv_lens)
        kv = torch.randn(total, 2, hk, D, generator=g, device=DEV).to(dtype)  # packed K/V
        self.k, self.v = kv[:, 0], kv[:, 1]
        if layout == "HND":
            self.k, self.v = self.k.transpose(0, 1), self.v.transpose(0, 1)
        self.indptr = indptr(kv_lens)
        self.layout = layout

    def request(self, b):
        s, e = int(self.indptr[b]), int(self.indptr[b + 1])
        k, v = (self.k[s:e], self.v[s:e]) if self.layout == "NHD" else (
            self.k[:, s:e].transpose(0, 1), self.v[:, s:e].transpose(0, 1))
        return k, v


def reference_batch(q, qo_indptr, kv, batch, hq, masks=None, **kw):
    """Per-request float64 reference, concatenated: out [rows, Hq, D], lse [rows, Hq]. masks:
    each request's bool [qo_len, kv_len] custom mask."""
    rows = q.shape[0]
    out = torch.zeros(rows, hq, D, dtype=torch.float64, device=DEV)
    lse = torch.full((rows, hq), -math.inf, dtype=torch.float64, device=DEV)
    for b in range(batch):
        s, e = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if e == s:
            continue
        k, v = kv.request(b)
        mask = masks[b] if masks is not None else None
        o, l_ = reference.prefill(q[s:e], k, v, mask=mask, **kw)
        out[s:e], lse[s:e] = o, l_
    return out, lse


def check(out, lse, ref_out, ref_lse, dtype, rows=None):
    rows = slice(None) if rows is None else rows
    atol, rtol = reference.tolerance(dtype)
    assert not torch.isnan(out[rows]).any()
    torch.testing.assert_close(out[rows].double(), ref_out[rows], atol=atol, rtol=rtol)
    if lse is not None:
        assert not torch.isnan(lse[rows]).any()
        torch.testing.assert_close(lse[rows].double(), ref_lse[rows], atol=2e-3, rtol=1e-4)


CASES = [
    # storage, causal, layout, page_size, (hq, hk), dtype, batch
    ("paged", True, "NHD", 16, (32, 8), torch.float16, 12),
    ("paged", False, "HND", 1, (8, 1), torch.bfloat16, 7),
    ("ragged", True, "NHD", None, (16, 16), torch.bfloat16, 9),
    ("ragged", False, "HND", None, (32, 8), torch.float16, 5),
]


def make(storage, kv_lens, page_size, hk, dtype, layout, seed, combined=False):
    if storage == "paged":
        return Paged(kv_lens, page_size, hk, dtype, layout, combined, seed)
    return Ragged(kv_lens, hk, dtype, layout, seed)


def plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, **kw):
    if storage == "paged":
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size, q_data_type=dtype,
               **kw)
    else:
        w.plan(qo_indptr, kv.indptr, hq, hk, D, q_data_type=dtype, **kw)


def run(w, storage, q, kv, *args, **kw):
    if storage == "paged":
        return w.run(q, kv.cache, *args, **kw)
    return w.run(q, kv.k, kv.v, *args, **kw)


def wrapper(storage, workspace, layout, **kw):
    cls = (cinfer.BatchPrefillWithPagedKVCacheWrapper if storage == "paged"
           else cinfer.BatchPrefillWithRaggedKVCacheWrapper)
    return cls(workspace, layout, **kw)


@pytest.mark.parametrize("storage,causal,layout,page_size,heads,dtype,batch", CASES)
def test_batch_prefill(workspace, storage, causal, layout, page_size, heads, dtype, batch):
    hq, hk = heads
    qo_lens, kv_lens = lengths(batch, seed=batch)
    kv = make(storage, kv_lens, page_size, hk, dtype, layout, seed=batch,
              combined=page_size == 1)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, D, device=DEV).to(dtype)
    w = wrapper(storage, workspace, layout)
    plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, causal=causal)
    out, lse = run(w, storage, q, kv, return_lse=True)
    ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, causal=causal)
    check(out, lse, ref_out, ref_lse, dtype)
    if causal:  # rows before the KV starts (qo_len > kv_len) attend nothing
        assert torch.isneginf(lse[ref_lse.isneginf()]).all()
        assert (out[ref_lse.isneginf().any(dim=1)] == 0).all()
    # Another layer: same plan, new q and K/V; device indptr arrays are accepted too.
    plan(w, storage, qo_indptr.to(DEV), kv, hq, hk, page_size, dtype, causal=causal)
    kv2 = make(storage, kv_lens, page_size, hk, dtype, layout, seed=batch + 1)
    if storage == "paged":
        kv2.indptr, kv2.indices, kv2.last = kv.indptr, kv.indices, kv.last
    q2 = torch.randn_like(q)
    out2 = run(w, storage, q2, kv2)
    check(out2, None, *reference_batch(q2, qo_indptr, kv2, batch, hq, causal=causal), dtype)


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_batch_prefill_options_replan_and_buffers(workspace, storage):
    """Soft cap, window, sm_scale; re-plans that outgrow the C object (batch and rows); indptr
    starting past 0; out/lse buffers; run_return_lse; forward()."""
    hq, hk, dtype, page_size = 32, 8, torch.float16, 16
    kw = dict(causal=True, logits_soft_cap=30.0, window_left=50, sm_scale=0.1)
    w = wrapper(storage, workspace, "NHD")
    for step, (batch, max_qo) in enumerate([(3, 20), (40, 60), (6, 1500), (20, 10)]):
        qo_lens, kv_lens = lengths(batch, seed=50 + step, max_qo=max_qo)
        kv = make(storage, kv_lens, page_size, hk, dtype, "NHD", seed=step)
        qo_indptr = indptr(qo_lens, offset=step)  # rows before qo_indptr[0] are untouched
        q = (torch.randn(int(qo_indptr[-1]) + 3, hq, D, device=DEV) * 3).to(dtype)
        plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, **kw)
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device=DEV)
        args = (q, kv.cache) if storage == "paged" else (q, kv.k, kv.v)
        got_out, got_lse = w.run_return_lse(*args, out=out, lse=lse)
        assert got_out is out and got_lse is lse
        rows = slice(step, int(qo_indptr[-1]))
        ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, **kw)
        check(out, lse, ref_out, ref_lse, dtype, rows)
        assert torch.isnan(out[:step]).all() and torch.isnan(out[int(qo_indptr[-1]):]).all()
    assert torch.equal(w.forward(*args, causal=True, logits_soft_cap=30.0, window_left=50,
                                 sm_scale=0.1)[rows], out[rows])


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_batch_prefill_cuda_graph(storage):
    """Capture run() at the graph capacity, re-plan other lengths and smaller batches, replay;
    also steps of few rows over long KV, which graph mode splits (split-KV) inside the grids
    fixed at create, replayed through the same capture."""
    cap, hq, hk, dtype, page_size, max_rows = 8, 16, 4, torch.bfloat16, 16, 400
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)
    qo_buf = torch.empty(cap + 1, dtype=torch.int32, device=DEV)
    kv_buf = torch.empty(cap + 1, dtype=torch.int32, device=DEV)
    if storage == "paged":
        max_pages = 600
        idx_buf = torch.empty(max_pages, dtype=torch.int32, device=DEV)
        last_buf = torch.empty(cap, dtype=torch.int32, device=DEV)
        w = cinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf,
            paged_kv_indptr_buf=kv_buf, paged_kv_indices_buf=idx_buf,
            paged_kv_last_page_len_buf=last_buf, max_total_qo_tokens=max_rows)
        pool = Paged([max_pages * page_size - 7 * page_size], page_size, hk, dtype, "NHD",
                     True, seed=3)
    else:
        w = cinfer.BatchPrefillWithRaggedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, kv_indptr_buf=kv_buf,
            max_total_qo_tokens=max_rows)
        pool = Ragged([8000], hk, dtype, "NHD", seed=3)
    assert w.is_cuda_graph_enabled
    q = torch.randn(max_rows, hq, D, device=DEV).to(dtype)

    def step(batch, seed, lens=None):
        qo_lens, kv_lens = lens if lens is not None else lengths(batch, seed,
                                                                 max_qo=max_rows // cap)
        if storage == "paged":  # pages of the one pool, in a random order
            kv = Paged(kv_lens, page_size, hk, dtype, "NHD", True, seed)
            kv.cache, kv.k, kv.v = pool.cache, pool.k, pool.v
            perm = torch.randperm(pool.max_pages - 7,
                                  generator=torch.Generator().manual_seed(seed))
            kv.indices = perm[: kv.indices.numel()].to(torch.int32)
        else:  # views of the pool's rows
            kv = Ragged([], hk, dtype, "NHD", seed)
            kv.k, kv.v, kv.indptr = pool.k, pool.v, indptr(kv_lens)
        qo_indptr = indptr(qo_lens)
        plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, causal=True)
        return kv, qo_indptr

    kv, qo_indptr = step(cap, seed=10)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(w, storage, q, kv, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run(w, storage, q, kv, return_lse=True)
    long_kv = {5: ([40], [6000]), 6: ([1, 30], [3000, 4500]),
               8: ([64, 2, 17], [2500, 2000, 1200])}  # split-KV steps
    for i, batch in enumerate([cap, 3, 1, cap, 5, 1, 2, cap, 3, 4]):
        kv, qo_indptr = step(batch, seed=20 + i, lens=long_kv.get(i))
        q.copy_(torch.randn(max_rows, hq, D, device=DEV).to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        rows = slice(0, int(qo_indptr[-1]))
        ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, causal=True)
        check(out, lse, ref_out, ref_lse, dtype, rows)

    with pytest.raises(ValueError, match="capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            run(w, storage, q[: max_rows - 1], kv)
    with pytest.raises(ValueError, match="first plan"):
        plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, causal=False)
    with pytest.raises(ValueError, match="capacity"):
        step(cap + 1, seed=1)
    if storage == "ragged":  # the captured run reads the pool's 8000 K/V rows
        with pytest.raises(ValueError, match="exceed the 8000 rows of the k and v"):
            step(1, seed=2, lens=([1], [8001]))


def random_masks(qo_lens, kv_lens, seed):
    """Per request a random bool [qo_len, kv_len] mask (about half kept), its first row fully
    masked and its last fully kept; and FlashInfer's flattened layout of them (concatenated)."""
    gen = torch.Generator(DEV).manual_seed(seed)
    masks = []
    for qo, kv in zip(qo_lens, kv_lens):
        m = torch.rand(qo, kv, generator=gen, device=DEV) < 0.5
        if qo > 1:
            m[0] = False
            m[-1] = True
        masks.append(m)
    flat = (torch.cat([m.flatten() for m in masks]) if masks
            else torch.zeros(0, dtype=torch.bool, device=DEV))
    return masks, flat


def packed_masks(qo_lens, kv_lens, flat):
    """segment_packbits' packing of the flattened masks (what FlashInfer's plan does)."""
    bit_indptr = indptr([a * b for a, b in zip(qo_lens, kv_lens)]).to(DEV)
    packed, _ = cinfer.segment_packbits(flat, bit_indptr, bitorder="little")
    return packed


@pytest.mark.parametrize("storage,layout,page_size,heads,dtype,batch,window", [
    ("paged", "NHD", 16, (32, 8), torch.float16, 9, -1),
    ("paged", "HND", 1, (8, 2), torch.bfloat16, 5, 30),
    ("ragged", "NHD", None, (16, 4), torch.bfloat16, 7, -1),
    ("ragged", "HND", None, (8, 8), torch.float16, 5, 20),
])
def test_batch_prefill_custom_mask(workspace, storage, layout, page_size, heads, dtype, batch,
                                   window):
    hq, hk = heads
    qo_lens, kv_lens = lengths(batch, seed=batch + 100)
    kv = make(storage, kv_lens, page_size, hk, dtype, layout, seed=batch)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, D, device=DEV).to(dtype)
    masks, flat = random_masks(qo_lens, kv_lens, seed=batch)
    w = wrapper(storage, workspace, layout)
    # causal=True is ignored: the custom mask replaces the causal mask (FlashInfer's rule).
    plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, custom_mask=flat, causal=True,
         window_left=window)
    out, lse = run(w, storage, q, kv, return_lse=True)
    ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, masks=masks,
                                       window_left=window)
    check(out, lse, ref_out, ref_lse, dtype)
    empty = ref_lse.isneginf()  # fully masked rows (and rows of requests without KV)
    assert empty.any() and torch.isneginf(lse[empty]).all()
    assert (out[empty.all(dim=1)] == 0).all()
    # Packed with segment_packbits (each request from a byte of its own): bit-identical.
    plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, window_left=window,
         packed_custom_mask=packed_masks(qo_lens, kv_lens, flat))
    out_p, lse_p = run(w, storage, q, kv, return_lse=True)
    assert torch.equal(out_p, out) and torch.equal(lse_p, lse)


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_batch_prefill_custom_mask_is_causal_when_lower_triangular(workspace, storage):
    # FlashInfer's own example: tril(ones(qo_len, kv_len), kv_len - qo_len) per request is the
    # bottom-right aligned causal mask.
    hq, hk, dtype, page_size, batch = 16, 4, torch.float16, 16, 6
    qo_lens, kv_lens = lengths(batch, seed=7)
    kv = make(storage, kv_lens, page_size, hk, dtype, "NHD", seed=7)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, D, device=DEV).to(dtype)
    flat = torch.cat([torch.ones(a, b, dtype=torch.bool, device=DEV).tril(b - a).flatten()
                      for a, b in zip(qo_lens, kv_lens)])
    w = wrapper(storage, workspace, "NHD")
    plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, custom_mask=flat)
    out, lse = run(w, storage, q, kv, return_lse=True)
    check(out, lse, *reference_batch(q, qo_indptr, kv, batch, hq, causal=True), dtype)


@pytest.mark.parametrize("storage,heads", [("paged", (32, 8)), ("ragged", (12, 4))])
def test_batch_prefill_alibi(workspace, storage, heads):
    hq, hk = heads
    dtype, page_size, batch = torch.float16, 16, 8
    qo_lens, kv_lens = lengths(batch, seed=hq)
    kv = make(storage, kv_lens, page_size, hk, dtype, "NHD", seed=hq)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, D, device=DEV).to(dtype)
    w = wrapper(storage, workspace, "NHD")
    slopes = reference.alibi_slopes(hq, DEV)
    for causal in (True, False):
        plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, causal=causal,
             pos_encoding_mode="ALIBI")
        out, lse = run(w, storage, q, kv, return_lse=True)
        ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, causal=causal,
                                           alibi_slopes=slopes)
        check(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_batch_prefill_custom_mask_cuda_graph(storage):
    """Capture run() with a custom mask, re-plan other lengths and masks, replay: each plan
    copies its packed mask into custom_mask_buf, which the captured kernel reads."""
    cap, hq, hk, dtype, page_size, max_rows = 6, 16, 4, torch.bfloat16, 16, 300
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)
    qo_buf = torch.empty(cap + 1, dtype=torch.int32, device=DEV)
    kv_buf = torch.empty(cap + 1, dtype=torch.int32, device=DEV)
    # Room for any step below (at most 6 requests of 49 x 248 bits: 9.1 KiB packed).
    mask_buf = torch.empty(16384, dtype=torch.uint8, device=DEV)
    mask_indptr_buf = torch.empty(cap + 1, dtype=torch.int32, device=DEV)
    if storage == "paged":
        max_pages = 400
        w = cinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf,
            paged_kv_indptr_buf=kv_buf,
            paged_kv_indices_buf=torch.empty(max_pages, dtype=torch.int32, device=DEV),
            paged_kv_last_page_len_buf=torch.empty(cap, dtype=torch.int32, device=DEV),
            custom_mask_buf=mask_buf, mask_indptr_buf=mask_indptr_buf,
            max_total_qo_tokens=max_rows)
        pool = Paged([max_pages * page_size - 7 * page_size], page_size, hk, dtype, "NHD",
                     True, seed=4)
    else:
        w = cinfer.BatchPrefillWithRaggedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, kv_indptr_buf=kv_buf,
            custom_mask_buf=mask_buf, mask_indptr_buf=mask_indptr_buf,
            max_total_qo_tokens=max_rows)
        pool = Ragged([5000], hk, dtype, "NHD", seed=4)
    q = torch.randn(max_rows, hq, D, device=DEV).to(dtype)

    def step(batch, seed):
        qo_lens, kv_lens = lengths(batch, seed, max_qo=max_rows // cap, max_kv=200)
        if storage == "paged":
            kv = Paged(kv_lens, page_size, hk, dtype, "NHD", True, seed)
            kv.cache, kv.k, kv.v = pool.cache, pool.k, pool.v
            perm = torch.randperm(pool.max_pages - 7,
                                  generator=torch.Generator().manual_seed(seed))
            kv.indices = perm[: kv.indices.numel()].to(torch.int32)
        else:
            kv = Ragged([], hk, dtype, "NHD", seed)
            kv.k, kv.v, kv.indptr = pool.k, pool.v, indptr(kv_lens)
        qo_indptr = indptr(qo_lens)
        masks, flat = random_masks(qo_lens, kv_lens, seed)
        plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, custom_mask=flat)
        return kv, qo_indptr, masks

    kv, qo_indptr, masks = step(cap, seed=30)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(w, storage, q, kv, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run(w, storage, q, kv, return_lse=True)
    for i, batch in enumerate([cap, 2, cap, 4]):
        kv, qo_indptr, masks = step(batch, seed=40 + i)
        q.copy_(torch.randn(max_rows, hq, D, device=DEV).to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        rows = slice(0, int(qo_indptr[-1]))
        ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, masks=masks)
        check(out, lse, ref_out, ref_lse, dtype, rows)
    with pytest.raises(ValueError, match="custom_mask_buf"):
        qo_lens, kv_lens = [60], [2400]  # 18000 bytes packed, more than custom_mask_buf
        big = make(storage, kv_lens, page_size, hk, dtype, "NHD", seed=1)
        plan(w, storage, indptr(qo_lens), big, hq, hk, page_size, dtype,
             custom_mask=torch.ones(60 * 2400, dtype=torch.bool, device=DEV))
    # The rejected plan was refused before the C plan: a replay still runs the last step.
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    rows = slice(0, int(qo_indptr[-1]))
    ref_out, ref_lse = reference_batch(q, qo_indptr, kv, 4, hq, masks=masks)
    check(out, lse, ref_out, ref_lse, dtype, rows)


def test_batch_prefill_errors(workspace):
    hq, hk, page_size, dtype = 8, 2, 16, torch.float16
    kv = Paged([10, 40], page_size, hk, dtype, "NHD", False, seed=9)
    qo_indptr = indptr([4, 6])
    q = torch.randn(10, hq, D, device=DEV).to(dtype)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(workspace)
    with pytest.raises(ValueError, match="plan"):
        w.run(q, kv.cache)
    with pytest.raises(ValueError, match="kv_last_page_len"):  # the library's message
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last + page_size, hq, hk, D, page_size)
    with pytest.raises(ValueError, match="qo_indptr"):
        w.plan(torch.tensor([0, 5, 2], dtype=torch.int32), kv.indptr, kv.indices, kv.last, hq,
               hk, D, page_size)
    with pytest.raises(cinfer.UnsupportedError, match="head_dim"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, 72, page_size)
    with pytest.raises(ValueError, match="num_qo_heads|num_kv_heads"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, 6, 4, D, page_size)
    with pytest.raises(ValueError, match="custom_mask.*elements"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size,
               custom_mask=torch.ones(100, dtype=torch.bool, device=DEV))
    with pytest.raises(ValueError, match="packed_custom_mask.*bytes"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size,
               packed_custom_mask=torch.ones(10, dtype=torch.uint8, device=DEV))
    with pytest.raises(cinfer.UnsupportedError, match="ALIBI"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size,
               custom_mask=torch.ones(4 * 10 + 6 * 40, dtype=torch.bool, device=DEV),
               pos_encoding_mode="ALIBI")
    with pytest.raises(cinfer.UnsupportedError, match="logits_soft_cap"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size,
               pos_encoding_mode="ALIBI", logits_soft_cap=30.0)
    with pytest.raises(ValueError, match="rope_theta"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size,
               pos_encoding_mode="ROPE_LLAMA", rope_theta=-1.0)
    # Numbers of the wrong type (int() would cut a float head dim, take a string head count).
    with pytest.raises(TypeError, match="head_dim_qk: float, expected an int"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D + 0.5, page_size)
    with pytest.raises(TypeError, match="num_kv_heads: str"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, str(hk), D, page_size)
    with pytest.raises(TypeError, match="page_size: float"):
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, float(page_size))
    w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size)
    w.run(q, kv.cache)
    with pytest.raises(ValueError, match="q"):
        w.run(q.bfloat16(), kv.cache)  # the planned dtype is float16
    with pytest.raises(ValueError, match="q"):
        w.run(q[:5], kv.cache)  # fewer rows than qo_indptr[-1]
    with pytest.raises(ValueError, match="cpu"):
        w.run(q.cpu(), kv.cache)
    with pytest.raises(ValueError, match="variant"):  # default attention takes no arguments
        w.run(q, kv.cache, 1.0)
    small = torch.empty(256, dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match="float_workspace_buffer.*bytes"):
        cinfer.BatchPrefillWithPagedKVCacheWrapper(small).plan(
            qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size)


FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("storage,causal,layout,page_size", [
    ("paged", True, "NHD", 16), ("paged", False, "HND", 1), ("ragged", True, "NHD", None)])
def test_batch_prefill_fp8(workspace, kv_dtype, storage, causal, layout, page_size):
    """fp8 K/V (kv_data_type) with k_scale / v_scale given at plan (and again at a paged
    run)."""
    hq, hk, batch, dtype = 8, 2, 6, torch.bfloat16
    qo_lens, kv_lens = lengths(batch, seed=40 + batch)
    kv = make(storage, kv_lens, page_size, hk, kv_dtype, layout, seed=41,
              combined=page_size == 1)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, D, device=DEV).to(dtype)
    ks, vs = 0.6, 2.0
    w = wrapper(storage, workspace, layout)
    plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, kv_data_type=kv_dtype,
         causal=causal, k_scale=ks, v_scale=vs)
    # The paged run takes the scales again (FlashInfer's signature); the ragged run has none.
    scales = dict(k_scale=ks, v_scale=vs) if storage == "paged" else {}
    out, lse = run(w, storage, q, kv, return_lse=True, **scales)
    ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, causal=causal,
                                       sm_scale=ks / math.sqrt(D))
    atol, rtol = reference.tolerance(dtype)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), ref_out * vs, atol=atol * vs, rtol=rtol)
    keep = ~ref_lse.isneginf()
    torch.testing.assert_close(lse.double()[keep], ref_lse[keep], atol=4e-3, rtol=1e-4)
    assert torch.isneginf(lse[~keep]).all()


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_batch_prefill_rope(workspace, storage):
    """In-kernel RoPE per request: query row i at kv_len - qo_len + i (negative for the rows of a
    request with qo_len > kv_len), key j at j of the request's own KV. Paged with the default
    parameters, ragged HND with rope_scale 2 and rope_theta 5e5."""
    hq, hk, dtype, page_size, batch = 16, 4, torch.float16, 16, 8
    paged = storage == "paged"
    layout = "NHD" if paged else "HND"
    rope = (1.0, 1e4) if paged else (2.0, 5e5)
    kw = {} if paged else dict(rope_scale=2.0, rope_theta=5e5)
    qo_lens, kv_lens = lengths(batch, seed=61)
    kv = make(storage, kv_lens, page_size, hk, dtype, layout, seed=61)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, D, device=DEV).to(dtype)
    w = wrapper(storage, workspace, layout)
    plan(w, storage, qo_indptr, kv, hq, hk, page_size, dtype, causal=True,
         pos_encoding_mode="ROPE_LLAMA", **kw)
    out, lse = run(w, storage, q, kv, return_lse=True)
    ref_out, ref_lse = reference_batch(q, qo_indptr, kv, batch, hq, causal=True, rope=rope,
                                       rope_round=dtype)
    atol, rtol = reference.tolerance(dtype)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    # forward() with the planned parameters gives the same result; other ones are refused.
    args = (q, kv.cache) if paged else (q, kv.k, kv.v)
    assert torch.equal(w.forward(*args, causal=True, pos_encoding_mode="ROPE_LLAMA", **kw), out)
    with pytest.raises(ValueError, match="rope_scale"):
        w.forward(*args, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_scale=3.0,
                  rope_theta=rope[1])


@pytest.mark.parametrize("storage,layout", [("paged", "NHD"), ("paged", "HND"),
                                            ("ragged", "NHD"), ("ragged", "HND")])
def test_batch_prefill_head_dims_qk_vo(workspace, storage, layout):
    # D_qk 192 / D_vo 128 (DeepSeek's prefill heads): v and out of their own head dim, paged K
    # and V caches with different strides, and a long request that splits the KV.
    hq, hk, dqk, dvo, page_size = 8, 2, 192, 128, 16
    dtype = torch.bfloat16
    qo_lens, kv_lens = [5, 0, 30, 12], [300, 17, 20, 5000]
    g = torch.Generator(DEV).manual_seed(7)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, dqk, generator=g, device=DEV).to(dtype)
    per_request = [(torch.randn(n, hk, dqk, generator=g, device=DEV).to(dtype),
                    torch.randn(n, hk, dvo, generator=g, device=DEV).to(dtype)) for n in kv_lens]
    w = wrapper(storage, workspace, layout)
    if storage == "paged":
        pages = [math.ceil(n / page_size) for n in kv_lens]
        num_pages = sum(pages) + 3
        caches = []
        for d, which in ((dqk, 0), (dvo, 1)):
            c = torch.zeros(num_pages, page_size, hk, d, device=DEV, dtype=dtype)
            at = 0
            for (k, v), p in zip(per_request, pages):
                x = (k, v)[which]
                c.view(-1, hk, d)[at * page_size: at * page_size + x.shape[0]] = x
                at += p
            caches.append(c if layout == "NHD" else c.transpose(1, 2).contiguous())
        w.plan(qo_indptr, indptr(pages), torch.arange(sum(pages), dtype=torch.int32),
               torch.tensor([n - (p - 1) * page_size if p else 1 for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32),
               hq, hk, dqk, page_size, head_dim_vo=dvo, causal=True, q_data_type=dtype)
        out, lse = w.run(q, tuple(caches), return_lse=True)
        with pytest.raises(ValueError, match="separate caches"):
            w.run(q, torch.zeros(num_pages, 2, page_size, hk, dqk, device=DEV, dtype=dtype))
    else:
        k = torch.cat([k for k, _ in per_request])
        v = torch.cat([v for _, v in per_request])
        if layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        w.plan(qo_indptr, indptr(kv_lens), hq, hk, dqk, head_dim_vo=dvo, causal=True,
               q_data_type=dtype)
        out, lse = w.run(q, k, v, return_lse=True)
        with pytest.raises(ValueError, match="head_dim_vo"):
            w.run(q, k, k)
    assert out.shape == (q.shape[0], hq, dvo)
    atol, rtol = reference.tolerance(dtype)
    for b, ((k, v), s, e) in enumerate(zip(per_request, qo_indptr[:-1], qo_indptr[1:])):
        s, e = int(s), int(e)
        if e == s:
            continue
        ref_out, ref_lse = reference.prefill(q[s:e], k, v, causal=True)
        torch.testing.assert_close(out[s:e].double(), ref_out, atol=atol, rtol=rtol)
        torch.testing.assert_close(lse[s:e].double(), ref_lse, atol=2e-3, rtol=1e-4)
