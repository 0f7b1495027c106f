"""single_prefill_with_kv_cache (and _return_lse) against a float64 reference: causal and not,
qo_len above and below kv_len, empty sides, GQA, head dims (D_qk != D_vo too), NHD/HND, packed QKV strides, soft
cap, sliding window, sm_scale, custom masks (bool and packed, fully masked rows, bottom-right
alignment), ALiBi with FlashInfer's default slopes, fp8 K/V with k_scale / v_scale, in-kernel
RoPE, errors."""

import math
import random
import threading

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
import reference  # noqa: E402

DEV = "cuda"


def _make(qo_len, kv_len, hq, hk, d, dtype, layout, seed, q_mul=1.0):
    """q [qo_len, Hq, D]; k, v in `layout`, slices of one packed [kv_len, 2, Hk, D] tensor."""
    gen = torch.Generator(DEV).manual_seed(seed)
    q = (torch.randn(qo_len, hq, d, generator=gen, device=DEV) * q_mul).to(dtype)
    kv = torch.randn(kv_len, 2, hk, d, generator=gen, device=DEV).to(dtype)
    k, v = kv[:, 0], kv[:, 1]
    if layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    return q, k, v


def _nhd(t, layout):
    return t if layout == "NHD" else t.transpose(0, 1)


def _check(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = reference.tolerance(dtype)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [(1, 1), (17, 17), (128, 1000), (333, 200), (1, 2047),
                                  (1000, 1000)], ids=lambda x: f"qo{x[0]}_kv{x[1]}")
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_single_prefill(dtype, layout, lens, causal):
    qo_len, kv_len = lens
    q, k, v = _make(qo_len, kv_len, 32, 8, 128, dtype, layout, seed=qo_len * 7 + kv_len)
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout,
                                                   return_lse=True)
    ref_out, ref_lse = reference.prefill(q, _nhd(k, layout), _nhd(v, layout), causal=causal)
    _check(out, lse, ref_out, ref_lse, dtype)
    # The same output without the LSE, and from the _return_lse entry point.
    assert torch.equal(cinfer.single_prefill_with_kv_cache(q, k, v, causal=causal,
                                                           kv_layout=layout), out)
    out2, lse2 = cinfer.single_prefill_with_kv_cache_return_lse(q, k, v, causal=causal,
                                                                kv_layout=layout)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    if causal and qo_len > kv_len:
        # Rows before the KV starts see nothing: exact zeros and -inf.
        empty = qo_len - kv_len
        assert (out[:empty] == 0).all() and torch.isneginf(lse[:empty]).all()


