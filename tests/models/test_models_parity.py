"""spade.models against transformers: config reading, logits parity, weight-map round trips.

Tiny random models (2 layers, hidden 64) built from transformers config objects; no downloads.
Parity runs the Megatron GPTModel at TP=1 in one process (gloo world of size 1). The sharded
layouts (TP/PP/EP) are checked as pure tensor bookkeeping: every rank's shards are produced with
``hf_to_megatron`` and merged back.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout, RankCoords, read_model_spec
from spade.models.builder import BuildOptions, build_gpt_model, build_transformer_config
from spade.models.loading import hf_weights, load_hf_state
from spade.models.transformers_state import from_transformers_state, to_transformers_state
from spade.models.weight_map import (
    MegatronNaming,
    bindings,
    hf_to_megatron,
    iter_hf_weights,
    megatron_to_hf,
)

from support.hf_fixtures import COMMON, VOCAB, randomize_  # noqa: E402  (the tiny shapes shared by every model test)
from support.models import qwen3_config  # noqa: E402

MODELS = {
    "llama-tied": (LlamaForCausalLM, lambda: LlamaConfig(tie_word_embeddings=True, rope_theta=10000.0, **COMMON)),
    "llama-untied": (LlamaForCausalLM, lambda: LlamaConfig(tie_word_embeddings=False, rope_theta=5e5, **COMMON)),
    "qwen3": (Qwen3ForCausalLM, lambda: qwen3_config(VOCAB, max_position_embeddings=128, rope_theta=1e6)),
    "qwen3-tied": (Qwen3ForCausalLM, lambda: qwen3_config(VOCAB, max_position_embeddings=128, head_dim=24,
                                                          tie_word_embeddings=True)),
    "qwen3-moe": (
        Qwen3MoeForCausalLM,
        lambda: Qwen3MoeConfig(
            head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            norm_topk_prob=True, rope_theta=1e6, **COMMON,
        ),
    ),
    "qwen3-moe-raw-topk": (
        Qwen3MoeForCausalLM,
        lambda: Qwen3MoeConfig(
            head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
            norm_topk_prob=False, **COMMON,
        ),
    ),
}


def tiny_hf(name: str, seed: int = 0):
    """A random transformers model (norm weights away from 1 so they matter) and its spec."""
    model_class, make_config = MODELS[name]
    torch.manual_seed(seed)
    config = make_config()
    return randomize_(model_class(config).eval()), read_model_spec(config)


def checkpoint_state(model, spec) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in from_transformers_state(model.state_dict(), spec).items()}


# ------------------------------------------------------------------ config reading

SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M config.json (the CPU demo model)
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True, "vocab_size": 49152,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B config.json
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def test_reads_smollm2_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_135M))
    spec = read_model_spec(tmp_path)
    assert spec == read_model_spec(SMOLLM2_135M)
    assert (spec.architecture, spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (
        "LlamaForCausalLM", 30, 576, 1536)
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (9, 3, 64)
    assert (spec.vocab_size, spec.rope_theta, spec.rms_norm_eps) == (49152, 100000.0, 1e-5)
    assert spec.tie_embeddings and not spec.qk_norm and spec.moe is None


def test_reads_qwen3_moe_config():
    spec = read_model_spec(QWEN3_30B_A3B)
    assert spec.qk_norm and not spec.tie_embeddings and spec.head_dim == 128
    assert spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.top_k, spec.moe.ffn_hidden_size) == (128, 8, 768)
    assert spec.moe.norm_topk_prob and spec.moe.shared_expert_ffn_hidden_size is None
    # the same model described by a transformers 5 config object (rope_parameters, num_local_experts)
    from_object = read_model_spec(Qwen3MoeConfig(**{k: v for k, v in QWEN3_30B_A3B.items() if k != "torch_dtype"}))
    assert from_object == spec


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ValueError) as raised:
        read_model_spec({**SMOLLM2_135M, "architectures": ["MistralForCausalLM"], "model_type": "mistral"})
    message = str(raised.value)
    assert "MistralForCausalLM" in message
    assert all(name in message for name in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM"))


@pytest.mark.parametrize(
    "change",
    [
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {"attention_bias": True},
        {"hidden_act": "gelu"},
    ],
)
def test_unreproducible_configs_are_rejected(change):
    with pytest.raises(ValueError):
        read_model_spec({**SMOLLM2_135M, **change})


def test_moe_with_dense_layers_is_rejected():
    with pytest.raises(ValueError, match="mlp_only_layers"):
        read_model_spec({**QWEN3_30B_A3B, "mlp_only_layers": [0]})


# ------------------------------------------------------------------ builder


def test_transformer_config_follows_the_spec():
    spec = read_model_spec(QWEN3_30B_A3B)
    config = build_transformer_config(spec, ParallelLayout(tp=1), BuildOptions(params_dtype=torch.float32))
    assert (config.num_query_groups, config.kv_channels, config.qk_layernorm) == (4, 128, True)
    assert config.gated_linear_unit and not config.add_bias_linear and config.normalization == "RMSNorm"
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (128, 8, 768)
    assert config.moe_router_pre_softmax is False  # norm_topk_prob: softmax over the top k
    assert config.use_cpu_initialization and config.params_dtype == torch.float32


def test_vocab_padding_follows_megatron():
    assert ParallelLayout(tp=1).padded_vocab_size(200) == 256
    assert ParallelLayout(tp=2).padded_vocab_size(200) == 256
    assert ParallelLayout(tp=4, make_vocab_size_divisible_by=64).padded_vocab_size(49152) == 49152
    assert ParallelLayout(tp=3).padded_vocab_size(49153) == 49536


# ------------------------------------------------------------------ HF parity (TP=1, fp32)


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_transformers(name):
    hf_model, spec = tiny_hf(name)
    state = checkpoint_state(hf_model, spec)
    model = build_gpt_model(spec, ParallelLayout(), BuildOptions(params_dtype=torch.float32)).eval()
    load_hf_state(model, state, spec)

    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        expected = hf_model(ids).logits
        logits = model(ids, positions, None)
    assert logits.shape == (2, 13, ParallelLayout().padded_vocab_size(VOCAB))
    torch.testing.assert_close(logits[..., :VOCAB], expected, atol=1e-4, rtol=0)

    # and back out of the live model, bit for bit
    exported = dict(hf_weights(model, spec))
    assert exported.keys() == state.keys()
    assert all(torch.equal(exported[k], state[k]) for k in state)


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("name", list(MODELS))
def test_export_round_trip_is_exact(name):
    hf_model, spec = tiny_hf(name)
    state = checkpoint_state(hf_model, spec)
    back = megatron_to_hf(hf_to_megatron(state, spec), spec)
    assert back.keys() == state.keys()
    for key, tensor in state.items():
        assert torch.equal(back[key], tensor), key


def all_coords(layout: ParallelLayout):
    """One RankCoords per distinct model shard (data-parallel replicas left out)."""
    ranks = itertools.product(range(layout.tp), range(layout.pp), range(layout.ep), range(layout.expert_tp))
    return [RankCoords(tp=t, pp=p, ep=e, etp=x) for t, p, e, x in ranks]


LAYOUTS = [
    ParallelLayout(tp=2),
    ParallelLayout(tp=4),  # more TP ranks than query groups
    ParallelLayout(pp=2),
    ParallelLayout(tp=2, pp=2),
    ParallelLayout(ep=2, etp=1),
    ParallelLayout(tp=2, ep=2, etp=1, pp=2),
    ParallelLayout(tp=2, ep=4, etp=2),
]
SHARDED_CASES = [
    pytest.param(name, layout, id=f"{name}-tp{layout.tp}pp{layout.pp}ep{layout.ep}etp{layout.expert_tp}")
    for name in ("llama-tied", "qwen3", "qwen3-moe")
    for layout in LAYOUTS
    if layout.ep == 1 or name == "qwen3-moe"
]


def peer_gather(shards: dict, coords: RankCoords, layout: ParallelLayout):
    """What an all-gather over this rank's TP or expert-TP group would return."""
    local = shards[coords]
    names = {id(tensor): name for name, tensor in local.items()}

    def gather(shard, group):
        if group == "tp":
            peers = [replace(coords, tp=i) for i in range(layout.tp)]
        else:
            peers = [replace(coords, etp=i) for i in range(layout.expert_tp)]
        return [shards[peer][names[id(shard)]] for peer in peers]

    return gather


