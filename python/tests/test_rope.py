"""The RoPE family against a float64 reference written here: ragged (indptr/offsets) and pos_ids
forms, Llama 3.1 frequencies, rotate-half and interleaved pairs, partial rotary dims, in place
and not, packed QKV strides, large and negative positions, the cos/sin-cache form (2-d and 3-d,
int64 positions, out-of-range positions), errors."""

import math
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
from reference import f64, rope_freqs, rope_rotate, tolerance  # noqa: E402

DEV = "cuda"
I32 = torch.int32


def _freqs(rotary_dim, rope_scale=1.0, rope_theta=1e4):
    return rope_freqs(rotary_dim, rope_scale, rope_theta, DEV)


def _llama31_freqs(rotary_dim, rope_scale=8.0, rope_theta=5e5, low_freq_factor=1.0,
                   high_freq_factor=4.0, old_context_len=8192.0):
    """Llama 3.1's frequency rule, as its reference code states it, per wavelength."""
    base = _freqs(rotary_dim, 1.0, rope_theta)
    wavelen = 2 * math.pi / base
    low_wavelen = old_context_len / low_freq_factor
    high_wavelen = old_context_len / high_freq_factor
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * base / rope_scale + smooth * base
    return torch.where(wavelen < high_wavelen, base,
                       torch.where(wavelen > low_wavelen, base / rope_scale, blended))


def _reference(x, pos, freqs, rotary_dim, interleave, covered=None):
    """RoPE of x at float64 positions pos [nnz]; rows where covered is False are copied."""
    a = pos[:, None] * freqs[None, :]
    out = rope_rotate(f64(x), torch.cos(a), torch.sin(a), rotary_dim, interleave)
    if covered is not None:
        out[~covered] = f64(x)[~covered]
    return out


def _check(got, want, dtype):
    atol, rtol = tolerance(dtype)
    assert got.dtype == dtype and not torch.isnan(got).any()
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)


def _qk(nnz, hq, hk, d, dtype, gen):
    """q, k as head slices of a packed [nnz, Hq + 2 Hk, D] QKV tensor (strided), and the
    tensor itself."""
    qkv = torch.randn(nnz, hq + 2 * hk, d, generator=gen, device=DEV).to(dtype)
    return qkv[:, :hq], qkv[:, hq:hq + hk], qkv