@pytest.mark.parametrize("seed", range(6))
def test_single_prefill_random(seed):
    rnd = random.Random(seed)
    hk = rnd.choice([1, 2, 4, 8])
    hq = hk * rnd.choice([1, 3, 5, 8])
    d = rnd.choice([64, 128, 256])
    qo_len = rnd.randint(1, 300)
    kv_len = qo_len + rnd.randint(0, 900)
    dtype = rnd.choice([torch.float16, torch.bfloat16])
    layout = rnd.choice(["NHD", "HND"])
    causal = rnd.random() < 0.7
    window_left = rnd.choice([-1, -1, 0, 5, rnd.randint(0, kv_len)])
    cap = rnd.choice([None, 30.0])
    sm_scale = rnd.choice([None, 0.05])
    q, k, v = _make(qo_len, kv_len, hq, hk, d, dtype, layout, seed=seed, q_mul=4.0)
    out, lse = cinfer.single_prefill_with_kv_cache(
        q, k, v, causal=causal, kv_layout=layout, sm_scale=sm_scale, window_left=window_left,
        logits_soft_cap=cap, return_lse=True)
    ref_out, ref_lse = reference.prefill(q, _nhd(k, layout), _nhd(v, layout), causal=causal,
                                         sm_scale=sm_scale, logits_soft_cap=cap,
                                         window_left=window_left)
    _check(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("d", [64, 80, 256])
def test_single_prefill_head_dims(d):
    q, k, v = _make(200, 300, 16, 4, d, torch.bfloat16, "NHD", seed=d)
    out = cinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    ref_out, _ = reference.prefill(q, k, v, causal=True)
    atol, rtol = reference.tolerance(torch.bfloat16)
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dims", [(192, 128), (128, 64), (64, 128)], ids=str)
def test_single_prefill_head_dims_qk_vo(dims, layout):
    # v (and out) with another head dim than q and k, as DeepSeek's prefill (192 / 128).
    d_qk, d_vo = dims
    gen = torch.Generator(DEV).manual_seed(d_qk + d_vo)
    q = torch.randn(150, 8, d_qk, generator=gen, device=DEV).bfloat16()
    k = torch.randn(270, 2, d_qk, generator=gen, device=DEV).bfloat16()
    v = torch.randn(270, 2, d_vo, generator=gen, device=DEV).bfloat16()
    for causal in (False, True):
        ref_out, ref_lse = reference.prefill(q, k, v, causal=causal)
        kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
        out, lse = cinfer.single_prefill_with_kv_cache(q, kk, vv, causal=causal,
                                                        kv_layout=layout, return_lse=True)
        assert out.shape == (150, 8, d_vo)
        _check(out, lse, ref_out, ref_lse, torch.bfloat16)
    # A repeated layout (the checked-call cache) keeps v's head dim.
    out = cinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    assert out.shape == (150, 8, d_vo)
    ref_out, _ = reference.prefill(q, k, v, causal=True)
    atol, rtol = reference.tolerance(torch.bfloat16)
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    # fp8 K/V does not combine with D_qk != D_vo: refused by name.
    with pytest.raises(cinfer.UnsupportedError, match="head_dim_vo"):
        cinfer.single_prefill_with_kv_cache(q, k.to(torch.float8_e4m3fn),
                                            v.to(torch.float8_e4m3fn))


def test_single_prefill_packed_qkv():
    # q, k, v as head slices of one [tokens, Hq + 2 Hk, D] projection output (vLLM's layout).
    n, hq, hk, d = 257, 8, 2, 128
    qkv = torch.randn(n, hq + 2 * hk, d, device=DEV).half()
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hk], qkv[:, hq + hk:]
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    ref_out, ref_lse = reference.prefill(q, k, v, causal=True)
    _check(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.parametrize("lens", [(0, 10), (10, 0), (0, 0)], ids=str)
def test_single_prefill_empty(lens):
    qo_len, kv_len = lens
    q, k, v = _make(qo_len, kv_len, 8, 2, 128, torch.float16, "NHD", seed=3)
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    assert out.shape == (qo_len, 8, 128) and lse.shape == (qo_len, 8)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_single_prefill_window_matches_decode():
    # The last query row of a prefill is the decode of that token.
    q, k, v = _make(64, 700, 32, 8, 128, torch.bfloat16, "NHD", seed=5)
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, causal=True, window_left=99,
                                                   return_lse=True)
    d_out, d_lse = cinfer.single_decode_with_kv_cache(q[-1], k, v, window_left=99,
                                                      return_lse=True)
    atol, rtol = reference.tolerance(torch.bfloat16)
    torch.testing.assert_close(out[-1].float(), d_out.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(lse[-1], d_lse, atol=2e-3, rtol=1e-4)


def random_mask(qo_len, kv_len, seed, empty_rows=(0,)):
    """A random bool [qo_len, kv_len] mask (about half kept) with the rows in empty_rows fully
    masked and the last row fully kept."""
    gen = torch.Generator(DEV).manual_seed(seed)
    mask = torch.rand(qo_len, kv_len, generator=gen, device=DEV) < 0.5
    if qo_len:
        mask[-1] = True
        for r in empty_rows:
            if r < qo_len - 1:
                mask[r] = False
    return mask


@pytest.mark.parametrize("lens", [(1, 1), (7, 100), (128, 1000), (333, 200), (64, 64),
                                  (17, 0)], ids=lambda x: f"qo{x[0]}_kv{x[1]}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_single_prefill_custom_mask(dtype, lens):
    qo_len, kv_len = lens
    layout = "HND" if qo_len % 2 else "NHD"
    q, k, v = _make(qo_len, kv_len, 16, 4, 128, dtype, layout, seed=qo_len + 3 * kv_len)
    mask = random_mask(qo_len, kv_len, seed=qo_len, empty_rows=(0, qo_len // 2))
    # causal=True is ignored: the custom mask replaces the causal mask (FlashInfer's rule).
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, causal=True,
                                                   kv_layout=layout, return_lse=True)
    ref_out, ref_lse = reference.prefill(q, _nhd(k, layout), _nhd(v, layout), mask=mask)
    _check(out, lse, ref_out, ref_lse, dtype)
    empty = ~mask.any(dim=1)  # fully masked rows: exact zeros and -inf
    assert (out[empty] == 0).all() and torch.isneginf(lse[empty]).all()
    # The same mask packed (little bit order, FlashInfer's packbits of the flattened mask), or
    # flattened: the same kernel on the same bits, bit-identical.
    packed = cinfer.packbits(mask.flatten(), bitorder="little")
    out_p, lse_p = cinfer.single_prefill_with_kv_cache(
        q, k, v, packed_custom_mask=packed, kv_layout=layout, return_lse=True)
    assert torch.equal(out_p, out) and torch.equal(lse_p, lse)
    assert torch.equal(cinfer.single_prefill_with_kv_cache(
        q, k, v, custom_mask=mask.flatten(), kv_layout=layout), out)


def test_single_prefill_custom_mask_alignment_and_window():
    # qo_len < kv_len: the mask's rows are the last qo_len positions. A lower-triangular mask
    # aligned bottom-right is the causal mask; with a window both apply.
    qo_len, kv_len = 100, 700
    q, k, v = _make(qo_len, kv_len, 8, 2, 128, torch.bfloat16, "NHD", seed=23)
    tril = torch.ones(qo_len, kv_len, dtype=torch.bool, device=DEV).tril(kv_len - qo_len)
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=tril, return_lse=True)
    ref_out, ref_lse = reference.prefill(q, k, v, causal=True)
    _check(out, lse, ref_out, ref_lse, torch.bfloat16)
    c_out, c_lse = cinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    atol, rtol = reference.tolerance(torch.bfloat16)
    torch.testing.assert_close(out.float(), c_out.float(), atol=atol, rtol=rtol)
    mask = random_mask(qo_len, kv_len, seed=29)
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, window_left=40,
                                                   return_lse=True)
    ref_out, ref_lse = reference.prefill(q, k, v, mask=mask, window_left=40)
    _check(out, lse, ref_out, ref_lse, torch.bfloat16)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens,heads", [((1, 500), (32, 8)), ((200, 200), (12, 4)),
                                        ((64, 1000), (8, 8)), ((300, 100), (6, 2))],
                         ids=["qo1_kv500_h32", "qo200_kv200_h12", "qo64_kv1000_h8",
                              "qo300_kv100_h6"])
