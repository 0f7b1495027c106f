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

import ctypes
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

from . import _args as A
from . import _dispatch
from . import _lib
from . import _tensor as T
from . import variant as V
from .errors import ArgumentError, UnsupportedError
from .decode import BatchDecodeWithPagedKVCacheWrapper
from .prefill import BatchPrefillWithPagedKVCacheWrapper

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


# ---------------------------------------------------------------------------------------------
# Multi-level cascade attention
# ---------------------------------------------------------------------------------------------

# Workspace slices of the levels start on this boundary (the library wants 256-byte aligned
# workspaces).
_SLICE_ALIGN = 256

# Sets of level-state buffers kept per cascade wrapper (one per CUDA stream that ran it).
_MAX_STATE_SETS = 4

_RUN_NAME = "MultiLevelCascadeAttentionWrapper.run"


# How a level runs (chosen at plan; a single level always runs batch prefill; in CUDA graph mode
# each level keeps the kind of the wrapper's first plan, see MultiLevelCascadeAttentionWrapper):
# PREFILL: batch prefill of the level's groups;
# DECODE: every group of the level has one query row (a decode step): batch decode, whose
#   tensor-core kernel reads each KV head once for all the query heads of its group (batch
#   prefill runs one query head per CTA, a 1-row tile of 32, and reads the KV once per head).
_PREFILL, _DECODE = "prefill", "decode"


class _States:
    """The levels' partial states of one run, ``v`` ``[rows, num_levels, H, D]`` and ``s``
    ``[rows, num_levels, H]`` float32, with the DLTensors of each level's slice (a level's
    batch prefill or decode writes its output and LSE there, strided) and of the whole (the input
    of the one merge_states that folds the levels)."""

    __slots__ = ("rows", "v", "s", "level_refs", "dls", "v_ref", "s_ref", "first_rows")

    def __init__(self, rows: int, num_levels: int, num_heads: int, head_dim: int, dtype,
                 device) -> None:
        torch = T.torch_module()
        self.rows = rows
        self.v = torch.empty((rows, num_levels, num_heads, head_dim), dtype=dtype, device=device)
        self.s = torch.empty((rows, num_levels, num_heads), dtype=torch.float32, device=device)
        # The structs must outlive their byref() references: keep them here.
        self.dls = [(T.to_dl(self.v[:, i], "out"), T.to_dl(self.s[:, i], "lse"))
                    for i in range(num_levels)]
        self.dls.append((T.to_dl(self.v, "v"), T.to_dl(self.s, "s")))
        self.level_refs = [(ctypes.byref(dv), ctypes.byref(ds)) for dv, ds in self.dls[:-1]]
        self.v_ref, self.s_ref = (ctypes.byref(d) for d in self.dls[-1])
        self.first_rows: dict = {}  # see level_refs_of

    def level_refs_of(self, level: int, n: int):
        """Level ``level``'s slice cut to its first ``n`` rows (a batch decode level takes
        exactly its batch's rows): the same addresses as ``level_refs[level]``, so a captured
        launch writes where a replay after a plan with another batch expects. Made once per
        (level, n)."""
        if n == self.rows:
            return self.level_refs[level]
        got = self.first_rows.get((level, n))
        if got is None:
            dv = T.to_dl(self.v[:n, level], "out")
            ds = T.to_dl(self.s[:n, level], "lse")
            got = (dv, ds, (ctypes.byref(dv), ctypes.byref(ds)))
            self.first_rows[(level, n)] = got
        return got[2]


