"""ctypes declarations of the C API (include/cinfer.h) and loading of libcinfer.so.

The library is looked up, in order, at:

1. ``$CINFER_LIBRARY`` (a full path);
2. ``libcinfer.so`` next to this module (an installed wheel);
3. ``../build/libcinfer.so`` relative to the ``python/`` folder (the CMake build tree).

It is loaded at the first call that needs it, not at import, so ``import cinfer`` works on a
machine where the library has not been built yet.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import List, Optional

from . import errors

# ---------------------------------------------------------------------------------------------
# DLPack (dlpack/dlpack.h, the 0.6 layout; DLTensor is unchanged in DLPack 1.x)
# ---------------------------------------------------------------------------------------------

# DLDeviceType
KDL_CPU = 1
KDL_CUDA = 2

# DLDataTypeCode; the fp8 and bool codes are DLPack 1.x's, which cinfer accepts.
KDL_INT = 0
KDL_UINT = 1
KDL_FLOAT = 2
KDL_BFLOAT = 4
KDL_BOOL = 6
KDL_FLOAT8_E4M3FN = 10
KDL_FLOAT8_E5M2 = 12


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# ---------------------------------------------------------------------------------------------
# cinfer.h structs. Sizes and offsets are checked below against what the header gives on an LP64
# target (x86-64, aarch64): a field added to the header without updating this file fails at import.
# ---------------------------------------------------------------------------------------------

CONTEXT_OPTIONS_VERSION = 1
ATTENTION_OPTIONS_VERSION = 4
MLA_OPTIONS_VERSION = 1
# cinfer_pos_encoding_t
POS_ENCODING_NONE = 0
POS_ENCODING_ROPE_LLAMA = 1
JIT_STATS_VERSION = 1
APPEND_OPTIONS_VERSION = 1
ROPE_OPTIONS_VERSION = 1

KV_LAYOUT_NHD = 0
KV_LAYOUT_HND = 1

# cinfer_kv_storage_t
KV_STORAGE_RAGGED = 0
KV_STORAGE_PAGED = 1

# cinfer_param_kind_t
PARAM_TENSOR = 1
PARAM_SCALAR = 2


class ContextOptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32), ("device", ctypes.c_int)]


class AttentionOptions(ctypes.Structure):
    """cinfer_attention_options_t; :func:`attention_options` fills it like
    CINFER_ATTENTION_OPTIONS_INIT."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("num_qo_heads", ctypes.c_int),
        ("num_kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("page_size", ctypes.c_int),
        ("kv_layout", ctypes.c_int),  # cinfer_kv_layout_t, an int-sized enum
        ("q_dtype", DLDataType),
        ("kv_dtype", DLDataType),
        ("sm_scale", ctypes.c_float),
        ("logits_soft_cap", ctypes.c_float),
        ("window_left", ctypes.c_int),
        ("k_scale", ctypes.c_float),
        ("v_scale", ctypes.c_float),
        ("use_cuda_graph", ctypes.c_int),
        ("max_batch_size", ctypes.c_int),
        ("use_tensor_cores", ctypes.c_int),  # -1 = the library chooses
        ("variant", ctypes.c_void_p),  # const cinfer_variant_t *, NULL = default attention
        ("pos_encoding_mode", ctypes.c_int),  # cinfer_pos_encoding_t: 0 none, 1 ROPE_LLAMA
        ("rope_scale", ctypes.c_float),
        ("rope_theta", ctypes.c_float),
        ("head_dim_vo", ctypes.c_int),  # 0 = head_dim; single and batch prefill
    ]


class MlaOptions(ctypes.Structure):
    """cinfer_mla_options_t; :func:`mla_options` fills it like CINFER_MLA_OPTIONS_INIT."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("num_heads", ctypes.c_int),
        ("head_dim_ckv", ctypes.c_int),
        ("head_dim_kpe", ctypes.c_int),
        ("page_size", ctypes.c_int),
        ("q_dtype", DLDataType),
        ("kv_dtype", DLDataType),
        ("sm_scale", ctypes.c_float),
        ("use_cuda_graph", ctypes.c_int),
        ("max_batch_size", ctypes.c_int),
    ]


class AppendOptions(ctypes.Structure):
    """cinfer_append_options_t; :func:`append_options` fills it like CINFER_APPEND_OPTIONS_INIT."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("kv_layout", ctypes.c_int),  # cinfer_kv_layout_t
        ("page_size", ctypes.c_int),
        ("k_scale", ctypes.c_float),
        ("v_scale", ctypes.c_float),
    ]


