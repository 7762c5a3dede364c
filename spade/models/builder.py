"""Build a Megatron ``GPTModel`` and its ``TransformerConfig`` from a ``ModelSpec``.

Every supported architecture is the same pre-norm decoder: RMSNorm, grouped-query attention with
RoPE (optionally with per-head RMSNorm on queries and keys, Qwen3), SwiGLU MLPs or top-k softmax
MoE layers, no biases, optionally tied input/output embeddings. On CPU (or without
transformer-engine) the local layer spec is used in fp32 with CPU initialisation; with CUDA and
transformer-engine the TE spec is used and parameters default to bf16.

The layer-norm parameter names differ between the two specs; ``naming_for(options)`` tells the
weight map which one a model was built with.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F

from .hf_config import ModelSpec
from .layout import ParallelLayout
from .weight_map import MegatronNaming


def transformer_engine_usable() -> bool:
    """True when the TE layer spec can be used: CUDA present and transformer_engine importable."""
    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


@dataclass(frozen=True)
class BuildOptions:
    """Choices that are not part of the architecture. ``None`` means: pick for this machine.

    With bf16/fp16 parameters the trainer wraps the model in Megatron's ``Float16Module``.
    """

    params_dtype: Optional[torch.dtype] = None  # fp32 on CPU, bf16 with CUDA
    use_transformer_engine: Optional[bool] = None  # TE spec when usable
    moe_token_dispatcher: Literal["alltoall", "allgather"] = "alltoall"
    moe_aux_loss_coeff: float = 0.0  # > 0 turns on the auxiliary load-balancing loss
    moe_router_dtype: Optional[Literal["fp32", "fp64"]] = "fp32"  # None: the activation dtype
    perform_initialization: bool = True  # False skips random init (weights loaded right after)
    # Activation recompute: "full" recomputes transformer layers in the backward pass (only their
    # input is kept), "selective" only the core attention (Megatron's recompute_modules
    # ["core_attn"]: the local spec's [b*heads, s, s] scores); same results, less memory.
    # With "full": recompute_method "uniform" recomputes every layer in groups of
    # recompute_num_layers, "block" only the first recompute_num_layers layers of each stage.
    recompute: Literal["none", "full", "selective"] = "none"
    recompute_method: Literal["uniform", "block"] = "uniform"
    recompute_num_layers: int = 1
    # The local spec's core attention: "sdpa" runs PyTorch's fused scaled_dot_product_attention
    # (no [b*heads, s, s] scores kept; models/sdpa_attention.py), "unfused" Megatron's
    # DotProductAttention. Transformer Engine's spec has its own fused attention and ignores this.
    core_attention: Literal["sdpa", "unfused"] = "unfused"

    def resolved_dtype(self) -> torch.dtype:
        if self.params_dtype is not None:
            return self.params_dtype
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32

    def resolved_use_te(self) -> bool:
        if self.use_transformer_engine is None:
            return transformer_engine_usable()
        if self.use_transformer_engine and not transformer_engine_usable():
            raise ValueError("use_transformer_engine=True needs CUDA and transformer_engine")
        return self.use_transformer_engine


def naming_for(options: BuildOptions) -> MegatronNaming:
    """The parameter naming a model built with ``options`` uses (for the weight map)."""
    backend = "te" if options.resolved_use_te() else "local"
    return MegatronNaming(backend=backend, grouped_experts=False)


def build_transformer_config(
    spec: ModelSpec, layout: ParallelLayout, options: BuildOptions = BuildOptions()
):
    """The TransformerConfig that reproduces ``spec`` under ``layout``."""
    from megatron.core.transformer import TransformerConfig

    if not options.perform_initialization and max(layout.tp, layout.expert_tp) > 1:
        # Megatron tags tensor-parallel weights (tensor_model_parallel, partition_dim) only inside
        # its init helpers; untagged shards count on TP rank 0 only in the gradient norm.
        raise ValueError("perform_initialization=False leaves tensor-parallel weights untagged under "
                         "tp/etp > 1 (wrong gradient norm and clipping); keep it True, loaded weights "
                         "overwrite the initialisation")
    dtype = options.resolved_dtype()
    moe = spec.moe
    moe_fields = {}
    if moe is not None:
        moe_fields = dict(
            num_moe_experts=moe.num_experts,
            moe_router_topk=moe.top_k,
            moe_ffn_hidden_size=moe.ffn_hidden_size,
            moe_router_score_function="softmax",
            # Softmax over the k selected logits equals the renormalised top-k probabilities;
            # softmax before top-k keeps the raw probabilities (norm_topk_prob=False).
            moe_router_pre_softmax=not moe.norm_topk_prob,
            moe_router_dtype=options.moe_router_dtype,
            moe_router_load_balancing_type="aux_loss" if options.moe_aux_loss_coeff > 0 else "none",
            moe_aux_loss_coeff=options.moe_aux_loss_coeff,
            moe_token_dispatcher_type=options.moe_token_dispatcher,
            moe_grouped_gemm=False,
            moe_permute_fusion=False,
        )
    recompute_fields = _recompute_fields(options, layout.layers_per_stage(spec.num_layers))
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.ffn_hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps,
        qk_layernorm=spec.qk_norm,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.expert_tp,
        sequence_parallel=layout.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=options.perform_initialization,
        **recompute_fields,
        **moe_fields,
    )


def _recompute_fields(options: BuildOptions, layers_per_stage: int) -> dict:
    if options.recompute not in ("none", "full", "selective"):
        raise ValueError(f"recompute {options.recompute!r}: allowed none, full, selective")
    if options.recompute_method not in ("uniform", "block"):
        raise ValueError(f"recompute_method {options.recompute_method!r}: allowed uniform, block")
    if not 1 <= options.recompute_num_layers <= layers_per_stage:
        raise ValueError(f"recompute_num_layers {options.recompute_num_layers}: must be between 1 and the "
                         f"layers per pipeline stage ({layers_per_stage})")
    if options.recompute == "full":
        return dict(recompute_granularity="full", recompute_method=options.recompute_method,
                    recompute_num_layers=options.recompute_num_layers)
    if options.recompute == "selective":
        return dict(recompute_granularity="selective")
    return {}


def build_layer_spec(spec: ModelSpec, use_transformer_engine: bool, core_attention: str = "unfused"):
    """Layer ModuleSpec: TE modules on GPU with TE, Megatron's local modules otherwise (their core
    attention ``core_attention``: "sdpa" or "unfused", see ``BuildOptions``)."""
    from .sdpa_attention import CORE_ATTENTION_CHOICES, use_sdpa_core_attention

    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    num_experts = spec.moe.num_experts if spec.moe else None
    if use_transformer_engine:
        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=spec.qk_norm
        )
    if core_attention not in CORE_ATTENTION_CHOICES:
        raise ValueError(f"model.core_attention {core_attention!r}: allowed {', '.join(CORE_ATTENTION_CHOICES)}")
    layer_spec = get_gpt_layer_local_spec(
        num_experts=num_experts,
        moe_grouped_gemm=False,
        qk_layernorm=spec.qk_norm,
        normalization="RMSNorm",
    )
    return use_sdpa_core_attention(layer_spec) if core_attention == "sdpa" else layer_spec


def build_gpt_model(
    spec: ModelSpec,
    layout: ParallelLayout,
    options: BuildOptions = BuildOptions(),
    *,
    pre_process: Optional[bool] = None,
    post_process: Optional[bool] = None,
):
    """This rank's GPTModel. Megatron's parallel state must be initialised for ``layout``.

    ``pre_process``/``post_process`` (embedding / final norm and output layer on this stage)
    default to whether this rank is the first / last pipeline stage.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    if pre_process is None:
        pre_process = ps.is_pipeline_first_stage()
    if post_process is None:
        post_process = ps.is_pipeline_last_stage()
    config = build_transformer_config(spec, layout, options)
    return GPTModel(
        config=config,
        transformer_layer_spec=build_layer_spec(spec, options.resolved_use_te(), options.core_attention),
        vocab_size=layout.padded_vocab_size(spec.vocab_size),
        max_sequence_length=spec.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tie_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=spec.rope_theta,
    )
