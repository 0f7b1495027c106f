"""cinfer._tensor.DLSlot, the reusable DLTensor of run() hot paths (CPU tensors: no GPU needed,
only PyTorch): a tensor of the bound layout only moves the data pointer, anything else is a
miss to check and bind."""

import ctypes

import pytest

torch = pytest.importorskip("torch")

from cinfer import _lib  # noqa: E402
from cinfer import _tensor as T  # noqa: E402


def view(ref):
    dl = ctypes.cast(ref, ctypes.POINTER(_lib.DLTensor)).contents
    return (dl.data, [dl.shape[i] for i in range(dl.ndim)],
            [dl.strides[i] for i in range(dl.ndim)], dl.dtype.bits)


class _DLPackOnly:
    """An object that speaks DLPack but is no torch.Tensor (as a NumPy array would be)."""

    def __dlpack__(self, stream=None):  # pragma: no cover - never called by lookup
        raise AssertionError("lookup must not convert")

    def __dlpack_device__(self):  # pragma: no cover
        return (1, 0)


def test_slot_moves_the_pointer_for_the_bound_layout_only():
    slot = T.DLSlot("q")
    a = torch.randn(4, 3, 8, dtype=torch.float16)
    assert slot.lookup(a) is None  # nothing bound yet
    ref = slot.bind(a)
    assert view(ref) == (a.data_ptr(), [4, 3, 8], [24, 8, 1], 16)
    b = torch.randn(4, 3, 8, dtype=torch.float16)
    assert slot.lookup(b) is ref
    assert view(ref)[0] == b.data_ptr()
    wide = torch.randn(4, 6, 8, dtype=torch.float16)
    for other in (wide[:, :3],                             # other strides
                  torch.randn(5, 3, 8, dtype=torch.float16),  # other shape
                  a.float(),                                  # other dtype
                  _DLPackOnly(),                              # not a tensor
                  a.tolist(),
                  "q"):
        assert slot.lookup(other) is None
    assert view(ref)[0] == b.data_ptr()  # a miss leaves the struct alone
    ref2 = slot.bind(wide[:, 3:])
    assert view(ref2) == (wide[:, 3:].data_ptr(), [4, 3, 8], [48, 8, 1], 16)
    assert slot.lookup(wide[:, :3]) is ref2
    assert view(ref2)[0] == wide.data_ptr()
