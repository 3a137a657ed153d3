"""A stand-in service process for the launcher's unit tests (never used outside them).

python -m tests.unit.fake_service --port P crash   # prints a few lines, exits 3
python -m tests.unit.fake_service --port P serve   # a real gRPC health server, ready at once
python -m tests.unit.fake_service --port P serve --helper-pid-file F
    # the same, with a helper child process (like the grammar service's compile forkserver)
    # whose pid is written to F before serving
"""

from __future__ import annotations

import argparse
import sys

CRASH_LINES = ["loading weights", "reading config", "fake_failure: cannot open /nonexistent"]
CRASH_CODE = 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("mode", choices=["crash", "serve"])
    p.add_argument("--helper-pid-file", default="")
    ns = p.parse_args()
    if ns.mode == "crash":
        for line in CRASH_LINES:
            print(line, file=sys.stderr, flush=True)
        sys.exit(CRASH_CODE)
    if ns.helper_pid_file:
        import subprocess
        from pathlib import Path

        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(ns.helper_pid_file).write_text(str(helper.pid))
    from services.server import run, run_server

    run(lambda: run_server("fake", "127.0.0.1", ns.port, lambda server, health: []))


if __name__ == "__main__":
    main()
