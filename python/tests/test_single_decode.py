"""single_decode_with_kv_cache against a float64 reference (ALiBi with FlashInfer's default
slopes and in-kernel RoPE included)."""

import math
import threading

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
import reference  # noqa: E402

DEV = "cuda"


def _make(kv_len, hq, hk, d, dtype, kv_dtype, layout, seed, q_mul=1.0):
    gen = torch.Generator(DEV).manual_seed(seed)
    q = (torch.randn(hq, d, generator=gen, device=DEV) * q_mul).to(dtype)
    # K and V as two halves of one packed tensor: strided, with equal strides, as in a KV cache.
    kv = torch.randn(kv_len, 2, hk, d, generator=gen, device=DEV).to(kv_dtype)
    k, v = kv[:, 0], kv[:, 1]
    if layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # [Hk, kv_len, D] views
    return q, k, v


def _nhd(t, layout):
    return t if layout == "NHD" else t.transpose(0, 1)


def _check(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = reference.tolerance(dtype)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("kv_len", [0, 1, 1000, 20000])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["gqa32_8", "gqa8_1"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_single_decode(dtype, layout, heads, kv_len):
    hq, hk = heads
    d = 128
    q, k, v = _make(kv_len, hq, hk, d, dtype, dtype, layout, seed=kv_len + hq)
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True)
    ref_out, ref_lse = reference.decode(q, _nhd(k, layout), _nhd(v, layout))
    _check(out, lse, ref_out, ref_lse, dtype)
    if kv_len == 0:
        assert (out == 0).all() and torch.isneginf(lse).all()
    # Without return_lse: the output alone, identical.
    out2 = cinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout)
    assert torch.equal(out2, out)


@pytest.mark.parametrize("d", [64, 256])
def test_single_decode_head_dims(d):
    q, k, v = _make(3000, 16, 4, d, torch.bfloat16, torch.bfloat16, "NHD", seed=d)
    out = cinfer.single_decode_with_kv_cache(q, k, v)
    ref_out, _ = reference.decode(q, k, v)
    atol, rtol = reference.tolerance(torch.bfloat16)
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)


@pytest.mark.parametrize("kv_len", [1, 1000, 20000])
def test_single_decode_soft_cap_and_sm_scale(kv_len):
    # Large logits so the cap changes the result.
    q, k, v = _make(kv_len, 32, 8, 128, torch.float16, torch.float16, "NHD", seed=7, q_mul=8.0)
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, logits_soft_cap=30.0, sm_scale=0.2,
                                                  return_lse=True)
    ref_out, ref_lse = reference.decode(q, k, v, logits_soft_cap=30.0, sm_scale=0.2)
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.parametrize("window_left", [0, 1, 100, 5000])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode_window(layout, window_left):
    q, k, v = _make(1000, 8, 1, 128, torch.bfloat16, torch.bfloat16, layout, seed=11)
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout,
                                                  window_left=window_left, return_lse=True)
    ref_out, ref_lse = reference.decode(q, _nhd(k, layout), _nhd(v, layout),
                                        window_left=window_left)
    _check(out, lse, ref_out, ref_lse, torch.bfloat16)


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_single_decode_fp8(kv_dtype):
    kv_dtype = getattr(torch, kv_dtype)
    q, k, v = _make(2000, 32, 8, 128, torch.float16, kv_dtype, "NHD", seed=13)
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, k_scale=0.5, v_scale=2.0,
                                                  return_lse=True)
    ref_out, ref_lse = reference.decode(q, k, v, k_scale=0.5, v_scale=2.0)
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.parametrize("kv_len", [0, 1, 700, 20000])
@pytest.mark.parametrize("heads", [(32, 8), (12, 4), (8, 1)], ids=["h32_8", "h12_4", "h8_1"])
def test_single_decode_alibi(heads, kv_len):
    # 12 heads are not a power of two: the paper's interleaved slopes for heads 8..11.
    hq, hk = heads
    layout = "HND" if hk == 4 else "NHD"
    q, k, v = _make(kv_len, hq, hk, 128, torch.float16, torch.float16, layout, seed=hq + kv_len)
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout,
                                                  pos_encoding_mode="ALIBI", return_lse=True)
    ref_out, ref_lse = reference.decode(q, _nhd(k, layout), _nhd(v, layout),
                                        alibi_slopes=reference.alibi_slopes(hq, DEV))
    _check(out, lse, ref_out, ref_lse, torch.float16)
    # With a window: the bias and the window's mask together.
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout, window_left=50,
                                                  pos_encoding_mode="ALIBI", return_lse=True)
    ref_out, ref_lse = reference.decode(q, _nhd(k, layout), _nhd(v, layout), window_left=50,
                                        alibi_slopes=reference.alibi_slopes(hq, DEV))
    _check(out, lse, ref_out, ref_lse, torch.float16)


