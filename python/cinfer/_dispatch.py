"""Routing of the public functions to PyTorch custom operators while torch.compile traces them.

TorchDynamo cannot trace into ctypes calls, so every tensor-taking public function is also a
custom operator (``torch.ops.cinfer.*``, defined in :mod:`cinfer.torch_ops` with fake
implementations that give the output shapes and dtypes). A public function starts with::

    if _dispatch.compiling():
        return _dispatch.op("merge_state")(...)   # one opaque node in the traced graph
    ...                                          # eager: straight to the C library

Outside of tracing the function calls the library directly (no dispatcher overhead).

This module imports neither torch nor the operators: they are registered once, by
``import cinfer.torch_ops``, by ``import cinfer`` when torch is already imported, or by the first
eager call of any of these functions. A function traced before any of those happened (cinfer
imported before torch, then compiled before any eager call) is not in the graph: TorchDynamo
breaks the graph around it (still correct; an error with ``fullgraph=True``).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Optional

# Set by torch_ops when it registers the operators.
_ops: Optional[Dict[str, Any]] = None
_is_compiling: Optional[Callable[[], bool]] = None
# Why registration failed (e.g. a PyTorch older than 2.4, which lacks torch.library.custom_op).
_failure: Optional[str] = None


def compiling() -> bool:
    """True while torch.compile (TorchDynamo or torch.export) traces the caller. Pure Python on
    module globals, so that it can be traced itself."""
    return _is_compiling is not None and _is_compiling()


def op(name: str):
    """The registered operator ``torch.ops.cinfer.<name>``."""
    return _ops[name]


def installed(ops: Dict[str, Any], is_compiling: Callable[[], bool]) -> None:
    """Called by torch_ops once its operators are registered."""
    global _ops, _is_compiling
    _ops = ops
    _is_compiling = is_compiling


def ensure_registered() -> None:
    """Registers the operators if torch is imported and they are not registered yet. Called on
    every eager call (a global read once done); never raises: the eager path works without
    them."""
    global _failure
    if _ops is not None or _failure is not None or sys.modules.get("torch") is None:
        return
    try:
        from . import torch_ops  # noqa: F401  (registers on import)
    except Exception as e:  # pragma: no cover - depends on the PyTorch version
        _failure = f"{type(e).__name__}: {e}"


def failure() -> Optional[str]:
    """Why the operators could not be registered, or None."""
    return _failure
