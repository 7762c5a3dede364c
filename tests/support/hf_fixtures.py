"""Tiny random Hugging Face models and a tiny chat tokenizer, saved to directories, for the
checkpoint, conversion and scoring tests (no downloads).

``save_tiny_hf(name, directory)`` writes ``config.json``, ``model.safetensors`` and the tokenizer
files; ``hf_logprobs`` is the independent reference: the transformers model's logits, then
``log_softmax`` and a gather, in fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

VOCAB = 200  # not a multiple of 128: Megatron pads the vocabulary
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
)


def _llama(tied: bool):
    from transformers import LlamaConfig

    return LlamaConfig(tie_word_embeddings=tied, rope_theta=10000.0 if tied else 5e5, **COMMON)


def _qwen3():
    from support.models import qwen3_config

    return qwen3_config(VOCAB, max_position_embeddings=128, rope_theta=1e6)  # COMMON's shapes


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          norm_topk_prob=True, rope_theta=1e6, **COMMON)


CONFIGS: dict[str, Callable] = {
    "llama-tied": lambda: _llama(True),
    "llama-untied": lambda: _llama(False),
    "qwen3": _qwen3,
    "qwen3-moe": _qwen3_moe,
}

WORDS = ("the a cat dog sat on mat ran fast slow red blue green one two three is was and or "
         "hello world what how why yes no please thanks good bad big small up down left right "
         "game move win lose play turn score").split()
SPECIALS = ["[UNK]", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def make_tokenizer():
    """A word-level tokenizer over ~50 words with a chat template (ids all below VOCAB)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def randomize_(model: torch.nn.Module) -> torch.nn.Module:
    """Random weights in place, norm weights away from 1 so that they matter (uses torch's RNG)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.08)
    return model


def tiny_model(name: str, seed: int = 0):
    """A random transformers model (norm weights away from 1 so that they matter)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return randomize_(AutoModelForCausalLM.from_config(CONFIGS[name]()).eval())


def save_tiny_hf(name: str, directory: Path, seed: int = 0, max_shard_size: str | None = None) -> Path:
    """Save a tiny model and the tokenizer to ``directory`` (created); returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = tiny_model(name, seed)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **kwargs)
    make_tokenizer().save_pretrained(directory)
    return directory


def load_hf(directory: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def hf_logprobs(model, token_ids: list[int]) -> list[float | None]:
    """log p(token_i | tokens before i) under a transformers model; None for the first token."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(token_ids[1:]).unsqueeze(1))
    return [None] + logp.squeeze(1).tolist()


# ---------------------------------------------------------------------------- Megatron side
# (these need torch.distributed and Megatron's parallel state set up for the layout)


def megatron_model(hf_dir: Path, layout, *, load_weights: bool = True, seed: int = 0):
    """This rank's fp32 GPTModel for the HF model in ``hf_dir``: its weights, or a random init."""
    import megatron_patches
    from spade.models import RankCoords, read_model_spec
    from spade.models.builder import BuildOptions, build_gpt_model
    from spade.models.loading import load_hf_state
    from spade.training.hf_directory import read_hf_tensors

    spec = read_model_spec(Path(hf_dir))
    torch.manual_seed(seed)
    with megatron_patches.cpu_device_mode():
        model = build_gpt_model(spec, layout, BuildOptions(params_dtype=torch.float32))
    if load_weights:
        load_hf_state(model, read_hf_tensors(hf_dir, spec), spec, layout, RankCoords.current())
    return model, spec


def full_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, T, padded vocab]`` gathered over the tensor-parallel group."""
    import megatron_patches
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad(), megatron_patches.cpu_device_mode():
        logits = model(ids, positions, None)
        return gather_from_tensor_model_parallel_region(logits)


def trainer(model, *, distributed_optimizer: bool = False, lr: float = 1e-2):
    """Megatron DDP wrapper and Adam optimizer (fp32) around ``model``."""
    import megatron_patches
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    with megatron_patches.cpu_device_mode():
        ddp = DistributedDataParallel(
            model.config, DistributedDataParallelConfig(use_distributed_optimizer=distributed_optimizer),
            model)
        optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=lr, adam_eps=1e-6, clip_grad=1.0,
                            use_distributed_optimizer=distributed_optimizer), [ddp])
    return ddp, optimizer


def train_step(ddp, optimizer, ids: torch.Tensor) -> float:
    """One next-token cross-entropy step on ``ids``; returns the loss (before the update)."""
    import megatron_patches
    from megatron.core.distributed import finalize_model_grads

    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with megatron_patches.cpu_device_mode():
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        loss = ddp(ids[:, :-1], positions[:, :-1], None, labels=ids[:, 1:]).float().mean()
        loss.backward()
        finalize_model_grads([ddp])
        updated, _, _ = optimizer.step()
    assert updated
    return loss.item()


def hf_state(model, spec, layout) -> dict[str, torch.Tensor]:
    """The model's full HF-named tensors (gathered over TP; this rank's stage / experts only)."""
    import megatron_patches
    from spade.models import RankCoords
    from spade.models.loading import RankExport, group_gather, hf_weights

    with megatron_patches.cpu_device_mode():
        return {name: t.clone() for name, t in hf_weights(model, spec,
                                                          RankExport(layout, RankCoords.current(), group_gather()))}


def batch(seed: int, rows: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def adam_moments(model, optimizer, spec, layout) -> dict[str, torch.Tensor]:
    """``exp_avg:NAME`` / ``exp_avg_sq:NAME`` of a plain (non-distributed) Megatron Adam, HF-named
    and gathered over TP like the parameters."""
    import megatron_patches
    from spade.models import RankCoords
    from spade.models.loading import group_gather
    from spade.models.weight_map import iter_hf_weights

    states: dict = {}
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        states.update(inner.optimizer.state)
    out = {}
    with megatron_patches.cpu_device_mode():
        for key in ("exp_avg", "exp_avg_sq"):
            local = {name: states[param][key] for name, param in model.named_parameters()}
            for name, tensor in iter_hf_weights(local, spec, layout, RankCoords.current(), group_gather()):
                out[f"{key}:{name}"] = tensor.clone()
    return out
