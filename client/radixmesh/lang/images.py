"""`rm.image(...)` in programs: the image travels inside the prompt text as a tag.

`image(path_or_bytes)` reads the image once, keeps its bytes in this process's image table
(keyed by their SHA-256) and returns the text `<image:HEX>` (the first 16 hex digits of the
hash). The tag is ordinary text to every part of the interpreter (forks copy it, `s.text()`
shows it, tracing records it), so no primitive needs to know about images. When a prompt goes
to the server (`grpc_backend.generate_request`), `split_images` turns each tag into the model's
image marker (`<image>`) and attaches the bytes in order; the server hashes the pixels, so the
same image in two requests shares the prefix cache.

The table keeps the most recent `MAX_IMAGES` images; a prompt naming one that was dropped
fails with a ProgramError that says so.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from pathlib import Path

from radixmesh.lang.errors import ProgramError

MARKER = "<image>"  # the model's image token text (LLaVA)
MAX_IMAGES = 256
_TAG = re.compile(r"<image:([0-9a-f]{16})>")

_lock = threading.Lock()
_table: OrderedDict[str, bytes] = OrderedDict()


def image_tag(source: str | Path | bytes) -> str:
    """Register an image (a file path or its bytes); the tag text that stands for it."""
    if isinstance(source, bytes | bytearray):
        data = bytes(source)
    elif isinstance(source, str | Path):
        if str(source).startswith(("http://", "https://")):
            raise ProgramError(
                f"rm.image({source!r}): remote URLs are not fetched; download the image and "
                "pass its path or bytes"
            )
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise ProgramError(f"rm.image({source!r}): cannot read the file: {exc}") from exc
    else:
        raise ProgramError(f"rm.image() takes a path or bytes, not {type(source).__name__}")
    if not data:
        raise ProgramError("rm.image(): the image is empty")
    key = hashlib.sha256(data).hexdigest()[:16]
    with _lock:
        _table[key] = data
        _table.move_to_end(key)
        while len(_table) > MAX_IMAGES:
            _table.popitem(last=False)
    return f"<image:{key}>"


def split_images(prompt: str) -> tuple[str, list[bytes]]:
    """(the prompt with each tag replaced by the image marker, the tagged images in order)."""
    keys = _TAG.findall(prompt)
    if not keys:
        return prompt, []
    with _lock:
        missing = [k for k in keys if k not in _table]
        if missing:
            raise ProgramError(
                f"the prompt names {len(missing)} image(s) no longer held (this process keeps "
                f"the last {MAX_IMAGES}): call rm.image() again"
            )
        images = [_table[k] for k in keys]
    return _TAG.sub(MARKER, prompt), images
