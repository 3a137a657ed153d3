"""Tensor-parallel sharding (model_service.tp.shard) and the per-rank fit check: shard shapes,
shards that put back together give the whole tensor, KV heads replicated when there are fewer
than ranks (and each rank's query heads use the KV head it holds), refusals naming numbers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from model_service import preflight
from model_service.models.llama import LlamaArgs, LlamaForCausalLM
from model_service.random_configs import config_dict, hf_config
from model_service.tp.shard import Shard, check_divisible, local_args, take
from services.model_store import ModelError


def _args(name: str = "llama-3.1-8b", **kw: object) -> LlamaArgs:
    return LlamaArgs.from_hf_config(hf_config(config_dict(name, **kw)))


def _small(**kw: object) -> LlamaArgs:
    base = {
        "vocab_size": 10,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 4,
    }
    return _args("tiny-llama", **{**base, **kw})


@pytest.mark.parametrize(
    ("name", "tp", "heads", "kv", "mlp", "vocab"),
    [
        ("llama-3.1-8b", 2, 16, 4, 7168, 64128),
        ("llama-3.1-8b", 8, 4, 1, 1792, 16032),
        ("llama-3.1-8b", 16, 2, 1, 896, 8016),  # 8 KV heads over 16 ranks: replicated
        ("llama-3.1-70b", 4, 16, 2, 7168, 32064),
        ("tiny-qwen2", 2, 2, 1, 256, 64128),  # 1 KV head on both ranks
    ],
)
def test_local_shapes(name: str, tp: int, heads: int, kv: int, mlp: int, vocab: int) -> None:
    a = local_args(_args(name), tp)
    assert (a.num_heads, a.num_kv_heads, a.intermediate_size, a.vocab_size) == (
        heads,
        kv,
        mlp,
        vocab,
    )


def _whole(a: LlamaArgs) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {k: torch.randn(v.shape) for k, v in LlamaForCausalLM(a).state_dict().items()}


@pytest.mark.parametrize("tp", [2, 4])
def test_shards_have_the_rank_model_shapes_and_put_back_together(tp: int) -> None:
    a = _small()
    whole = _whole(a)
    with torch.device("meta"):
        local = LlamaForCausalLM(local_args(a, tp)).state_dict()
    parts = {k: [take(k, t, a, Shard(r, tp)) for r in range(tp)] for k, t in whole.items()}
    for k, ps in parts.items():
        assert all(p.shape == local[k].shape for p in ps), k
    hd = a.head_dim
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(torch.cat(parts[q]), whole[q])
    o = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(torch.cat(parts[o], dim=1), whole[o])
    down = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(torch.cat(parts[down], dim=1), whole[down])
    # Vocabulary 10 over tp ranks: ceil(10 / tp) rows each, the padding rows zero.
    emb = torch.cat(parts["model.embed_tokens.weight"])
    assert torch.equal(emb[:10], whole["model.embed_tokens.weight"])
    assert not emb[10:].any()
    norm = "model.layers.0.input_layernorm.weight"
    assert all(torch.equal(p, whole[norm]) for p in parts[norm])
    k = "model.layers.0.self_attn.k_proj.weight"
    if tp == 2:  # 2 KV heads: one each
        assert torch.equal(torch.cat(parts[k]), whole[k])
    else:  # 4 ranks, 2 KV heads: ranks 0, 1 hold head 0; ranks 2, 3 head 1
        for r in range(4):
            h = r // 2
            assert torch.equal(parts[k][r], whole[k][h * hd : (h + 1) * hd])


def test_each_rank_holds_the_kv_head_its_query_heads_use() -> None:
    """GQA: query head h reads KV head h // (heads / kv_heads). A rank's query heads must all
    map to the KV heads it holds, in the same local order."""
    for heads, kv, tp in [(32, 8, 2), (32, 8, 8), (32, 8, 16), (4, 1, 2), (64, 8, 4)]:
        a = _args(num_attention_heads=heads, num_key_value_heads=kv, hidden_size=heads * 8)
        la = local_args(a, tp)
        ids = torch.arange(kv, dtype=torch.float32).repeat_interleave(a.head_dim)[:, None]
        for r in range(tp):
            held = take("x.k_proj.weight", ids, a, Shard(r, tp))[:: a.head_dim, 0].long()
            for j in range(la.num_heads):
                global_q = r * la.num_heads + j
                local_kv = j // (la.num_heads // la.num_kv_heads)
                assert held[local_kv] == global_q // (heads // kv), (heads, kv, tp, r, j)


@pytest.mark.parametrize(
    ("kw", "tp", "expect"),
    [
        ({"num_heads": 6, "num_kv_heads": 2}, 4, "6 attention heads"),
        ({"num_kv_heads": 6, "num_heads": 12}, 4, "6 KV heads"),
        ({"intermediate_size": 30}, 4, "MLP width 30"),
    ],
)
def test_a_model_that_does_not_split_is_refused(kw: dict[str, int], tp: int, expect: str) -> None:
    with pytest.raises(ModelError) as exc:
        check_divisible(dataclasses.replace(_small(), **kw), tp)  # type: ignore[arg-type]
    assert f"--tp {tp} cannot split this model" in str(exc.value) and expect in str(exc.value)


def test_rank_fit_check_names_weights_kv_and_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3.1-70B in bf16 on GPUs with 60 GiB free: over 2 ranks its 35 B parameters each
    do not fit; over 4 they do (the minimal KV is 4,096 tokens of the rank's KV heads)."""
    gib = 1 << 30
    monkeypatch.setattr(preflight, "free_memory", lambda dev: (60 * gib, 80 * gib))
    cuda = torch.device("cuda", 1)
    a = _args("llama-3.1-70b")
    with pytest.raises(ModelError) as exc:
        preflight.check_rank_fits(local_args(a, 2), torch.bfloat16, cuda, Shard(1, 2), 0, False)
    msg = str(exc.value)
    assert "--tp 2 does not fit: rank 1 on cuda:1" in msg
    assert "35.28 B parameters" in msg and "66.15 GiB" in msg
    assert "4096 KV tokens of its 4 KV heads" in msg and "0.62 GiB" in msg
    assert "only 60.00 GiB of 80.00 GiB is free" in msg and "larger --tp" in msg
    preflight.check_rank_fits(local_args(a, 4), torch.bfloat16, cuda, Shard(3, 4), 0, False)


def test_random_70b_has_the_published_shape_and_context() -> None:
    a = _args("llama-3.1-70b")
    assert (a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads) == (80, 8192, 64, 8)
    assert a.max_position == 131072
    assert round(preflight.param_count(a) / 1e9, 2) == 70.55
    # The smallest worthwhile pool is capped, not the context: a CPU test never sizes 131k.
    assert preflight.min_kv_tokens(0, a.max_position) == 4096
