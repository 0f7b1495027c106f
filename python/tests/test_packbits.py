"""packbits and segment_packbits against a reference written here (numpy.packbits semantics):
both bit orders, bool and uint8 inputs, lengths around byte and vector boundaries, empty
segments, int64 indptr, errors."""

import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402

DEV = "cuda"


def _pack(bits, bitorder):
    """numpy.packbits of a 1-d 0/1 tensor: element 8b + k is bit 7 - k (big) or k (little) of
    byte b; the last byte is padded with zeros."""
    n = bits.shape[0]
    padded = torch.zeros(((n + 7) // 8) * 8, dtype=torch.int64, device=bits.device)
    padded[:n] = (bits != 0).long()
    shifts = torch.arange(8, device=bits.device)
    if bitorder == "big":
        shifts = 7 - shifts
    return (padded.view(-1, 8) << shifts).sum(dim=1).to(torch.uint8)


def _input(n, dtype, gen):
    x = torch.randint(0, 2, (n,), generator=gen, device=DEV)
    if dtype == torch.uint8:
        # Any nonzero value is a 1.
        return (x * torch.randint(1, 256, (n,), generator=gen, device=DEV)).to(torch.uint8)
    return x.bool()


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 127, 128, 129, 1000, 100_003])
@pytest.mark.parametrize("bitorder", ["big", "little"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8], ids=["bool", "uint8"])
def test_packbits(dtype, bitorder, n):
    gen = torch.Generator(DEV).manual_seed(n)
    x = _input(n, dtype, gen)
    y = cinfer.packbits(x, bitorder)
    assert y.dtype == torch.uint8 and y.shape == ((n + 7) // 8,)
    assert torch.equal(y, _pack(x, bitorder))


def test_packbits_default_is_big_and_unaligned_input():
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool, device=DEV)
    assert cinfer.packbits(x).tolist() == [0b10110011]
    # A view starting at an odd byte (no 16-byte accesses) and a strided one (made contiguous).
    big = _input(1001, torch.bool, torch.Generator(DEV).manual_seed(1))
    assert torch.equal(cinfer.packbits(big[1:]), _pack(big[1:], "big"))
    assert torch.equal(cinfer.packbits(big[::3], "little"), _pack(big[::3], "little"))


@pytest.mark.parametrize("seed", range(6))
def test_segment_packbits(seed):
    rnd = random.Random(seed)
    bitorder = rnd.choice(["big", "little"])
    batch = rnd.randint(1, 40)
    lens = [rnd.choice([0, 1, 7, 8, 9, rnd.randint(0, 300)]) for _ in range(batch)]
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    gen = torch.Generator(DEV).manual_seed(seed)
    x = _input(indptr[-1], rnd.choice([torch.bool, torch.uint8]), gen)
    # int64 indptr, as torch.tensor makes it (converted).
    y, new_indptr = cinfer.segment_packbits(x, torch.tensor(indptr, device=DEV), bitorder)
    want_indptr = [0]
    for n in lens:
        want_indptr.append(want_indptr[-1] + (n + 7) // 8)
    assert new_indptr.dtype == torch.int32 and new_indptr.tolist() == want_indptr
    want = torch.cat([_pack(x[indptr[s]:indptr[s + 1]], bitorder) for s in range(batch)])
    assert y.dtype == torch.uint8 and torch.equal(y, want)


def test_segment_packbits_flashinfer_example():
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool, device=DEV)
    y, new_indptr = cinfer.segment_packbits(x, torch.tensor([0, 4, 7, 11], device=DEV))
    assert y.tolist() == [0b10110000, 0b00100000, 0b11010000]
    assert new_indptr.tolist() == [0, 1, 2, 3]
    y, new_indptr = cinfer.segment_packbits(x[:0], torch.zeros(1, dtype=torch.int32,
                                                               device=DEV))
    assert y.shape == (0,) and new_indptr.tolist() == [0]


def test_packbits_errors():
    x = torch.ones(10, dtype=torch.bool, device=DEV)
    with pytest.raises(ValueError, match="bitorder"):
        cinfer.packbits(x, "middle")
    with pytest.raises(ValueError, match="x"):
        cinfer.packbits(x.view(2, 5))
    # Another dtype is a mask with nonzero = 1, as FlashInfer's x.to(torch.bool).
    mask = torch.tensor([2.0, 0, -2, 1, 0, 0, 3, 1, 1, 0, 1], device=DEV)
    assert torch.equal(cinfer.packbits(mask), cinfer.packbits(mask != 0))
    assert torch.equal(cinfer.packbits(mask.to(torch.int32), "little"),
                       cinfer.packbits(mask != 0, "little"))
    with pytest.raises(ValueError, match="x.*cpu"):
        cinfer.packbits(x.cpu())
    with pytest.raises(TypeError, match="x"):
        cinfer.packbits([1, 0, 1])
    with pytest.raises(ValueError, match="indptr"):
        cinfer.segment_packbits(x, torch.tensor([0, 5], dtype=torch.float32, device=DEV))
    with pytest.raises(ValueError, match="indptr"):
        # Segments covering more elements than x has.
        cinfer.segment_packbits(x, torch.tensor([0, 64, 128], dtype=torch.int32, device=DEV))
