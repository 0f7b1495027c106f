"""The batch prefill, batch decode, cascade and MLA wrappers' Python logic against a stand-in
library, on the CPU: when C objects are created, reused, grown and evicted, CUDA-graph mode
rules, argument checks made before the library, what plan and run pass (the custom-mask layout
read back the way the "custom_mask" variant reads it, ALiBi's arguments, in-kernel RoPE's
options). The attention itself is checked by the GPU suites (test_batch_prefill.py,
test_batch_decode.py, test_cascade.py)."""

import ctypes
import gc
import math
import struct

import pytest

torch = pytest.importorskip("torch")

import cinfer  # noqa: E402
from cinfer import _lib, _tensor, errors  # noqa: E402


_TORCH_OF = {(_lib.KDL_UINT, 8): torch.uint8, (_lib.KDL_INT, 32): torch.int32,
             (_lib.KDL_INT, 64): torch.int64, (_lib.KDL_BOOL, 8): torch.bool}


def _read(dl):
    """A copy of the CPU tensor a DLTensor describes (contiguous)."""
    n = math.prod(dl.shape[i] for i in range(dl.ndim))
    dtype = _TORCH_OF[(dl.dtype.code, dl.dtype.bits)]
    nbytes = n * torch.empty(0, dtype=dtype).element_size()
    raw = bytearray(ctypes.string_at(dl.data, nbytes)) if n else bytearray()
    return torch.frombuffer(raw, dtype=dtype) if n else torch.empty(0, dtype=dtype)


def _strides(dl):
    return [dl.strides[i] for i in range(dl.ndim)]


def _decode_args(args):
    """A run's variant arguments: tensors read back (None for NULL), scalars as int32."""
    if not args:
        return []
    a = args._obj
    out = []
    for i in range(a.num_args):
        arg = a.args[i]
        if arg.kind == _lib.PARAM_TENSOR:
            out.append(_read(arg.tensor.contents) if arg.tensor else None)
        else:
            out.append(arg.value.i32)
    return out


class StandIn:
    """Records the batch prefill and batch decode calls; batch prefill's workspace sizes are
    4096 + max_total_qo_tokens bytes, batch decode's 4096. segment_packbits is computed on the
    host; the variant functions are the real library's."""

    def __init__(self, real):
        self.real = real
        self.run_args = []  # the decoded variant arguments of each run
        self.run_ptrs = []  # and the data pointers of its tensor arguments
        self.run_views = []  # (q data, out data, out strides, lse data, lse strides) of each run
        self.calls = []
        self.decode_graph = []  # use_cuda_graph of each batch decode create
        self.decode_rows = []  # rows of q, out and lse (None) of each batch decode run
        self.prefill_dims = []  # (head_dim, head_dim_vo) of each batch prefill create
        self.out_shapes = []  # out's shape at each batch prefill run
        self.live = set()
        self.next_handle = 1000
        self.size_extra = 0

    def cinfer_batch_prefill_workspace_size(self, ctx, opts, storage, causal, max_qo, out):
        out._obj.value = 4096 + max_qo + self.size_extra
        return 0

    def cinfer_batch_prefill_create(self, ctx, opts, storage, causal, max_qo, ws, nbytes, out):
        o = opts._obj
        self.next_handle += 1
        self.calls.append(("create", self.next_handle, storage, causal, max_qo,
                           o.max_batch_size, o.use_cuda_graph, o.sm_scale, o.variant,
                           o.pos_encoding_mode, o.rope_scale, o.rope_theta))
        self.prefill_dims.append((o.head_dim, o.head_dim_vo))
        self.live.add(self.next_handle)
        out._obj.value = self.next_handle
        return 0

    def cinfer_batch_prefill_plan(self, op, qo, kv, last, batch, stream):
        self.calls.append(("plan", op.value if hasattr(op, "value") else op, batch,
                           [qo[i] for i in range(batch + 1)], bool(last)))
        return 0

    def cinfer_batch_prefill_run(self, op, q, k, v, idx, out, lse, args, stream):
        self.calls.append(("run", op.value if hasattr(op, "value") else op, bool(v), bool(idx),
                           bool(lse), args._obj.num_args if args else 0))
        self.run_args.append(_decode_args(args))
        self.run_ptrs.append([a.tensor.contents.data if a.tensor else None
                              for a in (args._obj.args[i] for i in range(args._obj.num_args))
                              if a.kind == _lib.PARAM_TENSOR] if args else [])
        self.run_views.append((q._obj.data, out._obj.data, _strides(out._obj),
                               lse._obj.data if lse else None,
                               _strides(lse._obj) if lse else None))
        self.out_shapes.append(tuple(out._obj.shape[i] for i in range(out._obj.ndim)))
        return 0

    def cinfer_batch_decode_workspace_size(self, ctx, opts, out):
        out._obj.value = 4096 + self.size_extra
        return 0

    def cinfer_batch_decode_create(self, ctx, opts, ws, nbytes, out):
        o = opts._obj
        self.next_handle += 1
        self.calls.append(("decode_create", self.next_handle, o.max_batch_size,
                           o.use_tensor_cores, o.pos_encoding_mode, o.rope_scale, o.rope_theta))
        self.decode_graph.append(o.use_cuda_graph)
        self.live.add(self.next_handle)
        out._obj.value = self.next_handle
        return 0

    def cinfer_batch_decode_plan(self, op, indptr, last, batch, stream):
        self.calls.append(("decode_plan", op.value, batch))
        return 0

    def cinfer_batch_decode_run(self, op, q, k, v, indptr, indices, last, out, lse, args,
                                stream):
        self.calls.append(("decode_run", op.value, q._obj.data, out._obj.data, bool(v),
                           lse._obj.data if lse else None))
        self.decode_rows.append((q._obj.shape[0], out._obj.shape[0],
                                 lse._obj.shape[0] if lse else None))
        return 0

    def cinfer_batch_decode_destroy(self, op):
        self.live.discard(op.value)
        self.calls.append(("decode_destroy", op.value))

    def cinfer_batch_mla_workspace_size(self, ctx, opts, causal, max_qo, out):
        out._obj.value = 4096
        return 0

    def cinfer_batch_mla_create(self, ctx, opts, causal, max_qo, ws, nbytes, out):
        self.next_handle += 1
        self.calls.append(("mla_create", self.next_handle, opts._obj.max_batch_size, max_qo,
                           opts._obj.use_cuda_graph))
        self.live.add(self.next_handle)
        out._obj.value = self.next_handle
        return 0

    def cinfer_batch_mla_plan(self, op, qo, kv, last, batch, stream):
        self.calls.append(("mla_plan", op.value, batch, [qo[i] for i in range(batch + 1)]))
        return 0

    def cinfer_batch_mla_run(self, op, q_nope, q_pe, ckv, kpe, indices, out, lse, stream):
        self.calls.append(("mla_run", op.value, q_nope._obj.shape[0], bool(lse)))
        if lse:  # a base-2 LSE of 1.0 everywhere, to see the wrapper's conversion
            n = lse._obj.shape[0] * lse._obj.shape[1]
            ctypes.memmove(lse._obj.data, struct.pack(f"<{n}f", *([1.0] * n)), 4 * n)
        return 0

    def cinfer_batch_mla_destroy(self, op):
        self.live.discard(op.value)
        self.calls.append(("mla_destroy", op.value))

    def cinfer_segment_packbits(self, ctx, x, indptr, order, y, new_indptr, stream):
        assert order == 0  # little
        bits, ind = _read(x._obj), _read(indptr._obj).tolist()
        out, new = [], [0]
        for s, e in zip(ind[:-1], ind[1:]):
            seg = bits[s:e].tolist()
            seg += [False] * (-len(seg) % 8)
            out += [sum(int(b) << k for k, b in enumerate(seg[i:i + 8]))
                    for i in range(0, len(seg), 8)]
            new.append(len(out))
        ctypes.memmove(y._obj.data, bytes(out), len(out))
        ctypes.memmove(new_indptr._obj.data, struct.pack(f"<{len(new)}i", *new), 4 * len(new))
        return 0

    def __getattr__(self, name):
        if name.startswith("cinfer_variant_"):
            return getattr(self.real, name)
        raise AttributeError(name)

    def cinfer_batch_prefill_destroy(self, op):
        h = op.value if hasattr(op, "value") else op
        self.live.discard(h)
        self.calls.append(("destroy", h))

    def cinfer_merge_state_in_place(self, *a):
        self.calls.append(("merge",))
        return 0

    def cinfer_merge_states(self, ctx, v, lse, v_out, lse_out, stream):
        self.calls.append(("merge_states", v._obj.data, list(v._obj.shape[:4]), lse._obj.data,
                           v_out._obj.data, lse_out._obj.data if lse_out else None))
        return 0

    def cinfer_last_error(self):
        return b""

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]


