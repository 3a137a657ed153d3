"""Mirrors of SGLang's `sglang.srt` module paths that frontend programs import (only those)."""