class RopeOptions(ctypes.Structure):
    """cinfer_rope_options_t; :func:`rope_options` fills it like CINFER_ROPE_OPTIONS_INIT or
    CINFER_LLAMA31_ROPE_OPTIONS_INIT."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("rotary_dim", ctypes.c_int),
        ("interleave", ctypes.c_int),
        ("rope_scale", ctypes.c_float),
        ("rope_theta", ctypes.c_float),
        ("low_freq_factor", ctypes.c_float),
        ("high_freq_factor", ctypes.c_float),
        ("old_context_len", ctypes.c_float),
    ]


class Param(ctypes.Structure):
    """cinfer_param_t: one declared parameter of a variant."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("kind", ctypes.c_int),  # cinfer_param_kind_t
        ("dtype", DLDataType),
    ]


class ArgValue(ctypes.Union):
    """The value union of cinfer_arg_t."""

    _fields_ = [
        ("f32", ctypes.c_float),
        ("f64", ctypes.c_double),
        ("i32", ctypes.c_int32),
        ("i64", ctypes.c_int64),
        ("u32", ctypes.c_uint32),
    ]


class Arg(ctypes.Structure):
    """cinfer_arg_t: one run-time variant argument."""

    _fields_ = [
        ("kind", ctypes.c_int),  # cinfer_param_kind_t
        ("tensor", ctypes.POINTER(DLTensor)),
        ("dtype", DLDataType),
        ("value", ArgValue),
    ]


class Args(ctypes.Structure):
    """cinfer_args_t: a run's variant argument list."""

    _fields_ = [("num_args", ctypes.c_int), ("args", ctypes.POINTER(Arg))]


class JitStats(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("memory_hits", ctypes.c_uint64),
        ("disk_hits", ctypes.c_uint64),
        ("aot_hits", ctypes.c_uint64),
        ("misses", ctypes.c_uint64),
        ("compiles", ctypes.c_uint64),
        ("compile_seconds", ctypes.c_double),
        ("cache_write_fails", ctypes.c_uint64),
    ]


# What sizeof/offsetof give for the C structs on LP64 (measured with a probe compiled against
# include/cinfer.h; tests/test_package.py recompiles that probe when a C compiler is present).
LAYOUT = {
    "DLDevice": 8,
    "DLDataType": 4,
    "DLTensor": 48,
    "DLTensor.shape": 24,
    "DLTensor.byte_offset": 40,
    "cinfer_context_options_t": 16,
    "cinfer_attention_options_t": 96,
    "cinfer_attention_options_t.kv_layout": 28,
    "cinfer_attention_options_t.q_dtype": 32,
    "cinfer_attention_options_t.sm_scale": 40,
    "cinfer_attention_options_t.k_scale": 52,
    "cinfer_attention_options_t.max_batch_size": 64,
    "cinfer_attention_options_t.use_tensor_cores": 68,
    "cinfer_attention_options_t.variant": 72,
    "cinfer_attention_options_t.pos_encoding_mode": 80,
    "cinfer_attention_options_t.rope_theta": 88,
    "cinfer_jit_stats_t": 72,
    "cinfer_mla_options_t": 48,
    "cinfer_mla_options_t.q_dtype": 28,
    "cinfer_mla_options_t.sm_scale": 36,
    "cinfer_mla_options_t.max_batch_size": 44,
    "cinfer_append_options_t": 32,
    "cinfer_append_options_t.kv_layout": 12,
    "cinfer_append_options_t.k_scale": 20,
    "cinfer_rope_options_t": 40,
    "cinfer_rope_options_t.rotary_dim": 12,
    "cinfer_rope_options_t.rope_scale": 20,
    "cinfer_rope_options_t.old_context_len": 36,
    "cinfer_param_t": 16,
    "cinfer_param_t.kind": 8,
    "cinfer_param_t.dtype": 12,
    "cinfer_arg_t": 32,
    "cinfer_arg_t.tensor": 8,
    "cinfer_arg_t.dtype": 16,
    "cinfer_arg_t.value": 24,
    "cinfer_args_t": 16,
    "cinfer_args_t.args": 8,
}


