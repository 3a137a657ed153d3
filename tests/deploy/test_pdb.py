"""`kubectl drain` must be able to finish: with every overlay's replica counts (the
Deployment's and the lowest its autoscaler may choose), every PodDisruptionBudget allows at
least one pod to be evicted. Computed as the disruption controller does: an integer or a
percentage (rounded up) of the matching pods."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.deploy.manifests import OVERLAYS, of_kind, render


def _count(value: int | str, pods: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(pods * int(value[:-1]) / 100)
    return int(value)


def allowed_disruptions(pdb: dict[str, Any], pods: int) -> int:
    spec = pdb["spec"]
    if "maxUnavailable" in spec:
        return max(_count(spec["maxUnavailable"], pods), 0)
    return max(pods - _count(spec["minAvailable"], pods), 0)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_disruption_arithmetic() -> None:
    pdb = {"spec": {"minAvailable": 1}}
    assert allowed_disruptions(pdb, 1) == 0 and allowed_disruptions(pdb, 2) == 1
    assert allowed_disruptions({"spec": {"maxUnavailable": "50%"}}, 1) == 1
    assert allowed_disruptions({"spec": {"minAvailable": "50%"}}, 3) == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pdb_lets_a_node_drain(overlay: str) -> None:
    objs = render(overlay)
    deployments = of_kind(objs, "Deployment")
    hpas = {
        h["spec"]["scaleTargetRef"]["name"]: h for h in of_kind(objs, "HorizontalPodAutoscaler")
    }
    pdbs = of_kind(objs, "PodDisruptionBudget")
    assert pdbs
    for pdb in pdbs:
        selector = pdb["spec"]["selector"]["matchLabels"]
        targets = [
            d
            for d in deployments
            if _selects(selector, d["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(targets) == 1, (pdb["metadata"]["name"], len(targets))
        dep = targets[0]
        name = dep["metadata"]["name"]
        counts = {dep["spec"].get("replicas", 1)}
        if name in hpas:
            counts.add(hpas[name]["spec"].get("minReplicas", 1))
        for pods in sorted(counts):
            allowed = allowed_disruptions(pdb, pods)
            assert allowed >= 1, (overlay, pdb["metadata"]["name"], pods, pdb["spec"])