@pytest.fixture
def fake(monkeypatch):
    f = StandIn(_lib.lib())
    monkeypatch.setattr(_lib, "lib", lambda: f)
    monkeypatch.setattr(_tensor, "check_cuda", lambda *a, **k: None)
    monkeypatch.setattr(_tensor, "stream_of", lambda device: 0)
    monkeypatch.setattr(_tensor, "context_of", lambda device: ctypes.c_void_p(1))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return f


def _i32(x):
    return torch.tensor(x, dtype=torch.int32)


def _paged_args(qo, kv_pages, last):
    n = sum(kv_pages)
    return (_i32(qo), _i32([0] + list(torch.tensor(kv_pages).cumsum(0).tolist())),
            torch.arange(n, dtype=torch.int32), _i32(last))


WS = 1 << 20


def test_paged_objects_created_lazily_grown_and_cached(fake):
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    assert fake.calls == []  # nothing before plan
    args = _paged_args([0, 3, 10], [1, 2], [5, 16])
    w.plan(*args, 8, 2, 128, 16, causal=True)
    (create,) = fake.of("create")
    assert create[2:7] == (_lib.KV_STORAGE_PAGED, 1, 1024, 16, 0)  # rounded capacities
    assert fake.of("plan")[-1][2:] == (2, [0, 3, 10], True)
    q = torch.zeros(10, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    out, lse = w.run(q, cache, return_lse=True)
    assert out.shape == q.shape and lse.shape == (10, 8) and lse.dtype == torch.float32
    assert fake.of("run")[-1][2:] == (False, True, True, 0)  # combined cache, indices, lse
    w.run(q, (cache[:, 0], cache[:, 1]))
    assert fake.of("run")[-1][2:] == (True, True, False, 0)

    # Same options and room: reused. More rows than the capacity: re-created larger.
    w.plan(*args, 8, 2, 128, 16, causal=True)
    assert len(fake.of("create")) == 1
    big = _paged_args([0, 3000], [1], [1])
    w.plan(*big, 8, 2, 128, 16, causal=True)
    creates = fake.of("create")
    assert len(creates) == 2 and creates[-1][4] == 4096 and fake.of("destroy")[-1][1] == create[1]
    # Another causal value: a second object, kept; switching back reuses the first.
    w.plan(*args, 8, 2, 128, 16, causal=False)
    assert len(fake.of("create")) == 3 and fake.of("create")[-1][3] == 0
    w.plan(*args, 8, 2, 128, 16, causal=True)
    assert len(fake.of("create")) == 3
    # At most _MAX_OPS objects: the least recently used is destroyed.
    for i in range(5):
        w.plan(*args, 8, 2, 128, 16, sm_scale=0.1 * (i + 1))
    assert len(fake.live) == w._MAX_OPS
    del w
    assert not fake.live


def test_late_collection_destroys_with_the_creating_library(fake, monkeypatch):
    # A wrapper that outlives the stand-in (a failed test's traceback keeps it until a later
    # collection) hands its objects back to the library that made them, not to the real one.
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    w.plan(*_paged_args([0, 3, 10], [1, 2], [5, 16]), 8, 2, 128, 16, causal=True)
    d = cinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    d.plan(_i32([0, 1, 3]), torch.arange(3, dtype=torch.int32), _i32([5, 16]), 8, 2, 128, 16)
    (create,) = fake.of("create")
    (decode_create,) = fake.of("decode_create")
    monkeypatch.setattr(_lib, "lib", lambda: None)  # any other library: never called
    del w, d
    gc.collect()
    assert fake.of("destroy")[-1][1] == create[1]
    assert fake.of("decode_destroy")[-1][1] == decode_create[1]


def test_head_dim_vo_reaches_the_options_and_sizes_out(fake):
    # D_qk != D_vo is a create-time option (head_dim_vo, 0 when equal) and out defaults to
    # [rows, Hq, D_vo]; the library checks the rest (tests/gpu/test_batch_prefill.c).
    w = cinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    qo, kv = _i32([0, 3, 10]), _i32([0, 5, 20])
    q = torch.zeros(10, 8, 192, dtype=torch.float16)
    k = torch.zeros(20, 2, 192, dtype=torch.float16)
    v = torch.zeros(20, 2, 128, dtype=torch.float16)
    w.plan(qo, kv, 8, 2, 192, head_dim_vo=128, causal=True)
    assert fake.prefill_dims == [(192, 128)]
    w.run(q, k, v)
    assert fake.out_shapes[-1] == (10, 8, 128)
    # The same dims planned again reuse the object; head_dim_vo = head_dim_qk is one head dim.
    w.plan(qo, kv, 8, 2, 192, head_dim_vo=128, causal=True)
    w.plan(qo, kv, 8, 2, 192, head_dim_vo=192, causal=True)
    w.plan(qo, kv, 8, 2, 192, causal=True)
    assert fake.prefill_dims == [(192, 128), (192, 0)]
    w.run(q, k, k)
    assert fake.out_shapes[-1] == (10, 8, 192)


def test_paged_plan_and_run_errors(fake):
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    args = _paged_args([0, 3, 10], [1, 2], [5, 16])
    q = torch.zeros(10, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="plan"):
        w.run(q, cache)
    for kw, cls, match in [
        (dict(pos_encoding_mode="ROPE"), ValueError, "pos_encoding_mode"),
        (dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=0.0), ValueError, "rope_scale"),
        (dict(use_fp16_qk_reduction=True), cinfer.UnsupportedError, "fp16_qk"),
        (dict(kv_data_type="int8"), cinfer.UnsupportedError, "kv_data_type"),
        (dict(q_data_type="float32"), cinfer.UnsupportedError, "q_data_type"),
        (dict(o_data_type="bfloat16"), cinfer.UnsupportedError, "o_data_type"),
        (dict(prefix_len_ptr=_i32([0])), cinfer.UnsupportedError, "prefix_len_ptr"),
        (dict(window_left=-2), ValueError, "window_left"),
        (dict(sm_scale=-1.0), ValueError, "sm_scale"),
        (dict(variant=3), TypeError, "variant"),
    ]:
        with pytest.raises(cls, match=match):
            w.plan(*args, 8, 2, 128, 16, **kw)
    qo, kv, idx, last = args
    with pytest.raises(ValueError, match="int32"):
        w.plan(qo.long(), kv, idx, last, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="paged_kv_last_page_len"):
        w.plan(qo, kv, idx, last[:1], 8, 2, 128, 16)
    with pytest.raises(ValueError, match="paged_kv_indptr"):
        w.plan(qo, kv[:2], idx, last, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="paged_kv_indices"):
        w.plan(qo, kv, idx[:1], last, 8, 2, 128, 16)
    assert fake.of("create") == []  # every check above happens before the library

    w.plan(*args, 8, 2, 128, 16)
    with pytest.raises(TypeError, match="both"):
        w.run(q, cache, 1.0, variant_args=(1.0,))
    with pytest.raises(cinfer.UnsupportedError, match="q_scale"):
        w.run(q, cache, q_scale=2.0)
    with pytest.raises(ValueError, match="k_scale"):
        w.run(q, cache, k_scale=2.0)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(q, cache[:, 0])
    # forward() repeats the options; they must be the planned ones.
    w.forward(q, cache, causal=False)
    with pytest.raises(ValueError, match="causal"):
        w.forward(q, cache, causal=True)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        w.forward_return_lse(q, cache, logits_soft_cap=3.0)

    fake.size_extra = 10 * WS
    w2 = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    with pytest.raises(ValueError, match="float_workspace_buffer.*bytes") as info:
        w2.plan(*args, 8, 2, 128, 16)
    assert info.value.status == errors.WORKSPACE_TOO_SMALL
    for kw, cls in [(dict(jit_args=["x"]), cinfer.UnsupportedError),
                    (dict(backend="cudnn"), ValueError), (dict(use_cuda_graph=True), ValueError)]:
        with pytest.raises(cls):
            cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8), **kw)


