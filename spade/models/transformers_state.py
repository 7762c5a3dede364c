"""Convert between HF checkpoint tensors and the state dict of an in-memory transformers model.

The weight map speaks checkpoint names: what safetensors files hold and SGLang loads, one tensor
per expert and projection. transformers 5 keeps MoE experts fused in memory instead
(``Qwen3MoeExperts``): ``mlp.experts.gate_up_proj`` ``[E, 2*I, H]`` (gate rows, then up rows) and
``mlp.experts.down_proj`` ``[E, H, I]``. These two functions translate, so the in-process
transformers engine and the parity tests can use the same map. Tied models drop ``lm_head.weight``
from the checkpoint side (it is the embedding).
"""

from __future__ import annotations

import re
from typing import Mapping

import torch
from torch import Tensor

from .hf_config import ModelSpec

_FUSED_GATE_UP = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.gate_up_proj$")
_FUSED_DOWN = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.down_proj$")
_PER_EXPERT = re.compile(
    r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$"
)


def from_transformers_state(
    model_state: Mapping[str, Tensor], spec: ModelSpec
) -> dict[str, Tensor]:
    """Checkpoint-named tensors from a transformers model's ``state_dict()``."""
    out: dict[str, Tensor] = {}
    for name, tensor in model_state.items():
        if name == "lm_head.weight" and spec.tie_embeddings:
            continue
        if match := _FUSED_GATE_UP.match(name):
            for expert, (gate, up) in enumerate(t.chunk(2, dim=0) for t in tensor):
                out[f"{match[1]}.{expert}.gate_proj.weight"] = gate
                out[f"{match[1]}.{expert}.up_proj.weight"] = up
        elif match := _FUSED_DOWN.match(name):
            for expert, down in enumerate(tensor):
                out[f"{match[1]}.{expert}.down_proj.weight"] = down
        else:
            out[name] = tensor
    return out


def to_transformers_state(
    checkpoint_state: Mapping[str, Tensor], model_state_names: set[str], spec: ModelSpec
) -> dict[str, Tensor]:
    """A state dict for a transformers model whose ``state_dict()`` has ``model_state_names``.

    Per-expert tensors are stacked into the fused parameters when the model has them (and passed
    through otherwise, for transformers versions that keep experts as separate modules).
    """
    out: dict[str, Tensor] = {}
    experts: dict[str, dict[int, dict[str, Tensor]]] = {}
    for name, tensor in checkpoint_state.items():
        match = _PER_EXPERT.match(name)
        if match and f"{match[1]}.gate_up_proj" in model_state_names:
            experts.setdefault(match[1], {}).setdefault(int(match[2]), {})[match[3]] = tensor
        else:
            out[name] = tensor
    for prefix, by_expert in experts.items():
        order = [by_expert[e] for e in sorted(by_expert)]
        gate_up = [torch.cat((p["gate_proj"], p["up_proj"])) for p in order]
        out[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
        out[f"{prefix}.down_proj"] = torch.stack([p["down_proj"] for p in order])
    if spec.tie_embeddings and "lm_head.weight" in model_state_names and "model.embed_tokens.weight" in checkpoint_state:
        out["lm_head.weight"] = checkpoint_state["model.embed_tokens.weight"]
    return out
