"""BatchDecodeWithPagedKVCacheWrapper against a float64 reference: random batches, page sizes,
layouts, combined caches, fp8 KV, LSE, ALiBi (also under CUDA graph capture), in-kernel RoPE,
CUDA graph capture and replay, errors."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
import reference  # noqa: E402

DEV = "cuda"
WORKSPACE_BYTES = 128 * 1024 * 1024


@pytest.fixture(scope="module")
def workspace():
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)


def _cache(max_pages, page_size, hk, d, kv_dtype, layout, combined, gen):
    """A random paged cache: (k, v) or the combined [pages, 2, ...] tensor."""
    inner = (page_size, hk, d) if layout == "NHD" else (hk, page_size, d)
    kv = torch.randn((max_pages, 2) + inner, generator=gen, device=DEV).to(kv_dtype)
    return kv if combined else (kv[:, 0], kv[:, 1])


def _page_table(lens, page_size, max_pages, seed, offset=0):
    """indptr (starting at offset), indices (offset padding, then a random selection of pool
    pages), last_page_len, as CPU int32 tensors."""
    pages = [math.ceil(n / page_size) for n in lens]
    total = sum(pages)
    assert total <= max_pages
    perm = torch.randperm(max_pages, generator=torch.Generator().manual_seed(seed))[:total]
    indptr = [offset]
    for p in pages:
        indptr.append(indptr[-1] + p)
    last = [(n - (p - 1) * page_size) if p else 1 for n, p in zip(lens, pages)]
    indices = torch.cat([torch.zeros(offset, dtype=torch.int32), perm.to(torch.int32)])
    return (torch.tensor(indptr, dtype=torch.int32), indices,
            torch.tensor(last, dtype=torch.int32))


def _request_kv(cache, layout, indptr, indices, lens, b, page_size):
    """k, v [kv_len, Hk, D] (NHD) of request b, gathered from the pool."""
    k_cache, v_cache = (cache[:, 0], cache[:, 1]) if isinstance(cache, torch.Tensor) else cache
    pages = indices[indptr[b]:indptr[b + 1]].long().to(DEV)
    out = []
    for c in (k_cache, v_cache):
        g = c[pages]  # [pages, ...]
        if layout == "HND":
            g = g.transpose(1, 2)  # [pages, page_size, Hk, D]
        out.append(g.reshape(-1, g.shape[-2], g.shape[-1])[: lens[b]])
    return out


def _reference(q, cache, layout, indptr, indices, lens, page_size, **kw):
    outs, lses = [], []
    for b in range(len(lens)):
        k, v = _request_kv(cache, layout, indptr, indices, lens, b, page_size)
        o, s = reference.decode(q[b], k, v, **kw)
        outs.append(o)
        lses.append(s)
    if not outs:
        return (torch.zeros((0,) + tuple(q.shape[1:]), dtype=torch.float64, device=DEV),
                torch.zeros((0, q.shape[1]), dtype=torch.float64, device=DEV))
    return torch.stack(outs), torch.stack(lses)


def _check(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = reference.tolerance(dtype)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


def _lens(batch, page_size, seed, long_len=5000, max_len=700):
    """Random lengths with the edge cases: one long, empty, one token, page boundaries."""
    lens = torch.randint(1, max_len, (batch,),
                         generator=torch.Generator().manual_seed(seed)).tolist()
    specials = [long_len, 0, 1, page_size, page_size + 1][:batch]
    for i, n in enumerate(specials):
        lens[i * batch // len(specials)] = n  # distinct, spread-out positions
    return lens


CASES = [
    # batch, page_size, layout, (hq, hk), dtype, combined
    (1, 16, "NHD", (32, 8), torch.float16, False),
    (7, 16, "HND", (32, 8), torch.bfloat16, False),
    (33, 16, "NHD", (8, 1), torch.float16, True),
    (20, 1, "NHD", (32, 8), torch.bfloat16, False),
    (9, 1, "HND", (8, 1), torch.float16, True),
    (64, 16, "HND", (16, 16), torch.bfloat16, True),
]


@pytest.mark.parametrize("batch,page_size,layout,heads,dtype,combined", CASES)
def test_batch_decode(workspace, batch, page_size, layout, heads, dtype, combined):
    hq, hk = heads
    d = 128
    lens = _lens(batch, page_size, seed=batch * 31 + page_size)
    max_pages = sum(math.ceil(n / page_size) for n in lens) + 13
    gen = torch.Generator(DEV).manual_seed(batch)
    cache = _cache(max_pages, page_size, hk, d, dtype, layout, combined, gen)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=batch)
    q = torch.randn(batch, hq, d, generator=gen, device=DEV).to(dtype)

    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, layout)
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=dtype)
    out, lse = w.run(q, cache, return_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, hq) and lse.dtype == torch.float32
    ref_out, ref_lse = _reference(q, cache, layout, indptr, indices, lens, page_size)
    _check(out, lse, ref_out, ref_lse, dtype)
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all() and torch.isneginf(lse[b]).all()

    # The plan serves several "layers": another q and cache, same page table.
    q2 = torch.randn(batch, hq, d, generator=gen, device=DEV).to(dtype)
    cache2 = _cache(max_pages, page_size, hk, d, dtype, layout, combined, gen)
    out2 = w.run(q2, cache2)
    ref_out2, _ = _reference(q2, cache2, layout, indptr, indices, lens, page_size)
    atol, rtol = reference.tolerance(dtype)
    torch.testing.assert_close(out2.double(), ref_out2, atol=atol, rtol=rtol)


def test_batch_decode_options_and_buffers(workspace):
    """Soft cap, window, sm_scale, device page table with an indptr offset, out/lse buffers,
    run_return_lse, and re-planning with a larger batch (the C object grows)."""
    hq, hk, d, page_size, dtype = 32, 8, 128, 16, torch.float16
    gen = torch.Generator(DEV).manual_seed(5)
    max_pages = 4000
    cache = _cache(max_pages, page_size, hk, d, dtype, "NHD", False, gen)
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    kw = dict(logits_soft_cap=20.0, window_left=300, sm_scale=0.15)
    for step, batch in enumerate([3, 40, 0, 200, 5]):
        lens = _lens(batch, page_size, seed=step, max_len=200) if batch else []
        indptr, indices, last = _page_table(lens, page_size, max_pages, seed=step, offset=step)
        w.plan(indptr.to(DEV), indices.to(DEV), last.to(DEV), hq, hk, d, page_size,
               data_type=dtype, **kw)
        q = (torch.randn(batch, hq, d, generator=gen, device=DEV) * 4).to(dtype)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((batch, hq), float("nan"), device=DEV)
        got_out, got_lse = w.run_return_lse(q, cache, out=out, lse=lse)
        assert got_out is out and got_lse is lse
        ref_out, ref_lse = _reference(q, cache, "NHD", indptr, indices, lens, page_size, **kw)
        _check(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_decode_fp8(workspace, layout, kv_dtype):
    kv_dtype = getattr(torch, kv_dtype)
    hq, hk, d, page_size, batch = 32, 8, 128, 16, 12
    lens = _lens(batch, page_size, seed=3)
    max_pages = sum(math.ceil(n / page_size) for n in lens) + 5
    gen = torch.Generator(DEV).manual_seed(3)
    cache = _cache(max_pages, page_size, hk, d, kv_dtype, layout, False, gen)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=3)
    q = torch.randn(batch, hq, d, generator=gen, device=DEV).half()
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, layout)
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type="float16",
           kv_data_type=kv_dtype, k_scale=0.5, v_scale=2.0)
    out, lse = w.run(q, cache, k_scale=0.5, v_scale=2.0, return_lse=True)
    ref_out, ref_lse = _reference(q, cache, layout, indptr, indices, lens, page_size,
                                  k_scale=0.5, v_scale=2.0)
    _check(out, lse, ref_out, ref_lse, torch.float16)
    # None = the planned scales.
    assert torch.equal(w.run(q, cache), out)
    with pytest.raises(ValueError, match="k_scale"):
        w.run(q, cache, k_scale=0.25)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_decode_cuda_graph(layout):
    """Capture run() in a CUDA graph at full capacity, then re-plan other lengths and smaller
    batches into the same buffers and replay."""
    cap, hq, hk, d, page_size, dtype = 16, 16, 4, 128, 16, torch.bfloat16
    max_pages = 4000
    gen = torch.Generator(DEV).manual_seed(21)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)
    indptr_buf = torch.empty(cap + 1, dtype=torch.int32, device=DEV)
    indices_buf = torch.empty(max_pages, dtype=torch.int32, device=DEV)
    last_buf = torch.empty(cap, dtype=torch.int32, device=DEV)
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, layout, use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf)
    assert w.is_cuda_graph_enabled
    cache = _cache(max_pages, page_size, hk, d, dtype, layout, True, gen)
    q = torch.randn(cap, hq, d, generator=gen, device=DEV).to(dtype)

    lens = _lens(cap, page_size, seed=21)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=21)
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, as torch recommends
        w.run(q, cache, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = w.run(q, cache, return_lse=True)
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = _reference(q, cache, layout, indptr, indices, lens, page_size)
    _check(out, lse, ref_out, ref_lse, dtype)

    for step, batch in enumerate([cap, 5, 1, 16, 3]):
        lens = _lens(batch, page_size, seed=100 + step, long_len=20000 if step == 2 else 5000)
        indptr, indices, last = _page_table(lens, page_size, max_pages, seed=100 + step)
        q.copy_(torch.randn(cap, hq, d, generator=gen, device=DEV).to(dtype))
        w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=dtype)
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = _reference(q[:batch], cache, layout, indptr, indices, lens,
                                      page_size)
        _check(out[:batch], lse[:batch], ref_out, ref_lse, dtype)

    # Capturing a plan below capacity is refused: later plans could outgrow the captured q/out.
    lens = _lens(3, page_size, seed=5)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=5)
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=dtype)
    with pytest.raises(ValueError, match="capacity"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            w.run(q[:3], cache)

    with pytest.raises(ValueError, match="capacity"):
        lens = [5] * (cap + 1)
        indptr, indices, last = _page_table(lens, page_size, max_pages, seed=1)
        w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=dtype)
    # A plan that raises leaves no runnable plan.
    with pytest.raises(ValueError, match="before plan"):
        w.run(q, cache)
    # A run was captured: other options would need a new C object, which the graph would not
    # match, so the plan is refused.
    lens = _lens(cap, page_size, seed=7)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=7)
    with pytest.raises(ValueError, match="options .* must stay"):
        w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=dtype, sm_scale=0.05)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda_graph"])
@pytest.mark.parametrize("heads", [(32, 8), (12, 4)], ids=["h32_8", "h12_4"])
def test_batch_decode_alibi(heads, graph):
    hq, hk = heads
    d, page_size, cap, dtype, max_pages = 128, 16, 12, torch.float16, 2000
    gen = torch.Generator(DEV).manual_seed(hq)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)
    cache = _cache(max_pages, page_size, hk, d, dtype, "NHD", False, gen)
    slopes = reference.alibi_slopes(hq, DEV)
    bufs = {}
    if graph:
        bufs = dict(use_cuda_graph=True,
                    paged_kv_indptr_buffer=torch.empty(cap + 1, dtype=torch.int32, device=DEV),
                    paged_kv_indices_buffer=torch.empty(max_pages, dtype=torch.int32,
                                                        device=DEV),
                    paged_kv_last_page_len_buffer=torch.empty(cap, dtype=torch.int32,
                                                              device=DEV))
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", **bufs)
    q = torch.randn(cap, hq, d, generator=gen, device=DEV).to(dtype)
    lens = _lens(cap, page_size, seed=hq)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=hq)
    w.plan(indptr, indices, last, hq, hk, d, page_size, pos_encoding_mode="ALIBI",
           q_data_type=dtype)
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            w.run(q, cache, return_lse=True)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, lse = w.run(q, cache, return_lse=True)
        g.replay()
        torch.cuda.synchronize()
    else:
        out, lse = w.run(q, cache, return_lse=True)
    ref_out, ref_lse = _reference(q, cache, "NHD", indptr, indices, lens, page_size,
                                  alibi_slopes=slopes)
    _check(out, lse, ref_out, ref_lse, dtype)
    # Another step: other lengths, a smaller batch (replayed in graph mode).
    lens = _lens(5, page_size, seed=hq + 1, long_len=9000)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=hq + 1)
    w.plan(indptr, indices, last, hq, hk, d, page_size, pos_encoding_mode="ALIBI",
           q_data_type=dtype)
    if graph:
        g.replay()
        torch.cuda.synchronize()
    else:
        out, lse = w.run(q[:5], cache, return_lse=True)
    ref_out, ref_lse = _reference(q[:5], cache, "NHD", indptr, indices, lens, page_size,
                                  alibi_slopes=slopes)
    _check(out[:5], lse[:5], ref_out, ref_lse, dtype)
    with pytest.raises(TypeError, match="ALIBI"):
        w.run(q[:5], cache, None, hq)
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        w.forward(q[:5], cache)  # the planned mode is ALIBI


def test_batch_decode_errors(workspace):
    hq, hk, d, page_size = 8, 2, 128, 16
    lens = [10, 40]
    gen = torch.Generator(DEV).manual_seed(9)
    cache = _cache(8, page_size, hk, d, torch.float16, "NHD", False, gen)
    indptr, indices, last = _page_table(lens, page_size, 8, seed=9)
    q = torch.randn(2, hq, d, device=DEV).half()
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    with pytest.raises(ValueError, match="plan"):
        w.run(q, cache)
    with pytest.raises(ValueError, match="indptr.*int32"):
        w.plan(indptr.long(), indices, last, hq, hk, d, page_size)
    with pytest.raises(TypeError, match="last_page_len"):
        w.plan(indptr, indices, [1, 2], hq, hk, d, page_size)
    with pytest.raises(ValueError, match="indptr"):
        w.plan(indptr[:-1], indices, last, hq, hk, d, page_size)
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(indptr, indices, last + page_size, hq, hk, d, page_size)
    with pytest.raises(ValueError, match="rope_scale"):
        w.plan(indptr, indices, last, hq, hk, d, page_size, pos_encoding_mode="ROPE_LLAMA",
               rope_scale=-1.0)
    # Numbers of the wrong type: a float head dim would have been cut, a string converted.
    with pytest.raises(TypeError, match="head_dim: float, expected an int"):
        w.plan(indptr, indices, last, hq, hk, d + 0.5, page_size)
    with pytest.raises(TypeError, match="num_qo_heads: str"):
        w.plan(indptr, indices, last, str(hq), hk, d, page_size)
    with pytest.raises(TypeError, match="sm_scale: str"):
        w.plan(indptr, indices, last, hq, hk, d, page_size, sm_scale="0.1")
    with pytest.raises(TypeError, match="window_left: float"):
        w.plan(indptr, indices, last, hq, hk, d, page_size, window_left=10.0)
    with pytest.raises(cinfer.UnsupportedError, match="head_dim"):
        w.plan(indptr, indices, last, hq, hk, 72, page_size, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(cinfer.UnsupportedError, match="logits_soft_cap"):
        w.plan(indptr, indices, last, hq, hk, d, page_size, pos_encoding_mode="ALIBI",
               logits_soft_cap=30.0)
    with pytest.raises(cinfer.UnsupportedError, match="head_dim"):
        w.plan(indptr, indices, last, hq, hk, 100, page_size)
    with pytest.raises(ValueError, match="q_data_type"):
        w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type="float32")

    w.plan(indptr, indices, last, hq, hk, d, page_size)  # float16 by default
    w.run(q, cache)
    with pytest.raises(ValueError, match="q"):
        w.run(q.bfloat16(), cache)  # contradicts the planned q_data_type
    with pytest.raises(ValueError, match="q.*cpu"):
        w.run(q.cpu(), cache)
    with pytest.raises(ValueError, match="q"):
        w.run(q[:1], cache)  # batch differs from the plan
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(q, cache[0])  # a 4-D tensor alone
    with pytest.raises(ValueError, match="cpu"):
        w.run(q, (cache[0].cpu(), cache[1].cpu()))
    with pytest.raises(cinfer.UnsupportedError, match="q_scale"):
        w.run(q, cache, q_scale=2.0)
    # The deprecated forward() takes the attention options again; they must match the plan.
    expected = w.run(q, cache)
    assert torch.equal(w.forward(q, cache, sm_scale=1.0 / math.sqrt(d)), expected)
    assert torch.equal(w.forward_return_lse(q, cache)[0], expected)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        w.forward(q, cache, logits_soft_cap=5.0)

    small = torch.empty(1024, dtype=torch.uint8, device=DEV)
    w_small = cinfer.BatchDecodeWithPagedKVCacheWrapper(small, "NHD")
    with pytest.raises(ValueError, match="float_workspace_buffer.*bytes"):
        w_small.plan(indptr, indices, last, hq, hk, d, page_size)
    with pytest.raises(ValueError, match="float_workspace_buffer"):
        cinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.uint8), "NHD")
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer"):
        cinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=True)


@pytest.mark.parametrize("use_tensor_cores", [False, True], ids=["auto", "tensor_cores"])
def test_batch_decode_rope(workspace, use_tensor_cores):
    """In-kernel RoPE: each request's q at kv_len - 1, its keys at 0..kv_len - 1. With
    use_tensor_cores=True the CUDA-core kernel runs it (the only one that rotates)."""
    hq, hk, d, page_size, batch, dtype = 32, 8, 128, 16, 9, torch.float16
    layout = "HND" if use_tensor_cores else "NHD"
    rope = (0.5, 5e5) if use_tensor_cores else (1.0, 1e4)
    kw = dict(rope_scale=rope[0], rope_theta=rope[1]) if use_tensor_cores else {}
    lens = _lens(batch, page_size, seed=41)
    max_pages = sum(math.ceil(n / page_size) for n in lens) + 5
    gen = torch.Generator(DEV).manual_seed(41)
    cache = _cache(max_pages, page_size, hk, d, dtype, layout, False, gen)
    indptr, indices, last = _page_table(lens, page_size, max_pages, seed=41)
    q = (torch.randn(batch, hq, d, generator=gen, device=DEV) * 3).to(dtype)
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, layout,
                                                  use_tensor_cores=use_tensor_cores)
    w.plan(indptr, indices, last, hq, hk, d, page_size, pos_encoding_mode="ROPE_LLAMA",
           q_data_type=dtype, **kw)
    out, lse = w.run(q, cache, return_lse=True)
    ref_out, ref_lse = _reference(q, cache, layout, indptr, indices, lens, page_size, rope=rope)
    _check(out, lse, ref_out, ref_lse, dtype)
    # forward() repeats the planned RoPE parameters; others contradict the plan.
    assert torch.equal(w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA", **kw), out)
    with pytest.raises(ValueError, match="rope_theta"):
        w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA", rope_scale=rope[0],
                  rope_theta=2 * rope[1])
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        w.forward(q, cache)
