"""append_paged_kv_cache, get_batch_indices_positions and get_seq_lens against references written
here: random page tables, layouts, separate and combined caches, page sizes, dtype conversion,
fp8 caches, padding rows, int64 index tensors, errors."""

import math
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402

DEV = "cuda"
I32 = torch.int32


def _table(rnd, batch, page_size, max_pages, empty_ok=True):
    """A random page table (host lists): pages per request, indptr, indices, last_page_len and
    the resulting lengths."""
    lens = [rnd.choice([0, rnd.randint(1, 6 * page_size)]) if empty_ok else
            rnd.randint(1, 6 * page_size) for _ in range(batch)]
    pages = [math.ceil(n / page_size) for n in lens]
    assert sum(pages) <= max_pages
    indices = rnd.sample(range(max_pages), sum(pages))
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + p)
    last = [n - (p - 1) * page_size if p else rnd.randint(0, page_size)
            for n, p in zip(lens, pages)]
    return lens, indptr, indices, last


def _store(cache, layout, combined, which, pages, slots, rows):
    """Writes rows [n, Hk, D] at (pages[i], slots[i]) of the K (which=0) or V (1) cache."""
    c = cache[:, which] if combined else cache[which]
    if layout == "NHD":
        c[pages, slots] = rows
    else:
        c[pages, :, slots] = rows  # two advanced indices around a slice: [n, Hk, D]


def _fp8_round(x, dtype):
    """x stored in an fp8 cache: rounded to nearest even, saturated (torch's cast gives NaN
    above the largest finite value)."""
    big = torch.finfo(dtype).max
    return x.float().clamp(-big, big).to(dtype)


