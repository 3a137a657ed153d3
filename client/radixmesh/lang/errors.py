"""Exceptions of the program DSL.

Invariant: every error a program's reader sees is a `ProgramError` (or `TracingError` while
tracing) whose `__cause__` chain ends at the original exception (a `BackendError`, a gRPC
error, or the user's own exception), so the root cause is never lost.
"""

from __future__ import annotations


class ProgramError(RuntimeError):
    """A value or text of a program could not be produced; `__cause__` says why."""


class TracingError(ProgramError):
    """The program cannot be traced (e.g. data-dependent control flow on a traced value)."""


class ArgumentFormatError(TracingError, TypeError):
    """An abstract argument was formatted into a string while tracing (`f"Q: {question}"`):
    its value is unknown, so the text would be wrong. A TypeError, as SGLang raises."""


class BackendError(RuntimeError):
    """A backend call failed. `code` is the gRPC status name when there is one."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code
