"""Routed experts of a finished completion, from transformers' MoE routers (routing replay, R3).

The hf engine answers ``SamplingParams.return_routed_experts`` by running the whole sequence
(prompt and completion but its last token, the positions SGLang reports) once more through the
model with the same weights, right after the row finished and before its result is handed over,
with forward hooks on every MoE block's router (``mlp.gate``; transformers' Qwen3-MoE
``Qwen3MoeTopKRouter`` returns ``(logits, top-k weights, top-k ids)``). Recomputing rather than
hooking the decode steps keeps the capture independent of how the scheduler batched, padded, shared
prompt prefixes or cached them: tokens served from a shared prefix get their routing like any other.
The price is one extra prefill per asking request; the ids are those of the same weights, exact up
to floating-point ties between two experts' logits (batch shape changes the last bits).

Dense layers (a model with ``mlp_only_layers``) have no router; their rows hold 0, and the
trainer's dense layers have no router to replay into.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ...rl.routing_record import RoutedExperts


def moe_routers(model: Any) -> list[tuple[int, torch.nn.Module]]:
    """``(decoder layer index, router module)`` of every MoE layer of a transformers causal LM."""
    layers = model.model.layers
    out = []
    for index, layer in enumerate(layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            out.append((index, gate))
    return out


def is_moe(model: Any) -> bool:
    return bool(moe_routers(model))


@torch.inference_mode()
def capture_routed_experts(model: Any, token_ids: Sequence[int]) -> RoutedExperts:
    """The routing of ``token_ids[:-1]`` (``[len - 1, num_hidden_layers, top_k]``)."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError("return_routed_experts: the model has no MoE router (mlp.gate) to read")
    config = model.config
    top_k = int(routers[0][1].top_k)
    num_experts = int(routers[0][1].num_experts)
    inputs = torch.tensor([list(token_ids[:-1])], dtype=torch.long, device=model.device)
    ids = torch.zeros(inputs.shape[1], int(config.num_hidden_layers), top_k, dtype=torch.long)
    handles = []

    def keep(layer: int):
        def hook(_module, _args, output):
            ids[:, layer] = output[2].reshape(-1, top_k).cpu()
        return hook

    try:
        for layer, gate in routers:
            handles.append(gate.register_forward_hook(keep(layer)))
        if inputs.shape[1]:
            model(input_ids=inputs, use_cache=False, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    return RoutedExperts.from_ids(ids, num_experts)
