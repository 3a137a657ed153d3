"""The launcher's start-up reporting (issue 11), on stand-in service processes
(tests/unit/fake_service.py) and one real service: ports checked before starting, a service that
cannot bind names the address, a dying service's last lines reach stderr with the log's path
(also without a log folder), repeated start-up deaths stop the restarts, progress per service;
and where models come from (hub ids: the offline message, the download path on a stand-in)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services import model_store
from services.launcher import Launcher, ServiceSpec, StartupFailure, free_port
from services.log_tail import read_tail
from services.model_store import ModelError, resolve_model
from services.ports import port_in_use
from tests.unit.fake_service import CRASH_CODE, CRASH_LINES

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")])}
FAKE = "tests.unit.fake_service"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _launcher(*specs: ServiceSpec, **kw: Any) -> Launcher:
    return Launcher(list(specs), env=ENV, max_backoff=0.05, **kw)


def test_port_check_refuses_before_starting_anything(busy_port: int) -> None:
    assert port_in_use("127.0.0.1", busy_port)
    free = free_port()
    assert not port_in_use("127.0.0.1", free)
    launcher = _launcher(
        ServiceSpec("grammar", FAKE, free, ["serve"]),
        ServiceSpec("tokenizer", FAKE, busy_port, ["serve"]),
    )
    with pytest.raises(StartupFailure) as exc:
        launcher.start_all()
    assert str(exc.value).startswith(
        f"port {busy_port} on 127.0.0.1 (the tokenizer service's gRPC port) is already in use"
    )
    assert "--port" in str(exc.value)
    assert launcher.procs == {}  # nothing started
    assert launcher._log_dir is None  # and no log folder made


@pytest.mark.integration  # starts a process
def test_real_service_that_cannot_bind_names_the_address(busy_port: int) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler_service", "--port", str(busy_port)],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=120,
    )
    assert out.returncode == 1
    assert f"scheduler: cannot listen on 127.0.0.1:{busy_port}" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.integration  # starts a process
def test_dying_service_tail_and_log_path_on_stderr_without_log_dir(
    capsys: pytest.CaptureFixture[str],
) -> None:
    launcher = _launcher(ServiceSpec("model", FAKE, free_port(), ["crash"]))
    try:
        launcher.start_all()
        with pytest.raises(StartupFailure) as exc:
            asyncio.run(launcher.wait_ready(timeout=60))
    finally:
        launcher.stop_all()
    log = launcher.log_dir / "model.log"
    assert log.parent.name.startswith("radixmesh-")
    assert f"exited with code {CRASH_CODE} during start-up" in str(exc.value)
    assert str(log) in str(exc.value)
    err = capsys.readouterr().err
    assert f"radixmesh: service model exited with code {CRASH_CODE} during start-up" in err
    shown = [line.removeprefix("  | ") for line in err.splitlines() if line.startswith("  | ")]
    assert shown == CRASH_LINES
    assert f"full log: {log}" in err
    assert read_tail(log) == CRASH_LINES  # the whole log is where the message says
    shutil.rmtree(log.parent)  # the temporary folder the launcher made


@pytest.mark.integration  # starts a process
def test_supervise_stops_restarting_a_repeated_startup_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launcher = _launcher(
        ServiceSpec("grammar", FAKE, free_port(), ["crash"]),
        log_dir=tmp_path,
        max_startup_failures=3,
    )
    try:
        launcher.start_all()
        with pytest.raises(StartupFailure) as exc:
            asyncio.run(asyncio.wait_for(launcher.supervise(), 60))
    finally:
        launcher.stop_all()
    assert str(exc.value).startswith(
        "service grammar cannot be restarted: it died 3 times in a row before getting ready"
    )
    assert launcher.restarts["grammar"] == 2  # started 3 times in all, then gave up
    err = capsys.readouterr().err
    assert err.count("exited with code 3 before getting ready") == 3
    # each report shows that run's lines only, not the earlier runs' appended to the same file
    assert err.count("fake_failure: cannot open /nonexistent") == 3
    assert read_tail(tmp_path / "grammar.log", lines=100).count(CRASH_LINES[-1]) == 3


@pytest.mark.integration  # starts a process
def test_start_up_progress_names_each_service(tmp_path: Path) -> None:
    launcher = _launcher(
        ServiceSpec("grammar", FAKE, free_port(), ["serve"]),
        ServiceSpec("scheduler", FAKE, free_port(), ["serve"]),
        log_dir=tmp_path,
    )
    events: list[tuple[str, list[str]]] = []
    try:
        launcher.start_all()
        asyncio.run(
            launcher.wait_ready(timeout=60, progress=lambda e, p, t: events.append((e, list(p))))
        )
    finally:
        launcher.stop_all()
    ready = [e for e, _ in events if e.startswith("ready:")]
    assert sorted(ready) == ["ready:grammar", "ready:scheduler"]
    assert events[-1][1] == []  # the last report has nothing pending


# -- models from the hub ----------------------------------------------------------------------
def test_hub_id_without_a_reachable_hub_says_what_to_do(tmp_path: Path) -> None:
    # This machine has no route to the hub: the real download fails, the message explains.
    with pytest.raises(ModelError) as exc:
        resolve_model("radixmesh-test/not-a-model", hub_cache=tmp_path)
    msg = str(exc.value)
    assert msg.startswith("could not download 'radixmesh-test/not-a-model' from the Hugging")
    assert "huggingface-cli download radixmesh-test/not-a-model --local-dir DIR" in msg
    assert "pass --model DIR" in msg


def _standin_hub(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_type: str
) -> list[dict[str, Any]]:
    """huggingface_hub.snapshot_download replaced by a local folder maker (unit test only)."""
    import huggingface_hub

    calls: list[dict[str, Any]] = []

    def snapshot_download(repo_id: str, **kw: Any) -> str:
        calls.append({"repo_id": repo_id, **kw})
        folder = tmp_path / "snapshots" / repo_id.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_hub_id_download_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _standin_hub(monkeypatch, tmp_path, "qwen2")
    assert model_store.is_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
    folder = resolve_model("Qwen/Qwen2.5-0.5B-Instruct", hub_cache=tmp_path / "cache")
    assert folder == tmp_path / "snapshots" / "Qwen--Qwen2.5-0.5B-Instruct"
    assert calls == [
        {
            "repo_id": "Qwen/Qwen2.5-0.5B-Instruct",
            "allow_patterns": model_store.HUB_FILES,
            "cache_dir": tmp_path / "cache",
        }
    ]
    assert "*.safetensors" in model_store.HUB_FILES


def test_hub_model_of_an_unsupported_type_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _standin_hub(monkeypatch, tmp_path, "gpt2")
    with pytest.raises(ModelError, match=r"model_type 'gpt2' is not supported"):
        resolve_model("openai-community/gpt2")


def test_local_paths_are_not_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert not model_store.is_hub_id("models/mine")  # exists here: a local folder
    assert not model_store.is_hub_id("/abs/path/x")
    assert not model_store.is_hub_id("default")
    assert model_store.is_hub_id("org/name")


def test_replicas_share_their_roles_certificate() -> None:
    """Peers authorise by role, so "scheduler-1" must present the scheduler's certificate
    (a certificate per service name made every second replica's links PERMISSION_DENIED)."""
    from services.launcher import Launcher, Topology, sequential_ports, topology_specs

    topo = Topology(replicas=2, grammars=2)
    launcher = Launcher(topology_specs(topo, sequential_ports(40000, topo)), internal_tls=True)
    try:
        assert set(launcher.pki) == {
            "tokenizer",
            "scheduler",
            "model",
            "grammar",
            "launcher",
            "client",
        }
        envs = [
            launcher._service_env(n)["RADIXMESH_MTLS_CERT"] for n in ("scheduler-0", "scheduler-1")
        ]
        assert envs[0] == envs[1] == str(launcher.pki["scheduler"].cert)
    finally:
        launcher.stop_all()


# -- what a stopped stack leaves behind (issue 30 item 7, issue 26 item 7) ---------------------
@pytest.mark.integration  # starts a process
def test_a_services_helper_processes_do_not_outlive_it(tmp_path: Path) -> None:
    """The grammar service's compile forkserver outlived the launcher: whatever a service
    started in its process group is ended with it."""
    import psutil

    pid_file = tmp_path / "helper.pid"
    launcher = _launcher(
        ServiceSpec("grammar", FAKE, free_port(), ["serve", "--helper-pid-file", str(pid_file)]),
        log_dir=tmp_path / "logs",
    )
    try:
        launcher.start_all()
        asyncio.run(launcher.wait_ready(timeout=60))
        helper = psutil.Process(int(pid_file.read_text()))  # written before the service serves
        assert helper.is_running() and helper.status() != psutil.STATUS_ZOMBIE
    finally:
        launcher.stop_all()
    with pytest.raises(psutil.NoSuchProcess):
        helper.wait(timeout=30)  # gone (reaped by whoever adopted it), or never waited on
        helper.status()


@pytest.mark.integration  # starts a process
def test_temporary_log_folder_goes_with_a_clean_stop_and_stays_after_a_death() -> None:
    clean = _launcher(ServiceSpec("grammar", FAKE, free_port(), ["serve"]))
    try:
        clean.start_all()
        asyncio.run(clean.wait_ready(timeout=60))
        folder = clean.log_dir
        assert folder.name.startswith("radixmesh-") and (folder / "grammar.log").exists()
    finally:
        clean.stop_all()
    assert not clean.logs_kept and not folder.exists()  # /tmp/radixmesh-* no longer piles up

    dying = _launcher(ServiceSpec("model", FAKE, free_port(), ["crash"]))
    try:
        dying.start_all()
        with pytest.raises(StartupFailure):
            asyncio.run(dying.wait_ready(timeout=60))
    finally:
        dying.stop_all()
    assert dying.logs_kept and (dying.log_dir / "model.log").exists()  # its tail explains it
    shutil.rmtree(dying.log_dir)


@pytest.mark.integration  # starts a process
def test_an_existing_log_dir_is_tightened_to_0700(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chmod(logs, 0o755)
    launcher = _launcher(ServiceSpec("grammar", FAKE, free_port(), ["serve"]), log_dir=logs)
    try:
        launcher.start_all()
    finally:
        launcher.stop_all()
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    assert stat.S_IMODE((logs / "grammar.log").stat().st_mode) == 0o600
    assert launcher.logs_kept and logs.exists()  # a given folder is never removed
