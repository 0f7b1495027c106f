"""Merging attention states (FlashInfer's ``flashinfer.cascade`` merge functions).

An attention state is the pair ``(v, s)`` of a partial attention result over a subset of the KV
positions: ``v`` is the softmax-weighted sum of the values over that subset and
``s = log2(sum_j exp(logit_j))`` its log-sum-exp **in base 2**, the convention of cinfer and
FlashInfer. States over disjoint subsets merge exactly::

    s = log2(2**s_a + 2**s_b)
    v = (2**s_a * v_a + 2**s_b * v_b) / 2**s

An empty state has ``s = -inf`` (and any finite ``v``); it contributes nothing, and two empty states
merge to ``(0, -inf)`` -- never NaN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from . import _dispatch
from . import _lib
from . import _tensor as T
from .errors import ArgumentError

if TYPE_CHECKING:  # annotations only: torch is imported lazily
    import torch

_VALUE_DTYPES_TEXT = "torch.float16 or torch.bfloat16"


def _value_dtypes():
    torch = T.torch_module()
    return (torch.float16, torch.bfloat16)


def _check_state(v, s, v_name: str, s_name: str, device=None, v_ndim: int = 3):
    """Checks one state and returns it as tensors: v [..., H, D] fp16/bf16, s [..., H] float32,
    both CUDA, s's shape = v's shape without the last dim."""
    torch = T.torch_module()
    v = T.as_tensor(v, v_name)
    s = T.as_tensor(s, s_name)
    T.check_cuda(v, v_name, device)
    T.check_cuda(s, s_name, v.device)
    shape_text = ("[seq_len, num_heads, head_dim]" if v_ndim == 3
                  else "[seq_len, num_states, num_heads, head_dim]")
    T.check_ndim(v, v_name, v_ndim, shape_text)
    T.check_dtype(v, v_name, _value_dtypes(), _VALUE_DTYPES_TEXT)
    T.check_dtype(s, s_name, (torch.float32,), "torch.float32 (log-sum-exp, base 2)",
                  unsupported=False)
    if tuple(s.shape) != tuple(v.shape[:-1]):
        raise ArgumentError(
            f"{s_name}: shape {list(s.shape)}, expected {list(v.shape[:-1])} "
            f"({v_name}'s shape without head_dim)"
        )
    return v, s


def _check_same(v, v_name: str, ref, ref_name: str) -> None:
    if v.dtype != ref.dtype:
        raise ArgumentError(f"{v_name}: dtype {v.dtype}, expected {ref.dtype} (as {ref_name})")
    if tuple(v.shape) != tuple(ref.shape):
        raise ArgumentError(
            f"{v_name}: shape {list(v.shape)}, expected {list(ref.shape)} (as {ref_name})"
        )


def merge_state(v_a, s_a, v_b, s_b) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Merge two attention states.

    Parameters
    ----------
    v_a : torch.Tensor
        Values of state a, shape ``[seq_len, num_heads, head_dim]``, float16 or bfloat16, CUDA.
        The last dimension must be contiguous; rows may be strided.
    s_a : torch.Tensor
        Log-sum-exp of state a, **base 2**, shape ``[seq_len, num_heads]``, float32.
        ``-inf`` marks an empty state.
    v_b : torch.Tensor
        Values of state b, same shape and dtype as ``v_a``.
    s_b : torch.Tensor
        Log-sum-exp of state b, base 2, shape ``[seq_len, num_heads]``, float32.

    Returns
    -------
    V : torch.Tensor
        Merged values, shape ``[seq_len, num_heads, head_dim]``, dtype of ``v_a``.
    S : torch.Tensor
        Merged log-sum-exp, base 2, shape ``[seq_len, num_heads]``, float32
        (``-inf`` where both inputs are empty; ``V`` is 0 there).

    Raises
    ------
    TypeError
        An argument is not a tensor.
    ValueError
        Wrong dtype, shape or device (not CUDA, or not all on one device), naming the argument;
        :class:`cinfer.UnsupportedError` (a ValueError) for dtypes cinfer does not implement.
    cinfer.CinferError
        CUDA or JIT failures (:class:`cinfer.CompileError`, :class:`cinfer.NoDeviceError`).

    Notes
    -----
    The work is enqueued on PyTorch's current CUDA stream of the tensors' device.
    """
    if _dispatch.compiling():
        return _dispatch.op("merge_state")(v_a, s_a, v_b, s_b)
    _dispatch.ensure_registered()
    return merge_state_impl(v_a, s_a, v_b, s_b)


