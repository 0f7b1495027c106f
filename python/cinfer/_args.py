"""Argument checks shared by the attention and utility functions. Each raises the package's
exceptions with FlashInfer's argument names, before anything reaches the C library.

The functions marked *pure* touch neither ctypes nor torch, so they also run while torch.compile
traces a public function (see ``_dispatch``).
"""

from __future__ import annotations

import ctypes
import math
from typing import Optional, Tuple

from . import _lib
from . import _tensor as T
from .errors import ArgumentError, UnsupportedError

LAYOUTS = {"NHD": _lib.KV_LAYOUT_NHD, "HND": _lib.KV_LAYOUT_HND}
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")
Q_DTYPES_TEXT = "torch.float16 or torch.bfloat16"
INDEX_DTYPES_TEXT = "torch.int32 (or torch.int64, converted)"


def q_dtypes():
    """The query (and 16-bit KV) dtypes: float16, bfloat16."""
    torch = T.torch_module()
    return (torch.float16, torch.bfloat16)


def fp8_dtypes():
    """The fp8 dtypes this PyTorch build has (float8_e4m3fn, float8_e5m2)."""
    torch = T.torch_module()
    return tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def kv_layout(value) -> int:
    """*Pure.* The C layout of ``"NHD"`` / ``"HND"``; ArgumentError otherwise."""
    if value not in LAYOUTS:
        raise ArgumentError(f"kv_layout = {value!r}, expected 'NHD' or 'HND'")
    return LAYOUTS[value]


def pos_encoding_mode(mode) -> str:
    """*Pure.* ``mode`` checked: ``"NONE"``, ``"ROPE_LLAMA"`` (in-kernel RoPE, see :func:`rope`)
    or ``"ALIBI"`` (the ``"alibi"`` built-in variant with FlashInfer's default slopes); anything
    else raises ArgumentError."""
    if mode not in POS_ENCODING_MODES:
        raise ArgumentError(
            f"pos_encoding_mode = {mode!r}, expected one of {', '.join(POS_ENCODING_MODES)}"
        )
    return mode


# FlashInfer's defaults for rope_scale / rope_theta given as None.
ROPE_SCALE_DEFAULT = 1.0
ROPE_THETA_DEFAULT = 1e4


def rope(mode: str, rope_scale, rope_theta) -> Optional[Tuple[float, float]]:
    """The in-kernel RoPE of a call: None unless ``mode`` (checked by :func:`pos_encoding_mode`)
    is ``"ROPE_LLAMA"``; then ``(rope_scale, rope_theta)``, each a finite value > 0 rounded to
    float32 (the precision of the C options), None meaning FlashInfer's defaults 1 and 1e4.
    Without RoPE both are ignored unchecked, as FlashInfer ignores them."""
    if mode != "ROPE_LLAMA":
        return None
    out = []
    for name, value, default in (("rope_scale", rope_scale, ROPE_SCALE_DEFAULT),
                                 ("rope_theta", rope_theta, ROPE_THETA_DEFAULT)):
        if value is None:
            out.append(f32(default))
            continue
        # Checked after the rounding: 1e39 is inf in float32, 1e-50 is 0.
        x = f32(real(value, name, "a float or None"))
        if not math.isfinite(x) or x <= 0:
            raise ArgumentError(f"{name} = {value!r} with pos_encoding_mode='ROPE_LLAMA', "
                                "expected a finite value > 0 (in float32)")
        out.append(x)
    return out[0], out[1]


def rope_fields(rope_params: Optional[Tuple[float, float]]) -> dict:
    """The attention options' fields for :func:`rope`'s result (none without RoPE: the options'
    defaults are NONE, 1, 1e4)."""
    if rope_params is None:
        return {}
    return {"pos_encoding_mode": _lib.POS_ENCODING_ROPE_LLAMA, "rope_scale": rope_params[0],
            "rope_theta": rope_params[1]}


def f32(x: float) -> float:
    """x rounded to float32, the precision the C options hold."""
    return ctypes.c_float(x).value


def refuse_unplanned(name: str, given, planned, compared=None) -> None:
    """*Pure.* ArgumentError when an option given at run/forward (``compared``: its value as the
    plan stores it, default ``given``) differs from the ``planned`` one: the wrappers fix their
    options at plan time (changing one at run would rebuild the C object, which allocates)."""
    if (given if compared is None else compared) != planned:
        raise ArgumentError(
            f"{name} = {given!r} differs from the planned {name} = {planned!r}: cinfer fixes "
            f"it at plan time; pass plan(..., {name}={given!r})"
        )


def refuse_unplanned_scales(k_scale, v_scale, planned_k: float, planned_v: float) -> None:
    """run()'s ``k_scale`` / ``v_scale``: each one given (not None) is a number (:func:`real`)
    equal in float32 to the planned one (:func:`refuse_unplanned`)."""
    for name, given, planned in (("k_scale", k_scale, planned_k), ("v_scale", v_scale, planned_v)):
        if given is not None:
            refuse_unplanned(name, given, planned, f32(real(given, name, "a float or None")))


