"""First-hour traps on the client side (issues 11 and 30), without a server: two grammars in one
request, a dict JSON schema, `--json-schema @file`, unknown chat roles, the wrong-port message,
the heartbeat that fills long silent stretches; `generate` with nothing listening, without a
key, and with constrained output cut by the token limit."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from radixmesh.api import build_request
from radixmesh.wrong_port import wrong_service_message

from services.cli import (
    EXIT_CUT,
    EXIT_ERROR,
    build_parser,
    check_cut,
    error_hint,
    generate_kwargs,
    listen_problem,
    main,
    with_heartbeat,
)
from tokenizer_service.validation import InvalidRequest, check_chat_roles

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "kw,names",
    [
        ({"json_schema": "{}", "regex": "a+"}, "json_schema and regex"),
        ({"regex": "a+", "ebnf": 'root ::= "a"'}, "regex and ebnf"),
        ({"json_schema": SCHEMA, "ebnf": 'root ::= "a"'}, "json_schema and ebnf"),
    ],
)
def test_client_refuses_two_grammars(kw: dict[str, object], names: str) -> None:
    with pytest.raises(ValueError, match=f"at most one of json_schema, regex or ebnf.*{names}"):
        build_request("hi", **kw)  # type: ignore[arg-type]


def test_client_takes_json_schema_as_dict_or_text() -> None:
    as_dict = build_request("hi", json_schema=SCHEMA)
    as_text = build_request("hi", json_schema=json.dumps(SCHEMA))
    assert as_dict.sampling.WhichOneof("constraint") == "json_schema"
    assert json.loads(as_dict.sampling.json_schema) == SCHEMA
    assert as_dict.sampling.json_schema == as_text.sampling.json_schema


def _generate_ns(*args: str) -> dict[str, object]:
    return generate_kwargs(build_parser().parse_args(["generate", "prompt", *args]))


def test_cli_refuses_two_grammars(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _generate_ns("--regex", "a+", "--ebnf", 'root ::= "a"')
    assert exc.value.code == 2
    assert "--ebnf: not allowed with argument --regex" in capsys.readouterr().err


def test_cli_json_schema_from_text_at_file_and_path(tmp_path: Path) -> None:
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(SCHEMA))
    for arg in (json.dumps(SCHEMA), f"@{f}", str(f)):
        kw = _generate_ns("--json-schema", arg)
        assert json.loads(str(kw["json_schema"])) == SCHEMA, arg
        assert "regex" not in kw and "ebnf" not in kw
    assert _generate_ns()["request_id"] != _generate_ns()["request_id"]  # one per run


@pytest.mark.parametrize(
    "arg,needle",
    [("@/nonexistent/schema.json", "cannot read schema file"), ("{not json", "not valid JSON")],
)
def test_cli_json_schema_errors(
    arg: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _generate_ns("--json-schema", arg)
    assert needle in capsys.readouterr().err


def test_cli_json_flag_is_output_format_only(capsys: pytest.CaptureFixture[str]) -> None:
    kw = _generate_ns("--json")
    assert "json_schema" not in kw  # --json never turns on JSON mode
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "output format; JSON mode is --json-schema" in " ".join(capsys.readouterr().out.split())


def test_unknown_chat_role_names_the_valid_ones() -> None:
    check_chat_roles(["system", "user", "assistant", "user"])
    with pytest.raises(InvalidRequest) as exc:
        check_chat_roles(["user", "bot"])
    assert str(exc.value) == (
        "chat message 1 has role 'bot'; valid roles are system, user, assistant, tool"
    )


def test_wrong_service_message() -> None:
    ep = "localhost:50052"
    msg = wrong_service_message(ep, ["grpc.health.v1.Health", "radixmesh.v1.Scheduler"])
    assert msg is not None
    assert msg.startswith("localhost:50052 is RadixMesh's scheduler service, an internal port")
    assert "tokenizer service's port" in msg
    model = wrong_service_message(ep, ["radixmesh.v1.ModelWorker"])
    assert model is not None and "model service" in model
    other = wrong_service_message(ep, ["acme.Thing", "grpc.reflection.v1alpha.ServerReflection"])
    assert other is not None and "does not serve the RadixMesh API (it serves acme.Thing)" in other
    unknown = wrong_service_message(ep, None)
    assert unknown is not None and "radixmesh.v1.RadixMesh" in unknown
    # the API itself answered UNIMPLEMENTED: its own message stands
    assert wrong_service_message(ep, ["radixmesh.v1.RadixMesh"]) is None


def test_heartbeat_reports_elapsed_time_and_returns_or_raises() -> None:
    notes: list[str] = []
    two_notes = threading.Event()

    def say(msg: str) -> None:
        notes.append(msg)
        if len(notes) >= 2:
            two_notes.set()

    def slow() -> int:
        assert two_notes.wait(30), "no heartbeat"
        return 7

    assert with_heartbeat("converting", slow, every=0.01, say=say) == 7
    assert notes[0].startswith("converting ... ") and notes[0].endswith(" s")

    def broken() -> int:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        with_heartbeat("converting", broken, every=0.01, say=say)


def test_internal_certificate_names_its_role(tmp_path: Path) -> None:
    from cryptography import x509
    from radixmesh.wrong_port import INTERNAL_CERT_NAME, _last_common_name

    from services.pki import make_local_pki
    from services.transport_config import INTERNAL_SERVER_NAME

    assert INTERNAL_CERT_NAME.decode() == INTERNAL_SERVER_NAME  # the client's copy is current
    files = make_local_pki(tmp_path, ["scheduler", "model"])
    for role in ("scheduler", "model"):
        der = x509.load_pem_x509_certificate(files[role].cert.read_bytes()).public_bytes(
            serialization.Encoding.DER
        )
        assert INTERNAL_CERT_NAME in der
        assert _last_common_name(der) == role  # the subject's CN, not the CA's (issuer)


# -- generate's answers to a person (issue 30 items 5 and 6) ----------------------------------
def test_generate_with_nothing_listening_fails_at_once_naming_serve(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It took 34 s of gRPC retries to print a raw UNAVAILABLE. The refused connect is known
    at once: assert that no gRPC call was even made (the client is never built)."""
    from services.launcher import free_port

    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert listen_problem(endpoint) is not None
    assert main(["generate", "hi", "--endpoint", endpoint]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"radixmesh generate: nothing answers at {endpoint} (")
    assert "is `radixmesh serve` running?" in err and "--endpoint" in err
    assert listen_problem("dns:///somewhere:50051") is None  # left to gRPC


