"""Exceptions raised by cinfer, and the mapping from the C library's status codes to them.

Every C function returns a ``cinfer_status_t``; a status other than ``SUCCESS`` becomes one of the
exceptions below, carrying the message of ``cinfer_last_error()`` (which names the argument, the
value and what was expected). Argument problems are ``ValueError`` subclasses, so code written for
FlashInfer that catches ``ValueError`` keeps working; failures of the machine or the toolchain are
``RuntimeError`` subclasses.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

# The values of the C enum cinfer_status_t (CINFER_STATUS_LIST in include/cinfer.h).
SUCCESS = 0
INVALID_ARGUMENT = 1
UNSUPPORTED = 2
NO_DEVICE = 3
CUDA_ERROR = 4
COMPILE_ERROR = 5
OUT_OF_MEMORY = 6
WORKSPACE_TOO_SMALL = 7
NOT_FOUND = 8
PLAN_MISMATCH = 9
IO_ERROR = 10
INTERNAL = 11

STATUS_NAMES: Dict[int, str] = {
    SUCCESS: "SUCCESS",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    UNSUPPORTED: "UNSUPPORTED",
    NO_DEVICE: "NO_DEVICE",
    CUDA_ERROR: "CUDA_ERROR",
    COMPILE_ERROR: "COMPILE_ERROR",
    OUT_OF_MEMORY: "OUT_OF_MEMORY",
    WORKSPACE_TOO_SMALL: "WORKSPACE_TOO_SMALL",
    NOT_FOUND: "NOT_FOUND",
    PLAN_MISMATCH: "PLAN_MISMATCH",
    IO_ERROR: "IO_ERROR",
    INTERNAL: "INTERNAL",
}


class _StatusInfo:
    """The C status behind an exception: ``status`` (int, ``None`` for checks made in Python),
    ``status_name`` (``"INVALID_ARGUMENT"``) and ``message`` (the library's text)."""

    status: Optional[int]
    status_name: Optional[str]
    message: str

    def _set_status(self, status: Optional[int], message: str) -> None:
        self.status = status
        self.status_name = STATUS_NAMES.get(status) if status is not None else None
        self.message = message


class CinferError(RuntimeError, _StatusInfo):
    """A failure that is not the caller's arguments: CUDA driver errors, out of memory, a kernel
    missing with JIT off, file errors, internal errors. Base class of :class:`CompileError` and
    :class:`NoDeviceError`."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self._set_status(status, message)


class CompileError(CinferError):
    """NVRTC failed to compile a kernel; the message contains NVRTC's log."""


class NoDeviceError(CinferError):
    """No CUDA driver or no device: the library is loaded but cannot run kernels here."""


class ArgumentError(ValueError, _StatusInfo):
    """Bad arguments: a shape, dtype, device, layout or value the call cannot accept, run
    arguments that contradict the plan, or a workspace that is too small."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self._set_status(status, message)


class UnsupportedError(ArgumentError):
    """Valid arguments that cinfer does not implement (yet): a head dim, dtype, page size or
    feature such as fp8 queries. The message names the argument and the supported values."""


_EXCEPTIONS: Dict[int, Type[Exception]] = {
    INVALID_ARGUMENT: ArgumentError,
    PLAN_MISMATCH: ArgumentError,
    WORKSPACE_TOO_SMALL: ArgumentError,
    UNSUPPORTED: UnsupportedError,
    COMPILE_ERROR: CompileError,
    NO_DEVICE: NoDeviceError,
}


def error_for_status(status: int, message: str, function: str = "") -> Exception:
    """The exception for a non-success C status, with ``message`` (from ``cinfer_last_error``)."""
    name = STATUS_NAMES.get(status, f"status {status}")
    text = f"{function}: {message}" if function else message
    if not message:
        text = f"{function}: {name}" if function else name
    cls = _EXCEPTIONS.get(status, CinferError)
    exc = cls(f"{text} [CINFER_STATUS_{name}]", status)
    exc.message = message or name  # the library's own text, without the decoration
    return exc
