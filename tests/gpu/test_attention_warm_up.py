"""flashinfer's start-up warm-up on a real GPU (model_service/attention/flashinfer.py warm_up):
choose_attention compiles and runs both kernels on the scratch slot, then leaves the pool as it
found it. Skipped without CUDA or flashinfer."""

from __future__ import annotations

import pytest
import torch

from model_service.attention.flashinfer import choose_attention, flashinfer_available
from model_service.kv_pool import KVPool

pytestmark = pytest.mark.skipif(not flashinfer_available()[0], reason="needs CUDA and flashinfer")


@pytest.mark.parametrize("nh", [8, 2])  # tensor-core decode (GQA 4) and CUDA-core decode
def test_warm_up_runs_flashinfer_and_leaves_the_pool_as_it_was(nh: int) -> None:
    pool = KVPool(2, 17, 2, 64, torch.bfloat16, "cuda", nan_fill=True)
    pool.capacity = 16
    attn, note = choose_attention("auto", pool, nh, 2, 64)
    assert attn.name == "flashinfer" and note == ""
    assert torch.isnan(pool.k).all() and torch.isnan(pool.v).all()
