"""Attention variants from Python: custom logit transforms, masks, softmax initial states and
output transforms written in CUDA C, compiled into cinfer's kernels (``include/cinfer.h``,
"Attention variants").

A variant is declared once::

    import cinfer
    src = r'''
    #define VARIANT_LOGITS_TRANSFORM 1
    __device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,
        int batch_idx, int qo_idx, int kv_idx, int qo_head_idx, int kv_head_idx) {
        return logit + params->bias[qo_head_idx] * params->scale;
    }
    '''
    v = cinfer.Variant("head_bias", src, tensors=[("bias", "float32")],
                       scalars=[("scale", "float")])

and given to the attention functions: ``variant=`` where the kernel is chosen (the single
functions; the wrappers' ``plan``), its arguments where it runs (``variant_args=`` of the single
functions and the wrappers' ``run``; the wrappers' ``run`` also take them positionally after the
KV, as FlashInfer's ``run(q, kv, *args)`` does for its custom kernels)::

    o = cinfer.single_prefill_with_kv_cache(q, k, v_, causal=True, variant=v,
                                            variant_args=(bias, 0.5))
    o = cinfer.single_prefill_with_kv_cache(q, k, v_, causal=True, variant=v,
                                            variant_args={"bias": bias, "scale": 0.5})

``variant_args`` is a sequence in declaration order (tensors first, then scalars) or a mapping
from parameter names; a tensor parameter whose name starts with ``maybe_`` may be None or left
out of a mapping. The library checks the arguments at every run (count, kinds, dtypes, device,
contiguity) and its message becomes a ``ValueError``; Python-level type mistakes (a number for a
tensor parameter, an unknown parameter name) are ``TypeError``. A compile error in the source is
reported by the first call that needs the kernel (a wrapper's ``plan``, a single function's
call) as :class:`cinfer.CompileError` with NVRTC's log, lines numbered from 1 under the file name
``variant:NAME``.

The built-in example variants (:func:`variant_builtin`): ``"sigmoid"`` (no softmax; scalars
``scale``, ``bias``), ``"sinks"`` (tensor ``sinks`` [num_qo_heads] float32, natural-log units),
``"alibi"`` (tensor ``maybe_alibi_slopes`` [num_qo_heads] float32 or None, scalar int32
``num_heads``), ``"dump_logits"``, ``"custom_mask"`` (tensors uint8 ``packed_mask``, int64
``row_offset`` [batch], int32 ``row_stride`` [batch]). FlashInfer's ``pos_encoding_mode="ALIBI"``
and ``custom_mask`` / ``packed_custom_mask`` arguments run ``"alibi"`` and ``"custom_mask"`` with
arguments cinfer fills itself (:mod:`cinfer._masks`).
"""

from __future__ import annotations

import ctypes
import operator
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib
from . import _tensor as T
from .errors import INVALID_ARGUMENT, ArgumentError

# DLPack (code, bits) of the parameter types cinfer knows, and their names.
_TYPES: Dict[str, Tuple[int, int]] = {
    "float16": (_lib.KDL_FLOAT, 16),
    "bfloat16": (_lib.KDL_BFLOAT, 16),
    "float32": (_lib.KDL_FLOAT, 32),
    "float64": (_lib.KDL_FLOAT, 64),
    "int32": (_lib.KDL_INT, 32),
    "int64": (_lib.KDL_INT, 64),
    "uint32": (_lib.KDL_UINT, 32),
    "uint8": (_lib.KDL_UINT, 8),
}
# C spellings accepted for scalars (and tensors), mapped to the names above.
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "int": "int32",
    "int32_t": "int32",
    "int64_t": "int64",
    "uint32_t": "uint32",
    "uint8_t": "uint8",
}
_NAMES = {cb: name for name, cb in _TYPES.items()}
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
               "uint32": (0, 2**32 - 1)}

ParamDecl = Tuple[str, Any]
# The types a scalar parameter may have (include/cinfer.h, "Variants").
_SCALAR_TYPES = ("float32", "float64", "int32", "int64", "uint32")


def _decls(name: str, what: str, items, kind: int):
    """(parameter name, kind, type) of each (name, type) pair of ``items``; TypeError naming the
    item that is not such a pair."""
    if isinstance(items, (str, bytes)):
        raise TypeError(f"Variant {name}: {what} must be a sequence of (name, type) pairs, got "
                        f"{type(items).__name__} {items!r}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"Variant {name}: {what}[{i}] must be a (name, type) pair, got "
                            f"{item!r}")
        out.append((item[0], kind, item[1]))
    return out


