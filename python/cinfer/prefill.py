"""Prefill attention (FlashInfer's ``flashinfer.prefill``): many query tokens of one request over
its KV, on tensor cores.

Semantics (``SEMANTICS.md``): the query block is the **last** ``qo_len`` tokens of the request,
so query row ``i`` is at position ``p_i = i + kv_len - qo_len`` and the causal mask keeps KV
position ``j`` when ``j <= p_i`` (bottom-right aligned, as in FlashInfer's append attention).
The logit is ``s_ij = (q_i . k_j) * sm_scale``, then ``c * tanh(s_ij / c)`` when
``logits_soft_cap = c > 0``; ``window_left = w >= 0`` also masks ``j < p_i - w``. The output is
``softmax(s) @ V`` accumulated in float32, and the log-sum-exp ``log2(sum_j exp(s_ij))`` is
**base 2**. A row without any kept position gives output 0 and LSE ``-inf``.

FlashInfer's ``custom_mask`` / ``packed_custom_mask`` (a boolean ``[qo_len, kv_len]`` matrix per
request that replaces the causal mask) and ``pos_encoding_mode="ALIBI"`` (``slope_h * (j - p_i)``
added to the scaled logit, FlashInfer's default slopes) run as the library's built-in variants
``"custom_mask"`` and ``"alibi"`` (:mod:`cinfer._masks` has the layouts).
``pos_encoding_mode="ROPE_LLAMA"`` rotates q and k inside the kernels (Llama's rotate-half
RoPE): query row ``i`` at its position ``p_i``, key ``j`` at ``j``.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import math
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _args as A
from . import _dispatch
from . import _lib
from . import _masks as M
from . import _tensor as T
from . import variant as V
from .errors import WORKSPACE_TOO_SMALL, ArgumentError, UnsupportedError

if TYPE_CHECKING:  # annotations only: torch is imported lazily
    import torch

_BACKENDS = ("auto", "fa2", "fa3")


def _check_unsupported(use_fp16_qk_reduction, backend) -> None:
    """*Pure* checks of the FlashInfer arguments cinfer's single prefill cannot honour."""
    if use_fp16_qk_reduction:
        raise UnsupportedError(
            "use_fp16_qk_reduction = True is not supported: cinfer always accumulates q . k in "
            "float32; pass False"
        )
    if backend not in _BACKENDS:
        raise ArgumentError(f"backend = {backend!r}, expected one of {', '.join(_BACKENDS)}")


def _check_later_scales(q, scale_q, scale_k, scale_v, o_dtype) -> None:
    """Checks of the keyword arguments FlashInfer 0.2.8 added to single prefill (it put
    them after ``v``; cinfer keeps 0.2.0-0.2.7's positional order and takes them by keyword)."""
    for name, value, instead in (("scale_q", scale_q, "fold it into sm_scale"),
                                 ("scale_k", scale_k, "pass the float k_scale="),
                                 ("scale_v", scale_v, "pass the float v_scale=")):
        if value is not None:
            raise UnsupportedError(
                f"{name}: per-head fp8 scale tensors are not supported (cinfer takes one scale "
                f"per call for K and V, none for q); {instead}"
            )
    if o_dtype is not None:
        # The output always has q's dtype: only that request can be honoured.
        dtype = T.canonical_dtype(o_dtype, "o_dtype")
        q_dtype = T.as_tensor(q, "q").dtype
        if dtype != q_dtype:
            raise UnsupportedError(f"o_dtype = {o_dtype}: the output has q's dtype ({q_dtype}); "
                                   "pass None or q.dtype")


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
    return_lse: bool = False,
    backend: str = "auto",
    *,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    scale_q: Optional[torch.Tensor] = None,
    scale_k: Optional[torch.Tensor] = None,
    scale_v: Optional[torch.Tensor] = None,
    o_dtype=None,
    variant: Optional[V.Variant] = None,
    variant_args=None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    r"""Prefill (or append) attention of one request: ``qo_len`` query tokens over ``kv_len``
    KV tokens.

    Parameters
    ----------
    q : torch.Tensor
        The queries, shape ``[qo_len, num_qo_heads, head_dim]``, float16 or bfloat16, CUDA.
    k : torch.Tensor
        The keys, shape ``[kv_len, num_kv_heads, head_dim]`` (``NHD``) or
        ``[num_kv_heads, kv_len, head_dim]`` (``HND``), the dtype of ``q`` or fp8
        (``torch.float8_e4m3fn``, ``torch.float8_e5m2``; the kernels then run in fp16 with q
        multiplied by ``sm_scale`` and rounded to fp16, so ``|q| * sm_scale`` must stay below
        65504).
    v : torch.Tensor
        The values, the shape and dtype of ``k`` (strides may differ), except that its head dim
        ``head_dim_vo`` may differ from ``head_dim`` (D_qk != D_vo, e.g. 192 / 128) with 16-bit
        K/V, no in-kernel RoPE and both dims multiples of 16 up to 256 (else
        :class:`cinfer.UnsupportedError`).
    custom_mask : Optional[torch.Tensor]
        Boolean mask, shape ``[qo_len, kv_len]`` (or flattened, ``[qo_len * kv_len]``),
        torch.bool, CUDA on q's device: ``custom_mask[i, j]`` True keeps KV position ``j`` for
        query row ``i`` (row ``i`` is position ``i + kv_len - qo_len``, bottom-right aligned).
        It replaces the causal mask (``causal`` is then ignored, as in FlashInfer);
        ``window_left`` still applies. Packed on the device at each call
        (:func:`cinfer.packbits`, ``bitorder="little"``).
    packed_custom_mask : Optional[torch.Tensor]
        The mask already packed: 1-D torch.uint8 on q's device with at least
        ``ceil(qo_len * kv_len / 8)`` bytes, as
        ``cinfer.packbits(custom_mask.flatten(), bitorder="little")`` writes it (bit ``e % 8`` of
        byte ``e // 8`` is element ``e = i * kv_len + j``). Read in place, no copy. Takes
        precedence over ``custom_mask`` (which is then ignored, as in FlashInfer).
    causal : bool
        Mask KV position ``j`` for query row ``i`` unless ``j <= i + kv_len - qo_len``
        (bottom-right aligned). Default False. Ignored with a custom mask.
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``.
    pos_encoding_mode : str
        ``"NONE"`` (default) or ``"ALIBI"``: adds ``slope_h * (j - p_i)`` to the scaled logit of
        query head ``h``, with FlashInfer's default slopes (the ALiBi paper's:
        ``2^(-8 (h + 1) / n)`` for the first ``n`` heads, ``n`` the largest power of two not
        above ``num_qo_heads``, then ``2^(-4 (2 (h - n) + 1) / n)``). ``"ROPE_LLAMA"``:
        in-kernel rotary embedding (Llama's rotate-half) of query row ``i`` at its position
        ``p_i = kv_len - qo_len + i`` and of key ``j`` at ``j`` before the dot products (``k``
        holds un-rotated keys; ``v`` is not rotated): pair ``m < D/2`` of a vector,
        ``(x[m], x[m + D/2])``, is rotated by the angle
        ``(pos / rope_scale) * rope_theta^(-2m / D)``, computed in float32, the rotated q and
        k rounded to q's dtype for the tensor-core products. Needs ``head_dim`` a multiple of
        16 and ``qo_len, kv_len <= 2^24``; combines with masks, windows, soft caps and
        variants.
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
        With ``"ROPE_LLAMA"``: positions are divided by ``rope_scale`` (default 1) and
        ``rope_theta`` is the frequency base (default 1e4); each a finite value > 0
        (ValueError otherwise), rounded to float32. Ignored with other modes, as in FlashInfer.
    return_lse : bool
        Also return the log-sum-exp (not with a variant without softmax).
    backend : str
        ``"auto"`` (default), ``"fa2"`` or ``"fa3"``: accepted, cinfer chooses its kernel itself.
        After ``return_lse``, as in FlashInfer 0.2 (later versions swap the two: pass them by
        keyword to suit both).
    k_scale, v_scale : Optional[float]
        Keyword-only (FlashInfer's fp8 scales): the logits are ``(q . k) * sm_scale *
        k_scale`` and the output is multiplied by ``v_scale``; None = 1. Meant for fp8 K/V,
        applied to any dtype.
    scale_q, scale_k, scale_v : Optional[torch.Tensor]
        Keyword-only: FlashInfer 0.2.8's per-head fp8 scale tensors (which it takes
        positionally after ``v``). Only None; a tensor raises :class:`cinfer.UnsupportedError`
        (use the float ``k_scale`` / ``v_scale``).
    o_dtype : optional
        Keyword-only (FlashInfer 0.2.8): None or q's dtype (a torch dtype or its name); another
        dtype raises :class:`cinfer.UnsupportedError`.
    variant : Optional[cinfer.Variant]
        cinfer extension (keyword-only): an attention variant (:class:`cinfer.Variant`, or a
        built-in name such as ``"sinks"``); ``logits_soft_cap`` must then be off, and there
        must be no custom mask and no ALiBi. A compile error in its source raises
        :class:`cinfer.CompileError` with NVRTC's log.
    variant_args : sequence or mapping, optional
        cinfer extension (keyword-only): the variant's arguments, in declaration order or by
        name (:mod:`cinfer.variant`). ``batch_idx`` of the hooks is 0. None with a custom mask
        or ALiBi (cinfer fills their built-in variants' arguments; TypeError otherwise).

    Returns
    -------
    out : torch.Tensor
        Shape ``[qo_len, num_qo_heads, head_dim_vo]`` (v's head dim), the dtype of ``q``.
    lse : torch.Tensor
        Only with ``return_lse``: shape ``[qo_len, num_qo_heads]``, float32, **base 2**
        (``log2(sum_j exp(s_ij))``); ``-inf`` for rows without any kept position.

    Raises
    ------
    TypeError
        ``q``, ``k``, ``v`` or a mask is not a tensor; ``variant_args`` with a custom mask or
        ALiBi; a number argument of another type (a string or a bool; a float where an int is
        expected).
    ValueError
        Wrong shape, dtype or device, naming the argument (heads that do not divide, k and v
        of different shapes, a CPU tensor, a mask that is not ``[qo_len, kv_len]`` torch.bool,
        a packed mask that is not uint8 or too short, ``rope_scale`` / ``rope_theta`` not
        finite or not > 0 with RoPE); :class:`cinfer.UnsupportedError` for what cinfer does
        not implement: a head dim that is not a multiple of 16 up to 256, RoPE with fp8 K/V, a
        custom mask or ALiBi together with each other, with ``variant`` or with
        ``logits_soft_cap``, rows not 16-byte aligned.
    cinfer.CinferError
        CUDA or JIT failures (:class:`cinfer.CompileError`, :class:`cinfer.NoDeviceError`).

    Notes
    -----
    ``num_qo_heads`` must be a multiple of ``num_kv_heads`` (GQA). Any strides with a
    contiguous last dim work (slices of a packed QKV tensor). One kernel launch on PyTorch's
    current CUDA stream (plus, for ``custom_mask``, the packing kernel); a short query over a
    long KV, whose query tiles alone would leave most of the GPU idle, is split across CTAs
    instead (split-KV, as the batch prefill wrappers do: a workspace from PyTorch's caching
    allocator, a schedule copied from host memory, a merge kernel), except while a CUDA graph is
    being captured. It compiles its kernels on first use and is otherwise CUDA-graph capturable
    (a captured call runs unsplit and reads the mask tensor it was captured with: keep it alive
    and refill it in place).
    ``qo_len`` and ``kv_len`` must be below 2^30. A custom mask or ALiBi runs the library's
    built-in variant ``"custom_mask"`` or ``"alibi"`` (JIT-compiled on first use unless the
    kernel bundle has it); with a custom mask every KV tile is computed, none skipped as under
    ``causal``. Such calls, and calls with RoPE, are not torch.compile operators (they break
    the graph, like calls with a variant).
    """
    where = "single_prefill_with_kv_cache"
    _check_unsupported(use_fp16_qk_reduction, backend)
    _check_later_scales(q, scale_q, scale_k, scale_v, o_dtype)
    mode = A.pos_encoding_mode(pos_encoding_mode)
    rope = A.rope(mode, rope_scale, rope_theta)
    feature = M.feature(custom_mask, packed_custom_mask, mode)
    variant = V.check_variant(variant, where)
    M.check_combination(feature, variant, logits_soft_cap, where)
    if feature is not None:
        M.refuse_variant_args(feature, variant_args is not None, where)
    # Calls with a variant (a user's or the built-in of a mask or ALiBi) are not operators (a
    # Variant is no schema type): under torch.compile they break the graph, like the wrappers.
    # So are calls with RoPE: carrying its fields would change the schema of the operator
    # (torch.ops.cinfer.single_prefill, recorded by torch.export'ed graphs); the eager path
    # takes them instead.
    if (_dispatch.compiling() and variant is None and variant_args is None
            and feature is None and k_scale is None and v_scale is None and rope is None):
        out, lse = _dispatch.op("single_prefill")(
            q, k, v, bool(causal), kv_layout, sm_scale, window_left, logits_soft_cap,
            bool(return_lse))
    else:
        _dispatch.ensure_registered()
        out, lse = single_prefill_impl(q, k, v, causal, kv_layout, sm_scale, window_left,
                                       logits_soft_cap, return_lse, variant, variant_args,
                                       custom_mask=custom_mask,
                                       packed_custom_mask=packed_custom_mask,
                                       alibi=mode == "ALIBI", rope=rope, k_scale=k_scale,
                                       v_scale=v_scale)
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
    *,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    scale_q: Optional[torch.Tensor] = None,
    scale_k: Optional[torch.Tensor] = None,
    scale_v: Optional[torch.Tensor] = None,
    o_dtype=None,
    variant: Optional[V.Variant] = None,
    variant_args=None,
    return_lse: bool = True,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    r""":func:`single_prefill_with_kv_cache` with ``return_lse=True``: returns ``(out, lse)``,
    ``out`` ``[qo_len, num_qo_heads, head_dim]`` in q's dtype and ``lse``
    ``[qo_len, num_qo_heads]`` float32, **base 2**. Arguments and errors as there; FlashInfer
    defines this function as a ``functools.partial`` with ``return_lse=True``, so a
    ``return_lse=False`` given by keyword is honoured here too (returning ``out`` alone)."""
    return single_prefill_with_kv_cache(
        q, k, v, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode,
        use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
        return_lse=return_lse, backend=backend, k_scale=k_scale, v_scale=v_scale,
        scale_q=scale_q, scale_k=scale_k, scale_v=scale_v, o_dtype=o_dtype, variant=variant,
        variant_args=variant_args)


