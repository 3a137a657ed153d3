"""Why a request failed, as the scheduler's core says it, and the peer-loss error the core
handles. `Status` numbers are gRPC's status codes (a unit test checks them), so the front door
passes them through unchanged; only the link modules import grpc."""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    INVALID_ARGUMENT = 3
    ALREADY_EXISTS = 6
    RESOURCE_EXHAUSTED = 8
    INTERNAL = 13
    UNAVAILABLE = 14


class GrammarUnavailable(Exception):
    """The grammar service cannot be reached (raised by the grammar link)."""


class GrammarLost(GrammarUnavailable):
    """One grammar service is unreachable or its session ended (another may still answer)."""