def test_graph_mode_rules(fake, monkeypatch):
    cap = 4
    bufs = dict(qo_indptr_buf=torch.zeros(cap + 1, dtype=torch.int32),
                paged_kv_indptr_buf=torch.zeros(cap + 1, dtype=torch.int32),
                paged_kv_indices_buf=torch.zeros(64, dtype=torch.int32),
                paged_kv_last_page_len_buf=torch.zeros(cap, dtype=torch.int32))
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8), "NHD",
                                                   True, **bufs)
    assert w.is_cuda_graph_enabled
    args = _paged_args([0, 30, 100], [2, 3], [5, 16])
    w.plan(*args, 8, 2, 128, 16, causal=True)
    (create,) = fake.of("create")
    assert create[4:7] == (100, cap, 1)  # the first plan's rows, the buffers' capacity
    assert bufs["qo_indptr_buf"][:3].tolist() == [0, 30, 100]
    assert bufs["paged_kv_indices_buf"][:5].tolist() == list(range(5))
    w.plan(*_paged_args([0, 50], [1], [1]), 8, 2, 128, 16, causal=True)  # smaller: same object
    assert len(fake.of("create")) == 1
    with pytest.raises(ValueError, match="100"):
        w.plan(*_paged_args([0, 101], [1], [1]), 8, 2, 128, 16, causal=True)
    # q and out rows are absolute: 50 rows from row 60 end past the 100 of the capacity.
    with pytest.raises(ValueError, match=r"qo_indptr\[-1\] = 110"):
        w.plan(*_paged_args([60, 110], [1], [1]), 8, 2, 128, 16, causal=True)
    with pytest.raises(ValueError, match="capacity"):
        w.plan(*_paged_args([0] * 6, [1] * 5, [1] * 5), 8, 2, 128, 16, causal=True)
    with pytest.raises(ValueError, match="first plan"):
        w.plan(*args, 8, 2, 128, 16, causal=False)
    with pytest.raises(ValueError, match="paged_kv_indices_buf"):
        w.plan(*_paged_args([0, 1], [65], [1]), 8, 2, 128, 16, causal=True)
    w.plan(*args, 8, 2, 128, 16, causal=True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    cache = torch.zeros(70, 2, 16, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="capturing"):
        w.run(torch.zeros(99, 8, 128, dtype=torch.float16), cache)
    w.run(torch.zeros(100, 8, 128, dtype=torch.float16), cache)

    # Ragged graph mode: an explicit max_total_qo_tokens.
    r = cinfer.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(WS, dtype=torch.uint8), "NHD", True, torch.zeros(3, dtype=torch.int32),
        torch.zeros(3, dtype=torch.int32), max_total_qo_tokens=500)
    r.plan(_i32([0, 5, 7]), _i32([0, 9, 20]), 8, 2, 128, causal=True)
    assert fake.of("create")[-1][2:7] == (_lib.KV_STORAGE_RAGGED, 1, 500, 2, 1)
    assert fake.of("plan")[-1][-1] is False  # no last_page_len for a ragged KV
    # A refused capture (q below the capacity) limits nothing.
    small = torch.zeros(3, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="capturing"):
        r.run(torch.zeros(499, 8, 128, dtype=torch.float16), small, small)
    r.plan(_i32([0, 5, 7]), _i32([0, 9, 20]), 8, 2, 128, causal=True)
    # A run captured with k and v of 30 rows: later plans may not address more.
    kv = torch.zeros(30, 2, 128, dtype=torch.float16)
    r.run(torch.zeros(500, 8, 128, dtype=torch.float16), kv, kv)  # capturing (patched above)
    plans = len(fake.of("plan"))
    with pytest.raises(ValueError, match="exceed the 30 rows of the k and v"):
        r.plan(_i32([0, 5, 7]), _i32([0, 9, 31]), 8, 2, 128, causal=True)
    assert len(fake.of("plan")) == plans
    r.plan(_i32([0, 5, 7]), _i32([0, 9, 30]), 8, 2, 128, causal=True)


def test_ragged_run_passes_no_indices(fake):
    w = cinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8), "HND")
    w.plan(_i32([0, 5, 7]), _i32([0, 9, 20]), 8, 2, 128, causal=True, q_data_type="bfloat16")
    q = torch.zeros(7, 8, 128, dtype=torch.bfloat16)
    kv = torch.zeros(2, 20, 128, dtype=torch.bfloat16)
    w.run(q, kv, kv, variant_args=None)
    assert fake.of("run")[-1][2:] == (True, False, False, 0)
    w.run_return_lse(q, kv, kv)
    assert fake.of("run")[-1][4] is True
    # An empty batch needs no launch outside graph mode.
    w.plan(_i32([0]), _i32([0]), 8, 2, 128, q_data_type="bfloat16")
    n = len(fake.of("run"))
    out = w.run(q[:0], kv, kv)
    assert out.shape == (0, 8, 128) and len(fake.of("run")) == n


def _three_levels():
    """A three-level cascade's page tables (qo_indptr, kv_indptr, kv_indices, last_page_len per
    level): 4 rows sharing 8 pages, then two pairs, then one request each."""
    qo = [_i32([0, 4]), _i32([0, 2, 4]), _i32([0, 1, 2, 3, 4])]
    kv = [_i32([0, 8]), _i32([0, 1, 2]), _i32([0, 1, 1, 2, 3])]
    idx = [torch.arange(8, dtype=torch.int32), _i32([8, 9]), _i32([10, 11, 12])]
    last = [_i32([16]), _i32([3, 4]), _i32([1, 1, 2, 2])]
    return qo, kv, idx, last


def test_cascade_levels(fake):
    ws = torch.empty(3 * WS + 100, dtype=torch.uint8)
    c = cinfer.MultiLevelCascadeAttentionWrapper(3, ws)
    ptrs = [w._float_workspace_buffer.data_ptr() for w in c._wrappers]
    sizes = [w._float_workspace_buffer.numel() for w in c._wrappers]
    assert len(set(sizes)) == 1 and all(p % 256 == 0 for p in ptrs)
    assert all(ptrs[i] + sizes[i] <= ptrs[i + 1] for i in range(2))
    qo, kv, idx, last = _three_levels()
    c.plan(qo, kv, idx, last, 8, 2, 128, 16, causal=True)
    # Levels 0 and 1 are batch prefill (only the last level is causal); level 2, one query row
    # per group, is a decode step: batch decode.
    creates = fake.of("create")
    assert [x[3] for x in creates] == [0, 0]
    assert [x[3] for x in fake.of("plan")] == [[0, 4], [0, 2, 4]]
    assert len(fake.of("decode_create")) == 1 and fake.of("decode_plan")[-1][2] == 4
    assert len(fake.of("merge_states")) == 1  # plan loads the merge kernel (a one-row merge)
    q = torch.zeros(4, 8, 128, dtype=torch.float16)
    cache = torch.zeros(13, 2, 16, 2, 128, dtype=torch.float16)
    out, lse = c.run(q, cache, return_lse=True)
    assert len(fake.of("run")) == 2 and len(fake.of("decode_run")) == 1
    assert len(fake.of("merge")) == 0
    # Each level writes its slice of one [rows, levels, H, D] / [rows, levels, H] state pair,
    # and one merge_states folds the levels into the returned out and lse.
    _, v_ptr, v_shape, s_ptr, out_ptr, lse_ptr = fake.of("merge_states")[-1]
    assert v_shape == [4, 3, 8, 128] and (out_ptr, lse_ptr) == (out.data_ptr(), lse.data_ptr())
    for i, (q_ptr, o_ptr, o_strides, l_ptr, l_strides) in enumerate(fake.run_views):
        assert q_ptr == q.data_ptr()
        assert (o_ptr, o_strides) == (v_ptr + i * 8 * 128 * 2, [3 * 8 * 128, 128, 1])
        assert (l_ptr, l_strides) == (s_ptr + i * 8 * 4, [3 * 8, 1])
    _, _, dq_ptr, do_ptr, _, dl_ptr = fake.of("decode_run")[-1]
    assert (dq_ptr, do_ptr, dl_ptr) == (q.data_ptr(), v_ptr + 2 * 8 * 128 * 2, s_ptr + 2 * 8 * 4)
    # Another q and output: the same structs point at them; the states are reused.
    q2 = torch.zeros(4, 8, 128, dtype=torch.float16)
    out2 = c.run(q2, cache)
    assert [v[0] for v in fake.run_views[2:]] == [q2.data_ptr()] * 2
    assert [v[1] for v in fake.run_views[2:]] == [v[1] for v in fake.run_views[:2]]
    assert fake.of("decode_run")[-1][2:4] == (q2.data_ptr(), do_ptr)
    assert fake.of("merge_states")[-1][1:] == (v_ptr, v_shape, s_ptr, out2.data_ptr(), None)
    # A strided q is passed with its strides; more rows get new states.
    wide = torch.zeros(5, 16, 128, dtype=torch.float16)
    c.run(wide[:, 8:], cache)
    assert fake.run_views[-1][0] == wide[:, 8:].data_ptr()
    assert fake.of("decode_run")[-1][2] == wide[:, 8:].data_ptr()
    assert fake.of("merge_states")[-1][2] == [5, 3, 8, 128]
    # A plan whose last level has a group of two rows runs it as batch prefill again (the
    # workspace slice is shared: each plan rewrites what its kind reads).
    c.plan(qo[:2] + [_i32([0, 1, 2, 4, 4])], kv, idx, last, 8, 2, 128, 16, causal=True)
    n_decode, n_prefill = len(fake.of("decode_run")), len(fake.of("run"))
    c.run(q, cache)
    assert len(fake.of("decode_run")) == n_decode and len(fake.of("run")) == n_prefill + 3
    assert fake.of("plan")[-1][3] == [0, 1, 2, 4, 4] and fake.of("create")[-1][3] == 1
    with pytest.raises(TypeError, match="q"):
        c.run("q", cache)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        c.run(q, (cache,))
    with pytest.raises(ValueError, match="num_levels"):
        c.plan(qo[:2], kv, idx, last, 8, 2, 128, 16)
    with pytest.raises(cinfer.UnsupportedError, match="window_left"):
        c.plan(qo, kv, idx, last, 8, 2, 128, 16, window_left=10)
    with pytest.raises(ValueError, match="level 1"):
        c.plan(qo, [kv[0], kv[1][:2], kv[2]], idx, last, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="level 0: qo_indptr"):
        c.plan([qo[0].long()] + qo[1:], kv, idx, last, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="num_levels"):
        cinfer.MultiLevelCascadeAttentionWrapper(0, ws)
    with pytest.raises(ValueError, match="qo_indptr_buf_arr"):
        cinfer.MultiLevelCascadeAttentionWrapper(2, ws, use_cuda_graph=True)