def _single_options(num_qo_heads, num_kv_heads, head_dim, head_dim_vo, layout, q_dtype, kv_dtype,
                    sm_scale, soft_cap, window_left, k_scale, v_scale, variant_handle, rope):
    key = ("prefill", num_qo_heads, num_kv_heads, head_dim, head_dim_vo, layout, q_dtype,
           kv_dtype, sm_scale, soft_cap, window_left, k_scale, v_scale, variant_handle, rope)
    return _lib.cached_attention_options(key, lambda: _lib.attention_options(
        num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        head_dim_vo=head_dim_vo if head_dim_vo != head_dim else 0,
        kv_layout=layout, q_dtype=T.dl_dtype(q_dtype), kv_dtype=T.dl_dtype(kv_dtype),
        sm_scale=sm_scale, logits_soft_cap=soft_cap, window_left=window_left,
        k_scale=k_scale, v_scale=v_scale, variant=variant_handle, **A.rope_fields(rope)))


# Checked layouts of single prefill calls of default attention (:func:`single_prefill_impl`).
_single_calls = T.LayoutCache(64)


def single_prefill_impl(q, k, v, causal, kv_layout, sm_scale, window_left, logits_soft_cap,
                        return_lse, variant=None, variant_args=None, *, custom_mask=None,
                        packed_custom_mask=None, alibi=False, rope=None, k_scale=None,
                        v_scale=None):
    """The eager implementation (also the ``cinfer::single_prefill`` operator's, without a
    variant, mask, ALiBi or RoPE): returns ``(out, lse)`` with ``lse`` None unless
    ``return_lse``. The combination of variant, mask and ALiBi was checked by the caller;
    ``rope`` is :func:`cinfer._args.rope`'s ``(rope_scale, rope_theta)``, or None.

    Default attention (no variant, mask, ALiBi or RoPE) on tensors of a layout an earlier call
    of this thread checked skips the checks and reuses that call's structs: only the data
    pointers change (the library checks the arguments again either way)."""
    torch = T.torch_module()
    key = None
    if (variant is None and variant_args is None and custom_mask is None
            and packed_custom_mask is None and not alibi and rope is None
            and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(v, torch.Tensor)):
        key = (T.layout_of(q), T.layout_of(k), T.layout_of(v), bool(causal), kv_layout,
               sm_scale, window_left, logits_soft_cap, bool(return_lse), k_scale, v_scale)
        c = _single_calls.get(key)
        if c is not None:
            out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype,
                              device=q.device)
            lse = (torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
                   if return_lse else None)
            refs = c.rebind(q, k, v, out, lse) if return_lse else c.rebind(q, k, v, out)
            _call(T.context_of(q.device), c.options_ref, causal, refs[:4],
                  refs[4] if return_lse else None, c.packed, c.extra, q.device)
            return out, lse
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
    # K/V: q's dtype, or fp8 (both of one fp8 dtype) with k_scale / v_scale.
    if k.dtype != q.dtype and k.dtype not in A.fp8_dtypes():
        raise ArgumentError(f"k: dtype {k.dtype}, expected {q.dtype} (as q) or an fp8 dtype "
                            "(torch.float8_e4m3fn, torch.float8_e5m2)")
    if v.dtype != k.dtype:
        raise ArgumentError(f"v: dtype {v.dtype}, expected {k.dtype} (as k)")

    qo_len, num_qo_heads, head_dim = q.shape
    nhd = layout == _lib.KV_LAYOUT_NHD
    if custom_mask is not None or packed_custom_mask is not None:
        kv_len = int(k.shape[0] if nhd else k.shape[1])
        variant = M.mask_variant()
        variant_args = M.single_mask(custom_mask, packed_custom_mask, int(qo_len), kv_len,
                                     q.device)
        causal = False  # the custom mask replaces the causal one (FlashInfer's rule)
    elif alibi:
        variant, variant_args = M.alibi(num_qo_heads)
    # v and out may have another head dim than q and k (D_qk != D_vo, e.g. 192 / 128).
    head_dim_vo = int(v.shape[2])
    opts = _single_options(
        int(num_qo_heads), int(k.shape[1] if nhd else k.shape[0]), int(head_dim), head_dim_vo,
        layout, q.dtype, k.dtype,
        # 0 asks the library for its default, 1/sqrt(head_dim).
        A.positive(sm_scale, "sm_scale", 0.0), A.soft_cap(logits_soft_cap),
        A.window_left(window_left), A.positive(k_scale, "k_scale", 1.0),
        A.positive(v_scale, "v_scale", 1.0), variant.handle if variant is not None else None,
        rope)
    packed = V.pack_args(variant, variant_args, "single_prefill_with_kv_cache")
    out = torch.empty((qo_len, num_qo_heads, head_dim_vo), dtype=q.dtype, device=q.device)
    lse = (torch.empty((qo_len, num_qo_heads), dtype=torch.float32, device=q.device)
           if return_lse else None)
    dl = [T.to_dl(q, "q"), T.to_dl(k, "k"), T.to_dl(v, "v"), T.to_dl(out, "out")]
    if lse is not None:
        dl.append(T.to_dl(lse, "lse"))
    ctx = T.context_of(q.device)
    # Split-KV's workspace for these lengths (0: the call does not split). A call being captured
    # in a CUDA graph runs unsplit (the library's rule), so it asks for none and is not cached.
    capturing = torch.cuda.is_current_stream_capturing()
    nbytes = ctypes.c_size_t()
    if not capturing:
        _lib.check(_lib.lib().cinfer_single_prefill_workspace_size(
            ctx, ctypes.byref(opts), 1 if causal else 0, int(qo_len),
            int(k.shape[0] if nhd else k.shape[1]), ctypes.byref(nbytes)),
            "single_prefill_with_kv_cache")
    _call(ctx, ctypes.byref(opts), causal, [T.ref(t) for t in dl[:4]],
          T.ref(dl[4]) if lse is not None else None, packed, nbytes.value, q.device)
    if key is not None and not capturing:  # later calls of this layout reuse the structs
        _single_calls.put(key, T.CheckedCall(opts, dl, packed, nbytes.value))
    return out, lse