def test_single_prefill_alibi(lens, heads, causal):
    # Head counts that are not powers of two take the paper's interleaved slopes.
    (qo_len, kv_len), (hq, hk) = lens, heads
    q, k, v = _make(qo_len, kv_len, hq, hk, 128, torch.float16, "NHD", seed=hq + qo_len)
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, causal=causal,
                                                   pos_encoding_mode="ALIBI", return_lse=True)
    ref_out, ref_lse = reference.prefill(q, k, v, causal=causal,
                                         alibi_slopes=reference.alibi_slopes(hq, DEV))
    _check(out, lse, ref_out, ref_lse, torch.float16)


def test_single_prefill_reuses_checked_layouts(monkeypatch):
    """Calls that repeat an earlier call's layout (the path that reuses its checked structs with
    the data pointers updated): other data, with and without the LSE, another sm_scale, q with
    other strides, a call that must still fail, and the same layout on another thread."""
    f = cinfer.single_prefill_with_kv_cache
    q, k, v = _make(200, 700, 8, 2, 128, torch.bfloat16, "NHD", seed=5)
    first, first_lse = f(q, k, v, causal=True, return_lse=True)
    for seed in range(3):
        q2, k2, v2 = _make(200, 700, 8, 2, 128, torch.bfloat16, "NHD", seed=10 + seed)
        out, lse = f(q2, k2, v2, causal=True, return_lse=True)
        _check(out, lse, *reference.prefill(q2, k2, v2, causal=True), torch.bfloat16)
        assert torch.equal(f(q2, k2, v2, causal=True), out)
    again, again_lse = f(q, k, v, causal=True, return_lse=True)
    assert torch.equal(again, first) and torch.equal(again_lse, first_lse)
    out, lse = f(q, k, v, causal=True, sm_scale=0.05, return_lse=True)
    _check(out, lse, *reference.prefill(q, k, v, causal=True, sm_scale=0.05), torch.bfloat16)
    wide = torch.zeros(200, 8, 256, dtype=torch.bfloat16, device=DEV)
    wide[..., 64:192] = q
    out, lse = f(wide[..., 64:192], k, v, causal=True, return_lse=True)
    _check(out, lse, *reference.prefill(q, k, v, causal=True), torch.bfloat16)
    with pytest.raises(ValueError, match="v: dtype"):
        f(q, k, v.float(), causal=True)
    # A repeated layout builds no DLTensor: it rebinds the structs of the call that checked it.
    # (Called once more first: the per-thread cache empties itself when full, which the calls of
    # earlier tests in this process may make happen at any call above.)
    f(q2, k2, v2, causal=True)
    built = []
    to_dl = cinfer._tensor.to_dl
    monkeypatch.setattr(cinfer._tensor, "to_dl",
                        lambda *a, **kw: built.append(1) or to_dl(*a, **kw))
    f(q2, k2, v2, causal=True)
    assert built == []
    monkeypatch.undo()
    result = []
    worker = threading.Thread(target=lambda: result.append(f(q2, k2, v2, causal=True)))
    worker.start()
    worker.join()
    assert torch.equal(result[0], f(q2, k2, v2, causal=True))


