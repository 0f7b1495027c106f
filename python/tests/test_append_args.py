"""append_paged_kv_cache's scale arguments as the function checks them before anything reaches
the library: pure Python, no GPU needed (the kernel's use of them is in test_page.py)."""

import ctypes

import pytest

from cinfer import errors, page


def test_scales_as_the_attention_calls_take_them():
    assert page._scale(None, "k_scale") == 1.0
    assert page._scale(2, "k_scale") == 2.0
    assert page._scale(0.1, "v_scale") == ctypes.c_float(0.1).value  # the C options' float32
    for bad in ("2", True, b"2", [2.0]):
        want = f"v_scale: {type(bad).__name__}, expected a float or None"
        with pytest.raises(TypeError, match=want):
            page._scale(bad, "v_scale")
    for bad, match in ((0, "v_scale = 0, expected a finite value > 0"),
                       (-1.0, "v_scale = -1.0"), (float("inf"), "v_scale = inf"),
                       (float("nan"), "v_scale = nan")):
        with pytest.raises(errors.ArgumentError, match=match):
            page._scale(bad, "v_scale")


def test_scales_from_numpy_and_0_dim_tensors():
    np = pytest.importorskip("numpy")
    assert page._scale(np.float32(0.5), "k_scale") == 0.5
    torch = pytest.importorskip("torch")
    assert page._scale(torch.tensor(0.25), "k_scale") == 0.25  # a layer's fp8 scale
