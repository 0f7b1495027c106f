"""Decode attention (FlashInfer's ``flashinfer.decode``): one query token per request over its KV
cache, for a single request or a batch over a paged KV cache.

Semantics (shared with the C library, ``SEMANTICS.md``): the logit of KV position ``j`` is
``s_j = (q . k_j) * sm_scale * k_scale``, then ``c * tanh(s_j / c)`` when
``logits_soft_cap = c > 0``; with ``window_left = w >= 0`` only the last ``w + 1`` positions are
attended. The output is ``softmax(s) @ V * v_scale``, accumulated in float32, and the log-sum-exp
``log2(sum_j exp(s_j))`` is returned **in base 2**. A request with no KV gives output 0 and LSE
``-inf``. ``pos_encoding_mode="ALIBI"`` adds ``slope_h * (j - (kv_len - 1))`` to the scaled logit
(FlashInfer's default slopes), through the library's built-in variant ``"alibi"``.
``pos_encoding_mode="ROPE_LLAMA"`` rotates q and the keys inside the kernels (Llama's
rotate-half RoPE): the query at position ``kv_len - 1``, key ``j`` at ``j``; the cache holds
un-rotated keys.
"""

from __future__ import annotations

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

_KV_DTYPES_TEXT = ("torch.float16, torch.bfloat16, torch.float8_e4m3fn or torch.float8_e5m2 "
                   "(fp8 with k_scale/v_scale)")


def _kv_dtypes():
    return A.q_dtypes() + A.fp8_dtypes()


def _no_q_scale(q_scale) -> None:
    if q_scale is not None:
        raise UnsupportedError(
            f"q_scale = {q_scale!r} is not supported yet: it calibrates fp8 queries, and cinfer "
            "takes float16/bfloat16 queries; fold any scale into sm_scale"
        )


def _options(*, num_qo_heads, num_kv_heads, head_dim, kv_layout, q_dtype, kv_dtype, sm_scale,
             logits_soft_cap, window_left, k_scale, v_scale, page_size=16,
             use_cuda_graph=False, max_batch_size=1,
             use_tensor_cores=False, variant=None, rope=None) -> _lib.AttentionOptions:
    # True asks for the tensor-core kernel; False lets the library choose (it takes the
    # tensor-core kernel wherever the dtypes and head dim allow: faster on every measured shape).
    # With in-kernel RoPE the library always chooses: only its CUDA-core kernel rotates q and K
    # (it refuses 1 with RoPE), and FlashInfer's use_tensor_cores=True runs RoPE too.
    return _lib.attention_options(
        use_tensor_cores=1 if use_tensor_cores and rope is None else -1,
        num_qo_heads=int(num_qo_heads),
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        page_size=int(page_size),
        kv_layout=kv_layout,
        q_dtype=T.dl_dtype(q_dtype),
        kv_dtype=T.dl_dtype(kv_dtype),
        # 0 asks the library for its default, 1/sqrt(head_dim).
        sm_scale=0.0 if sm_scale is None else sm_scale,
        logits_soft_cap=logits_soft_cap,
        window_left=window_left,
        k_scale=k_scale,
        v_scale=v_scale,
        use_cuda_graph=1 if use_cuda_graph else 0,
        max_batch_size=int(max_batch_size),
        variant=variant.handle if variant is not None else None,
        **A.rope_fields(rope),
    )


# ---------------------------------------------------------------------------------------------
# Single-request decode
# ---------------------------------------------------------------------------------------------