@pytest.mark.parametrize("name, layout", SHARDED_CASES)
def test_sharded_round_trip_is_exact(name, layout):
    hf_model, spec = tiny_hf(name)
    state = checkpoint_state(hf_model, spec)
    shards = {coords: hf_to_megatron(state, spec, layout, coords) for coords in all_coords(layout)}
    back = megatron_to_hf(shards, spec, layout)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)

    # live-sync path: each rank streams its tensors, gathering shards from its TP/ETP peers
    streamed: dict[str, torch.Tensor] = {}
    for coords, local in shards.items():
        gather = peer_gather(shards, coords, layout)
        for hf_name, tensor in iter_hf_weights(local, spec, layout, coords, gather):
            assert torch.equal(tensor, state[hf_name]), hf_name
            streamed[hf_name] = tensor
    assert streamed.keys() == state.keys()


def test_tp_shards_follow_megatron_layouts():
    """QKV interleaved per query group, fc1 as [gate_r; up_r], row-parallel on dim 1, vocab padded."""
    hf_model, spec = tiny_hf("qwen3")  # 4 query heads, 2 groups, head_dim 16
    state = checkpoint_state(hf_model, spec)
    layout = ParallelLayout(tp=2)
    prefix = "model.layers.1."
    q, k, v = (state[prefix + f"self_attn.{p}_proj.weight"] for p in "qkv")
    gate, up = state[prefix + "mlp.gate_proj.weight"], state[prefix + "mlp.up_proj.weight"]
    for rank in range(2):
        shard = hf_to_megatron(state, spec, layout, RankCoords(tp=rank))
        qkv = shard["decoder.layers.1.self_attention.linear_qkv.weight"]
        # rank r holds query group r: its 2 query heads, then its key head, then its value head
        expected = torch.cat((q[32 * rank: 32 * rank + 32], k[16 * rank: 16 * rank + 16], v[16 * rank: 16 * rank + 16]))
        assert torch.equal(qkv, expected)
        fc1 = shard["decoder.layers.1.mlp.linear_fc1.weight"]
        assert torch.equal(fc1, torch.cat((gate[48 * rank: 48 * rank + 48], up[48 * rank: 48 * rank + 48])))
        fc2 = shard["decoder.layers.1.mlp.linear_fc2.weight"]
        assert torch.equal(fc2, state[prefix + "mlp.down_proj.weight"][:, 48 * rank: 48 * rank + 48])
        embedding = shard["embedding.word_embeddings.weight"]
        assert embedding.shape == (128, 64)  # 200 rows padded to 256, halved
        if rank == 1:
            assert torch.equal(embedding[:72], state["model.embed_tokens.weight"][128:])
            assert not embedding[72:].any()


