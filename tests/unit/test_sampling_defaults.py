"""One sampling type and one table of defaults: the public wire message reads into
`step_ops.Sampling` field by field by name (no hand copy), an unset field takes the table's
default on every layer (front door validation, scheduler, model service), and every field the
wire and the type share arrives."""

from __future__ import annotations

from dataclasses import fields

from radixmesh_wire.pb import api_pb2, scheduler_pb2
from radixmesh_wire.sampling import sampling_from_params
from radixmesh_wire.step_ops import DEFAULTS, Sampling
from scheduler_service.links.frontend import request_from_proto
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.validation import normalize_sampling


def test_an_empty_wire_message_is_the_defaults_table() -> None:
    assert sampling_from_params(api_pb2.SamplingParams(), api_pb2.LogprobOptions()) == DEFAULTS
    assert Sampling() == DEFAULTS


def test_every_shared_field_arrives() -> None:
    s = api_pb2.SamplingParams(
        temperature=0.5,
        top_p=0.25,
        top_k=7,
        min_p=0.125,
        seed=11,
        max_new_tokens=9,
        min_new_tokens=2,
        ignore_eos=True,
        stop_token_ids=[3, 4],
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.5,
        logit_bias={5: 1.0, 2: -1.0},
    )
    lp = api_pb2.LogprobOptions(return_logprob=True, top_logprobs=3, prompt_logprobs_from=1)
    got = sampling_from_params(s, lp)
    shared = {f.name for f in fields(Sampling)} & (
        set(s.DESCRIPTOR.fields_by_name) | set(lp.DESCRIPTOR.fields_by_name)
    )
    for name in shared:  # each differs from its default, so each was read
        assert getattr(got, name) != getattr(DEFAULTS, name), name
    assert got.logit_bias == ((2, -1.0), (5, 1.0)) and got.stop_token_ids == (3, 4)


def test_unset_fields_get_the_same_defaults_on_every_layer() -> None:
    validated = normalize_sampling(
        api_pb2.SamplingParams(),
        api_pb2.LogprobOptions(),
        prompt_len=4,
        context_length=4096,
        vocab_size=100,
        default_max_new=TokenizerConfig().default_max_new_tokens,
        max_top_logprobs=20,
    )
    assert validated.temperature == DEFAULTS.temperature
    assert validated.max_new_tokens == DEFAULTS.max_new_tokens
    submit = scheduler_pb2.SubmitRequest(rid="r", input_ids=[1, 2], key=1)
    spec = request_from_proto(submit, "session").spec  # a peer that sends nothing
    assert spec.temperature == DEFAULTS.temperature and spec.top_p == DEFAULTS.top_p
    assert spec.max_new_tokens == DEFAULTS.max_new_tokens
    assert spec.repetition_penalty == 1.0 and spec.prompt_logprobs_from == -1
