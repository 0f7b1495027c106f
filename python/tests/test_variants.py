"""Attention variants from Python against a float64 reference: a user variant defined here (a
logit transform with a tensor and a scalar argument and batch_idx, plus a logits mask) and the
built-ins sinks, alibi and sigmoid, through single decode, single prefill, the batch decode
wrapper and both batch prefill wrappers; argument errors (the library's messages) and compile
errors (NVRTC's log)."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
import reference  # noqa: E402
from test_batch_prefill import Paged, Ragged, indptr, lengths  # noqa: E402

DEV = "cuda"
D = 128

USER_SOURCE = r"""
#define VARIANT_LOGITS_TRANSFORM 1
#define VARIANT_LOGITS_MASK 1
__device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,
                                          int batch_idx, int qo_idx, int kv_idx,
                                          int qo_head_idx, int kv_head_idx) {
    return logit + params->bias[qo_head_idx] * params->scale + 0.25f * (float)batch_idx;
}
__device__ bool variant_logits_mask(const cinfer_variant_params *params, int batch_idx,
                                    int qo_idx, int kv_idx, int qo_head_idx, int kv_head_idx) {
    return (kv_idx & 1) == 0;
}
"""


@pytest.fixture(scope="module")
def user_variant():
    return cinfer.Variant("py_head_bias_even", USER_SOURCE, tensors=[("bias", torch.float32)],
                          scalars=[("scale", "float")])


def alibi_slopes(h):
    """The ALiBi paper's slopes (SEMANTICS.md), any head count."""
    n = 1 << (h.bit_length() - 1)
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / n) if i < n
                         else 2.0 ** (-4.0 * (2 * (i - n) + 1) / n) for i in range(h)],
                        dtype=torch.float64, device=DEV)


def ref_variant(q, k, v, kind, *, causal=False, batch_idx=0, args=None):
    """One request: q [qo, Hq, D]; k, v [kv, Hk, D] -> (out [qo, Hq, D], lse [qo, Hq] or None).
    kind: "user" (args bias, scale), "sinks" (args sinks), "alibi" (args slopes or None),
    "sigmoid" (args scale, bias)."""
    q, k, v = reference.f64(q), reference.f64(k), reference.f64(v)
    qo, hq, _ = q.shape
    kv, hk, _ = k.shape
    kk = k.repeat_interleave(hq // hk, dim=1)
    vv = v.repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, kk) / math.sqrt(D)
    pos = torch.arange(qo, device=DEV)[:, None] + (kv - qo)
    j = torch.arange(kv, device=DEV)[None, :]
    keep = torch.ones(qo, kv, dtype=torch.bool, device=DEV)
    if causal:
        keep &= j <= pos
    if kind == "user":
        bias, scale = args
        s = s + bias.double()[:, None, None] * scale + 0.25 * batch_idx
        keep &= (j % 2 == 0)
    elif kind == "alibi":
        slopes = args[0].double() if args[0] is not None else alibi_slopes(hq)
        s = s + slopes[:, None, None] * (j - pos)[None].double()
    if kind == "sigmoid":
        scale, bias = args
        w = torch.sigmoid(s * scale + bias) * keep[None]
        return torch.einsum("hij,jhd->ihd", w, vv), None
    s = s.masked_fill(~keep[None], -math.inf)
    if kind == "sinks":
        sink = args[0].double()[:, None, None].expand(hq, qo, 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=2), dim=2)
    else:
        lse = torch.logsumexp(s, dim=2)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return torch.einsum("hij,jhd->ihd", p, vv), (lse / reference.LN2).transpose(0, 1)


