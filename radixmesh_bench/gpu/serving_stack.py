"""The four services for the serving parts: one model process per part, the scheduler
restarted (cold cache, fresh counters) for each configuration.

Model service: `--random-weights MODEL --device DEVICE`, flashinfer on CUDA (reference
attention on CPU), CUDA graphs captured up to `max_running` rows; tokenizer and grammar
services on the random model's folder (its config.json and the Llama-3.1 tokenizer);
scheduler `--chunk-tokens 8192 --max-running max_running` plus the configuration's own flags.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from radixmesh_bench.gpu.common import log, log_tails

WARMUP = (8, 128, 16)  # requests, prompt tokens, output tokens (random ids, never reused)
QUICK_WARMUP = (2, 16, 4)


class ServingStack:
    CHUNK_TOKENS = 8192  # prefill budget per step (the scheduler's default is 2048)

    def __init__(self, model: str, device: str, log_dir: Path, max_running: int = 256) -> None:
        from model_service.random_configs import random_config
        from services.launcher import Launcher, StackPorts, stack_specs

        _, model_dir = random_config(model)
        self.ports = StackPorts.free()
        cuda = device.startswith("cuda")
        model_args = [
            "--random-weights",
            model,
            "--device",
            device,
            "--attention",
            "flashinfer" if cuda else "reference",
            "--cuda-graph-max-bs",
            str(max(128, max_running)),
        ]
        self.base_sched = [
            "--chunk-tokens",
            str(self.CHUNK_TOKENS),
            "--max-running",
            str(max_running),
        ]
        specs = stack_specs(
            self.ports, str(model_dir), model_args=model_args, scheduler_args=self.base_sched
        )
        env = {"PYTHONUNBUFFERED": "1"}
        self.launcher = Launcher(specs, log_dir=log_dir, env=env)
        self.log_dir = log_dir
        self.endpoint = f"127.0.0.1:{self.ports.tokenizer}"
        self.started = False
        self._warm_seed = 1000

    def start(self, sched_args: Sequence[str], timeout: float = 300) -> None:
        self.launcher.specs["scheduler"].args = [*self._sched_prefix(), *sched_args]
        t = time.perf_counter()
        self.launcher.start_all()
        self.started = True
        asyncio.run(self.launcher.wait_ready(timeout=timeout))
        log(f"stack ready in {time.perf_counter() - t:.1f}s, scheduler {list(sched_args)}")

    def restart(self, sched_args: Sequence[str], timeout: float = 120) -> None:
        """A new scheduler process (empty cache, zero counters) on the same model process."""
        from services.launcher import check_ready

        self.launcher.specs["scheduler"].args = [*self._sched_prefix(), *sched_args]
        proc = self.launcher.procs["scheduler"]
        proc.terminate()
        proc.wait(30)
        front = self.launcher.specs["tokenizer"].address
        t = time.perf_counter()

        async def again() -> None:
            deadline = time.monotonic() + 10
            # until the front door has seen the old scheduler go (else it could report ready
            # on the stale connection)
            while await check_ready(front) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            self.launcher.start("scheduler")
            await self.launcher.wait_ready(timeout=timeout, names=["scheduler", "tokenizer"])

        asyncio.run(again())
        log(f"scheduler restarted in {time.perf_counter() - t:.1f}s: {list(sched_args)}")

    def _sched_prefix(self) -> list[str]:
        spec_args = self.launcher.specs["scheduler"].args
        addr = [a for a in spec_args if a.startswith(("--model-address", "--grammar-address"))]
        return [*addr, *self.base_sched]

    def warmup(self, quick: bool) -> None:
        """A few short requests of fresh random ids: the first steps after a (re)start pay for
        connections and lazy kernel set-up, which should not land in a measured run."""
        from radixmesh.api import AsyncClient

        from radixmesh_bench.gpu.perf import prompts

        n, ilen, olen = QUICK_WARMUP if quick else WARMUP
        self._warm_seed += 1
        ps = prompts(n, ilen, 128000, self._warm_seed)

        async def go() -> None:
            async with AsyncClient(self.endpoint) as c:
                await asyncio.gather(
                    *(
                        c.generate(
                            input_ids=p, max_new_tokens=olen, ignore_eos=True, temperature=0.0
                        )
                        for p in ps
                    )
                )

        asyncio.run(go())

    def log_tails(self, chars: int = 1500) -> list[str]:
        return log_tails(self.log_dir, chars)

    def stop(self) -> None:
        if self.started:
            self.launcher.stop_all()
            self.started = False