def _graph_cascade(capacity):
    """A three-level graph-mode cascade whose last level's buffers hold ``capacity`` groups,
    and the buffers (per level: qo_indptr, kv_indptr, kv_indices, last_page_len)."""
    caps = [1, 4, capacity]
    bufs = [[torch.zeros(c + 1, dtype=torch.int32) for c in caps],
            [torch.zeros(c + 1, dtype=torch.int32) for c in caps],
            [torch.zeros(16, dtype=torch.int32) for _ in caps],
            [torch.zeros(c, dtype=torch.int32) for c in caps]]
    c = cinfer.MultiLevelCascadeAttentionWrapper(
        3, torch.empty(3 * WS, dtype=torch.uint8), use_cuda_graph=True,
        qo_indptr_buf_arr=bufs[0], paged_kv_indptr_buf_arr=bufs[1],
        paged_kv_indices_buf_arr=bufs[2], paged_kv_last_page_len_buf_arr=bufs[3])
    return c, bufs


def test_cascade_graph_mode_decode_levels(fake, monkeypatch):
    c, bufs = _graph_cascade(6)
    qo, kv, idx, last = _three_levels()
    c.plan(qo, kv, idx, last, 8, 2, 128, 16, causal=True)
    # The first plan fixes the kinds: levels 0 and 1 batch prefill, level 2 (one row per
    # group) batch decode, a graph-mode object over level 2's buffers (capacity 6).
    assert c._graph_kinds == ["prefill", "prefill", "decode"]
    assert [x[2] for x in fake.of("decode_create")] == [6] and fake.decode_graph == [1]
    assert fake.of("decode_plan")[-1][2] == 4
    assert bufs[1][2][:5].tolist() == [0, 1, 1, 2, 3]
    assert bufs[2][2][:3].tolist() == [10, 11, 12]
    assert bufs[3][2][:4].tolist() == [1, 1, 2, 2]
    cache = torch.zeros(13, 2, 16, 2, 128, dtype=torch.float16)
    # A capture needs q of the most rows a later plan may have: 6, the decode level's capacity.
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="capturing run.. with 4 rows, below the 6"):
        c.run(torch.zeros(4, 8, 128, dtype=torch.float16), cache)
    q = torch.zeros(6, 8, 128, dtype=torch.float16)
    out, lse = c.run(q, cache, return_lse=True)
    # Batch decode gets exactly its 4 rows of q and of its state slice, at the run's addresses.
    _, _, dq_ptr, do_ptr, _, dl_ptr = fake.of("decode_run")[-1]
    _, v_ptr, v_shape, s_ptr, _, _ = fake.of("merge_states")[-1]
    assert v_shape == [6, 3, 8, 128]
    assert (dq_ptr, do_ptr, dl_ptr) == (q.data_ptr(), v_ptr + 2 * 8 * 128 * 2, s_ptr + 2 * 8 * 4)
    assert fake.decode_rows[-1] == (4, 4, 4)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    # A later plan with 3 requests: the same decode object (capacity), 3 rows.
    qo3 = [_i32([0, 3]), _i32([0, 2, 3]), _i32([0, 1, 2, 3])]
    kv3 = [kv[0], kv[1], _i32([0, 1, 1, 2])]
    c.plan(qo3, kv3, idx, [last[0], last[1], _i32([1, 1, 2])], 8, 2, 128, 16, causal=True)
    assert len(fake.of("decode_create")) == 1 and fake.of("decode_plan")[-1][2] == 3
    c.run(q, cache)
    assert fake.decode_rows[-1] == (3, 3, 3)
    assert fake.of("decode_run")[-1][2:4] == (q.data_ptr(), do_ptr)
    # q of exactly the decode batch's rows: passed whole.
    c.run(q[:3], cache)
    assert fake.decode_rows[-1] == (3, 3, 3) and fake.of("decode_run")[-1][2] == q.data_ptr()
    n_decode = len(fake.of("decode_plan"))
    # The decode level cannot get a group of several rows any more: a clear error, and no
    # level planned (every level is checked first, so all keep the previous step).
    n_plans = len(fake.of("plan"))
    with pytest.raises(ValueError, match=r"level 2: qo_indptr: \[0, 1, 3\].*batch decode"):
        c.plan(qo3[:2] + [_i32([0, 1, 3])], kv3[:2] + [_i32([0, 1, 2])], idx,
               [last[0], last[1], _i32([1, 1])], 8, 2, 128, 16, causal=True)
    assert len(fake.of("plan")) == n_plans
    # Nor more groups than the decode level's capacity (6), or pages than a level's buffer.
    seven = [_i32(list(range(8))), _i32([0] + [1] * 7), _i32([1] * 7)]
    with pytest.raises(ValueError, match="level 2: paged_kv_indptr: 7 groups exceed"):
        c.plan(qo3[:2] + [seven[0]], kv3[:2] + [seven[1]], idx,
               [last[0], last[1], seven[2]], 8, 2, 128, 16, causal=True)
    with pytest.raises(ValueError, match="level 0: paged_kv_indices: paged_kv_indptr.-1. = 17"):
        c.plan(qo3, [_i32([0, 17])] + kv3[1:], idx, [last[0], last[1], _i32([1, 1, 2])], 8, 2,
               128, 16, causal=True)
    assert len(fake.of("plan")) == n_plans and len(fake.of("decode_plan")) == n_decode
    with pytest.raises(ValueError, match="before plan"):
        c.run(q, cache)
    # Levels fixed as batch prefill stay so, even with one row per group.
    qo_d = [_i32([0, 4]), _i32([0, 1, 2, 3, 4]), qo[2]]
    c.plan(qo_d, [kv[0], _i32([0, 1, 1, 2, 2]), kv[2]], idx,
           [last[0], _i32([3, 4, 4, 4]), last[2]], 8, 2, 128, 16, causal=True)
    assert fake.of("plan")[-1][3] == [0, 1, 2, 3, 4]
    assert len(fake.of("decode_create")) == 1
    # A level's kind is the first plan's: a wrapper first planned with level 2 in groups of two
    # keeps batch prefill there.
    c2, _ = _graph_cascade(6)
    c2.plan(qo[:2] + [_i32([0, 1, 2, 4])], kv[:2] + [_i32([0, 1, 1, 2])], idx,
            [last[0], last[1], _i32([1, 1, 2])], 8, 2, 128, 16, causal=True)
    c2.plan(qo, kv, idx, last, 8, 2, 128, 16, causal=True)
    assert c2._graph_kinds == ["prefill"] * 3 and len(fake.of("decode_create")) == 1


