"""Will a training step fit on the device? An estimate for Megatron's local (non-TE) layer spec.

Without Transformer Engine, Megatron-core's ``DotProductAttention`` materialises the attention
scores ``[b * heads, s, s]`` and, with ``attention_softmax_in_fp32``, keeps the fp32 softmax
output and its bf16 copy for the backward pass: 6 bytes per score element per layer
(``fusions/fused_softmax.py``). A Qwen3-4B shape at 2 x 4,096 tokens per micro-batch saves
2 * 32 * 4096^2 * 6 B * 36 layers = 216 GiB of it. Selective recompute (Megatron's
``recompute_modules=["core_attn"]``) keeps only q, k, v and rebuilds one layer's scores at a
time in the backward pass; full recompute keeps only each recomputed group's input.

``estimate_step_memory`` adds up, per rank, in bytes:

* weights, gradients and optimizer state: parameters in their dtype, fp32 gradient buffers
  (``grad_reduce_in_fp32``), Adam moments plus fp32 main parameters for bf16 models (divided over
  data-parallel ranks with the distributed optimizer);
* saved activations of the decoder layers, per token and layer (bf16 elements, from what autograd
  keeps in the local spec, checked on CPU in ``tests/training/test_memory_plan.py``):
  4 h (norm and linear inputs) + 3 q + 3 kv (the fused qkv output, rotated q and k, the attention
  context) + 5 f (SwiGLU), with h, q = heads * head_dim, kv = kv heads * head_dim, f = FFN size;
  torch's composite RMSNorm (used when its fused kernel cannot run, e.g. fp32 norm weights on bf16
  input) keeps fp32 copies on top (12 h + 8 (q + kv) bytes), the fused kernel only its input;
* saved attention scores (6 B per element, above) in layers that do not recompute them;
* a working set for the one layer being run or recomputed: its scores buffer, scores, fp32
  softmax, bf16 probabilities and their gradients (18 B per element), and the fp32 logits of one
  log-prob chunk.

MoE layers count their routed experts' SwiGLU (top-k copies of each token) instead of the dense
MLP; that part is not calibrated. The estimate is a planning figure, not an allocator model:
``check_fits`` refuses only settings whose estimate exceeds the device's whole memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ..models import ModelSpec, ParallelLayout

GIB = 2**30
SOFTMAX_SAVED_BYTES = 6  # fp32 softmax output + its bf16 copy, per score element and layer
ATTENTION_WORKING_BYTES = 18  # one layer run/recomputed: buffer 2 + scores 2 + saved 6 + gradients 8
RECOMPUTE_CHOICES = ("none", "selective", "full")
METHOD_CHOICES = ("uniform", "block")


@dataclass(frozen=True)
class RecomputeSettings:
    """Megatron's activation recompute (``TransformerConfig.recompute_*``).

    ``granularity``: "none", "selective" (the core attention of every layer) or "full" (whole
    layers). ``method`` and ``num_layers`` apply to "full" only: "uniform" recomputes every layer
    in groups of ``num_layers`` (only each group's input is kept); "block" recomputes the first
    ``num_layers`` layers of each pipeline stage and keeps everything of the others.
    """

    granularity: Literal["none", "selective", "full"] = "none"
    method: Literal["uniform", "block"] = "uniform"
    num_layers: int = 1

    def __post_init__(self) -> None:
        if self.granularity not in RECOMPUTE_CHOICES:
            raise ValueError(f"recompute: {self.granularity!r} is not one of {', '.join(RECOMPUTE_CHOICES)}")
        if self.method not in METHOD_CHOICES:
            raise ValueError(f"recompute_method: {self.method!r} is not one of {', '.join(METHOD_CHOICES)}")
        if self.num_layers < 1:
            raise ValueError(f"recompute_num_layers: must be >= 1, got {self.num_layers}")


@dataclass(frozen=True)
class MicroBatchShape:
    """The largest micro-batch a step runs: ``rows`` sequences padded to ``seq_len`` tokens."""

    rows: int
    seq_len: int

    @property
    def tokens(self) -> int:
        return self.rows * self.seq_len

    @classmethod
    def worst_case(cls, token_budget: int, max_seq_len: int) -> "MicroBatchShape":
        """The shape with the most score elements under a token budget: the longest rows that fit."""
        seq = max(1, min(token_budget, max_seq_len))
        return cls(rows=max(1, token_budget // seq), seq_len=seq)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank of one training step's peak, by part."""

    weights: float  # parameters, gradient buffers and optimizer state
    activations: float  # saved activations other than attention scores
    attention_saved: float  # attention scores kept for the backward pass, all layers
    working_set: float  # the layer being run or recomputed, and one log-prob chunk
    attention_layers_saved: int  # layers (of this stage) whose scores stay saved
    scores_materialised: bool = True  # Megatron's unfused attention; False for sdpa and fused kernels

    @property
    def total(self) -> float:
        return self.weights + self.activations + self.attention_saved + self.working_set

    def describe(self) -> str:
        return (f"{self.total / GIB:.1f} GiB = weights, gradients and optimizer {self.weights / GIB:.1f} GiB"
                f" + saved attention scores {self.attention_saved / GIB:.1f} GiB"
                f" ({self.attention_layers_saved} layers) + other activations {self.activations / GIB:.1f} GiB"
                f" + one layer's working set {self.working_set / GIB:.1f} GiB")

    def to_dict(self) -> dict[str, float]:
        return {"estimate_gib": round(self.total / GIB, 2), "estimate_weights_gib": round(self.weights / GIB, 2),
                "estimate_activations_gib": round(self.activations / GIB, 2),
                "estimate_attention_saved_gib": round(self.attention_saved / GIB, 2),
                "estimate_working_set_gib": round(self.working_set / GIB, 2)}


def parameter_count(spec: ModelSpec) -> tuple[int, int]:
    """(dense parameters incl. embeddings and norms, routed-expert parameters) of the whole model."""
    h, q, kv = spec.hidden_size, spec.num_attention_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    attention = h * (q + 2 * kv) + q * h + 2 * h + (2 * spec.head_dim if spec.qk_norm else 0)
    embeddings = spec.vocab_size * h * (1 if spec.tie_embeddings else 2) + h
    if spec.moe is None:
        return spec.num_layers * (attention + 3 * h * spec.ffn_hidden_size) + embeddings, 0
    router = spec.moe.num_experts * h
    experts = spec.moe.num_experts * 3 * h * spec.moe.ffn_hidden_size
    return spec.num_layers * (attention + router) + embeddings, spec.num_layers * experts


def activation_bytes_per_token_layer(spec: ModelSpec, layout: ParallelLayout, *, fused_norms: bool,
                                     dtype_bytes: int = 2) -> float:
    """Saved activations of one decoder layer per token, attention scores excluded."""
    tp, sp = layout.tp, layout.sequence_parallel
    h = spec.hidden_size / (tp if sp else 1)
    q = spec.num_attention_heads * spec.head_dim / tp
    kv = max(spec.num_kv_heads // tp, 1) * spec.head_dim
    if spec.moe is None:
        mlp = 5 * spec.ffn_hidden_size / tp
    else:  # each token goes to top_k experts; the expert FFN is split over expert-TP
        mlp = spec.moe.top_k * (2 * spec.hidden_size + 5 * spec.moe.ffn_hidden_size / layout.expert_tp)
    elements = 4 * h + 3 * q + 3 * kv + mlp
    norm_copies = 0.0 if fused_norms else 12 * h + 8 * (q + kv)  # composite RMSNorm: fp32 input + output
    return dtype_bytes * elements + norm_copies * dtype_bytes / 2


def estimate_step_memory(
    spec: ModelSpec,
    layout: ParallelLayout,
    micro_batch: MicroBatchShape,
    recompute: RecomputeSettings = RecomputeSettings(),
    *,
    dtype_bytes: int = 2,
    data_parallel: int = 1,
    distributed_optimizer: bool = False,
    fused_norms: bool = True,
    local_attention: bool = True,
    logprob_chunk: int = 1024,
    reference_model: bool = False,
) -> MemoryEstimate:
    """Peak bytes on one rank (the first pipeline stage, which holds the most micro-batches).
    ``reference_model``: a frozen copy of the parameters stays on the device (the KL term's)."""
    dense, experts = parameter_count(spec)
    params = dense / (layout.tp * layout.pp) + experts / (layout.ep * layout.expert_tp * layout.pp)
    optimizer = (12 if dtype_bytes < 4 else 8) / (data_parallel if distributed_optimizer else 1)
    weights = params * (dtype_bytes + 4 + optimizer + (dtype_bytes if reference_model else 0))

    layers = layout.layers_per_stage(spec.num_layers)
    in_flight = layout.pp  # 1F1B: the first stage holds up to pp micro-batches' activations
    tokens = micro_batch.tokens
    heads = spec.num_attention_heads // layout.tp
    scores = micro_batch.rows * heads * micro_batch.seq_len**2 if local_attention else 0
    per_layer = activation_bytes_per_token_layer(spec, layout, fused_norms=fused_norms,
                                                 dtype_bytes=dtype_bytes) * tokens
    layer_input = dtype_bytes * spec.hidden_size * tokens / (layout.tp if layout.sequence_parallel else 1)
    softmax_bytes = SOFTMAX_SAVED_BYTES if dtype_bytes < 4 else 4  # fp32 models keep one fp32 copy
    full_layer = per_layer + softmax_bytes * scores

    if recompute.granularity == "none":
        kept, scores_layers, replay = layers * full_layer, layers, 0.0
    elif recompute.granularity == "selective":
        kept, scores_layers, replay = layers * per_layer, 0, 0.0
    elif recompute.method == "uniform":
        group = min(recompute.num_layers, layers)
        groups = -(-layers // group)
        kept, scores_layers, replay = groups * layer_input, 0, group * full_layer
    else:  # block: the first num_layers layers keep their input only, the others everything
        recomputed = min(recompute.num_layers, layers)
        kept = recomputed * layer_input + (layers - recomputed) * full_layer
        scores_layers, replay = layers - recomputed, (full_layer if recomputed else 0.0)

    attention_saved = in_flight * scores_layers * softmax_bytes * scores
    activations = in_flight * kept - attention_saved + replay
    vocab_rows = layout.padded_vocab_size(spec.vocab_size) / layout.tp
    logits = 3 * min(logprob_chunk, tokens) * vocab_rows * 4  # fp32 chunk logits, softmax, gradient
    base = 2 * dtype_bytes * spec.hidden_size * tokens * in_flight  # embedding output, final norm
    working_set = ATTENTION_WORKING_BYTES * dtype_bytes / 2 * scores + logits
    return MemoryEstimate(weights=weights, activations=activations + base, attention_saved=attention_saved,
                          working_set=working_set, attention_layers_saved=scores_layers,
                          scores_materialised=local_attention)


class MemoryPlanError(ValueError):
    """The settings cannot fit on the device."""


@dataclass(frozen=True)
class SettingNames:
    """How the caller names the settings that change the estimate (config keys or CLI flags)."""

    recompute: str = "model.recompute"
    recompute_method: str = "model.recompute_method"
    recompute_num_layers: str = "model.recompute_num_layers"
    micro_batch_tokens: str = "run.micro_batch_tokens"
    parallel: str = "more model-parallel ranks (parallel.tp, parallel.pp)"
    skip: str = "model.memory_check: false"
    assign: str = ": "  # between a name and its value: ": " for config keys, " " for command-line flags


def check_fits(estimate: MemoryEstimate, device_bytes: float, micro_batch: MicroBatchShape,
               recompute: RecomputeSettings, *, names: SettingNames = SettingNames(),
               device_name: Optional[str] = None) -> None:
    """Raise ``MemoryPlanError`` when the estimate exceeds ``device_bytes``, saying why and what to change."""
    if estimate.total <= device_bytes:
        return
    where = f"{device_name} ({device_bytes / GIB:.1f} GiB)" if device_name else f"{device_bytes / GIB:.1f} GiB"
    scores = estimate.scores_materialised
    advice = []
    if estimate.attention_saved > 0:
        advice.append(f"{names.recompute}{names.assign}selective (keeps one layer's attention scores at a time "
                      f"instead of {estimate.attention_saved / GIB:.1f} GiB) or full")
    elif recompute.granularity == "selective":
        advice.append(f"{names.recompute}{names.assign}full (keeps only each layer's input)")
    elif recompute.granularity == "full" and recompute.method == "block":
        advice.append(f"{names.recompute_method}{names.assign}uniform (recomputes every layer)")
    elif recompute.granularity == "full" and recompute.num_layers > 1:
        advice.append(f"{names.recompute_num_layers}{names.assign}1")
    growth = "the saved scores grow with rows x length^2" if scores else "activations grow with the tokens"
    advice.append(f"a smaller {names.micro_batch_tokens} (now {micro_batch.rows} x {micro_batch.seq_len} tokens; "
                  f"{growth})")
    advice.append(names.parallel)
    if scores:
        advice.append("or Transformer Engine's fused attention (no scores kept)")
    why = (f": Megatron's local (non-Transformer-Engine) attention materialises [rows * heads, length, length] "
           f"scores and keeps {SOFTMAX_SAVED_BYTES} bytes of them per element and layer for the backward pass"
           if scores else "")
    raise MemoryPlanError(
        f"this training step needs about {estimate.describe()}, more than {where}{why}. Change: "
        + "; ".join(advice) + f". ({names.skip} skips this check.)")


def check_local_spec_step(spec: ModelSpec, layout: ParallelLayout, build_options, micro_batch_tokens: int, *,
                          data_parallel: int = 1, distributed_optimizer: bool = False,
                          reference_model: bool = False,
                          names: SettingNames = SettingNames()) -> Optional[MemoryEstimate]:
    """Refuse a CUDA run of the local spec whose worst micro-batch cannot fit (None when not checked:
    no CUDA, or Transformer Engine, whose own kernels this estimate does not model). With core
    attention "sdpa" (the trainer's default) no scores are kept or materialised, and the weights,
    gradients, optimizer state and activations are checked alone.

    The worst micro-batch under ``micro_batch_tokens`` is one row of that many tokens (capped by the
    model's context): the most score elements the budget allows."""
    import torch

    if not torch.cuda.is_available() or build_options.resolved_use_te():
        return None
    local_attention = getattr(build_options, "core_attention", "unfused") != "sdpa"
    dtype = build_options.resolved_dtype()
    shape = MicroBatchShape.worst_case(micro_batch_tokens, spec.max_position_embeddings)
    recompute = RecomputeSettings(build_options.recompute, build_options.recompute_method,
                                  build_options.recompute_num_layers)
    estimate = estimate_step_memory(spec, layout, shape, recompute, dtype_bytes=torch.finfo(dtype).bits // 8,
                                    data_parallel=data_parallel, distributed_optimizer=distributed_optimizer,
                                    reference_model=reference_model, local_attention=local_attention)
    device = torch.cuda.current_device()
    check_fits(estimate, torch.cuda.get_device_properties(device).total_memory, shape, recompute, names=names,
               device_name=torch.cuda.get_device_name(device))
    return estimate