def _layout_of_ctypes() -> dict:
    return {
        "DLDevice": ctypes.sizeof(DLDevice),
        "DLDataType": ctypes.sizeof(DLDataType),
        "DLTensor": ctypes.sizeof(DLTensor),
        "DLTensor.shape": DLTensor.shape.offset,
        "DLTensor.byte_offset": DLTensor.byte_offset.offset,
        "cinfer_context_options_t": ctypes.sizeof(ContextOptions),
        "cinfer_attention_options_t": ctypes.sizeof(AttentionOptions),
        "cinfer_attention_options_t.kv_layout": AttentionOptions.kv_layout.offset,
        "cinfer_attention_options_t.q_dtype": AttentionOptions.q_dtype.offset,
        "cinfer_attention_options_t.sm_scale": AttentionOptions.sm_scale.offset,
        "cinfer_attention_options_t.k_scale": AttentionOptions.k_scale.offset,
        "cinfer_attention_options_t.max_batch_size": AttentionOptions.max_batch_size.offset,
        "cinfer_attention_options_t.use_tensor_cores": AttentionOptions.use_tensor_cores.offset,
        "cinfer_attention_options_t.variant": AttentionOptions.variant.offset,
        "cinfer_attention_options_t.pos_encoding_mode": AttentionOptions.pos_encoding_mode.offset,
        "cinfer_attention_options_t.rope_theta": AttentionOptions.rope_theta.offset,
        "cinfer_jit_stats_t": ctypes.sizeof(JitStats),
        "cinfer_mla_options_t": ctypes.sizeof(MlaOptions),
        "cinfer_mla_options_t.q_dtype": MlaOptions.q_dtype.offset,
        "cinfer_mla_options_t.sm_scale": MlaOptions.sm_scale.offset,
        "cinfer_mla_options_t.max_batch_size": MlaOptions.max_batch_size.offset,
        "cinfer_append_options_t": ctypes.sizeof(AppendOptions),
        "cinfer_append_options_t.kv_layout": AppendOptions.kv_layout.offset,
        "cinfer_append_options_t.k_scale": AppendOptions.k_scale.offset,
        "cinfer_rope_options_t": ctypes.sizeof(RopeOptions),
        "cinfer_rope_options_t.rotary_dim": RopeOptions.rotary_dim.offset,
        "cinfer_rope_options_t.rope_scale": RopeOptions.rope_scale.offset,
        "cinfer_rope_options_t.old_context_len": RopeOptions.old_context_len.offset,
        "cinfer_param_t": ctypes.sizeof(Param),
        "cinfer_param_t.kind": Param.kind.offset,
        "cinfer_param_t.dtype": Param.dtype.offset,
        "cinfer_arg_t": ctypes.sizeof(Arg),
        "cinfer_arg_t.tensor": Arg.tensor.offset,
        "cinfer_arg_t.dtype": Arg.dtype.offset,
        "cinfer_arg_t.value": Arg.value.offset,
        "cinfer_args_t": ctypes.sizeof(Args),
        "cinfer_args_t.args": Args.args.offset,
    }


if ctypes.sizeof(ctypes.c_void_p) == 8 and ctypes.sizeof(ctypes.c_long) == 8:
    _mismatch = {k: v for k, v in _layout_of_ctypes().items() if LAYOUT[k] != v}
    if _mismatch:
        raise ImportError(
            f"cinfer: ctypes struct layout differs from include/cinfer.h: {_mismatch} "
            f"(expected {LAYOUT})"
        )


def mla_options(**fields) -> MlaOptions:
    """A cinfer_mla_options_t with CINFER_MLA_OPTIONS_INIT's defaults, then ``fields`` set on
    it."""
    o = MlaOptions(ctypes.sizeof(MlaOptions), MLA_OPTIONS_VERSION, 0, 512, 64, 64,
                   DLDataType(KDL_BFLOAT, 16, 1), DLDataType(KDL_BFLOAT, 16, 1), 0.0, 0, 1)
    for name, value in fields.items():
        setattr(o, name, value)
    return o


