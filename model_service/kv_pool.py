"""The KV pool: one K and one V tensor for all layers, indexed by token slot (page size 1).

The scheduler owns the index space (which slot holds which token); this pool only stores.
Shapes: k, v = [num_layers, capacity, num_kv_heads, head_dim].
"""

from __future__ import annotations

import torch


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class KVPool:
    def __init__(
        self,
        num_layers: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        nan_fill: bool = False,
    ) -> None:
        if capacity < 1:
            raise ValueError("KV capacity must be at least one token")
        self.capacity = capacity
        self.nan_fill = nan_fill
        shape = (num_layers, capacity, num_kv_heads, head_dim)
        fill = float("nan") if nan_fill else 0.0
        self.k = torch.full(shape, fill, dtype=dtype, device=device)
        self.v = torch.full(shape, fill, dtype=dtype, device=device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def poison(self, slots: torch.Tensor) -> None:
        """Debug: a freed slot reads as NaN, so any read after free shows up in the output."""
        if self.nan_fill and slots.numel():
            self.k[:, slots] = float("nan")
            self.v[:, slots] = float("nan")
