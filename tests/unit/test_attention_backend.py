"""Both attention backends implement the one `AttentionBackend` interface (mypy checks the
assignments below; the signature test catches a drift mypy's structural match would allow,
such as a renamed parameter), and the flashinfer module imports without flashinfer."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from model_service.attention.backend import AttentionBackend, LayerAttention
from model_service.attention.flashinfer import FlashInferAttention
from model_service.attention.reference import ReferenceAttention

_static: list[type[AttentionBackend]] = [ReferenceAttention, FlashInferAttention]
_layer: type[LayerAttention] = ReferenceAttention

METHODS = ("plan", "forward", "kv_target", "attend")


@pytest.mark.parametrize("cls", [ReferenceAttention, FlashInferAttention])
def test_backend_methods_match_the_protocol(cls: type[AttentionBackend]) -> None:
    for name in METHODS:
        want = inspect.signature(getattr(AttentionBackend, name))
        got = inspect.signature(getattr(cls, name))
        assert list(got.parameters) == list(want.parameters), (cls.__name__, name)
        defaults = [p.default for p in got.parameters.values()]
        assert defaults == [p.default for p in want.parameters.values()], (cls.__name__, name)
    assert cls.name in ("reference", "flashinfer")


@pytest.mark.integration  # starts a process
def test_flashinfer_module_imports_without_flashinfer() -> None:
    """In a fresh interpreter where `import flashinfer` fails (as on a CPU-only install)."""
    code = (
        "import sys; sys.modules['flashinfer'] = None\n"
        "from model_service.attention import flashinfer as fi\n"
        "ok, why = fi.flashinfer_available()\n"
        "print(ok, fi.FlashInferAttention.name, bool(why))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "flashinfer", "True"]