@pytest.mark.parametrize("causal", [False, True])
def test_single_prefill_short_query_long_kv(causal):
    """A short query over a long KV, which the library splits across CTAs (split-KV): against
    the reference, the same output without the LSE, and in a CUDA graph (a captured call runs
    unsplit) replayed over new contents of the same tensors."""
    f = cinfer.single_prefill_with_kv_cache
    q, k, v = _make(16, 16384, 32, 8, 128, torch.bfloat16, "NHD", seed=41)
    out, lse = f(q, k, v, causal=causal, return_lse=True)
    _check(out, lse, *reference.prefill(q, k, v, causal=causal), torch.bfloat16)
    assert torch.equal(f(q, k, v, causal=causal), out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = f(q, k, v, causal=causal, return_lse=True)
    q2, k2, v2 = _make(16, 16384, 32, 8, 128, torch.bfloat16, "NHD", seed=42)
    q.copy_(q2)
    k.copy_(k2)
    v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    _check(g_out, g_lse, *reference.prefill(q, k, v, causal=causal), torch.bfloat16)


def test_single_prefill_errors():
    q, k, v = _make(16, 32, 8, 2, 128, torch.float16, "NHD", seed=17)
    f = cinfer.single_prefill_with_kv_cache
    mask = torch.ones(16, 32, dtype=torch.bool, device=DEV)
    with pytest.raises(TypeError, match="k"):
        f(q, "k", v)
    with pytest.raises(ValueError, match="custom_mask.*shape"):
        f(q, k, v, custom_mask=mask[:, :31])
    with pytest.raises(ValueError, match="custom_mask.*bool"):
        f(q, k, v, custom_mask=mask.to(torch.uint8))
    with pytest.raises(ValueError, match="custom_mask.*cpu"):
        f(q, k, v, custom_mask=mask.cpu())
    with pytest.raises(ValueError, match="packed_custom_mask.*bytes"):
        f(q, k, v, packed_custom_mask=torch.ones(63, dtype=torch.uint8, device=DEV))
    with pytest.raises(ValueError, match="packed_custom_mask.*uint8"):
        f(q, k, v, packed_custom_mask=torch.ones(64, dtype=torch.int32, device=DEV))
    with pytest.raises(cinfer.UnsupportedError, match="ALIBI"):
        f(q, k, v, custom_mask=mask, pos_encoding_mode="ALIBI")
    with pytest.raises(cinfer.UnsupportedError, match="variant"):
        f(q, k, v, custom_mask=mask, variant="sinks", variant_args=(torch.zeros(8, device=DEV),))
    with pytest.raises(cinfer.UnsupportedError, match="logits_soft_cap"):
        f(q, k, v, custom_mask=mask, logits_soft_cap=30.0)
    with pytest.raises(cinfer.UnsupportedError, match="logits_soft_cap"):
        f(q, k, v, pos_encoding_mode="ALIBI", logits_soft_cap=30.0)
    with pytest.raises(TypeError, match="ALIBI"):
        f(q, k, v, pos_encoding_mode="ALIBI", variant_args=(None, 8))
    with pytest.raises(ValueError, match="rope_scale"):
        f(q, k, v, pos_encoding_mode="ROPE_LLAMA", rope_scale=float("nan"))
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        f(q, k, v, pos_encoding_mode="rope")
    with pytest.raises(cinfer.UnsupportedError, match="use_fp16_qk_reduction"):
        f(q, k, v, use_fp16_qk_reduction=True)
    with pytest.raises(ValueError, match="backend"):
        f(q, k, v, backend="cutlass")
    with pytest.raises(ValueError, match="kv_layout"):
        f(q, k, v, kv_layout="NDH")
    with pytest.raises(ValueError, match="q.*float32"):
        f(q.float(), k, v)
    with pytest.raises(ValueError, match="v.*dtype"):
        f(q, k, v.bfloat16())
    with pytest.raises(ValueError, match="q.*cpu"):
        f(q.cpu(), k, v)
    with pytest.raises(ValueError, match="sm_scale"):
        f(q, k, v, sm_scale=0.0)
    with pytest.raises(ValueError, match="window_left"):
        f(q, k, v, window_left=-2)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        f(q, k, v, logits_soft_cap=-1.0)
    if hasattr(torch, "float8_e4m3fn"):
        with pytest.raises(ValueError, match="v: dtype"):
            f(q, k.to(torch.float8_e4m3fn), v)
        with pytest.raises(ValueError, match="k_scale"):
            f(q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), k_scale=0.0)
    # Checks made by the library, with its message: heads that do not divide, head dims.
    q9 = torch.randn(16, 9, 128, device=DEV).half()
    with pytest.raises(ValueError, match="num_qo_heads"):
        f(q9, k, v)
    q72, k72, v72 = _make(16, 32, 8, 2, 72, torch.float16, "NHD", seed=19)
    with pytest.raises(cinfer.UnsupportedError, match="head_dim"):
        f(q72, k72, v72)
    with pytest.raises(ValueError, match="v"):
        f(q, k, v[:, :1])  # k and v of different shapes
    assert math.isfinite(f(q, k, v).float().sum().item())


FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (64, torch.float16),
                                     (256, torch.bfloat16)])
def test_single_prefill_fp8(kv_dtype, causal, d, dtype):
    """fp8 K/V: the reference reads the same fp8 values; k_scale scales the logits, v_scale the
    output. The kernels round q * sm_scale to fp16, hence the wider LSE tolerance."""
    q, k, v = _make(200, 333, 8, 2, d, dtype, "NHD", seed=d + causal)
    k8, v8 = k.to(kv_dtype), v.to(kv_dtype)
    ks, vs = 0.8, 1.7
    out, lse = cinfer.single_prefill_with_kv_cache(q, k8, v8, causal=causal, return_lse=True,
                                                   k_scale=ks, v_scale=vs)
    ref_out, ref_lse = reference.prefill(q, k8, v8, causal=causal, sm_scale=ks / math.sqrt(d))
    atol, rtol = reference.tolerance(dtype)
    assert out.dtype == dtype and not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), ref_out * vs, atol=atol * vs, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=4e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype,layout,causal,lens,rope", [
    (torch.float16, "NHD", True, (100, 300), None),
    (torch.bfloat16, "HND", True, (64, 700), (0.5, 5e5)),
    (torch.float16, "NHD", False, (120, 260), (2.5, 1e6)),
], ids=["f16_causal_defaults", "bf16_hnd_causal_scaled", "f16_noncausal_scaled"])
def test_single_prefill_rope(dtype, layout, causal, lens, rope):
    # In-kernel RoPE: query row i at kv_len - qo_len + i, key j at j (chunked prefill here).
    qo_len, kv_len = lens
    q, k, v = _make(qo_len, kv_len, 16, 4, 128, dtype, layout, seed=qo_len + kv_len)
    kw = {} if rope is None else dict(rope_scale=rope[0], rope_theta=rope[1])
    out, lse = cinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout,
                                                   pos_encoding_mode="ROPE_LLAMA",
                                                   return_lse=True, **kw)
    ref_out, ref_lse = reference.prefill(q, _nhd(k, layout), _nhd(v, layout), causal=causal,
                                         rope=rope or (1.0, 1e4), rope_round=dtype)
    atol, rtol = reference.tolerance(dtype)
    assert out.dtype == dtype and not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