def single_decode_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    return_lse: bool = False,
    *,
    variant: Optional[V.Variant] = None,
    variant_args=None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    r"""Decode attention of one request: one query token over its whole KV cache.

    Parameters
    ----------
    q : torch.Tensor
        The query, shape ``[num_qo_heads, head_dim]``, float16 or bfloat16, CUDA.
    k : torch.Tensor
        The keys, shape ``[kv_len, num_kv_heads, head_dim]`` (``NHD``) or
        ``[num_kv_heads, kv_len, head_dim]`` (``HND``); float16, bfloat16, float8_e4m3fn or
        float8_e5m2. ``kv_len`` may be 0. The last dimension must be contiguous.
    v : torch.Tensor
        The values, same shape, dtype and strides as ``k``.
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``.
    pos_encoding_mode : str
        ``"NONE"`` (default) or ``"ALIBI"``: adds ``slope_h * (j - (kv_len - 1))`` to the scaled
        logit of query head ``h`` with FlashInfer's default slopes (the ALiBi paper's:
        ``2^(-8 (h + 1) / n)`` for the first ``n`` heads, ``n`` the largest power of two not
        above ``num_qo_heads``, then ``2^(-4 (2 (h - n) + 1) / n)``), through the built-in
        variant ``"alibi"``; not with ``logits_soft_cap`` or ``variant``
        (:class:`cinfer.UnsupportedError`). ``"ROPE_LLAMA"``: in-kernel rotary embedding
        (Llama's rotate-half) of q at position ``kv_len - 1`` and of key ``j`` at position
        ``j`` before the dot product (``k`` holds un-rotated keys; ``v`` is not rotated): pair
        ``m < D/2`` of a vector, ``(x[m], x[m + D/2])``, is rotated by the angle
        ``(pos / rope_scale) * rope_theta^(-2m / D)``, in float32. Needs ``head_dim`` a
        multiple of 16 and ``kv_len <= 2^24``; combines with everything else (a variant sees
        the rotated vectors' logits).
    use_tensor_cores : bool
        Accepted for compatibility and ignored: cinfer chooses its kernels itself.
    q_scale : Optional[float]
        Not supported (fp8 queries); must be ``None``.
    k_scale : Optional[float]
        Multiplies the logits (dequantization scale of fp8 keys); default 1.
    v_scale : Optional[float]
        Multiplies the output (dequantization scale of fp8 values); default 1.
    window_left : int
        Sliding window: attend only the last ``window_left + 1`` positions. ``-1`` (default) = off.
    logits_soft_cap : Optional[float]
        ``c > 0`` applies ``c * tanh(s / c)`` to the logits; ``None`` or 0 = off.
    sm_scale : Optional[float]
        Logit scale; default ``1 / sqrt(head_dim)``.
    rope_scale, rope_theta : Optional[float]
        With ``"ROPE_LLAMA"``: positions are divided by ``rope_scale`` (default 1) and
        ``rope_theta`` is the frequency base (default 1e4); each a finite value > 0
        (ValueError otherwise), rounded to float32. Ignored with other modes, as in FlashInfer.
    return_lse : bool
        Also return the log-sum-exp.
    variant : Optional[cinfer.Variant]
        cinfer extension (keyword-only): an attention variant (:class:`cinfer.Variant`, or a
        built-in name such as ``"sinks"``); ``logits_soft_cap`` must then be off and
        ``pos_encoding_mode`` ``"NONE"``.
    variant_args : sequence or mapping, optional
        cinfer extension (keyword-only): the variant's arguments, in declaration order or by
        name (:mod:`cinfer.variant`). ``batch_idx`` of the hooks is 0. None with ALiBi
        (TypeError otherwise).

    Returns
    -------
    out : torch.Tensor
        Shape ``[num_qo_heads, head_dim]``, dtype of ``q``. Zero when ``kv_len`` is 0.
    lse : torch.Tensor
        Only with ``return_lse``: shape ``[num_qo_heads]``, float32, **base 2**
        (``log2(sum_j exp(s_j))``); ``-inf`` when ``kv_len`` is 0.

    Raises
    ------
    TypeError
        ``q``, ``k`` or ``v`` is not a tensor; ``variant_args`` with ALiBi; a number argument of
        another type (a string or a bool; a float where an int is expected).
    ValueError
        Wrong shape, dtype or device (e.g. a CPU tensor), naming the argument;
        ``rope_scale`` / ``rope_theta`` not finite or not > 0 with RoPE;
        :class:`cinfer.UnsupportedError` for what cinfer does not implement (a head dim that is
        not a multiple of 8 or above 256, or with RoPE not a multiple of 16, ALiBi with
        ``logits_soft_cap`` or a variant, ``q_scale``, misaligned rows).
    cinfer.CinferError
        CUDA or JIT failures (:class:`cinfer.CompileError`, :class:`cinfer.NoDeviceError`).

    Notes
    -----
    ``num_qo_heads`` must be a multiple of ``num_kv_heads`` (grouped-query attention). Runs on
    PyTorch's current CUDA stream; the split-KV workspace is allocated with PyTorch's caching
    allocator for each call. A call can be captured in a CUDA graph when its head slices fit one
    wave of CTAs, as every model's head counts do (its plan then travels in the kernels'
    parameters; else capturing raises :class:`cinfer.UnsupportedError`); make one call before
    capturing, so that the kernels are loaded. A replay attends over the captured tensors'
    current contents, at the captured ``kv_len``; :class:`BatchDecodeWithPagedKVCacheWrapper` in
    CUDA-graph mode takes any lengths up to its capacity. Calls with ALiBi or RoPE are not torch.compile operators
    (they break the graph, like calls with a variant).
    """
    where = "single_decode_with_kv_cache"
    mode = A.pos_encoding_mode(pos_encoding_mode)
    rope = A.rope(mode, rope_scale, rope_theta)
    feature = M.feature(None, None, mode)
    _no_q_scale(q_scale)
    variant = V.check_variant(variant, where)
    M.check_combination(feature, variant, logits_soft_cap, where)
    if feature is not None:
        M.refuse_variant_args(feature, variant_args is not None, where)
        variant, variant_args = M.alibi(T.as_tensor(q, "q").shape[0])
    # Calls with a variant (a user's, or ALiBi's built-in) are not operators (a Variant is no
    # schema type): under torch.compile they break the graph, like the wrappers. So are calls
    # with RoPE: carrying its fields would change the schema of the operator
    # (torch.ops.cinfer.single_decode, recorded by torch.export'ed graphs); the eager path
    # takes them instead.
    if _dispatch.compiling() and variant is None and variant_args is None and rope is None:
        out, lse = _dispatch.op("single_decode")(
            q, k, v, kv_layout, k_scale, v_scale, window_left, logits_soft_cap, sm_scale,
            bool(return_lse))
    else:
        _dispatch.ensure_registered()
        out, lse = single_decode_impl(q, k, v, kv_layout, k_scale, v_scale, window_left,
                                      logits_soft_cap, sm_scale, return_lse, variant,
                                      variant_args, rope=rope)
    return (out, lse) if return_lse else out


# Checked layouts of single decode calls of default attention (:func:`single_decode_impl`).
_single_calls = T.LayoutCache(64)