def test_single_decode_reuses_checked_layouts(monkeypatch):
    """Calls that repeat an earlier call's layout (the path that reuses its checked structs and
    workspace size with the data pointers updated): other data, with and without the LSE,
    another soft cap, a call that must still fail, and the same layout on another thread."""
    f = cinfer.single_decode_with_kv_cache
    q, k, v = _make(3000, 32, 8, 128, torch.bfloat16, torch.bfloat16, "NHD", seed=3)
    first, first_lse = f(q, k, v, return_lse=True)
    for seed in range(3):
        q2, k2, v2 = _make(3000, 32, 8, 128, torch.bfloat16, torch.bfloat16, "NHD",
                           seed=20 + seed)
        out, lse = f(q2, k2, v2, return_lse=True)
        _check(out, lse, *reference.decode(q2, k2, v2), torch.bfloat16)
        assert torch.equal(f(q2, k2, v2), out)
    again, again_lse = f(q, k, v, return_lse=True)
    assert torch.equal(again, first) and torch.equal(again_lse, first_lse)
    out, lse = f(q, k, v, logits_soft_cap=5.0, return_lse=True)
    _check(out, lse, *reference.decode(q, k, v, logits_soft_cap=5.0), torch.bfloat16)
    with pytest.raises(ValueError, match="v: dtype"):
        f(q, k, v.float())
    # A repeated layout builds no DLTensor: it rebinds the structs of the call that checked it.
    built = []
    to_dl = cinfer._tensor.to_dl
    monkeypatch.setattr(cinfer._tensor, "to_dl",
                        lambda *a, **kw: built.append(1) or to_dl(*a, **kw))
    f(q2, k2, v2)
    assert built == []
    monkeypatch.undo()
    result = []
    worker = threading.Thread(target=lambda: result.append(f(q2, k2, v2)))
    worker.start()
    worker.join()
    assert torch.equal(result[0], f(q2, k2, v2))