# ---- custom masks and ALiBi: the built-in variants' arguments ----

def _masks(qo_lens, kv_lens, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(a, b, generator=g) < 0.5 for a, b in zip(qo_lens, kv_lens)]


def _pack_little(m):
    """numpy.packbits(m.flatten(), bitorder="little") of one request's mask, on the host."""
    bits = m.flatten().tolist()
    bits += [False] * (-len(bits) % 8)
    return [sum(int(b) << k for k, b in enumerate(bits[i:i + 8]))
            for i in range(0, len(bits), 8)]


def _check_mask_args(args, masks):
    """What the "custom_mask" variant reads (bit row_offset[b] + p * row_stride[b] + j of the
    packed mask, p = i + kv_len - qo_len) is each request's mask."""
    packed, row_offset, row_stride = args
    assert packed.dtype == torch.uint8 and row_offset.dtype == torch.int64
    assert row_stride.dtype == torch.int32
    for b, m in enumerate(masks):
        qo, kv = m.shape
        for i in range(qo):
            for j in range(kv):
                bit = int(row_offset[b]) + (i + kv - qo) * int(row_stride[b]) + j
                assert (int(packed[bit >> 3]) >> (bit & 7)) & 1 == int(m[i, j]), (b, i, j)


def _paged_lens(qo_lens, kv_lens, page):
    pages = [math.ceil(n / page) for n in kv_lens]
    last = [n - (p - 1) * page if p else 1 for n, p in zip(kv_lens, pages)]
    qo = [0]
    for n in qo_lens:
        qo.append(qo[-1] + n)
    return _paged_args(qo, pages, last)


def test_custom_mask_layout(fake):
    page = 4
    qo_lens, kv_lens = [3, 2, 5, 7, 1], [10, 0, 4, 3, 9]  # kv_len 0, qo_len > kv_len
    args = _paged_lens(qo_lens, kv_lens, page)
    masks = _masks(qo_lens, kv_lens, seed=1)
    flat = torch.cat([m.flatten() for m in masks])
    own = torch.tensor(sum((_pack_little(m) for m in masks), []), dtype=torch.uint8)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    q = torch.zeros(18, 8, 128, dtype=torch.float16)
    cache = torch.zeros(8, 2, page, 2, 128, dtype=torch.float16)
    w.plan(*args, 8, 2, 128, page, custom_mask=flat, causal=True)
    create = fake.of("create")[-1]
    assert create[3] == 0  # the custom mask replaces the causal one
    assert create[8] == cinfer.variant_builtin("custom_mask").handle
    w.run(q, cache)
    _check_mask_args(fake.run_args[-1], masks)
    assert torch.equal(fake.run_args[-1][0][: len(own)], own)  # segment_packbits' layout
    # Packed by the caller (it wins over custom_mask): the same bits, read in place.
    w.plan(*args, 8, 2, 128, page, custom_mask=~flat, packed_custom_mask=own, causal=True)
    w.run(q, cache)
    _check_mask_args(fake.run_args[-1], masks)
    assert fake.run_ptrs[-1][0] == own.data_ptr()
    assert len(fake.of("create")) == 1  # the same create-time options
    w.forward(q, cache, causal=True)  # forward() compares the causal given to plan
    with pytest.raises(TypeError, match="custom_mask"):
        w.run(q, cache, 1.0)
    with pytest.raises(TypeError, match="custom_mask"):
        w.run(q, cache, variant_args=())

    for kw, cls, match in [
        (dict(custom_mask=flat[:-1]), ValueError, "custom_mask.*elements"),
        (dict(custom_mask=flat.to(torch.uint8)), ValueError, "custom_mask.*bool"),
        (dict(custom_mask=flat.tolist()), TypeError, "custom_mask"),
        (dict(packed_custom_mask=own[:-1]), ValueError, "packed_custom_mask.*bytes"),
        (dict(packed_custom_mask=own.int()), ValueError, "packed_custom_mask.*uint8"),
        (dict(custom_mask=flat, pos_encoding_mode="ALIBI"), cinfer.UnsupportedError, "ALIBI"),
        (dict(custom_mask=flat, variant="sinks"), cinfer.UnsupportedError, "variant"),
        (dict(packed_custom_mask=own, logits_soft_cap=5.0), cinfer.UnsupportedError,
         "logits_soft_cap"),
    ]:
        with pytest.raises(cls, match=match):
            w.plan(*args, 8, 2, 128, page, **kw)
    with pytest.raises(ValueError, match="plan"):  # a plan that raised left none
        w.run(q, cache)

    # Ragged: the same layout from kv_indptr.
    r = cinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    r.plan(_i32([0, 3, 5, 10, 17, 18]), _i32([0, 10, 10, 14, 17, 26]), 8, 2, 128,
           custom_mask=flat)
    kv = torch.zeros(26, 2, 128, dtype=torch.float16)
    r.run(q, kv, kv)
    _check_mask_args(fake.run_args[-1], masks)


def test_alibi_arguments(fake):
    args = _paged_args([0, 3, 10], [1, 2], [5, 16])
    q = torch.zeros(10, 12, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 4, 128, dtype=torch.float16)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    w.plan(*args, 12, 4, 128, 16, causal=True, pos_encoding_mode="ALIBI")
    create = fake.of("create")[-1]
    assert create[3] == 1 and create[8] == cinfer.variant_builtin("alibi").handle
    w.run(q, cache)
    assert fake.run_args[-1] == [None, 12]  # default slopes for num_qo_heads heads
    w.forward(q, cache, causal=True, pos_encoding_mode="ALIBI")
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        w.forward(q, cache, causal=True)
    with pytest.raises(TypeError, match="ALIBI"):
        w.run(q, cache, None, 12)
    for kw, match in [(dict(logits_soft_cap=30.0), "logits_soft_cap"),
                      (dict(variant="sinks"), "variant")]:
        with pytest.raises(cinfer.UnsupportedError, match=match):
            w.plan(*args, 12, 4, 128, 16, **dict(dict(pos_encoding_mode="ALIBI"), **kw))