def refuse_backend_only(where: str, **given) -> None:
    """*Pure.* UnsupportedError for the first argument in ``given`` that is not None: arguments
    FlashInfer 0.2.14 added for its cuDNN and TensorRT-LLM backends (page tables as 2-D block
    tables, per-request lengths, maximum lengths). cinfer reads the same facts from the indptr,
    indices and last-page-length arrays, so it takes only the default rather than a second
    description that might disagree with the first."""
    for name, value in given.items():
        if value is not None:
            raise UnsupportedError(
                f"{where}: {name} is not supported (an argument of FlashInfer's cuDNN / "
                "TensorRT-LLM backends; cinfer derives it from the indptr, indices and last page "
                "lengths): pass None"
            )


def run_window_and_sinks(given_window_left, sinks, planned_window_left: int) -> None:
    """run()'s ``window_left`` and ``sinks`` (FlashInfer 0.2.14): ``window_left`` None or the
    planned value, as FlashInfer's own FA2/FA3 paths require (ArgumentError otherwise);
    ``sinks`` only None (UnsupportedError: cinfer's sinks are the built-in variant chosen at
    plan time)."""
    if given_window_left is not None:
        refuse_unplanned("window_left", given_window_left, planned_window_left,
                         window_left(given_window_left))
    if sinks is not None:
        raise UnsupportedError(
            "sinks: attention sinks given at run() are not supported; plan with "
            "variant=cinfer.variant_builtin(\"sinks\") and pass the sink tensor as run()'s "
            "variant argument"
        )


def real(value, name: str, expected: str = "a float") -> float:
    """*Pure.* ``value`` as a float: a Python or NumPy number, or a tensor of one element (a
    layer's scale); TypeError naming ``name`` (and what it ``expected``) for a string, bytes, a
    bool or anything without ``__float__``, where ``float()`` would take ``"2"`` or ``True``;
    ArgumentError for a value whose conversion fails (a tensor of several elements)."""
    if isinstance(value, (str, bytes, bool)) or not hasattr(value, "__float__"):
        raise TypeError(f"{name}: {type(value).__name__}, expected {expected}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as e:  # e.g. a tensor of several elements
        raise ArgumentError(f"{name}: {e}") from None


def integer(value, name: str) -> int:
    """*Pure.* ``value`` as an int: a Python or NumPy integer, or an integer tensor of one element
    (anything with ``__index__`` but a bool); TypeError naming ``name`` otherwise, a float too,
    where ``int()`` would cut 128.5 to 128 or take ``"32"``; ArgumentError for a value whose
    ``__index__`` fails (a float tensor, a tensor of several elements)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: {type(value).__name__}, expected an int")
    try:
        return value.__index__()
    except (TypeError, ValueError, RuntimeError) as e:
        raise ArgumentError(f"{name}: {e}") from None


def positive(value, name: str, default: Optional[float]) -> Optional[float]:
    """A finite float > 0 (:func:`real`), rounded to float32 (``default`` for None)."""
    if value is None:
        return default
    x = real(value, name, "a float or None")
    if not math.isfinite(x) or x <= 0:
        raise ArgumentError(f"{name} = {value!r}, expected a finite value > 0")
    return f32(x)


def soft_cap(value) -> float:
    """logits_soft_cap: None or 0 = off, else a finite value > 0 (:func:`real`)."""
    if value is None:
        return 0.0
    x = real(value, "logits_soft_cap", "a float or None")
    if not math.isfinite(x) or x < 0:
        raise ArgumentError(f"logits_soft_cap = {value!r}, expected None, 0 (off) or a value > 0")
    return f32(x)


def window_left(value) -> int:
    """window_left: -1 = off, else the keys kept left of the query (:func:`integer`)."""
    w = integer(value, "window_left")
    if w < -1:
        raise ArgumentError(f"window_left = {value!r}, expected -1 (off) or >= 0")
    return w


def index_tensor(t, name: str, device):
    """An index tensor as int32 on ``device``: int32 is used as is, int64 (what ``torch.tensor``
    makes by default, and what vLLM passes as positions) is converted on the device (its values
    must fit in int32); any other dtype is an ArgumentError."""
    torch = T.torch_module()
    t = T.as_tensor(t, name)
    T.check_cuda(t, name, device)
    if t.dtype == torch.int64:
        return t.to(torch.int32)
    T.check_dtype(t, name, (torch.int32,), INDEX_DTYPES_TEXT, unsupported=False)
    return t


def output(t, name: str, shape, dtype, device):
    """A caller-given output tensor, checked for shape, dtype and device."""
    t = T.as_tensor(t, name)
    T.check_cuda(t, name, device)
    if tuple(t.shape) != tuple(shape):
        raise ArgumentError(f"{name}: shape {list(t.shape)}, expected {list(shape)}")
    if t.dtype != dtype:
        raise ArgumentError(f"{name}: dtype {t.dtype}, expected {dtype}")
    return t


def paged_kv_cache(value, device):
    """``(k_cache, v_cache)`` from FlashInfer's ``paged_kv_cache`` argument (a pair of tensors,
    or one combined ``[max_num_pages, 2, ...]`` tensor, returned as ``(combined, None)``),
    checked to be CUDA tensors on ``device``."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ArgumentError(
                f"paged_kv_cache: a sequence of {len(value)} items, expected (k_cache, v_cache)"
            )
        k = T.as_tensor(value[0], "paged_kv_cache[0]")
        v = T.as_tensor(value[1], "paged_kv_cache[1]")
        T.check_cuda(k, "paged_kv_cache[0]", device)
        T.check_cuda(v, "paged_kv_cache[1]", device)
        return k, v
    kv = T.as_tensor(value, "paged_kv_cache")
    T.check_cuda(kv, "paged_kv_cache", device)
    if kv.dim() != 5 or kv.shape[1] != 2:
        raise ArgumentError(
            f"paged_kv_cache: a tensor of shape {list(kv.shape)}, expected the combined "
            "[max_num_pages, 2, ...] 5-D cache, or a tuple (k_cache, v_cache)"
        )
    return kv, None


