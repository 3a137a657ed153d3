"""The public wire's sampling messages (`api_pb2.SamplingParams` + `LogprobOptions`) -> the one
sampling type (`step_ops.Sampling`), field by field by name: a field that is unset (no presence
on the wire) keeps the default of `step_ops.DEFAULTS`. No field is copied by hand, so a field
added to both ends needs no edit here."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from radixmesh_wire.pb import api_pb2
from radixmesh_wire.step_ops import Sampling

_FROM_LOGPROBS = frozenset({"return_logprob", "top_logprobs", "prompt_logprobs_from"})
_NAMES = tuple(f.name for f in fields(Sampling))


def _value(msg: Any, name: str) -> tuple[bool, Any]:
    """(set, value) of one field of a protobuf message, as `Sampling` holds it."""
    fd = msg.DESCRIPTOR.fields_by_name.get(name)
    if fd is None:
        return False, None
    if fd.has_presence and not msg.HasField(name):
        return False, None
    value = getattr(msg, name)
    if fd.message_type is not None:  # a map (logit_bias): sorted (key, value) pairs
        return True, tuple(sorted(value.items()))
    if fd.is_repeated:
        return True, tuple(value)
    return True, value


def sampling_from_params(
    s: api_pb2.SamplingParams, lp: api_pb2.LogprobOptions | None = None
) -> Sampling:
    """`Sampling` of a request as the wire gives it; unset fields take the table's defaults.
    (The front door's validation has filled max_new_tokens, temperature and seed already.)"""
    kw: dict[str, Any] = {}
    for name in _NAMES:
        src = lp if name in _FROM_LOGPROBS else s
        if src is None:
            continue
        present, value = _value(src, name)
        if present:
            kw[name] = value
    if kw.get("repetition_penalty") == 0:  # proto3's zero: off, as 1 is
        kw["repetition_penalty"] = 1.0
    return Sampling(**kw)