def _call(ctx, options_ref, causal, refs, lse_ref, packed, nbytes, device):
    """One single prefill call: with a split-KV workspace of nbytes from PyTorch's caching
    allocator when nbytes > 0 and no CUDA graph is being captured (a captured call runs
    unsplit), else without one."""
    stream = T.stream_of(device)
    torch = T.torch_module()
    if nbytes and not torch.cuda.is_current_stream_capturing():
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
        status = _lib.lib().cinfer_single_prefill_with_workspace(
            ctx, options_ref, 1 if causal else 0, *refs, lse_ref, packed.ref(),
            workspace.data_ptr(), nbytes, stream)
    else:
        status = _lib.lib().cinfer_single_prefill(
            ctx, options_ref, 1 if causal else 0, *refs, lse_ref, packed.ref(), stream)
    _lib.check(status, "single_prefill_with_kv_cache")




# ---------------------------------------------------------------------------------------------
# Batch prefill over a ragged or paged KV
# ---------------------------------------------------------------------------------------------

class _Op:
    """One cinfer_batch_prefill_t and what it was created for."""

    # lib: the library that created the handle, which destroys it (a wrapper collected late
    # must not hand one library's handle to another, e.g. a test's stand-in to the real one).
    __slots__ = ("handle", "key", "max_batch", "max_total_qo", "variant", "lib")


class _PrefillPlan:
    """What one plan() decided, kept for run()."""

    # builtin_args: the packed arguments of the built-in variant of a custom mask or ALiBi
    # (feature names which), filled at plan and given to every run; None otherwise.
    __slots__ = ("op", "batch_size", "qo_end", "num_qo_heads", "num_kv_heads", "head_dim",
                 "head_dim_vo", "page_size", "q_dtype", "kv_dtype", "causal", "sm_scale",
                 "logits_soft_cap", "window_left", "k_scale", "v_scale", "variant", "kv_indices", "dl_kv_indices",
                 "pos_encoding_mode", "feature", "builtin_args", "rope", "kv_indices_ref",
                 "run_fn")


def _check_plan_unsupported(use_fp16_qk_reduction, extras) -> None:
    """The FlashInfer plan arguments cinfer's batch prefill cannot honour."""
    if use_fp16_qk_reduction:
        raise UnsupportedError(
            "use_fp16_qk_reduction = True is not supported: cinfer always accumulates q . k in "
            "float32; pass False"
        )
    for name, value in extras.items():
        if value:
            raise UnsupportedError(f"{name}: multi-item scoring arguments are not supported")


