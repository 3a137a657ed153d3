"""`rm.image` in programs (client/radixmesh/lang/images.py): the image is a tag in the prompt
text; forks carry it; the gRPC request has the model's marker in its place and the bytes
attached, in order; paths and bytes give the same tag; bad sources are ProgramErrors."""

from __future__ import annotations

from pathlib import Path

import pytest
import radixmesh.lang as rm
from radixmesh.lang.grpc_backend import generate_request
from radixmesh.lang.images import split_images
from radixmesh.lang.params import GenParams
from radixmesh.lang.scripted import ScriptedBackend


def test_tags_become_markers_and_bytes_in_order(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"AAAA")
    tag_a = rm.image(tmp_path / "a.png")
    tag_b = rm.image(b"BBBB")
    assert rm.image(b"AAAA").value == tag_a.value  # type: ignore[attr-defined]  # one image
    assert tag_a.value != tag_b.value  # type: ignore[attr-defined]

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Look: " + rm.image(b"AAAA") + " and " + rm.image(b"BBBB") + " ok"
        forks = s.fork(2)
        for i in range(2):
            forks[i] += f" q{i}" + rm.gen("a", max_tokens=1)
        forks.join("gather_variable")

    backend = ScriptedBackend()
    prog.run(backend=backend).sync()
    prompts = [c.prompt for c in backend.calls if c.kind == "gen"]
    assert len(prompts) == 2
    for p in prompts:
        req = generate_request(p, GenParams(), None, stream=False)
        assert req.text.startswith("Look: <image> and <image> ok q")
        assert list(req.images) == [b"AAAA", b"BBBB"]
    assert split_images("no images")[1] == []


def test_bad_sources_are_program_errors() -> None:
    with pytest.raises(rm.ProgramError, match="remote URLs"):
        rm.image("https://example.com/cat.png")
    with pytest.raises(rm.ProgramError, match="path or bytes"):
        rm.image(3)
    with pytest.raises(rm.ProgramError, match="no longer held"):
        split_images("<image:0123456789abcdef>")
