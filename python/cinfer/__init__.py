"""cinfer: attention for LLM serving, with FlashInfer 0.2's Python API over a C library.

A serving engine switches by changing one import::

    import cinfer as flashinfer

Implemented so far: :func:`single_decode_with_kv_cache`,
:class:`BatchDecodeWithPagedKVCacheWrapper` (and its CUDA-graph variant),
:func:`single_prefill_with_kv_cache` (and ``_return_lse``),
:class:`BatchPrefillWithPagedKVCacheWrapper`, :class:`BatchPrefillWithRaggedKVCacheWrapper`,
:class:`MultiLevelCascadeAttentionWrapper`, :class:`BatchMLAPagedAttentionWrapper` (MLA),
:func:`merge_state`,
:func:`merge_state_in_place`, :func:`merge_states`, :func:`append_paged_kv_cache`,
:func:`get_batch_indices_positions`, :func:`get_seq_lens`, the ``apply_rope*`` and
``apply_llama31_rope*`` family, :func:`apply_rope_with_cos_sin_cache` (and ``_inplace``),
:func:`packbits`, :func:`segment_packbits`; attention variants (:class:`Variant`,
:func:`variant_builtin`, :mod:`cinfer.variant`). Log-sum-exp values are in base 2, as in
FlashInfer.

Importing the package needs neither PyTorch nor the shared library: torch is imported by the first
call that takes tensors, and ``libcinfer.so`` is loaded by the first call into it (from
``$CINFER_LIBRARY``, next to this package, or the ``build/`` folder of the source tree). The
tensor functions are also PyTorch custom operators for torch.compile (:mod:`cinfer.torch_ops`),
registered at import when torch is already imported, else at the first call.
"""

from __future__ import annotations

import ctypes as _ctypes

from . import _dispatch, cascade, decode, mla, page, prefill, quantization, rope, variant
from .cascade import (
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)
from .decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)
from .mla import BatchMLAPagedAttentionWrapper
from .page import (APPEND_ERROR_BATCH_INDEX, APPEND_ERROR_PAGE, APPEND_ERROR_POSITION,
                   append_paged_kv_cache, get_batch_indices_positions, get_seq_lens)
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)
from .quantization import packbits, segment_packbits
from .rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from .variant import Variant, variant_builtin
from .errors import (
    ArgumentError,
    CinferError,
    CompileError,
    NoDeviceError,
    UnsupportedError,
)

__version__ = "0.1.0"


def library_version() -> str:
    """The version of the loaded libcinfer.so, ``"major.minor.patch"``."""
    from . import _lib

    return _lib.lib().cinfer_version_string().decode()


def library_path() -> str:
    """The path of the libcinfer.so in use (see the module docstring for the search order)."""
    from . import _lib

    return str(_lib.library_path())


def cache_dir() -> str:
    """The kernel cache folder (``CINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/cinfer``, else
    ``~/.cache/cinfer``)."""
    from . import _lib

    return _lib.lib().cinfer_cache_dir().decode()


def jit_stats() -> dict[str, int | float]:
    """Process-wide JIT statistics: ``memory_hits``, ``disk_hits``, ``aot_hits``, ``misses``,
    ``compiles``, ``compile_seconds`` (wall seconds in NVRTC), ``cache_write_fails``."""
    from . import _lib

    stats = _lib.JitStats()
    stats.size = _ctypes.sizeof(_lib.JitStats)
    stats.version = _lib.JIT_STATS_VERSION
    _lib.check(_lib.lib().cinfer_jit_get_stats(_ctypes.byref(stats)), "jit_stats")
    return {name: getattr(stats, name) for name, _ in _lib.JitStats._fields_
            if name not in ("size", "version")}


# With torch already imported, register the torch.compile operators now, so code compiled before
# any eager call traces them too (this imports nothing new).
_dispatch.ensure_registered()

__all__ = [
    "ArgumentError",
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchMLAPagedAttentionWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "CinferError",
    "CompileError",
    "MultiLevelCascadeAttentionWrapper",
    "NoDeviceError",
    "UnsupportedError",
    "Variant",
    "append_paged_kv_cache",
    "APPEND_ERROR_BATCH_INDEX",
    "APPEND_ERROR_POSITION",
    "APPEND_ERROR_PAGE",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "cache_dir",
    "cascade",
    "decode",
    "get_batch_indices_positions",
    "get_seq_lens",
    "jit_stats",
    "library_path",
    "library_version",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "mla",
    "packbits",
    "page",
    "prefill",
    "quantization",
    "rope",
    "segment_packbits",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "variant",
    "variant_builtin",
]

# The __future__ import binds the name `annotations` in this module; it is not part of the API.
del annotations
