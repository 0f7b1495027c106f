"""The position-encoding arguments (pos_encoding_mode, rope_scale, rope_theta) as the attention
functions and wrappers check them before anything reaches the library: pure Python, no torch
and no GPU needed (the wrappers' use of them is in test_wrappers_stand_in.py, the attention in
the GPU suites)."""

import ctypes
import math

import pytest

from cinfer import _args as A
from cinfer import _lib, errors


def test_modes():
    for mode in ("NONE", "ROPE_LLAMA", "ALIBI"):
        assert A.pos_encoding_mode(mode) == mode
    for bad in ("rope", "ROPE", "alibi", None, 1):
        with pytest.raises(errors.ArgumentError, match="pos_encoding_mode.*expected one of"):
            A.pos_encoding_mode(bad)


def test_rope_defaults_and_rounding():
    assert A.rope("ROPE_LLAMA", None, None) == (1.0, 1e4)  # FlashInfer's defaults
    scale, theta = A.rope("ROPE_LLAMA", 0.1, 500000)
    assert scale == ctypes.c_float(0.1).value != 0.1  # the C options' float32
    assert theta == 5e5 and isinstance(theta, float)
    assert A.rope_fields(A.rope("ROPE_LLAMA", 2, 5e5)) == {
        "pos_encoding_mode": _lib.POS_ENCODING_ROPE_LLAMA, "rope_scale": 2.0,
        "rope_theta": 5e5}
    # Without RoPE the parameters are ignored, unchecked (FlashInfer ignores them too), and the
    # options keep their defaults.
    for mode in ("NONE", "ALIBI"):
        assert A.rope(mode, -1.0, math.nan) is None
    assert A.rope_fields(None) == {}
    opts = _lib.attention_options(**A.rope_fields(A.rope("ROPE_LLAMA", 0.5, 1e6)))
    assert (opts.pos_encoding_mode, opts.rope_scale, opts.rope_theta) == (
        _lib.POS_ENCODING_ROPE_LLAMA, 0.5, 1e6)


@pytest.mark.parametrize("name", ["rope_scale", "rope_theta"])
@pytest.mark.parametrize("value", [0, 0.0, -1.0, math.inf, -math.inf, math.nan, 1e39, 1e-50])
def test_rope_values_refused(name, value):
    # 1e39 and 1e-50 are finite and > 0 as Python floats, but inf and 0 in the options' float32.
    kw = {"rope_scale": None, "rope_theta": None, name: value}
    with pytest.raises(errors.ArgumentError) as info:
        A.rope("ROPE_LLAMA", **kw)
    text = str(info.value)
    assert text.startswith(f"{name} = {value!r} with pos_encoding_mode='ROPE_LLAMA'")
    assert "expected a finite value > 0" in text
    assert not isinstance(info.value, errors.UnsupportedError)


@pytest.mark.parametrize("value", ["1e4", b"1", [1.0], object()])
def test_rope_types_refused(value):
    with pytest.raises(TypeError,
                       match=f"rope_theta: {type(value).__name__}, expected a float or None"):
        A.rope("ROPE_LLAMA", 1.0, value)