def single_decode_impl(q, k, v, kv_layout, k_scale, v_scale, window_left, logits_soft_cap,
                       sm_scale, return_lse, variant=None, variant_args=None, *, rope=None):
    """The eager implementation (also the ``cinfer::single_decode`` operator's, without a
    variant or RoPE): returns ``(out, lse)`` with ``lse`` None unless ``return_lse``. ``rope``:
    :func:`cinfer._args.rope`'s ``(rope_scale, rope_theta)``, or None.

    Default attention (no variant or RoPE) on tensors of a layout an earlier call of this thread
    checked skips the checks and reuses that call's structs and workspace size: only the data
    pointers change (the library checks the arguments again either way)."""
    torch = T.torch_module()
    where = "single_decode_with_kv_cache"
    key = None
    if (variant is None and variant_args is None and rope is None
            and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(v, torch.Tensor)):
        key = (T.layout_of(q), T.layout_of(k), T.layout_of(v), kv_layout, k_scale, v_scale,
               window_left, logits_soft_cap, sm_scale, bool(return_lse))
        c = _single_calls.get(key)
        if c is not None:
            nbytes = c.extra
            workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            lse = (torch.empty((q.shape[0],), dtype=torch.float32, device=q.device)
                   if return_lse else None)
            refs = c.rebind(q, k, v, out, lse) if return_lse else c.rebind(q, k, v, out)
            _lib.check(
                _lib.lib().cinfer_single_decode(
                    T.context_of(q.device), c.options_ref, refs[0], refs[1], refs[2], refs[3],
                    refs[4] if return_lse else None, c.packed.ref(), workspace.data_ptr(),
                    nbytes, T.stream_of(q.device)),
                where,
            )
            return out, lse
    q = T.as_tensor(q, "q")
    k = T.as_tensor(k, "k")
    v = T.as_tensor(v, "v")
    layout = A.kv_layout(kv_layout)
    T.check_cuda(q, "q")
    T.check_cuda(k, "k", q.device)
    T.check_cuda(v, "v", q.device)
    T.check_ndim(q, "q", 2, "[num_qo_heads, head_dim]")
    kv_shape = ("[kv_len, num_kv_heads, head_dim] (NHD)" if kv_layout == "NHD"
                else "[num_kv_heads, kv_len, head_dim] (HND)")
    T.check_ndim(k, "k", 3, kv_shape)
    T.check_ndim(v, "v", 3, kv_shape)
    T.check_dtype(q, "q", A.q_dtypes(), A.Q_DTYPES_TEXT)
    T.check_dtype(k, "k", _kv_dtypes(), _KV_DTYPES_TEXT)
    if v.dtype != k.dtype:
        raise ArgumentError(f"v: dtype {v.dtype}, expected {k.dtype} (as k)")

    num_qo_heads, head_dim = q.shape
    nhd = layout == _lib.KV_LAYOUT_NHD
    kv_len = k.shape[0] if nhd else k.shape[1]
    num_kv_heads = k.shape[1] if nhd else k.shape[0]
    sm_scale = A.positive(sm_scale, "sm_scale", None)
    logits_soft_cap = A.soft_cap(logits_soft_cap)
    window_left = A.window_left(window_left)
    k_scale = A.positive(k_scale, "k_scale", 1.0)
    v_scale = A.positive(v_scale, "v_scale", 1.0)
    options_key = ("decode", num_qo_heads, num_kv_heads, head_dim, layout, q.dtype, k.dtype,
                   sm_scale, logits_soft_cap, window_left, k_scale, v_scale,
                   variant.handle if variant is not None else None, rope)
    opts = _lib.cached_attention_options(options_key, lambda: _options(
        num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        kv_layout=layout, q_dtype=q.dtype, kv_dtype=k.dtype, sm_scale=sm_scale,
        logits_soft_cap=logits_soft_cap, window_left=window_left, k_scale=k_scale,
        v_scale=v_scale, variant=variant, rope=rope))
    packed = V.pack_args(variant, variant_args, where)
    lib = _lib.lib()
    ctx = T.context_of(q.device)
    nbytes = ctypes.c_size_t()
    _lib.check(lib.cinfer_single_decode_workspace_size(ctx, ctypes.byref(opts), kv_len,
                                                       ctypes.byref(nbytes)), where)
    # An empty allocation has a NULL pointer, which the library rejects even for 0 bytes.
    workspace = torch.empty(max(nbytes.value, 1), dtype=torch.uint8, device=q.device)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = (torch.empty((num_qo_heads,), dtype=torch.float32, device=q.device)
           if return_lse else None)
    dl = [T.to_dl(q, "q"), T.to_dl(k, "k"), T.to_dl(v, "v"), T.to_dl(out, "out")]
    if lse is not None:
        dl.append(T.to_dl(lse, "lse"))
    _lib.check(
        lib.cinfer_single_decode(
            ctx, ctypes.byref(opts), T.ref(dl[0]), T.ref(dl[1]), T.ref(dl[2]), T.ref(dl[3]),
            T.ref(dl[4]) if lse is not None else None, packed.ref(), workspace.data_ptr(),
            nbytes.value, T.stream_of(q.device)),
        where,
    )
    if key is not None:  # checked and accepted: later calls of this layout reuse the structs
        _single_calls.put(key, T.CheckedCall(opts, dl, packed, nbytes.value))
    return out, lse


# ---------------------------------------------------------------------------------------------
# Batch decode over a paged KV cache
# ---------------------------------------------------------------------------------------------

class _Plan:
    """What one plan() decided, kept for run(): the planned shapes and scales, the page table on
    the device (and its DLTensor views) and its host copies."""

    __slots__ = ("batch_size", "num_qo_heads", "head_dim", "q_dtype", "kv_dtype", "k_scale",
                 "v_scale", "sm_scale", "logits_soft_cap", "window_left", "variant", "indptr_host",
                 "last_page_len_host", "indptr", "indices", "last_page_len", "dl_indptr",
                 "dl_indices", "dl_last_page_len", "pos_encoding_mode", "feature", "builtin_args",
                 "rope", "run_fn", "indptr_ref", "indices_ref", "last_page_len_ref")


_RUN_NAME = "BatchDecodeWithPagedKVCacheWrapper.run"


