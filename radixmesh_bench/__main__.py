"""`python -m radixmesh_bench ...`: what `radixmesh bench ...` runs."""

from __future__ import annotations

import sys

from radixmesh_bench.cli import main

sys.exit(main())
