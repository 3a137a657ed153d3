"""Grammar kinds, cache keys and compile errors: shared by the cache, the worker processes and
the step engine (no xgrammar import here, so the worker side stays importable on its own)."""

from __future__ import annotations

import re
from enum import Enum

# xgrammar messages start with "[hh:mm:ss] /path/file.cc:123: " and sometimes "Check failed:
# (cond) is false: "; clients want the sentence after that.
_LOG_PREFIX = re.compile(r"^\s*\[[0-9:.]+\]\s+\S+:\d+:\s*")
_CHECK_PREFIX = re.compile(r"^Check failed: .*? is false:\s*")
MAX_ERROR_CHARS = 2000


class GrammarKind(str, Enum):
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF = "ebnf"


GrammarKey = tuple[GrammarKind, str]


class GrammarError(Exception):
    """A grammar that does not compile; `str(err)` is xgrammar's message, cleaned."""


def clean_error(exc: BaseException) -> str:
    text = str(exc).strip()
    text = _LOG_PREFIX.sub("", text, count=1)
    text = _CHECK_PREFIX.sub("", text, count=1)
    return text[:MAX_ERROR_CHARS] or type(exc).__name__
