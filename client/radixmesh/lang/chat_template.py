"""SGLang's `ChatTemplate` view of a backend's role markers (`backend.get_chat_template()`).

RadixMesh renders roles from the server's `GetModelInfo` markers (`roles.py`); this exposes the
same markers under SGLang's names for programs that inspect the template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixmesh.lang.backend import Backend, ModelInfo


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    default_system_prompt: str
    role_prefix_and_suffix: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    stop_str: tuple[str, ...] = ()
    image_token: str = ""

    def get_prefix_and_suffix(
        self, role: str, hist_messages: Sequence[Mapping[str, Any]] = ()
    ) -> tuple[str, str]:
        if role not in self.role_prefix_and_suffix:
            raise ValueError(f"template {self.name!r} has no role {role!r}")
        return self.role_prefix_and_suffix[role]

    @classmethod
    def from_model_info(cls, info: ModelInfo) -> ChatTemplate:
        return cls(
            name=info.model_name,
            default_system_prompt=info.default_system_prompt,
            role_prefix_and_suffix={r: (m.prefix, m.suffix) for r, m in info.roles.items()},
        )


def get_chat_template(backend: Backend | str | None = None) -> ChatTemplate:
    """The chat template of `backend` (default: the default backend). SGLang also accepts a
    template name; RadixMesh always uses the serving model's own markers."""
    if isinstance(backend, str):
        raise ValueError(
            f"get_chat_template({backend!r}): RadixMesh has no named templates; roles are "
            "rendered from the server's model info (pass a backend, or nothing)"
        )
    if backend is None:
        from radixmesh.lang.config import get_default_backend

        backend = get_default_backend()
    return ChatTemplate.from_model_info(backend.model_info())
