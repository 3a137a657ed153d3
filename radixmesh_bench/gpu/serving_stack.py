"""The four services for the serving parts: one model process per part, the scheduler
restarted (cold cache, fresh counters) for each configuration.

Model service: `--random-weights MODEL --device DEVICE`, flashinfer on CUDA (reference
attention on CPU), CUDA graphs captured up to `max_running` rows; tokenizer and grammar
services on the random model's folder (its config.json and the Llama-3.1 tokenizer);
scheduler `--chunk-tokens 8192 --max-running max_running` plus the configuration's own flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from radixmesh_bench.gpu.common import log, log_tails

WARMUP = (8, 128, 16)  # requests, prompt tokens, output tokens (random ids, never reused)
QUICK_WARMUP = (2, 16, 4)


class ServingStack:
    CHUNK_TOKENS = 8192  # prefill budget per step (the scheduler's default is 2048)

    def __init__(self, model: str, device: str, log_dir: Path, max_running: int = 256) -> None:
        from radixmesh_bench.stack import launcher_for, random_model_args
        from services.launcher import StackPorts, stack_specs

        model_dir, model_args = random_model_args(model, device, max(128, max_running))
        self.ports = StackPorts.free()
        self.base_sched = [
            "--chunk-tokens",
            str(self.CHUNK_TOKENS),
            "--max-running",
            str(max_running),
        ]
        specs = stack_specs(
            self.ports, str(model_dir), model_args=model_args, scheduler_args=self.base_sched
        )
        self.launcher = launcher_for(specs, log_dir, env={"PYTHONUNBUFFERED": "1"})
        self.log_dir = log_dir
        self.endpoint = f"127.0.0.1:{self.ports.tokenizer}"
        self._running = contextlib.ExitStack()  # holds the stack while it runs
        self._warm_seed = 1000

    def start(self, sched_args: Sequence[str], timeout: float = 300) -> None:
        """Start the four services (radixmesh_bench.stack.running), the scheduler with
        `sched_args`; they run until `stop` (a failed start-up has stopped them already)."""
        from radixmesh_bench.stack import running

        self.launcher.specs["scheduler"].args = [*self._sched_prefix(), *sched_args]
        t = time.perf_counter()
        self._running.enter_context(running(self.launcher, timeout=timeout))
        log(f"stack ready in {time.perf_counter() - t:.1f}s, scheduler {list(sched_args)}")

    def restart(self, sched_args: Sequence[str], timeout: float = 120) -> None:
        """A new scheduler process (empty cache, zero counters) on the same model process."""
        from radixmesh_bench.stack import restart_scheduler

        t = time.perf_counter()
        restart_scheduler(self.launcher, [*self._sched_prefix(), *sched_args], timeout)
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
        self._running.close()