@pytest.mark.parametrize("seed", range(8))
def test_append_paged_kv_cache(seed):
    rnd = random.Random(seed)
    layout = rnd.choice(["NHD", "HND"])
    combined = rnd.random() < 0.5
    page_size = rnd.choice([1, 5, 16, 64])
    hk, d = rnd.choice([(1, 64), (8, 128), (4, 256), (2, 40)])
    batch = rnd.randint(1, 12)
    max_pages = batch * 6 + 10
    append_dtype = rnd.choice([torch.float16, torch.bfloat16])
    cache_dtype = rnd.choice([append_dtype, append_dtype, torch.float16, torch.bfloat16] +
                             ([torch.float8_e4m3fn, torch.float8_e5m2]
                              if hasattr(torch, "float8_e4m3fn") else []))
    lens, indptr, indices, last = _table(rnd, batch, page_size, max_pages, empty_ok=False)
    # Each request appends its last 0..len tokens (the page table already holds them).
    appended = [rnd.randint(0, n) for n in lens]
    append_indptr = [0]
    for a in appended:
        append_indptr.append(append_indptr[-1] + a)
    nnz = append_indptr[-1]
    pad = rnd.choice([0, 3])  # padding rows at the end, as a CUDA graph's fixed size gives

    inner = (page_size, hk, d) if layout == "NHD" else (hk, page_size, d)
    gen = torch.Generator(DEV).manual_seed(seed)
    if combined:
        cache = torch.randn((max_pages, 2) + inner, generator=gen, device=DEV).to(cache_dtype)
        paged = cache
    else:
        cache = torch.randn((2, max_pages) + inner, generator=gen, device=DEV).to(cache_dtype)
        paged = (cache[0], cache[1])
    before = cache.clone()
    # K and V as slices of a packed [nnz, Hq + 2 Hk, D] projection.
    qkv = torch.randn(nnz + pad, 3 + 2 * hk, d, generator=gen, device=DEV).to(append_dtype)
    k_new, v_new = qkv[:, 3:3 + hk], qkv[:, 3 + hk:]

    d_indptr = torch.tensor(indptr, dtype=I32, device=DEV)
    d_last = torch.tensor(last, dtype=I32, device=DEV)
    seq_lens = cinfer.get_seq_lens(d_indptr, d_last, page_size)
    assert seq_lens.tolist() == lens
    # int64 indptr (what torch.tensor makes) is accepted.
    batch_indices, positions = cinfer.get_batch_indices_positions(
        torch.tensor(append_indptr, device=DEV), seq_lens, nnz + pad)
    want_b = [b for b in range(batch) for _ in range(appended[b])] + [-1] * pad
    want_p = [lens[b] - appended[b] + i for b in range(batch) for i in range(appended[b])]
    assert batch_indices.tolist() == want_b
    assert positions.tolist() == want_p + [-1] * pad

    # fp8 caches: scales (powers of two, so the reference's x / scale is the kernel's x * (1 /
    # scale) exactly) or none; an error flag that must stay 0.
    fp8 = cache_dtype.itemsize == 1
    scales = rnd.choice([(None, None), (2.0, 0.5), (0.25, 4.0)]) if fp8 else (None, None)
    flag = torch.zeros(1, dtype=I32, device=DEV)
    cinfer.append_paged_kv_cache(k_new, v_new, batch_indices, positions, paged,
                                 torch.tensor(indices, dtype=I32, device=DEV), d_indptr, d_last,
                                 kv_layout=layout, k_scale=scales[0], v_scale=scales[1],
                                 error_flag=flag)
    assert flag.item() == 0

    expect = before.clone()
    pages = torch.tensor([indices[indptr[b] + p // page_size]
                          for b, p in zip(want_b, want_p)], dtype=torch.long, device=DEV)
    slots = torch.tensor([p % page_size for p in want_p], dtype=torch.long, device=DEV)
    for which, src in ((0, k_new[:nnz]), (1, v_new[:nnz])):
        scale = scales[which] or 1.0
        rows = (_fp8_round(src.float() / scale, cache_dtype) if fp8 else src.to(cache_dtype))
        _store(expect, layout, combined, which, pages, slots, rows)
    # Bit-exact: a conversion rounds once, and every other element is untouched.
    assert torch.equal(cache.view(torch.uint8), expect.view(torch.uint8))


def test_append_paged_kv_cache_skips_bad_rows():
    page_size, hk, d = 4, 2, 64
    k_cache = torch.zeros(3, page_size, hk, d, device=DEV).half()
    v_cache = torch.zeros_like(k_cache)
    indptr = torch.tensor([0, 1, 2], dtype=I32, device=DEV)
    indices = torch.tensor([2, 0], dtype=I32, device=DEV)
    last = torch.tensor([4, 4], dtype=I32, device=DEV)
    rows = torch.ones(5, hk, d, device=DEV).half()
    # Padding (-1), a request out of range, a position beyond the request's page, one good row.
    batch_indices = torch.tensor([-1, 7, 0, 1, 1], dtype=I32, device=DEV)
    positions = torch.tensor([0, 0, 9, -1, 3], dtype=I32, device=DEV)
    flag = torch.zeros(1, dtype=I32, device=DEV)
    cinfer.append_paged_kv_cache(rows, rows * 2, batch_indices, positions, (k_cache, v_cache),
                                 indices, indptr, last, error_flag=flag)
    want_k = torch.zeros_like(k_cache)
    want_k[0, 3] = 1
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_k * 2)
    assert flag.item() == cinfer.APPEND_ERROR_BATCH_INDEX | cinfer.APPEND_ERROR_POSITION
    # A page-table entry outside the cache; the flag accumulates (never cleared by a call).
    cinfer.append_paged_kv_cache(rows[4:], rows[4:], batch_indices[4:], positions[4:],
                                 (k_cache, v_cache), torch.tensor([2, 9], dtype=I32, device=DEV),
                                 indptr, last, error_flag=flag)
    assert flag.item() == (cinfer.APPEND_ERROR_BATCH_INDEX | cinfer.APPEND_ERROR_POSITION |
                           cinfer.APPEND_ERROR_PAGE)
    # Without a flag the same rows are skipped silently (FlashInfer's signature).
    cinfer.append_paged_kv_cache(rows[4:], rows[4:], batch_indices[4:], positions[4:],
                                 (k_cache, v_cache), torch.tensor([2, 9], dtype=I32, device=DEV),
                                 indptr, last)
    assert torch.equal(k_cache, want_k)
    bad = [(dict(error_flag=torch.zeros(2, dtype=I32, device=DEV)), "error_flag: .*one int32"),
           (dict(error_flag=torch.zeros(1, device=DEV)), "error_flag: .*one int32"),
           (dict(error_flag=torch.zeros(1, dtype=I32)), "error_flag"),
           (dict(k_scale=2.0), "k_scale")]  # a float16 cache takes no scale
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            cinfer.append_paged_kv_cache(rows, rows, batch_indices, positions,
                                         (k_cache, v_cache), indices, indptr, last, **kwargs)
    with pytest.raises(TypeError, match="v_scale: str"):
        cinfer.append_paged_kv_cache(rows, rows, batch_indices, positions, (k_cache, v_cache),
                                     indices, indptr, last, v_scale="2")


