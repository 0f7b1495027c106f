"""Paged KV-cache utilities (FlashInfer's ``flashinfer.page``): appending new K/V rows to the
pages of their requests, and the page-table helpers a serving step uses around it.

Page table (CSR, ``SEMANTICS.md``): request ``b`` owns pages
``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``; position ``p`` of the request is slot
``p % page_size`` of page ``kv_indices[kv_indptr[b] + p // page_size]``. As in FlashInfer, the
page table must already include the appended tokens: allocate pages first, then append. A
typical step::

    seq_lens = get_seq_lens(kv_indptr, kv_last_page_len, page_size)      # lengths after the step
    batch_indices, positions = get_batch_indices_positions(append_indptr, seq_lens, nnz)
    append_paged_kv_cache(k, v, batch_indices, positions, (k_cache, v_cache),
                          kv_indices, kv_indptr, kv_last_page_len)       # once per layer
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _args as A
from . import _dispatch
from . import _lib
from . import _tensor as T
from .errors import ArgumentError

if TYPE_CHECKING:  # annotations only: torch is imported lazily
    import torch


def _unpack_cache(paged_kv_cache):
    """*Pure.* ``(k_cache, v_cache)`` from a tuple, or ``(combined, None)`` from one tensor."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ArgumentError(
                f"paged_kv_cache: a sequence of {len(paged_kv_cache)} items, expected "
                "(k_cache, v_cache)"
            )
        return paged_kv_cache[0], paged_kv_cache[1]
    return paged_kv_cache, None


def append_paged_kv_cache(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    kv_layout: str = "NHD",
    *,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    error_flag: Optional[torch.Tensor] = None,
) -> None:
    r"""Write new K/V rows into a paged KV cache: row ``i`` goes to request
    ``batch_indices[i]`` at position ``positions[i]``.

    Parameters
    ----------
    append_key : torch.Tensor
        The keys to append, ``[nnz, num_kv_heads, head_dim]``, float16 or bfloat16, CUDA; any
        token and head strides (e.g. a slice of a packed QKV tensor), contiguous last dim.
    append_value : torch.Tensor
        The values, the shape and dtype of ``append_key`` (strides may differ).
    batch_indices : torch.Tensor
        ``[nnz]`` int32 (int64 is converted): the request of each row. ``-1`` marks a padding
        row (e.g. of a CUDA graph captured for more tokens), which is skipped.
    positions : torch.Tensor
        ``[nnz]`` int32 (int64 is converted): the position of each row within its request.
    paged_kv_cache : tuple of two torch.Tensor, or torch.Tensor
        ``(k_cache, v_cache)``, each ``[max_num_pages, page_size, num_kv_heads, head_dim]``
        (NHD) or ``[max_num_pages, num_kv_heads, page_size, head_dim]`` (HND); or one combined
        ``[max_num_pages, 2, ...]`` tensor (index 0 = K, 1 = V). float16 or bfloat16 (rows
        are converted from the append dtype), or float8_e4m3fn / float8_e5m2 (rounded to
        nearest even, saturated). Written in place.
    kv_indices : torch.Tensor
        The page indices of every request, int32 (int64 is converted).
    kv_indptr : torch.Tensor
        ``[batch_size + 1]`` int32 (int64 is converted): request ``b`` owns
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``.
    kv_last_page_len : torch.Tensor
        ``[batch_size]`` int32 (int64 is converted); checked for shape only.
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``.
    k_scale, v_scale : float, optional
        fp8 caches only (keyword-only; None = 1): the stored value is ``row / scale``, as the
        attention calls' ``k_scale`` / ``v_scale`` read it back (``stored * scale``). Must be
        None or 1 for float16 / bfloat16 caches.
    error_flag : torch.Tensor, optional
        Keyword-only (not in FlashInfer): an int32 tensor of one element on the device, into
        which the kernel ORs :data:`APPEND_ERROR_BATCH_INDEX` (a batch index outside
        ``[0, batch_size)`` other than -1), :data:`APPEND_ERROR_POSITION` (a position outside
        the pages its request owns) and :data:`APPEND_ERROR_PAGE` (a page-table entry outside
        ``kv_indices``, or a page index outside the cache) for rows it skips. Never cleared by
        the call: zero it, append (every layer of a step, say), then read it (``.item()``
        synchronizes).

    Raises
    ------
    TypeError
        An argument is not a tensor; ``k_scale`` or ``v_scale`` is not a number (a string or a
        bool).
    ValueError
        Wrong shapes, dtypes or devices, naming the argument; :class:`cinfer.UnsupportedError`
        for a head dim above 1024.
    cinfer.CinferError
        CUDA or JIT failures.

    Notes
    -----
    Rows that cannot be written (a batch index outside ``[0, batch_size)`` other than -1, a
    position beyond the pages the request owns, a page index outside the cache) are skipped,
    never written elsewhere, and reported in ``error_flag`` when one is given (the batch
    indices and positions are device data: checking them on the host would synchronize).
    Asynchronous on PyTorch's current CUDA stream; no host synchronization, so it can be
    captured in a CUDA graph once its kernel is compiled.
    """
    k_cache, v_cache = _unpack_cache(paged_kv_cache)
    if _dispatch.compiling():
        _dispatch.op("append_paged_kv_cache")(
            append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices,
            kv_indptr, kv_last_page_len, kv_layout, k_scale, v_scale, error_flag)
        return
    _dispatch.ensure_registered()
    append_paged_kv_cache_impl(append_key, append_value, batch_indices, positions, k_cache,
                               v_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout,
                               k_scale, v_scale, error_flag)