class _Level:
    """One level's launch, bound at plan: its kind, the C object, the entry point and the
    references its run takes besides q, the cache and the outputs (the page table: a batch
    prefill object keeps its indptr from plan, batch decode takes it at run)."""

    __slots__ = ("kind", "handle", "run_fn", "table_refs", "args_ref", "args", "rows", "q")

    def __init__(self, kind: str, wrapper, prefill_run) -> None:
        p = wrapper._plan
        self.kind = kind
        self.args = (p.builtin_args if p.builtin_args is not None
                     else V.pack_args(p.variant, None, _RUN_NAME))
        self.args_ref = self.args.ref()
        # Batch decode takes q, out and lse of exactly its batch's rows; when the run's q has
        # more (a CUDA-graph capture sized for later plans), the level gets its first rows
        # through its own q struct (same addresses).
        self.rows = None
        self.q = None
        if kind == _DECODE:
            self.handle = wrapper._op
            self.run_fn = p.run_fn
            self.table_refs = (p.indptr_ref, p.indices_ref, p.last_page_len_ref)
            self.rows = p.batch_size
            self.q = T.DLSlot("q")
        else:
            self.handle = p.op.handle
            self.run_fn = prefill_run
            self.table_refs = (ctypes.byref(p.dl_kv_indices),)

    def launch(self, q_ref, k_ref, v_ref, o_ref, s_ref, stream) -> None:
        _lib.check(self.run_fn(self.handle, q_ref, k_ref, v_ref, *self.table_refs, o_ref, s_ref,
                               self.args_ref, stream), _RUN_NAME)