def test_get_seq_lens():
    rnd = random.Random(1)
    for page_size in (1, 16, 256):
        lens, indptr, _, last = _table(rnd, 50, page_size, 50 * 6)
        got = cinfer.get_seq_lens(torch.tensor(indptr, device=DEV),  # int64, converted
                                  torch.tensor(last, dtype=I32, device=DEV), page_size)
        assert got.dtype == I32 and got.tolist() == lens  # 0 for requests without pages
    empty = cinfer.get_seq_lens(torch.zeros(1, dtype=I32, device=DEV),
                                torch.zeros(0, dtype=I32, device=DEV), 16)
    assert empty.shape == (0,)
    # Host tensors (FlashInfer's get_seq_lens is torch arithmetic): the same values, on the CPU.
    lens, indptr, _, last = _table(rnd, 30, 16, 30 * 6)
    host = cinfer.get_seq_lens(torch.tensor(indptr), torch.tensor(last, dtype=I32), 16)
    assert host.device.type == "cpu" and host.dtype == I32 and host.tolist() == lens
    with pytest.raises(ValueError, match="kv_last_page_len: tensor on cuda"):
        cinfer.get_seq_lens(torch.tensor(indptr), torch.tensor(last, device=DEV), 16)
    with pytest.raises(ValueError, match="kv_indptr: 2 entries"):
        cinfer.get_seq_lens(torch.tensor([0, 1]), torch.tensor([1, 1]), 16)


def test_get_batch_indices_positions_into_buffers():
    append_indptr = torch.tensor([0, 1, 3, 6, 10], dtype=I32, device=DEV)
    seq_lens = torch.tensor([5, 5, 5, 5], dtype=I32, device=DEV)
    bi = torch.full((12,), 99, dtype=I32, device=DEV)
    pos = torch.full((12,), 99, dtype=I32, device=DEV)
    out = cinfer.get_batch_indices_positions(append_indptr, seq_lens, 12, bi, pos)
    assert out[0] is bi and out[1] is pos
    assert bi.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, -1, -1]
    assert pos.tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4, -1, -1]


def test_page_errors():
    hk, d, page_size = 2, 64, 16
    k_cache = torch.zeros(4, page_size, hk, d, device=DEV).half()
    rows = torch.zeros(3, hk, d, device=DEV).half()
    idx = torch.zeros(3, dtype=I32, device=DEV)
    indptr = torch.tensor([0, 1], dtype=I32, device=DEV)
    last = torch.ones(1, dtype=I32, device=DEV)
    ok = dict(kv_indices=idx, kv_indptr=indptr, kv_last_page_len=last)
    append = cinfer.append_paged_kv_cache
    with pytest.raises(ValueError, match="kv_layout"):
        append(rows, rows, idx, idx, (k_cache, k_cache), kv_layout="HDN", **ok)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        append(rows, rows, idx, idx, (k_cache,), **ok)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        append(rows, rows, idx, idx, k_cache, **ok)  # 4-d where the combined cache is 5-d
    with pytest.raises(ValueError, match="positions"):
        append(rows, rows, idx, idx.float(), (k_cache, k_cache), **ok)
    with pytest.raises(ValueError, match="append_key.*cpu"):
        append(rows.cpu(), rows, idx, idx, (k_cache, k_cache), **ok)
    with pytest.raises(ValueError, match="v_cache"):
        append(rows, rows, idx, idx, (k_cache, k_cache[:, :, :1]), **ok)  # v with other heads
    with pytest.raises(TypeError, match="append_value"):
        append(rows, None, idx, idx, (k_cache, k_cache), **ok)
    with pytest.raises(ValueError, match="page_size"):
        cinfer.get_seq_lens(indptr, last, 0)
    with pytest.raises(ValueError, match="nnz"):
        cinfer.get_batch_indices_positions(indptr, last, -1)
    with pytest.raises(TypeError, match="page_size: float"):
        cinfer.get_seq_lens(indptr, last, 16.0)
    with pytest.raises(TypeError, match="nnz: str"):
        cinfer.get_batch_indices_positions(indptr, last, "4")
    with pytest.raises(ValueError, match="batch_indices"):
        cinfer.get_batch_indices_positions(indptr, last, 4, torch.zeros(3, dtype=I32,
                                                                        device=DEV))
