"""Bit packing of boolean masks (FlashInfer's ``flashinfer.quantization``): the packed form
attention masks use, with ``numpy.packbits`` semantics per array or per segment.

Bit orders: ``"big"`` (numpy's and FlashInfer's default) puts element ``8b + k`` in bit
``7 - k`` of byte ``b``; ``"little"`` in bit ``k`` (the order of cinfer's packed masks). The
unused bits of a last partial byte are 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from . import _args as A
from . import _dispatch
from . import _lib
from . import _tensor as T
from .errors import ArgumentError

if TYPE_CHECKING:  # annotations only: torch is imported lazily
    import torch

_BITORDERS = {"little": 0, "big": 1}  # cinfer_bitorder_t


def _bitorder(value) -> int:
    if value not in _BITORDERS:
        raise ArgumentError(f"bitorder = {value!r}, expected 'big' or 'little'")
    return _BITORDERS[value]


def _bits(x):
    """``x`` as a contiguous 1-d bool/uint8 CUDA tensor; another dtype (a float or int mask such
    as ``torch.tril(torch.ones(...))``) becomes bool first (nonzero = 1), as FlashInfer does."""
    torch = T.torch_module()
    x = T.as_tensor(x, "x")
    T.check_cuda(x, "x")
    T.check_ndim(x, "x", 1, "[n] binary values")
    if x.dtype not in (torch.bool, torch.uint8):
        x = x != 0
    return x.contiguous()


def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    r"""Pack a binary array into bits, like ``numpy.packbits``.

    Parameters
    ----------
    x : torch.Tensor
        ``[n]`` binary values, CUDA: bool, or any dtype with nonzero = 1 (converted to bool
        first, as in FlashInfer). ``n`` may be 0.
    bitorder : str
        ``"big"`` (default) or ``"little"``.

    Returns
    -------
    y : torch.Tensor
        ``[(n + 7) // 8]`` uint8.

    Raises
    ------
    TypeError
        ``x`` is not a tensor.
    ValueError
        ``x`` not 1-d, not bool/uint8 or not on a CUDA device; a bad ``bitorder``.
    cinfer.CinferError
        CUDA or JIT failures.

    Notes
    -----
    Asynchronous on PyTorch's current CUDA stream, no host synchronization.
    """
    if _dispatch.compiling():
        return _dispatch.op("packbits")(x, bitorder)
    _dispatch.ensure_registered()
    return packbits_impl(x, bitorder)


def packbits_impl(x, bitorder):
    """:func:`packbits`' eager implementation (also the ``cinfer::packbits`` operator's)."""
    torch = T.torch_module()
    order = _bitorder(bitorder)
    x = _bits(x)
    y = torch.empty(((x.shape[0] + 7) // 8,), dtype=torch.uint8, device=x.device)
    _lib.check(
        _lib.lib().cinfer_packbits(T.context_of(x.device), T.ref(T.to_dl(x, "x")), order,
                                   T.ref(T.to_dl(y, "y")), T.stream_of(x.device)),
        "packbits",
    )
    return y


def segment_packbits(x: torch.Tensor, indptr: torch.Tensor,
                     bitorder: str = "big") -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Pack each segment ``x[indptr[s]:indptr[s+1]]`` of a binary array into its own bytes.

    Parameters
    ----------
    x : torch.Tensor
        ``[n]`` binary values (as :func:`packbits`'s ``x``), CUDA, normally ``n = indptr[-1]``.
    indptr : torch.Tensor
        ``[batch_size + 1]`` int32 (int64 is converted), non-decreasing, with
        ``indptr[-1] - indptr[0] <= n``.
    bitorder : str
        ``"big"`` (default) or ``"little"``.

    Returns
    -------
    y : torch.Tensor
        ``[new_indptr[-1]]`` uint8: ``y[new_indptr[s]:new_indptr[s+1]]`` holds segment ``s``.
    new_indptr : torch.Tensor
        ``[batch_size + 1]`` int32, ``new_indptr[s+1] - new_indptr[s] = (len_s + 7) // 8``.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        As :func:`packbits`; ValueError also when ``indptr`` covers more than ``n`` elements.

    Notes
    -----
    The output size is known only on the device: like FlashInfer, this reads
    ``new_indptr[-1]`` back (a host synchronization), so it cannot be captured in a CUDA
    graph; under torch.compile the output size is data-dependent.
    """
    if _dispatch.compiling():
        return _dispatch.op("segment_packbits")(x, indptr, bitorder)
    _dispatch.ensure_registered()
    return segment_packbits_impl(x, indptr, bitorder)


def segment_packbits_impl(x, indptr, bitorder):
    """:func:`segment_packbits`' eager implementation (also the operator's)."""
    torch = T.torch_module()
    order = _bitorder(bitorder)
    x = _bits(x)
    indptr = A.index_tensor(indptr, "indptr", x.device)
    T.check_ndim(indptr, "indptr", 1, "[batch_size + 1]")
    if indptr.shape[0] < 1:
        raise ArgumentError("indptr: 0 entries, expected batch_size + 1 >= 1")
    batch_size = indptr.shape[0] - 1
    # Enough for any segmentation of at most n elements (cinfer.h).
    capacity = (x.shape[0] + 7 * batch_size) // 8
    y = torch.empty((capacity,), dtype=torch.uint8, device=x.device)
    new_indptr = torch.empty((batch_size + 1,), dtype=torch.int32, device=x.device)
    _lib.check(
        _lib.lib().cinfer_segment_packbits(
            T.context_of(x.device), T.ref(T.to_dl(x, "x")), T.ref(T.to_dl(indptr, "indptr")),
            order, T.ref(T.to_dl(y, "y")), T.ref(T.to_dl(new_indptr, "new_indptr")),
            T.stream_of(x.device)),
        "segment_packbits",
    )
    total = int(new_indptr[-1].item())
    if total > capacity:
        raise ArgumentError(
            f"indptr: the segments pack into {total} bytes, more than the {capacity} that "
            f"{x.shape[0]} elements of x can fill: indptr[-1] - indptr[0] must be at most "
            "len(x)"
        )
    return y[:total], new_indptr


__all__ = ["packbits", "segment_packbits"]
