"""Prefill attention (FlashInfer's ``flashinfer.prefill``): many query tokens of one request over
its KV, on tensor cores.

Semantics (``SEMANTICS.md``): the query block is the **last** ``qo_len`` tokens of the request,
so query row ``i`` is at position ``p_i = i + kv_len - qo_len`` and the causal mask keeps KV
position ``j`` when ``j <= p_i`` (bottom-right aligned, as in FlashInfer's append attention).
The logit is ``s_ij = (q_i . k_j) * sm_scale``, then ``c * tanh(s_ij / c)`` when
``logits_soft_cap = c > 0``; ``window_left = w >= 0`` also masks ``j < p_i - w``. The output is
``softmax(s) @ V`` accumulated in float32, and the log-sum-exp ``log2(sum_j exp(s_ij))`` is
**base 2**. A row without any kept position gives output 0 and LSE ``-inf``.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _args as A
from . import _dispatch
from . import _lib
from . import _tensor as T
from .errors import ArgumentError, UnsupportedError

if TYPE_CHECKING:  # annotations only: torch is imported lazily
    import torch

_BACKENDS = ("auto", "fa2", "fa3")


def _check_unsupported(custom_mask, packed_custom_mask, use_fp16_qk_reduction, backend) -> None:
    """*Pure* checks of the FlashInfer arguments cinfer's single prefill cannot honour."""
    if custom_mask is not None or packed_custom_mask is not None:
        which = "custom_mask" if custom_mask is not None else "packed_custom_mask"
        raise UnsupportedError(
            f"{which}: custom masks are not supported by cinfer's single prefill yet; use "
            "causal=True and/or window_left, or apply the mask outside attention"
        )
    if use_fp16_qk_reduction:
        raise UnsupportedError(
            "use_fp16_qk_reduction = True is not supported: cinfer always accumulates q . k in "
            "float32; pass False"
        )
    if backend not in _BACKENDS:
        raise ArgumentError(f"backend = {backend!r}, expected one of {', '.join(_BACKENDS)}")


def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    custom_mask: Optional[torch.Tensor] = None,
    packed_custom_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    r"""Prefill (or append) attention of one request: ``qo_len`` query tokens over ``kv_len``
    KV tokens.

    Parameters
    ----------
    q : torch.Tensor
        The queries, shape ``[qo_len, num_qo_heads, head_dim]``, float16 or bfloat16, CUDA.
    k : torch.Tensor
        The keys, shape ``[kv_len, num_kv_heads, head_dim]`` (``NHD``) or
        ``[num_kv_heads, kv_len, head_dim]`` (``HND``), the dtype of ``q``.
    v : torch.Tensor
        The values, the shape and dtype of ``k`` (strides may differ).
    custom_mask, packed_custom_mask : Optional[torch.Tensor]
        Not supported yet: anything but None raises :class:`cinfer.UnsupportedError`.
    causal : bool
        Mask KV position ``j`` for query row ``i`` unless ``j <= i + kv_len - qo_len``
        (bottom-right aligned). Default False.
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``.
    pos_encoding_mode : str
        Only ``"NONE"``; ``"ROPE_LLAMA"`` and ``"ALIBI"`` raise :class:`cinfer.UnsupportedError`
        (rotate q and k first, e.g. with :func:`cinfer.apply_rope_pos_ids`).
    use_fp16_qk_reduction : bool
        Only False (cinfer accumulates in float32); True raises
        :class:`cinfer.UnsupportedError`.
    sm_scale : Optional[float]
        Logit scale; default ``1 / sqrt(head_dim)``.
    window_left : int
        Sliding window: query row ``i`` attends positions ``p_i - window_left .. p_i``.
        ``-1`` (default) = off.
    logits_soft_cap : Optional[float]
        ``c > 0`` applies ``c * tanh(s / c)`` to the logits; None or 0 = off.
    rope_scale, rope_theta : Optional[float]
        Accepted for compatibility; unused with ``pos_encoding_mode="NONE"`` (as in FlashInfer).
    backend : str
        ``"auto"`` (default), ``"fa2"`` or ``"fa3"``: accepted, cinfer chooses its kernel itself.
    return_lse : bool
        Also return the log-sum-exp.

    Returns
    -------
    out : torch.Tensor
        Shape ``[qo_len, num_qo_heads, head_dim]``, the dtype of ``q``.
    lse : torch.Tensor
        Only with ``return_lse``: shape ``[qo_len, num_qo_heads]``, float32, **base 2**
        (``log2(sum_j exp(s_ij))``); ``-inf`` for rows without any kept position.

    Raises
    ------
    TypeError
        ``q``, ``k`` or ``v`` is not a tensor.
    ValueError
        Wrong shape, dtype or device, naming the argument (heads that do not divide, k and v
        of different shapes, a CPU tensor); :class:`cinfer.UnsupportedError` for what cinfer
        does not implement: a head dim that is not a multiple of 16 up to 256, fp8 K/V, custom
        masks, RoPE/ALiBi in the kernel, rows not 16-byte aligned.
    cinfer.CinferError
        CUDA or JIT failures (:class:`cinfer.CompileError`, :class:`cinfer.NoDeviceError`).

    Notes
    -----
    ``num_qo_heads`` must be a multiple of ``num_kv_heads`` (GQA). Any strides with a
    contiguous last dim work (slices of a packed QKV tensor). One kernel launch on PyTorch's
    current CUDA stream, no workspace; it compiles the kernel on first use and is otherwise
    CUDA-graph capturable. ``qo_len`` and ``kv_len`` must be below 2^30.
    """
    _check_unsupported(custom_mask, packed_custom_mask, use_fp16_qk_reduction, backend)
    A.pos_encoding_mode(pos_encoding_mode)
    if _dispatch.compiling():
        out, lse = _dispatch.op("single_prefill")(
            q, k, v, bool(causal), kv_layout, sm_scale, window_left, logits_soft_cap,
            bool(return_lse))
    else:
        _dispatch.ensure_registered()
        out, lse = single_prefill_impl(q, k, v, causal, kv_layout, sm_scale, window_left,
                                       logits_soft_cap, return_lse)
    return (out, lse) if return_lse else out


