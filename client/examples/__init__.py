"""Runnable DSL examples: `python -m client.examples.<name> --endpoint HOST:PORT`."""
