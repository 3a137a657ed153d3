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
