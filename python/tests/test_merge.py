"""merge_state, merge_state_in_place, merge_states against a float64 reference."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cinfer  # noqa: E402
from reference import merge_many, tolerance  # noqa: E402

DEV = "cuda"


def _state(n, h, d, dtype, gen, empty_rows=()):
    v = torch.randn(n, h, d, generator=gen, device=DEV).to(dtype)
    s = (torch.randn(n, h, generator=gen, device=DEV) * 4).float()
    for r in empty_rows:
        s[r] = -math.inf
    return v, s


def _check(v, s, v_ref, s_ref, dtype):
    atol, rtol = tolerance(dtype)
    assert v.dtype == dtype and s.dtype == torch.float32
    assert not torch.isnan(v).any() and not torch.isnan(s).any()
    torch.testing.assert_close(v.double(), v_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(s.double(), s_ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [128, 64, 100])
def test_merge_state(dtype, d):
    gen = torch.Generator(DEV).manual_seed(1)
    n, h = 77, 8
    # Rows 0-4: a empty; 3-9: b empty (rows 3 and 4: both, which must give (0, -inf)).
    v_a, s_a = _state(n, h, d, dtype, gen, empty_rows=range(0, 5))
    v_b, s_b = _state(n, h, d, dtype, gen, empty_rows=range(3, 10))
    v, s = cinfer.merge_state(v_a, s_a, v_b, s_b)
    v_ref, s_ref = merge_many(torch.stack([v_a, v_b], 1), torch.stack([s_a, s_b], 1))
    _check(v, s, v_ref, s_ref, dtype)
    assert (v[3:5] == 0).all() and torch.isneginf(s[3:5]).all()


def test_merge_state_strided_inputs():
    gen = torch.Generator(DEV).manual_seed(2)
    n, h, d = 33, 4, 64
    big = torch.randn(n, 2, h, d, generator=gen, device=DEV).half()
    lse = torch.randn(n, 2, h, generator=gen, device=DEV).float()
    v, s = cinfer.merge_state(big[:, 0], lse[:, 0], big[:, 1], lse[:, 1])
    v_ref, s_ref = merge_many(big, lse)
    _check(v, s, v_ref, s_ref, torch.float16)


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_merge_state_in_place(dtype, with_mask):
    gen = torch.Generator(DEV).manual_seed(3)
    n, h, d = 50, 16, 128
    v, s = _state(n, h, d, dtype, gen, empty_rows=(0, 1, 2))
    v_o, s_o = _state(n, h, d, dtype, gen, empty_rows=(2, 3))
    v_ref, s_ref = merge_many(torch.stack([v, v_o], 1), torch.stack([s, s_o], 1))
    mask = None
    if with_mask:
        mask = torch.rand(n, generator=gen, device=DEV) < 0.5
        keep = ~mask
        v_ref[keep] = v[keep].double()
        s_ref[keep] = s[keep].double()
    cinfer.merge_state_in_place(v, s, v_o, s_o, mask=mask)
    _check(v, s, v_ref, s_ref, dtype)


@pytest.mark.parametrize("num_states", [0, 1, 3, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_merge_states(dtype, num_states):
    gen = torch.Generator(DEV).manual_seed(4)
    n, h, d = 40, 8, 128
    v = torch.randn(n, num_states, h, d, generator=gen, device=DEV).to(dtype)
    s = (torch.randn(n, num_states, h, generator=gen, device=DEV) * 4).float()
    if num_states > 1:
        s[0] = -math.inf  # every state of row 0 empty
        s[1, 0] = -math.inf  # one state of row 1 empty
    v_out, s_out = cinfer.merge_states(v, s)
    assert v_out.shape == (n, h, d) and s_out.shape == (n, h)
    v_ref, s_ref = merge_many(v, s)
    _check(v_out, s_out, v_ref, s_ref, dtype)


def test_merge_errors():
    v = torch.randn(4, 2, 64, device=DEV).half()
    s = torch.randn(4, 2, device=DEV).float()
    with pytest.raises(TypeError, match="v_a"):
        cinfer.merge_state([1.0], s, v, s)
    with pytest.raises(ValueError, match="s_b"):
        cinfer.merge_state(v, s, v, s.half())
    with pytest.raises(ValueError, match="v_a"):
        cinfer.merge_state(v.float(), s, v, s)
    with pytest.raises(ValueError, match="v_b"):
        cinfer.merge_state(v, s, v.bfloat16(), s)
    with pytest.raises(ValueError, match="v_a.*cpu"):
        cinfer.merge_state(v.cpu(), s, v, s)
    with pytest.raises(ValueError, match="s_a"):
        cinfer.merge_state(v, s[:, :1], v, s)
    with pytest.raises(ValueError, match="mask"):
        cinfer.merge_state_in_place(v, s, v, s, mask=torch.ones(3, dtype=torch.bool, device=DEV))
    with pytest.raises(ValueError, match="v"):
        cinfer.merge_states(v, s)  # 3-D where 4-D is expected
