"""cinfer: attention for LLM serving, with FlashInfer 0.2's Python API over a C library.

A serving engine switches by changing one import::

    import cinfer as flashinfer

Implemented so far: :func:`single_decode_with_kv_cache`,
:class:`BatchDecodeWithPagedKVCacheWrapper` (and its CUDA-graph variant), :func:`merge_state`,
:func:`merge_state_in_place`, :func:`merge_states`. Log-sum-exp values are in base 2, as in
FlashInfer.

Importing the package needs neither PyTorch nor the shared library: torch is imported by the first
call that takes tensors, and ``libcinfer.so`` is loaded by the first call into it (from
``$CINFER_LIBRARY``, next to this package, or the ``build/`` folder of the source tree).
"""

from __future__ import annotations

import ctypes
from typing import Dict, Union

from . import cascade, decode
from .cascade import merge_state, merge_state_in_place, merge_states
from .decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)
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


def jit_stats() -> Dict[str, Union[int, float]]:
    """Process-wide JIT statistics: ``memory_hits``, ``disk_hits``, ``aot_hits``, ``misses``,
    ``compiles``, ``compile_seconds`` (wall seconds in NVRTC), ``cache_write_fails``."""
    from . import _lib

    stats = _lib.JitStats()
    stats.size = ctypes.sizeof(_lib.JitStats)
    stats.version = _lib.JIT_STATS_VERSION
    _lib.check(_lib.lib().cinfer_jit_get_stats(ctypes.byref(stats)), "jit_stats")
    return {name: getattr(stats, name) for name, _ in _lib.JitStats._fields_
            if name not in ("size", "version")}


__all__ = [
    "ArgumentError",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "CinferError",
    "CompileError",
    "NoDeviceError",
    "UnsupportedError",
    "cache_dir",
    "cascade",
    "decode",
    "jit_stats",
    "library_path",
    "library_version",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "single_decode_with_kv_cache",
]