def attention_options(**fields) -> AttentionOptions:
    """A cinfer_attention_options_t with CINFER_ATTENTION_OPTIONS_INIT's defaults, then
    ``fields`` set on it."""
    o = AttentionOptions()
    o.size = ctypes.sizeof(AttentionOptions)
    o.version = ATTENTION_OPTIONS_VERSION
    o.page_size = 16
    o.kv_layout = KV_LAYOUT_NHD
    o.q_dtype = DLDataType(KDL_BFLOAT, 16, 1)
    o.kv_dtype = DLDataType(KDL_BFLOAT, 16, 1)
    o.sm_scale = 0.0
    o.logits_soft_cap = 0.0
    o.window_left = -1
    o.k_scale = 1.0
    o.v_scale = 1.0
    o.use_cuda_graph = 0
    o.max_batch_size = 1
    o.use_tensor_cores = -1
    o.variant = None
    o.pos_encoding_mode = POS_ENCODING_NONE
    o.rope_scale = 1.0
    o.rope_theta = 1e4
    o.head_dim_vo = 0
    for name, value in fields.items():
        setattr(o, name, value)
    return o


# Options structs of single-request calls by the fields they were built from: the C calls take
# the struct as const, so a call with an earlier call's fields passes that call's struct instead
# of building one (a few microseconds of host time). Shared, so never mutated after building;
# emptied when it holds _OPTIONS_CACHE_MAX.
_options_cache: dict = {}
_OPTIONS_CACHE_MAX = 256


def cached_attention_options(key: tuple, build) -> AttentionOptions:
    """``build()``'s options struct, built once per ``key`` and shared afterwards: read-only.
    ``key`` must name every input of ``build`` by value (a variant by its handle, not by its
    Python object, whose id a later variant may take)."""
    opts = _options_cache.get(key)
    if opts is None:
        opts = build()
        if len(_options_cache) >= _OPTIONS_CACHE_MAX:
            _options_cache.clear()
        _options_cache[key] = opts
    return opts


def append_options(**fields) -> AppendOptions:
    """A cinfer_append_options_t with CINFER_APPEND_OPTIONS_INIT's defaults (NHD, page size 16,
    scales 1), then ``fields`` set on it."""
    o = AppendOptions(ctypes.sizeof(AppendOptions), APPEND_OPTIONS_VERSION, KV_LAYOUT_NHD, 16,
                      1.0, 1.0)
    for name, value in fields.items():
        setattr(o, name, value)
    return o


def rope_options(llama31: bool = False, **fields) -> RopeOptions:
    """A cinfer_rope_options_t with the defaults of CINFER_ROPE_OPTIONS_INIT (scale 1, theta 1e4)
    or, with ``llama31``, CINFER_LLAMA31_ROPE_OPTIONS_INIT (scale 8, theta 5e5), then ``fields``
    set on it. Both: rotary_dim 0 (the head dim), rotate-half pairs, frequency factors 1 and 4,
    old context length 8192."""
    o = RopeOptions(ctypes.sizeof(RopeOptions), ROPE_OPTIONS_VERSION, 0, 0,
                    8.0 if llama31 else 1.0, 5e5 if llama31 else 1e4, 1.0, 4.0, 8192.0)
    for name, value in fields.items():
        setattr(o, name, value)
    return o


# ---------------------------------------------------------------------------------------------
# Loading and prototypes
# ---------------------------------------------------------------------------------------------

_c_status = ctypes.c_int
_p_tensor = ctypes.POINTER(DLTensor)
_p_options = ctypes.POINTER(AttentionOptions)
_vp = ctypes.c_void_p
_p_vp = ctypes.POINTER(ctypes.c_void_p)
_p_size = ctypes.POINTER(ctypes.c_size_t)
_p_i32 = ctypes.POINTER(ctypes.c_int32)
_p_append = ctypes.POINTER(AppendOptions)
_p_mla = ctypes.POINTER(MlaOptions)
_p_rope = ctypes.POINTER(RopeOptions)
_p_args = ctypes.POINTER(Args)
_p_param = ctypes.POINTER(Param)