def merge_state_impl(v_a, s_a, v_b, s_b):
    """:func:`merge_state`'s eager implementation (also the ``cinfer::merge_state`` operator's)."""
    torch = T.torch_module()
    v_a, s_a = _check_state(v_a, s_a, "v_a", "s_a")
    v_b, s_b = _check_state(v_b, s_b, "v_b", "s_b", v_a.device)
    _check_same(v_b, "v_b", v_a, "v_a")
    v_out = torch.empty(v_a.shape, dtype=v_a.dtype, device=v_a.device)
    s_out = torch.empty(s_a.shape, dtype=torch.float32, device=v_a.device)
    dls = [T.to_dl(t) for t in (v_a, s_a, v_b, s_b, v_out, s_out)]  # dtypes checked above
    ctx = T.context_of(v_a.device)
    _lib.check(
        _lib.lib().cinfer_merge_state(ctx, *[T.ref(d) for d in dls], T.stream_of(v_a.device)),
        "merge_state",
    )
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None) -> None:
    r"""Merge state ``(v_other, s_other)`` into ``(v, s)`` in place.

    Parameters
    ----------
    v : torch.Tensor
        Values of the state to update, shape ``[seq_len, num_heads, head_dim]``, float16 or
        bfloat16, CUDA; overwritten with the merged values.
    s : torch.Tensor
        Log-sum-exp of that state, **base 2**, shape ``[seq_len, num_heads]``, float32;
        overwritten with the merged log-sum-exp.
    v_other : torch.Tensor
        Values of the other state, same shape and dtype as ``v``.
    s_other : torch.Tensor
        Log-sum-exp of the other state, base 2, shape ``[seq_len, num_heads]``, float32.
    mask : Optional[torch.Tensor]
        ``[seq_len]`` bool (or uint8) on the same device: only rows where it is true (nonzero)
        are merged, the others are left untouched. ``None`` (default) merges every row. A device
        mask keeps the call free of host synchronization, e.g. inside CUDA graphs.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        As :func:`merge_state`.
    """
    if _dispatch.compiling():
        _dispatch.op("merge_state_in_place")(v, s, v_other, s_other, mask)
        return
    _dispatch.ensure_registered()
    merge_state_in_place_impl(v, s, v_other, s_other, mask)


def merge_state_in_place_impl(v, s, v_other, s_other, mask) -> None:
    """:func:`merge_state_in_place`'s eager implementation (also the operator's)."""
    torch = T.torch_module()
    v, s = _check_state(v, s, "v", "s")
    v_other, s_other = _check_state(v_other, s_other, "v_other", "s_other", v.device)
    _check_same(v_other, "v_other", v, "v")
    dl_mask = None
    if mask is not None:
        mask = T.as_tensor(mask, "mask")
        T.check_cuda(mask, "mask", v.device)
        T.check_dtype(mask, "mask", (torch.bool, torch.uint8), "torch.bool or torch.uint8",
                      unsupported=False)
        if tuple(mask.shape) != (v.shape[0],):
            raise ArgumentError(
                f"mask: shape {list(mask.shape)}, expected [{v.shape[0]}] (seq_len of v)"
            )
        dl_mask = T.to_dl(mask)
    dls = [T.to_dl(t) for t in (v, s, v_other, s_other)]
    ctx = T.context_of(v.device)
    _lib.check(
        _lib.lib().cinfer_merge_state_in_place(
            ctx, *[T.ref(d) for d in dls], T.ref(dl_mask), T.stream_of(v.device)
        ),
        "merge_state_in_place",
    )


def merge_states(v, s) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Merge any number of attention states per row.

    Parameters
    ----------
    v : torch.Tensor
        Values, shape ``[seq_len, num_states, num_heads, head_dim]``, float16 or bfloat16, CUDA.
    s : torch.Tensor
        Log-sum-exp, **base 2**, shape ``[seq_len, num_states, num_heads]``, float32.
        ``num_states`` may be 0 (every output row is then ``(0, -inf)``).

    Returns
    -------
    V : torch.Tensor
        Merged values, shape ``[seq_len, num_heads, head_dim]``, dtype of ``v``.
    S : torch.Tensor
        Merged log-sum-exp, base 2, shape ``[seq_len, num_heads]``, float32.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        As :func:`merge_state`.
    """
    if _dispatch.compiling():
        return _dispatch.op("merge_states")(v, s)
    _dispatch.ensure_registered()
    return merge_states_impl(v, s)


def merge_states_impl(v, s):
    """:func:`merge_states`'s eager implementation (also the ``cinfer::merge_states``
    operator's)."""
    torch = T.torch_module()
    v, s = _check_state(v, s, "v", "s", v_ndim=4)
    n, _, h, d = v.shape
    v_out = torch.empty((n, h, d), dtype=v.dtype, device=v.device)
    s_out = torch.empty((n, h), dtype=torch.float32, device=v.device)
    dls = [T.to_dl(t) for t in (v, s, v_out, s_out)]
    ctx = T.context_of(v.device)
    _lib.check(
        _lib.lib().cinfer_merge_states(ctx, *[T.ref(d) for d in dls], T.stream_of(v.device)),
        "merge_states",
    )
    return v_out, s_out