class _Launch:
    """Everything :meth:`MultiLevelCascadeAttentionWrapper.run` needs, bound once by
    :meth:`~MultiLevelCascadeAttentionWrapper.plan`: each level's launch (_Level), the library's
    entry points, the context, the stream accessor, reusable argument structs (a call with
    tensors of the last call's layout only updates their data pointers) and the level-state
    buffers, per stream. A run is then the levels' launches and one merge, with one allocation
    (the output; the LSE too with ``return_lse``)."""

    def __init__(self, wrappers, kinds, graph: bool, states, captured, side) -> None:
        lib = _lib.lib()
        # The plans own the page tables' device tensors and DLTensors that the levels' launches
        # read; keeping them keeps those alive until the next plan.
        self.plans = [w._plan for w in wrappers]
        self.levels = [_Level(k, w, lib.cinfer_batch_prefill_run) for w, k in zip(wrappers, kinds)]
        first = self.plans[0]
        self.num_heads = first.num_qo_heads
        self.head_dim = first.head_dim
        self.dtype = first.q_dtype
        self.device = wrappers[0].device
        self.ctx = T.context_of(self.device)
        self.stream = T.stream_getter(self.device)
        self.merge_fn = lib.cinfer_merge_states
        # Graph mode: captured runs must cover the most query rows any later plan may have (a
        # batch decode level's: its buffers' batch capacity).
        self.capture_rows = (max(w._fixed_batch_size if k == _DECODE else w._max_total_qo
                                 for w, k in zip(wrappers, kinds)) if graph else 0)
        # Outside graph mode a run with no query rows and nothing planned launches nothing.
        self.empty_ok = not graph and all(_planned_rows(p) <= 0 for p in self.plans)
        self.q = T.DLSlot("q")
        self.kv = A.PagedKVSlots(self.device)
        self.out = T.DLSlot("out")
        self.lse = T.DLSlot("lse")
        # The wrapper's, kept from plan to plan (see MultiLevelCascadeAttentionWrapper.plan).
        self.states = states
        # The wrapper's state sets a CUDA graph captured: its replays write their addresses, so
        # they live as long as the wrapper, whatever states_for drops later (another row count
        # on that stream, a fifth stream, another plan key).
        self.captured = captured
        self.graph = graph
        # The stream the levels after the first run on while a graph is captured (graph mode;
        # None: all on the caller's stream).
        self.side = side

    def states_for(self, stream: int, rows: int) -> _States:
        """The level states for a run on ``stream`` with ``rows`` query rows: allocated on that
        stream the first time, so the caching allocator never hands them to another stream
        while this one may still use them (runs on one stream are ordered, so they can share
        the buffers)."""
        st = self.states.pop(stream, None)
        if st is None or st.rows != rows:
            st = _States(rows, len(self.levels), self.num_heads, self.head_dim, self.dtype,
                         self.device)
        self.states[stream] = st  # most recently used last
        while len(self.states) > _MAX_STATE_SETS:
            del self.states[next(iter(self.states))]
        return st

    def warm_merge(self) -> None:
        """Runs the levels' merge once on a one-row state, so that its kernel is compiled (or
        loaded) here rather than in the first :meth:`run`, which may be a CUDA graph capture."""
        torch = T.torch_module()
        st = _States(1, len(self.levels), self.num_heads, self.head_dim, self.dtype,
                     self.device)
        st.v.zero_()
        st.s.zero_()
        out = torch.empty((1, self.num_heads, self.head_dim), dtype=self.dtype,
                          device=self.device)
        dl_out = T.to_dl(out, "out")
        _lib.check(self.merge_fn(self.ctx, st.v_ref, st.s_ref, ctypes.byref(dl_out), None,
                                 self.stream()), "MultiLevelCascadeAttentionWrapper.plan")

    def run(self, q, paged_kv_cache, return_lse: bool):
        torch = T.torch_module()
        q, q_ref = A.slot_ref(self.q, q, "q", self.device, 3,
                              "[num_rows, num_qo_heads, head_dim]")
        k_ref, v_ref = self.kv.refs(paged_kv_cache)
        rows = q.shape[0]
        # Only a graph-mode wrapper's runs are captured (asked once per run).
        capturing = self.graph and torch.cuda.is_current_stream_capturing()
        if rows < self.capture_rows and capturing:
            # A replay after a later plan with more rows would read q and write out past the
            # rows captured here.
            raise ArgumentError(
                f"q: capturing run() with {rows} rows, below the {self.capture_rows} query rows "
                "of the CUDA graph mode: capture with q of that many rows so it covers every "
                "later plan"
            )
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = (torch.empty((rows, q.shape[1]), dtype=torch.float32, device=q.device)
               if return_lse else None)
        if rows == 0 and self.empty_ok:
            return (out, lse) if return_lse else out
        out, out_ref = A.slot_ref(self.out, out, "out", self.device)
        lse_ref = None
        if lse is not None:
            lse, lse_ref = A.slot_ref(self.lse, lse, "lse", self.device)
        stream = self.stream()
        if len(self.levels) == 1:
            self.levels[0].launch(q_ref, k_ref, v_ref, out_ref, lse_ref, stream)
            return (out, lse) if return_lse else out
        # Every level writes its state into its slice of the state buffers, the prefix (the
        # longest) first; one merge_states folds them into out (and lse).
        st = self.states_for(stream, rows)
        if capturing and not any(c is st for c in self.captured):
            self.captured.append(st)
        # The levels are independent until the merge. While a CUDA graph is captured (graph
        # mode) the first (the shared prefix, whose batch prefill is compute-bound) runs on the
        # caller's stream and the others (per-request KV, memory-bound) on the side stream beside
        # it, forked from and joined back into the caller's stream (the capture records both),
        # the side stream's launches enqueued first. bench/cascade.py, 2026-11-30: graph step
        # 73.8 -> 70.5 us; uncaptured, the fork and join cost more host time per call than they
        # save (per call 95 -> 104-127 us), so eager runs keep one stream.
        main = side = None
        if self.side is not None and capturing:
            main = torch.cuda.current_stream(self.device)
            self.side.wait_stream(main)
            side = self.side.cuda_stream
        order = range(len(self.levels)) if side is None else [*range(1, len(self.levels)), 0]
        try:
            for i in order:
                lvl = self.levels[i]
                level_stream = stream if i == 0 or side is None else side
                if lvl.rows is not None and lvl.rows < rows:
                    _, lq_ref = A.slot_ref(lvl.q, q[:lvl.rows], "q", self.device)
                    lvl.launch(lq_ref, k_ref, v_ref, *st.level_refs_of(i, lvl.rows),
                               level_stream)
                else:
                    lvl.launch(q_ref, k_ref, v_ref, *st.level_refs[i], level_stream)
        finally:
            # Joined even when a launch raised, so that a capture does not end with the side
            # stream unjoined (hiding the error).
            if main is not None:
                main.wait_stream(self.side)
        _lib.check(self.merge_fn(self.ctx, st.v_ref, st.s_ref, out_ref, lse_ref, stream),
                   _RUN_NAME)
        return (out, lse) if return_lse else out


def _planned_rows(p) -> int:
    """The query rows a level's plan covers (a batch prefill plan's qo_end; a decode plan's
    batch size)."""
    return p.qo_end if hasattr(p, "qo_end") else p.batch_size


