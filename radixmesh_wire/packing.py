"""Packed little-endian int32/float32 arrays, the wire form of id and slot lists on internal
streams (a `bytes` field costs one copy; a repeated field costs one object per element)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence

assert sys.byteorder == "little", "packed arrays assume a little-endian host"


def pack_i32(values: Iterable[int]) -> bytes:
    return array("i", values).tobytes()


def unpack_i32(data: bytes) -> list[int]:
    a = array("i")
    a.frombytes(data)
    return a.tolist()


def pack_f32(values: Sequence[float]) -> bytes:
    return array("f", values).tobytes()


def unpack_f32(data: bytes) -> list[float]:
    a = array("f")
    a.frombytes(data)
    return a.tolist()
