"""`radixmesh serve`'s GPU flags (issue 28): each reaches the service that owns it under that
service's own name, placement decides the replicas and each one's GPUs, and what is not given
passes nothing (the services keep their own defaults)."""

from __future__ import annotations

import argparse

import pytest

from services.cli import build_parser
from services.gpu_flags import PASSED_ON, gpu_service_args
from services.placement import plan_placement
from services.serve_cmd import build_specs, service_args
from services.topology import Topology


def _ns(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *args])


def test_every_gpu_flag_reaches_its_service_by_that_services_name() -> None:
    ns = _ns(
        "--device", "cuda",
        "--attention-backend", "flashinfer",
        "--dtype", "bfloat16",
        "--cuda-graph-max-bs", "256",
        "--mem-fraction-static", "0.8",
        "--context-length", "131072",
        "--random-weights", "llama-3.1-8b",
        "--model-threads", "4",
        "--max-running-requests", "512",
        "--chunked-prefill-size", "8192",
    )  # fmt: skip
    got = gpu_service_args(ns)
    assert got["model"] == [
        "--device", "cuda",
        "--attention", "flashinfer",
        "--dtype", "bfloat16",
        "--cuda-graph-max-bs", "256",
        "--kv-memory-fraction", "0.8",
        "--context-length", "131072",
        "--random-weights", "llama-3.1-8b",
        "--threads", "4",
    ]  # fmt: skip
    assert got["scheduler"] == ["--max-running", "512", "--chunk-tokens", "8192"]
    assert len(PASSED_ON) == 10


def test_flags_not_given_pass_nothing() -> None:
    assert gpu_service_args(_ns()) == {"model": [], "scheduler": []}


def test_placement_sets_the_replicas_their_gpus_and_tp() -> None:
    ns = _ns("--gpus", "0,1,2,3", "--tp", "2")
    p = plan_placement([0, 1, 2, 3], gpus=ns.gpus, tp=ns.tp, replicas=ns.replicas)
    topo = Topology(len(p.replicas), 1, 1, replica_env=p.replica_envs())
    specs = build_specs(ns, topo, "default", p)
    models = [s for s in specs if s.name.startswith("model")]
    assert [s.env.get("CUDA_VISIBLE_DEVICES") for s in models] == ["0,1", "2,3"]
    assert all(s.env.get("NCCL_NVLS_ENABLE") == "0" for s in models)
    assert all("--tp" in s.args and s.args[s.args.index("--tp") + 1] == "2" for s in models)
    assert service_args(ns, p)["model"].count("--tp") == 1


def test_kv_tokens_split_over_the_planned_replicas() -> None:
    ns = _ns("--kv-tokens", "8000", "--gpus", "0,1")
    p = plan_placement([0, 1], gpus=ns.gpus, tp=ns.tp, replicas=ns.replicas)
    assert len(p.replicas) == 2  # one replica per GPU by default
    model = service_args(ns, p)["model"]
    assert model[model.index("--kv-tokens") + 1] == "4000"


@pytest.mark.parametrize("bad", ["a,b", "-1", ""])
def test_bad_gpu_lists_are_refused_by_the_parser(bad: str) -> None:
    with pytest.raises(SystemExit):
        _ns("--gpus", bad)