class MultiLevelCascadeAttentionWrapper:
    r"""Cascade attention over a KV cache organized in levels (FlashInfer's
    ``MultiLevelCascadeAttentionWrapper``): level 0 is typically a prefix shared by every
    request, the last level each request's own tokens. Each level is one batch prefill over its
    own page table, in which a level's "request" is a group of query rows sharing that level's
    KV: the shared prefix is read once for all the rows that attend it instead of once per
    request. The levels' partial states (output, base-2 LSE) are merged exactly with one
    :func:`merge_states`, so the result equals attention over each row's concatenated KV
    (levels in order). With more than one level, a level whose every group is one query row
    (``qo_indptr_arr[l]`` = ``0, 1, ..., n``: a decode step's own tokens) runs as batch decode
    instead (cinfer extension, same result: the tensor-core decode kernel reads each KV head once
    for its query heads, where batch prefill reads it once per query head); in CUDA graph mode
    under the rule in the notes.

    Parameters
    ----------
    num_levels : int
        Number of levels, >= 1.
    float_workspace_buffer : torch.Tensor
        Device workspace (contiguous, CUDA), split evenly between the levels (each level plans
        into its own slice); :meth:`plan` raises ValueError when a slice is too small.
    kv_layout : str
        ``"NHD"`` (default) or ``"HND"``.
    use_cuda_graph : bool
        CUDA graph mode: each level keeps its page table in the buffers below, and :meth:`run`
        can be captured (see :class:`cinfer.BatchPrefillWithPagedKVCacheWrapper` and
        :class:`cinfer.BatchDecodeWithPagedKVCacheWrapper`). In a capture, levels 1 and up run
        on a side stream beside level 0, forked from and joined back into the caller's stream
        (the graph holds both branches).
    qo_indptr_buf_arr, paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
    paged_kv_last_page_len_buf_arr : Optional[List[torch.Tensor]]
        Graph mode: one buffer per level, as the batch prefill wrapper's ``qo_indptr_buf``,
        ``paged_kv_indptr_buf``, ``paged_kv_indices_buf``, ``paged_kv_last_page_len_buf``
        (a level running as batch decode uses the last three as the batch decode wrapper's
        buffers).

    Notes
    -----
    The query rows of a step are the same for every level (``q`` of :meth:`run`); level ``l``
    groups them with ``qo_indptr_arr[l]``. Only the last level is causal (``plan(causal=...)``):
    the levels above hold positions that precede every query. ``window_left`` must be -1 with
    more than one level (a window relative to a level's own KV is not the window of the
    concatenated KV). Not thread-safe.

    CUDA graph mode: a captured run replays the launches of the plan it was captured after, so
    each level's kind is fixed by the wrapper's **first** successful :meth:`plan`: a level whose
    groups were one query row each then runs as batch decode in every later plan, and a later
    plan that gives it a group of several rows raises ValueError naming the level and
    ``qo_indptr`` (plan the first step as the steps you will capture, or use another wrapper); a
    level first planned as batch prefill stays batch prefill whatever its groups. A batch decode
    level holds at most ``len(paged_kv_last_page_len_buf_arr[l])`` groups, and captures need q
    with at least that many rows (as for a batch prefill level's ``max_total_qo`` rows).
    """

    def __init__(
        self,
        num_levels: int,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf_arr: Optional[List[torch.Tensor]] = None,
        paged_kv_indptr_buf_arr: Optional[List[torch.Tensor]] = None,
        paged_kv_indices_buf_arr: Optional[List[torch.Tensor]] = None,
        paged_kv_last_page_len_buf_arr: Optional[List[torch.Tensor]] = None,
    ) -> None:
        num_levels = A.integer(num_levels, "num_levels")
        if num_levels < 1:
            raise ArgumentError(f"num_levels = {num_levels}, expected >= 1")
        self._num_levels = num_levels
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._launch: Optional[_Launch] = None
        # Level states per stream (_Launch.states_for) and the (dtype, heads, head_dim) they
        # were made for. They outlive a plan: steps of one shape reuse them, and a CUDA graph
        # captured before a plan goes on writing the buffers it was captured with.
        self._states: dict = {}
        self._states_key = None
        self._captured_states: list = []  # see _Launch.captured
        # CUDA graph mode: the stream the levels after the first run on in a capture, beside
        # it (_Launch.run); made by the first plan of a cascade of two or more levels on a CUDA
        # device.
        self._side_stream = None
        slices = self._split(float_workspace_buffer, num_levels)
        self._slices = slices
        self._decode_wrappers: list = [None] * num_levels
        # Graph mode: each level's kind, fixed by the first successful plan (see the class
        # notes), and the page-table buffers a batch decode level's wrapper is made over.
        self._graph_kinds: Optional[List[str]] = None
        self._graph_tables = None
        if self._use_cuda_graph:
            arrs = {"qo_indptr_buf_arr": qo_indptr_buf_arr,
                    "paged_kv_indptr_buf_arr": paged_kv_indptr_buf_arr,
                    "paged_kv_indices_buf_arr": paged_kv_indices_buf_arr,
                    "paged_kv_last_page_len_buf_arr": paged_kv_last_page_len_buf_arr}
            for name, arr in arrs.items():
                if arr is None or len(arr) != num_levels:
                    raise ArgumentError(f"{name}: expected a list of {num_levels} buffers (one "
                                        "per level) in cudagraph mode")
            self._graph_tables = (paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
                                  paged_kv_last_page_len_buf_arr)
            self._wrappers = [
                BatchPrefillWithPagedKVCacheWrapper(
                    slices[i], kv_layout, use_cuda_graph=True,
                    qo_indptr_buf=qo_indptr_buf_arr[i],
                    paged_kv_indptr_buf=paged_kv_indptr_buf_arr[i],
                    paged_kv_indices_buf=paged_kv_indices_buf_arr[i],
                    paged_kv_last_page_len_buf=paged_kv_last_page_len_buf_arr[i])
                for i in range(num_levels)
            ]
        else:
            self._wrappers = [BatchPrefillWithPagedKVCacheWrapper(slices[i], kv_layout)
                              for i in range(num_levels)]

    @staticmethod
    def _split(float_workspace_buffer, num_levels: int):
        """``num_levels`` byte slices of the workspace, each starting 256-byte aligned."""
        torch = T.torch_module()
        ws = T.as_tensor(float_workspace_buffer, "float_workspace_buffer")
        T.check_cuda(ws, "float_workspace_buffer")
        if not ws.is_contiguous():
            raise ArgumentError("float_workspace_buffer: must be contiguous")
        raw = ws.reshape(-1).view(torch.uint8)
        skip = (-raw.data_ptr()) % _SLICE_ALIGN
        per = (raw.numel() - skip) // num_levels // _SLICE_ALIGN * _SLICE_ALIGN
        if per == 0:
            raise ArgumentError(f"float_workspace_buffer: {raw.numel()} bytes cannot be split "
                                f"into {num_levels} levels")
        return [raw[skip + i * per: skip + (i + 1) * per] for i in range(num_levels)]

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffers: Optional[List[torch.Tensor]] = None) -> None:
        r"""Use another workspace (split between the levels again) from the next :meth:`plan`
        on; ``int_workspace_buffers`` is accepted and unused. The current plan is dropped."""
        slices = self._split(float_workspace_buffer, self._num_levels)
        self._launch = None  # the levels' C objects are destroyed
        self._slices = slices
        for w, ws in zip(self._wrappers, slices):
            w.reset_workspace_buffer(ws)
        for w, ws in zip(self._decode_wrappers, slices):
            if w is not None:
                w.reset_workspace_buffer(ws)

    def plan(
        self,
        qo_indptr_arr: Sequence[torch.Tensor],
        paged_kv_indptr_arr: Sequence[torch.Tensor],
        paged_kv_indices_arr: Sequence[torch.Tensor],
        paged_kv_last_page_len: Sequence[torch.Tensor],
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
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
    ) -> None:
        r"""Plan every level for one step (shared by all layers).

        Parameters
        ----------
        qo_indptr_arr : list of torch.Tensor
            Per level, ``[groups_l + 1]`` int32: the query rows each group of the level covers
            (e.g. ``[0, batch_size]`` for a prefix shared by all, ``arange(batch_size + 1)`` for
            the requests' own tokens in decode). Each level's last entry is the total number of
            query rows.
        paged_kv_indptr_arr, paged_kv_indices_arr : list of torch.Tensor
            Per level, the page table of its groups (``[groups_l + 1]`` and the page indices).
        paged_kv_last_page_len : list of torch.Tensor
            Per level, ``[groups_l]`` int32 valid slots of each group's last page.
        num_qo_heads, num_kv_heads, head_dim, page_size : int
            As :meth:`cinfer.BatchPrefillWithPagedKVCacheWrapper.plan`.
        causal : bool
            Causal mask on the last level (the other levels are never masked).
        use_fp16_qk_reduction, sm_scale, logits_soft_cap, rope_scale, rope_theta,
        q_data_type, kv_data_type
            As :meth:`cinfer.BatchPrefillWithPagedKVCacheWrapper.plan`.
        pos_encoding_mode : str
            As :meth:`cinfer.BatchPrefillWithPagedKVCacheWrapper.plan`; ``"ALIBI"`` and
            ``"ROPE_LLAMA"`` only when ``num_levels == 1`` (:class:`cinfer.UnsupportedError`
            otherwise: positions are per level).
        window_left : int
            -1 only when ``num_levels > 1`` (:class:`cinfer.UnsupportedError` otherwise).

        Raises
        ------
        TypeError
            A number argument of another type (a float ``window_left``), and the batch prefill
            plan's TypeErrors.
        ValueError
            Lists whose length is not ``num_levels``, and the batch prefill plan's errors
            (the level is named).

        Notes
        -----
        The levels are planned in order. In CUDA-graph mode every level's capacity (groups,
        query rows, pages) is checked before any is planned, so a step too large for the
        buffers leaves every level on the previous step; an error a level's own plan finds
        (a malformed page table) comes after the levels before it were planned: :meth:`run`
        refuses until a plan succeeds, and a captured graph must not be replayed until then
        either (its levels would belong to two different steps).
        """
        arrs = {"qo_indptr_arr": qo_indptr_arr, "paged_kv_indptr_arr": paged_kv_indptr_arr,
                "paged_kv_indices_arr": paged_kv_indices_arr,
                "paged_kv_last_page_len": paged_kv_last_page_len}
        for name, arr in arrs.items():
            if len(arr) != self._num_levels:
                raise ArgumentError(f"{name}: {len(arr)} items, expected num_levels = "
                                    f"{self._num_levels}")
        mode = A.pos_encoding_mode(pos_encoding_mode)
        if self._num_levels > 1 and mode != "NONE":
            what = "bias" if mode == "ALIBI" else "rotation"
            raise UnsupportedError(
                f"pos_encoding_mode = {mode!r} with {self._num_levels} levels: the {what} of "
                "each level would use positions relative to that level's KV, not to the "
                "concatenated KV; pass 'NONE' (or use one level)"
            )
        if self._num_levels > 1 and A.window_left(window_left) != -1:
            raise UnsupportedError(
                f"window_left = {window_left} with {self._num_levels} levels: a window relative "
                "to each level's KV is not the window of the concatenated KV; pass -1"
            )
        # A failed plan leaves no runnable plan (as the batch prefill wrapper's).
        self._launch = None
        if self._use_cuda_graph and self._graph_kinds is not None:
            self._check_graph_levels(qo_indptr_arr, paged_kv_indptr_arr)
        kinds, planned = [], []
        # What every level's plan takes alike, whichever kind runs it.
        common = dict(pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
                      window_left=window_left, logits_soft_cap=logits_soft_cap,
                      rope_scale=rope_scale, rope_theta=rope_theta,
                      q_data_type=q_data_type, kv_data_type=kv_data_type)
        for i in range(self._num_levels):
            try:
                kind, qo_indptr = self._level_kind(i, qo_indptr_arr[i])
                kinds.append(kind)
                if kind == _DECODE:
                    # One query row per group: causal or not, it attends all of the group's KV
                    # (bottom-right alignment), as batch decode's query does.
                    w = self._decode_wrapper(i)
                    w.plan(paged_kv_indptr_arr[i], paged_kv_indices_arr[i],
                           paged_kv_last_page_len[i], num_qo_heads, num_kv_heads, head_dim,
                           page_size, **common)
                else:
                    w = self._wrappers[i]
                    w.plan(qo_indptr, paged_kv_indptr_arr[i], paged_kv_indices_arr[i],
                           paged_kv_last_page_len[i], num_qo_heads, num_kv_heads, head_dim,
                           page_size, causal=bool(causal) and i == self._num_levels - 1,
                           use_fp16_qk_reduction=use_fp16_qk_reduction, **common)
            except ArgumentError as e:
                raise type(e)(f"level {i}: {e}", e.status) from e
            planned.append(w)
        if self._use_cuda_graph and self._graph_kinds is None:
            self._graph_kinds = kinds
        p = planned[0]._plan
        key = (p.q_dtype, p.num_qo_heads, p.head_dim)
        if key != self._states_key:
            self._states = {}
        device = planned[0].device
        if (self._side_stream is None and self._use_cuda_graph and self._num_levels > 1
                and device.type == "cuda"):
            self._side_stream = T.torch_module().cuda.Stream(device)
        launch = _Launch(planned, kinds, self._use_cuda_graph, self._states,
                         self._captured_states, self._side_stream)
        if self._num_levels > 1 and key != self._states_key:
            launch.warm_merge()
        self._states_key = key
        self._launch = launch

    def _level_kind(self, level: int, qo_indptr):
        """How level ``level`` runs (_PREFILL or _DECODE), and the qo_indptr its batch prefill
        plans with: the host copy this function read (so a CUDA tensor is copied to the host
        once), or the argument itself when nothing was read. A single level runs batch prefill
        (the wrapper is then one batch prefill, variants and positions included). With more
        levels there is no RoPE, ALiBi or window (plan refuses them), so a level of one query
        row per group computes what batch decode computes. In CUDA graph mode the first plan
        fixes each level's kind (captured graphs replay its launches): a level fixed as batch
        prefill stays so (it computes any grouping), one fixed as batch decode must get one
        query row per group again. ArgumentError names ``qo_indptr``, as batch prefill's plan
        does."""
        if self._num_levels == 1:
            return _PREFILL, qo_indptr
        _, host = A.host_index(qo_indptr, "qo_indptr")
        torch = T.torch_module()
        groups = host.shape[0] - 1
        one_row_each = groups >= 0 and torch.equal(
            host, torch.arange(groups + 1, dtype=torch.int32))
        fixed = self._graph_kinds[level] if self._graph_kinds is not None else None
        if fixed == _DECODE and not one_row_each:
            shown = host.tolist()
            text = str(shown if len(shown) <= 8 else shown[:4] + ["..."] + shown[-2:])
            raise ArgumentError(
                f"qo_indptr: {text}, expected 0, 1, ..., n (one query row per group): in CUDA "
                "graph mode the level runs as batch decode, as the wrapper's first plan "
                "(captured graphs replay its launches); plan its groups one query row each, or "
                "use another wrapper"
            )
        if fixed is not None:
            return fixed, host
        return (_DECODE if groups >= 1 and one_row_each else _PREFILL), host

    def _check_graph_levels(self, qo_indptr_arr, paged_kv_indptr_arr) -> None:
        """CUDA graph mode after the first plan: every level's kind, batch, query rows and page
        count checked against its capacity before any level is planned, so a step too large
        for the captured buffers is refused while every level still holds the previous step
        (a captured graph replays all of them). The levels' own plans check the rest."""
        for i in range(self._num_levels):
            try:
                kind, qo = self._level_kind(i, qo_indptr_arr[i])
                _, qo_host = A.host_index(qo, "qo_indptr")  # one level: not yet checked
                _, kv_host = A.host_index(paged_kv_indptr_arr[i], "paged_kv_indptr")
                groups = kv_host.shape[0] - 1
                pages = int(kv_host[groups]) if groups >= 0 else 0
                if kind == _DECODE:
                    w, rows = self._decode_wrapper(i), None
                    indices_buf = w._paged_kv_indices_buf
                else:
                    w = self._wrappers[i]
                    rows = w._max_total_qo
                    indices_buf = w._paged_kv_indices_buf
                if groups > w._fixed_batch_size:
                    raise ArgumentError(
                        f"paged_kv_indptr: {groups} groups exceed the CUDA graph capacity "
                        f"{w._fixed_batch_size}")
                qo_end = int(qo_host[-1]) if qo_host.shape[0] > 0 else 0
                if rows is not None and qo_end > rows:
                    raise ArgumentError(
                        f"qo_indptr: qo_indptr[-1] = {qo_end} query rows exceed the {rows} of "
                        "the CUDA graph mode (the first plan's)")
                if indices_buf is not None and pages > indices_buf.shape[0]:
                    raise ArgumentError(
                        f"paged_kv_indices: paged_kv_indptr[-1] = {pages} entries do not fit the "
                        f"level's page-index buffer ({indices_buf.shape[0]} entries)")
            except ArgumentError as e:
                raise type(e)(f"level {i}: {e}", e.status) from e

    def _decode_wrapper(self, i: int) -> BatchDecodeWithPagedKVCacheWrapper:
        """Level ``i``'s batch decode wrapper, created on first use over the level's workspace
        slice (shared with its batch prefill wrapper: only the kind planned last runs, and each
        plan rewrites the schedule it reads); in CUDA graph mode over the level's page-table
        buffers (the level's batch capacity is ``len(paged_kv_last_page_len_buf_arr[i])``)."""
        w = self._decode_wrappers[i]
        if w is None:
            if self._use_cuda_graph:
                indptr, indices, last = (arr[i] for arr in self._graph_tables)
                w = BatchDecodeWithPagedKVCacheWrapper(
                    self._slices[i], self._kv_layout, use_cuda_graph=True,
                    paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
                    paged_kv_last_page_len_buffer=last)
            else:
                w = BatchDecodeWithPagedKVCacheWrapper(self._slices[i], self._kv_layout)
            self._decode_wrappers[i] = w
        return w

    begin_forward = plan

    def run(self, q: torch.Tensor,
            paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]], *,
            return_lse: bool = False):
        r"""Cascade attention of the planned step for one layer.

        Parameters
        ----------
        q : torch.Tensor
            ``[num_rows, num_qo_heads, head_dim]``, the planned dtype (``num_rows`` = each
            level's ``qo_indptr[-1]``).
        paged_kv_cache : tuple of two torch.Tensor, or torch.Tensor
            The paged cache every level's page table points into, as
            :meth:`cinfer.BatchPrefillWithPagedKVCacheWrapper.run` takes it.
        return_lse : bool
            cinfer extension (keyword-only): also return the merged LSE
            (``[num_rows, num_qo_heads]`` float32, base 2).

        Returns
        -------
        out : torch.Tensor
            q's shape and dtype; with ``return_lse``, ``(out, lse)``.

        Raises
        ------
        TypeError
            ``q`` or a cache is not a tensor.
        ValueError
            No plan yet; shapes or dtypes that contradict the plan, CPU tensors (the library's
            message names the argument); a CUDA-graph capture with ``q`` too short.
        cinfer.CinferError
            A CUDA launch failure.

        Notes
        -----
        One batch prefill or batch decode launch per level (two for a level planned with
        split-KV, and in CUDA graph mode for every batch prefill level whose plans may split)
        writing its partial state into buffers the wrapper keeps per CUDA stream, then one
        :func:`merge_states` launch into the output: no synchronization, no compilation, and
        no allocation but the returned tensors (and the state buffers, at the first run on a
        stream or with another number of rows), so it can be captured in a CUDA graph
        (``use_cuda_graph=True``). Runs on one stream share the state buffers (stream order
        keeps them apart); runs on different streams get their own.
        """
        launch = self._launch
        if launch is None:
            raise ArgumentError("run() before plan(): call plan() first (again after a failed "
                                "plan or reset_workspace_buffer)")
        return launch.run(q, paged_kv_cache, bool(return_lse))

    forward = run