def _type_name(dtype, what: str) -> str:
    """The cinfer type name of a torch dtype, a type name or a C spelling."""
    text = str(dtype)
    if text.startswith("torch."):
        text = text[len("torch."):]
    text = _ALIASES.get(text, text)
    if text not in _TYPES:
        raise ArgumentError(
            f"{what}: type {dtype!r} is not a cinfer parameter type (tensors: float16, bfloat16, "
            "float32, float64, int32, int64, uint32, uint8; scalars: float/float32, "
            "double/float64, int32, int64, uint32)"
        )
    return text


class Variant:
    r"""An attention variant: a name, CUDA C source defining hooks, and parameter declarations.

    Parameters
    ----------
    name : str
        A C identifier of at most 63 characters (it appears in kernel names).
    source : str
        CUDA C defining any of the hooks of ``include/cinfer.h`` (``variant_query_transform``,
        ``variant_logits_transform``, ``variant_logits_mask``, ``variant_logits_mask_bits``,
        ``variant_logits_mask_row``, ``variant_alibi_slope``, ``variant_state_init``,
        ``variant_output_transform``, and ``VARIANT_USE_SOFTMAX 0``), each announced with its
        ``#define`` (``VARIANT_QUERY_TRANSFORM 1`` and so on). The parameters are
        members of ``const cinfer_variant_params *params``: a tensor is a pointer to its element
        0, a scalar is a value.
    tensors : sequence of (str, dtype)
        Tensor parameters in order: name and element type (a torch dtype or its name:
        ``float16``, ``bfloat16``, ``float32``, ``float64``, ``int32``, ``int64``, ``uint32``,
        ``uint8``). A name starting with ``maybe_`` may be given None at run.
    scalars : sequence of (str, type)
        Scalar parameters in order, after the tensors: name and C type (``"float"``/
        ``"float32"``, ``"double"``/``"float64"``, ``"int32"``, ``"int64"``, ``"uint32"``).

    Raises
    ------
    ValueError
        The library's message for a bad name, a repeated or malformed parameter name, a type it
        does not take, more than 32 parameters (:class:`cinfer.ArgumentError`).
    TypeError
        ``name`` or ``source`` is not a string, or ``tensors`` / ``scalars`` is not a sequence
        of (name, type) pairs.

    Notes
    -----
    Creating a variant checks the declaration but compiles nothing (no GPU needed); the source
    is compiled by the first call that needs a kernel with it. A variant must outlive every
    wrapper plan made with it (the wrappers keep a reference).
    """

    def __init__(self, name: str, source: str, tensors: Sequence[ParamDecl] = (),
                 scalars: Sequence[ParamDecl] = ()) -> None:
        self._handle: Optional[int] = None
        self._builtin = False
        if not isinstance(name, str) or not isinstance(source, str):
            raise TypeError("Variant(name, source, ...): name and source must be str")
        decls = (_decls(name, "tensors", tensors, _lib.PARAM_TENSOR)
                 + _decls(name, "scalars", scalars, _lib.PARAM_SCALAR))
        params = (_lib.Param * max(len(decls), 1))()
        names = []  # keeps the encoded names alive during the call
        for i, (pname, kind, t) in enumerate(decls):
            if not isinstance(pname, str):
                raise TypeError(f"Variant {name}: parameter {i} name must be str, got "
                                f"{type(pname).__name__}")
            names.append(pname.encode())
            type_name = _type_name(t, f"Variant {name}: parameter {pname}")
            if kind == _lib.PARAM_SCALAR and type_name not in _SCALAR_TYPES:
                raise ArgumentError(
                    f"Variant {name}: params[{i}] (scalar {pname}): type {t!r} is not a scalar "
                    f"type (expected {', '.join(_SCALAR_TYPES)}, or float, double, int, "
                    "int64_t, uint32_t)", INVALID_ARGUMENT
                )
            code, bits = _TYPES[type_name]
            params[i].name = names[-1]
            params[i].kind = kind
            params[i].dtype = _lib.DLDataType(code, bits, 1)
        lib = _lib.lib()
        out = ctypes.c_void_p()
        _lib.check(lib.cinfer_variant_create(name.encode(), source.encode(), params, len(decls),
                                             ctypes.byref(out)), "Variant")
        self._handle = out.value
        self._read_back()

    @classmethod
    def _wrap_builtin(cls, handle: int) -> "Variant":
        self = cls.__new__(cls)
        self._handle = handle
        self._builtin = True
        self._read_back()
        return self

    def _read_back(self) -> None:
        """The name, source and declarations as the library holds them."""
        lib = _lib.lib()
        self.name: str = lib.cinfer_variant_name(self._handle).decode()
        self.source: str = lib.cinfer_variant_source(self._handle).decode()
        n = ctypes.c_int()
        arr = lib.cinfer_variant_params(self._handle, ctypes.byref(n))
        params = []
        for i in range(n.value):
            p = arr[i]
            kind = "tensor" if p.kind == _lib.PARAM_TENSOR else "scalar"
            params.append((p.name.decode(), kind,
                           _NAMES.get((p.dtype.code, p.dtype.bits), "unknown")))
        self._params: List[Tuple[str, str, str]] = params

    @property
    def handle(self) -> int:
        """The ``cinfer_variant_t *`` (for ``cinfer_attention_options_t.variant``)."""
        return self._handle

    @property
    def params(self) -> List[Tuple[str, str, str]]:
        """The declared parameters in order: ``(name, "tensor" | "scalar", type name)``."""
        return list(self._params)

    @property
    def is_builtin(self) -> bool:
        return self._builtin

    def __repr__(self) -> str:
        decl = ", ".join(f"{k} {t} {n}" for n, k, t in self._params)
        return f"cinfer.Variant({self.name!r}: {decl or 'no parameters'})"

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None and not getattr(self, "_builtin", True):
            try:
                _lib.lib().cinfer_variant_destroy(handle)
            except Exception:  # interpreter shutdown: the library may already be unloaded
                pass