@pytest.mark.parametrize("variant", [None, "sinks"])
def test_single_decode_in_cuda_graph(variant):
    """A call captured in a CUDA graph (split-KV: 5000 tokens, so the merge kernel is captured
    too) replays over new contents of the same tensors."""
    f = cinfer.single_decode_with_kv_cache
    hq, hk, d, n, dtype = 32, 8, 128, 5000, torch.bfloat16
    q, k, v = _make(n, hq, hk, d, dtype, dtype, "NHD", seed=31)
    kw = {}
    if variant is not None:
        sinks = torch.randn(hq, generator=torch.Generator(DEV).manual_seed(5), device=DEV)
        kw = dict(variant=variant, variant_args=[sinks])
    f(q, k, v, return_lse=True, **kw)  # loads the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = f(q, k, v, return_lse=True, **kw)
    for seed in (32, 33):
        q2, k2, v2 = _make(n, hq, hk, d, dtype, dtype, "NHD", seed=seed)
        q.copy_(q2)
        k.copy_(k2)
        v.copy_(v2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference.decode(q, k, v, sinks=kw["variant_args"][0] if kw else None)
        _check(out, lse, *ref, dtype)
    if variant is None:  # an empty KV, captured too: zeros and -inf
        q0, k0, v0 = _make(0, hq, hk, d, dtype, dtype, "NHD", seed=34)
        f(q0, k0, v0)
        torch.cuda.synchronize()
        empty = torch.cuda.CUDAGraph()
        with torch.cuda.graph(empty):
            out0, lse0 = f(q0, k0, v0, return_lse=True)
        out0.fill_(float("nan"))
        empty.replay()
        torch.cuda.synchronize()
        assert (out0 == 0).all() and torch.isneginf(lse0).all()


def test_single_decode_errors():
    q, k, v = _make(10, 8, 2, 128, torch.float16, torch.float16, "NHD", seed=17)
    with pytest.raises(TypeError, match="k"):
        cinfer.single_decode_with_kv_cache(q, "k", v)
    with pytest.raises(ValueError, match="q.*float32"):
        cinfer.single_decode_with_kv_cache(q.float(), k, v)
    with pytest.raises(ValueError, match="v"):
        cinfer.single_decode_with_kv_cache(q, k, v.bfloat16())
    with pytest.raises(ValueError, match="q.*cpu"):
        cinfer.single_decode_with_kv_cache(q.cpu(), k, v)
    with pytest.raises(ValueError, match="k.*cpu"):
        cinfer.single_decode_with_kv_cache(q, k.cpu(), v)
    with pytest.raises(ValueError, match="kv_layout"):
        cinfer.single_decode_with_kv_cache(q, k, v, kv_layout="NDH")
    with pytest.raises(ValueError, match="rope_theta"):
        cinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA",
                                           rope_theta=0.0)
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        cinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="alibi")
    with pytest.raises(cinfer.UnsupportedError, match="logits_soft_cap"):
        cinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI",
                                           logits_soft_cap=30.0)
    with pytest.raises(cinfer.UnsupportedError, match="variant"):
        cinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI", variant="alibi")
    with pytest.raises(TypeError, match="ALIBI"):
        cinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI",
                                           variant_args=(None, 8))
    with pytest.raises(cinfer.UnsupportedError, match="q_scale"):
        cinfer.single_decode_with_kv_cache(q, k, v, q_scale=0.5)
    with pytest.raises(ValueError, match="sm_scale"):
        cinfer.single_decode_with_kv_cache(q, k, v, sm_scale=-1.0)
    # Heads that do not divide: the library's check, as ValueError.
    q3 = torch.randn(9, 128, device=DEV).half()
    with pytest.raises(ValueError, match="num_qo_heads"):
        cinfer.single_decode_with_kv_cache(q3, k, v)
    # A head dim the kernels do not implement: UnsupportedError naming head_dim.
    q100, k100, v100 = _make(10, 8, 2, 100, torch.float16, torch.float16, "NHD", seed=19)
    with pytest.raises(cinfer.UnsupportedError, match="head_dim"):
        cinfer.single_decode_with_kv_cache(q100, k100, v100)
    # RoPE needs a head dim that is a multiple of 16 (72 runs without it).
    q72, k72, v72 = _make(10, 8, 2, 72, torch.float16, torch.float16, "NHD", seed=23)
    cinfer.single_decode_with_kv_cache(q72, k72, v72)
    with pytest.raises(cinfer.UnsupportedError, match="head_dim"):
        cinfer.single_decode_with_kv_cache(q72, k72, v72, pos_encoding_mode="ROPE_LLAMA")
    assert math.isfinite(cinfer.single_decode_with_kv_cache(q, k, v).float().sum().item())


@pytest.mark.parametrize("dtype,layout,kv_len,rope", [
    (torch.float16, "NHD", 1000, None),
    (torch.bfloat16, "HND", 5000, (2.0, 5e5)),
], ids=["f16_nhd_defaults", "bf16_hnd_scale2_theta5e5"])
def test_single_decode_rope(dtype, layout, kv_len, rope):
    # q scaled so that the attention is peaked: rotating or not then changes the output by O(1).
    q, k, v = _make(kv_len, 32, 8, 128, dtype, dtype, layout, seed=kv_len, q_mul=3.0)
    kw = {} if rope is None else dict(rope_scale=rope[0], rope_theta=rope[1])
    # use_tensor_cores is ignored by single decode; the CUDA-core kernel rotates.
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout,
                                                  pos_encoding_mode="ROPE_LLAMA",
                                                  use_tensor_cores=True, return_lse=True, **kw)
    ref_out, ref_lse = reference.decode(q, _nhd(k, layout), _nhd(v, layout),
                                        rope=rope or (1.0, 1e4))
    _check(out, lse, ref_out, ref_lse, dtype)
    atol, rtol = reference.tolerance(dtype)
    plain = cinfer.single_decode_with_kv_cache(q, k, v, kv_layout=layout)
    assert not torch.allclose(plain.double(), ref_out, atol=atol, rtol=rtol)
