"""Variant declarations and argument packing against the real library, without a GPU: creating a
variant needs no device, and packing is pure Python over ctypes (the library checks the packed
list at run, which the GPU suites cover)."""

import ctypes

import pytest

from cinfer import _lib, errors


@pytest.fixture(scope="module")
def lib():
    try:
        return _lib.lib()
    except errors.CinferError as e:
        pytest.skip(f"libcinfer.so not available: {e}")


SRC = """
#define VARIANT_LOGITS_TRANSFORM 1
__device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,
    int batch_idx, int qo_idx, int kv_idx, int qo_head_idx, int kv_head_idx) {
    return logit * params->scale + params->bias[qo_head_idx];
}
"""


def test_variant_create_and_read_back(lib):
    import cinfer

    v = cinfer.Variant("head_bias", SRC, tensors=[("bias", "float32"), ("maybe_x", "int64")],
                       scalars=[("scale", "float"), ("n", "int32"), ("d", "double"),
                                ("u", "uint32_t")])
    assert v.name == "head_bias" and v.source == SRC and not v.is_builtin
    assert v.params == [("bias", "tensor", "float32"), ("maybe_x", "tensor", "int64"),
                        ("scale", "scalar", "float32"), ("n", "scalar", "int32"),
                        ("d", "scalar", "float64"), ("u", "scalar", "uint32")]
    assert "head_bias" in repr(v) and v.handle
    del v  # destroyed through the library


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="1bad", source=""), "C identifier"),
    (dict(name="v", source="", tensors=[("a", "float32"), ("a", "float32")]), "repeats"),
    (dict(name="v", source="", scalars=[("s", "float16")]), "scalar s"),
    (dict(name="v", source="", scalars=[("s", "half")]), r"scalar s\): type 'half' is not a scalar"),
    (dict(name="v", source="", tensors=[("has space", "float32")]), "C identifier"),
])
def test_variant_declaration_errors_carry_the_library_message(lib, kwargs, match):
    import cinfer

    with pytest.raises(ValueError, match=match) as info:
        cinfer.Variant(**kwargs)
    assert info.value.status == errors.INVALID_ARGUMENT


def test_variant_python_errors(lib):
    import cinfer

    with pytest.raises(ValueError, match="not a cinfer parameter type"):
        cinfer.Variant("v", "", tensors=[("a", "complex64")])
    with pytest.raises(TypeError):
        cinfer.Variant("v", 3)
    with pytest.raises(TypeError, match=r"tensors must be a sequence of \(name, type\) pairs"):
        cinfer.Variant("v", "", tensors="abc")
    with pytest.raises(TypeError, match=r"scalars\[1\] must be a \(name, type\) pair"):
        cinfer.Variant("v", "", scalars=[("a", "float32"), "b"])
    with pytest.raises(ValueError, match="no built-in"):
        cinfer.variant_builtin("nope")
    with pytest.raises(TypeError, match="name is NoneType, expected a str"):
        cinfer.variant_builtin(None)


def test_builtins(lib):
    import cinfer

    assert cinfer.variant_builtin("sinks").params == [("sinks", "tensor", "float32")]
    assert cinfer.variant_builtin("sigmoid").params == [("scale", "scalar", "float32"),
                                                        ("bias", "scalar", "float32")]
    alibi = cinfer.variant_builtin("alibi")
    assert alibi.params == [("maybe_alibi_slopes", "tensor", "float32"),
                            ("num_heads", "scalar", "int32")]
    assert alibi.is_builtin and cinfer.variant_builtin("alibi") is alibi
    assert "VARIANT_ALIBI_SLOPE" in alibi.source


def _arg(packed, i):
    return packed.args.args[i]


