"""The prefix cache's contents as both ends of the scheduler session name them.

A scheduler publishes what its radix cache holds as chained hashes of full blocks of cache
keys; a front door hashes a request's prompt the same way and routes it to the replica that
holds the longest run of its leading blocks. Block i's hash covers every key of blocks 0..i
(each hash folds in its predecessor), so equal hashes mean equal prefixes (up to a 2^-64
collision per pair), and a replica "holds block i" exactly when its cache holds that whole
prefix: a radix path of depth >= (i + 1) * BLOCK_TOKENS.

Cache keys are token ids shifted by the request's namespace offset (tenant isolation), so a
tenant's blocks never match another tenant's prompt.

With a host KV tier a block is published as GPU-resident or host-resident (its KV saved to host
memory when the GPU evicted it); both ends weigh a host-resident hit by `HOST_HIT_WEIGHT`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BLOCK_TOKENS = 16  # fine enough for few-shot prefixes, ~128 hashes for a 2k-token prompt
# A host-tier hit's worth, in GPU-hit tokens (issue 31): loading KV back from host memory costs
# a copy, far less than recomputing it and more than using it in place. The one value both
# ends rank matches by: the scheduler's prefill order (a waiting request's host-resident
# prefix) and the front door's router (a replica's host-resident blocks). docs/radix.md.
# Measured (GPU part host_tier, H200, random Llama-3.1-8B, 2026-11-27): a token loaded in runs
# costs 3.17 us, a token prefilled 22.5 us, so a host hit saves 1 - 3.17/22.5 = 0.86 of what a
# GPU hit saves; rounded down, as the scattered worst case (runs of one) costs more.
HOST_HIT_WEIGHT = 0.85


def namespace_offset(namespace: str) -> int:
    """The cache-key offset of a namespace name: 0 for the default namespace, else a multiple
    of 2^32 drawn from the name's 64-bit hash (names that differ get different offsets, up to
    a 2^-64 collision chance per pair)."""
    if not namespace:
        return 0
    digest = hashlib.blake2b(namespace.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") + 1) << 32


def cache_keys(token_ids: Sequence[int], namespace: str) -> list[int]:
    off = namespace_offset(namespace)
    return list(token_ids) if not off else [t + off for t in token_ids]


def block_hashes(keys: Sequence[int], start_block: int = 0, prev: int = 0) -> list[int]:
    """Hashes of the full blocks of `keys` from block `start_block` on; `prev` is the hash of
    block `start_block - 1` (ignored for block 0), so a growing sequence is hashed
    incrementally. Unsigned 64-bit values (protobuf fixed64).

    A key is a token id (low 32 bits) plus its namespace's offset (the bits above, the same
    for every key of one sequence): the chain starts from the namespace and hashes the tokens
    as 32-bit items."""
    n_full = len(keys) // BLOCK_TOKENS
    if start_block == 0:
        prev = (keys[0] >> 32) & _U64 if keys else 0
    if start_block >= n_full:
        return []
    # The low 32 bits of every key at once, then one slice and one blake2b per block. Keys of
    # the default namespace are the token ids and convert in C; namespaced ones need a mask.
    part = keys[start_block * BLOCK_TOKENS : n_full * BLOCK_TOKENS]
    try:
        data = array("I", part).tobytes()
    except OverflowError:
        data = array("I", map(_U32.__and__, part)).tobytes()
    out: list[int] = []
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    for off in range(0, len(data), _BLOCK_BYTES):
        h = blake2b(prev.to_bytes(8, "little") + data[off : off + _BLOCK_BYTES], digest_size=8)
        prev = from_bytes(h.digest(), "little")
        out.append(prev)
    return out


_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_BLOCK_BYTES = BLOCK_TOKENS * 4
