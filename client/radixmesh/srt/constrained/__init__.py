"""Mirror of `sglang.srt.constrained` (see `outlines_backend`)."""