def test_auth_errors_name_the_flag_and_the_variable() -> None:
    import grpc
    from radixmesh.api import RadixMeshError

    hint = error_hint(RadixMeshError(grpc.StatusCode.UNAUTHENTICATED, "missing API key"))
    assert "--api-key KEY" in hint and "RADIXMESH_API_KEY" in hint
    assert error_hint(RadixMeshError(grpc.StatusCode.INVALID_ARGUMENT, "bad")) == ""
    ns = build_parser().parse_args(["generate", "hi", "--api-key", "s3cret"])
    assert ns.api_key == "s3cret"
    assert build_parser().parse_args(["generate", "hi"]).api_key is None  # env, in the client


@pytest.mark.parametrize(
    "args,finish,code",
    [
        (["--json-schema", '{"type": "object"}'], "length", EXIT_CUT),
        (["--regex", "[a-z]+"], "length", EXIT_CUT),
        (["--ebnf", 'root ::= "a"'], "length", EXIT_CUT),
        (["--json-schema", '{"type": "object"}'], "stop", 0),
        ([], "length", 0),  # plain text cut at the limit is an ordinary ending
    ],
)
def test_constrained_output_cut_by_the_limit_warns_and_exits_distinctly(
    args: list[str], finish: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = build_parser().parse_args(["generate", "hi", "--max-new-tokens", "7", *args])
    assert check_cut(ns, finish) == code
    err = capsys.readouterr().err
    if code:
        assert err.startswith("radixmesh generate: warning: the output was cut at ")
        assert "--max-new-tokens 7" in err and args[0] in err
    else:
        assert err == ""
