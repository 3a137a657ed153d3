"""services.model_fetch: the gpu overlay's download Job and wait-for-model init
containers, without the network (a folder already present is never downloaded again)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.model_fetch import ModelFetchConfig, fetch, wait_for


def test_wait_returns_once_config_json_appears(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    assert not wait_for(folder, timeout_s=0.2, poll_s=0.05)

    def publish() -> None:
        time.sleep(0.2)  # stand-in for a download's time, not synchronisation
        partial = tmp_path / "model.partial"
        partial.mkdir()
        (partial / "config.json").write_text("{}")
        partial.rename(folder)

    t = threading.Thread(target=publish)
    t.start()
    assert wait_for(folder, timeout_s=10, poll_s=0.05)
    t.join()


def test_present_folder_is_not_downloaded(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    cfg = ModelFetchConfig(hf_model="no/such-repo", model_dir=str(tmp_path))
    assert fetch(cfg) == tmp_path  # no network call: it would fail for this repo id


def test_download_needs_a_repo_unless_waiting() -> None:
    with pytest.raises(ValueError, match="--hf-model"):
        ModelFetchConfig().validate()
    ModelFetchConfig(wait=True).validate()


@pytest.mark.integration  # starts a process
def test_wait_cli_times_out_with_exit_code_1(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "services.model_fetch", "--wait"]
        + [f"--model-dir={tmp_path / 'none'}", "--wait-timeout-s=0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "model_wait_timeout" in out.stderr