# Bits of append_paged_kv_cache's error_flag (CINFER_APPEND_ERROR_* in cinfer.h).
APPEND_ERROR_BATCH_INDEX = 1
APPEND_ERROR_POSITION = 2
APPEND_ERROR_PAGE = 4


def _scale(value, name: str) -> float:
    """An append scale as the attention calls take theirs (:func:`cinfer._args.positive`): None
    is 1, else a finite value > 0 (rounded to float32); the C call checks that a 16-bit cache has
    none."""
    return A.positive(value, name, 1.0)


def append_paged_kv_cache_impl(append_key, append_value, batch_indices, positions, k_cache,
                               v_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout,
                               k_scale=None, v_scale=None, error_flag=None) -> None:
    """:func:`append_paged_kv_cache`'s eager implementation (also the operator's); ``v_cache``
    None means ``k_cache`` is the combined cache."""
    layout = A.kv_layout(kv_layout)
    k_scale = _scale(k_scale, "k_scale")
    v_scale = _scale(v_scale, "v_scale")
    append_key = T.as_tensor(append_key, "append_key")
    append_value = T.as_tensor(append_value, "append_value")
    T.check_cuda(append_key, "append_key")
    device = append_key.device
    T.check_cuda(append_value, "append_value", device)
    combined = v_cache is None
    k_name = "paged_kv_cache" if combined else "paged_kv_cache[0]"
    k_cache = T.as_tensor(k_cache, k_name)
    T.check_cuda(k_cache, k_name, device)
    if combined:
        T.check_ndim(k_cache, k_name, 5,
                     "the combined [max_num_pages, 2, page_size, num_kv_heads, head_dim] (NHD) "
                     "or [max_num_pages, 2, num_kv_heads, page_size, head_dim] (HND) cache, or "
                     "a tuple (k_cache, v_cache)")
    else:
        shape = ("[max_num_pages, page_size, num_kv_heads, head_dim]"
                 if layout == _lib.KV_LAYOUT_NHD
                 else "[max_num_pages, num_kv_heads, page_size, head_dim]")
        T.check_ndim(k_cache, k_name, 4, shape)
        v_cache = T.as_tensor(v_cache, "paged_kv_cache[1]")
        T.check_cuda(v_cache, "paged_kv_cache[1]", device)
    # The page dim: after [max_num_pages, (2,)] comes page_size (NHD) or num_kv_heads (HND).
    page_dim = (2 if combined else 1) + (0 if layout == _lib.KV_LAYOUT_NHD else 1)
    page_size = int(k_cache.shape[page_dim])
    if not 1 <= page_size <= 256:
        raise ArgumentError(
            f"{k_name}: page_size = {page_size} (dim {page_dim} of shape {list(k_cache.shape)} "
            f"in {kv_layout}), expected 1..256"
        )
    batch_indices = A.index_tensor(batch_indices, "batch_indices", device)
    positions = A.index_tensor(positions, "positions", device)
    kv_indices = A.index_tensor(kv_indices, "kv_indices", device)
    kv_indptr = A.index_tensor(kv_indptr, "kv_indptr", device)
    kv_last_page_len = A.index_tensor(kv_last_page_len, "kv_last_page_len", device)
    flag_ref = None
    if error_flag is not None:
        error_flag = T.as_tensor(error_flag, "error_flag")
        T.check_cuda(error_flag, "error_flag", device)
        if error_flag.dtype != T.torch_module().int32 or error_flag.numel() != 1:
            raise ArgumentError(
                f"error_flag: {error_flag.dtype} of shape {list(error_flag.shape)}, expected "
                "one int32 element"
            )
        flag_ref = T.ref(T.to_dl(error_flag.reshape(1), "error_flag"))
    opts = _lib.append_options(kv_layout=layout, page_size=page_size, k_scale=k_scale,
                               v_scale=v_scale)
    dl_v = T.to_dl(v_cache, "paged_kv_cache[1]") if v_cache is not None else None
    _lib.check(
        _lib.lib().cinfer_append_paged_kv_cache(
            T.context_of(device), ctypes.byref(opts), T.ref(T.to_dl(append_key, "append_key")),
            T.ref(T.to_dl(append_value, "append_value")),
            T.ref(T.to_dl(batch_indices, "batch_indices")),
            T.ref(T.to_dl(positions, "positions")), T.ref(T.to_dl(k_cache, k_name)),
            T.ref(dl_v), T.ref(T.to_dl(kv_indices, "kv_indices")),
            T.ref(T.to_dl(kv_indptr, "kv_indptr")),
            T.ref(T.to_dl(kv_last_page_len, "kv_last_page_len")), flag_ref, T.stream_of(device)),
        "append_paged_kv_cache",
    )