class _RunSlots:
    """What :meth:`BatchDecodeWithPagedKVCacheWrapper.run` reuses from call to call, whatever
    the plan: the argument structs of q, the cache, out and lse, torch and the stream
    accessor."""

    __slots__ = ("q", "kv", "out", "lse", "torch", "stream")

    def __init__(self, device) -> None:
        self.q = T.DLSlot("q")
        self.kv = A.PagedKVSlots(device)
        self.out = T.DLSlot("out")
        self.lse = T.DLSlot("lse")
        self.torch = T.torch_module()
        self.stream = T.stream_getter(device)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class BatchDecodeWithPagedKVCacheWrapper:
    r"""Batch decode over a paged KV cache, planned once per step and run once per layer.

    Page table (CSR): request ``b`` owns pages ``indices[indptr[b]:indptr[b+1]]`` and
    ``kv_len[b] = (num_pages - 1) * page_size + last_page_len[b]`` (0 without pages).

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Device workspace (any dtype, contiguous, CUDA, 256-byte aligned as PyTorch allocations
        are), used for the schedule and the split-KV partial results. The size needed grows with
        the device's SM count, ``head_dim`` and the batch capacity; a buffer that is too small
        raises ValueError at :meth:`plan` with the size needed.
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``: the layout of the paged caches given to :meth:`run`.
    use_cuda_graph : bool
        CUDA graph mode: the page table lives in the three fixed buffers below, the kernels use a
        fixed grid, and :meth:`run` can be captured with ``torch.cuda.graph``; a later
        :meth:`plan` (other lengths, or a batch up to the buffers' capacity) is honoured by
        replays of the captured graph.
    use_tensor_cores : bool
        True asks for the tensor-core kernel (head dims 64, 128, 256), except with
        ``pos_encoding_mode="ROPE_LLAMA"``, which runs on the CUDA-core kernel (the only one
        with in-kernel RoPE); False (default) lets cinfer choose.
    paged_kv_indptr_buffer : Optional[torch.Tensor]
        Graph mode only: int32 CUDA buffer of ``max_batch_size + 1`` entries.
    paged_kv_indices_buffer : Optional[torch.Tensor]
        Graph mode only: int32 CUDA buffer large enough for every plan's page indices.
    paged_kv_last_page_len_buffer : Optional[torch.Tensor]
        Graph mode only: int32 CUDA buffer of ``max_batch_size`` entries; its length is the batch
        capacity.
    backend : str
        Accepted for compatibility (``"auto"``, ``"fa2"``, ``"fa3"``, ``"trtllm-gen"``) and
        ignored.
    jit_args : None
        FlashInfer's JIT variants are not supported; anything but None raises
        :class:`cinfer.UnsupportedError` (pass a :class:`cinfer.Variant` to :meth:`plan`).

    Raises
    ------
    TypeError
        ``float_workspace_buffer`` is not a tensor.
    ValueError
        A CPU or non-contiguous workspace, a bad ``kv_layout``, missing or malformed graph
        buffers.

    Notes
    -----
    Differences from FlashInfer: fp8 ``k_scale``/``v_scale`` are fixed at :meth:`plan` (pass
    them there; :meth:`run` accepts the same values and rejects others, because changing them
    would rebuild the plan object, which allocates); in graph mode the batch may be smaller than
    the buffers' capacity (FlashInfer requires it to be equal) -- :meth:`run` must be captured
    with the batch at capacity (it raises otherwise), so the captured ``q`` and ``out`` cover
    every row a later plan may use.
    The wrapper is not thread-safe.
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
        paged_kv_indices_buffer: Optional[torch.Tensor] = None,
        paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None,
        backend: str = "auto",
        jit_args=None,
    ) -> None:
        self._op = None  # cinfer_batch_decode_t*, set first so __del__ always finds it
        torch = T.torch_module()
        self._kv_layout_code = A.kv_layout(kv_layout)
        self._kv_layout = kv_layout
        if jit_args is not None:
            raise UnsupportedError("jit_args: FlashInfer's JIT variants are not supported; pass "
                                   "a cinfer.Variant to plan(..., variant=...)")
        if backend not in ("auto", "fa2", "fa3", "trtllm-gen"):
            raise ArgumentError(
                f"backend = {backend!r}, expected 'auto', 'fa2', 'fa3' or 'trtllm-gen' "
                "(accepted for compatibility; cinfer chooses its own kernels)"
            )
        ws = T.as_tensor(float_workspace_buffer, "float_workspace_buffer")
        self._check_workspace(ws)
        self._float_workspace_buffer = ws
        self.device = ws.device
        self._use_tensor_cores = bool(use_tensor_cores)
        self._use_cuda_graph = bool(use_cuda_graph)
        if self._use_cuda_graph:
            bufs = (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                    ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                    ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer))
            for name, buf in bufs:
                if not isinstance(buf, torch.Tensor):
                    raise ArgumentError(f"{name} should be a torch.Tensor in cudagraph mode")
                T.check_cuda(buf, name, self.device)
                T.check_ndim(buf, name, 1, "a 1-D int32 buffer")
                T.check_dtype(buf, name, (torch.int32,), "torch.int32", unsupported=False)
                if not buf.is_contiguous():
                    raise ArgumentError(f"{name}: must be contiguous")
            self._fixed_batch_size = paged_kv_last_page_len_buffer.shape[0]
            if paged_kv_indptr_buffer.shape[0] != self._fixed_batch_size + 1:
                raise ArgumentError(
                    f"paged_kv_indptr_buffer: {paged_kv_indptr_buffer.shape[0]} entries, expected "
                    f"{self._fixed_batch_size + 1} (len(paged_kv_last_page_len_buffer) + 1)"
                )
            self._paged_kv_indptr_buf = paged_kv_indptr_buffer
            self._paged_kv_indices_buf = paged_kv_indices_buffer
            self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        else:
            self._fixed_batch_size = 0
            self._paged_kv_indptr_buf = None
            self._paged_kv_indices_buf = None
            self._paged_kv_last_page_len_buf = None
        self._op_key = None
        self._op_capacity = 0
        self._captured = False  # a run() was captured into a CUDA graph
        self._op_variant = None  # the variant self._op was created with (kept alive)
        self._plan: Optional[_Plan] = None
        self._slots = _RunSlots(self.device)

    # ---- properties and FlashInfer compatibility ----

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffer: Optional[torch.Tensor] = None) -> None:
        r"""Use another device workspace from the next :meth:`plan` on.

        Parameters
        ----------
        float_workspace_buffer : torch.Tensor
            The new workspace (CUDA, contiguous, on the wrapper's device).
        int_workspace_buffer : Optional[torch.Tensor]
            Accepted for compatibility and unused: cinfer needs a single workspace.

        Notes
        -----
        The current plan is dropped: call :meth:`plan` before the next :meth:`run`.
        """
        ws = T.as_tensor(float_workspace_buffer, "float_workspace_buffer")
        self._check_workspace(ws)
        if ws.device != self.device:
            raise ArgumentError(
                f"float_workspace_buffer: on {ws.device}, expected {self.device} (the wrapper's)"
            )
        self._destroy()
        self._float_workspace_buffer = ws
        self._captured = False  # a graph captured before now replays a destroyed object

    def end_forward(self) -> None:
        """Deprecated FlashInfer call; does nothing."""

    # ---- plan ----

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        non_blocking: bool = True,
        block_tables: Optional[torch.Tensor] = None,
        seq_lens: Optional[torch.Tensor] = None,
        *,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        variant: Optional[V.Variant] = None,
    ) -> None:
        r"""Plan one decode step for the page table; every :meth:`run` until the next plan (one
        per layer) uses it.

        Parameters
        ----------
        indptr : torch.Tensor
            ``[batch_size + 1]`` int32 (CPU or CUDA): request ``b`` owns
            ``indices[indptr[b]:indptr[b+1]]``. Non-decreasing.
        indices : torch.Tensor
            ``[>= indptr[-1]]`` int32 page indices into the paged cache.
        last_page_len : torch.Tensor
            ``[batch_size]`` int32, each in ``1..page_size`` for a request with pages.
        num_qo_heads : int
            Query heads, a multiple of ``num_kv_heads``.
        num_kv_heads : int
            KV heads.
        head_dim : int
            Head dim of q, k and v: a multiple of 8, at most 256.
        page_size : int
            Tokens per page, 1..256.
        pos_encoding_mode : str
            ``"NONE"`` (default) or ``"ALIBI"`` (``slope_h * (j - (kv_len - 1))`` added to the
            scaled logit, FlashInfer's default slopes, as in
            :func:`cinfer.single_decode_with_kv_cache`; not with ``logits_soft_cap`` or
            ``variant``); ``"ROPE_LLAMA"``: in-kernel RoPE (Llama's rotate-half) of each
            request's q at position ``kv_len - 1`` and of its key ``j`` at ``j`` (the cache
            holds un-rotated keys), pair ``(x[m], x[m + D/2])`` rotated by
            ``(pos / rope_scale) * rope_theta^(-2m / D)``, as in
            :func:`cinfer.single_decode_with_kv_cache`; ``head_dim`` a multiple of 16, every
            ``kv_len <= 2^24``. It runs on the CUDA-core kernel whatever ``use_tensor_cores``
            says.
        window_left : int
            Sliding window (last ``window_left + 1`` positions); ``-1`` = off.
        logits_soft_cap : Optional[float]
            ``c > 0`` applies ``c * tanh(s / c)``; ``None``/0 = off.
        q_data_type : str or torch.dtype
            Dtype of q and of the output: float16 (default) or bfloat16.
        kv_data_type : str or torch.dtype, optional
            Dtype of the paged cache; default ``q_data_type``. float16, bfloat16,
            float8_e4m3fn or float8_e5m2.
        data_type : str or torch.dtype, optional
            Deprecated FlashInfer alias: used for ``q_data_type`` and ``kv_data_type`` where
            they are None (``q_data_type`` defaults to float16, so by default it sets the KV
            dtype only).
        sm_scale : Optional[float]
            Logit scale; default ``1 / sqrt(head_dim)``.
        rope_scale, rope_theta : Optional[float]
            With ``"ROPE_LLAMA"``: the position divisor (default 1) and the frequency base
            (default 1e4), each finite and > 0; ignored with other modes, as in FlashInfer.
        non_blocking : bool
            Copy the page table to the device without blocking the host (default True).
        block_tables, seq_lens : None
            FlashInfer 0.2.14's arguments for its TensorRT-LLM backend (after ``non_blocking``,
            as there): only None; a tensor raises :class:`cinfer.UnsupportedError`, since
            cinfer takes the pages and lengths from ``indptr``, ``indices`` and
            ``last_page_len``.
        k_scale, v_scale : Optional[float]
            cinfer extension (keyword-only): the fp8 dequantization scales, default 1. They are
            plan-time in cinfer; :meth:`run` accepts only the planned values.
        variant : Optional[cinfer.Variant]
            cinfer extension (keyword-only): an attention variant (:class:`cinfer.Variant` or a
            built-in name); its arguments are given to :meth:`run`. ``logits_soft_cap`` must
            then be off and ``pos_encoding_mode`` ``"NONE"``. A compile error in its source
            raises :class:`cinfer.CompileError` here.

        Raises
        ------
        TypeError
            A page-table argument is not a tensor; a number argument of another type (a string
            or a bool; a float for ``num_qo_heads``, ``num_kv_heads``, ``head_dim``,
            ``page_size`` or ``window_left``).
        ValueError
            Wrong dtypes (the argument is named), ``len(indptr) != len(last_page_len) + 1``,
            non-monotone ``indptr``, ``last_page_len`` out of range, graph-mode batch above the
            buffers' capacity or indices beyond ``paged_kv_indices_buffer``, a workspace smaller
            than needed (the message gives the size), ``rope_scale`` / ``rope_theta`` not
            finite or not > 0 with RoPE, a ``kv_len`` above 2^24 with RoPE;
            :class:`cinfer.UnsupportedError` for head dims (with RoPE: not a multiple of 16),
            page sizes or dtypes cinfer does not implement, ``block_tables`` or ``seq_lens``.
        cinfer.CinferError
            CUDA or JIT failures (kernels are compiled or loaded here, never in :meth:`run`).

        Notes
        -----
        Host copies of ``indptr`` and ``last_page_len`` are taken (a device-to-host copy, which
        synchronizes, if they are CUDA tensors -- pass CPU tensors to avoid it). The schedule and
        the page table are copied to the device on PyTorch's current stream. A plan that
        raises leaves no runnable plan (run() raises until the next plan succeeds).
        """
        torch = T.torch_module()
        self._plan = None
        A.refuse_backend_only("BatchDecodeWithPagedKVCacheWrapper.plan",
                              block_tables=block_tables, seq_lens=seq_lens)
        num_qo_heads = A.integer(num_qo_heads, "num_qo_heads")
        num_kv_heads = A.integer(num_kv_heads, "num_kv_heads")
        head_dim = A.integer(head_dim, "head_dim")
        page_size = A.integer(page_size, "page_size")
        indptr = T.as_tensor(indptr, "indptr")
        indices = T.as_tensor(indices, "indices")
        last_page_len = T.as_tensor(last_page_len, "last_page_len")
        for name, t in (("indptr", indptr), ("indices", indices),
                        ("last_page_len", last_page_len)):
            T.check_ndim(t, name, 1, "a 1-D int32 tensor")
            T.check_dtype(t, name, (torch.int32,), "torch.int32", unsupported=False)
            if t.device.type not in ("cpu", "cuda"):
                raise ArgumentError(f"{name}: tensor on {t.device}, expected CPU or CUDA")
        batch_size = last_page_len.shape[0]
        if indptr.shape[0] != batch_size + 1:
            raise ArgumentError(
                f"indptr: {indptr.shape[0]} entries, expected {batch_size + 1} "
                "(len(last_page_len) + 1)"
            )
        mode = A.pos_encoding_mode(pos_encoding_mode)
        rope = A.rope(mode, rope_scale, rope_theta)
        feature = M.feature(None, None, mode)
        q_dtype, kv_dtype = A.plan_dtypes(q_data_type, kv_data_type, data_type)
        if q_dtype not in A.q_dtypes():
            raise UnsupportedError(f"q_data_type = {q_dtype}, expected {A.Q_DTYPES_TEXT}")
        if kv_dtype not in _kv_dtypes():
            raise UnsupportedError(f"kv_data_type = {kv_dtype}, expected {_KV_DTYPES_TEXT}")
        sm = A.positive(sm_scale, "sm_scale", None)
        cap = A.soft_cap(logits_soft_cap)
        wl = A.window_left(window_left)
        ks = A.positive(k_scale, "k_scale", 1.0)
        vs = A.positive(v_scale, "v_scale", 1.0)
        where = "BatchDecodeWithPagedKVCacheWrapper.plan"
        variant = V.check_variant(variant, where)
        M.check_combination(feature, variant, logits_soft_cap, where)
        alibi_args = None
        if feature is not None:
            variant, alibi_args = M.alibi(num_qo_heads)

        graph = self._use_cuda_graph
        if graph and batch_size > self._fixed_batch_size:
            raise ArgumentError(
                f"batch_size = {batch_size} (len(last_page_len)) exceeds the CUDA graph capacity "
                f"{self._fixed_batch_size} (len(paged_kv_last_page_len_buffer))"
            )
        # Host copies for the C planner (a no-op for contiguous CPU tensors).
        indptr_host = indptr.to("cpu").contiguous()
        last_host = last_page_len.to("cpu").contiguous()
        num_pages = int(indptr_host[batch_size])
        if num_pages > indices.shape[0]:
            raise ArgumentError(
                f"indices: {indices.shape[0]} entries, but indptr[{batch_size}] = {num_pages}"
            )
        if graph and num_pages > self._paged_kv_indices_buf.shape[0]:
            raise ArgumentError(
                f"indices: indptr[{batch_size}] = {num_pages} pages do not fit "
                f"paged_kv_indices_buffer ({self._paged_kv_indices_buf.shape[0]} entries)"
            )

        key = (num_qo_heads, num_kv_heads, head_dim, page_size,
               self._kv_layout_code, q_dtype, kv_dtype, sm, cap, wl, ks, vs,
               variant.handle if variant is not None else None, rope)
        options = functools.partial(
            _options, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            page_size=page_size, kv_layout=self._kv_layout_code, q_dtype=q_dtype,
            kv_dtype=kv_dtype, sm_scale=sm, logits_soft_cap=cap, window_left=wl, k_scale=ks,
            v_scale=vs, use_cuda_graph=graph, use_tensor_cores=self._use_tensor_cores,
            variant=variant, rope=rope)
        self._ensure_op(key, options, batch_size, variant)

        lib = self._op_lib  # the library that made self._op
        stream = T.stream_of(self.device)
        p_i32 = ctypes.POINTER(ctypes.c_int32)
        _lib.check(
            lib.cinfer_batch_decode_plan(
                self._op,
                ctypes.cast(indptr_host.data_ptr(), p_i32),
                ctypes.cast(last_host.data_ptr(), p_i32) if batch_size > 0 else None,
                batch_size, stream),
            "BatchDecodeWithPagedKVCacheWrapper.plan",
        )

        # The page table on the device: copied after the C plan accepted it, so a rejected plan
        # leaves the graph buffers as the previous plan wrote them.
        if graph:
            self._paged_kv_indptr_buf[: batch_size + 1].copy_(indptr, non_blocking=non_blocking)
            self._paged_kv_indices_buf[:num_pages].copy_(indices[:num_pages],
                                                         non_blocking=non_blocking)
            self._paged_kv_last_page_len_buf[:batch_size].copy_(last_page_len,
                                                                non_blocking=non_blocking)
            d_indptr = self._paged_kv_indptr_buf[: batch_size + 1]
            d_indices = self._paged_kv_indices_buf
            d_last = self._paged_kv_last_page_len_buf[:batch_size]
        else:
            d_indptr = indptr.to(self.device, non_blocking=non_blocking)
            d_indices = indices.to(self.device, non_blocking=non_blocking)
            d_last = last_page_len.to(self.device, non_blocking=non_blocking)

        p = _Plan()
        p.batch_size = batch_size
        p.num_qo_heads = num_qo_heads
        p.head_dim = head_dim
        p.q_dtype = q_dtype
        p.kv_dtype = kv_dtype
        p.k_scale = ks
        p.v_scale = vs
        p.sm_scale = sm if sm is not None else A.f32(1.0 / math.sqrt(head_dim))
        p.logits_soft_cap = cap
        p.window_left = wl
        p.variant = variant  # also keeps it alive while the C object uses it
        p.indptr_host = indptr_host
        p.last_page_len_host = last_host
        p.indptr = d_indptr
        p.indices = d_indices
        p.last_page_len = d_last
        p.dl_indptr = T.to_dl(d_indptr, "indptr")
        p.dl_indices = T.to_dl(d_indices, "indices")
        p.dl_last_page_len = T.to_dl(d_last, "last_page_len")
        p.indptr_ref = ctypes.byref(p.dl_indptr)
        p.indices_ref = ctypes.byref(p.dl_indices)
        p.last_page_len_ref = ctypes.byref(p.dl_last_page_len)
        p.run_fn = self._op_lib.cinfer_batch_decode_run  # the library that made the object
        p.pos_encoding_mode = mode
        p.rope = rope
        p.feature = feature
        p.builtin_args = (V.pack_args(variant, alibi_args, where) if alibi_args is not None
                          else None)
        self._plan = p

    begin_forward = plan

    # ---- run ----

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
        r"""Decode attention of the planned batch for one layer.

        Never allocates device memory of its own (only ``out``/``lse`` when not given, through
        PyTorch), synchronizes or compiles, so it can be captured in a CUDA graph.

        Parameters
        ----------
        q : torch.Tensor
            ``[batch_size, num_qo_heads, head_dim]`` in the planned ``q_data_type``; rows and
            heads may be strided, the last dim must be contiguous.
        paged_kv_cache : tuple of two torch.Tensor, or torch.Tensor
            ``(k_cache, v_cache)``, each ``[max_num_pages, page_size, num_kv_heads, head_dim]``
            (NHD) or ``[max_num_pages, num_kv_heads, page_size, head_dim]`` (HND), with the same
            strides; or one combined tensor ``[max_num_pages, 2, ...]`` (index 0 = K, 1 = V).
            Dtype ``kv_data_type``.
        *args
            The planned variant's arguments in declaration order (FlashInfer passes a custom
            kernel's extra arguments the same way); or use ``variant_args``. None after a plan
            with ALiBi (cinfer passes the built-in variant's arguments; TypeError otherwise).
        q_scale : Optional[float]
            Not supported (fp8 queries); must be None.
        k_scale, v_scale : Optional[float]
            fp8 dequantization scales. ``None`` uses the planned values (default 1); a value
            must equal the planned one (see the class notes).
        out : Optional[torch.Tensor]
            Output buffer ``[batch_size, num_qo_heads, head_dim]``, dtype of q; allocated if None.
        lse : Optional[torch.Tensor]
            Log-sum-exp buffer ``[batch_size, num_qo_heads]`` float32; written when given,
            allocated when None and ``return_lse`` is True.
        return_lse : bool
            Return ``(out, lse)`` instead of ``out``.
        enable_pdl : Optional[bool]
            Accepted for compatibility and ignored.
        window_left : Optional[int]
            FlashInfer 0.2.14: None (the planned value) or the planned value; another value
            raises ValueError (FlashInfer's FA2 path refuses it too).
        sinks : Optional[torch.Tensor]
            FlashInfer 0.2.14: only None (:class:`cinfer.UnsupportedError`); plan with the
            built-in variant ``"sinks"`` and pass the tensor as its argument instead.
        variant_args : sequence or mapping, optional
            cinfer extension: the variant's arguments in declaration order or by name (not
            together with ``*args``). ``batch_idx`` of the hooks is the request.

        Returns
        -------
        out : torch.Tensor
            ``[batch_size, num_qo_heads, head_dim]``, dtype of q (0 for requests without KV).
        lse : torch.Tensor
            Only with ``return_lse``: ``[batch_size, num_qo_heads]`` float32, **base 2**
            (``-inf`` for requests without KV).

        Raises
        ------
        TypeError
            ``q`` or a cache is not a tensor.
        ValueError
            No plan yet, shapes or dtypes that contradict the plan (the argument is named), CPU
            tensors, scales or a ``window_left`` that differ from the planned ones;
            :class:`cinfer.UnsupportedError` for ``q_scale``, ``sinks`` or misaligned rows.
        cinfer.CinferError
            A CUDA launch failure.
        """
        # The hot path (once per layer): the argument structs are reused (a tensor of the
        # layout seen last only moves their data pointers; another is checked and bound), the
        # plan holds the page table's references, the entry point and the stream accessor.
        p = self._plan
        if p is None:
            raise ArgumentError("run() before plan(): call plan() first (again after "
                                "reset_workspace_buffer)")
        if q_scale is not None:
            _no_q_scale(q_scale)
        if k_scale is not None or v_scale is not None:
            A.refuse_unplanned_scales(k_scale, v_scale, p.k_scale, p.v_scale)
        if window_left is not None or sinks is not None:
            A.run_window_and_sinks(window_left, sinks, p.window_left)
        slots = self._slots
        q, q_ref = A.slot_ref(slots.q, q, "q", self.device, 3,
                              "[batch_size, num_qo_heads, head_dim]")
        k_ref, v_ref = slots.kv.refs(paged_kv_cache)
        torch = slots.torch
        capturing = self._use_cuda_graph and torch.cuda.is_current_stream_capturing()
        if capturing and p.batch_size < self._fixed_batch_size:
            # A replay after a later plan with more requests would read q and write out past the
            # rows captured here.
            raise ArgumentError(
                f"q: capturing run() with batch_size = {p.batch_size}, below the CUDA graph "
                f"capacity {self._fixed_batch_size}: plan the capture with the batch at capacity "
                "so the captured q and out cover every later plan"
            )
        if capturing:
            self._captured = True
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        out, out_ref = A.slot_ref(slots.out, out, "out", self.device)
        lse_ref = None
        if lse is None:
            if return_lse:
                lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
        if lse is not None:
            lse, lse_ref = A.slot_ref(slots.lse, lse, "lse", self.device)
        if p.builtin_args is not None:
            if args or variant_args is not None:
                M.refuse_variant_args(p.feature, True, _RUN_NAME)
            args_ref = p.builtin_args.ref()
        elif not args and variant_args is None:
            args_ref = None  # what packing no arguments gives, for any variant
        else:
            packed = V.pack_args(p.variant, V.run_args(args, variant_args, _RUN_NAME), _RUN_NAME)
            args_ref = packed.ref()
        _lib.check(
            p.run_fn(self._op, q_ref, k_ref, v_ref, p.indptr_ref, p.indices_ref,
                     p.last_page_len_ref, out_ref, lse_ref, args_ref, slots.stream()),
            _RUN_NAME,
        )
        return (out, lse) if return_lse else out

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
        pos_encoding_mode: str = "NONE",
        q_scale: Optional[float] = None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
    ) -> torch.Tensor:
        r"""Deprecated FlashInfer entry point: :meth:`run` with the attention options repeated.

        In FlashInfer these arguments replace the planned ones; in cinfer they are fixed by
        :meth:`plan`, so each must equal the planned value (``sm_scale=None`` meaning
        ``1/sqrt(head_dim)``, ``logits_soft_cap`` None or 0 meaning off, ``rope_scale`` /
        ``rope_theta`` None meaning 1 / 1e4 and compared only with ``"ROPE_LLAMA"``), else
        ValueError. Returns ``[batch_size, num_qo_heads, head_dim]`` like :meth:`run`.
        """
        self._check_forward_options(pos_encoding_mode, window_left, logits_soft_cap, sm_scale,
                                    rope_scale, rope_theta)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(
        self,
        q: torch.Tensor,
        paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
        pos_encoding_mode: str = "NONE",
        q_scale: Optional[float] = None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        r"""Deprecated FlashInfer entry point: :meth:`forward` that also returns the LSE
        (``[batch_size, num_qo_heads]`` float32, base 2)."""
        self._check_forward_options(pos_encoding_mode, window_left, logits_soft_cap, sm_scale,
                                    rope_scale, rope_theta)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                        return_lse=True)

    # ---- internals ----

    def _check_forward_options(self, pos_encoding_mode, window_left, logits_soft_cap,
                               sm_scale, rope_scale=None, rope_theta=None) -> None:
        """forward()'s attention options must be the planned ones (see :meth:`forward`)."""
        mode = A.pos_encoding_mode(pos_encoding_mode)
        rope = A.rope(mode, rope_scale, rope_theta)
        p = self._plan
        if p is None:
            raise ArgumentError("forward() before plan(): call plan() (or begin_forward()) first")
        given = {
            "pos_encoding_mode": mode,
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

    @staticmethod
    def _check_workspace(ws) -> None:
        T.check_cuda(ws, "float_workspace_buffer")
        if not ws.is_contiguous():
            raise ArgumentError("float_workspace_buffer: must be contiguous")

    def _ensure_op(self, key, options, batch_size: int, variant=None) -> None:
        """Creates the C object when the options change or the batch outgrows its capacity;
        the object's variant is kept alive as long as the object (it holds the pointer)."""
        if self._op is not None and key == self._op_key and batch_size <= self._op_capacity:
            return
        if self._use_cuda_graph and self._captured and self._op is not None:
            # A captured graph keeps the object's kernels, grid and workspace layout: a new
            # object over the same workspace would leave it reading a schedule laid out for
            # other options.
            raise ArgumentError(
                "CUDA graph mode: the options (heads, head dim, page size, dtypes, scales, "
                "window, soft cap, variant, RoPE) must stay those of the plan a run() was "
                "captured with; use another wrapper (and workspace) for other options")
        if self._use_cuda_graph:
            candidates = [max(self._fixed_batch_size, 1)]
        else:
            # Grow geometrically so a slowly growing batch re-creates the object rarely; fall back
            # to the exact batch if the rounded one does not fit the workspace.
            want = max(batch_size, 1)
            if key == self._op_key:
                want = max(want, 2 * self._op_capacity)
            candidates = [_next_pow2(want)]
            if candidates[0] != max(batch_size, 1):
                candidates.append(max(batch_size, 1))
        lib = _lib.lib()
        ctx = T.context_of(self.device)
        ws = self._float_workspace_buffer
        ws_bytes = ws.numel() * ws.element_size()
        where = "BatchDecodeWithPagedKVCacheWrapper.plan"
        need = 0
        for capacity in candidates:
            opts = options(max_batch_size=capacity)
            nbytes = ctypes.c_size_t()
            _lib.check(lib.cinfer_batch_decode_workspace_size(ctx, ctypes.byref(opts),
                                                              ctypes.byref(nbytes)), where)
            need = nbytes.value
            if need <= ws_bytes:
                break
        else:
            raise ArgumentError(
                f"float_workspace_buffer: {ws_bytes} bytes, cinfer needs {need} bytes for "
                f"{candidates[-1]} requests with these options; allocate a larger buffer",
                WORKSPACE_TOO_SMALL,
            )
        op = ctypes.c_void_p()
        _lib.check(lib.cinfer_batch_decode_create(ctx, ctypes.byref(opts), ws.data_ptr(),
                                                  ws_bytes, ctypes.byref(op)), where)
        self._destroy()
        self._op = op
        self._op_lib = lib  # destroys it (a late collection must not mix libraries)
        self._op_key = key
        self._op_capacity = capacity
        self._op_variant = variant

    def _destroy(self) -> None:
        op, self._op = self._op, None
        self._plan = None
        self._op_key = None
        self._op_capacity = 0
        if op is not None:
            self._op_lib.cinfer_batch_decode_destroy(op)
        self._op_variant = None  # after the object that points at it

    def __del__(self) -> None:
        try:
            self._destroy()
        except Exception:  # interpreter shutdown: the library may already be unloaded
            pass


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    r"""FlashInfer's CUDA-graph variant of :class:`BatchDecodeWithPagedKVCacheWrapper`: the same
    wrapper with ``use_cuda_graph=True`` and the three page-table buffers given positionally.

    Parameters
    ----------
    workspace_buffer : torch.Tensor
        The device workspace (see :class:`BatchDecodeWithPagedKVCacheWrapper`).
    indptr_buffer : torch.Tensor
        int32 CUDA buffer of ``max_batch_size + 1`` entries.
    indices_buffer : torch.Tensor
        int32 CUDA buffer for the page indices of every plan.
    last_page_len_buffer : torch.Tensor
        int32 CUDA buffer of ``max_batch_size`` entries.
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``.
    use_tensor_cores : bool
        Accepted for compatibility and ignored.
    """

    def __init__(
        self,
        workspace_buffer: torch.Tensor,
        indptr_buffer: torch.Tensor,
        indices_buffer: torch.Tensor,
        last_page_len_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_tensor_cores: bool = False,
    ) -> None:
        super().__init__(
            workspace_buffer,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer,
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "single_decode_with_kv_cache",
]
