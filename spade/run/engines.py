"""One way to open a model as an engine, for ``spade train``, ``eval``, ``serve``, ``pool`` and ``score``.

A model reference is one of:

- ``embedded``: the embedded demo model (``spade.models.embedded``);
- a Hugging Face directory (``config.json``, safetensors, tokenizer files);
- a spade checkpoint (``RUN/checkpoints/step_N``: ``spade_checkpoint.json``, Megatron shards,
  ``hf/`` with the config and tokenizer); its weights go through the weight map's export path
  (``hf_weights``) into an hf engine built from ``hf/config.json``;
- a run directory (``config.yaml`` and ``checkpoints/``): its newest intact checkpoint.

:func:`resolve_model` turns the reference into a :class:`ModelRef` without loading anything;
:func:`open_engine` opens it as the engine the ``engine:`` config section describes
(:class:`EngineSettings`: the section, ``model.dtype`` and an optional ``cuda:N`` device). The
commands' ``--engine/--device/--dtype/--max-batch-size/--sglang-url`` flags are shorthands for
those keys (:func:`engine_settings`). :func:`resolve_device` and :func:`resolve_dtype` are the one
place where ``auto`` becomes a device and a dtype.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Sequence

from ..rollout.settings import EngineSection
from ..train_config import EMBEDDED

DTYPES = ("float32", "bfloat16", "float16")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
CPU_FLAGS_FILE = Path("/proc/cpuinfo")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


class ModelRefError(ValueError):
    """A model reference that names nothing usable, or an engine that cannot be opened as asked."""


# ---------------------------------------------------------------------------- model references


@dataclass(frozen=True)
class ModelRef:
    """What a model reference resolved to; nothing is loaded."""

    given: str  # as the user wrote it
    kind: Literal["embedded", "hf", "checkpoint"]
    hf_dir: Path  # config.json and tokenizer files (a checkpoint's hf/)
    label: str  # the default served name / the eval label
    checkpoint: Optional[Path] = None  # kind "checkpoint": the checkpoint directory
    step: Optional[int] = None  # kind "checkpoint": its step
    notes: tuple[str, ...] = ()  # checkpoints of a run directory skipped as damaged

    @property
    def hf_config(self) -> dict[str, Any]:
        return json.loads((self.hf_dir / "config.json").read_text())


def is_run_dir(path: Path) -> bool:
    from .run_dir import CHECKPOINTS_DIR, CONFIG_FILE

    return (path / CHECKPOINTS_DIR).is_dir() and (path / CONFIG_FILE).is_file() \
        and not (path / "config.json").exists()


def resolve_model(reference: str, *, key: str = "--model") -> ModelRef:
    """The :class:`ModelRef` of ``reference``; :class:`ModelRefError` naming ``key`` otherwise."""
    if reference == EMBEDDED:
        from ..models.embedded import MODEL_NAME, embedded_model_dir

        return ModelRef(reference, "embedded", Path(embedded_model_dir()), MODEL_NAME)
    root = Path(reference).expanduser()
    if not root.is_dir():
        raise ModelRefError(f"{key} {reference}: no such directory (give an HF model directory, a spade "
                            f"checkpoint, a run directory, or '{EMBEDDED}')")
    notes: tuple[str, ...] = ()
    if is_run_dir(root):
        from .run_dir import RunDir

        run = RunDir(root)
        step, warnings = run.newest_intact_checkpoint()
        if step is None:
            raise ModelRefError(f"{key} {reference}: the run directory has no usable checkpoint"
                                + (f" ({'; '.join(warnings)})" if warnings else ""))
        root, notes = run.checkpoint_dir(step), tuple(warnings)
    from ..training.checkpoint_info import INFO_FILE, CheckpointError, read_checkpoint_info

    if (root / INFO_FILE).is_file():
        try:
            info = read_checkpoint_info(root)
        except CheckpointError as exc:
            raise ModelRefError(f"{key} {reference}: {exc}") from None
        run_name = root.resolve().parent.parent.name
        return ModelRef(reference, "checkpoint", Path(info.hf_dir), f"{run_name}@{info.step}",
                        checkpoint=Path(info.directory), step=int(info.step), notes=notes)
    if (root / "config.json").is_file():
        return ModelRef(reference, "hf", root, root.resolve().name)
    raise ModelRefError(f"{key} {reference}: not an HF model directory (no config.json), a spade checkpoint "
                        f"({INFO_FILE}), a run directory (config.yaml and checkpoints/), or '{EMBEDDED}'")


# ---------------------------------------------------------------------------- device and dtype


def cpu_has_native_bf16(cpuinfo: Path = CPU_FLAGS_FILE) -> bool:
    """Whether the CPU computes in bf16 natively (AMX or AVX512-BF16), from its ``flags`` line."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return any(flag in flags for flag in NATIVE_BF16_FLAGS)
    return False