def test_graph_mode_custom_mask(fake):
    cap, page = 3, 16
    bufs = dict(qo_indptr_buf=torch.zeros(cap + 1, dtype=torch.int32),
                paged_kv_indptr_buf=torch.zeros(cap + 1, dtype=torch.int32),
                paged_kv_indices_buf=torch.zeros(64, dtype=torch.int32),
                paged_kv_last_page_len_buf=torch.zeros(cap, dtype=torch.int32))
    steps = [([3, 5, 2], [9, 5, 16]), ([4], [4]), ([1, 6], [20, 6])]
    masks = _masks(*steps[0], seed=2)
    flat = torch.cat([m.flatten() for m in masks])
    ws = torch.empty(WS, dtype=torch.uint8)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", True, **bufs)
    with pytest.raises(ValueError, match="custom_mask_buf"):
        w.plan(*_paged_lens(*steps[0], page), 8, 2, 128, page, custom_mask=flat)
    with pytest.raises(ValueError, match="custom_mask_buf.*uint8"):
        cinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", True, **bufs,
                                                   custom_mask_buf=torch.zeros(8))
    mask_buf = torch.zeros(40, dtype=torch.uint8)
    indptr_buf = torch.zeros(cap + 1, dtype=torch.int32)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", True, **bufs,
                                                   custom_mask_buf=mask_buf,
                                                   mask_indptr_buf=indptr_buf)
    q = torch.zeros(10, 8, 128, dtype=torch.float16)
    cache = torch.zeros(64, 2, page, 2, 128, dtype=torch.float16)
    ptrs = None
    for step, (qo_lens, kv_lens) in enumerate(steps):
        masks = _masks(qo_lens, kv_lens, seed=step)
        w.plan(*_paged_lens(qo_lens, kv_lens, page), 8, 2, 128, page, causal=True,
               custom_mask=torch.cat([m.flatten() for m in masks]))
        w.run(q, cache)
        _check_mask_args(fake.run_args[-1], masks)
        # Fixed addresses for captured graphs: the packed mask in custom_mask_buf.
        assert fake.run_ptrs[-1][0] == mask_buf.data_ptr()
        assert ptrs is None or fake.run_ptrs[-1] == ptrs
        ptrs = fake.run_ptrs[-1]
        nbytes = [0]
        for a, b in zip(qo_lens, kv_lens):
            nbytes.append(nbytes[-1] + (a * b + 7) // 8)
        assert indptr_buf[: len(nbytes)].tolist() == nbytes  # FlashInfer's mask_indptr
    assert len(fake.of("create")) == 1
    big = ([8], [60])  # 480 bits: 60 bytes, more than custom_mask_buf holds
    plans = len(fake.of("plan"))
    with pytest.raises(ValueError, match="custom_mask_buf.*60"):
        w.plan(*_paged_lens(*big, page), 8, 2, 128, page, causal=True,
               custom_mask=torch.ones(480, dtype=torch.bool))
    # Refused before the C plan: a captured graph keeps replaying the last accepted schedule.
    assert len(fake.of("plan")) == plans
    with pytest.raises(ValueError, match="first plan"):  # no mask: another kernel
        w.plan(*_paged_lens(*steps[1], page), 8, 2, 128, page, causal=True)


def test_cascade_alibi(fake):
    ws = torch.empty(3 * WS + 100, dtype=torch.uint8)
    c = cinfer.MultiLevelCascadeAttentionWrapper(3, ws)
    qo, kv, idx, last = _three_levels()
    with pytest.raises(cinfer.UnsupportedError, match="ALIBI"):
        c.plan(qo, kv, idx, last, 8, 2, 128, 16, pos_encoding_mode="ALIBI")
    one = cinfer.MultiLevelCascadeAttentionWrapper(1, torch.empty(WS, dtype=torch.uint8))
    one.plan(qo[2:], kv[2:], idx[2:], last[2:], 8, 2, 128, 16, causal=True,
             pos_encoding_mode="ALIBI")
    one.run(torch.zeros(4, 8, 128, dtype=torch.float16),
            torch.zeros(13, 2, 16, 2, 128, dtype=torch.float16))
    assert fake.run_args[-1] == [None, 8]


# ---- in-kernel RoPE: options of the C objects, forward() against the plan, checks ----

def _f32(x):
    return ctypes.c_float(x).value


def test_prefill_rope_options_and_forward(fake):
    args = _paged_args([0, 3, 10], [1, 2], [5, 16])
    q = torch.zeros(10, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    w.plan(*args, 8, 2, 128, 16, causal=True, pos_encoding_mode="ROPE_LLAMA")
    create = fake.of("create")[-1]
    # RoPE is an option of the kernels, not a variant; None gives FlashInfer's 1 and 1e4.
    assert create[8] is None and create[9:] == (_lib.POS_ENCODING_ROPE_LLAMA, 1.0, 1e4)
    w.run(q, cache)
    assert fake.run_args[-1] == []
    w.forward(q, cache, causal=True, pos_encoding_mode="ROPE_LLAMA")
    w.forward(q, cache, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_scale=1,
              rope_theta=1e4)
    with pytest.raises(ValueError, match="rope_theta = 500000.0 differs from the planned"):
        w.forward(q, cache, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5)
    with pytest.raises(ValueError, match="pos_encoding_mode = 'NONE' differs"):
        w.forward(q, cache, causal=True)
    # Other parameters are other create-time options (another object), rounded to float32.
    w.plan(*args, 8, 2, 128, 16, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_scale=0.1,
           rope_theta=5e5)
    assert len(fake.of("create")) == 2
    assert fake.of("create")[-1][9:] == (_lib.POS_ENCODING_ROPE_LLAMA, _f32(0.1), 5e5)
    w.forward_return_lse(q, cache, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_scale=0.1,
                         rope_theta=5e5)
    with pytest.raises(ValueError, match="rope_scale = 1.0 differs"):
        w.forward(q, cache, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5)
    # Without RoPE the parameters are ignored unchecked, as FlashInfer ignores them.
    w.plan(*args, 8, 2, 128, 16, causal=True, rope_scale=-1.0, rope_theta=float("nan"))
    assert fake.of("create")[-1][9:] == (_lib.POS_ENCODING_NONE, 1.0, 1e4)
    w.forward(q, cache, causal=True, rope_theta=5e5)
    with pytest.raises(ValueError, match="pos_encoding_mode = 'ROPE_LLAMA' differs"):
        w.forward(q, cache, causal=True, pos_encoding_mode="ROPE_LLAMA")

    r = cinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    r.plan(_i32([0, 5, 7]), _i32([0, 9, 20]), 8, 2, 128, causal=True,
           pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5)
    assert fake.of("create")[-1][9:] == (_lib.POS_ENCODING_ROPE_LLAMA, 1.0, 5e5)
    kv = torch.zeros(20, 2, 128, dtype=torch.float16)
    r.forward(q[:7], kv, kv, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5)
    with pytest.raises(ValueError, match="rope_scale = 2.0 differs"):
        r.forward(q[:7], kv, kv, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_scale=2,
                  rope_theta=5e5)


def test_decode_rope_options_and_forward(fake):
    ws = torch.empty(WS, dtype=torch.uint8)
    table = (_i32([0, 1, 3]), torch.arange(3, dtype=torch.int32), _i32([5, 16]))
    q = torch.zeros(2, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    for tensor_cores in (False, True):
        w = cinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD",
                                                      use_tensor_cores=tensor_cores)
        w.plan(*table, 8, 2, 128, 16, pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0,
               rope_theta=5e5)
        # The library chooses (-1), whatever use_tensor_cores says: only its CUDA-core kernel
        # has in-kernel RoPE (it refuses 1 with RoPE).
        assert fake.of("decode_create")[-1][3:] == (-1, _lib.POS_ENCODING_ROPE_LLAMA, 2.0, 5e5)
        w.run(q, cache)
        w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0, rope_theta=5e5)
        with pytest.raises(ValueError, match="rope_theta = 10000.0 differs"):
            w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0)
        with pytest.raises(ValueError, match="pos_encoding_mode"):
            w.forward_return_lse(q, cache)
        # Without RoPE: a new object, with use_tensor_cores honoured again.
        w.plan(*table, 8, 2, 128, 16, rope_scale=0.0)
        assert fake.of("decode_create")[-1][3:] == (1 if tensor_cores else -1,
                                                    _lib.POS_ENCODING_NONE, 1.0, 1e4)
        w.forward(q, cache, rope_theta=123.0)
        with pytest.raises(ValueError, match="pos_encoding_mode"):
            w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA")


@pytest.mark.parametrize("kw,cls,match", [
    (dict(rope_scale=0.0), ValueError, "rope_scale = 0.0 with .*ROPE_LLAMA.*finite value > 0"),
    (dict(rope_scale=-2), ValueError, "rope_scale = -2 "),
    (dict(rope_scale=float("inf")), ValueError, "rope_scale = inf "),
    (dict(rope_theta=float("nan")), ValueError, "rope_theta = nan "),
    (dict(rope_theta=0), ValueError, "rope_theta = 0 "),
    (dict(rope_theta="1e4"), TypeError, "rope_theta"),
])
def test_rope_parameters_checked_before_the_library(fake, kw, cls, match):
    kw = dict(kw, pos_encoding_mode="ROPE_LLAMA")
    ws = torch.empty(WS, dtype=torch.uint8)
    args = _paged_args([0, 3, 10], [1, 2], [5, 16])
    with pytest.raises(cls, match=match):
        cinfer.BatchPrefillWithPagedKVCacheWrapper(ws).plan(*args, 8, 2, 128, 16, **kw)
    with pytest.raises(cls, match=match):
        cinfer.BatchPrefillWithRaggedKVCacheWrapper(ws).plan(_i32([0, 5]), _i32([0, 9]), 8, 2,
                                                             128, **kw)
    with pytest.raises(cls, match=match):
        cinfer.BatchDecodeWithPagedKVCacheWrapper(ws).plan(_i32([0, 1]), _i32([0]), _i32([3]),
                                                           8, 2, 128, 16, **kw)
    with pytest.raises(cls, match=match):
        cinfer.MultiLevelCascadeAttentionWrapper(1, ws).plan(
            [args[0]], [args[1]], [args[2]], [args[3]], 8, 2, 128, 16, **kw)
    # The single-request functions check them first, before looking at the tensors (CPU
    # tensors here, which they would refuse next).
    q = torch.zeros(8, 128, dtype=torch.float16)
    k = torch.zeros(4, 2, 128, dtype=torch.float16)
    with pytest.raises(cls, match=match):
        cinfer.single_decode_with_kv_cache(q, k, k, **kw)
    with pytest.raises(cls, match=match):
        cinfer.single_prefill_with_kv_cache(q[None], k, k, **kw)
    assert fake.calls == []


