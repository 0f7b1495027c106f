"""MLA (multi-head latent attention, DeepSeek-V2/V3) over a paged latent cache: FlashInfer's
``BatchMLAPagedAttentionWrapper`` on cinfer's ``cinfer_batch_mla_*`` (include/cinfer.h, "MLA")."""

from __future__ import annotations

import ctypes
import math
from typing import Optional, Tuple, Union

from . import _args as A
from . import _lib
from . import _tensor as T
from .errors import ArgumentError, UnsupportedError, WORKSPACE_TOO_SMALL

__all__ = ["BatchMLAPagedAttentionWrapper"]

# FlashInfer's backend names for this wrapper.
_BACKENDS = ("auto", "fa2", "fa3", "cutlass")


class BatchMLAPagedAttentionWrapper:
    r"""MLA attention over a paged latent cache, planned once per step and run once per layer.

    Every query head attends over one latent KV shared by all heads (the weight-absorbed form of
    MLA): ``s = (q_nope . ckv + q_pe . kpe) * sm_scale``, ``out = softmax(s) @ ckv``, with
    ``q_nope [rows, H, 512]``, ``q_pe [rows, H, 64]``, ``ckv_cache [pages, page_size, 512]`` and
    ``kpe_cache [pages, page_size, 64]``. Decode (one row per request) and incremental prefill
    (``causal`` bottom-right aligned) both run; long KV with few rows is split across CTAs and
    merged. The LSE is base 2.

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        A CUDA buffer (any dtype, contiguous) holding the schedule and the split-KV partial
        states; 128 MB suits most batches (:meth:`plan` says when it is too small).
    use_cuda_graph : bool
        Fixed grids and buffers so a captured :meth:`run` replays after later plans; the first
        plan fixes the options and its batch size and query rows are the capacity (or the
        length of ``qo_indptr`` - 1 when given).
    qo_indptr, kv_indptr, kv_indices, kv_len_arr : Optional[torch.Tensor]
        CUDA-graph mode's buffers in FlashInfer; accepted, and ``qo_indptr`` sets the batch
        capacity. cinfer keeps the page indices in a buffer of its own (``kv_indices``, when
        given, is filled too).
    backend : str
        One of FlashInfer's names (``"auto"``, ``"fa2"``, ``"fa3"``, ``"cutlass"``), checked and
        otherwise ignored: the library picks the kernel (on Hopper, sm_90a, a warpgroup kernel
        for ``num_heads`` a multiple of 64; a 16-row tensor-core kernel otherwise).

    Differences from FlashInfer: ``num_heads`` must be a multiple of 16 or 1, 2, 4 or 8;
    ``head_dim_ckv`` 512 and ``head_dim_kpe`` 64 (other values: :class:`cinfer.UnsupportedError`);
    q and the caches of one dtype, fp16 or bf16; ``kv_len_arr[b]`` must end in request ``b``'s
    last listed page (FlashInfer ignores pages past the length); in CUDA-graph mode the first
    plan's batch size and query rows are the capacity; ``use_profiler``, ``profiler_buffer``,
    ``kv_len`` and ``page_table`` are not supported; ``return_lse_base_on_e`` converts the LSE.
    """

    def __init__(self, float_workspace_buffer, use_cuda_graph: bool = False,
                 qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None,
                 backend: str = "auto") -> None:
        self._op = None  # cinfer_batch_mla_t*, set first so __del__ always finds it
        T.torch_module()
        if backend not in _BACKENDS:
            raise ArgumentError(
                f"backend = {backend!r}, expected one of {', '.join(map(repr, _BACKENDS))} "
                "(accepted for compatibility; cinfer chooses its own kernels)"
            )
        ws = T.as_tensor(float_workspace_buffer, "float_workspace_buffer")
        T.check_cuda(ws, "float_workspace_buffer")
        if not ws.is_contiguous():
            raise ArgumentError("float_workspace_buffer: must be contiguous")
        self._float_workspace_buffer = ws
        self.device = ws.device
        self._use_cuda_graph = bool(use_cuda_graph)
        if qo_indptr is not None:
            qo_indptr = T.as_tensor(qo_indptr, "qo_indptr")
            T.check_ndim(qo_indptr, "qo_indptr", 1, "a 1-D int32 buffer of batch + 1 entries")
        self._fixed_batch = qo_indptr.shape[0] - 1 if qo_indptr is not None else None
        self._kv_indices_buf = kv_indices
        self._key = None
        self._lib = None
        self._plan = None
        # run()'s argument structs, reused while a tensor keeps its layout (not thread-safe,
        # as the wrappers of batch decode and prefill)
        self._slots = {n: T.DLSlot(n) for n in ("q_nope", "q_pe", "ckv_cache", "kpe_cache",
                                                 "out", "lse")}
        self._stream = T.stream_getter(self.device)

    # ---- plan ----

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads: int,
             head_dim_ckv: int, head_dim_kpe: int, page_size: int, causal: bool,
             sm_scale: float, q_data_type, kv_data_type, use_profiler: bool = False) -> None:
        r"""Plan one step; every :meth:`run` until the next plan uses it.

        Parameters
        ----------
        qo_indptr : torch.Tensor
            ``[batch_size + 1]`` int32 (CPU or CUDA): request ``b`` owns query rows
            ``qo_indptr[b]:qo_indptr[b+1]`` (decode: ``0, 1, ..., batch_size``).
        kv_indptr : torch.Tensor
            ``[batch_size + 1]`` int32: request ``b`` owns page-table entries
            ``kv_indptr[b]:kv_indptr[b+1]``.
        kv_indices : torch.Tensor
            int32 page indices, at least ``kv_indptr[-1]`` entries.
        kv_len_arr : torch.Tensor
            ``[batch_size]`` int32: each request's KV length, within its last page
            (``(pages - 1) * page_size < kv_len <= pages * page_size``; 0 without pages).
        num_heads, head_dim_ckv, head_dim_kpe, page_size : int
            Query heads (a multiple of 16, or 1, 2, 4, 8), 512, 64, tokens per page (1..256).
        causal : bool
            Bottom-right aligned causal mask (for rows of a prefill chunk).
        sm_scale : float
            The logit scale (DeepSeek's ``1 / sqrt(128 + 64)`` times its YaRN factor).
        q_data_type, kv_data_type : torch.dtype
            fp16 or bf16, the same.
        use_profiler : bool
            Must be False.

        Raises
        ------
        TypeError
            A number argument of another type (a string or a bool; a float for ``num_heads``,
            the head dims or ``page_size``).
        ValueError
            Bad indptr arrays or lengths, a workspace too small (the message gives the size).
        cinfer.UnsupportedError
            Heads, head dims or dtypes the kernel does not take; ``use_profiler``.
        """
        if use_profiler:
            raise UnsupportedError("use_profiler = True is not supported")
        torch = T.torch_module()
        num_heads = A.integer(num_heads, "num_heads")
        head_dim_ckv = A.integer(head_dim_ckv, "head_dim_ckv")
        head_dim_kpe = A.integer(head_dim_kpe, "head_dim_kpe")
        page_size = A.integer(page_size, "page_size")
        sm_scale = A.real(sm_scale, "sm_scale")
        qo_indptr, qo_host = A.host_index(qo_indptr, "qo_indptr")
        kv_indptr, kv_host = A.host_index(kv_indptr, "kv_indptr")
        kv_len_arr, len_host = A.host_index(kv_len_arr, "kv_len_arr")
        indices = T.as_tensor(kv_indices, "kv_indices")
        T.check_ndim(indices, "kv_indices", 1, "[kv_indptr[-1]] page indices")
        T.check_dtype(indices, "kv_indices", (torch.int32,), "torch.int32", unsupported=False)
        batch = qo_host.shape[0] - 1
        if batch < 0:
            raise ArgumentError("qo_indptr: 0 entries, expected batch_size + 1 >= 1")
        if kv_host.shape[0] != batch + 1 or len_host.shape[0] != batch:
            raise ArgumentError(
                f"kv_indptr: {kv_host.shape[0]} entries, kv_len_arr: {len_host.shape[0]}; "
                f"expected {batch + 1} and {batch} (qo_indptr has {batch + 1})")
        pages = (kv_host[1:] - kv_host[:-1]).long()
        last = (len_host.long() - (pages - 1).clamp(min=0) * page_size)
        bad = ((pages > 0) & ((last < 1) | (last > page_size))) | \
              ((pages == 0) & (len_host != 0))
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise ArgumentError(
                f"kv_len_arr[{b}] = {int(len_host[b])} does not fit the {int(pages[b])} pages of "
                f"{page_size} tokens that kv_indptr gives request {b}")
        last = torch.where(pages > 0, last, torch.ones_like(last)).to(torch.int32).contiguous()
        num_pages = int(kv_host[batch])
        if num_pages > indices.shape[0]:
            raise ArgumentError(f"kv_indices: {indices.shape[0]} entries, but kv_indptr[-1] = "
                                f"{num_pages}")
        q_dtype, kv_dtype = A.plan_dtypes(q_data_type, kv_data_type)
        total_qo = int(qo_host[batch]) - int(qo_host[0]) if batch > 0 else 0
        if self._use_cuda_graph:
            # q and out rows are absolute (qo_indptr[b] ..): the capacity bounds the last row.
            qo_end = int(qo_host[batch]) if batch > 0 else 0
            if self._op is None:
                self._fixed_batch = self._fixed_batch or max(batch, 1)
                self._max_total_qo = max(qo_end, 1)
            if batch > self._fixed_batch or qo_end > self._max_total_qo:
                raise ArgumentError(
                    f"batch_size {batch} / qo_indptr[-1] = {qo_end} query rows exceed the CUDA "
                    f"graph capacity {self._fixed_batch} / {self._max_total_qo}")
        key = (num_heads, head_dim_ckv, head_dim_kpe, page_size,
               bool(causal), A.f32(sm_scale), q_dtype, kv_dtype)
        opts = _lib.mla_options(
            num_heads=num_heads, head_dim_ckv=head_dim_ckv,
            head_dim_kpe=head_dim_kpe, page_size=page_size,
            q_dtype=T.dl_dtype(q_dtype), kv_dtype=T.dl_dtype(kv_dtype),
            sm_scale=sm_scale, use_cuda_graph=1 if self._use_cuda_graph else 0)
        self._plan = None
        self._ensure_op(key, opts, bool(causal), batch, total_qo)
        # Everything that can reject the plan before the C plan replaces the previous one: a
        # captured graph replays whatever schedule the object holds, against the page-index
        # buffer below.
        if self._use_cuda_graph and self._indices.shape[0] < num_pages:
            raise ArgumentError(
                f"kv_indices: kv_indptr[-1] = {num_pages} entries do not fit the CUDA graph "
                f"mode's page-index buffer ({self._indices.shape[0]} entries: the constructor's "
                "kv_indices buffer, or 2^20)")
        stream = T.stream_of(self.device)
        p_i32 = ctypes.POINTER(ctypes.c_int32)
        _lib.check(self._lib.cinfer_batch_mla_plan(
            self._op, ctypes.cast(qo_host.data_ptr(), p_i32),
            ctypes.cast(kv_host.data_ptr(), p_i32),
            ctypes.cast(last.data_ptr(), p_i32) if batch else None, batch, stream),
            "BatchMLAPagedAttentionWrapper.plan")
        if self._use_cuda_graph:
            self._indices[:num_pages].copy_(indices[:num_pages], non_blocking=True)
            if self._kv_indices_buf is not None and self._kv_indices_buf.shape[0] >= num_pages:
                self._kv_indices_buf[:num_pages].copy_(indices[:num_pages], non_blocking=True)
            d_indices = self._indices
        else:
            d_indices = indices.to(self.device, non_blocking=True)
            if d_indices.numel() == 0:  # an empty tensor has no data pointer
                d_indices = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._plan = (num_heads, int(qo_host[batch]), q_dtype, d_indices,
                      T.to_dl(d_indices, "kv_indices"))

    def _ensure_op(self, key, opts, causal: bool, batch: int, total_qo: int) -> None:
        """The C object for these options, created (or re-created larger outside graph mode)
        when needed."""
        torch = T.torch_module()
        if self._use_cuda_graph:
            if self._op is not None:
                if key != self._key:
                    raise ArgumentError("CUDA graph mode: the options (heads, head dims, page "
                                        "size, causal, sm_scale, dtypes) must stay the first "
                                        "plan's")
                return
            max_batch, max_qo = self._fixed_batch, self._max_total_qo
        else:
            if (self._op is not None and key == self._key and batch <= self._max_batch
                    and total_qo <= self._max_qo):
                return
            max_batch = max(A.next_pow2(max(batch, 1)), 16)
            max_qo = max(A.next_pow2(max(total_qo, 1)), 64)
            if self._op is not None and key == self._key:
                max_batch, max_qo = max(max_batch, self._max_batch), max(max_qo, self._max_qo)
        self._destroy()
        lib = _lib.lib()
        ctx = T.context_of(self.device)
        opts.max_batch_size = max_batch
        ws = self._float_workspace_buffer
        ws_bytes = ws.numel() * ws.element_size()
        need = ctypes.c_size_t()
        where = "BatchMLAPagedAttentionWrapper.plan"
        _lib.check(lib.cinfer_batch_mla_workspace_size(ctx, ctypes.byref(opts), int(causal),
                                                       max_qo, ctypes.byref(need)), where)
        if need.value > ws_bytes:
            raise ArgumentError(
                f"float_workspace_buffer: {ws_bytes} bytes, cinfer needs {need.value} bytes for "
                f"{max_batch} requests and {max_qo} query rows; allocate a larger buffer",
                WORKSPACE_TOO_SMALL)
        handle = ctypes.c_void_p()
        _lib.check(lib.cinfer_batch_mla_create(ctx, ctypes.byref(opts), int(causal), max_qo,
                                               ws.data_ptr(), ws_bytes, ctypes.byref(handle)),
                   where)
        self._op, self._lib, self._key = handle, lib, key
        self._max_batch, self._max_qo = max_batch, max_qo
        self._indices = None
        if self._use_cuda_graph:
            # The captured run reads the page indices from one buffer: as long as the caller's
            # kv_indices buffer when given, else 2^20 entries (4 MiB).
            n = (self._kv_indices_buf.shape[0] if self._kv_indices_buf is not None
                 else 1 << 20)
            self._indices = torch.zeros(max(n, 1), dtype=torch.int32, device=self.device)

    # ---- run ----

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None,
            return_lse: bool = False, profiler_buffer=None, kv_len=None, page_table=None,
            return_lse_base_on_e: bool = False
            ) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
        r"""MLA attention of the planned step for one layer (capturable in a CUDA graph).

        Parameters
        ----------
        q_nope, q_pe : torch.Tensor
            ``[>= qo_indptr[-1], num_heads, 512]`` and ``[same rows, num_heads, 64]`` in the
            planned dtype.
        ckv_cache, kpe_cache : torch.Tensor
            ``[max_pages, page_size, 512]`` and ``[max_pages, page_size, 64]``.
        out : Optional[torch.Tensor]
            ``q_nope``'s shape and dtype; allocated if None.
        lse : Optional[torch.Tensor]
            ``[rows, num_heads]`` float32, base 2; written when given, allocated when None and
            ``return_lse``.
        return_lse : bool
            Return ``(out, lse)``.
        return_lse_base_on_e : bool
            The LSE written (``lse``, or the one returned with ``return_lse``) in base e (the
            kernel's base-2 LSE times ln 2); it does not change what is returned, as in
            FlashInfer.

        Raises
        ------
        ValueError
            No plan; shapes or dtypes that contradict the plan (the library's message).
        cinfer.UnsupportedError
            ``profiler_buffer``, ``kv_len`` or ``page_table``; misaligned rows.
        """
        if profiler_buffer is not None or kv_len is not None or page_table is not None:
            raise UnsupportedError("profiler_buffer, kv_len and page_table are not supported "
                                   "(cinfer's MLA takes the planned lengths and pages)")
        if self._plan is None:
            raise ArgumentError("run() before plan(): call plan() first (again after a failed "
                                "plan)")
        heads, qo_end, q_dtype, _indices, dl_indices = self._plan
        slots = self._slots
        q_nope, q_nope_ref = A.slot_ref(slots["q_nope"], q_nope, "q_nope", self.device)
        torch = T.torch_module()
        if (self._use_cuda_graph and q_nope.shape[0] < self._max_total_qo
                and torch.cuda.is_current_stream_capturing()):
            # A replay after a later plan with more rows would read q and write out past the
            # rows captured here (the grid is fixed for the capacity).
            raise ArgumentError(
                f"q_nope: capturing run() with {q_nope.shape[0]} rows, below the "
                f"{self._max_total_qo} query rows of the CUDA graph mode: capture with q_nope, "
                "q_pe and out of that many rows so they cover every later plan")
        q_pe, q_pe_ref = A.slot_ref(slots["q_pe"], q_pe, "q_pe", self.device)
        _, ckv_ref = A.slot_ref(slots["ckv_cache"], ckv_cache, "ckv_cache", self.device)
        _, kpe_ref = A.slot_ref(slots["kpe_cache"], kpe_cache, "kpe_cache", self.device)
        if out is None:
            out = torch.empty(q_nope.shape, dtype=q_nope.dtype, device=q_nope.device)
        out, out_ref = A.slot_ref(slots["out"], out, "out", self.device)
        if lse is None and return_lse:
            lse = torch.empty((q_nope.shape[0], heads), dtype=torch.float32,
                              device=q_nope.device)
        lse_ref = None
        if lse is not None:
            lse, lse_ref = A.slot_ref(slots["lse"], lse, "lse", self.device)
        if q_nope.shape[0] > 0 or qo_end > 0:
            _lib.check(self._lib.cinfer_batch_mla_run(
                self._op, q_nope_ref, q_pe_ref, ckv_ref, kpe_ref, ctypes.byref(dl_indices),
                out_ref, lse_ref, self._stream()),
                "BatchMLAPagedAttentionWrapper.run")
        if lse is not None and return_lse_base_on_e:
            lse.mul_(math.log(2.0))
        return (out, lse) if return_lse else out

    def _destroy(self) -> None:
        if self._op is not None:
            self._lib.cinfer_batch_mla_destroy(self._op)
            self._op = None
            self._plan = None

    def __del__(self) -> None:
        try:
            self._destroy()
        except Exception:  # interpreter shutdown: the library may already be unloaded
            pass
