"""services.placement.plan_placement: which GPUs each replica's ranks get, the defaults, and
refusals that name the numbers."""

from __future__ import annotations

import pytest

from services.placement import NCCL_ENV, plan_placement, visible_gpus


def test_defaults_use_every_visible_gpu_one_replica_each() -> None:
    p = plan_placement([0, 1, 2, 3])
    assert (p.tp, p.replicas) == (1, ((0,), (1,), (2,), (3,)))
    assert p.model_args() == []
    assert p.env(2) == {"CUDA_VISIBLE_DEVICES": "2", **NCCL_ENV}
    assert NCCL_ENV["NCCL_NVLS_ENABLE"] == "0"
    assert "4 replica(s) x TP1" in p.note


def test_gpus_tp_replicas_as_the_issue_writes_it() -> None:
    p = plan_placement(range(8), gpus=[0, 1, 2, 3], tp=2, replicas=2)
    assert p.replicas == ((0, 1), (2, 3))
    assert p.model_args() == ["--tp", "2"]
    assert p.env(1) == {"CUDA_VISIBLE_DEVICES": "2,3", **NCCL_ENV}
    assert "(0,1 | 2,3)" in p.note
    assert [e["CUDA_VISIBLE_DEVICES"] for e in p.replica_envs()] == ["0,1", "2,3"]


def test_tp_alone_fits_as_many_replicas_as_there_are_gpus_and_names_the_spare() -> None:
    p = plan_placement([0, 1, 2, 3, 4], tp=2)
    assert p.replicas == ((0, 1), (2, 3))
    assert "GPU(s) 4 left unused" in p.note


def test_replicas_alone_split_the_gpus_evenly() -> None:
    p = plan_placement([4, 5, 6, 7], replicas=2)
    assert (p.tp, p.replicas) == (2, ((4, 5), (6, 7)))
    p = plan_placement([0, 1, 2, 3], replicas=1)
    assert (p.tp, p.replicas) == (4, ((0, 1, 2, 3),))


def test_gpu_order_is_kept_so_a_replica_can_be_given_chosen_neighbours() -> None:
    p = plan_placement(range(4), gpus=[3, 2, 1, 0], tp=2)
    assert p.replicas == ((3, 2), (1, 0))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tp": 4}, "--tp 4 needs 4 GPUs per replica; only 2 given"),
        ({"tp": 2, "replicas": 2}, "--tp 2 x --replicas 2 needs 4 GPUs; only 2 given"),
        ({"replicas": 3}, "--replicas 3 needs at least 3 GPUs; 2 given"),
        ({"gpus": [0, 0]}, "--gpus 0,0 names a GPU twice"),
        ({"gpus": [1, 5]}, "--gpus 1,5: GPU 5 is not visible (visible: 0,1)"),
        ({"tp": 0}, "--tp must be at least 1 (got 0)"),
    ],
)
def test_refusals_name_the_numbers(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        plan_placement([0, 1], **kw)  # type: ignore[arg-type]
    assert message in str(exc.value)


def test_no_gpu_means_the_cpu_with_the_sizes_given() -> None:
    p = plan_placement([], tp=2, replicas=2)
    assert (p.tp, p.replicas) == (2, ((), ()))
    assert p.env(0) == {} and p.model_args() == ["--tp", "2"]
    assert plan_placement([]).replicas == ((),)
    with pytest.raises(ValueError, match="GPU 0 is not visible"):
        plan_placement([], gpus=[0])


def test_visible_gpus_from_cuda_visible_devices_else_nvidia_smi() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, lambda: "0\n1\n") == [2, 3]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, lambda: "0\n") == []
    assert visible_gpus({}, lambda: "0\n1\n2\n3\n") == [0, 1, 2, 3]
    assert visible_gpus({}, lambda: "") == []  # no nvidia-smi: the CPU
    with pytest.raises(ValueError, match="GPU numbers"):
        visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-5f3c"}, lambda: "")
