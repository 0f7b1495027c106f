"""Rotary position embeddings (FlashInfer's ``flashinfer.rope``) applied to q and k.

For a token at position ``p``, the first ``rotary_dim`` elements of every q and k head row are
rotated in pairs: pair ``j`` is ``(x[j], x[j + rotary_dim/2])`` (rotate-half, Llama/GPT-NeoX,
the default) or ``(x[2j], x[2j+1])`` with ``interleave=True`` (GPT-J), by the angle
``a = p * f_j``::

    out_first  = x_first * cos(a) - x_second * sin(a)
    out_second = x_second * cos(a) + x_first * sin(a)

The remaining elements are copied. Frequencies: ``f_j = rope_theta ** (-2j / rotary_dim) /
rope_scale``; the Llama 3.1 functions blend ``base_j = rope_theta ** (-2j / rotary_dim)`` and
``base_j / rope_scale`` by wavelength (``low_freq_factor``, ``high_freq_factor``,
``old_context_len``), as Llama 3.1's reference code does. Frequencies and angles are computed
in float64, the rotation in float32, rounded once to q's dtype: exact within float32 noise even
at positions in the millions.

Common arguments: ``q`` ``[nnz, num_q_heads, head_dim]`` and ``k`` ``[nnz, num_k_heads,
head_dim]``, float16 or bfloat16 (one dtype), CUDA, any token and head strides with a
contiguous last dim (slices of a packed QKV tensor work); head_dim up to 1024; ``rotary_dim``
even, at most ``min(head_dim, 512)`` (None = head_dim). Index tensors are int32 (int64 is
converted on the device). Every function is asynchronous on PyTorch's current CUDA stream with
no host synchronization. Errors: TypeError for a non-tensor, or a number argument of another
type (a string or a bool; a float for ``rotary_dim`` or ``head_size``); ValueError naming the
argument for a wrong shape, dtype, device or value (:class:`cinfer.UnsupportedError` beyond the
limits above); :class:`cinfer.CinferError` for CUDA or JIT failures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from . import _args as A
from . import _dispatch
from . import _lib
from . import _tensor as T
from .errors import ArgumentError

if TYPE_CHECKING:  # annotations only: torch is imported lazily
    import torch

_NO_LLAMA31 = (1.0, 4.0, 8192.0)  # unused frequency fields of the plain functions


def _rope(q, k, indptr, offsets, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
          llama31, factors, inplace):
    """Routes one RoPE call: the operator while torch.compile traces, else the library."""
    # Plain Python numbers, as the operators' schemas take them (FlashInfer's defaults are ints),
    # each checked for its type (A.integer, A.real: a string or a bool is a TypeError).
    args = (q, k, indptr, offsets, pos_ids,
            0 if rotary_dim is None else A.integer(rotary_dim, "rotary_dim"), bool(interleave),
            A.real(rope_scale, "rope_scale"), A.real(rope_theta, "rope_theta"), llama31,
            A.real(factors[0], "low_freq_factor"), A.real(factors[1], "high_freq_factor"),
            A.real(factors[2], "old_context_len"))
    if _dispatch.compiling():
        return _dispatch.op("rope_inplace" if inplace else "rope")(*args)
    _dispatch.ensure_registered()
    return rope_impl(*args, inplace=inplace)


def rope_impl(q, k, indptr, offsets, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
              llama31, low_freq_factor, high_freq_factor, old_context_len, inplace=False):
    """The eager implementation of the RoPE family (also the ``cinfer::rope`` and
    ``cinfer::rope_inplace`` operators'): by ragged batch (``indptr``, ``offsets``) or by
    ``pos_ids``; returns ``(q_rope, k_rope)``, or None in place."""
    torch = T.torch_module()
    q = T.as_tensor(q, "q")
    k = T.as_tensor(k, "k")
    T.check_cuda(q, "q")
    T.check_cuda(k, "k", q.device)
    T.check_ndim(q, "q", 3, "[nnz, num_q_heads, head_dim]")
    T.check_ndim(k, "k", 3, "[nnz, num_k_heads, head_dim]")
    T.check_dtype(q, "q", A.q_dtypes(), A.Q_DTYPES_TEXT)
    if k.dtype != q.dtype:
        raise ArgumentError(f"k: dtype {k.dtype}, expected {q.dtype} (as q)")
    rotary_dim = int(rotary_dim)
    if rotary_dim < 0:
        raise ArgumentError(f"rotary_dim = {rotary_dim}, expected None or an even value >= 2")
    fields = dict(
        rotary_dim=rotary_dim,
        interleave=1 if interleave else 0,
        rope_scale=A.positive(rope_scale, "rope_scale", 1.0),
        rope_theta=A.positive(rope_theta, "rope_theta", 1e4),
    )
    if llama31:
        fields.update(
            low_freq_factor=A.positive(low_freq_factor, "low_freq_factor", 1.0),
            high_freq_factor=A.positive(high_freq_factor, "high_freq_factor", 4.0),
            old_context_len=A.positive(old_context_len, "old_context_len", 8192.0),
        )
    opts = _lib.rope_options(llama31, **fields)
    device = q.device
    if inplace:
        q_out = k_out = None
    else:
        q_out = torch.empty(q.shape, dtype=q.dtype, device=device)
        k_out = torch.empty(k.shape, dtype=k.dtype, device=device)
    dl_q_out = T.to_dl(q_out, "q_rope") if q_out is not None else None
    dl_k_out = T.to_dl(k_out, "k_rope") if k_out is not None else None
    lib = _lib.lib()
    common = (T.context_of(device), T.ref(opts), T.ref(T.to_dl(q, "q")), T.ref(T.to_dl(k, "k")),
              T.ref(dl_q_out), T.ref(dl_k_out))
    if pos_ids is not None:
        pos_ids = A.index_tensor(pos_ids, "pos_ids", device)
        fn = lib.cinfer_apply_llama31_rope_pos_ids if llama31 else lib.cinfer_apply_rope_pos_ids
        status = fn(*common, T.ref(T.to_dl(pos_ids, "pos_ids")), T.stream_of(device))
    else:
        indptr = A.index_tensor(indptr, "indptr", device)
        offsets = A.index_tensor(offsets, "offsets", device)
        fn = lib.cinfer_apply_llama31_rope if llama31 else lib.cinfer_apply_rope
        status = fn(*common, T.ref(T.to_dl(indptr, "indptr")),
                    T.ref(T.to_dl(offsets, "offsets")), T.stream_of(device))
    _lib.check(status, "apply_llama31_rope" if llama31 else "apply_rope")
    return None if inplace else (q_out, k_out)


# ---- by ragged batch: token i of request b is at offsets[b] + i - indptr[b] ----

def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""RoPE on a ragged batch: token ``i`` of request ``b`` (``indptr[b] <= i < indptr[b+1]``)
    is at position ``offsets[b] + i - indptr[b]``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[nnz, num_q_heads, head_dim]`` and ``[nnz, num_k_heads, head_dim]`` (module notes).
    indptr : torch.Tensor
        ``[batch_size + 1]`` int32, non-decreasing (normally from 0 to nnz). Tokens no request
        covers are copied unrotated.
    offsets : torch.Tensor
        ``[batch_size]`` int32: the position of each request's first token.
    rotary_dim : Optional[int]
        Elements rotated (even); None = head_dim.
    interleave : bool
        False (default): rotate-half pairs; True: interleaved pairs.
    rope_scale : float
        > 0; frequencies are divided by it (position interpolation). Default 1.
    rope_theta : float
        > 0, the frequency base. Default 1e4.

    Returns
    -------
    q_rope, k_rope : torch.Tensor
        New tensors, the shapes and dtype of ``q`` and ``k``.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        See the module notes.
    """
    return _rope(q, k, indptr, offsets, None, rotary_dim, interleave, rope_scale, rope_theta,
                 False, _NO_LLAMA31, False)


def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    r""":func:`apply_rope` writing the rotated values back into ``q`` and ``k``.

    Parameters and errors as :func:`apply_rope`; returns None.
    """
    _rope(q, k, indptr, offsets, None, rotary_dim, interleave, rope_scale, rope_theta, False,
          _NO_LLAMA31, True)


def apply_llama31_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r""":func:`apply_rope` with Llama 3.1 frequencies.

    Parameters
    ----------
    q, k, indptr, offsets, rotary_dim, interleave
        As :func:`apply_rope`.
    rope_scale : float
        > 0, the factor low frequencies are divided by. Default 8.
    rope_theta : float
        > 0, the frequency base. Default 5e5.
    low_freq_factor : float
        > 0. Default 1.
    high_freq_factor : float
        > ``low_freq_factor``. Default 4.
    old_context_len : int
        > 0, the pre-training context length. Default 8192.

    Returns
    -------
    q_rope, k_rope : torch.Tensor
        New tensors, the shapes and dtype of ``q`` and ``k``.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        See the module notes.
    """
    return _rope(q, k, indptr, offsets, None, rotary_dim, interleave, rope_scale, rope_theta,
                 True, (low_freq_factor, high_freq_factor, old_context_len), False)


def apply_llama31_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    r""":func:`apply_llama31_rope` writing the rotated values back into ``q`` and ``k``.

    Parameters and errors as :func:`apply_llama31_rope`; returns None.
    """
    _rope(q, k, indptr, offsets, None, rotary_dim, interleave, rope_scale, rope_theta, True,
          (low_freq_factor, high_freq_factor, old_context_len), True)


# ---- by explicit positions: token i is at pos_ids[i] ----

def apply_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""RoPE with explicit positions: token ``i`` is at position ``pos_ids[i]``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[nnz, num_q_heads, head_dim]`` and ``[nnz, num_k_heads, head_dim]`` (module notes).
    pos_ids : torch.Tensor
        ``[nnz]`` int32 (int64 is converted; values must fit in int32, negative ones included).
    rotary_dim, interleave, rope_scale, rope_theta
        As :func:`apply_rope`.

    Returns
    -------
    q_rope, k_rope : torch.Tensor
        New tensors, the shapes and dtype of ``q`` and ``k``.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        See the module notes.
    """
    return _rope(q, k, None, None, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                 False, _NO_LLAMA31, False)


def apply_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    r""":func:`apply_rope_pos_ids` writing the rotated values back into ``q`` and ``k``.

    Parameters and errors as :func:`apply_rope_pos_ids`; returns None.
    """
    _rope(q, k, None, None, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, False,
          _NO_LLAMA31, True)


def apply_llama31_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r""":func:`apply_rope_pos_ids` with Llama 3.1 frequencies (arguments as
    :func:`apply_llama31_rope`).

    Returns
    -------
    q_rope, k_rope : torch.Tensor
        New tensors, the shapes and dtype of ``q`` and ``k``.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        See the module notes.
    """
    return _rope(q, k, None, None, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                 True, (low_freq_factor, high_freq_factor, old_context_len), False)


def apply_llama31_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    r""":func:`apply_llama31_rope_pos_ids` writing the rotated values back into ``q`` and
    ``k``. Parameters and errors as there; returns None."""
    _rope(q, k, None, None, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, True,
          (low_freq_factor, high_freq_factor, old_context_len), True)


# ---- from a precomputed cos/sin table (the vLLM / SGLang layout) ----

def _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    args = (positions, query, key, A.integer(head_size, "head_size"), cos_sin_cache,
            bool(is_neox))
    if _dispatch.compiling():
        name = "rope_cos_sin_cache_inplace" if inplace else "rope_cos_sin_cache"
        return _dispatch.op(name)(*args)
    _dispatch.ensure_registered()
    return rope_cos_sin_cache_impl(*args, inplace=inplace)


def _per_head(t, name: str, head_size: int):
    """``t`` ``[nnz, heads * head_size]`` or ``[nnz, heads, head_size]`` as a 3-d view."""
    if t.dim() == 3:
        if t.shape[2] != head_size:
            raise ArgumentError(
                f"{name}: shape {list(t.shape)}, expected [nnz, num_heads, {head_size}] "
                f"(head_size = {head_size})")
        return t
    T.check_ndim(t, name, 2, f"[nnz, num_heads * head_size] (head_size = {head_size})")
    if t.shape[1] % head_size != 0:
        raise ArgumentError(
            f"{name}: shape {list(t.shape)}: {t.shape[1]} is not a multiple of "
            f"head_size = {head_size}")
    if t.shape[1] > 0 and t.stride(1) != 1:
        raise ArgumentError(f"{name}: the last dimension must be contiguous "
                            f"(stride {t.stride(1)})")
    # A row-strided 2-d tensor always has this 3-d view.
    return t.view(t.shape[0], t.shape[1] // head_size, head_size)


def rope_cos_sin_cache_impl(positions, query, key, head_size, cos_sin_cache, is_neox,
                            inplace=False):
    """The eager implementation of :func:`apply_rope_with_cos_sin_cache` and its in-place
    form (also the operators'): returns ``(query_out, key_out)`` shaped like the inputs, or
    None in place."""
    torch = T.torch_module()
    query = T.as_tensor(query, "query")
    key = T.as_tensor(key, "key")
    cos_sin_cache = T.as_tensor(cos_sin_cache, "cos_sin_cache")
    T.check_cuda(query, "query")
    device = query.device
    T.check_cuda(key, "key", device)
    T.check_cuda(cos_sin_cache, "cos_sin_cache", device)
    head_size = int(head_size)
    if head_size < 1:
        raise ArgumentError(f"head_size = {head_size}, expected >= 1")
    T.check_dtype(query, "query", A.q_dtypes(), A.Q_DTYPES_TEXT)
    if key.dtype != query.dtype:
        raise ArgumentError(f"key: dtype {key.dtype}, expected {query.dtype} (as query)")
    T.check_dtype(cos_sin_cache, "cos_sin_cache", (torch.float32,),
                  "torch.float32 ([max_position, rotary_dim]: cos then sin)", unsupported=False)
    q3 = _per_head(query, "query", head_size)
    k3 = _per_head(key, "key", head_size)
    positions = A.index_tensor(positions, "positions", device)
    if inplace:
        query_out = key_out = None
        dl_q_out = dl_k_out = None
    else:
        query_out = torch.empty(query.shape, dtype=query.dtype, device=device)
        key_out = torch.empty(key.shape, dtype=key.dtype, device=device)
        dl_q_out = T.to_dl(_per_head(query_out, "query_out", head_size), "query_out")
        dl_k_out = T.to_dl(_per_head(key_out, "key_out", head_size), "key_out")
    _lib.check(
        _lib.lib().cinfer_apply_rope_with_cos_sin_cache(
            T.context_of(device), T.ref(T.to_dl(q3, "query")), T.ref(T.to_dl(k3, "key")),
            T.ref(dl_q_out), T.ref(dl_k_out), T.ref(T.to_dl(positions, "positions")),
            T.ref(T.to_dl(cos_sin_cache, "cos_sin_cache")), 0 if is_neox else 1,
            T.stream_of(device)),
        "apply_rope_with_cos_sin_cache",
    )
    return None if inplace else (query_out, key_out)


def apply_rope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""RoPE from a precomputed table (the vLLM / SGLang layout).

    Parameters
    ----------
    positions : torch.Tensor
        ``[nnz]`` int32 or int64 (converted): the position of each token. A position outside
        the table is never read: that token's rotated elements come out NaN, so it shows.
    query : torch.Tensor
        ``[nnz, num_q_heads * head_size]`` (or ``[nnz, num_q_heads, head_size]``), float16 or
        bfloat16, CUDA, rows may be strided, contiguous last dim.
    key : torch.Tensor
        ``[nnz, num_k_heads * head_size]`` (or 3-d), the dtype of ``query``.
    head_size : int
        The head dim.
    cos_sin_cache : torch.Tensor
        ``[max_position, rotary_dim]`` float32: row ``p`` holds ``cos(a_0 .. a_{R/2-1})`` then
        ``sin(a_0 .. a_{R/2-1})`` for position ``p``. Its width is the rotary dim (even, at
        most ``min(head_size, 512)``).
    is_neox : bool
        True (default): rotate-half pairs; False: interleaved pairs.

    Returns
    -------
    query_out, key_out : torch.Tensor
        New tensors, the shapes and dtype of ``query`` and ``key``.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        See the module notes; ValueError also for a width that does not split into heads of
        ``head_size`` or a ``cos_sin_cache`` that is not float32.
    """
    return _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, False)


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    r""":func:`apply_rope_with_cos_sin_cache` writing the rotated values back into ``query``
    and ``key``. Parameters and errors as there; returns None."""
    _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, True)


__all__ = [
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]