def check(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = reference.tolerance(dtype)
    # Unnormalized outputs (sigmoid) grow with the KV length: scale the absolute tolerance.
    atol *= max(1.0, float(ref_out.abs().max()))
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    if lse is not None:
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


def variant_and_args(kind, hq, user_variant, gen):
    if kind == "user":
        return user_variant, (torch.randn(hq, generator=gen, device=DEV), 0.5)
    if kind == "sinks":
        return cinfer.variant_builtin("sinks"), (torch.randn(hq, generator=gen, device=DEV) * 2,)
    if kind == "alibi":
        return cinfer.variant_builtin("alibi"), (None, hq)
    return cinfer.variant_builtin("sigmoid"), (0.7, -1.0)


def ref_args(kind, args):
    return args if kind != "alibi" else (args[0],)


@pytest.mark.parametrize("kind,causal,lens,heads", [
    ("user", True, (70, 300), (8, 2)),
    ("sinks", True, (40, 33), (8, 8)),
    ("alibi", True, (64, 200), (12, 4)),  # not a power of two: the interleaved slopes
    ("sigmoid", False, (50, 120), (8, 2)),
])
def test_single_prefill_variants(user_variant, kind, causal, lens, heads):
    qo, kv = lens
    hq, hk = heads
    gen = torch.Generator(DEV).manual_seed(hq + qo)
    q = torch.randn(qo, hq, D, generator=gen, device=DEV).half()
    k = torch.randn(kv, hk, D, generator=gen, device=DEV).half()
    v = torch.randn(kv, hk, D, generator=gen, device=DEV).half()
    variant, args = variant_and_args(kind, hq, user_variant, gen)
    want_lse = kind != "sigmoid"
    res = cinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, variant=variant,
                                              variant_args=args, return_lse=want_lse)
    out, lse = res if want_lse else (res, None)
    ref_out, ref_lse = ref_variant(q, k, v, kind, causal=causal, args=ref_args(kind, args))
    check(out, lse, ref_out, ref_lse, torch.float16)
    # By name, and a built-in by its name.
    names = [p[0] for p in variant.params]
    by_name = dict(zip(names, args))
    out2 = cinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, variant=variant.name
                                               if variant.is_builtin else variant,
                                               variant_args=by_name)
    assert torch.equal(out2, out)


@pytest.mark.parametrize("kind", ["user", "sinks", "alibi"])
def test_single_decode_variants(user_variant, kind):
    hq, hk, kv = 16, 4, 3000
    gen = torch.Generator(DEV).manual_seed(7)
    q = torch.randn(hq, D, generator=gen, device=DEV).bfloat16()
    k = torch.randn(kv, hk, D, generator=gen, device=DEV).bfloat16()
    v = torch.randn(kv, hk, D, generator=gen, device=DEV).bfloat16()
    variant, args = variant_and_args(kind, hq, user_variant, gen)
    out, lse = cinfer.single_decode_with_kv_cache(q, k, v, variant=variant, variant_args=args,
                                                  return_lse=True)
    ref_out, ref_lse = ref_variant(q[None], k, v, kind, args=ref_args(kind, args))
    check(out, lse, ref_out[0], ref_lse[0], torch.bfloat16)


def test_batch_decode_variant(user_variant):
    """batch_idx is the request: the user variant adds 0.25 * b to request b's logits."""
    hq, hk, page_size, batch = 8, 2, 16, 6
    kv_lens = [100, 0, 1, 700, 33, 16]
    pool = Paged(kv_lens, page_size, hk, torch.float16, "NHD", True, seed=4)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(pool.indptr, pool.indices, pool.last, hq, hk, D, page_size, variant=user_variant)
    gen = torch.Generator(DEV).manual_seed(4)
    q = torch.randn(batch, hq, D, generator=gen, device=DEV).half()
    bias = torch.randn(hq, generator=gen, device=DEV)
    out, lse = w.run(q, pool.cache, bias, 0.5, return_lse=True)  # FlashInfer's *args
    for b in range(batch):
        k, v = pool.request(b)
        ref_out, ref_lse = ref_variant(q[b][None], k, v, "user", batch_idx=b, args=(bias, 0.5))
        check(out[b], lse[b], ref_out[0], ref_lse[0], torch.float16)
    assert torch.equal(w.run(q, pool.cache, variant_args={"bias": bias, "scale": 0.5}), out)
    with pytest.raises(ValueError, match="declares"):
        w.run(q, pool.cache, bias)


