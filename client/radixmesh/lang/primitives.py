"""The DSL's primitives: `gen`, `select` and the chat roles.

They only *build* IR expressions; nothing runs until an expression is appended to a state
(`s += gen("x")`). Expressions compose with `+`: `assistant("Answer: " + gen("a"))`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixmesh.lang.choices import token_length_normalized
from radixmesh.lang.ir import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    ROLES,
    Concat,
    Expr,
    Gen,
    Role,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Text,
    flatten,
)
from radixmesh.lang.params import make_params

_DTYPE_REGEX = {int: REGEX_INT, float: REGEX_FLOAT, bool: REGEX_BOOL, str: REGEX_STR}
_DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}


def _dtype_regex(dtype: type | str) -> str:
    key = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if key not in _DTYPE_REGEX:
        raise ValueError(f"unsupported dtype {dtype!r}; expected int, float, bool or str")
    return _DTYPE_REGEX[key]


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: Sequence[str] | None = None,
    choices_method: Any = None,
    regex: str | None = None,
    json_schema: str | Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
    ebnf: str | None = None,
) -> Expr:
    """Generate text at this point of the prompt and store it as `s[name]`.

    Positional parameters are SGLang's, in SGLang's order. Unset knobs fall back to the
    program's defaults (`run(temperature=0, ...)`) and then to the server's. At most one of
    regex / json_schema (str or dict) / ebnf / dtype constrains the output. `choices=` makes
    this a `select` (as in SGLang). `n > 1` stores the list of n samples in `s[name]` and
    appends the first. `frequency_penalty` / `presence_penalty` other than 0 and `stop_regex`
    are refused (the runtime has no such knobs).
    """
    if choices:
        return select(
            name,
            choices,
            0.0 if temperature is None else temperature,
            choices_method=choices_method or token_length_normalized,
        )
    if stop_regex is not None:
        raise ValueError("stop_regex is not supported by RadixMesh; use stop= or regex=")
    if dtype is not None:
        if regex is not None or json_schema is not None or ebnf is not None:
            raise ValueError("give dtype or a regex / json_schema / ebnf constraint, not both")
        regex = _dtype_regex(dtype)
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
        n=n,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
    )
    return Gen(name, params)


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Expr:
    """`gen(..., dtype=int)`: an integer (SGLang's REGEX_INT)."""
    return gen(name, max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Expr:
    """`gen(..., dtype=str)`: a double-quoted string (SGLang's REGEX_STR)."""
    return gen(name, max_tokens, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: Any = token_length_normalized,
) -> Expr:
    """Append the choice the model finds likeliest after the prompt; store it as `s[name]`.

    All choices are scored in one parallel batch sharing the prompt's cached prefix; see
    `radixmesh.lang.choices` for the methods. Scoring is deterministic, so `temperature`
    must be 0 (SGLang asserts the same).
    """
    if choices is None:
        raise ValueError("select needs choices")
    if isinstance(choices, str):
        raise TypeError("choices must be a sequence of strings, not a string")
    if temperature > 1e-5:
        raise ValueError(
            f"select scores choices deterministically; temperature must be 0, got {temperature}"
        )
    options = tuple(choices)
    if not options:
        raise ValueError("select needs at least one choice")
    if any(not isinstance(c, str) or not c for c in options):
        raise ValueError("choices must be non-empty strings")
    return Select(name, options, choices_method)


def image(path: Any) -> Expr:
    """SGLang's image input (a file path or the image's bytes), for multimodal models: the
    image goes into the prompt as a tag that the backend sends as the image (lang/images.py).
    A text-only model refuses the request with INVALID_ARGUMENT naming the model."""
    from radixmesh.lang.images import image_tag

    return Text(image_tag(path))


def separate_reasoning(expr: Expr, model_type: str | None = None) -> Expr:
    """`separate_reasoning(gen("x"))`: after the gen, `s["x"]` keeps only the answer and
    `s["x_reasoning_content"]` the text inside `<think>...</think>` (the prompt keeps both).
    As in SGLang the result is an expression list (`Concat`, alias `SglExprList`) of the gen
    and a `SeparateReasoning` named after the reasoning variable. `model_type` is kept on it
    for SGLang's signature; every model uses the think markers."""
    gens = [leaf for leaf in flatten(expr) if isinstance(leaf, Gen) and leaf.name]
    if not gens:
        raise ValueError("separate_reasoning needs a named gen")
    return Concat((expr, SeparateReasoning(gens[-1].name or "", model_type)))


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


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


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
