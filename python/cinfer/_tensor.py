"""PyTorch interop: tensors to DLTensor views, dtype codes, streams and argument checks.

A DLTensor is built directly from a tensor's metadata (data pointer, shape, strides, dtype,
device): no copy, no DLPack capsule, and no PyTorch at import time (torch is imported by the
first function that needs it).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, Iterable, Optional, Tuple

from . import _lib
from .errors import ArgumentError, UnsupportedError

_dtype_codes: Optional[Dict[Any, Tuple[int, int]]] = None


def torch_module():
    """The ``torch`` module, imported on first use."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "cinfer's attention functions take PyTorch tensors: install torch "
            "(the package itself imports without it)"
        ) from e
    return torch


def _codes() -> Dict[Any, Tuple[int, int]]:
    """torch dtype -> (DLPack type code, bits)."""
    global _dtype_codes
    if _dtype_codes is None:
        torch = torch_module()
        codes = {
            torch.float16: (_lib.KDL_FLOAT, 16),
            torch.bfloat16: (_lib.KDL_BFLOAT, 16),
            torch.float32: (_lib.KDL_FLOAT, 32),
            torch.float64: (_lib.KDL_FLOAT, 64),  # variant parameters
            torch.int32: (_lib.KDL_INT, 32),
            torch.int64: (_lib.KDL_INT, 64),  # variant parameters
            torch.uint8: (_lib.KDL_UINT, 8),
            torch.bool: (_lib.KDL_BOOL, 8),
        }
        # Older PyTorch builds lack the fp8 dtypes (and uint32, a variant parameter type).
        for name, code, bits in (("float8_e4m3fn", _lib.KDL_FLOAT8_E4M3FN, 8),
                                 ("float8_e5m2", _lib.KDL_FLOAT8_E5M2, 8),
                                 ("uint32", _lib.KDL_UINT, 32)):
            dt = getattr(torch, name, None)
            if dt is not None:
                codes[dt] = (code, bits)
        _dtype_codes = codes
    return _dtype_codes


def dl_dtype(dtype) -> _lib.DLDataType:
    """The DLDataType of a torch dtype; :class:`UnsupportedError` if cinfer has no equivalent."""
    cb = _codes().get(dtype)
    if cb is None:
        raise UnsupportedError(f"dtype {dtype} has no cinfer equivalent")
    return _lib.DLDataType(cb[0], cb[1], 1)


def canonical_dtype(value, name: str):
    """A torch dtype from a torch dtype or its name (``"float16"``, ``"bfloat16"``,
    ``"float8_e4m3fn"``...), as FlashInfer's plan arguments accept."""
    torch = torch_module()
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        dt = getattr(torch, value, None)
        if isinstance(dt, torch.dtype):
            return dt
        raise ArgumentError(f"{name} = {value!r} is not a torch dtype name")
    raise TypeError(f"{name}: expected a torch.dtype or its name, got {type(value).__name__}")


def as_tensor(x, name: str):
    """``x`` as a torch.Tensor: a tensor is returned as is; an object with ``__dlpack__`` is
    wrapped zero-copy with ``torch.from_dlpack``; anything else is a TypeError naming ``name``."""
    torch = torch_module()
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "__dlpack__"):
        return torch.from_dlpack(x)
    raise TypeError(
        f"{name}: expected a torch.Tensor (or an object with __dlpack__), got {type(x).__name__}"
    )


def check_cuda(t, name: str, device=None) -> None:
    """ArgumentError unless ``t`` is a CUDA tensor (on ``device`` when given)."""
    if t.device.type != "cuda":
        raise ArgumentError(f"{name}: tensor on {t.device}, expected a CUDA tensor")
    if device is not None and t.device != device:
        raise ArgumentError(f"{name}: tensor on {t.device}, expected {device}")


def check_dtype(t, name: str, allowed: Iterable, what: str, unsupported: bool = True) -> None:
    """Raises (UnsupportedError, or ArgumentError when ``unsupported`` is False) naming ``name``
    unless ``t.dtype`` is one of ``allowed``; ``what`` describes the accepted dtypes."""
    if t.dtype not in allowed:
        cls = UnsupportedError if unsupported else ArgumentError
        raise cls(f"{name}: dtype {t.dtype}, expected {what}")


def check_ndim(t, name: str, ndim: int, shape_text: str) -> None:
    if t.dim() != ndim:
        raise ArgumentError(
            f"{name}: {t.dim()} dimensions (shape {list(t.shape)}), expected {ndim}: {shape_text}"
        )


# ctypes array types of 1..8 int64s, built once (shape and strides of to_dl's structs).
_INT64_ARRAYS = tuple(ctypes.c_int64 * n for n in range(9))


