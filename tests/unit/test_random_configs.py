"""Random-weight architectures (model_service.random_configs): `llama-3.2-1b` has Meta's
published Llama-3.2-1B shape (the GPU router bench runs two replicas of it on one GPU)."""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from model_service import preflight
from model_service.models.llama import LlamaArgs, LlamaForCausalLM, rope_inv_freq
from model_service.random_configs import config_dict, hf_config, random_config


def test_llama_3_2_1b_has_the_published_shape_and_parameter_count() -> None:
    fields = config_dict("llama-3.2-1b")
    assert (fields["hidden_size"], fields["num_hidden_layers"]) == (2048, 16)
    assert (fields["num_attention_heads"], fields["num_key_value_heads"]) == (32, 8)
    assert (fields["intermediate_size"], fields["vocab_size"]) == (8192, 128256)
    assert fields["rope_theta"] == 500000.0 and fields["rope_scaling"]["factor"] == 32.0
    assert fields["tie_word_embeddings"] is True
    args = LlamaArgs.from_hf_config(hf_config(fields))
    assert args.head_dim == 64 and args.tie_word_embeddings
    with torch.device("meta"):
        model = LlamaForCausalLM(args)
    # The head shares the embedding table: counted once, as Meta's 1.24 B figure does.
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == 1_235_814_400
    assert preflight.param_count(args) == 1_235_814_400
    # The 8B's scaling is untouched by the 1B's (the dicts must not alias).
    assert config_dict("llama-3.1-8b")["rope_scaling"]["factor"] == 8.0


def test_llama_3_2_1b_rope_matches_transformers_llama3_scaling() -> None:
    cfg = hf_config(config_dict("llama-3.2-1b"))
    ours = rope_inv_freq(LlamaArgs.from_hf_config(cfg)).float()
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=0)


def test_llama_3_2_1b_model_folder_loads_like_a_model() -> None:
    from transformers import AutoConfig

    _, folder = random_config("llama-3.2-1b")
    loaded = AutoConfig.from_pretrained(folder)
    assert loaded.hidden_size == 2048 and loaded.tie_word_embeddings
    assert (folder / "tokenizer.json").exists()


def test_every_random_shape_has_its_published_context_length() -> None:
    """Llama-3.1 and 3.2 shapes serve 131,072 positions (not 4,096), tiny-qwen2 Qwen2's
    32,768; the smallest worthwhile KV pool stays min(context, 4096), so tests never size a
    pool from the context length."""
    want = {
        "llama-3.1-8b": 131072,
        "llama-3.1-70b": 131072,
        "llama-3.2-1b": 131072,
        "tiny-llama": 131072,
        "tiny-qwen2": 32768,
    }
    for name, ctx in want.items():
        args = LlamaArgs.from_hf_config(hf_config(config_dict(name)))
        assert args.max_position == ctx, name
        assert preflight.min_kv_tokens(0, args.max_position) == 4096


def test_tiny_qwen2_is_a_qwen2_with_biases_one_kv_head_and_tied_embeddings() -> None:
    cfg, folder = random_config("tiny-qwen2")
    preflight.check_architecture(cfg)
    assert cfg.model_type == "qwen2" and cfg.architectures == ["Qwen2ForCausalLM"]
    args = LlamaArgs.from_hf_config(cfg)
    assert args.attention_bias and args.tie_word_embeddings
    assert (args.num_heads, args.num_kv_heads, args.head_dim) == (4, 1, 64)
    assert args.rope_theta == 1000000.0
    with torch.device("meta"):
        model = LlamaForCausalLM(args)
    assert "model.layers.0.self_attn.q_proj.bias" in dict(model.named_parameters())
    assert preflight.param_count(args) == sum(p.numel() for p in model.parameters())