# name: (restype, argtypes)
_PROTOTYPES = {
    "cinfer_version": (ctypes.c_int, []),
    "cinfer_version_string": (ctypes.c_char_p, []),
    "cinfer_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "cinfer_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "cinfer_last_error": (ctypes.c_char_p, []),
    "cinfer_context_create": (_c_status, [ctypes.POINTER(ContextOptions), _p_vp]),
    "cinfer_context_destroy": (None, [_vp]),
    "cinfer_context_get_device": (
        _c_status,
        [_vp, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
    ),
    "cinfer_jit_get_stats": (_c_status, [ctypes.POINTER(JitStats)]),
    "cinfer_cache_dir": (ctypes.c_char_p, []),
    "cinfer_merge_state": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_merge_state_in_place": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_merge_states": (_c_status, [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp]),
    "cinfer_batch_decode_workspace_size": (_c_status, [_vp, _p_options, _p_size]),
    "cinfer_batch_decode_create": (
        _c_status,
        [_vp, _p_options, _vp, ctypes.c_size_t, _p_vp],
    ),
    "cinfer_batch_decode_plan": (_c_status, [_vp, _p_i32, _p_i32, ctypes.c_int, _vp]),
    "cinfer_batch_decode_run": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor,
         _p_tensor, _p_args, _vp],
    ),
    "cinfer_batch_decode_destroy": (None, [_vp]),
    "cinfer_single_decode_workspace_size": (
        _c_status,
        [_vp, _p_options, ctypes.c_int64, _p_size],
    ),
    "cinfer_single_decode": (
        _c_status,
        [_vp, _p_options, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_args, _vp,
         ctypes.c_size_t, _vp],
    ),
    "cinfer_single_prefill": (
        _c_status,
        [_vp, _p_options, ctypes.c_int, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor,
         _p_args, _vp],
    ),
    "cinfer_single_prefill_workspace_size": (
        _c_status,
        [_vp, _p_options, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, _p_size],
    ),
    "cinfer_single_prefill_with_workspace": (
        _c_status,
        [_vp, _p_options, ctypes.c_int, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor,
         _p_args, _vp, ctypes.c_size_t, _vp],
    ),
    "cinfer_batch_prefill_workspace_size": (
        _c_status,
        [_vp, _p_options, ctypes.c_int, ctypes.c_int, ctypes.c_int64, _p_size],
    ),
    "cinfer_batch_prefill_create": (
        _c_status,
        [_vp, _p_options, ctypes.c_int, ctypes.c_int, ctypes.c_int64, _vp, ctypes.c_size_t,
         _p_vp],
    ),
    "cinfer_batch_prefill_plan": (_c_status, [_vp, _p_i32, _p_i32, _p_i32, ctypes.c_int, _vp]),
    "cinfer_batch_prefill_run": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_args, _vp],
    ),
    "cinfer_batch_prefill_destroy": (None, [_vp]),
    "cinfer_batch_mla_workspace_size": (
        _c_status,
        [_vp, _p_mla, ctypes.c_int, ctypes.c_int64, _p_size],
    ),
    "cinfer_batch_mla_create": (
        _c_status,
        [_vp, _p_mla, ctypes.c_int, ctypes.c_int64, _vp, ctypes.c_size_t, _p_vp],
    ),
    "cinfer_batch_mla_plan": (_c_status, [_vp, _p_i32, _p_i32, _p_i32, ctypes.c_int, _vp]),
    "cinfer_batch_mla_run": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_batch_mla_destroy": (None, [_vp]),
    "cinfer_variant_create": (
        _c_status,
        [ctypes.c_char_p, ctypes.c_char_p, _p_param, ctypes.c_int, _p_vp],
    ),
    "cinfer_variant_builtin": (_vp, [ctypes.c_char_p]),
    "cinfer_variant_name": (ctypes.c_char_p, [_vp]),
    "cinfer_variant_source": (ctypes.c_char_p, [_vp]),
    "cinfer_variant_params": (_p_param, [_vp, ctypes.POINTER(ctypes.c_int)]),
    "cinfer_variant_destroy": (None, [_vp]),
    "cinfer_append_paged_kv_cache": (
        _c_status,
        [_vp, _p_append, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor,
         _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_get_batch_indices_positions": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_get_seq_lens": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, ctypes.c_int, _p_tensor, _vp],
    ),
    "cinfer_apply_rope": (
        _c_status,
        [_vp, _p_rope, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_apply_llama31_rope": (
        _c_status,
        [_vp, _p_rope, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_apply_rope_pos_ids": (
        _c_status,
        [_vp, _p_rope, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_apply_llama31_rope_pos_ids": (
        _c_status,
        [_vp, _p_rope, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _vp],
    ),
    "cinfer_apply_rope_with_cos_sin_cache": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, _p_tensor, ctypes.c_int,
         _vp],
    ),
    "cinfer_packbits": (_c_status, [_vp, _p_tensor, ctypes.c_int, _p_tensor, _vp]),
    "cinfer_segment_packbits": (
        _c_status,
        [_vp, _p_tensor, _p_tensor, ctypes.c_int, _p_tensor, _p_tensor, _vp],
    ),
}

