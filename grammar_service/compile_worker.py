"""What one compile does, and the child process that does it where it can be killed.

`compile_grammar` is the compile itself (JSON check, schema rewrite, xgrammar call), used both
in-process (`--compile-isolation thread`) and in a worker process (`process`, the default).

Why processes: xgrammar compiles untrusted grammars in native code that neither Python nor a
thread can interrupt, and some grammars take minutes or gigabytes. A worker process can be
killed (its deadline passed, its waiters all left) and its address space is capped
(RLIMIT_AS), so a hostile grammar costs one worker restart, never the service's memory.

Worker protocol over a multiprocessing Pipe: the worker says `("ready", None)` once set up;
then the parent sends `(kind, text)`; the worker
answers `("ok", CompiledGrammar.serialize_json())`, `("error", message)` or
`("memory", message)` (after which it exits: a heap that hit its cap is not reused).

Invariants:
- A worker has the parent's TokenizerInfo (serialized once at start) and xgrammar's cache off:
  the parent's CompileCache is the only cache, so a worker's memory is one compile's memory.
- A worker dies with its parent (PR_SET_PDEATHSIG, and EOF on the pipe when idle).
"""

from __future__ import annotations

import ctypes
import json
import math
import resource
import signal
import sys
from typing import Any

import xgrammar as xgr

from grammar_service.kinds import GrammarError, GrammarKind, clean_error
from grammar_service.schema_rewrite import rewrite_schema_text

_PR_SET_PDEATHSIG = 1


def compile_grammar(
    compiler: xgr.GrammarCompiler,
    kind: GrammarKind,
    text: str,
    *,
    any_whitespace: bool,
    pattern_strings: bool,
) -> xgr.CompiledGrammar:
    """Compile one grammar; GrammarError with a message a person can act on."""
    try:
        if kind is GrammarKind.JSON_SCHEMA:
            check_json(text)
            if pattern_strings:  # same strict-JSON strings, masks ~100x cheaper
                text = rewrite_schema_text(text)
            return compiler.compile_json_schema(text, any_whitespace=any_whitespace)
        if kind is GrammarKind.REGEX:
            return compiler.compile_regex(text)
        if kind is GrammarKind.EBNF:
            return compiler.compile_grammar(text)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(clean_error(exc)) from exc
    raise GrammarError(f"unknown grammar kind {kind!r}")  # pragma: no cover - closed enum


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise GrammarError(f"JSON schema holds a non-finite number {text[:40]}")
    return value


def _no_constant(name: str) -> Any:
    raise GrammarError(f"JSON schema holds {name}, which is not JSON")


def check_json(text: str) -> None:
    """Reject non-JSON early with Python's message (xgrammar's echoes the whole schema back),
    and numbers that are not finite (NaN, Infinity, 1e999): bounds must be real numbers."""
    try:
        json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"JSON schema is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise GrammarError("JSON schema is nested too deeply") from exc


def die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies, even mid-native-call."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def worker_main(
    conn: Any,
    tokenizer_json: str,
    threads: int,
    memory_bytes: int,
    any_whitespace: bool,
    pattern_strings: bool,
) -> None:
    """The worker process's body (multiprocessing target)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    info = xgr.TokenizerInfo.deserialize_json(tokenizer_json)
    compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
    if memory_bytes > 0:
        # Cap what compiles may add to what this process already maps (Python, xgrammar,
        # the vocabulary): past it allocation fails inside xgrammar (std::bad_alloc).
        limit = _vm_size_bytes() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    conn.send(("ready", None))  # deadlines count from here: start-up is not the grammar's
    while True:
        try:
            kind, text = conn.recv()
        except (EOFError, OSError):
            return
        try:
            grammar = compile_grammar(
                compiler,
                GrammarKind(kind),
                text,
                any_whitespace=any_whitespace,
                pattern_strings=pattern_strings,
            )
            conn.send(("ok", grammar.serialize_json()))
        except GrammarError as exc:
            if "bad_alloc" not in str(exc):
                conn.send(("error", str(exc)))
                continue
            conn.send(("memory", str(exc)))
            return
        except (MemoryError, RuntimeError) as exc:  # the cap hit while serializing, say
            conn.send(("memory", clean_error(exc)))
            return
