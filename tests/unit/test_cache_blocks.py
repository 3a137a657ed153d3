"""Block hashes name prefixes: equal prefixes hash alike on both ends of the session stream,
different ones (or another namespace) do not, and incremental hashing equals hashing at once."""

from __future__ import annotations

from radixmesh_wire.cache_blocks import BLOCK_TOKENS, block_hashes, cache_keys


def test_hashes_name_prefixes() -> None:
    a = list(range(100, 100 + 5 * BLOCK_TOKENS + 3))
    b = a[: 2 * BLOCK_TOKENS] + [7] + a[2 * BLOCK_TOKENS + 1 :]
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 5  # partial last block not hashed
    assert ha[:2] == hb[:2] and all(x != y for x, y in zip(ha[2:], hb[2:], strict=True))
    assert block_hashes(a[: 3 * BLOCK_TOKENS]) == ha[:3]
    assert block_hashes(a, start_block=3, prev=ha[2]) == ha[3:]
    assert all(0 <= h < 1 << 64 for h in ha)


def test_namespaces_never_match() -> None:
    toks = list(range(2 * BLOCK_TOKENS))
    plain, t1, t2 = (block_hashes(cache_keys(toks, ns)) for ns in ("", "tenant-1", "tenant-2"))
    assert plain == block_hashes(toks)
    assert not set(plain) & set(t1) and not set(t1) & set(t2)
    assert block_hashes(cache_keys(toks, "tenant-1"), 1, t1[0]) == t1[1:]


def _reference(keys: list[int], start_block: int = 0, prev: int = 0) -> list[int]:
    """The chain as specified, one block at a time: blake2b-64 of the previous hash (8 bytes
    little-endian; block 0: the namespace bits of the keys) then the block's 16 low 32-bit
    halves, little-endian."""
    import hashlib
    import struct

    if start_block == 0:
        prev = (keys[0] >> 32) % (1 << 64) if keys else 0
    out = []
    for i in range(start_block, len(keys) // BLOCK_TOKENS):
        block = keys[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS]
        low = [k % 2**32 for k in block]
        raw = struct.pack("<Q", prev) + struct.pack(f"<{BLOCK_TOKENS}I", *low)
        prev = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
        out.append(prev)
    return out


def test_block_hashes_equal_the_specified_chain() -> None:
    import random

    rng = random.Random(5)
    for ns in ("", "tenant-1", "a-much-longer-tenant-name"):
        for n in (0, 1, 15, 16, 17, 48, 129):
            keys = cache_keys([rng.randrange(200_000) for _ in range(n)], ns)
            want = _reference(keys)
            assert block_hashes(keys) == want
            for start in range(len(want) + 1):
                prev = want[start - 1] if start else 0
                assert block_hashes(keys, start, prev) == want[start:]
    huge = [(1 << 95) + 7] * 32  # an offset above 64 bits keeps its low 64 for the chain start
    assert block_hashes(huge) == _reference(huge)