def resolve_device(device: str = "auto") -> str:
    """``auto``: the current CUDA device when there is one, else ``cpu``; anything else as given."""
    if not DEVICE_PATTERN.match(device):
        raise ModelRefError(f"device {device!r}: allowed are auto, cpu, cuda, cuda:N")
    if device != "auto":
        return device
    import torch

    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # float32 | bfloat16 | float16
    why: str  # "" when it was given; for auto, the reason

    @property
    def torch(self):
        import torch

        return getattr(torch, self.name)

    def line(self) -> str:
        """What ``model.dtype: auto`` became and why (empty for an explicit dtype)."""
        return f"model.dtype auto: {self.name} ({self.why})" if self.why else ""


def resolve_dtype(dtype: str, device: str, *, native_bf16: Optional[bool] = None) -> DtypeChoice:
    """``model.dtype`` for ``device`` (a resolved one): ``auto`` is bfloat16 on CUDA and on a CPU
    with native bf16 (AMX or AVX512-BF16), float32 on any other CPU, where bf16 matrix products
    convert to fp32 and run slower than fp32 throughout."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ModelRefError(f"model.dtype {dtype!r}: allowed are auto, {', '.join(DTYPES)}")
        return DtypeChoice(dtype, "")
    if device.startswith("cuda"):
        return DtypeChoice("bfloat16", "CUDA device")
    if cpu_has_native_bf16() if native_bf16 is None else native_bf16:
        return DtypeChoice("bfloat16", "this CPU has AMX or AVX512-BF16")
    return DtypeChoice("float32", "this CPU has neither AMX nor AVX512-BF16, where bf16 runs slower than fp32")


# ---------------------------------------------------------------------------- engine settings


@dataclass(frozen=True)
class EngineSettings:
    """The ``engine:`` section, ``model.dtype`` and a device that may name one GPU (``cuda:N``)."""

    section: EngineSection = field(default_factory=EngineSection)
    dtype: str = "auto"
    device: Optional[str] = None  # None: engine.device

    @property
    def kind(self) -> str:
        return self.section.kind

    def resolved_device(self) -> str:
        return resolve_device(self.device or self.section.device)

    def resolved_dtype(self) -> DtypeChoice:
        return resolve_dtype(self.dtype, self.resolved_device())


def engine_settings(config: Optional[str] = None, overrides: Sequence[str] = (), *, engine: Optional[str] = None,
                    device: Optional[str] = None, dtype: Optional[str] = None,
                    max_batch_size: Optional[int] = None, sglang_urls: Sequence[str] = ()) -> EngineSettings:
    """The engine settings of a train config (``--config``, its ``engine:`` and ``model.dtype``) with
    ``overrides`` (``engine.batch_wait_ms=5``, ...), then the flags, each a shorthand for its key:
    ``--engine`` engine.kind, ``--device`` engine.device (or one GPU, ``cuda:N``), ``--dtype``
    model.dtype, ``--max-batch-size`` engine.max_batch_size, ``--sglang-url`` engine.sglang.urls.
    A flag left None keeps the config's value."""
    from ..config import ConfigError
    from ..train_config import apply_overrides, from_dict, read_config_file

    data: Mapping[str, Any] = read_config_file(config) if config else {}
    data = {key: value for key, value in data.items() if key in ("engine", "model")}
    refused = [text for text in overrides if not text.split("=", 1)[0].startswith(("engine.", "model.dtype"))]
    if refused:
        raise ConfigError(f"{refused[0]}: only engine.* and model.dtype settings apply here")
    tree = from_dict(apply_overrides(data, overrides))
    section, model_dtype = tree.engine, tree.model.dtype
    if engine is not None:
        section = dataclasses.replace(section, kind=engine)
    if max_batch_size is not None:
        section = dataclasses.replace(section, max_batch_size=max_batch_size)
    if sglang_urls:
        section = dataclasses.replace(section, sglang=dataclasses.replace(section.sglang, urls=tuple(sglang_urls)))
    if dtype is not None:
        model_dtype = dtype
    resolve_dtype(model_dtype, "cpu", native_bf16=False)  # names the allowed values of a wrong one
    exact_device = None
    if device is not None:
        if not DEVICE_PATTERN.match(device):
            raise ModelRefError(f"--device {device!r}: allowed are auto, cpu, cuda, cuda:N")
        if device in ("auto", "cpu", "cuda"):
            section = dataclasses.replace(section, device=device)
        else:
            exact_device = device
    return EngineSettings(section, model_dtype, exact_device)


# ---------------------------------------------------------------------------- opening


@dataclass
class OpenedEngine:
    """An engine serving ``ref``, with what its callers need beside it."""

    engine: Any  # a RolloutEngine
    tokenizer: Any
    ref: ModelRef
    max_context_tokens: int
    vocab_size: int
    eos_token_ids: set[int]
    device: str = ""  # hf engine only
    dtype: str = ""  # hf engine only

    def close(self) -> None:
        self.engine.close()


