"""python -m services.model_fetch [--wait]: put a Hugging Face model folder where the
services expect it (the GPU deployment's download Job), or wait until one is there (its init
containers). The folder appears atomically: a download goes to `<dir>.partial` and is
renamed, so a waiter that sees config.json sees a whole folder."""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from services.config import field, parse_config
from services.logging import configure_logging

log = structlog.get_logger(__name__)


@dataclass
class ModelFetchConfig:
    """Download a Hugging Face model folder once, or wait for it."""

    hf_model: str = field("", "Hugging Face repo id to download (token: env HF_TOKEN)")
    revision: str = field("", "revision (branch, tag or commit) to pin; empty: the default")
    model_dir: str = field("/models/model", "folder the services read the model from")
    wait: bool = field(False, "only wait until model_dir holds a model (init containers)")
    wait_timeout_s: float = field(3600.0, "give up waiting after this long")
    log_format: str = field("json", "log lines as key=value text or JSON", choices=["text", "json"])

    def validate(self) -> None:
        if not self.wait and not self.hf_model:
            raise ValueError("--hf-model is required unless --wait")


def ready(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def wait_for(folder: Path, timeout_s: float, poll_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not ready(folder):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def fetch(cfg: ModelFetchConfig) -> Path:
    from huggingface_hub import snapshot_download

    dest = Path(cfg.model_dir)
    if ready(dest):
        log.info("model_present", dir=str(dest))
        return dest
    partial = dest.with_name(dest.name + ".partial")
    log.info("model_download", repo=cfg.hf_model, revision=cfg.revision or None, dir=str(dest))
    snapshot_download(
        cfg.hf_model,
        revision=cfg.revision or None,
        local_dir=partial,
        allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
    )
    shutil.rmtree(partial / ".cache", ignore_errors=True)
    os.replace(partial, dest)
    log.info("model_ready", dir=str(dest))
    return dest


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(ModelFetchConfig, argv)
    configure_logging("model-fetch", "info", json=cfg.log_format == "json")
    if cfg.wait:
        log.info("model_wait", dir=cfg.model_dir)
        if not wait_for(Path(cfg.model_dir), cfg.wait_timeout_s):
            log.error("model_wait_timeout", dir=cfg.model_dir, timeout_s=cfg.wait_timeout_s)
            sys.exit(1)
        log.info("model_present", dir=cfg.model_dir)
        return
    fetch(cfg)


if __name__ == "__main__":
    main()
