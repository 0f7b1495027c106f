"""BatchMLAPagedAttentionWrapper against a float64 reference written from the math: decode and
causal prefill chunks, page sizes 1 and 64, heads 16 / 128 / 8, LSE in base 2 and base e, CUDA
graph replay after a re-plan, errors."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402

DEV = "cuda"
CKV, KPE = 512, 64
SM_SCALE = 1.0 / math.sqrt(128 + 64)


@pytest.fixture(scope="module")
def workspace():
    return torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=DEV)


def make_batch(qo_lens, kv_lens, heads, page_size, dtype, seed):
    g = torch.Generator(DEV).manual_seed(seed)
    pages = [math.ceil(n / page_size) for n in kv_lens]
    num_pages = sum(pages) + 2
    ckv = torch.randn(num_pages, page_size, CKV, generator=g, device=DEV).to(dtype)
    kpe = torch.randn(num_pages, page_size, KPE, generator=g, device=DEV).to(dtype)
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    indices = perm[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()),
                             dtype=torch.int32)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0).tolist()),
                             dtype=torch.int32)
    rows = int(qo_indptr[-1])
    q_nope = torch.randn(rows, heads, CKV, generator=g, device=DEV).to(dtype)
    q_pe = torch.randn(rows, heads, KPE, generator=g, device=DEV).to(dtype)
    return dict(q_nope=q_nope, q_pe=q_pe, ckv=ckv, kpe=kpe, indices=indices,
                kv_indptr=kv_indptr, qo_indptr=qo_indptr,
                kv_len=torch.tensor(kv_lens, dtype=torch.int32))


def reference(b, causal):
    """out [rows, H, 512] and base-2 lse [rows, H] in float64, request by request."""
    rows, heads = b["q_nope"].shape[:2]
    out = torch.zeros(rows, heads, CKV, dtype=torch.float64, device=DEV)
    lse = torch.full((rows, heads), -math.inf, dtype=torch.float64, device=DEV)
    page_size = b["ckv"].shape[1]
    for r in range(len(b["kv_len"])):
        s, e = int(b["qo_indptr"][r]), int(b["qo_indptr"][r + 1])
        n = int(b["kv_len"][r])
        if e == s:
            continue
        pages = b["indices"][int(b["kv_indptr"][r]):int(b["kv_indptr"][r + 1])].long().to(DEV)
        ckv = b["ckv"][pages].reshape(-1, CKV)[:n].double()
        kpe = b["kpe"][pages].reshape(-1, KPE)[:n].double()
        logits = (torch.einsum("ihd,jd->hij", b["q_nope"][s:e].double(), ckv)
                  + torch.einsum("ihd,jd->hij", b["q_pe"][s:e].double(), kpe)) * SM_SCALE
        if causal:
            pos = torch.arange(e - s, device=DEV)[:, None] + (n - (e - s))
            keep = torch.arange(n, device=DEV)[None, :] <= pos
            logits = logits.masked_fill(~keep[None], -math.inf)
        l_ = torch.logsumexp(logits, dim=2)  # [H, qo]
        p = torch.exp(logits - torch.where(torch.isinf(l_), torch.zeros_like(l_), l_)[..., None])
        out[s:e] = torch.einsum("hij,jd->ihd", p, ckv)
        lse[s:e] = (l_ / math.log(2.0)).transpose(0, 1)
    return out, lse


def check(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = (2e-2, 2e-2) if dtype == torch.bfloat16 else (4e-3, 4e-3)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


def plan(w, b, heads, page_size, causal, dtype):
    w.plan(b["qo_indptr"], b["kv_indptr"], b["indices"], b["kv_len"], heads, CKV, KPE,
           page_size, causal, SM_SCALE, dtype, dtype)


@pytest.mark.parametrize("heads,page_size,dtype,qo_lens,kv_lens,causal", [
    (16, 1, torch.bfloat16, [1] * 6, [700, 1, 0, 64, 2000, 33], False),
    (128, 64, torch.float16, [1, 1, 1], [300, 5000, 65], False),
    (8, 16, torch.bfloat16, [20, 1, 0, 7], [300, 40, 10, 3], True),
    (16, 64, torch.float16, [1], [30000], True),  # one long request: split-KV
])
def test_mla(workspace, heads, page_size, dtype, qo_lens, kv_lens, causal):
    b = make_batch(qo_lens, kv_lens, heads, page_size, dtype, seed=heads + page_size)
    w = cinfer.BatchMLAPagedAttentionWrapper(workspace)
    plan(w, b, heads, page_size, causal, dtype)
    out, lse = w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"], return_lse=True)
    assert out.shape == b["q_nope"].shape and lse.shape == out.shape[:2]
    check(out, lse, *reference(b, causal), dtype)
    # FlashInfer's base-e option sets the LSE's base; return_lse alone decides the return.
    _, lse_e = w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"], return_lse=True,
                     return_lse_base_on_e=True)
    torch.testing.assert_close(lse_e, lse * math.log(2.0))
    only_out = w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"], return_lse_base_on_e=True)
    assert isinstance(only_out, torch.Tensor)
    given = torch.empty_like(lse)
    w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"], lse=given, return_lse_base_on_e=True)
    torch.testing.assert_close(given, lse_e)


def test_mla_cuda_graph_replays_after_replan(workspace):
    heads, page_size, dtype = 16, 16, torch.bfloat16
    first = make_batch([1] * 4, [100, 2000, 7, 0], heads, page_size, dtype, seed=1)
    second = make_batch([1] * 2, [6000, 40], heads, page_size, dtype, seed=2)
    w = cinfer.BatchMLAPagedAttentionWrapper(workspace, use_cuda_graph=True,
                                             qo_indptr=torch.zeros(5, dtype=torch.int32,
                                                                   device=DEV))
    plan(w, first, heads, page_size, False, dtype)
    # Static buffers large enough for both steps.
    q_nope = torch.zeros(4, heads, CKV, dtype=dtype, device=DEV)
    q_pe = torch.zeros(4, heads, KPE, dtype=dtype, device=DEV)
    pages = max(first["ckv"].shape[0], second["ckv"].shape[0])
    ckv = torch.zeros(pages, page_size, CKV, dtype=dtype, device=DEV)
    kpe = torch.zeros(pages, page_size, KPE, dtype=dtype, device=DEV)
    out = torch.zeros(4, heads, CKV, dtype=dtype, device=DEV)
    lse = torch.zeros(4, heads, dtype=torch.float32, device=DEV)

    def load(b):
        n = b["q_nope"].shape[0]
        q_nope[:n].copy_(b["q_nope"])
        q_pe[:n].copy_(b["q_pe"])
        ckv[: b["ckv"].shape[0]].copy_(b["ckv"])
        kpe[: b["kpe"].shape[0]].copy_(b["kpe"])
        return n

    load(first)
    w.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)
    for b in (first, second):
        plan(w, b, heads, page_size, False, dtype)
        n = load(b)
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = reference(b, False)
        check(out[:n], lse[:n], ref_out, ref_lse, dtype)
    # Capturing with fewer rows than the capacity is refused (a later plan could address rows
    # past the captured tensors), and so is a plan whose rows end past the capacity even when
    # they are fewer (q and out rows are absolute).
    with pytest.raises(ValueError, match="below the 4 query rows"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            w.run(q_nope[:2], q_pe[:2], ckv, kpe)
    shifted = dict(second, qo_indptr=second["qo_indptr"] + 3)
    with pytest.raises(ValueError, match="qo_indptr.-1. = 5 query rows exceed"):
        plan(w, shifted, heads, page_size, False, dtype)


def test_mla_cuda_graph_plan_past_the_index_buffer_keeps_the_old_plan(workspace):
    # A plan rejected for its page count leaves the captured graph on the previous schedule
    # (the C plan is not replaced), so a replay still reads only the indices it was given.
    heads, page_size, dtype = 16, 16, torch.bfloat16
    first = make_batch([1] * 4, [100, 2000, 7, 0], heads, page_size, dtype, seed=4)
    big = make_batch([1] * 2, [6000, 40], heads, page_size, dtype, seed=5)
    w = cinfer.BatchMLAPagedAttentionWrapper(
        workspace, use_cuda_graph=True, qo_indptr=torch.zeros(5, dtype=torch.int32, device=DEV),
        kv_indices=torch.zeros(200, dtype=torch.int32, device=DEV))
    plan(w, first, heads, page_size, False, dtype)
    out = torch.zeros(4, heads, CKV, dtype=dtype, device=DEV)
    lse = torch.zeros(4, heads, dtype=torch.float32, device=DEV)
    w.run(first["q_nope"], first["q_pe"], first["ckv"], first["kpe"], out=out, lse=lse)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(first["q_nope"], first["q_pe"], first["ckv"], first["kpe"], out=out, lse=lse)
    with pytest.raises(ValueError, match="do not fit the CUDA graph mode's page-index buffer"):
        plan(w, big, heads, page_size, False, dtype)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(first, False)
    check(out, lse, ref_out, ref_lse, dtype)


def test_mla_errors(workspace):
    b = make_batch([1, 1], [10, 20], 16, 16, torch.bfloat16, seed=3)
    with pytest.raises(TypeError, match="float_workspace_buffer: expected a torch.Tensor"):
        cinfer.BatchMLAPagedAttentionWrapper(5)
    with pytest.raises(ValueError, match="backend = 'flash'"):
        cinfer.BatchMLAPagedAttentionWrapper(workspace, backend="flash")
    with pytest.raises(ValueError, match="float_workspace_buffer: tensor on cpu"):
        cinfer.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8))
    for backend in ("auto", "fa2", "fa3", "cutlass"):
        cinfer.BatchMLAPagedAttentionWrapper(workspace, backend=backend)
    w = cinfer.BatchMLAPagedAttentionWrapper(workspace)
    with pytest.raises(ValueError, match="plan"):
        w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"])
    args = (b["qo_indptr"], b["kv_indptr"], b["indices"], b["kv_len"])
    with pytest.raises(cinfer.UnsupportedError, match="num_heads = 12"):
        w.plan(*args, 12, CKV, KPE, 16, False, SM_SCALE, torch.bfloat16, torch.bfloat16)
    with pytest.raises(cinfer.UnsupportedError, match="head_dim_ckv"):
        w.plan(*args, 16, 256, KPE, 16, False, SM_SCALE, torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="kv_len_arr"):
        w.plan(b["qo_indptr"], b["kv_indptr"], b["indices"], b["kv_len"] + 40, 16, CKV, KPE,
               16, False, SM_SCALE, torch.bfloat16, torch.bfloat16)
    with pytest.raises(TypeError, match="num_heads: float, expected an int"):
        w.plan(*args, 16.0, CKV, KPE, 16, False, SM_SCALE, torch.bfloat16, torch.bfloat16)
    with pytest.raises(TypeError, match="sm_scale: str"):
        w.plan(*args, 16, CKV, KPE, 16, False, str(SM_SCALE), torch.bfloat16, torch.bfloat16)
    with pytest.raises(cinfer.UnsupportedError, match="use_profiler"):
        w.plan(*args, 16, CKV, KPE, 16, False, SM_SCALE, torch.bfloat16, torch.bfloat16,
               use_profiler=True)
    w.plan(*args, 16, CKV, KPE, 16, False, SM_SCALE, torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="q_pe"):
        w.run(b["q_nope"], b["q_pe"][:, :, :32], b["ckv"], b["kpe"])
    with pytest.raises(cinfer.UnsupportedError, match="page_table"):
        w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"], page_table=b["indices"])
    out = w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"])
    ref_out, _ = reference(b, False)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