def slot_ref(slot: "T.DLSlot", t, name: str, device, ndim: int = 0, shape_text: str = ""):
    """``(tensor, reference)`` of a hot path's argument through its reused struct: a tensor of
    the layout ``slot`` last bound (which passed these checks then) only moves the data
    pointer; anything else is checked (a tensor, or an object with ``__dlpack__``; CUDA on
    ``device``; ``ndim`` dimensions when given) and bound."""
    ref = slot.lookup(t)
    if ref is None:
        t = T.as_tensor(t, name)
        T.check_cuda(t, name, device)
        if ndim:
            T.check_ndim(t, name, ndim, shape_text)
        ref = slot.bind(t)
    return t, ref


class PagedKVSlots:
    """Reused structs for FlashInfer's ``paged_kv_cache`` argument of a wrapper's run (a
    ``(k_cache, v_cache)`` pair, or one combined tensor): :meth:`refs` of a cache of the layout
    last seen only moves the data pointers; another is checked by :func:`paged_kv_cache` and
    bound. Not thread-safe (see :class:`cinfer._tensor.DLSlot`)."""

    __slots__ = ("_kv", "_k", "_v", "_device")

    def __init__(self, device) -> None:
        self._kv = T.DLSlot("paged_kv_cache")
        self._k = T.DLSlot("paged_kv_cache[0]")
        self._v = T.DLSlot("paged_kv_cache[1]")
        self._device = device

    def refs(self, value):
        """``(k_ref, v_ref)``: the K and V caches' references, ``v_ref`` None for a combined
        ``[max_num_pages, 2, ...]`` cache."""
        if isinstance(value, (tuple, list)):
            if len(value) == 2:
                k_ref, v_ref = self._k.lookup(value[0]), self._v.lookup(value[1])
                if k_ref is not None and v_ref is not None:
                    return k_ref, v_ref
        else:
            k_ref = self._kv.lookup(value)
            if k_ref is not None:
                return k_ref, None
        k_cache, v_cache = paged_kv_cache(value, self._device)
        if v_cache is None:
            return self._kv.bind(k_cache), None
        return self._k.bind(k_cache), self._v.bind(v_cache)


def host_index(t, name: str):
    """A 1-D int32 index tensor (CPU or CUDA) checked, and its contiguous host copy (a
    device-to-host copy, which synchronizes, for a CUDA tensor)."""
    torch = T.torch_module()
    t = T.as_tensor(t, name)
    T.check_ndim(t, name, 1, "a 1-D int32 tensor")
    T.check_dtype(t, name, (torch.int32,), "torch.int32", unsupported=False)
    if t.device.type not in ("cpu", "cuda"):
        raise ArgumentError(f"{name}: tensor on {t.device}, expected CPU or CUDA")
    return t, t.to("cpu").contiguous()


def plan_dtypes(q_data_type, kv_data_type, data_type=None):
    """(q dtype, kv dtype) of a plan from FlashInfer's q_data_type / kv_data_type and the
    deprecated ``data_type`` alias (which fills whichever is None)."""
    if data_type is not None:
        if q_data_type is None:
            q_data_type = data_type
        if kv_data_type is None:
            kv_data_type = data_type
    if q_data_type is None:
        raise ArgumentError("q_data_type is None (and data_type too): give the dtype of q")
    q_dtype = T.canonical_dtype(q_data_type, "q_data_type")
    kv_dtype = q_dtype if kv_data_type is None else T.canonical_dtype(kv_data_type,
                                                                       "kv_data_type")
    return q_dtype, kv_dtype


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