_builtins: Dict[str, Variant] = {}


def variant_builtin(name: str) -> Variant:
    r"""A built-in example variant of the library (owned by it).

    Parameters
    ----------
    name : str
        ``"sigmoid"`` (no softmax: ``w = 1 / (1 + exp(-(logit * scale + bias)))``, scalars
        float ``scale``, float ``bias``; no LSE), ``"sinks"`` (one logit per query head in the
        softmax denominator: tensor float32 ``sinks`` ``[num_qo_heads]``), ``"alibi"``
        (``logit + slope[h] * (kv_idx - qo_idx)``: tensor float32 ``maybe_alibi_slopes``
        ``[num_qo_heads]`` or None for the paper's slopes, scalar int32 ``num_heads``),
        ``"dump_logits"`` or ``"custom_mask"`` (bit ``row_offset[b] + qo_idx * row_stride[b] +
        kv_idx`` of the little-bit-order ``packed_mask`` keeps a position; tensors uint8
        ``packed_mask``, int64 ``row_offset`` and int32 ``row_stride`` ``[batch]``).

    Raises
    ------
    TypeError
        ``name`` is not a str.
    ValueError
        An unknown name.
    """
    if not isinstance(name, str):
        raise TypeError(f"variant_builtin: name is {type(name).__name__}, expected a str")
    v = _builtins.get(name)
    if v is None:
        handle = _lib.lib().cinfer_variant_builtin(str(name).encode())
        if not handle:
            raise ArgumentError(
                f"variant_builtin: no built-in variant {name!r} (sigmoid, sinks, alibi, "
                "dump_logits, custom_mask)"
            )
        v = _builtins.setdefault(name, Variant._wrap_builtin(handle))
    return v


def check_variant(variant, where: str) -> Optional[Variant]:
    """``variant`` if it is a :class:`Variant` or None; a built-in name (str) is looked up;
    anything else is a TypeError."""
    if variant is None or isinstance(variant, Variant):
        return variant
    if isinstance(variant, str):
        return variant_builtin(variant)
    raise TypeError(f"{where}: variant must be a cinfer.Variant, a built-in name or None, got "
                    f"{type(variant).__name__}")


def _is_tensor(x) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(x, torch.Tensor)) or hasattr(x, "__dlpack__")


def _scalar(value, type_name: str, where: str, pname: str, arg: "_lib.Arg") -> None:
    """Fills ``arg`` with ``value`` converted to the declared scalar type."""
    code, bits = _TYPES.get(type_name, (None, None))
    if code is None:  # a declaration the library would have refused; keep its check
        raise ArgumentError(f"{where}: scalar {pname} has type {type_name}")
    arg.dtype = _lib.DLDataType(code, bits, 1)
    if type_name in ("float32", "float64"):
        try:
            if isinstance(value, (str, bytes, bool)):  # float() would take "2" and True
                raise TypeError
            x = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{where}: variant argument {pname} is a {type_name} scalar, got "
                            f"{type(value).__name__}") from None
        if type_name == "float32":
            arg.value.f32 = x
        else:
            arg.value.f64 = x
        return
    try:
        if isinstance(value, bool):  # operator.index would take True as 1
            raise TypeError
        x = operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: variant argument {pname} is an {type_name} scalar, got "
                        f"{type(value).__name__} (an integer is expected)") from None
    lo, hi = _INT_RANGES[type_name]
    if not lo <= x <= hi:
        raise ArgumentError(f"{where}: variant argument {pname} = {x} is outside the "
                            f"{type_name} range")
    setattr(arg.value, {"int32": "i32", "int64": "i64", "uint32": "u32"}[type_name], x)


