"""SGLang's `sglang.srt.constrained.outlines_backend` path, for the one name its JSON example
imports: `build_regex_from_object` (a pydantic model or JSON schema as a regex; implemented
without outlines in `radixmesh.lang.json_regex`)."""

from __future__ import annotations

from radixmesh.lang.json_regex import build_regex_from_object, build_regex_from_schema

__all__ = ["build_regex_from_object", "build_regex_from_schema"]
