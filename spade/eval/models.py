"""Loading the model to evaluate into a rollout engine: an HF directory, the embedded model, or a
spade Megatron checkpoint (its weights go through the weight map's export path, ``hf_weights``,
into an hf engine built from the checkpoint's ``hf/`` config, via ``update_weights``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..rollout.engine import RolloutEngine

EMBEDDED = "embedded"


class ModelLoadError(RuntimeError):
    """The model cannot be loaded as asked."""


@dataclass
class LoadedModel:
    engine: RolloutEngine
    tokenizer: Any
    label: str
    hf_dir: Path
    step: Optional[int]
    max_context_tokens: int


def _device_dtype(device: str, dtype: str) -> tuple[str, str]:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def megatron_hf_tensors(checkpoint: Path) -> tuple[Any, list[tuple[str, Any]]]:
    """(CheckpointInfo, HF-named tensors) of a spade checkpoint, loaded on one rank."""
    from ..models import ParallelLayout
    from ..models.builder import BuildOptions, build_gpt_model
    from ..models.loading import hf_weights
    from ..training.checkpoint import load_checkpoint
    from ..training.checkpoint_info import read_checkpoint_info
    from ..training.parallel import parallel_session

    import megatron_patches

    info = read_checkpoint_info(checkpoint)
    spec = info.model_spec()
    with parallel_session(ParallelLayout()):
        with megatron_patches.cpu_device_mode():
            import torch

            model = build_gpt_model(spec, ParallelLayout(), BuildOptions(params_dtype=torch.float32))
        load_checkpoint(info.directory, [model], load_rng=False)
        tensors = [(name, tensor.detach().clone()) for name, tensor in hf_weights(model, spec)]
    return info, tensors


async def load_model(path: str, *, engine: str = "hf", device: str = "auto", dtype: str = "auto",
                     max_batch_size: int = 8, sglang_urls: Sequence[str] = (),
                     max_context_tokens: Optional[int] = None) -> LoadedModel:
    """``path``: an HF directory, ``embedded``, or a spade checkpoint directory."""
    from transformers import AutoTokenizer

    step = None
    checkpoint: Optional[Path] = None
    if path == EMBEDDED:
        from ..models.embedded import MODEL_NAME, embedded_model_dir

        hf_dir, label = Path(embedded_model_dir()), MODEL_NAME
    else:
        root = Path(path).expanduser()
        if (root / "spade_checkpoint.json").is_file():
            from ..training.checkpoint_info import CheckpointError, read_checkpoint_info

            try:
                info = read_checkpoint_info(root)
            except CheckpointError as exc:
                raise ModelLoadError(str(exc)) from None
            checkpoint, hf_dir, step, label = root, Path(info.hf_dir), info.step, f"{root.parent.parent.name}@{info.step}"
        elif (root / "config.json").is_file():
            hf_dir, label = root, root.resolve().name
        else:
            raise ModelLoadError(f"--model {path}: not an HF directory (config.json), a spade checkpoint "
                                 "(spade_checkpoint.json), a run directory, or 'embedded'")
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    config = json.loads((hf_dir / "config.json").read_text())
    context = int(max_context_tokens or config.get("max_position_embeddings") or 4096)
    if engine == "sglang":
        if not sglang_urls:
            raise ModelLoadError("--engine sglang needs --sglang-url URL (servers already serving the model)")
        from ..rollout.sglang.engine import SGLangEngine

        return LoadedModel(SGLangEngine(list(sglang_urls)), tokenizer, label, hf_dir, step, context)
    if engine != "hf":
        raise ModelLoadError(f"--engine must be hf or sglang, got {engine!r}")
    from ..rollout.hf.engine import HFEngine

    device, dtype = _device_dtype(device, dtype)
    if checkpoint is None:
        hf_engine = HFEngine(hf_dir, tokenizer, device=device, dtype=dtype, max_batch_size=max_batch_size,
                             max_context_tokens=context)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        info, tensors = megatron_hf_tensors(checkpoint)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(hf_dir)))
        hf_engine = HFEngine((model, tokenizer), device=device, dtype=dtype, max_batch_size=max_batch_size,
                             max_context_tokens=context)
        await hf_engine.update_weights(tensors, version=int(info.step))
    return LoadedModel(hf_engine, tokenizer, label, hf_dir, step, context)
