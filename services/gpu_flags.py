"""`radixmesh serve`'s GPU flags: placement (`--gpus`, `--tp`, with `--replicas`) and the model
execution settings an operator tunes, named as SGLang's `launch_server` names them where the
meaning is the same, each passed on to the service that owns it.

| serve flag | goes to | as |
| --- | --- | --- |
| `--gpus`, `--tp` (`--tp-size`) | placement | CUDA_VISIBLE_DEVICES per replica, `--tp` |
| `--device` | model service | `--device` |
| `--attention-backend` | model service | `--attention` |
| `--dtype` | model service | `--dtype` |
| `--cuda-graph-max-bs` | model service | `--cuda-graph-max-bs` |
| `--mem-fraction-static` | model service | `--kv-memory-fraction` |
| `--context-length` | model service | `--context-length` |
| `--random-weights` | model service | `--random-weights` (the shape's folder serves the others) |
| `--model-threads` | model service | `--threads` |
| `--max-running-requests` | scheduler | `--max-running` |
| `--chunked-prefill-size` | scheduler | `--chunk-tokens` |

A flag left at its default passes nothing: each service keeps its own default (one table per
service, not a second copy here).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.placement import Placement

# serve flag (argparse dest) -> (service kind, the service's own flag)
PASSED_ON: dict[str, tuple[str, str]] = {
    "device": ("model", "--device"),
    "attention_backend": ("model", "--attention"),
    "dtype": ("model", "--dtype"),
    "cuda_graph_max_bs": ("model", "--cuda-graph-max-bs"),
    "mem_fraction_static": ("model", "--kv-memory-fraction"),
    "context_length": ("model", "--context-length"),
    "random_weights": ("model", "--random-weights"),
    "model_threads": ("model", "--threads"),
    "max_running_requests": ("scheduler", "--max-running"),
    "chunked_prefill_size": ("scheduler", "--chunk-tokens"),
}


def gpu_ids(text: str) -> list[int]:
    """`--gpus 0,1,2,3` -> [0, 1, 2, 3] (argparse type)."""
    try:
        ids = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--gpus takes GPU numbers like 0,1 (got {text!r})"
        ) from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"--gpus takes GPU numbers like 0,1 (got {text!r})")
    return ids


def add_gpu_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "GPUs and model execution (SGLang's launch_server names where the meaning is the same)"
    )
    g.add_argument(
        "--gpus",
        type=gpu_ids,
        default=None,
        help="GPU numbers to use, e.g. 0,1,2,3 (default: every visible GPU); replica i takes "
        "the i-th group of --tp GPUs",
    )
    g.add_argument(
        "--tp",
        "--tp-size",
        dest="tp",
        type=int,
        default=None,
        help="tensor-parallel size: each replica's model split over this many GPUs (default: "
        "1 with --replicas unset, else the GPUs split evenly over the replicas)",
    )
    g.add_argument("--device", default=None, help="cpu, cuda or auto (model service's default)")
    g.add_argument(
        "--attention-backend",
        default=None,
        choices=["auto", "reference", "flashinfer"],
        help="attention kernels (model service's default: auto)",
    )
    g.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or auto")
    g.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="largest decode batch replayed from a CUDA graph (0: no graphs)",
    )
    g.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="share of the GPU memory left after the weights that the KV pool takes",
    )
    g.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="longest prompt + output served (default: the model's own)",
    )
    g.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="most requests decoding at once, per replica",
    )
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="most prompt tokens one step prefills (chunked prefill)",
    )
    g.add_argument(
        "--model-threads",
        type=int,
        default=None,
        help="torch intra-op threads of each model-service process (default: 4 on a GPU, "
        "where a step's host-side tensors are small and several replicas or TP ranks share "
        "the host's cores; torch's, every core, on the CPU)",
    )
    g.add_argument(
        "--random-weights",
        default=None,
        help="serve random weights of a published shape (e.g. llama-3.1-8b, llama-3.1-70b) "
        "instead of --model: benchmarks and capacity planning",
    )


def given_args(
    ns: argparse.Namespace, table: dict[str, tuple[str, str]], kinds: tuple[str, ...]
) -> dict[str, list[str]]:
    """Each service kind's flags from the serve flags of `table` (argparse dest -> (kind, the
    service's flag)) that were given; one left at None passes nothing."""
    out: dict[str, list[str]] = {k: [] for k in kinds}
    for dest, (kind, flag) in table.items():
        value = getattr(ns, dest, None)
        if value is not None:
            out[kind] += [flag, str(value)]
    return out


def gpu_service_args(ns: argparse.Namespace) -> dict[str, list[str]]:
    """Each service kind's flags from the GPU flags that were given."""
    return given_args(ns, PASSED_ON, ("model", "scheduler"))


def plan(ns: argparse.Namespace) -> Placement:
    """Where each replica's ranks run (ValueError naming the numbers when it cannot be)."""
    from services.placement import plan_placement, visible_gpus

    visible = [] if ns.device == "cpu" else visible_gpus()
    return plan_placement(visible, gpus=ns.gpus, tp=ns.tp, replicas=ns.replicas)


def random_model_folder(name: str) -> str:
    """The folder (config.json and tokenizer) of a random shape, which the front door and the
    grammar service read. Made by the model service's own code in a child process: this layer
    imports no service."""
    out = subprocess.run(
        [sys.executable, "-m", "model_service.random_configs", name],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode != 0:
        raise ValueError(f"--random-weights {name}: {out.stderr.strip() or 'unknown shape'}")
    return out.stdout.strip().splitlines()[-1]