class PackedArgs:
    """A ``cinfer_args_t`` and what it points to (tensor views, the argument array), kept
    alive together for the duration of a C call (or of a CUDA graph capture: the pointers are
    baked into the graph, so the tensors themselves must stay alive as long as it)."""

    __slots__ = ("args", "_keep")

    def __init__(self, args, keep) -> None:
        self.args = args
        self._keep = keep

    def ref(self):
        return ctypes.byref(self.args) if self.args is not None else None


def run_args(args: tuple, variant_args, where: str):
    """The variant arguments of a wrapper's ``run``: its ``*args`` (FlashInfer's way) or its
    ``variant_args`` keyword, not both."""
    if args and variant_args is not None:
        raise TypeError(f"{where}: variant arguments given both positionally (*args) and as "
                        "variant_args; use one")
    return variant_args if variant_args is not None else (tuple(args) or None)


def pack_args(variant: Optional[Variant],
              args: Union[Sequence[Any], Mapping[str, Any], None],
              where: str) -> PackedArgs:
    r"""Converts Python variant arguments to a ``cinfer_args_t``.

    ``args``: None or empty (no arguments), a sequence in declaration order, or a mapping from
    parameter names (``maybe_*`` tensors may be left out). Tensors become DLTensor views (no
    copy); numbers are converted to the declared C type. The library checks the result at run
    (count, kinds, dtypes, device, contiguity); its message becomes a ValueError.
    """
    params = variant.params if variant is not None else []
    vname = variant.name if variant is not None else "default attention"
    if args is None:
        values: List[Any] = []
    elif isinstance(args, Mapping):
        by_name = {p[0]: i for i, p in enumerate(params)}
        unknown = [k for k in args if k not in by_name]
        if unknown:
            declared = ", ".join(p[0] for p in params) or "none"
            raise TypeError(f"{where}: variant {vname} has no parameter {unknown[0]!r} "
                            f"(declared: {declared})")
        missing = [p[0] for p in params
                   if p[0] not in args and not (p[1] == "tensor" and p[0].startswith("maybe_"))]
        if missing:
            raise TypeError(f"{where}: variant {vname}: missing argument(s) "
                            f"{', '.join(missing)}")
        values = [args.get(p[0]) for p in params]
    elif isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(f"{where}: variant_args must be a sequence (declaration order) or a "
                        f"mapping (by name), got {type(args).__name__}")
    else:
        values = list(args)
    if not values:
        return PackedArgs(None, None)

    arr = (_lib.Arg * len(values))()
    keep: List[Any] = [arr]
    for i, value in enumerate(values):
        a = arr[i]
        decl = params[i] if i < len(params) else None
        pname = decl[0] if decl else f"#{i}"
        tensor_param = decl[1] == "tensor" if decl else (value is None or _is_tensor(value))
        if tensor_param:
            a.kind = _lib.PARAM_TENSOR
            a.dtype = _lib.DLDataType(_lib.KDL_FLOAT, 0, 0)
            if value is None:
                continue  # NULL: the library accepts it for maybe_* parameters only
            if not _is_tensor(value):
                raise TypeError(f"{where}: variant argument {i} ({pname}) is a tensor parameter "
                                f"of variant {vname}, got {type(value).__name__}")
            t = T.as_tensor(value, pname)
            dl = T.to_dl(t, pname)
            keep += [t, dl]
            a.tensor = ctypes.pointer(dl)
        else:
            if _is_tensor(value) or value is None:
                raise TypeError(f"{where}: variant argument {i} ({pname}) is a scalar parameter "
                                f"of variant {vname}, got "
                                f"{'None' if value is None else 'a tensor'}")
            a.kind = _lib.PARAM_SCALAR
            if decl is None:  # beyond the declaration: the library reports the count
                type_name = "float64" if isinstance(value, float) else "int64"
            else:
                type_name = decl[2]
            _scalar(value, type_name, where, pname, a)
    packed = _lib.Args(len(values), ctypes.cast(arr, ctypes.POINTER(_lib.Arg)))
    return PackedArgs(packed, keep)


__all__ = ["Variant", "variant_builtin"]
