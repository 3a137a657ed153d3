"""Renders chat roles from the server's role markers (`GetModelInfo`), without templates.

Invariant: the interpreter and the compiler's constant-prefix warm-up both render roles here,
so a warmed prefix is byte-identical to what the program later sends.
"""

from __future__ import annotations

from radixmesh.lang.backend import ModelInfo, RoleMarkers
from radixmesh.lang.errors import ProgramError


class RoleRenderer:
    def __init__(self, info: ModelInfo) -> None:
        self._info = info

    def _markers(self, role: str) -> RoleMarkers:
        markers = self._info.roles.get(role)
        if markers is None:
            known = ", ".join(sorted(self._info.roles)) or "none"
            raise ProgramError(
                f"model {self._info.model_name!r} has no markers for role {role!r} "
                f"(known roles: {known}); is it a chat model?"
            )
        return markers

    def default_system(self, role: str, *, first: bool) -> str | None:
        """The default system prompt `begin` inserts before `role`, None when it inserts none."""
        if first and role != "system" and self._info.default_system_prompt:
            return self._info.default_system_prompt
        return None

    def begin(self, role: str, *, first: bool) -> str:
        """Text opening `role`. On the stream's first role, a non-system role is preceded by
        the model's default system prompt, as the model's chat template would do."""
        text = ""
        if first and role != "system" and self._info.default_system_prompt:
            system = self._markers("system")
            text = system.prefix + self._info.default_system_prompt + system.suffix
        return text + self._markers(role).prefix

    def end(self, role: str) -> str:
        return self._markers(role).suffix
