"""The number checks every Python call makes of its scalar arguments (cinfer._args.real and
integer, and the checks built on them) before anything reaches the library: pure Python, no GPU
needed. Python's float() and int() would take "2" or True and cut 128.5 to 128; these refuse them
with a TypeError naming the argument."""

import pytest

from cinfer import _args as A
from cinfer import errors


def test_real_takes_numbers_only():
    assert A.real(2, "sm_scale") == 2.0
    assert A.real(0.5, "sm_scale") == 0.5
    for bad in ("0.5", b"1", True, None, [1.0], object()):
        with pytest.raises(TypeError, match=f"sm_scale: {type(bad).__name__}, expected a float"):
            A.real(bad, "sm_scale")


def test_integer_takes_integers_only():
    assert A.integer(128, "head_dim") == 128
    for bad in (128.0, 128.5, "128", True, None):
        with pytest.raises(TypeError, match=f"head_dim: {type(bad).__name__}, expected an int"):
            A.integer(bad, "head_dim")


def test_checks_built_on_them():
    assert A.window_left(-1) == -1 and A.window_left(4096) == 4096
    with pytest.raises(TypeError, match="window_left: float"):
        A.window_left(4096.0)
    with pytest.raises(errors.ArgumentError, match="window_left = -2"):
        A.window_left(-2)
    assert A.soft_cap(None) == 0.0 and A.soft_cap(30) == 30.0
    with pytest.raises(TypeError, match="logits_soft_cap: str"):
        A.soft_cap("30")
    with pytest.raises(TypeError, match="rope_theta: str"):
        A.rope("ROPE_LLAMA", None, "1e4")
    assert A.positive(None, "k_scale", 1.0) == 1.0
    with pytest.raises(TypeError, match="k_scale: bool, expected a float or None"):
        A.positive(False, "k_scale", 1.0)


def test_numpy_and_one_element_tensors():
    np = pytest.importorskip("numpy")
    assert A.integer(np.int64(16), "page_size") == 16
    assert A.real(np.float32(0.25), "v_scale") == 0.25
    with pytest.raises(TypeError, match="page_size: float64"):
        A.integer(np.float64(16), "page_size")
    torch = pytest.importorskip("torch")
    assert A.integer(torch.tensor(16), "page_size") == 16
    assert A.real(torch.tensor(0.25), "k_scale") == 0.25
    with pytest.raises(errors.ArgumentError, match="k_scale: "):
        A.real(torch.tensor([0.25, 0.5]), "k_scale")
    with pytest.raises(errors.ArgumentError, match="page_size: "):
        A.integer(torch.tensor([16, 32]), "page_size")


def test_rope_numbers_before_the_tensors():
    from cinfer import rope
    # The numbers are checked where the call is routed, before any tensor is looked at.
    common = (None, None, None, None, None)
    with pytest.raises(TypeError, match="rotary_dim: float, expected an int"):
        rope._rope(*common, 64.0, False, 1.0, 1e4, False, (1.0, 4.0, 8192), False)
    with pytest.raises(TypeError, match="rope_theta: str"):
        rope._rope(*common, None, False, 1.0, "1e4", False, (1.0, 4.0, 8192), False)
    with pytest.raises(TypeError, match="old_context_len: str"):
        rope._rope(*common, None, False, 1.0, 1e4, True, (1.0, 4.0, "8192"), False)
    with pytest.raises(TypeError, match="head_size: float"):
        rope._cos_sin_cache(None, None, None, 128.0, None, True, False)


def test_run_scales_against_the_plan():
    A.refuse_unplanned_scales(None, 2.0, 0.5, 2.0)  # equal, or not given: accepted
    with pytest.raises(errors.ArgumentError, match="k_scale = 0.25 differs from the planned"):
        A.refuse_unplanned_scales(0.25, None, 0.5, 2.0)
    with pytest.raises(TypeError, match="v_scale: str, expected a float or None"):
        A.refuse_unplanned_scales(None, "2", 0.5, 2.0)