def single_prefill_with_kv_cache_return_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    custom_mask: Optional[torch.Tensor] = None,
    packed_custom_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    r""":func:`single_prefill_with_kv_cache` with ``return_lse=True``: returns ``(out, lse)``,
    ``out`` ``[qo_len, num_qo_heads, head_dim]`` in q's dtype and ``lse``
    ``[qo_len, num_qo_heads]`` float32, **base 2**. Arguments and errors as there."""
    return single_prefill_with_kv_cache(
        q, k, v, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode,
        use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
        backend, return_lse=True)


def single_prefill_impl(q, k, v, causal, kv_layout, sm_scale, window_left, logits_soft_cap,
                        return_lse):
    """The eager implementation (also the ``cinfer::single_prefill`` operator's): returns
    ``(out, lse)`` with ``lse`` None unless ``return_lse``."""
    torch = T.torch_module()
    q = T.as_tensor(q, "q")
    k = T.as_tensor(k, "k")
    v = T.as_tensor(v, "v")
    layout = A.kv_layout(kv_layout)
    T.check_cuda(q, "q")
    T.check_cuda(k, "k", q.device)
    T.check_cuda(v, "v", q.device)
    T.check_ndim(q, "q", 3, "[qo_len, num_qo_heads, head_dim]")
    kv_shape = ("[kv_len, num_kv_heads, head_dim] (NHD)" if layout == _lib.KV_LAYOUT_NHD
                else "[num_kv_heads, kv_len, head_dim] (HND)")
    T.check_ndim(k, "k", 3, kv_shape)
    T.check_ndim(v, "v", 3, kv_shape)
    T.check_dtype(q, "q", A.q_dtypes(), A.Q_DTYPES_TEXT)
    for name, t in (("k", k), ("v", v)):
        if t.dtype in A.fp8_dtypes():
            raise UnsupportedError(
                f"{name}: dtype {t.dtype}: fp8 K/V is not supported by prefill yet (decode "
                "supports it); pass K/V in q's dtype"
            )
        if t.dtype != q.dtype:
            raise ArgumentError(f"{name}: dtype {t.dtype}, expected {q.dtype} (as q)")

    qo_len, num_qo_heads, head_dim = q.shape
    nhd = layout == _lib.KV_LAYOUT_NHD
    opts = _lib.attention_options(
        num_qo_heads=int(num_qo_heads),
        num_kv_heads=int(k.shape[1] if nhd else k.shape[0]),
        head_dim=int(head_dim),
        kv_layout=layout,
        q_dtype=T.dl_dtype(q.dtype),
        kv_dtype=T.dl_dtype(k.dtype),
        # 0 asks the library for its default, 1/sqrt(head_dim).
        sm_scale=A.positive(sm_scale, "sm_scale", 0.0),
        logits_soft_cap=A.soft_cap(logits_soft_cap),
        window_left=A.window_left(window_left),
    )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = (torch.empty((qo_len, num_qo_heads), dtype=torch.float32, device=q.device)
           if return_lse else None)
    dl_lse = T.to_dl(lse, "lse") if lse is not None else None
    _lib.check(
        _lib.lib().cinfer_single_prefill(
            T.context_of(q.device), ctypes.byref(opts), 1 if causal else 0,
            T.ref(T.to_dl(q, "q")), T.ref(T.to_dl(k, "k")), T.ref(T.to_dl(v, "v")),
            T.ref(T.to_dl(out, "out")), T.ref(dl_lse), None, T.stream_of(q.device)),
        "single_prefill_with_kv_cache",
    )
    return out, lse


__all__ = ["single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse"]