def test_single_functions_take_rope():
    # Valid RoPE arguments pass the argument checks: the call gets as far as the tensors (CPU
    # here), where the pre-RoPE code raised UnsupportedError for the mode.
    q = torch.zeros(8, 128, dtype=torch.float16)
    k = torch.zeros(4, 2, 128, dtype=torch.float16)
    for f, qq in ((cinfer.single_decode_with_kv_cache, q),
                  (cinfer.single_prefill_with_kv_cache, q[None])):
        with pytest.raises(ValueError, match="q: tensor on cpu") as info:
            f(qq, k, k, pos_encoding_mode="ROPE_LLAMA", rope_scale=8, rope_theta=5e5)
        assert not isinstance(info.value, cinfer.UnsupportedError)


def test_cascade_rope(fake):
    ws = torch.empty(3 * WS + 100, dtype=torch.uint8)
    c = cinfer.MultiLevelCascadeAttentionWrapper(3, ws)
    qo, kv, idx, last = _three_levels()
    with pytest.raises(cinfer.UnsupportedError, match="ROPE_LLAMA.*3 levels"):
        c.plan(qo, kv, idx, last, 8, 2, 128, 16, pos_encoding_mode="ROPE_LLAMA")
    one = cinfer.MultiLevelCascadeAttentionWrapper(1, torch.empty(WS, dtype=torch.uint8))
    one.plan(qo[2:], kv[2:], idx[2:], last[2:], 8, 2, 128, 16, causal=True,
             pos_encoding_mode="ROPE_LLAMA", rope_scale=4.0, rope_theta=5e5)
    assert fake.of("create")[-1][9:] == (_lib.POS_ENCODING_ROPE_LLAMA, 4.0, 5e5)