def test_pack_scalars(lib):
    import cinfer
    from cinfer import variant as V

    v = cinfer.Variant("s", "", scalars=[("f", "float"), ("d", "double"), ("i", "int32"),
                                         ("l", "int64"), ("u", "uint32")])
    for given in ((0.5, 2.25, -3, 2**40, 7),
                  {"u": 7, "l": 2**40, "i": -3, "d": 2.25, "f": 0.5}):
        packed = V.pack_args(v, given, "t")
        assert packed.args.num_args == 5
        a = [_arg(packed, i) for i in range(5)]
        assert all(x.kind == _lib.PARAM_SCALAR for x in a)
        assert (a[0].value.f32, a[1].value.f64, a[2].value.i32, a[3].value.i64,
                a[4].value.u32) == (0.5, 2.25, -3, 2**40, 7)
        assert [(x.dtype.code, x.dtype.bits) for x in a] == [
            (_lib.KDL_FLOAT, 32), (_lib.KDL_FLOAT, 64), (_lib.KDL_INT, 32), (_lib.KDL_INT, 64),
            (_lib.KDL_UINT, 32)]
    with pytest.raises(TypeError, match="integer"):
        V.pack_args(v, (0.5, 2.0, 1.5, 1, 1), "t")
    with pytest.raises(TypeError, match="integer"):  # a bool is not taken as 1
        V.pack_args(v, (0.5, 2.0, True, 1, 1), "t")
    for bad in ("0.5", True):  # float() would take both
        with pytest.raises(TypeError, match=f"f is a float32 scalar, got {type(bad).__name__}"):
            V.pack_args(v, (bad, 2.0, 1, 1, 1), "t")
    with pytest.raises(ValueError, match="range"):
        V.pack_args(v, (0.5, 2.0, 2**31, 1, 1), "t")
    with pytest.raises(ValueError, match="range"):
        V.pack_args(v, (0.5, 2.0, 1, 1, -1), "t")
    with pytest.raises(TypeError, match="no parameter 'x'"):
        V.pack_args(v, {"x": 1}, "t")
    with pytest.raises(TypeError, match="missing"):
        V.pack_args(v, {"f": 1.0}, "t")
    with pytest.raises(TypeError, match="sequence"):
        V.pack_args(v, 1.0, "t")
    # Too few or too many positionally: packed as given, the library reports the count at run.
    assert V.pack_args(v, (1.0,), "t").args.num_args == 1
    extra = V.pack_args(v, (1.0, 2.0, 3, 4, 5, 6.5), "t")
    assert extra.args.num_args == 6 and _arg(extra, 5).value.f64 == 6.5
    assert V.pack_args(None, None, "t").ref() is None
    assert V.pack_args(v, (), "t").ref() is None
    with pytest.raises(TypeError, match="both"):
        V.run_args((1.0,), (1.0,), "t")
    assert V.run_args((), None, "t") is None and V.run_args((1,), None, "t") == (1,)


def test_pack_tensors(lib):
    torch = pytest.importorskip("torch")
    import cinfer
    from cinfer import variant as V

    alibi = cinfer.variant_builtin("alibi")
    slopes = torch.rand(8)
    packed = V.pack_args(alibi, (slopes, 8), "t")
    a0, a1 = _arg(packed, 0), _arg(packed, 1)
    assert a0.kind == _lib.PARAM_TENSOR and a0.tensor.contents.data == slopes.data_ptr()
    assert list(a0.tensor.contents.shape[:1]) == [8] and a1.value.i32 == 8
    # maybe_* tensors may be None, or left out of a mapping.
    for given in ((None, 8), {"num_heads": 8}):
        packed = V.pack_args(alibi, given, "t")
        assert not _arg(packed, 0).tensor  # NULL
    with pytest.raises(TypeError, match="tensor parameter"):
        V.pack_args(alibi, (1.0, 8), "t")
    with pytest.raises(TypeError, match="scalar parameter"):
        V.pack_args(alibi, (slopes, slopes), "t")
    # 64-bit and float64 tensors convert (variant parameter types).
    v = cinfer.Variant("t64", "", tensors=[("a", torch.int64), ("b", torch.float64)])
    packed = V.pack_args(v, (torch.zeros(2, dtype=torch.int64), torch.zeros(3).double()), "t")
    assert (packed.args.args[1].tensor.contents.dtype.bits,
            packed.args.args[1].tensor.contents.dtype.code) == (64, _lib.KDL_FLOAT)
    assert ctypes.sizeof(_lib.Arg) == 32