class _BatchPrefillBase:
    """What the ragged and paged wrappers share: the C objects (created lazily at plan time,
    one per set of create-time options, cached), plan bookkeeping and run."""

    _STORAGE = _lib.KV_STORAGE_RAGGED
    _NAME = "BatchPrefill"
    # Objects kept per wrapper (one per causal/options/variant combination in use); they all
    # plan into the same workspace, so only the latest plan is runnable.
    _MAX_OPS = 4
    # Smallest capacities of an object outside CUDA-graph mode, so that small, growing steps do
    # not re-create it each time (capacities then grow in powers of two).
    _MIN_BATCH = 16
    _MIN_TOTAL_QO = 1024

    def _init_common(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                     custom_mask_buf, mask_indptr_buf, max_total_qo_tokens,
                     jit_kwargs=None) -> None:
        self._ops: "collections.OrderedDict[tuple, _Op]" = collections.OrderedDict()
        self._plan: Optional[_PrefillPlan] = None
        self._kv_layout_code = A.kv_layout(kv_layout)
        self._kv_layout = kv_layout
        for name, value in (("jit_args", jit_args), ("jit_kwargs", jit_kwargs)):
            if value is not None:
                raise UnsupportedError(
                    f"{name}: FlashInfer's JIT variants are not supported; pass a cinfer.Variant "
                    "to plan(..., variant=...)"
                )
        if backend not in ("auto", "fa2", "fa3"):
            raise ArgumentError(f"backend = {backend!r}, expected 'auto', 'fa2' or 'fa3' "
                                "(accepted for compatibility; cinfer chooses its own kernels)")
        ws = T.as_tensor(float_workspace_buffer, "float_workspace_buffer")
        self._check_workspace(ws)
        self._float_workspace_buffer = ws
        self.device = ws.device
        self._use_cuda_graph = bool(use_cuda_graph)
        self._slots = _RunSlots(self.device)
        # Graph mode with a custom mask: each plan copies the packed mask into custom_mask_buf
        # and its per-request offsets into two buffers of the wrapper, so captured runs read
        # fixed addresses. Outside graph mode the buffers are ignored, as in FlashInfer.
        self._custom_mask_buf = None
        self._mask_indptr_buf = None
        self._mask_row_offset_buf = None
        self._mask_row_stride_buf = None
        if self._use_cuda_graph:
            torch = T.torch_module()
            checked = []
            for name, buf, dtype in (("custom_mask_buf", custom_mask_buf, torch.uint8),
                                     ("mask_indptr_buf", mask_indptr_buf, torch.int32)):
                if buf is not None:
                    buf = T.as_tensor(buf, name)
                    T.check_cuda(buf, name, self.device)
                    T.check_ndim(buf, name, 1, f"a 1-D {dtype} buffer")
                    T.check_dtype(buf, name, (dtype,), str(dtype), unsupported=False)
                    if not buf.is_contiguous():
                        raise ArgumentError(f"{name}: must be contiguous")
                checked.append(buf)
            self._custom_mask_buf, self._mask_indptr_buf = checked
        self._graph_key = None
        self._max_total_qo = None
        self._captured_kv_rows = None  # ragged, graph mode: K/V rows of a captured run()
        if max_total_qo_tokens is not None:
            max_total_qo_tokens = A.integer(max_total_qo_tokens, "max_total_qo_tokens")
            if max_total_qo_tokens < 1:
                raise ArgumentError(f"max_total_qo_tokens = {max_total_qo_tokens}, expected >= 1")
            self._max_total_qo = max_total_qo_tokens

    def _graph_buffers(self, bufs, capacity_name: str) -> int:
        """Checks the CUDA-graph buffers (1-D int32 contiguous CUDA tensors on the wrapper's
        device); returns the batch capacity, ``len(bufs[capacity_name]) - 1``."""
        torch = T.torch_module()
        for name, buf in bufs.items():
            if not isinstance(buf, torch.Tensor):
                raise ArgumentError(f"{name} should be a torch.Tensor in cudagraph mode")
            T.check_cuda(buf, name, self.device)
            T.check_ndim(buf, name, 1, "a 1-D int32 buffer")
            T.check_dtype(buf, name, (torch.int32,), "torch.int32", unsupported=False)
            if not buf.is_contiguous():
                raise ArgumentError(f"{name}: must be contiguous")
        capacity = bufs[capacity_name].shape[0] - 1
        if capacity < 1:
            raise ArgumentError(f"{capacity_name}: {capacity + 1} entries, expected at least 2 "
                                "(max_batch_size + 1)")
        return capacity

    # ---- FlashInfer compatibility ----

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffer: Optional[torch.Tensor] = None) -> None:
        r"""Use another device workspace from the next :meth:`plan` on (``int_workspace_buffer``
        is accepted and unused). The current plan and the cached C objects are dropped."""
        ws = T.as_tensor(float_workspace_buffer, "float_workspace_buffer")
        self._check_workspace(ws)
        if ws.device != self.device:
            raise ArgumentError(
                f"float_workspace_buffer: on {ws.device}, expected {self.device} (the wrapper's)"
            )
        self._destroy()
        self._float_workspace_buffer = ws

    def end_forward(self) -> None:
        """Deprecated FlashInfer call; does nothing."""

    # ---- internals ----

    @staticmethod
    def _check_workspace(ws) -> None:
        T.check_cuda(ws, "float_workspace_buffer")
        if not ws.is_contiguous():
            raise ArgumentError("float_workspace_buffer: must be contiguous")

    def _common_plan(self, *, qo_indptr, kv_indptr, last_page_len, num_qo_heads, num_kv_heads,
                     head_dim, head_dim_vo, page_size, causal, sm_scale, window_left,
                     logits_soft_cap,
                     q_data_type, kv_data_type, o_data_type, k_scale, v_scale, variant,
                     custom_mask, packed_custom_mask, pos_encoding_mode, non_blocking,
                     check_kv_end=None, rope_scale=None, rope_theta=None):
        """Validates (``check_kv_end(kv_indptr[batch])`` too, when given), creates or reuses
        the C object, plans, lays out a custom mask; returns (plan, the index tensors,
        kv_host) with the plan's device page table still to be filled by the caller."""
        where = f"{self._NAME}.plan"
        num_qo_heads = A.integer(num_qo_heads, "num_qo_heads")
        num_kv_heads = A.integer(num_kv_heads, "num_kv_heads")
        head_dim = A.integer(head_dim, "head_dim_qk")
        if head_dim_vo is not None:
            head_dim_vo = A.integer(head_dim_vo, "head_dim_vo")
        page_size = A.integer(page_size, "page_size")
        mode = A.pos_encoding_mode(pos_encoding_mode)
        rope = A.rope(mode, rope_scale, rope_theta)
        feature = M.feature(custom_mask, packed_custom_mask, mode)
        masked = feature is not None and feature != M.ALIBI
        qo_indptr, qo_host = A.host_index(qo_indptr, "qo_indptr")
        kv_name = "paged_kv_indptr" if self._STORAGE == _lib.KV_STORAGE_PAGED else "kv_indptr"
        kv_indptr, kv_host = A.host_index(kv_indptr, kv_name)
        batch_size = qo_indptr.shape[0] - 1
        if batch_size < 0:
            raise ArgumentError("qo_indptr: 0 entries, expected batch_size + 1 >= 1")
        if kv_indptr.shape[0] != batch_size + 1:
            raise ArgumentError(f"{kv_name}: {kv_indptr.shape[0]} entries, expected "
                                f"{batch_size + 1} (len(qo_indptr))")
        last_host = None
        if last_page_len is not None:
            last_page_len, last_host = A.host_index(last_page_len, "paged_kv_last_page_len")
            if last_page_len.shape[0] != batch_size:
                raise ArgumentError(
                    f"paged_kv_last_page_len: {last_page_len.shape[0]} entries, expected "
                    f"{batch_size} (len(qo_indptr) - 1)"
                )
        q_dtype, kv_dtype = A.plan_dtypes(q_data_type, kv_data_type)
        if q_dtype not in A.q_dtypes():
            raise UnsupportedError(f"q_data_type = {q_dtype}, expected {A.Q_DTYPES_TEXT}")
        if kv_dtype != q_dtype and kv_dtype not in A.fp8_dtypes():
            raise UnsupportedError(
                f"kv_data_type = {kv_dtype}: batch prefill takes K/V in q's dtype ({q_dtype}) "
                "or fp8 (torch.float8_e4m3fn, torch.float8_e5m2)"
            )
        if o_data_type is not None and T.canonical_dtype(o_data_type, "o_data_type") != q_dtype:
            raise UnsupportedError(f"o_data_type = {o_data_type}: the output has q's dtype "
                                   f"({q_dtype})")
        sm = A.positive(sm_scale, "sm_scale", None)
        cap = A.soft_cap(logits_soft_cap)
        wl = A.window_left(window_left)
        ks = A.positive(k_scale, "k_scale", 1.0)
        vs = A.positive(v_scale, "v_scale", 1.0)
        variant = V.check_variant(variant, where)
        M.check_combination(feature, variant, logits_soft_cap, where)
        causal = bool(causal)
        # The kernels' causal mask: a custom mask replaces it (FlashInfer's rule).
        kernel_causal = causal and not masked
        alibi_args = None
        if masked:
            variant = M.mask_variant()
        elif feature is not None:
            variant, alibi_args = M.alibi(num_qo_heads)

        total_qo = int(qo_host[batch_size]) - int(qo_host[0]) if batch_size > 0 else 0
        if check_kv_end is not None:
            check_kv_end(int(kv_host[batch_size]))
        graph = self._use_cuda_graph
        if graph:
            if batch_size > self._fixed_batch_size:
                raise ArgumentError(
                    f"batch_size = {batch_size} (len(qo_indptr) - 1) exceeds the CUDA graph "
                    f"capacity {self._fixed_batch_size} (len(qo_indptr_buf) - 1)"
                )
            # q and out rows are absolute (qo_indptr[b] ..), so the capacity bounds the last
            # row, qo_indptr[-1], not only the count.
            qo_end = int(qo_host[batch_size])
            if self._max_total_qo is None:  # FlashInfer's rule: the first plan sets it
                self._max_total_qo = max(qo_end, 1)
            if qo_end > self._max_total_qo:
                raise ArgumentError(
                    f"qo_indptr: qo_indptr[-1] = {qo_end} query rows exceed the "
                    f"{self._max_total_qo} of the CUDA graph mode (the first plan's, or "
                    "max_total_qo_tokens)"
                )
            if masked and self._custom_mask_buf is None:
                raise ArgumentError(
                    f"custom_mask_buf: None, but a CUDA-graph mode plan with {feature} needs "
                    "it: pass the wrapper a uint8 CUDA buffer with room for the largest packed "
                    "mask (sum over requests of ceil(qo_len * kv_len / 8) bytes)"
                )

        # head_dim_vo: None or head_dim_qk for one head dim (FlashInfer's default).
        vo = head_dim if head_dim_vo is None else head_dim_vo
        key = (kernel_causal, num_qo_heads, num_kv_heads, head_dim, vo,
               page_size, self._kv_layout_code, q_dtype, kv_dtype, sm, cap, wl, ks, vs,
               variant.handle if variant is not None else None, rope)
        options = functools.partial(
            _lib.attention_options, num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim=head_dim,
            head_dim_vo=vo if vo != head_dim else 0, page_size=page_size,
            kv_layout=self._kv_layout_code, q_dtype=T.dl_dtype(q_dtype),
            kv_dtype=T.dl_dtype(kv_dtype), sm_scale=0.0 if sm is None else sm,
            logits_soft_cap=cap, window_left=wl, k_scale=ks, v_scale=vs,
            use_cuda_graph=1 if graph else 0,
            variant=variant.handle if variant is not None else None, **A.rope_fields(rope))
        # A failed create or plan leaves no runnable plan (creating may touch the workspace
        # the previous plan's schedule lives in).
        self._plan = None
        # The mask is built and checked before the C plan: a captured graph replays whatever
        # schedule the object holds, so nothing may reject the plan after the C plan has
        # replaced it.
        mask = (self._mask_prepare(custom_mask, packed_custom_mask, qo_host, kv_host, last_host,
                                   page_size, batch_size) if masked else None)
        op = self._ensure_op(key, options, kernel_causal, batch_size, total_qo, variant)

        p_i32 = ctypes.POINTER(ctypes.c_int32)
        _lib.check(
            op.lib.cinfer_batch_prefill_plan(
                op.handle, ctypes.cast(qo_host.data_ptr(), p_i32),
                ctypes.cast(kv_host.data_ptr(), p_i32),
                ctypes.cast(last_host.data_ptr(), p_i32) if last_host is not None and batch_size
                else None,
                batch_size, T.stream_of(self.device)),
            where,
        )
        p = _PrefillPlan()
        p.op = op
        p.batch_size = batch_size
        p.qo_end = int(qo_host[batch_size])
        p.num_qo_heads = num_qo_heads
        p.num_kv_heads = num_kv_heads
        p.head_dim = head_dim
        p.head_dim_vo = vo
        p.page_size = page_size
        p.q_dtype = q_dtype
        p.kv_dtype = kv_dtype
        p.causal = causal
        p.sm_scale = sm if sm is not None else A.f32(1.0 / math.sqrt(head_dim))
        p.logits_soft_cap = cap
        p.window_left = wl
        p.k_scale = ks
        p.v_scale = vs
        p.variant = variant
        p.kv_indices = None
        p.dl_kv_indices = None
        p.kv_indices_ref = None
        p.run_fn = op.lib.cinfer_batch_prefill_run  # the library that made op
        p.pos_encoding_mode = mode
        p.rope = rope
        p.feature = feature
        p.builtin_args = None
        if masked:
            p.builtin_args = V.pack_args(variant, self._mask_commit(mask, batch_size,
                                                                    non_blocking), where)
        elif alibi_args is not None:
            p.builtin_args = V.pack_args(variant, alibi_args, where)
        return p, (qo_indptr, kv_indptr, last_page_len), kv_host

    def _mask_prepare(self, custom_mask, packed_custom_mask, qo_host, kv_host, last_host,
                      page_size: int, batch_size: int):
        """The "custom_mask" variant's packed mask and per-request row offsets and strides for
        the plan's lengths, checked (the mask's size, and in graph mode the fixed buffers'
        room) before the C plan; :meth:`_mask_commit` puts them in place after it."""
        torch = T.torch_module()
        qo_lens = (qo_host[1:] - qo_host[:-1]).to(torch.int64)
        kv_lens = (kv_host[1:] - kv_host[:-1]).to(torch.int64)
        if last_host is not None:  # paged: the entries are pages
            kv_lens = torch.where(kv_lens > 0, (kv_lens - 1) * page_size + last_host.long(),
                                  torch.zeros_like(kv_lens))
        packed, mask_indptr, row_offset, row_stride = M.batch_mask(
            custom_mask, packed_custom_mask, qo_lens, kv_lens, self.device)
        if self._use_cuda_graph:
            need = int(mask_indptr[-1])
            buf = self._custom_mask_buf
            if need > buf.shape[0] or buf.shape[0] == 0:
                raise ArgumentError(
                    f"custom_mask_buf: {buf.shape[0]} bytes, the plan's packed mask needs {need} "
                    "(sum over requests of ceil(qo_len * kv_len / 8)); give the wrapper a larger "
                    "buffer"
                )
            if (self._mask_indptr_buf is not None
                    and self._mask_indptr_buf.shape[0] < batch_size + 1):
                raise ArgumentError(
                    f"mask_indptr_buf: {self._mask_indptr_buf.shape[0]} entries, expected at "
                    f"least {batch_size + 1} (batch_size + 1)"
                )
        return packed, mask_indptr, row_offset, row_stride

    def _mask_commit(self, mask, batch_size: int, non_blocking: bool):
        """The variant's arguments from :meth:`_mask_prepare`'s mask, on the device; in graph
        mode copied into the wrapper's fixed buffers (after the C plan accepted the plan)."""
        torch = T.torch_module()
        packed, mask_indptr, row_offset, row_stride = mask
        if not self._use_cuda_graph:
            return (packed, row_offset.to(self.device, non_blocking=non_blocking),
                    row_stride.to(self.device, non_blocking=non_blocking))
        need = int(mask_indptr[-1])
        buf = self._custom_mask_buf
        if self._mask_row_offset_buf is None:
            cap = max(self._fixed_batch_size, 1)
            self._mask_row_offset_buf = torch.zeros(cap, dtype=torch.int64, device=self.device)
            self._mask_row_stride_buf = torch.zeros(cap, dtype=torch.int32, device=self.device)
        buf[:need].copy_(packed[:need], non_blocking=non_blocking)
        self._mask_row_offset_buf[:batch_size].copy_(row_offset, non_blocking=non_blocking)
        self._mask_row_stride_buf[:batch_size].copy_(row_stride, non_blocking=non_blocking)
        if self._mask_indptr_buf is not None:  # FlashInfer's buffer, for compatibility only
            self._mask_indptr_buf[: batch_size + 1].copy_(mask_indptr.to(torch.int32),
                                                          non_blocking=non_blocking)
        return buf, self._mask_row_offset_buf, self._mask_row_stride_buf

    def _ensure_op(self, key, options, causal: bool, batch_size: int, total_qo: int,
                   variant) -> _Op:
        """The C object for ``key`` with room for the plan; created (or re-created larger)
        when needed. Outside graph mode the capacities grow in powers of two."""
        entry = self._ops.get(key)
        if entry is not None and batch_size <= entry.max_batch and total_qo <= entry.max_total_qo:
            self._ops.move_to_end(key)
            return entry
        where = f"{self._NAME}.plan"
        if self._use_cuda_graph:
            if self._graph_key is not None and key != self._graph_key:
                raise ArgumentError(
                    "CUDA graph mode: the attention options (causal, heads, head_dim, page_size, "
                    "dtypes, sm_scale, logits_soft_cap, window_left, scales, variant, RoPE) must "
                    "stay those of the first plan, since captured graphs run its kernels; use "
                    "another wrapper for other options"
                )
            candidates = [(self._fixed_batch_size, self._max_total_qo)]
        else:
            want_b, want_q = max(batch_size, 1), max(total_qo, 1)
            if entry is not None:
                want_b, want_q = max(want_b, entry.max_batch), max(want_q, entry.max_total_qo)
            rounded = (max(A.next_pow2(want_b), self._MIN_BATCH),
                       max(A.next_pow2(want_q), self._MIN_TOTAL_QO))
            candidates = [rounded] + ([(want_b, want_q)] if rounded != (want_b, want_q) else [])
        lib = _lib.lib()
        ctx = T.context_of(self.device)
        ws = self._float_workspace_buffer
        ws_bytes = ws.numel() * ws.element_size()
        need = 0
        for max_batch, max_total_qo in candidates:
            opts = options(max_batch_size=max_batch)
            nbytes = ctypes.c_size_t()
            _lib.check(lib.cinfer_batch_prefill_workspace_size(
                ctx, ctypes.byref(opts), self._STORAGE, int(causal), max_total_qo,
                ctypes.byref(nbytes)), where)
            need = nbytes.value
            if need <= ws_bytes:
                break
        else:
            raise ArgumentError(
                f"float_workspace_buffer: {ws_bytes} bytes, cinfer needs {need} bytes for "
                f"{max_batch} requests and {max_total_qo} query rows with these options; "
                "allocate a larger buffer",
                WORKSPACE_TOO_SMALL,
            )
        handle = ctypes.c_void_p()
        _lib.check(lib.cinfer_batch_prefill_create(
            ctx, ctypes.byref(opts), self._STORAGE, int(causal), max_total_qo, ws.data_ptr(),
            ws_bytes, ctypes.byref(handle)), where)
        if entry is not None:
            self._drop(key)
        op = _Op()
        op.handle = handle
        op.lib = lib
        op.key = key
        op.max_batch = max_batch
        op.max_total_qo = max_total_qo
        op.variant = variant  # the variant must outlive the object
        self._ops[key] = op
        if self._use_cuda_graph:
            self._graph_key = key
        while len(self._ops) > self._MAX_OPS:
            self._drop(next(iter(self._ops)))
        return op

    def _drop(self, key) -> None:
        op = self._ops.pop(key)
        if self._plan is not None and self._plan.op is op:
            self._plan = None
        op.lib.cinfer_batch_prefill_destroy(op.handle)

    def _destroy(self) -> None:
        self._plan = None
        ops = getattr(self, "_ops", None)
        while ops:
            self._drop(next(iter(ops)))

    def __del__(self) -> None:
        try:
            self._destroy()
        except Exception:  # interpreter shutdown: the library may already be unloaded
            pass

    def _require_plan(self, what: str = "run") -> _PrefillPlan:
        if self._plan is None:
            raise ArgumentError(f"{what}() before plan(): call plan() first (again after a "
                                "failed plan or reset_workspace_buffer)")
        return self._plan

    def _check_forward_options(self, causal, pos_encoding_mode, use_fp16_qk_reduction,
                               window_left, logits_soft_cap, sm_scale, rope_scale=None,
                               rope_theta=None) -> None:
        """forward()'s attention options must be the planned ones (``rope_scale`` /
        ``rope_theta``: None meaning 1 / 1e4, compared only with ``"ROPE_LLAMA"``)."""
        mode = A.pos_encoding_mode(pos_encoding_mode)
        rope = A.rope(mode, rope_scale, rope_theta)
        if use_fp16_qk_reduction:
            raise UnsupportedError("use_fp16_qk_reduction = True is not supported")
        p = self._require_plan("forward")
        given = {
            "pos_encoding_mode": mode,
            "causal": bool(causal),
            "window_left": A.window_left(window_left),
            "logits_soft_cap": A.soft_cap(logits_soft_cap),
            "sm_scale": (A.positive(sm_scale, "sm_scale", None) if sm_scale is not None
                         else A.f32(1.0 / math.sqrt(p.head_dim))),
        }
        planned_of = {}
        if rope is not None and p.rope is not None:  # both RoPE: the parameters must match too
            given.update(rope_scale=rope[0], rope_theta=rope[1])
            planned_of.update(rope_scale=p.rope[0], rope_theta=p.rope[1])
        for name, value in given.items():
            A.refuse_unplanned(name, value,
                               planned_of[name] if name in planned_of else getattr(p, name))

    def _run(self, p: _PrefillPlan, q, k_ref, v_ref, kv_indices_ref, out, lse, return_lse,
             args, variant_args, where):
        """The launch shared by both wrappers' run, with ``q`` not yet checked and the K/V
        references bound. The hot path (once per layer): argument structs are reused through
        the wrapper's slots (a tensor of the layout seen last only moves their data pointers;
        another is checked and bound)."""
        slots = self._slots
        q, q_ref = A.slot_ref(slots.q, q, "q", self.device, 3,
                              "[qo_indptr[-1], num_qo_heads, head_dim]")
        torch = slots.torch
        graph = self._use_cuda_graph
        if graph and q.shape[0] < self._max_total_qo and torch.cuda.is_current_stream_capturing():
            # A replay after a later plan with more rows would read q and write out past the
            # rows captured here.
            raise ArgumentError(
                f"q: capturing run() with {q.shape[0]} rows, below the {self._max_total_qo} "
                "query rows of the CUDA graph mode: capture with q and out of that many rows so "
                "they cover every later plan"
            )
        if out is None:
            out = torch.empty((q.shape[0], q.shape[1], p.head_dim_vo), dtype=q.dtype,
                              device=q.device)
        out, out_ref = A.slot_ref(slots.out, out, "out", self.device)
        lse_ref = None
        if lse is None:
            if return_lse:
                lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
        if lse is not None:
            lse, lse_ref = A.slot_ref(slots.lse, lse, "lse", self.device)
        if p.builtin_args is not None:
            if args or variant_args is not None:
                M.refuse_variant_args(p.feature, True, where)
            args_ref = p.builtin_args.ref()
        elif not args and variant_args is None:
            args_ref = None  # what packing no arguments gives, for any variant
        else:
            packed = V.pack_args(p.variant, V.run_args(args, variant_args, where), where)
            args_ref = packed.ref()
        if q.shape[0] == 0 and p.qo_end <= 0 and not graph:
            # No rows (an empty tensor has no data pointer for the library to check).
            return (out, lse) if return_lse else out
        _lib.check(
            p.run_fn(p.op.handle, q_ref, k_ref, v_ref, kv_indices_ref, out_ref, lse_ref,
                     args_ref, slots.stream()),
            where,
        )
        return (out, lse) if return_lse else out