def get_batch_indices_positions(
    append_indptr: torch.Tensor,
    seq_lens: torch.Tensor,
    nnz: int,
    batch_indices: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""The request and position of each appended token of a ragged batch.

    For ``i`` in ``[append_indptr[b], append_indptr[b+1])``: ``batch_indices[i] = b`` and
    ``positions[i] = seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) +
    (i - append_indptr[b])``, i.e. the appended tokens are the last ones of their request.

    Parameters
    ----------
    append_indptr : torch.Tensor
        ``[batch_size + 1]`` int32 (int64 is converted), non-decreasing, CUDA.
    seq_lens : torch.Tensor
        ``[batch_size]`` int32 (int64 is converted): each request's KV length *after* the
        append (e.g. from :func:`get_seq_lens`).
    nnz : int
        The number of entries to fill (usually ``append_indptr[-1]``, known on the host).
    batch_indices, positions : Optional[torch.Tensor]
        ``[nnz]`` int32 CUDA buffers to write into (e.g. fixed buffers of a CUDA graph);
        allocated when None.

    Returns
    -------
    batch_indices : torch.Tensor
        ``[nnz]`` int32.
    positions : torch.Tensor
        ``[nnz]`` int32.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        As :func:`append_paged_kv_cache`; ``nnz < 0`` is a ValueError, an ``nnz`` that is not
        an int (a float, a string) a TypeError.

    Notes
    -----
    Entries no request covers (``i >= append_indptr[-1]``, e.g. padding up to a CUDA graph's
    size) get batch index -1 and position -1, which :func:`append_paged_kv_cache` skips
    (FlashInfer leaves them unwritten).
    """
    if _dispatch.compiling():
        bi, pos = _dispatch.op("get_batch_indices_positions")(append_indptr, seq_lens, nnz)
        if batch_indices is not None:
            batch_indices.copy_(bi)
            bi = batch_indices
        if positions is not None:
            positions.copy_(pos)
            pos = positions
        return bi, pos
    _dispatch.ensure_registered()
    return get_batch_indices_positions_impl(append_indptr, seq_lens, nnz, batch_indices,
                                            positions)


def get_batch_indices_positions_impl(append_indptr, seq_lens, nnz, batch_indices=None,
                                     positions=None):
    """:func:`get_batch_indices_positions`'s eager implementation (also the operator's)."""
    torch = T.torch_module()
    nnz = A.integer(nnz, "nnz")
    if nnz < 0:
        raise ArgumentError(f"nnz = {nnz}, expected >= 0")
    append_indptr = T.as_tensor(append_indptr, "append_indptr")
    T.check_cuda(append_indptr, "append_indptr")
    device = append_indptr.device
    append_indptr = A.index_tensor(append_indptr, "append_indptr", device)
    seq_lens = A.index_tensor(seq_lens, "seq_lens", device)
    if batch_indices is None:
        batch_indices = torch.empty((nnz,), dtype=torch.int32, device=device)
    else:
        batch_indices = A.output(batch_indices, "batch_indices", (nnz,), torch.int32, device)
    if positions is None:
        positions = torch.empty((nnz,), dtype=torch.int32, device=device)
    else:
        positions = A.output(positions, "positions", (nnz,), torch.int32, device)
    _lib.check(
        _lib.lib().cinfer_get_batch_indices_positions(
            T.context_of(device), T.ref(T.to_dl(append_indptr, "append_indptr")),
            T.ref(T.to_dl(seq_lens, "seq_lens")), T.ref(T.to_dl(batch_indices, "batch_indices")),
            T.ref(T.to_dl(positions, "positions")), T.stream_of(device)),
        "get_batch_indices_positions",
    )
    return batch_indices, positions


def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                 page_size: int) -> torch.Tensor:
    r"""The KV length of each request from its page table:
    ``(num_pages - 1) * page_size + kv_last_page_len[b]``, with
    ``num_pages = kv_indptr[b+1] - kv_indptr[b]``.

    Parameters
    ----------
    kv_indptr : torch.Tensor
        ``[batch_size + 1]`` int32 (int64 is converted), CUDA, or on the CPU (computed there
        with torch, as FlashInfer's is, the result on the CPU too).
    kv_last_page_len : torch.Tensor
        ``[batch_size]`` int32 (int64 is converted), on kv_indptr's device.
    page_size : int
        Tokens per page, >= 1.

    Returns
    -------
    seq_lens : torch.Tensor
        ``[batch_size]`` int32, computed in 64 bits and saturated to the int32 range.

    Raises
    ------
    TypeError, ValueError, cinfer.CinferError
        As :func:`append_paged_kv_cache`; ``page_size < 1`` is a ValueError, a ``page_size``
        that is not an int (a float, a string) a TypeError.

    Notes
    -----
    A request without pages has length 0 (``SEMANTICS.md``); FlashInfer returns its
    ``kv_last_page_len`` there, which agrees whenever that is 0.
    """
    if _dispatch.compiling():
        return _dispatch.op("get_seq_lens")(kv_indptr, kv_last_page_len, page_size)
    _dispatch.ensure_registered()
    return get_seq_lens_impl(kv_indptr, kv_last_page_len, page_size)


def _seq_lens_on_host(torch, kv_indptr, kv_last_page_len, page_size):
    """get_seq_lens of host tensors (as FlashInfer's, plain torch arithmetic, which serving
    engines call on CPU page tables): the same formula, int64 arithmetic saturated to int32."""
    kv_last_page_len = T.as_tensor(kv_last_page_len, "kv_last_page_len")
    for t, name in ((kv_indptr, "kv_indptr"), (kv_last_page_len, "kv_last_page_len")):
        if t.device.type != "cpu":
            raise ArgumentError(f"{name}: tensor on {t.device}, expected the CPU (kv_indptr is "
                                "on the CPU)")
        T.check_dtype(t, name, (torch.int32, torch.int64), A.INDEX_DTYPES_TEXT,
                      unsupported=False)
    T.check_ndim(kv_indptr, "kv_indptr", 1, "[batch_size + 1]")
    T.check_ndim(kv_last_page_len, "kv_last_page_len", 1, "[batch_size]")
    if kv_indptr.shape[0] != kv_last_page_len.shape[0] + 1:
        raise ArgumentError(f"kv_indptr: {kv_indptr.shape[0]} entries, expected "
                            f"{kv_last_page_len.shape[0] + 1} (len(kv_last_page_len) + 1)")
    indptr = kv_indptr.to(torch.int64)
    pages = indptr[1:] - indptr[:-1]
    lens = torch.where(pages > 0, (pages - 1) * page_size + kv_last_page_len.to(torch.int64),
                       torch.zeros_like(pages))
    return lens.clamp(-(2**31), 2**31 - 1).to(torch.int32)


def get_seq_lens_impl(kv_indptr, kv_last_page_len, page_size):
    """:func:`get_seq_lens`'s eager implementation (also the operator's)."""
    torch = T.torch_module()
    page_size = A.integer(page_size, "page_size")
    if not 1 <= page_size <= 0x7FFFFFFF:
        raise ArgumentError(f"page_size = {page_size}, expected 1 .. 2^31 - 1")
    kv_indptr = T.as_tensor(kv_indptr, "kv_indptr")
    if kv_indptr.device.type == "cpu":
        return _seq_lens_on_host(torch, kv_indptr, kv_last_page_len, page_size)
    T.check_cuda(kv_indptr, "kv_indptr")
    device = kv_indptr.device
    kv_indptr = A.index_tensor(kv_indptr, "kv_indptr", device)
    kv_last_page_len = A.index_tensor(kv_last_page_len, "kv_last_page_len", device)
    T.check_ndim(kv_last_page_len, "kv_last_page_len", 1, "[batch_size]")
    seq_lens = torch.empty(kv_last_page_len.shape, dtype=torch.int32, device=device)
    _lib.check(
        _lib.lib().cinfer_get_seq_lens(
            T.context_of(device), T.ref(T.to_dl(kv_indptr, "kv_indptr")),
            T.ref(T.to_dl(kv_last_page_len, "kv_last_page_len")), page_size,
            T.ref(T.to_dl(seq_lens, "seq_lens")), T.stream_of(device)),
        "get_seq_lens",
    )
    return seq_lens


__all__ = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]