def test_decode_plan_state(fake, monkeypatch):
    """A plan that raises leaves no runnable plan; in CUDA-graph mode, once a run was captured,
    a plan needing another C object (other options) is refused; the object's variant lives as
    long as the object."""
    cap = 2
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(cap + 1, dtype=torch.int32),
                paged_kv_indices_buffer=torch.zeros(8, dtype=torch.int32),
                paged_kv_last_page_len_buffer=torch.zeros(cap, dtype=torch.int32))
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8), "NHD",
                                                  use_cuda_graph=True, **bufs)
    table = (_i32([0, 1, 3]), torch.arange(3, dtype=torch.int32), _i32([5, 16]))
    w.plan(*table, 8, 2, 128, 16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    q = torch.zeros(2, 8, 128, dtype=torch.float16)
    w.run(q, cache)
    with pytest.raises(ValueError, match="capacity"):
        w.plan(_i32([0, 1, 2, 3]), table[1], _i32([5, 5, 5]), 8, 2, 128, 16)
    with pytest.raises(ValueError, match="before plan"):
        w.run(q, cache)
    # Before a capture, other options re-create the object; after one, they are refused.
    w.plan(*table, 8, 2, 128, 16, sm_scale=0.5)
    creates = len(fake.of("decode_create"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    w.run(q, cache)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with pytest.raises(ValueError, match="options .* must stay"):
        w.plan(*table, 8, 2, 128, 16, sm_scale=0.25)
    assert len(fake.of("decode_create")) == creates
    w.plan(*table, 8, 2, 128, 16, sm_scale=0.5)  # the captured options: fine
    # A new workspace drops the object (and what was captured over it): any options again.
    w.reset_workspace_buffer(torch.empty(WS, dtype=torch.uint8))
    w.plan(*table, 8, 2, 128, 16, sm_scale=0.25)
    # The variant the object points at is kept with it, whatever became of the plan.
    e = cinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    v = cinfer.variant_builtin("sigmoid")
    e.plan(*table, 8, 2, 128, 16, variant=v)
    assert e._op_variant is v
    e.plan(*table, 8, 2, 128, 16)  # other options: a new object, without a variant
    assert e._op_variant is None


def test_mla_wrapper_rules(fake, monkeypatch):
    """The MLA wrapper's checks (backend, workspace type), run's LSE base and return, and the
    CUDA-graph rules: the capacity bounds qo_indptr[-1], a capture below it is refused, and a
    plan whose pages do not fit the page-index buffer makes no C plan."""
    with pytest.raises(TypeError, match="float_workspace_buffer: expected a torch.Tensor"):
        cinfer.BatchMLAPagedAttentionWrapper(5)
    with pytest.raises(ValueError, match="backend = 'x'"):
        cinfer.BatchMLAPagedAttentionWrapper(torch.empty(WS, dtype=torch.uint8), backend="x")
    page, heads = 16, 16

    def args(qo, kv_lens):
        pages = [(n + page - 1) // page for n in kv_lens]
        kv = [0] + list(torch.tensor(pages).cumsum(0).tolist())
        return (_i32(qo), _i32(kv), torch.arange(kv[-1], dtype=torch.int32), _i32(kv_lens),
                heads, 512, 64, page, False, 0.1, torch.bfloat16, torch.bfloat16)

    w = cinfer.BatchMLAPagedAttentionWrapper(torch.empty(WS, dtype=torch.uint8))
    w.plan(*args([0, 1, 2], [20, 40]))
    q_nope = torch.zeros(2, heads, 512, dtype=torch.bfloat16)
    q_pe = torch.zeros(2, heads, 64, dtype=torch.bfloat16)
    ckv = torch.zeros(8, page, 512, dtype=torch.bfloat16)
    kpe = torch.zeros(8, page, 64, dtype=torch.bfloat16)
    assert isinstance(w.run(q_nope, q_pe, ckv, kpe, return_lse_base_on_e=True), torch.Tensor)
    out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True, return_lse_base_on_e=True)
    assert torch.allclose(lse, torch.full_like(lse, math.log(2.0)))
    with pytest.raises(ValueError, match="kv_indices: 2 dimensions"):
        a = args([0, 1, 2], [20, 40])
        w.plan(a[0], a[1], a[2][:, None], *a[3:])

    g = cinfer.BatchMLAPagedAttentionWrapper(
        torch.empty(WS, dtype=torch.uint8), use_cuda_graph=True,
        qo_indptr=torch.zeros(3, dtype=torch.int32), kv_indices=torch.zeros(5, dtype=torch.int32))
    g.plan(*args([0, 1, 2], [20, 40]))
    plans = len(fake.of("mla_plan"))
    with pytest.raises(ValueError, match="do not fit the CUDA graph mode's page-index buffer"):
        g.plan(*args([0, 1, 2], [20, 90]))
    with pytest.raises(ValueError, match=r"qo_indptr\[-1\] = 3 query rows exceed"):
        g.plan(*args([1, 2, 3], [20, 40]))
    assert len(fake.of("mla_plan")) == plans  # neither reached the C plan
    g.plan(*args([0, 1], [20]))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="below the 2 query rows"):
        g.run(q_nope[:1], q_pe[:1], ckv, kpe)
    g.run(q_nope, q_pe, ckv, kpe)


# ---- run's reused argument structs ----

def test_decode_run_rebinds_structs(fake):
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    w.plan(_i32([0, 1, 3]), torch.arange(3, dtype=torch.int32), _i32([5, 16]), 8, 2, 128, 16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    seen = []
    for _ in range(3):  # new q and out each call, of one layout: the structs follow them
        q = torch.randn(2, 8, 128).half()
        out = w.run(q, cache)
        seen.append(fake.of("decode_run")[-1][2:4])
        assert seen[-1] == (q.data_ptr(), out.data_ptr()) and out.shape == q.shape
    wide = torch.zeros(2, 16, 128, dtype=torch.float16)
    out, lse = w.run(wide[:, 8:], (cache[:, 0], cache[:, 1]), return_lse=True)
    assert fake.of("decode_run")[-1][2:] == (wide[:, 8:].data_ptr(), out.data_ptr(), True,
                                             lse.data_ptr())
    given = torch.empty(2, 8, 128, dtype=torch.float16)
    assert w.run(q, cache, out=given) is given
    assert fake.of("decode_run")[-1][2:5] == (q.data_ptr(), given.data_ptr(), False)
    # Tensors of another layout are checked again, also after a layout was bound.
    with pytest.raises(ValueError, match="q: 2 dimensions"):
        w.run(q[0], cache)
    with pytest.raises(TypeError, match="q"):
        w.run("q", cache)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(q, (cache,))
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(q, cache[:, 0])
    with pytest.raises(TypeError, match="out"):
        w.run(q, cache, out=[0])
    # A plan with ALiBi: its built-in arguments, and none from the caller.
    w.plan(_i32([0, 1, 3]), torch.arange(3, dtype=torch.int32), _i32([5, 16]), 8, 2, 128, 16,
           pos_encoding_mode="ALIBI")
    with pytest.raises(TypeError, match="ALIBI"):
        w.run(q, cache, None, 8)
    n = len(fake.of("decode_run"))
    w.run(q, cache)
    assert len(fake.of("decode_run")) == n + 1 and fake.of("decode_run")[-1][2] == q.data_ptr()


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_prefill_run_rebinds_structs(fake, storage):
    ws = torch.empty(WS, dtype=torch.uint8)
    if storage == "paged":
        w = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws)
        w.plan(*_paged_args([0, 3, 10], [1, 2], [5, 16]), 8, 2, 128, 16, causal=True)
        cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
        kv_args = [(cache,), ((cache[:, 0], cache[:, 1]),)]
    else:
        w = cinfer.BatchPrefillWithRaggedKVCacheWrapper(ws)
        w.plan(_i32([0, 3, 10]), _i32([0, 9, 20]), 8, 2, 128, causal=True)
        kv = torch.zeros(20, 2, 2, 128, dtype=torch.float16)
        kv_args = [(kv[:, 0], kv[:, 1]), (kv[:, 0].contiguous(), kv[:, 1].contiguous())]
    for i in range(4):
        q = torch.randn(10, 8, 128).half()
        out = w.run(q, *kv_args[i % 2])
        q_ptr, out_ptr, out_strides, lse_ptr, _ = fake.run_views[-1]
        assert (q_ptr, out_ptr, lse_ptr) == (q.data_ptr(), out.data_ptr(), None)
        assert out_strides == list(out.stride())
    wide = torch.zeros(10, 16, 128, dtype=torch.float16)
    lse = torch.empty(10, 8)
    out, got = w.run(wide[:, 8:], *kv_args[0], lse=lse, return_lse=True)
    assert got is lse and fake.run_views[-1][0] == wide[:, 8:].data_ptr()
    assert fake.run_views[-1][3] == lse.data_ptr()
    with pytest.raises(ValueError, match="q: 2 dimensions"):
        w.run(q[0], *kv_args[0])
    with pytest.raises(TypeError, match="q"):
        w.run(None, *kv_args[0])
    if storage == "paged":
        with pytest.raises(ValueError, match="paged_kv_cache"):
            w.run(q, (cache, cache, cache))
    else:
        with pytest.raises(TypeError, match="k"):
            w.run(q, "k", kv_args[0][1])
    w.run(q, *kv_args[0])
    assert fake.run_views[-1][0] == q.data_ptr()


# ---- arguments of later FlashInfer 0.2 releases ----

def test_decode_later_arguments(fake):
    # FlashInfer 0.2.14's plan(block_tables, seq_lens) describe the page table a second time for
    # its TensorRT-LLM backend: refused before anything is created. run(window_left=) may repeat
    # the planned window only; run(sinks=) is refused (the sinks variant is chosen at plan).
    w = cinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    args = (_i32([0, 1, 3]), torch.arange(3, dtype=torch.int32), _i32([5, 16]), 8, 2, 128, 16)
    for kw in (dict(block_tables=torch.zeros(2, 2, dtype=torch.int32)),
               dict(seq_lens=_i32([5, 32]))):
        with pytest.raises(cinfer.UnsupportedError, match=next(iter(kw))):
            w.plan(*args, **kw)
    # Positionally, as FlashInfer 0.2.14 orders them (after non_blocking).
    with pytest.raises(cinfer.UnsupportedError, match="seq_lens"):
        w.plan(*args, "NONE", -1, None, "float16", None, None, None, None, None, True, None,
               _i32([5, 32]))
    assert fake.of("decode_create") == []
    w.plan(*args, window_left=7)
    q = torch.zeros(2, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    n = len(fake.of("decode_run"))
    w.run(q, cache, window_left=7)
    w.run(q, cache, window_left=None, sinks=None)
    assert len(fake.of("decode_run")) == n + 2
    with pytest.raises(ValueError, match="window_left = 3 differs from the planned"):
        w.run(q, cache, window_left=3)
    with pytest.raises(TypeError, match="window_left"):
        w.run(q, cache, window_left=7.0)
    with pytest.raises(cinfer.UnsupportedError, match="sinks"):
        w.run_return_lse(q, cache, sinks=torch.zeros(8))
    assert len(fake.of("decode_run")) == n + 2


def test_prefill_later_arguments(fake):
    ws = torch.empty(WS, dtype=torch.uint8)
    for cls in (cinfer.BatchPrefillWithPagedKVCacheWrapper,
                cinfer.BatchPrefillWithRaggedKVCacheWrapper):
        with pytest.raises(cinfer.UnsupportedError, match="jit_kwargs"):
            cls(ws, jit_kwargs={"use_sliding_window": False})
        cls(ws, jit_kwargs=None)
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(ws)
    args = _paged_args([0, 3, 10], [1, 2], [5, 16])
    for kw in (dict(seq_lens=_i32([5, 32])), dict(seq_lens_q=_i32([3, 7])),
               dict(block_tables=torch.zeros(2, 2, dtype=torch.int32)),
               dict(max_token_per_sequence=7), dict(max_sequence_kv=32)):
        with pytest.raises(cinfer.UnsupportedError, match=next(iter(kw))):
            w.plan(*args, 8, 2, 128, 16, **kw)
    assert fake.of("create") == []
    w.plan(*args, 8, 2, 128, 16, causal=True, window_left=15)
    q = torch.zeros(10, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    w.run(q, cache, window_left=15)
    n = len(fake.of("run"))
    with pytest.raises(ValueError, match="window_left = -1 differs from the planned"):
        w.run(q, cache, window_left=-1)
    with pytest.raises(cinfer.UnsupportedError, match="sinks"):
        w.run(q, cache, sinks=torch.zeros(8))
    assert len(fake.of("run")) == n


def test_single_prefill_later_arguments():
    # FlashInfer 0.2.8's scale_q / scale_k / scale_v / o_dtype, by keyword: refused (or, for
    # o_dtype, accepted when it is q's dtype) before the tensors are checked (CPU here).
    q = torch.zeros(4, 8, 128, dtype=torch.float16)
    k = torch.zeros(4, 2, 128, dtype=torch.float16)
    f = cinfer.single_prefill_with_kv_cache
    for kw in (dict(scale_q=torch.ones(8)), dict(scale_k=torch.ones(2)),
               dict(scale_v=torch.ones(2)), dict(o_dtype=torch.bfloat16),
               dict(o_dtype="float32")):
        with pytest.raises(cinfer.UnsupportedError, match=next(iter(kw))):
            f(q, k, k, **kw)
    for o_dtype in (torch.float16, "float16", None):
        with pytest.raises(ValueError, match="q: tensor on cpu"):
            f(q, k, k, o_dtype=o_dtype)
    with pytest.raises(TypeError, match="o_dtype"):
        f(q, k, k, o_dtype=16)
    # FlashInfer's _return_lse is a functools.partial: return_lse may still be given.
    with pytest.raises(cinfer.UnsupportedError, match="scale_q"):
        cinfer.single_prefill_with_kv_cache_return_lse(q, k, k, scale_q=torch.ones(8))
    with pytest.raises(ValueError, match="q: tensor on cpu"):
        cinfer.single_prefill_with_kv_cache_return_lse(q, k, k, return_lse=False)
