"""The torch.compile operators (cinfer.torch_ops): registration, fake (meta) shapes, opcheck,
and torch.compile(fullgraph=True) over code calling decode, prefill, merge and the utilities,
against eager. The registration and meta tests need torch only; the rest a CUDA device."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch.library.custom_op needs PyTorch 2.4", allow_module_level=True)

import cinfer  # noqa: E402
import cinfer.torch_ops  # noqa: E402,F401

PYTHON_DIR = Path(__file__).resolve().parent.parent
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
OPS = torch.ops.cinfer


def test_registered_when_torch_is_imported_first():
    code = ("import sys, torch, cinfer\n"
            "assert 'cinfer.torch_ops' in sys.modules\n"
            "assert hasattr(torch.ops.cinfer, 'single_prefill')\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(PYTHON_DIR)))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_schemas_declare_mutations():
    def mutated(name):
        schema = getattr(OPS, name).default._schema
        return {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
    assert mutated("single_prefill") == set()
    assert mutated("merge_state_in_place") == {"v", "s"}
    assert mutated("append_paged_kv_cache") == {"k_cache", "v_cache", "error_flag"}
    assert mutated("rope_inplace") == {"q", "k"}
    assert mutated("rope_cos_sin_cache_inplace") == {"query", "key"}


def test_fake_shapes_on_meta():
    m = dict(device="meta")
    q = torch.empty(7, 8, 64, dtype=torch.bfloat16, **m)
    k = torch.empty(9, 2, 64, dtype=torch.bfloat16, **m)
    out, lse = OPS.single_prefill(q, k, k, True, "NHD", None, -1, None, True)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (7, 8),
                                                            torch.float32)
    out, lse = OPS.single_decode(q[0], k, k, "NHD", None, None, -1, None, None, True)
    assert out.shape == (8, 64) and lse.shape == (8,)
    _, lse = OPS.single_decode(q[0], k, k, "NHD", None, None, -1, None, None, False)
    assert lse.shape == (0,)
    v = torch.empty(5, 3, 4, 64, dtype=torch.float16, **m)
    s = torch.empty(5, 3, 4, **m)
    vo, so = OPS.merge_states(v, s)
    assert vo.shape == (5, 4, 64) and vo.dtype == torch.float16 and so.shape == (5, 4)
    vo, so = OPS.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    assert vo.shape == (5, 4, 64) and so.shape == (5, 4)
    i32 = torch.empty(4, dtype=torch.int32, **m)
    bi, pos = OPS.get_batch_indices_positions(i32, i32[:3], 11)
    assert bi.shape == pos.shape == (11,) and bi.dtype == torch.int32
    assert OPS.get_seq_lens(i32, i32[:3], 16).shape == (3,)
    qr, kr = OPS.rope(q, k, None, None, i32, 0, False, 1.0, 1e4, False, 1.0, 4.0, 8192.0)
    assert qr.shape == q.shape and kr.shape == k.shape and qr.dtype == q.dtype
    x = torch.empty(13, dtype=torch.bool, **m)
    assert OPS.packbits(x, "big").shape == (2,)


def _qkv(qo_len, kv_len, hq, hk, d, dtype, seed):
    gen = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(qo_len, hq, d, generator=gen, device="cuda").to(dtype)
    k = torch.randn(kv_len, hk, d, generator=gen, device="cuda").to(dtype)
    v = torch.randn(kv_len, hk, d, generator=gen, device="cuda").to(dtype)
    return q, k, v


@gpu
def test_compile_fullgraph_attention_matches_eager():
    def step(q, k, v):
        o_d, s_d = cinfer.single_decode_with_kv_cache(q[-1], k, v, return_lse=True)
        o_p, s_p = cinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True,
                                                       window_left=200)
        # Merge each prefill row with the decode state of the last token (any two states do).
        n = q.shape[0]
        o, s = cinfer.merge_state(o_p, s_p, o_d[None].expand(n, -1, -1).contiguous(),
                                  s_d[None].expand(n, -1).contiguous())
        return o * 2, s + 1, o_p

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    for seed, (qo_len, kv_len) in enumerate([(128, 1000), (77, 300)]):  # a recompile too
        q, k, v = _qkv(qo_len, kv_len, 32, 8, 128, torch.bfloat16, seed)
        for got, want in zip(compiled(q, k, v), step(q, k, v)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@gpu
def test_compile_fullgraph_utilities_match_eager():
    page_size, hk, d, hq = 16, 2, 64, 8
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda")
    indices = torch.tensor([4, 1, 0], dtype=torch.int32, device="cuda")
    last = torch.tensor([5, 16], dtype=torch.int32, device="cuda")
    append_indptr = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")

    def step(qkv, k_cache, v_cache, mask_bits):
        q, k, v = qkv[:, :hq], qkv[:, hq:hq + hk], qkv[:, hq + hk:]
        seq_lens = cinfer.get_seq_lens(indptr, last, page_size)
        bi, pos = cinfer.get_batch_indices_positions(append_indptr, seq_lens, 10)
        cinfer.apply_rope_pos_ids_inplace(q, k, pos)
        cinfer.append_paged_kv_cache(k, v, bi, pos, (k_cache, v_cache), indices, indptr, last)
        return q * 1, seq_lens, cinfer.packbits(mask_bits, "little")

    gen = torch.Generator("cuda").manual_seed(3)
    qkv = torch.randn(10, hq + 2 * hk, d, generator=gen, device="cuda").half()
    cache = torch.randn(2, 5, page_size, hk, d, generator=gen, device="cuda").half()
    bits = torch.rand(77, generator=gen, device="cuda") < 0.5
    eager_args = (qkv.clone(), cache[0].clone(), cache[1].clone(), bits)
    comp_args = (qkv.clone(), cache[0].clone(), cache[1].clone(), bits)
    want = step(*eager_args)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(*comp_args)
    for a, b in zip(list(got) + list(comp_args), list(want) + list(eager_args)):
        assert torch.equal(a, b)


@gpu
def test_opcheck():
    q, k, v = _qkv(33, 70, 8, 2, 128, torch.float16, 1)
    opcheck = torch.library.opcheck
    opcheck(OPS.single_prefill.default, (q, k, v, True, "NHD", None, -1, None, True))
    opcheck(OPS.single_decode.default, (q[0], k, v, "NHD", None, None, -1, None, None, True))
    s = torch.randn(33, 8, device="cuda")
    opcheck(OPS.merge_state.default, (q, s, q.flip(0), s.flip(0)))
    opcheck(OPS.merge_state_in_place.default, (q.clone(), s.clone(), q.flip(0), s.flip(0),
                                               None))
    pos = torch.arange(33, dtype=torch.int32, device="cuda")
    opcheck(OPS.rope_inplace.default, (q.clone(), q[:, :2].clone(), None, None, pos, 0, False,
                                       1.0, 1e4, False, 1.0, 4.0, 8192.0))
    opcheck(OPS.get_seq_lens.default, (pos[:5], pos[:4], 16))