def to_dl(t, name: str = "tensor") -> _lib.DLTensor:
    """A DLTensor describing torch tensor ``t`` (no copy). The shape and strides arrays are owned
    by the returned struct; ``t`` must stay alive while the DLTensor is in use. ``name`` is the
    argument named in the error for a dtype cinfer has no code for."""
    cb = _codes().get(t.dtype)
    if cb is None:
        raise UnsupportedError(f"{name}: dtype {t.dtype} has no cinfer equivalent")
    dev = t.device
    if dev.type == "cuda":
        device = _lib.DLDevice(_lib.KDL_CUDA, dev.index if dev.index is not None else 0)
    else:
        device = _lib.DLDevice(_lib.KDL_CPU, 0)
    nd = t.dim()
    arrays = _INT64_ARRAYS[nd] if nd < len(_INT64_ARRAYS) else ctypes.c_int64 * nd
    # One constructor call (the fields in order) rather than an assignment per field.
    return _lib.DLTensor(t.data_ptr() or None, device, nd, _lib.DLDataType(cb[0], cb[1], 1),
                         arrays(*t.shape), arrays(*t.stride()), 0)


def ref(dl: Optional[_lib.DLTensor]):
    """A pointer argument for a DLTensor, or NULL for None."""
    return ctypes.byref(dl) if dl is not None else None


def _raw_stream(torch, device):
    """torch's raw current-stream accessor (it builds no ``torch.cuda.Stream`` object) and the
    device index to call it with, or None where this PyTorch build lacks it or ``device`` is not a
    CUDA device (a test's CPU stand-in)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None or device.type != "cuda":
        return None
    return raw, device.index if device.index is not None else torch.cuda.current_device()


def stream_of(device) -> int:
    """The handle (CUstream) of PyTorch's current CUDA stream on ``device`` (through the raw
    accessor where there is one)."""
    torch = torch_module()
    r = _raw_stream(torch, device)
    return r[0](r[1]) if r is not None else torch.cuda.current_stream(device).cuda_stream


def context_of(device) -> ctypes.c_void_p:
    """The cinfer context of a torch CUDA device."""
    return _lib.context(device.index if device.index is not None else 0)


def stream_getter(device):
    """A function of no arguments returning the handle of PyTorch's current CUDA stream on
    ``device``, for hot paths: the raw accessor and the device index looked up once."""
    torch = torch_module()
    r = _raw_stream(torch, device)
    if r is None:  # an older PyTorch; a test's CPU stand-in (which replaces stream_of)
        return lambda: stream_of(device)
    raw, index = r
    return lambda: raw(index)


def layout_of(t) -> tuple:
    """What a tensor argument's checks and DLTensor depend on besides its data: shape, strides,
    dtype and device."""
    return (t.shape, t.stride(), t.dtype, t.device)


class CheckedCall:
    """The checked argument layout of one call of a single-request op: its options struct, the
    DLTensors of its tensors (``dl``, in the op's order; only their data pointers change from
    call to call) and references to them, its packed variant arguments, and what else the op
    keeps (``extra``, e.g. a workspace size)."""

    __slots__ = ("options", "options_ref", "dl", "refs", "packed", "extra")

    def __init__(self, options, dl, packed, extra=None) -> None:
        self.options = options
        self.options_ref = ctypes.byref(options)
        self.dl = dl
        self.refs = [ref(d) for d in dl]
        self.packed = packed
        self.extra = extra

    def rebind(self, *tensors) -> list:
        """Points the DLTensors, in order, at ``tensors`` (of the checked layouts) and returns
        their references."""
        for d, t in zip(self.dl, tensors):
            d.data = t.data_ptr() or None
        return self.refs


class LayoutCache:
    """:class:`CheckedCall` s by a key naming every input of the checks (the tensors'
    :func:`layout_of` and the scalar arguments): a call whose key an earlier call of the same
    thread put here skips the checks and rebinds that call's structs to its data (the library
    checks the arguments again either way). Per thread, since a call rewrites the structs and the
    C call releases the GIL; at most ``capacity`` keys per thread (emptied when full)."""

    def __init__(self, capacity: int) -> None:
        self._local = threading.local()
        self._capacity = capacity

    def get(self, key):
        calls = getattr(self._local, "calls", None)
        return calls.get(key) if calls is not None else None

    def put(self, key, call: CheckedCall) -> None:
        calls = getattr(self._local, "calls", None)
        if calls is None:
            calls = self._local.calls = {}
        if len(calls) >= self._capacity:
            calls.clear()
        calls[key] = call


class DLSlot:
    """A DLTensor reused by a hot path for an argument passed again and again with the same
    layout: :meth:`lookup` only updates the data pointer when the tensor has the shape, strides,
    dtype and device of the one last bound, so a call skips both the argument checks (which
    that tensor passed) and building the struct.

    Not thread-safe: the struct is shared by every call through the slot, so a C call must be
    made with it before the slot is used again.
    """

    __slots__ = ("_name", "_tensor", "_key", "_dl", "_ref")

    def __init__(self, name: str) -> None:
        self._name = name
        self._tensor = torch_module().Tensor
        self._key = None
        self._dl: Optional[_lib.DLTensor] = None
        self._ref = None

    def lookup(self, t):
        """The struct's reference pointing at ``t`` when ``t`` is a tensor of the bound layout;
        None otherwise (check ``t`` and :meth:`bind` it)."""
        if not isinstance(t, self._tensor):
            return None
        if layout_of(t) != self._key:
            return None
        self._dl.data = t.data_ptr() or None
        return self._ref

    def bind(self, t):
        """Builds the struct for ``t`` (a checked tensor) and returns its reference."""
        self._dl = to_dl(t, self._name)
        self._ref = ctypes.byref(self._dl)
        self._key = layout_of(t)
        return self._ref