def _ragged(rnd, batch, extra):
    """Host indptr with `extra` uncovered tokens at the end, offsets, per-token positions."""
    lens = [rnd.randint(0, 40) for _ in range(batch)]
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    offsets = [rnd.randint(0, 5000) for _ in range(batch)]
    pos = [offsets[b] + i for b in range(batch) for i in range(lens[b])]
    nnz = indptr[-1] + extra
    return indptr, offsets, pos + [0] * extra, nnz


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("llama31", [False, True], ids=["rope", "llama31"])
def test_apply_rope_ragged(llama31, seed):
    rnd = random.Random(seed * 2 + llama31)
    dtype = rnd.choice([torch.float16, torch.bfloat16])
    d = rnd.choice([64, 128, 256])
    rotary_dim = rnd.choice([None, d // 2]) if d <= 512 else None
    interleave = rnd.random() < 0.5
    inplace = rnd.random() < 0.5
    hq, hk = rnd.choice([(32, 8), (8, 1), (4, 4)])
    indptr, offsets, pos, nnz = _ragged(rnd, rnd.randint(1, 8), rnd.choice([0, 3]))
    gen = torch.Generator(DEV).manual_seed(seed)
    q, k, qkv = _qk(nnz, hq, hk, d, dtype, gen)
    v_before = qkv[:, hq + hk:].clone()
    q0, k0 = q.clone(), k.clone()
    r = rotary_dim or d
    if llama31:
        kw = dict(rope_scale=4.0, rope_theta=5e5, low_freq_factor=1.0, high_freq_factor=4.0,
                  old_context_len=8192)
        freqs = _llama31_freqs(r, 4.0, 5e5, 1.0, 4.0, 8192.0)
        fn = cinfer.apply_llama31_rope_inplace if inplace else cinfer.apply_llama31_rope
    else:
        kw = dict(rope_scale=2.0, rope_theta=1e4)
        freqs = _freqs(r, 2.0, 1e4)
        fn = cinfer.apply_rope_inplace if inplace else cinfer.apply_rope
    # indptr as int64 (converted), offsets as int32.
    res = fn(q, k, torch.tensor(indptr, device=DEV), torch.tensor(offsets, dtype=I32, device=DEV),
             rotary_dim=rotary_dim, interleave=interleave, **kw)
    if inplace:
        assert res is None
        q_rope, k_rope = q, k
        assert torch.equal(qkv[:, hq + hk:], v_before)  # only q and k were written
    else:
        q_rope, k_rope = res
        assert torch.equal(q, q0) and torch.equal(k, k0)
    p = torch.tensor(pos, dtype=torch.float64, device=DEV)
    covered = torch.arange(nnz, device=DEV) < indptr[-1]
    _check(q_rope, _reference(q0, p, freqs, r, interleave, covered), dtype)
    _check(k_rope, _reference(k0, p, freqs, r, interleave, covered), dtype)


@pytest.mark.parametrize("llama31", [False, True], ids=["rope", "llama31"])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_apply_rope_pos_ids(interleave, inplace, llama31):
    nnz, hq, hk, d = 300, 16, 4, 128
    dtype = torch.bfloat16 if llama31 else torch.float16
    gen = torch.Generator(DEV).manual_seed(7)
    q, k, _ = _qk(nnz, hq, hk, d, dtype, gen)
    q0, k0 = q.clone(), k.clone()
    # Positions from negative to the millions: angles are reduced in float64 on the device.
    pos = torch.randint(-1000, 3_000_000, (nnz,), generator=gen, device=DEV, dtype=torch.int64)
    if llama31:
        fn = cinfer.apply_llama31_rope_pos_ids_inplace if inplace else \
            cinfer.apply_llama31_rope_pos_ids
        freqs = _llama31_freqs(d)  # FlashInfer's defaults: scale 8, theta 5e5, 1, 4, 8192
    else:
        fn = cinfer.apply_rope_pos_ids_inplace if inplace else cinfer.apply_rope_pos_ids
        freqs = _freqs(d)  # defaults: scale 1, theta 1e4
    res = fn(q, k, pos, interleave=interleave)  # int64 pos_ids, converted
    q_rope, k_rope = (q, k) if inplace else res
    _check(q_rope, _reference(q0, pos.double(), freqs, d, interleave), dtype)
    _check(k_rope, _reference(k0, pos.double(), freqs, d, interleave), dtype)


def _cos_sin_cache(max_pos, rotary_dim, theta=1e4):
    a = torch.arange(max_pos, dtype=torch.float64, device=DEV)[:, None] * _freqs(
        rotary_dim, 1.0, theta)[None, :]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=1).float()


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_apply_rope_with_cos_sin_cache(rotary_dim, inplace, is_neox):
    nnz, hq, hk, d = 211, 8, 2, 128
    dtype = torch.bfloat16
    gen = torch.Generator(DEV).manual_seed(rotary_dim + inplace)
    # vLLM's layout: one [nnz, (Hq + 2 Hk) * D] projection, q and k as 2-d column slices.
    qkv = torch.randn(nnz, (hq + 2 * hk) * d, generator=gen, device=DEV).to(dtype)
    query, key = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d]
    q0, k0, v0 = query.clone(), key.clone(), qkv[:, (hq + hk) * d:].clone()
    table = _cos_sin_cache(4096, rotary_dim)
    positions = torch.randint(0, 4096, (nnz,), generator=gen, device=DEV)  # int64, as vLLM's
    if inplace:
        assert cinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, d, table,
                                                            is_neox) is None
        q_out, k_out = query, key
        assert torch.equal(qkv[:, (hq + hk) * d:], v0)
    else:
        q_out, k_out = cinfer.apply_rope_with_cos_sin_cache(positions, query, key, d, table,
                                                            is_neox=is_neox)
        assert torch.equal(query, q0)
    assert q_out.shape == (nnz, hq * d) and k_out.shape == (nnz, hk * d)
    t = f64(table[positions])
    cos, sin = t[:, :rotary_dim // 2], t[:, rotary_dim // 2:]
    for got, x0, h in ((q_out, q0, hq), (k_out, k0, hk)):
        want = rope_rotate(f64(x0).view(nnz, h, d), cos, sin, rotary_dim, not is_neox)
        _check(got.view(nnz, h, d), want, dtype)


def test_apply_rope_with_cos_sin_cache_3d_and_out_of_range():
    nnz, h, d = 10, 4, 64
    query = torch.randn(nnz, h, d, device=DEV).half()
    key = torch.randn(nnz, 1, d, device=DEV).half()
    table = _cos_sin_cache(100, d)
    positions = torch.arange(nnz, dtype=I32, device=DEV) * 10
    positions[3] = 100  # past the table: that token's rotated elements come out NaN
    q_out, k_out = cinfer.apply_rope_with_cos_sin_cache(positions, query, key, d, table)
    assert q_out.shape == query.shape
    assert torch.isnan(q_out[3]).all() and torch.isnan(k_out[3]).all()  # rotary_dim = d
    ok = torch.ones(nnz, dtype=torch.bool, device=DEV)
    ok[3] = False
    want = _reference(query[ok], positions[ok].double(), _freqs(d), d, False)
    _check(q_out[ok], want, torch.float16)


def test_rope_errors():
    q = torch.randn(5, 4, 64, device=DEV).half()
    k = torch.randn(5, 2, 64, device=DEV).half()
    pos = torch.arange(5, dtype=I32, device=DEV)
    with pytest.raises(ValueError, match="rotary_dim"):
        cinfer.apply_rope_pos_ids(q, k, pos, rotary_dim=63)
    with pytest.raises(ValueError, match="rotary_dim"):
        cinfer.apply_rope_pos_ids(q, k, pos, rotary_dim=128)
    with pytest.raises(ValueError, match="k.*dtype"):
        cinfer.apply_rope_pos_ids(q, k.bfloat16(), pos)
    with pytest.raises(ValueError, match="q.*float32"):
        cinfer.apply_rope_pos_ids(q.float(), k.float(), pos)
    with pytest.raises(ValueError, match="pos_ids"):
        cinfer.apply_rope_pos_ids(q, k, pos[:4])
    with pytest.raises(ValueError, match="pos_ids"):
        cinfer.apply_rope_pos_ids(q, k, pos.float())
    with pytest.raises(ValueError, match="rope_theta"):
        cinfer.apply_rope_pos_ids(q, k, pos, rope_theta=0.0)
    with pytest.raises(ValueError, match="high_freq_factor"):
        cinfer.apply_llama31_rope_pos_ids(q, k, pos, low_freq_factor=4.0, high_freq_factor=2.0)
    with pytest.raises(ValueError, match="offsets"):
        cinfer.apply_rope(q, k, torch.tensor([0, 5], dtype=I32, device=DEV),
                          torch.zeros(2, dtype=I32, device=DEV))
    with pytest.raises(ValueError, match="q.*cpu"):
        cinfer.apply_rope_pos_ids(q.cpu(), k, pos)
    with pytest.raises(TypeError, match="k"):
        cinfer.apply_rope_pos_ids(q, None, pos)
    table = _cos_sin_cache(16, 64)
    q2 = q.view(5, -1)
    with pytest.raises(ValueError, match="head_size"):
        cinfer.apply_rope_with_cos_sin_cache(pos, q2, k.view(5, -1), 48, table)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        cinfer.apply_rope_with_cos_sin_cache(pos, q2, k.view(5, -1), 64, table.half())
    with pytest.raises(ValueError, match="cos_sin_cache"):
        cinfer.apply_rope_with_cos_sin_cache(pos, q2, k.view(5, -1), 64, table[:, :63])