class _RunSlots:
    """What a batch prefill wrapper's run reuses from call to call, whatever the plan: the
    argument structs of q, K/V, out and lse, torch and the stream accessor."""

    __slots__ = ("q", "kv", "k", "v", "out", "lse", "torch", "stream")

    def __init__(self, device) -> None:
        self.q = T.DLSlot("q")
        self.kv = A.PagedKVSlots(device)
        self.k = T.DLSlot("k")
        self.v = T.DLSlot("v")
        self.out = T.DLSlot("out")
        self.lse = T.DLSlot("lse")
        self.torch = T.torch_module()
        self.stream = T.stream_getter(device)


_WRAPPER_NOTES = """
    Differences from FlashInfer: the kernels are chosen when :meth:`plan` first sees a set of
    create-time options (``causal``, heads, head dim, page size, dtypes, ``sm_scale``,
    ``logits_soft_cap``, ``window_left``, scales, variant) and are kept for later plans with
    the same options (a few sets per wrapper); the objects grow with the batch outside CUDA
    graph mode. In CUDA graph mode the options must stay those of the first plan, the batch may
    be smaller than the buffers' capacity (FlashInfer requires it equal), and the most query
    rows of any plan is the first plan's (FlashInfer's rule) or ``max_total_qo_tokens``;
    :meth:`run` must be captured with ``q`` of at least that many rows. A custom mask
    (``custom_mask`` / ``packed_custom_mask``) or ``pos_encoding_mode="ALIBI"`` runs the
    library's built-in variant ``"custom_mask"`` or ``"alibi"``, so it is a create-time option
    too (a graph-mode wrapper planned with a mask needs one at every plan), it cannot be
    combined with the other, with ``variant`` or with ``logits_soft_cap``
    (:class:`cinfer.UnsupportedError`), and :meth:`run` takes no variant arguments then. In
    graph mode each plan copies the packed mask into ``custom_mask_buf``, which must stay
    alive as long as the captured graphs; outside graph mode the plan keeps the packed mask
    (the caller's ``packed_custom_mask`` itself when it is contiguous on the device: do not
    change it before the next plan). ``pos_encoding_mode="ROPE_LLAMA"`` (in-kernel RoPE) is a
    create-time option too, with ``rope_scale`` / ``rope_theta`` part of the object's options.
    fp8 K/V (``kv_data_type``) with ``k_scale`` / ``v_scale`` is supported, not together with
    RoPE. ``head_dim_vo != head_dim_qk`` (e.g. 192 / 128) takes 16-bit K/V, no RoPE and, paged,
    a ``(k_cache, v_cache)`` pair. ``use_fp16_qk_reduction`` raises
    :class:`cinfer.UnsupportedError`. Two wrappers must
    not share one workspace buffer (each plan writes its schedule there). A plan that raises
    leaves no runnable plan. The wrapper is not thread-safe.
"""


_PAGED_RUN = "BatchPrefillWithPagedKVCacheWrapper.run"
_RAGGED_RUN = "BatchPrefillWithRaggedKVCacheWrapper.run"


