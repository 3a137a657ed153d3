"""Chat roles rendered from the server's role markers (no chat template on the client)."""

from __future__ import annotations

import pytest
import radixmesh as rm
from radixmesh.lang.backend import ModelInfo, RoleMarkers
from radixmesh.lang.scripted import ScriptedBackend

INFO = ModelInfo(
    model_name="tiny",
    roles={
        "system": RoleMarkers("[S]", "[/S]"),
        "user": RoleMarkers("[U]", "[/U]"),
        "assistant": RoleMarkers("[A]", "[/A]"),
    },
    default_system_prompt="Be brief.",
)


def backend(reply: str = "hi") -> ScriptedBackend:
    return ScriptedBackend(lambda prompt, params: reply, info=INFO)


def test_roles_wrap_content_in_markers() -> None:
    @rm.function
    def chat(s: rm.ProgramState) -> None:
        s += rm.system("You help.")
        s += rm.user("Hello")
        s += rm.assistant(rm.gen("reply"))

    b = backend()
    state = chat.run(backend=b)
    assert state.text() == "[S]You help.[/S][U]Hello[/U][A]hi[/A]"
    assert b.calls[0].prompt == "[S]You help.[/S][U]Hello[/U][A]"  # gen sees the open role
    assert state.messages() == [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "hi"},
    ]


def test_default_system_prompt_precedes_a_first_non_system_role() -> None:
    @rm.function
    def chat(s: rm.ProgramState) -> None:
        s += rm.user("Hello")
        s += rm.user("Again")

    assert chat.run(backend=backend()).text() == "[S]Be brief.[/S][U]Hello[/U][U]Again[/U]"


def test_context_manager_roles() -> None:
    @rm.function
    def chat(s: rm.ProgramState) -> None:
        with s.user():
            s += "Part one. "
            s += "Part two."
        with s.assistant():
            s += rm.gen("reply")

    state = chat.run(backend=backend("ok"))
    assert state.text() == "[S]Be brief.[/S][U]Part one. Part two.[/U][A]ok[/A]"
    assert state.messages()[-1] == {"role": "assistant", "content": "ok"}


def test_role_content_can_mix_text_and_primitives() -> None:
    @rm.function
    def chat(s: rm.ProgramState) -> None:
        s += rm.system("S")
        s += rm.assistant("Judgment:" + rm.gen("j", stop="END") + " Grade:" + rm.gen("g"))

    state = chat.run(backend=backend("A END"))
    assert state.text() == "[S]S[/S][A]Judgment:A  Grade:A END[/A]"  # only j had the stop


def test_forks_inherit_the_chat_history() -> None:
    @rm.function
    def chat(s: rm.ProgramState) -> rm.ForkGroup:
        s += rm.user("Q")
        forks = s.fork(2)
        forks += rm.assistant(rm.gen("a"))
        return forks

    state = chat.run(backend=backend())
    forks = state.ret_value
    assert forks[1].text() == "[S]Be brief.[/S][U]Q[/U][A]hi[/A]"
    # SGLang lists the template's default system prompt as a message too
    assert [m["role"] for m in forks[1].messages()] == ["system", "user", "assistant"]


def test_nesting_and_mismatched_roles_fail_at_submission() -> None:
    @rm.function
    def nested(s: rm.ProgramState) -> None:
        s += rm.role_begin("user")
        s += rm.assistant("x")

    with pytest.raises(ValueError, match="inside role 'user'"):
        nested.run(backend=backend())

    @rm.function
    def mismatched(s: rm.ProgramState) -> None:
        s += rm.role_begin("user") + "x" + rm.role_end("assistant")

    with pytest.raises(ValueError, match="cannot close role"):
        mismatched.run(backend=backend())
    with pytest.raises(ValueError):
        rm.role_begin("narrator")


def test_a_model_without_role_markers_fails_at_the_read() -> None:
    @rm.function
    def chat(s: rm.ProgramState) -> None:
        s += rm.user("Hello")

    state = chat.run(backend=ScriptedBackend(info=ModelInfo(model_name="base")))
    with pytest.raises(rm.ProgramError, match="no markers for role 'user'"):
        state.text()