def test_pipeline_and_expert_offsets():
    _, spec = tiny_hf("qwen3-moe")  # 2 layers, 4 experts
    layout = ParallelLayout(pp=2, ep=2, etp=1)
    names = {b.megatron: b.hf for b in bindings(spec, layout, RankCoords(pp=1, ep=1))}
    assert names["decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"] == (
        "model.layers.1.mlp.experts.3.down_proj.weight",)
    assert "embedding.word_embeddings.weight" not in names
    assert names["output_layer.weight"] == ("lm_head.weight",)
    first = {b.megatron for b in bindings(spec, layout, RankCoords(pp=0))}
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first


def test_tied_output_layer_on_last_stage_is_imported_not_exported():
    hf_model, spec = tiny_hf("llama-tied")
    state = checkpoint_state(hf_model, spec)
    layout = ParallelLayout(pp=2)
    last = hf_to_megatron(state, spec, layout, RankCoords(pp=1))
    assert torch.equal(last["output_layer.weight"][:VOCAB], state["model.embed_tokens.weight"])
    assert "lm_head.weight" not in megatron_to_hf(
        {RankCoords(pp=p): hf_to_megatron(state, spec, layout, RankCoords(pp=p)) for p in range(2)},
        spec, layout,
    )


def test_transformer_engine_names():
    _, dense = tiny_hf("qwen3")
    _, moe = tiny_hf("qwen3-moe")
    te = MegatronNaming(backend="te")
    dense_names = {b.megatron: b.hf[0] for b in bindings(dense, ParallelLayout(), naming=te)}
    assert dense_names["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"] == "model.layers.0.input_layernorm.weight"
    assert dense_names["decoder.layers.0.mlp.linear_fc1.layer_norm_weight"] == "model.layers.0.post_attention_layernorm.weight"
    moe_names = {b.megatron: b.hf[0] for b in bindings(moe, ParallelLayout(), naming=te)}
    assert moe_names["decoder.layers.0.pre_mlp_layernorm.weight"] == "model.layers.0.post_attention_layernorm.weight"
    grouped = {b.megatron for b in bindings(moe, ParallelLayout(), naming=MegatronNaming("te", grouped_experts=True))}
    assert "decoder.layers.1.mlp.experts.linear_fc1.weight3" in grouped


def test_transformers_state_round_trip():
    hf_model, spec = tiny_hf("qwen3-moe")
    model_state = hf_model.state_dict()
    checkpoint = from_transformers_state(model_state, spec)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in checkpoint
    rebuilt = to_transformers_state(checkpoint, set(model_state), spec)
    assert rebuilt.keys() == model_state.keys()
    assert all(torch.equal(rebuilt[k], model_state[k]) for k in model_state)


def test_missing_hf_tensor_is_reported():
    hf_model, spec = tiny_hf("llama-untied")
    state = checkpoint_state(hf_model, spec)
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="up_proj"):
        hf_to_megatron(state, spec)