class BatchPrefillWithPagedKVCacheWrapper(_BatchPrefillBase):
    __doc__ = r"""Batch prefill/append attention over a paged KV cache, planned once per step and run
    once per layer.

    Request ``b`` owns query rows ``qo_indptr[b]:qo_indptr[b+1]`` of ``q`` and pages
    ``paged_kv_indices[paged_kv_indptr[b]:paged_kv_indptr[b+1]]``; its
    ``kv_len = (num_pages - 1) * page_size + last_page_len[b]`` (0 without pages). Its query
    rows are the last ``qo_len`` of its ``kv_len`` positions (row ``i`` at position
    ``i + kv_len - qo_len``; the causal mask is bottom-right aligned; ``qo_len > kv_len`` leaves
    the first rows with nothing to attend under causal: output 0, LSE ``-inf``).

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Device workspace (any dtype, contiguous, CUDA) for the schedule; :meth:`plan` raises
        ValueError with the size needed when it is too small (128 MiB is plenty).
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``.
    use_cuda_graph : bool
        CUDA graph mode: the page table lives in the buffers below, the kernel grid is fixed,
        and :meth:`run` can be captured; later plans are honoured by replays.
    qo_indptr_buf : Optional[torch.Tensor]
        Graph mode: int32 CUDA buffer of ``max_batch_size + 1`` entries (its length sets the
        batch capacity; the plan's ``qo_indptr`` is copied there).
    paged_kv_indptr_buf : Optional[torch.Tensor]
        Graph mode: int32 CUDA buffer of ``max_batch_size + 1`` entries.
    paged_kv_indices_buf : Optional[torch.Tensor]
        Graph mode: int32 CUDA buffer with room for every plan's page indices (the kernels read
        the page indices from it).
    paged_kv_last_page_len_buf : Optional[torch.Tensor]
        Graph mode: int32 CUDA buffer of ``max_batch_size`` entries.
    custom_mask_buf : Optional[torch.Tensor]
        Graph mode with a custom mask (required then): 1-D uint8 CUDA buffer with room for the
        largest packed mask of any plan (``sum(ceil(qo_len[i] * kv_len[i] / 8))`` bytes); each
        plan copies its packed mask there, so captured runs read it. Ignored outside graph
        mode (as in FlashInfer).
    mask_indptr_buf : Optional[torch.Tensor]
        Graph mode, optional: 1-D int32 CUDA buffer of ``max_batch_size + 1`` entries; each
        plan with a custom mask writes its ``mask_indptr`` (bytes) there, for compatibility
        (cinfer's kernels do not read it).
    backend : str
        ``"auto"``, ``"fa2"`` or ``"fa3"``: accepted, cinfer chooses its kernels itself.
    jit_args, jit_kwargs : None
        FlashInfer's JIT variants (``jit_kwargs`` since 0.2.14) are not supported
        (:class:`cinfer.UnsupportedError`); pass a :class:`cinfer.Variant` to :meth:`plan`
        instead.
    max_total_qo_tokens : Optional[int]
        cinfer extension (keyword-only), graph mode: the most query rows of any plan (default:
        the first plan's).

    Raises
    ------
    TypeError
        ``float_workspace_buffer`` is not a tensor.
    ValueError
        A CPU or non-contiguous workspace, a bad ``kv_layout``, missing or malformed graph
        buffers, a ``custom_mask_buf`` that is not 1-D uint8 or a ``mask_indptr_buf`` that is
        not 1-D int32 (graph mode); :class:`cinfer.UnsupportedError` for ``jit_args`` or
        ``jit_kwargs``.

    Notes
    -----""" + _WRAPPER_NOTES

    _STORAGE = _lib.KV_STORAGE_PAGED
    _NAME = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Optional[torch.Tensor] = None,
        paged_kv_indptr_buf: Optional[torch.Tensor] = None,
        paged_kv_indices_buf: Optional[torch.Tensor] = None,
        paged_kv_last_page_len_buf: Optional[torch.Tensor] = None,
        custom_mask_buf: Optional[torch.Tensor] = None,
        mask_indptr_buf: Optional[torch.Tensor] = None,
        backend: str = "auto",
        jit_args=None,
        jit_kwargs=None,
        *,
        max_total_qo_tokens: Optional[int] = None,
    ) -> None:
        self._init_common(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                          custom_mask_buf, mask_indptr_buf, max_total_qo_tokens, jit_kwargs)
        self._qo_indptr_buf = qo_indptr_buf
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        self._fixed_batch_size = 0
        if self._use_cuda_graph:
            cap = self._graph_buffers({
                "qo_indptr_buf": qo_indptr_buf,
                "paged_kv_indptr_buf": paged_kv_indptr_buf,
                "paged_kv_indices_buf": paged_kv_indices_buf,
                "paged_kv_last_page_len_buf": paged_kv_last_page_len_buf,
            }, "qo_indptr_buf")
            if paged_kv_indptr_buf.shape[0] != cap + 1:
                raise ArgumentError(f"paged_kv_indptr_buf: {paged_kv_indptr_buf.shape[0]} "
                                    f"entries, expected {cap + 1} (len(qo_indptr_buf))")
            if paged_kv_last_page_len_buf.shape[0] != cap:
                raise ArgumentError(
                    f"paged_kv_last_page_len_buf: {paged_kv_last_page_len_buf.shape[0]} entries, "
                    f"expected {cap} (len(qo_indptr_buf) - 1)")
            self._fixed_batch_size = cap

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: Optional[int] = None,
        custom_mask: Optional[torch.Tensor] = None,
        packed_custom_mask: Optional[torch.Tensor] = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking: bool = True,
        prefix_len_ptr: Optional[torch.Tensor] = None,
        token_pos_in_items_ptr: Optional[torch.Tensor] = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Optional[torch.Tensor] = None,
        seq_lens: Optional[torch.Tensor] = None,
        seq_lens_q: Optional[torch.Tensor] = None,
        block_tables: Optional[torch.Tensor] = None,
        max_token_per_sequence: Optional[int] = None,
        max_sequence_kv: Optional[int] = None,
        *,
        o_data_type=None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        variant: Optional[V.Variant] = None,
    ) -> None:
        r"""Plan one step for the batch; every :meth:`run` until the next plan (one per layer)
        uses it.

        Parameters
        ----------
        qo_indptr : torch.Tensor
            ``[batch_size + 1]`` int32 (CPU or CUDA), non-decreasing: request ``b`` owns query
            rows ``qo_indptr[b]:qo_indptr[b+1]``.
        paged_kv_indptr : torch.Tensor
            ``[batch_size + 1]`` int32, non-decreasing: request ``b`` owns page-table entries
            ``paged_kv_indptr[b]:paged_kv_indptr[b+1]``.
        paged_kv_indices : torch.Tensor
            ``[>= paged_kv_indptr[-1]]`` int32 page indices into the paged cache.
        paged_kv_last_page_len : torch.Tensor
            ``[batch_size]`` int32, each in ``1..page_size`` for a request with pages.
        num_qo_heads, num_kv_heads : int
            Query and KV heads (``num_qo_heads`` a multiple of ``num_kv_heads``).
        head_dim_qk : int
            Head dim of q and k (and of v and out unless ``head_dim_vo`` differs): a multiple
            of 16, at most 256.
        page_size : int
            Tokens per page, 1..256.
        head_dim_vo : Optional[int]
            Head dim of v and out: None (= ``head_dim_qk``) or a multiple of 16 up to 256
            (D_qk != D_vo, e.g. 192 / 128: 16-bit K/V, no RoPE, separate K and V caches; else
            :class:`cinfer.UnsupportedError`). The default ``sm_scale`` stays
            ``1 / sqrt(head_dim_qk)``.
        custom_mask : Optional[torch.Tensor]
            FlashInfer's flattened boolean mask: the ``[qo_len, kv_len]`` row-major matrices of
            all requests concatenated in request order,
            ``sum(qo_len[i] * kv_len[i])`` torch.bool elements (CPU or CUDA); True keeps
            the element. Row ``i`` of request ``b``'s matrix is its position
            ``i + kv_len - qo_len`` (bottom-right aligned). It replaces the causal mask
            (``causal`` is then ignored, as in FlashInfer); ``window_left`` still applies.
            Packed here with :func:`cinfer.segment_packbits` (``bitorder="little"``; it reads
            the packed size back, a synchronization).
        packed_custom_mask : Optional[torch.Tensor]
            The same masks already packed, as
            ``segment_packbits(custom_mask, bit_indptr, bitorder="little")`` writes them: 1-D
            torch.uint8, request ``b``'s bits starting at byte ``mask_indptr[b]`` with
            ``mask_indptr[b+1] - mask_indptr[b] = ceil(qo_len[b] * kv_len[b] / 8)`` (for one
            request, ``packbits(mask.flatten(), bitorder="little")``). Outside graph mode a
            contiguous tensor on the wrapper's device is read in place by every :meth:`run`
            of this plan (no copy): keep it alive and unchanged until the next plan. Takes
            precedence over ``custom_mask``.
        causal : bool
            Bottom-right aligned causal mask per request. Default False. Ignored with a custom
            mask.
        pos_encoding_mode : str
            ``"NONE"`` (default) or ``"ALIBI"`` (``slope_h * (j - p_i)`` added to the scaled
            logit, FlashInfer's default slopes, as in
            :func:`cinfer.single_prefill_with_kv_cache`); ``"ROPE_LLAMA"``: in-kernel RoPE
            (Llama's rotate-half) of each request's query row ``i`` at its position
            ``kv_len - qo_len + i`` and of its key ``j`` at ``j`` (the cache holds un-rotated
            keys), pair ``(x[m], x[m + D/2])`` rotated by
            ``(pos / rope_scale) * rope_theta^(-2m / D)``, as in
            :func:`cinfer.single_prefill_with_kv_cache`; ``head_dim_qk`` a multiple of 16,
            lengths up to 2^24.
        use_fp16_qk_reduction : bool
            Only False.
        sm_scale : Optional[float]
            Logit scale; default ``1 / sqrt(head_dim_qk)``.
        window_left : int
            Sliding window: row at position ``p`` attends ``p - window_left .. p``; -1 = off.
        logits_soft_cap : Optional[float]
            ``c > 0`` applies ``c * tanh(s / c)``; None or 0 = off.
        rope_scale, rope_theta : Optional[float]
            With ``"ROPE_LLAMA"``: the position divisor (default 1) and the frequency base
            (default 1e4), each finite and > 0 (ValueError otherwise); ignored with other
            modes, as in FlashInfer.
        q_data_type, kv_data_type : str or torch.dtype
            float16 (default) or bfloat16; ``kv_data_type`` defaults to ``q_data_type`` and may
            be fp8 (``torch.float8_e4m3fn``, ``torch.float8_e5m2``), with ``k_scale`` /
            ``v_scale`` (the logits are ``(q . k) * sm_scale * k_scale``, the output is
            multiplied by ``v_scale``).
        non_blocking : bool
            Copy the page indices to the device without blocking the host.
        prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr
            Multi-item scoring: not supported (must keep their defaults).
        seq_lens, seq_lens_q, block_tables, max_token_per_sequence, max_sequence_kv : None
            FlashInfer 0.2.14's arguments for its cuDNN / TensorRT-LLM backends (positional
            after ``max_item_len_ptr``, as there): only None (:class:`cinfer.UnsupportedError`
            otherwise); cinfer takes the lengths and pages from the indptr arrays, the indices
            and ``paged_kv_last_page_len``.
        o_data_type : optional
            cinfer extension (keyword-only): None or q's dtype.
        k_scale, v_scale : Optional[float]
            cinfer extension (keyword-only): multiply the logits / the output (default 1).
        variant : Optional[cinfer.Variant]
            cinfer extension (keyword-only): an attention variant (or a built-in name); its
            arguments go to :meth:`run`. ``logits_soft_cap`` must then be off, and there must
            be no custom mask and no ALiBi; ``batch_idx`` of the hooks is the request's index in
            this plan.

        Raises
        ------
        TypeError
            An index argument or a mask is not a tensor, or ``variant`` is not a Variant; a
            number argument of another type (a string or a bool; a float for the head counts,
            head dims, ``page_size`` or ``window_left``).
        ValueError
            Index tensors that are not 1-D int32 or disagree in length, non-monotone indptr,
            ``last_page_len`` out of range (the library's message names the index), a graph-mode
            plan beyond the buffers (``custom_mask_buf`` missing or too small included), a
            workspace that is too small, a ``custom_mask`` that is not torch.bool with
            ``sum(qo_len[i] * kv_len[i])`` elements, a ``packed_custom_mask`` that is not 1-D
            uint8 or shorter than ``sum(ceil(qo_len[i] * kv_len[i] / 8))`` bytes;
            :class:`cinfer.UnsupportedError` for what cinfer does not implement (see the class
            notes, head dims, page sizes).
        cinfer.CinferError
            CUDA or JIT failures (kernels are compiled or loaded here, never in :meth:`run`;
            :class:`cinfer.CompileError` for a variant's source).

        Notes
        -----
        Host copies of the indptr arrays and ``paged_kv_last_page_len`` are taken (a device to
        host copy, which synchronizes, for CUDA tensors: pass CPU tensors to avoid it). The
        schedule and the page indices are copied to the device on PyTorch's current stream.
        """
        A.refuse_backend_only(
            "BatchPrefillWithPagedKVCacheWrapper.plan", seq_lens=seq_lens, seq_lens_q=seq_lens_q,
            block_tables=block_tables, max_token_per_sequence=max_token_per_sequence,
            max_sequence_kv=max_sequence_kv)
        _check_plan_unsupported(use_fp16_qk_reduction,
                                {"prefix_len_ptr": prefix_len_ptr is not None,
                                 "token_pos_in_items_ptr": token_pos_in_items_ptr is not None,
                                 "token_pos_in_items_len": token_pos_in_items_len,
                                 "max_item_len_ptr": max_item_len_ptr is not None})
        indices = T.as_tensor(paged_kv_indices, "paged_kv_indices")
        torch = T.torch_module()
        T.check_ndim(indices, "paged_kv_indices", 1, "a 1-D int32 tensor")
        T.check_dtype(indices, "paged_kv_indices", (torch.int32,), "torch.int32",
                      unsupported=False)

        def check_kv_end(num_pages: int) -> None:
            if num_pages > indices.shape[0]:
                raise ArgumentError(f"paged_kv_indices: {indices.shape[0]} entries, but "
                                    f"paged_kv_indptr[-1] = {num_pages}")
            if self._use_cuda_graph and num_pages > self._paged_kv_indices_buf.shape[0]:
                raise ArgumentError(
                    f"paged_kv_indices: paged_kv_indptr[-1] = {num_pages} entries do not fit "
                    f"paged_kv_indices_buf ({self._paged_kv_indices_buf.shape[0]} entries)"
                )

        p, (qo_indptr, kv_indptr, last_page_len), kv_host = self._common_plan(
            qo_indptr=qo_indptr, kv_indptr=paged_kv_indptr, last_page_len=paged_kv_last_page_len,
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim_qk,
            head_dim_vo=head_dim_vo,
            page_size=page_size, causal=causal, sm_scale=sm_scale, window_left=window_left,
            logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
            o_data_type=o_data_type, k_scale=k_scale, v_scale=v_scale, variant=variant,
            custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale, rope_theta=rope_theta,
            non_blocking=non_blocking,
            check_kv_end=check_kv_end)
        b = p.batch_size
        num_pages = int(kv_host[b])
        if self._use_cuda_graph:
            self._qo_indptr_buf[: b + 1].copy_(qo_indptr, non_blocking=non_blocking)
            self._paged_kv_indptr_buf[: b + 1].copy_(kv_indptr, non_blocking=non_blocking)
            self._paged_kv_last_page_len_buf[:b].copy_(last_page_len, non_blocking=non_blocking)
            self._paged_kv_indices_buf[:num_pages].copy_(indices[:num_pages],
                                                         non_blocking=non_blocking)
            d_indices = self._paged_kv_indices_buf
        else:
            d_indices = indices.to(self.device, non_blocking=non_blocking)
            if d_indices.numel() == 0:  # an empty tensor has no data pointer
                d_indices = torch.zeros(1, dtype=torch.int32, device=self.device)
        p.kv_indices = d_indices
        p.dl_kv_indices = T.to_dl(d_indices, "paged_kv_indices")
        p.kv_indices_ref = ctypes.byref(p.dl_kv_indices)
        self._plan = p

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
        *args,
        q_scale: Optional[float] = None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        out: Optional[torch.Tensor] = None,
        lse: Optional[torch.Tensor] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
        window_left: Optional[int] = None,
        sinks: Optional[torch.Tensor] = None,
        variant_args=None,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        r"""Batch prefill attention of the planned batch for one layer.

        Never allocates device memory of its own (only ``out``/``lse`` when not given, through
        PyTorch), synchronizes or compiles, so it can be captured in a CUDA graph.

        Parameters
        ----------
        q : torch.Tensor
            ``[>= qo_indptr[-1], num_qo_heads, head_dim]`` in the planned dtype; any strides with
            a contiguous last dim. Rows no request owns are neither read nor written.
        paged_kv_cache : tuple of two torch.Tensor, or torch.Tensor
            ``(k_cache, v_cache)``, each ``[max_num_pages, page_size, num_kv_heads, head_dim]``
            (NHD) or ``[max_num_pages, num_kv_heads, page_size, head_dim]`` (HND) with the same
            strides; or one combined ``[max_num_pages, 2, ...]`` tensor. With ``head_dim_vo``
            planned apart from ``head_dim_qk``: the pair only, ``v_cache`` with ``head_dim_vo``
            as its last dim and strides of its own.
        *args
            The planned variant's arguments in declaration order (FlashInfer's way of passing a
            custom kernel's arguments); or use ``variant_args``. None after a plan with a custom
            mask or ALiBi (cinfer passes their built-in variants' arguments; TypeError).
        q_scale : None
            Not supported.
        k_scale, v_scale : Optional[float]
            None (the planned values) or the planned values.
        out : Optional[torch.Tensor]
            Output buffer ``[q.shape[0], num_qo_heads, head_dim_vo]`` (q's shape unless
            ``head_dim_vo`` differs) in q's dtype; allocated if None.
        lse : Optional[torch.Tensor]
            ``[q.shape[0], num_qo_heads]`` float32; written when given, allocated when None and
            ``return_lse``.
        return_lse : bool
            Return ``(out, lse)``.
        enable_pdl : Optional[bool]
            Accepted and ignored.
        window_left : Optional[int]
            FlashInfer 0.2.14: None (the planned value) or the planned value; another value
            raises ValueError (FlashInfer's FA2/FA3 paths refuse it too).
        sinks : Optional[torch.Tensor]
            FlashInfer 0.2.14: only None (:class:`cinfer.UnsupportedError`); plan with the
            built-in variant ``"sinks"`` and pass the tensor as its argument instead.
        variant_args : sequence or mapping, optional
            cinfer extension: the variant's arguments in declaration order or by name.

        Returns
        -------
        out : torch.Tensor
            ``out``'s shape, q's dtype (0 for rows with nothing to attend).
        lse : torch.Tensor
            Only with ``return_lse``: ``[q.shape[0], num_qo_heads]`` float32, **base 2**
            (``-inf`` for rows with nothing to attend).

        Raises
        ------
        TypeError
            A tensor argument is not a tensor; a variant argument of the wrong Python type.
        ValueError
            No plan, shapes or dtypes that contradict the plan, CPU tensors, variant arguments
            that do not match the declaration (the library's message), a CUDA-graph capture
            with ``q`` too short, a ``window_left`` other than the planned one;
            :class:`cinfer.UnsupportedError` for ``q_scale``, ``sinks`` or misaligned rows.
        cinfer.CinferError
            A CUDA launch failure.
        """
        p = self._require_plan()
        if q_scale is not None:
            raise UnsupportedError(f"q_scale = {q_scale!r} is not supported (fp8 queries)")
        if k_scale is not None or v_scale is not None:
            A.refuse_unplanned_scales(k_scale, v_scale, p.k_scale, p.v_scale)
        if window_left is not None or sinks is not None:
            A.run_window_and_sinks(window_left, sinks, p.window_left)
        k_ref, v_ref = self._slots.kv.refs(paged_kv_cache)
        return self._run(p, q, k_ref, v_ref, p.kv_indices_ref, out, lse, return_lse, args,
                         variant_args, _PAGED_RUN)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: torch.Tensor, paged_kv_cache, causal: bool = False,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                window_left: int = -1, logits_soft_cap: Optional[float] = None,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> torch.Tensor:
        r"""Deprecated FlashInfer entry point: :meth:`run` with the attention options repeated;
        in cinfer each must equal the planned value (else ValueError)."""
        self._check_forward_options(causal, pos_encoding_mode, use_fp16_qk_reduction,
                                    window_left, logits_soft_cap, sm_scale, rope_scale,
                                    rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                           k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                           window_left: int = -1, logits_soft_cap: Optional[float] = None,
                           sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                           rope_theta: Optional[float] = None):
        r"""Deprecated FlashInfer entry point: :meth:`forward` that also returns the LSE."""
        self._check_forward_options(causal, pos_encoding_mode, use_fp16_qk_reduction,
                                    window_left, logits_soft_cap, sm_scale, rope_scale,
                                    rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_BatchPrefillBase):
    __doc__ = r"""Batch prefill/append attention over ragged K/V tensors (every request's K/V rows
    concatenated), planned once per step and run once per layer.

    Request ``b`` owns query rows ``qo_indptr[b]:qo_indptr[b+1]`` and K/V rows
    ``kv_indptr[b]:kv_indptr[b+1]``; its query rows are the last ``qo_len`` of its ``kv_len``
    positions (bottom-right aligned causal mask; ``qo_len > kv_len`` is allowed).

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Device workspace (contiguous, CUDA) for the schedule; :meth:`plan` raises ValueError
        with the size needed when it is too small.
    kv_layout : str
        ``"NHD"`` (K/V ``[total_kv, num_kv_heads, head_dim]``, default) or ``"HND"``
        (``[num_kv_heads, total_kv, head_dim]``).
    use_cuda_graph : bool
        CUDA graph mode (fixed grid; :meth:`run` can be captured, later plans are honoured by
        replays).
    qo_indptr_buf, kv_indptr_buf : Optional[torch.Tensor]
        Graph mode: int32 CUDA buffers of ``max_batch_size + 1`` entries (``qo_indptr_buf``'s
        length sets the batch capacity; the plan's indptr arrays are copied there, though
        cinfer's kernels read the lengths from the workspace).
    custom_mask_buf, mask_indptr_buf : Optional[torch.Tensor]
        Graph mode with a custom mask: as :class:`BatchPrefillWithPagedKVCacheWrapper`
        (``custom_mask_buf`` required then).
    backend : str
        ``"auto"``, ``"fa2"`` or ``"fa3"``: accepted and ignored.
    jit_args, jit_kwargs : None
        Not supported (``jit_kwargs`` as FlashInfer 0.2.14 added it); pass a
        :class:`cinfer.Variant` to :meth:`plan`.
    max_total_qo_tokens : Optional[int]
        cinfer extension (keyword-only), graph mode: the most query rows of any plan (default:
        the first plan's).

    Raises
    ------
    TypeError, ValueError
        As :class:`BatchPrefillWithPagedKVCacheWrapper`.

    Notes
    -----""" + _WRAPPER_NOTES

    _STORAGE = _lib.KV_STORAGE_RAGGED
    _NAME = "BatchPrefillWithRaggedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Optional[torch.Tensor] = None,
        kv_indptr_buf: Optional[torch.Tensor] = None,
        custom_mask_buf: Optional[torch.Tensor] = None,
        mask_indptr_buf: Optional[torch.Tensor] = None,
        backend: str = "auto",
        jit_args=None,
        jit_kwargs=None,
        *,
        max_total_qo_tokens: Optional[int] = None,
    ) -> None:
        self._init_common(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                          custom_mask_buf, mask_indptr_buf, max_total_qo_tokens, jit_kwargs)
        self._qo_indptr_buf = qo_indptr_buf
        self._kv_indptr_buf = kv_indptr_buf
        self._fixed_batch_size = 0
        if self._use_cuda_graph:
            cap = self._graph_buffers({"qo_indptr_buf": qo_indptr_buf,
                                       "kv_indptr_buf": kv_indptr_buf}, "qo_indptr_buf")
            if kv_indptr_buf.shape[0] != cap + 1:
                raise ArgumentError(f"kv_indptr_buf: {kv_indptr_buf.shape[0]} entries, expected "
                                    f"{cap + 1} (len(qo_indptr_buf))")
            self._fixed_batch_size = cap

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: Optional[int] = None,
        custom_mask: Optional[torch.Tensor] = None,
        packed_custom_mask: Optional[torch.Tensor] = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking: bool = True,
        prefix_len_ptr: Optional[torch.Tensor] = None,
        token_pos_in_items_ptr: Optional[torch.Tensor] = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Optional[torch.Tensor] = None,
        *,
        o_data_type=None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        variant: Optional[V.Variant] = None,
    ) -> None:
        r"""Plan one step for the batch; every :meth:`run` until the next plan uses it.

        Parameters
        ----------
        qo_indptr : torch.Tensor
            ``[batch_size + 1]`` int32 (CPU or CUDA), non-decreasing.
        kv_indptr : torch.Tensor
            ``[batch_size + 1]`` int32, non-decreasing: request ``b`` owns K/V rows
            ``kv_indptr[b]:kv_indptr[b+1]``.
        num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask,
        causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
        sm_scale, rope_scale, rope_theta, q_data_type, kv_data_type, non_blocking,
        prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr,
        o_data_type, k_scale, v_scale, variant
            As :meth:`BatchPrefillWithPagedKVCacheWrapper.plan` (note FlashInfer's different
            order of ``window_left``, ``logits_soft_cap`` and ``sm_scale`` here).

        Raises
        ------
        TypeError, ValueError, cinfer.CinferError
            As :meth:`BatchPrefillWithPagedKVCacheWrapper.plan`.
        """
        _check_plan_unsupported(use_fp16_qk_reduction,
                                {"prefix_len_ptr": prefix_len_ptr is not None,
                                 "token_pos_in_items_ptr": token_pos_in_items_ptr is not None,
                                 "token_pos_in_items_len": token_pos_in_items_len,
                                 "max_item_len_ptr": max_item_len_ptr is not None})
        p, (qo_indptr, kv_indptr, _), _ = self._common_plan(
            qo_indptr=qo_indptr, kv_indptr=kv_indptr, last_page_len=None,
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim_qk,
            head_dim_vo=head_dim_vo,
            page_size=16, causal=causal, sm_scale=sm_scale, window_left=window_left,
            logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
            o_data_type=o_data_type, k_scale=k_scale, v_scale=v_scale, variant=variant,
            custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale, rope_theta=rope_theta,
            non_blocking=non_blocking, check_kv_end=self._check_captured_kv)
        if self._use_cuda_graph:
            b = p.batch_size
            self._qo_indptr_buf[: b + 1].copy_(qo_indptr, non_blocking=non_blocking)
            self._kv_indptr_buf[: b + 1].copy_(kv_indptr, non_blocking=non_blocking)
        self._plan = p

    def _check_captured_kv(self, kv_end: int) -> None:
        """Graph mode: a captured run() reads the k and v it was captured with, so a later
        plan's KV rows must fit them (checked before the C plan)."""
        if self._captured_kv_rows is not None and kv_end > self._captured_kv_rows:
            raise ArgumentError(
                f"kv_indptr: kv_indptr[-1] = {kv_end} rows exceed the {self._captured_kv_rows} "
                "rows of the k and v a run() was captured with (capture with k and v that "
                "cover every later plan)")

    begin_forward = plan

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *args,
        out: Optional[torch.Tensor] = None,
        lse: Optional[torch.Tensor] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
        variant_args=None,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        r"""Batch prefill attention of the planned batch for one layer (capturable in a CUDA
        graph: never allocates of its own, synchronizes or compiles).

        Parameters
        ----------
        q : torch.Tensor
            ``[>= qo_indptr[-1], num_qo_heads, head_dim]`` in the planned dtype.
        k, v : torch.Tensor
            ``[>= kv_indptr[-1], num_kv_heads, head_dim]`` (NHD) or
            ``[num_kv_heads, >= kv_indptr[-1], head_dim]`` (HND), q's dtype, the same shape
            (v's last dim ``head_dim_vo`` when planned apart from ``head_dim_qk``); any strides
            with a contiguous last dim (slices of a packed QKV work).
        *args, out, lse, return_lse, enable_pdl, variant_args
            As :meth:`BatchPrefillWithPagedKVCacheWrapper.run`.

        Returns
        -------
        out : torch.Tensor
            ``[q.shape[0], num_qo_heads, head_dim_vo]``, q's dtype.
        lse : torch.Tensor
            Only with ``return_lse``: ``[q.shape[0], num_qo_heads]`` float32, **base 2**.

        Raises
        ------
        TypeError, ValueError, cinfer.CinferError
            As :meth:`BatchPrefillWithPagedKVCacheWrapper.run`.
        """
        p = self._require_plan()
        slots = self._slots
        k, k_ref = A.slot_ref(slots.k, k, "k", self.device)
        v, v_ref = A.slot_ref(slots.v, v, "v", self.device)
        result = self._run(p, q, k_ref, v_ref, None, out, lse, return_lse, args, variant_args,
                           _RAGGED_RUN)
        if self._use_cuda_graph and slots.torch.cuda.is_current_stream_capturing():
            # The run was captured (it passed every check): later plans must fit its k and v.
            axis = 1 if self._kv_layout == "HND" else 0
            rows = min(k.shape[axis], v.shape[axis])
            self._captured_kv_rows = (rows if self._captured_kv_rows is None
                                      else min(rows, self._captured_kv_rows))
        return result

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                window_left: int = -1, logits_soft_cap: Optional[float] = None,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> torch.Tensor:
        r"""Deprecated FlashInfer entry point: :meth:`run` with the attention options repeated;
        in cinfer each must equal the planned value (else ValueError)."""
        self._check_forward_options(causal, pos_encoding_mode, use_fp16_qk_reduction,
                                    window_left, logits_soft_cap, sm_scale, rope_scale,
                                    rope_theta)
        return self.run(q, k, v)

    def forward_return_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           causal: bool = False, pos_encoding_mode: str = "NONE",
                           use_fp16_qk_reduction: bool = False, window_left: int = -1,
                           logits_soft_cap: Optional[float] = None,
                           sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                           rope_theta: Optional[float] = None):
        r"""Deprecated FlashInfer entry point: :meth:`forward` that also returns the LSE."""
        self._check_forward_options(causal, pos_encoding_mode, use_fp16_qk_reduction,
                                    window_left, logits_soft_cap, sm_scale, rope_scale,
                                    rope_theta)
        return self.run(q, k, v, return_lse=True)


__all__ = [
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
]
