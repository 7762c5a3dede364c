"""Read a Hugging Face ``config.json`` into a typed ``ModelSpec``.

Accepted inputs: a dict (the parsed JSON), a path to ``config.json`` or to the directory holding
it, or a ``transformers`` config object. Both generations of key names are read: transformers 4
(``rope_theta``, ``rope_scaling``, ``num_experts``) and transformers 5 (``rope_parameters``,
``num_local_experts``). Anything the Megatron build cannot reproduce exactly (biases, sliding
window, RoPE scaling, dense layers inside an MoE model, shared experts, a non-SiLU activation) is
rejected with a ValueError that says which key and value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

LLAMA = "LlamaForCausalLM"
QWEN3 = "Qwen3ForCausalLM"
QWEN3_MOE = "Qwen3MoeForCausalLM"
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (QWEN3, QWEN3_MOE, LLAMA)

# transformers config objects built in code often have architectures=None; model_type decides then.
_ARCHITECTURE_BY_MODEL_TYPE = {"llama": LLAMA, "qwen3": QWEN3, "qwen3_moe": QWEN3_MOE}


@dataclass(frozen=True)
class MoESpec:
    """Routed experts of every layer (no shared experts in the supported architectures)."""

    num_experts: int
    top_k: int
    ffn_hidden_size: int  # per expert (HF moe_intermediate_size)
    norm_topk_prob: bool  # renormalise the top-k softmax probabilities to sum to one
    router_aux_loss_coef: float = 0.0
    shared_expert_ffn_hidden_size: Optional[int] = None  # always None for now


@dataclass(frozen=True)
class ModelSpec:
    """What the Megatron build and the weight map need to know about one HF model."""

    architecture: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int  # dense MLP size (HF intermediate_size)
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    qk_norm: bool
    tie_embeddings: bool
    max_position_embeddings: int
    moe: Optional[MoESpec] = None

    @property
    def num_query_groups(self) -> int:
        return self.num_kv_heads

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_kv_heads


ConfigSource = Union[Mapping[str, Any], str, Path, Any]


def read_model_spec(source: ConfigSource) -> ModelSpec:
    """ModelSpec from a config dict, a config.json path/directory, or a transformers config."""
    config = _as_dict(source)
    architecture = _architecture(config)
    _check_common(config)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    num_kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    if config["num_attention_heads"] % num_kv_heads:
        raise ValueError(
            f"num_attention_heads={config['num_attention_heads']} is not a multiple of "
            f"num_key_value_heads={num_kv_heads}"
        )
    moe = _read_moe(config) if architecture == QWEN3_MOE else None
    return ModelSpec(
        architecture=architecture,
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        ffn_hidden_size=config["intermediate_size"],
        num_attention_heads=config["num_attention_heads"],
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        vocab_size=config["vocab_size"],
        rope_theta=float(_rope_theta(config)),
        rms_norm_eps=float(config["rms_norm_eps"]),
        qk_norm=architecture in (QWEN3, QWEN3_MOE),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=config["max_position_embeddings"],
        moe=moe,
    )


def _as_dict(source: ConfigSource) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        return json.loads(path.read_text())
    if hasattr(source, "to_dict"):  # transformers.PretrainedConfig
        return source.to_dict()
    raise TypeError(f"cannot read a model config from {type(source).__name__}")


def _architecture(config: Mapping[str, Any]) -> str:
    names = config.get("architectures") or []
    if not names and config.get("model_type") in _ARCHITECTURE_BY_MODEL_TYPE:
        names = [_ARCHITECTURE_BY_MODEL_TYPE[config["model_type"]]]
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    found = ", ".join(names) or f"model_type={config.get('model_type')!r}"
    raise ValueError(
        f"unsupported model architecture {found}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _reject(config: Mapping[str, Any], key: str, allowed: tuple, why: str) -> None:
    value = config.get(key, allowed[0])
    if value not in allowed:
        raise ValueError(f"unsupported {key}={value!r}: {why}")


def _check_common(config: Mapping[str, Any]) -> None:
    _reject(config, "hidden_act", ("silu",), "the Megatron build uses SwiGLU (SiLU-gated) MLPs")
    _reject(config, "attention_bias", (False,), "attention projections are built without bias")
    _reject(config, "mlp_bias", (False,), "MLP projections are built without bias")
    _reject(config, "use_sliding_window", (False,), "sliding-window attention is not supported")
    scaling = config.get("rope_scaling")
    rope_type = (config.get("rope_parameters") or {}).get("rope_type", "default")
    if scaling or rope_type != "default":
        raise ValueError(
            f"unsupported RoPE scaling ({scaling or rope_type!r}): only plain RoPE is supported"
        )


def _rope_theta(config: Mapping[str, Any]) -> float:
    parameters = config.get("rope_parameters") or {}
    if "rope_theta" in parameters:
        return parameters["rope_theta"]
    return config.get("rope_theta", 10000.0)


def _read_moe(config: Mapping[str, Any]) -> MoESpec:
    _reject(config, "decoder_sparse_step", (1,), "every layer must be an MoE layer")
    if config.get("mlp_only_layers"):
        raise ValueError(
            f"unsupported mlp_only_layers={config['mlp_only_layers']!r}: every layer must be MoE"
        )
    if config.get("shared_expert_intermediate_size"):
        raise ValueError("unsupported shared_expert_intermediate_size: no shared experts")
    num_experts = config.get("num_experts", config.get("num_local_experts"))
    return MoESpec(
        num_experts=num_experts,
        top_k=config["num_experts_per_tok"],
        ffn_hidden_size=config["moe_intermediate_size"],
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        router_aux_loss_coef=float(config.get("router_aux_loss_coef", 0.0)),
    )