def checkpoint_hf_tensors(checkpoint: Path) -> tuple[Any, list[tuple[str, Any]]]:
    """(CheckpointInfo, HF-named fp32 tensors) of a spade checkpoint, loaded on one rank."""
    import torch

    import megatron_patches

    from ..models import ParallelLayout
    from ..models.builder import BuildOptions, build_gpt_model
    from ..models.loading import hf_weights
    from ..training.checkpoint import load_checkpoint
    from ..training.checkpoint_info import read_checkpoint_info
    from ..training.parallel import parallel_session

    info = read_checkpoint_info(checkpoint)
    spec = info.model_spec()
    with parallel_session(ParallelLayout()):
        with megatron_patches.cpu_device_mode():
            model = build_gpt_model(spec, ParallelLayout(), BuildOptions(params_dtype=torch.float32))
        load_checkpoint(info.directory, [model], load_rng=False)
        tensors = [(name, tensor.detach().clone()) for name, tensor in hf_weights(model, spec)]
    return info, tensors


def generation_eos_ids(hf_dir: Path, tokenizer: Any) -> set[int]:
    """End-of-sequence ids from ``generation_config.json`` and the tokenizer."""
    ids: set[int] = set()
    config = hf_dir / "generation_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def load_tokenizer(ref: ModelRef) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ref.hf_dir))


def hf_engine(model: Any, tokenizer: Any, settings: EngineSettings, *, max_context_tokens: Optional[int] = None,
              return_routed_experts: bool = False) -> Any:
    """The in-process hf engine on ``model`` (an HF directory, or a ``(model, tokenizer)`` pair) with
    the ``engine:`` section's batching and the resolved device and dtype."""
    from ..rollout.hf.engine import HFEngine

    section = settings.section
    return HFEngine(model, tokenizer, device=settings.resolved_device(), dtype=settings.resolved_dtype().name,
                    max_batch_size=section.max_batch_size, batch_wait_ms=section.batch_wait_ms,
                    prefill_chunk_tokens=section.prefill_chunk_tokens, max_context_tokens=max_context_tokens,
                    return_routed_experts=return_routed_experts)


async def open_engine(ref: ModelRef, settings: EngineSettings, *, tokenizer: Any = None,
                      max_context_tokens: Optional[int] = None) -> OpenedEngine:
    """Open ``ref`` as the engine ``settings`` describe. ``hf``: in this process (a checkpoint's
    weights are exported to HF names and copied into a model built from its ``hf/`` config);
    ``sglang``: a client of the running servers of ``engine.sglang.urls`` (which serve ``ref``)."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(ref)
    config = ref.hf_config
    context = int(max_context_tokens or config.get("max_position_embeddings") or 4096)
    vocab = int(config.get("vocab_size") or len(tokenizer))
    section = settings.section
    if section.kind == "sglang":
        if not section.sglang.urls:
            raise ModelRefError("engine.kind sglang needs the URLs of running servers: --sglang-url URL "
                                "(engine.sglang.urls)")
        from ..rollout.sglang.engine import SGLangEngine

        return OpenedEngine(SGLangEngine(list(section.sglang.urls)), tokenizer, ref, context, vocab,
                            generation_eos_ids(ref.hf_dir, tokenizer))
    if section.kind != "hf":
        raise ModelRefError(f"engine.kind {section.kind!r}: allowed are hf, sglang")
    device, dtype = settings.resolved_device(), settings.resolved_dtype()
    if ref.checkpoint is None:
        engine = hf_engine(ref.hf_dir, tokenizer, settings, max_context_tokens=context)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        info, tensors = checkpoint_hf_tensors(ref.checkpoint)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(ref.hf_dir)))
        engine = hf_engine((model, tokenizer), tokenizer, settings, max_context_tokens=context)
        await engine.update_weights(tensors, version=int(info.step))
    return OpenedEngine(engine, tokenizer, ref, context, vocab, set(engine.eos_token_ids), device, dtype.name)


def open_engine_now(ref: ModelRef, settings: EngineSettings, **kwargs: Any) -> OpenedEngine:
    """:func:`open_engine` from synchronous code (no event loop running); the engine attaches to the
    loop that later uses it."""
    return asyncio.run(open_engine(ref, settings, **kwargs))


def report(command: str, ref: ModelRef, settings: EngineSettings) -> None:
    """The lines a command prints before it loads: skipped checkpoints and what ``auto`` chose."""
    for note in ref.notes:
        print(f"spade {command}: {note}", file=sys.stderr)
    if settings.kind == "hf":
        line = settings.resolved_dtype().line()
        if line:
            print(f"spade {command}: {line}", file=sys.stderr)
