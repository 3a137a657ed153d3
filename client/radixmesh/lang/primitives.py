"""The DSL's primitives: `gen`, `select` and the chat roles.

They only *build* IR expressions; nothing runs until an expression is appended to a state
(`s += gen("x")`). Expressions compose with `+`: `assistant("Answer: " + gen("a"))`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixmesh.lang.choices import ChoicesMethod, token_length_normalized
from radixmesh.lang.ir import ROLES, Concat, Expr, Gen, Role, RoleBegin, RoleEnd, Select, Text
from radixmesh.lang.params import make_params


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    *,
    min_tokens: int | None = None,
    stop_token_ids: Sequence[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    ignore_eos: bool | None = None,
    regex: str | None = None,
    json_schema: str | Mapping[str, Any] | None = None,
    ebnf: str | None = None,
    choices: Sequence[str] | None = None,
) -> Expr:
    """Generate text at this point of the prompt and store it as `s[name]`.

    Unset knobs fall back to the program's defaults (`run(temperature=0, ...)`) and then to
    the server's. At most one of regex / json_schema (str or dict) / ebnf constrains the
    output. `choices=` makes this a `select` (as in SGLang).
    """
    if choices is not None:
        return select(name, choices)
    params = make_params(
        max_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        ignore_eos=ignore_eos,
        regex=regex,
        json_schema=json_schema,
        ebnf=ebnf,
    )
    return Gen(name, params)


def select(
    name: str | None = None,
    choices: Sequence[str] = (),
    *,
    choices_method: ChoicesMethod = token_length_normalized,
) -> Expr:
    """Append the choice the model finds likeliest after the prompt; store it as `s[name]`.

    All choices are scored in one parallel batch sharing the prompt's cached prefix; see
    `radixmesh.lang.choices` for the methods.
    """
    if isinstance(choices, str):
        raise TypeError("choices must be a sequence of strings, not a string")
    options = tuple(choices)
    if not options:
        raise ValueError("select needs at least one choice")
    if any(not isinstance(c, str) or not c for c in options):
        raise ValueError("choices must be non-empty strings")
    return Select(name, options, choices_method)


def _role(role: str, content: Expr | str | None) -> Expr:
    if isinstance(content, str):
        content = Text(content)
    return Role(role, content)


def system(content: Expr | str | None = None) -> Expr:
    """The system message: the model's system markers around `content`."""
    return _role("system", content)


def user(content: Expr | str | None = None) -> Expr:
    return _role("user", content)


def assistant(content: Expr | str | None = None) -> Expr:
    return _role("assistant", content)


def role_begin(role: str) -> Expr:
    """Opens `role` (for content appended by several `+=`); close with `role_end`."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    return RoleBegin(role)


def role_end(role: str) -> Expr:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    return RoleEnd(role)


def concat(*parts: Expr | str) -> Expr:
    """`concat(a, b, c)` is `a + b + c` without relying on operator overloading."""
    return Concat(tuple(Text(p) if isinstance(p, str) else p for p in parts))