_lock = threading.RLock()
_lib: Optional[ctypes.CDLL] = None


def candidate_paths() -> List[Path]:
    """The paths tried for libcinfer.so, in order."""
    paths = []
    env = os.environ.get("CINFER_LIBRARY")
    if env:
        paths.append(Path(env))
    here = Path(__file__).resolve().parent
    paths.append(here / "libcinfer.so")
    # A source checkout (python/cinfer in the repository, installed editable or not at all) finds
    # the library of its build folder; an installed copy (site-packages) has no such folder.
    if (here.parent.parent / "CMakeLists.txt").is_file():
        paths.append(here.parent.parent / "build" / "libcinfer.so")
    return paths


def library_path() -> Path:
    """The libcinfer.so that is (or would be) loaded; raises :class:`~cinfer.CinferError` if
    none of :func:`candidate_paths` exists."""
    env = os.environ.get("CINFER_LIBRARY")
    paths = candidate_paths()
    if env:
        # An explicit path is used or reported, never silently skipped.
        if paths[0].is_dir():
            raise errors.CinferError(
                f"CINFER_LIBRARY={env} is a folder: set it to the library file itself, "
                f"e.g. {paths[0] / 'libcinfer.so'}")
        if not paths[0].is_file():
            raise errors.CinferError(f"CINFER_LIBRARY={env}: no such file")
        return paths[0]
    for p in paths:
        if p.is_file():
            return p
    tried = ", ".join(str(p) for p in paths)
    if len(paths) > 1:  # a source checkout
        raise errors.CinferError(
            f"libcinfer.so not found (tried {tried}); set CINFER_LIBRARY to a built "
            "libcinfer.so, or build this checkout's: `cmake -S . -B build && cmake --build build`")
    raise errors.CinferError(
        f"libcinfer.so not found (tried {tried}); set CINFER_LIBRARY to a built libcinfer.so "
        "(`make install` puts one in PREFIX/lib), or install the wheel of `make wheel`, which "
        "carries its own")


def lib() -> ctypes.CDLL:
    """The loaded library, with every prototype declared (loaded on first call)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            try:
                handle = ctypes.CDLL(str(path))
            except OSError as e:
                raise errors.CinferError(f"cannot load {path}: {e}") from e
            if not hasattr(handle, "cinfer_version"):
                raise errors.CinferError(
                    f"{path} is not a cinfer library (it has no symbol cinfer_version)"
                )
            for name, (restype, argtypes) in _PROTOTYPES.items():
                try:
                    fn = getattr(handle, name)
                except AttributeError as e:
                    raise errors.CinferError(
                        f"{path} has no symbol {name}: it is older than this Python package"
                    ) from e
                fn.restype = restype
                fn.argtypes = argtypes
            major = handle.cinfer_version() // 10000
            if major != 0:
                raise errors.CinferError(
                    f"{path} is cinfer {handle.cinfer_version_string().decode()}, this package "
                    "expects 0.x"
                )
            _lib = handle
    return _lib


def last_error() -> str:
    """cinfer_last_error() of this thread, decoded."""
    raw = lib().cinfer_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def check(status: int, function: str = "") -> None:
    """Raises the exception for a non-success status, with this thread's last error message.
    Must be called right after the failing C call, on the same thread."""
    if status != errors.SUCCESS:
        raise errors.error_for_status(status, last_error(), function)


# ---------------------------------------------------------------------------------------------
# Contexts: one per CUDA device, created at first use and kept for the life of the process
# (destroying one at interpreter exit could race with work still queued by the framework).
# ---------------------------------------------------------------------------------------------

_contexts: dict = {}


def context(device: int) -> ctypes.c_void_p:
    """The cinfer_context_t of CUDA device ``device`` (an ordinal), created on first use."""
    ctx = _contexts.get(device)
    if ctx is not None:
        return ctx
    with _lock:
        ctx = _contexts.get(device)
        if ctx is None:
            handle = lib()
            opts = ContextOptions(ctypes.sizeof(ContextOptions), CONTEXT_OPTIONS_VERSION, device)
            out = ctypes.c_void_p()
            check(handle.cinfer_context_create(ctypes.byref(opts), ctypes.byref(out)),
                  "cinfer_context_create")
            ctx = out
            _contexts[device] = ctx
    return ctx