@pytest.mark.parametrize("storage,kind,causal", [
    ("paged", "user", True),
    ("ragged", "sinks", True),
    ("paged", "alibi", False),
])
def test_batch_prefill_variants(user_variant, storage, kind, causal):
    hq, hk, page_size, batch, dtype = 8, 2, 16, 7, torch.bfloat16
    qo_lens, kv_lens = lengths(batch, seed=11)
    gen = torch.Generator(DEV).manual_seed(11)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    qo_indptr = indptr(qo_lens)
    q = torch.randn(int(qo_indptr[-1]), hq, D, generator=gen, device=DEV).to(dtype)
    variant, args = variant_and_args(kind, hq, user_variant, gen)
    if storage == "paged":
        kv = Paged(kv_lens, page_size, hk, dtype, "HND", False, seed=11)
        w = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "HND")
        w.plan(qo_indptr, kv.indptr, kv.indices, kv.last, hq, hk, D, page_size, causal=causal,
               q_data_type=dtype, variant=variant)
        out, lse = w.run(q, kv.cache, *args, return_lse=True)
    else:
        kv = Ragged(kv_lens, hk, dtype, "NHD", seed=11)
        w = cinfer.BatchPrefillWithRaggedKVCacheWrapper(ws)
        w.plan(qo_indptr, kv.indptr, hq, hk, D, causal=causal, q_data_type=dtype,
               variant=variant)
        out, lse = w.run(q, kv.k, kv.v, variant_args=args, return_lse=True)
    for b in range(batch):
        s, e = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if s == e:
            continue
        k, v = kv.request(b)
        ref_out, ref_lse = ref_variant(q[s:e], k, v, kind, causal=causal, batch_idx=b,
                                       args=ref_args(kind, args))
        check(out[s:e], lse[s:e], ref_out, ref_lse, dtype)


def test_variant_errors(user_variant):
    gen = torch.Generator(DEV).manual_seed(1)
    q = torch.randn(16, 8, D, generator=gen, device=DEV).half()
    k = torch.randn(32, 8, D, generator=gen, device=DEV).half()
    bias = torch.randn(8, device=DEV)
    f = cinfer.single_prefill_with_kv_cache
    with pytest.raises(ValueError, match="declares 2"):
        f(q, k, k, variant=user_variant, variant_args=(bias,))
    with pytest.raises(ValueError, match="bias.*dtype"):
        f(q, k, k, variant=user_variant, variant_args=(bias.half(), 1.0))
    with pytest.raises(ValueError, match="contiguous"):
        f(q, k, k, variant=user_variant, variant_args=(torch.randn(16, device=DEV)[::2], 1.0))
    with pytest.raises(ValueError, match="bias"):
        f(q, k, k, variant=user_variant, variant_args=(bias.cpu(), 1.0))
    with pytest.raises(TypeError, match="tensor parameter"):
        f(q, k, k, variant=user_variant, variant_args=(1.0, 1.0))
    with pytest.raises(ValueError, match="logits_soft_cap"):
        f(q, k, k, variant=user_variant, variant_args=(bias, 1.0), logits_soft_cap=10.0)
    with pytest.raises(ValueError, match="no softmax"):
        f(q, k, k, variant="sigmoid", variant_args=(1.0, 0.0), return_lse=True)
    with pytest.raises(ValueError, match="sinks"):  # NULL for a tensor not named maybe_*
        f(q, k, k, variant="sinks", variant_args=(None,))
    bad = cinfer.Variant("py_broken", "#define VARIANT_LOGITS_TRANSFORM 1\n"
                                      "__device__ float variant_logits_transform(oops)\n")
    with pytest.raises(cinfer.CompileError, match="variant:py_broken"):
        f(q, k, k, variant=bad)
    ws = torch.empty(16 << 20, dtype=torch.uint8, device=DEV)
    w = cinfer.BatchPrefillWithRaggedKVCacheWrapper(ws)
    with pytest.raises(cinfer.CompileError, match="variant:py_broken"):
        w.plan(indptr([16]), indptr([32]), 8, 8, D, variant=bad)
