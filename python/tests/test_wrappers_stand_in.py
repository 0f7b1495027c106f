"""The batch prefill and cascade wrappers' Python logic against a stand-in library, on the CPU:
when C objects are created, reused, grown and evicted, CUDA-graph mode rules, argument checks
made before the library, what run passes. The attention itself is checked by the GPU suites
(test_batch_prefill.py, test_cascade.py)."""

import ctypes

import pytest

torch = pytest.importorskip("torch")

import cinfer  # noqa: E402
from cinfer import _lib, _tensor, errors  # noqa: E402


class StandIn:
    """Records the batch prefill calls; workspace sizes are 4096 + max_total_qo_tokens bytes."""

    def __init__(self):
        self.calls = []
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
                           o.max_batch_size, o.use_cuda_graph, o.sm_scale, o.variant))
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
        return 0

    def cinfer_batch_prefill_destroy(self, op):
        h = op.value if hasattr(op, "value") else op
        self.live.discard(h)
        self.calls.append(("destroy", h))

    def cinfer_merge_state_in_place(self, *a):
        self.calls.append(("merge",))
        return 0

    def cinfer_last_error(self):
        return b""

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]


@pytest.fixture
def fake(monkeypatch):
    f = StandIn()
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


def test_paged_plan_and_run_errors(fake):
    w = cinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8))
    args = _paged_args([0, 3, 10], [1, 2], [5, 16])
    q = torch.zeros(10, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="plan"):
        w.run(q, cache)
    for kw, cls, match in [
        (dict(custom_mask=torch.ones(3, dtype=torch.bool)), cinfer.UnsupportedError,
         "custom_mask"),
        (dict(packed_custom_mask=torch.ones(3, dtype=torch.uint8)), cinfer.UnsupportedError,
         "packed_custom_mask"),
        (dict(head_dim_vo=64), cinfer.UnsupportedError, "head_dim_vo"),
        (dict(pos_encoding_mode="ROPE_LLAMA"), cinfer.UnsupportedError, "pos_encoding_mode"),
        (dict(use_fp16_qk_reduction=True), cinfer.UnsupportedError, "fp16_qk"),
        (dict(kv_data_type="float8_e4m3fn"), cinfer.UnsupportedError, "kv_data_type"),
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
                    (dict(custom_mask_buf=torch.ones(1)), cinfer.UnsupportedError),
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


def test_cascade_levels(fake):
    ws = torch.empty(3 * WS + 100, dtype=torch.uint8)
    c = cinfer.MultiLevelCascadeAttentionWrapper(3, ws)
    ptrs = [w._float_workspace_buffer.data_ptr() for w in c._wrappers]
    sizes = [w._float_workspace_buffer.numel() for w in c._wrappers]
    assert len(set(sizes)) == 1 and all(p % 256 == 0 for p in ptrs)
    assert all(ptrs[i] + sizes[i] <= ptrs[i + 1] for i in range(2))
    qo = [_i32([0, 4]), _i32([0, 2, 4]), _i32([0, 1, 2, 3, 4])]
    kv = [_i32([0, 8]), _i32([0, 1, 2]), _i32([0, 1, 1, 2, 3])]
    idx = [torch.arange(8, dtype=torch.int32), _i32([8, 9]), _i32([10, 11, 12])]
    last = [_i32([16]), _i32([3, 4]), _i32([1, 1, 2, 2])]
    c.plan(qo, kv, idx, last, 8, 2, 128, 16, causal=True)
    creates = fake.of("create")
    assert [x[3] for x in creates] == [0, 0, 1]  # only the last level is causal
    q = torch.zeros(4, 8, 128, dtype=torch.float16)
    out, lse = c.run(q, torch.zeros(13, 2, 16, 2, 128, dtype=torch.float16), return_lse=True)
    assert len(fake.of("run")) == 3 and len(fake.of("merge")) == 2
    with pytest.raises(ValueError, match="num_levels"):
        c.plan(qo[:2], kv, idx, last, 8, 2, 128, 16)
    with pytest.raises(cinfer.UnsupportedError, match="window_left"):
        c.plan(qo, kv, idx, last, 8, 2, 128, 16, window_left=10)
    with pytest.raises(ValueError, match="level 1"):
        c.plan(qo, [kv[0], kv[1][:2], kv[2]], idx, last, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="num_levels"):
        cinfer.MultiLevelCascadeAttentionWrapper(0, ws)
    with pytest.raises(ValueError, match="qo_indptr_buf_arr"):
        cinfer.MultiLevelCascadeAttentionWrapper(2, ws, use_cuda_graph=True)
