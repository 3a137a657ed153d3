"""deploy/k8s rendered and checked without a cluster: every overlay renders, every object
validates against the Kubernetes API schemas, and the policies the deployment promises hold
on the rendered objects (probes, resources, securityContext, pinned images, network exposure,
and flags / variables / probe names the code really knows)."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest

from services.discovery import parse_address_spec
from services.drain import INTERNAL_EXTRA_S
from services.pki import CA_FILE, CERT_FILE, KEY_FILE
from services.server import LIVENESS, READINESS
from tests.deploy.manifests import (
    OVERLAYS,
    ROOT,
    Container,
    config_problems,
    containers,
    of_kind,
    parsed_config,
    placeholder_secrets,
    render,
    secret_file,
    secret_mounts,
)

K8S_VERSION = "1.32"  # the schemas every object must validate against (strict: no unknown keys)

EXPECTED_KINDS = {
    "Namespace": {"radixmesh"},
    "ServiceAccount": {"radixmesh"},
    "ConfigMap": {"radixmesh-grafana-dashboard"},
    "Deployment": {"radixmesh-frontdoor", "radixmesh-replica", "radixmesh-grammar"},
    "Service": {"radixmesh-frontdoor", "radixmesh-replica", "radixmesh-grammar"},
    "HorizontalPodAutoscaler": {"radixmesh-frontdoor", "radixmesh-replica", "radixmesh-grammar"},
    "PodDisruptionBudget": {"radixmesh-frontdoor", "radixmesh-replica", "radixmesh-grammar"},
    "NetworkPolicy": {
        "radixmesh-default-deny",
        "radixmesh-frontdoor",
        "radixmesh-replica",
        "radixmesh-grammar",
    },
}
GPU_EXTRA = {
    "PersistentVolumeClaim": {"radixmesh-models"},
    "Job": {"radixmesh-model-download"},
    "NetworkPolicy": {"radixmesh-model-download"},
}


def _names(objs: tuple[dict[str, Any], ...]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for o in objs:
        out.setdefault(o["kind"], set()).add(o["metadata"]["name"])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_whole_topology(overlay: str) -> None:
    want = {k: set(v) for k, v in EXPECTED_KINDS.items()}
    if overlay.startswith("gpu"):
        for k, v in GPU_EXTRA.items():
            want.setdefault(k, set()).update(v)
    objs = render(overlay)
    assert _names(objs) == want
    for o in objs:
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == "radixmesh", o["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_api_schema(overlay: str) -> None:
    for obj in render(overlay):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_schema_validation_can_fail() -> None:
    dep = json.loads(json.dumps(of_kind(render("cpu"), "Deployment")[0]))
    dep["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["sevice"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_locked_down_and_bounded(overlay: str) -> None:
    for c in containers(render(overlay)):
        pod_sec = c.pod.get("securityContext", {})
        sec = c.spec.get("securityContext", {})
        assert sec.get("allowPrivilegeEscalation") is False, c.where
        assert sec.get("readOnlyRootFilesystem") is True, c.where
        assert sec.get("capabilities", {}).get("drop") == ["ALL"], c.where
        assert "add" not in sec.get("capabilities", {}), c.where
        assert not sec.get("privileged", False), c.where
        assert sec.get("runAsNonRoot", pod_sec.get("runAsNonRoot")) is True, c.where
        assert pod_sec.get("runAsUser", 0) > 0, c.where
        assert pod_sec.get("seccompProfile", {}).get("type") == "RuntimeDefault", c.where
        assert c.pod.get("automountServiceAccountToken") is False, c.where
        res = c.spec.get("resources", {})
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(kind, {})), (c.where, kind)
        # A read-only root needs a writable /tmp (HF_HOME, torch and flashinfer caches).
        mounts = {m["mountPath"] for m in c.spec.get("volumeMounts", [])}
        assert c.init or "/tmp" in mounts or "/models" in mounts, c.where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned(overlay: str) -> None:
    for c in containers(render(overlay)):
        image = c.spec["image"]
        assert "@sha256:" in image or re.fullmatch(r"[\w./-]+:[\w.-]+", image), image
        tag = image.rsplit(":", 1)[-1]
        assert tag != "latest" and c.spec.get("imagePullPolicy") != "Always", image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_have_grpc_probes_with_the_codes_health_names(overlay: str) -> None:
    for c in containers(render(overlay)):
        if c.init or c.workload["kind"] != "Deployment":
            continue
        cfg = parsed_config(c)
        declared = {p["containerPort"] for p in c.spec["ports"]}
        assert cfg.port in declared, c.where
        # Probes use the plaintext health port (docs/security.md): they keep working when the
        # service port speaks mutual TLS or requires API keys.
        port = cfg.health_port
        assert port and port in declared and port != cfg.port, c.where
        want = {"startupProbe": LIVENESS, "livenessProbe": LIVENESS, "readinessProbe": READINESS}
        for probe, service in want.items():
            grpc = c.spec[probe]["grpc"]
            assert (grpc["port"], grpc["service"]) == (port, service), (c.where, probe)
        # Start-up (weights, CUDA graphs) gets far longer than a liveness failure allows.
        st = c.spec["startupProbe"]
        assert st["periodSeconds"] * st["failureThreshold"] >= 300, c.where
        grace = c.pod["terminationGracePeriodSeconds"]
        assert grace >= 30, c.where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_flags_and_variables_are_known_to_the_code(overlay: str) -> None:
    problems = [p for c in containers(render(overlay)) for p in config_problems(c)]
    assert problems == []
    for c in containers(render(overlay)):
        cfg = parsed_config(c)  # raises on a value its parser or validate() refuses
        if hasattr(cfg, "log_format") and c.module != "services.model_fetch":
            assert cfg.log_format == "json", c.where
        if hasattr(cfg, "host"):
            assert cfg.host == "0.0.0.0", c.where  # probes and peers reach the pod IP


def test_an_unknown_variable_or_flag_is_caught() -> None:
    c = next(c for c in containers(render("cpu")) if c.module == "scheduler_service")
    bad = Container(c.workload, c.pod, json.loads(json.dumps(c.spec)), False)
    bad.spec["env"].append({"name": "RADIXMESH_MODEL", "value": "x"})  # not a scheduler field
    bad.spec["args"] = ["--no-such-flag"]
    problems = config_problems(bad)
    assert any("RADIXMESH_MODEL is read by nothing" in p for p in problems), problems
    assert any("--no-such-flag" in p for p in problems), problems


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_front_door_is_reachable_from_outside(overlay: str) -> None:
    objs = render(overlay)
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in objs
        if d["kind"] in ("Deployment", "Job")
    }
    for svc in of_kind(objs, "Service"):
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
    (front,) = [c for c in containers(objs) if c.module == "tokenizer_service" and not c.init]
    cfg = parsed_config(front)
    public = {cfg.port, cfg.http_port}  # gRPC and HTTP APIs, both behind the API keys
    pols = of_kind(objs, "NetworkPolicy")
    deny = [p for p in pols if p["spec"]["podSelector"] == {}]
    assert deny and set(deny[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny[0]["spec"] and "egress" not in deny[0]["spec"]
    open_to: set[str] = set()
    for pol in pols:
        sel = pol["spec"]["podSelector"].get("matchLabels", {})
        for rule in pol["spec"].get("ingress", []):
            sources = rule.get("from")
            outside = sources is None or any("ipBlock" in s for s in sources)
            if outside:
                open_to |= {n for n, labels in pods.items() if sel and _selects(sel, labels)}
                ports = {p["port"] for p in rule["ports"]}
                assert ports <= public, (pol["metadata"]["name"], ports)
    assert open_to == {"radixmesh-frontdoor"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_internal_traffic_follows_the_real_links(overlay: str) -> None:
    """(source component, destination component, port) allowed by ingress rules between pods."""
    objs = render(overlay)
    links = set()
    for pol in of_kind(objs, "NetworkPolicy"):
        dst = pol["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component")
        for rule in pol["spec"].get("ingress", []):
            for src in rule.get("from", []):
                comp = src.get("podSelector", {}).get("matchLabels", {})
                if "app.kubernetes.io/component" in comp and "namespaceSelector" not in src:
                    for p in rule["ports"]:
                        links.add((comp["app.kubernetes.io/component"], dst, p["port"]))
    assert links == {("frontdoor", "replica", 50052), ("replica", "grammar", 50054)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_has_a_service_hpa_and_pdb(overlay: str) -> None:
    objs = render(overlay)
    for dep in of_kind(objs, "Deployment"):
        name = dep["metadata"]["name"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        ports = {
            p.get("name") for c in dep["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        }
        svc = next(s for s in of_kind(objs, "Service") if s["metadata"]["name"] == name)
        assert _selects(svc["spec"]["selector"], labels)
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
        hpa = next(
            h for h in of_kind(objs, "HorizontalPodAutoscaler") if h["metadata"]["name"] == name
        )
        assert hpa["spec"]["scaleTargetRef"]["name"] == name
        pdb = next(p for p in of_kind(objs, "PodDisruptionBudget") if p["metadata"]["name"] == name)
        assert _selects(pdb["spec"]["selector"]["matchLabels"], labels)
        assert dep["spec"]["template"]["spec"]["topologySpreadConstraints"], name
    for name in ("radixmesh-replica", "radixmesh-grammar"):
        svc = next(s for s in of_kind(objs, "Service") if s["metadata"]["name"] == name)
        assert svc["spec"]["clusterIP"] == "None", name  # headless: callers see every pod


def _code_metric_names() -> set[str]:
    names = set()
    for path in ROOT.glob("*/metrics.py"):
        text = path.read_text()
        made = re.findall(r'(?:name|histogram|counter|gauge)\(\s*"([a-z0-9_]+)"', text)
        names |= {"radixmesh_" + n for n in made}
        names |= {"radixmesh_" + n for n in re.findall(r'Reading\(\s*"([a-z0-9_]+)"', text)}
    return names


def test_queue_depth_autoscaling_uses_a_metric_the_scheduler_exports() -> None:
    hpa = next(
        h
        for h in of_kind(render("cpu"), "HorizontalPodAutoscaler")
        if h["metadata"]["name"] == "radixmesh-replica"
    )
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "radixmesh_num_queue_reqs"
    assert "radixmesh_num_queue_reqs" in _code_metric_names()
    rules = (ROOT / "deploy/k8s/monitoring/prometheus-adapter-rules.yaml").read_text()
    assert "radixmesh_num_queue_reqs" in rules and metric in rules


def test_dashboard_only_uses_metrics_the_code_exports() -> None:
    cm = of_kind(render("cpu"), "ConfigMap")[0]
    dash = json.loads(cm["data"]["radixmesh-dashboard.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {
        re.sub(r"_(total|bucket|sum|count)$", "", m)
        for e in exprs
        for m in re.findall(r"radixmesh[:_][a-z0-9_]+", e)
    }
    known = _code_metric_names()
    assert len(used) >= 15 and used <= known, used - known


def test_pod_monitor_scrapes_every_metrics_port() -> None:
    import yaml

    mon = yaml.safe_load((ROOT / "deploy/k8s/monitoring/podmonitor.yaml").read_text())
    scraped = {e["port"] for e in mon["spec"]["podMetricsEndpoints"]}
    for c in containers(render("cpu")):
        if c.init:
            continue
        metrics = [p for p in c.spec["ports"] if "metrics" in p["name"]]
        assert len(metrics) == 1 and metrics[0]["name"] in scraped, c.where
        assert metrics[0]["containerPort"] == parsed_config(c).metrics_port, c.where


def _services(overlay: str) -> list[Container]:
    """The long-running service containers (no init containers, no Jobs)."""
    return [
        c for c in containers(render(overlay)) if not c.init and c.workload["kind"] == "Deployment"
    ]


# The certificate role each service presents: the roles security.require_peer admits on its
# callee (scheduler admits `tokenizer`, model and grammar admit `scheduler`).
ROLE_OF = {
    "tokenizer_service": "tokenizer",
    "scheduler_service": "scheduler",
    "model_service": "model",
    "grammar_service": "grammar",
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_internal_links_use_each_roles_certificate_from_a_read_only_secret(overlay: str) -> None:
    for c in _services(overlay):
        cfg = parsed_config(c)
        role = ROLE_OF[c.module]
        files = {
            "ca": (cfg.mtls_ca, CA_FILE),
            "cert": (cfg.mtls_cert, CERT_FILE),
            "key": (cfg.mtls_key, KEY_FILE),
        }
        for what, (path, key) in files.items():
            assert secret_file(c, path) == (f"radixmesh-mtls-{role}", key), (c.where, what)
        for m in c.spec["volumeMounts"]:
            if m["mountPath"] in secret_mounts(c):
                assert m.get("readOnly") is True, (c.where, m)
        for v in c.pod["volumes"]:
            if "secret" in v:  # group-readable for the pod's fsGroup, nobody else
                assert v["secret"]["defaultMode"] & 0o007 == 0, (c.where, v)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_front_door_reads_its_api_keys_from_a_secret(overlay: str) -> None:
    (front,) = [c for c in _services(overlay) if c.module == "tokenizer_service"]
    cfg = parsed_config(front)
    assert secret_file(front, cfg.api_keys_file) == ("radixmesh-api-keys", "api-keys")
    assert not cfg.api_keys and not cfg.admin_api_keys  # never a key in the manifest itself


def _referenced_secrets() -> dict[str, set[str]]:
    """Secret name -> the keys the rendered workloads of every overlay read from it."""
    out: dict[str, set[str]] = {}
    for overlay in OVERLAYS:
        for c in containers(render(overlay)):
            for value in c.env().values():
                where = secret_file(c, value)
                if where:
                    out.setdefault(where[0], set()).add(where[1])
            for e in c.spec.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    out.setdefault(ref["name"], set()).add(ref["key"])
            for secret in secret_mounts(c).values():
                out.setdefault(secret, set())
    return out


def test_placeholder_secrets_are_empty_and_match_what_pods_read() -> None:
    placeholders = placeholder_secrets()
    referenced = _referenced_secrets()
    assert set(placeholders) == set(referenced)
    for name, secret in placeholders.items():
        kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
        assert secret["metadata"]["namespace"] == "radixmesh", name
        assert "data" not in secret, name  # nothing encoded hides here
        values = secret["stringData"]
        assert referenced[name] <= set(values), (name, referenced[name])
        assert all(v == "" for v in values.values()), f"{name} holds a value: never commit one"
    # No overlay applies a Secret: `kubectl apply -k` must never overwrite the real ones.
    for overlay in OVERLAYS:
        assert not of_kind(render(overlay), "Secret"), overlay


# A container's grace plus its exit must fit before the kubelet's SIGKILL.
DRAIN_MARGIN_S = 10.0
# Who calls whom: a callee drains longer than its callers, so a request that fits the
# caller's grace never loses a dependency first (services/drain.py).
CALLEES = {
    "tokenizer_service": ("scheduler_service",),
    "scheduler_service": ("model_service", "grammar_service"),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shutdown_grace_fits_the_pod_and_callees_outlast_callers(overlay: str) -> None:
    grace: dict[str, float] = {}
    longest: dict[str, float] = {}
    for c in _services(overlay):
        assert "RADIXMESH_SHUTDOWN_GRACE_S" in c.env(), c.where  # set, not a code default
        g = float(parsed_config(c).shutdown_grace_s)
        period = c.pod["terminationGracePeriodSeconds"]
        assert g + DRAIN_MARGIN_S <= period, (c.where, g, period)
        grace[c.module] = g
        name = c.workload["metadata"]["name"]
        longest[name] = max(longest.get(name, 0.0), g)
    for dep in of_kind(render(overlay), "Deployment"):
        # The pod's period is its longest grace plus the margin, not an unrelated number.
        period = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert longest[dep["metadata"]["name"]] + DRAIN_MARGIN_S == period, dep["metadata"]
    for caller, callees in CALLEES.items():
        for callee in callees:
            assert grace[callee] >= grace[caller] + INTERNAL_EXTRA_S, (caller, callee, grace)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_peers_are_found_through_headless_services_by_dns(overlay: str) -> None:
    """Front doors reach every replica, schedulers every grammar service, as
    `dns:///<headless Service>:<port>` (re-resolved: pods that come and go are picked up)."""
    objs = render(overlay)
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    by_module = {c.module: c for c in _services(overlay)}
    links = {
        ("tokenizer_service", "scheduler_address"): "scheduler_service",
        ("scheduler_service", "grammar_address"): "grammar_service",
    }
    for (caller, field), callee in links.items():
        spec = parse_address_spec(getattr(parsed_config(by_module[caller]), field))
        assert spec.kind == "dns", (caller, field)
        svc = services[spec.host]
        assert svc["spec"]["clusterIP"] == "None", spec.host
        (sp,) = [p for p in svc["spec"]["ports"] if p["port"] == spec.port]
        target = by_module[callee]
        labels = target.workload["spec"]["template"]["metadata"]["labels"]
        assert _selects(svc["spec"]["selector"], labels), spec.host
        (cp,) = [p for p in target.spec["ports"] if p["name"] == sp["targetPort"]]
        assert cp["containerPort"] == parsed_config(target).port, (caller, field)


def test_tp_overlay_gives_the_model_pod_one_gpu_per_rank() -> None:
    """gpu-tp: one replica pod holds its N GPUs (nvidia.com/gpu: N, request = limit), its
    model service runs --tp N, NVLink multicast stays off; the other GPU overlay keeps one."""
    for overlay, n in (("gpu", 1), ("gpu-tp", 2)):
        (model,) = [
            c for c in containers(render(overlay)) if c.spec["name"] == "model" and not c.init
        ]
        res = model.spec["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == n
        assert parsed_config(model).tp == n
        if n > 1:
            env = model.env()
            assert env["NCCL_NVLS_ENABLE"] == "0"
            assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == env["NVSHMEM_DISABLE_NVLS"] == "1"
