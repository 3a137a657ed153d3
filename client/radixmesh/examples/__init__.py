"""Runnable DSL examples: `python -m radixmesh.examples.<name> --endpoint HOST:PORT`."""
