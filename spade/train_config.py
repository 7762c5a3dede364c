"""The one typed configuration tree of ``spade train``.

A training config is YAML with these top-level sections (every one optional; defaults are the
SPEC numbers)::

    include: base.yaml        # optional: a file (or list of files) merged underneath this one
    model:     {hf_dir: embedded | /path/to/hf, dtype: auto | float32 | bfloat16, recompute: none | full | selective,
                recompute_method: uniform | block, recompute_num_layers: N, core_attention: sdpa | unfused,
                memory_check: true,
                thinking: auto | on | off}
    parallel:  {tp, pp, ep, etp, sequence_parallel}
    optimizer: spade.training.OptimizerSettings
    loss:      spade.training.LossSettings
    selfplay:  spade.selfplay.settings.SelfPlaySettings
    sandbox:   spade.envs.sandbox.SandboxConfig
    engine:    spade.rollout.settings.EngineSection (sglang: spade.rollout.sglang.settings.SGLangSection)
    corpus:    spade.designer.corpus.CorpusSettings
    run:       {steps, checkpoint_every, seed, micro_batch_tokens, log_every, keep_checkpoints, best_metric,
                best_mode: max | min, loggers, overlap: 0 | 1}
    eval:      spade.eval.in_loop.EvalSettings (held-out evaluation between steps; every: 0 = off)

``load_train_config(path, overrides)`` reads the file (resolving ``include:`` relative to the
including file; later files and the including file win, mappings merge key by key), applies
dotted command-line overrides ``key.sub=value`` (values parsed as YAML scalars, so ``3``, ``0.5``,
``true``, ``null``, ``[a, b]`` work), and validates every section with
:func:`spade.config.from_mapping`: an unknown key or a wrong type raises ``ConfigError`` naming
the full key (``selfplay.k``, ``run.steps``, ...). A key that moved (a section's ``MOVED_KEYS``,
:func:`spade.config.upgrade_keys`) still loads, with a warning naming its new place: each file and
each override is upgraded on its own before they are merged, so an old key in a later file or an
override wins over the new key in an included file, as it did before the key moved.

Relative paths (``model.hf_dir``, ``corpus.paths``, ``selfplay.fixed_env_dir``, ``selfplay.memory_seed_dir``) are resolved when
the config is loaded: relative to the working directory when they exist there, else relative to
the repository root (where ``examples/`` lives), so a run directory's ``config.yaml`` snapshot
holds absolute paths and resumes from anywhere.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Sequence

import yaml

from .config import ConfigError, from_mapping, load_yaml, require, upgrade_keys
from .designer.corpus import CorpusSettings
from .eval.in_loop import EvalSettings
from .eval.suites import benchmark_names
from .envs.sandbox.config import SandboxConfig
from .rollout.settings import EngineSection
from .selfplay.settings import SelfPlaySettings
from .training.optimizer import OptimizerSettings
from .training.train_step import LossSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = "embedded"
SECTIONS = ("model", "parallel", "optimizer", "loss", "selfplay", "sandbox", "engine", "corpus", "run", "eval")
MAX_INCLUDE_DEPTH = 8
# YAML 1.1 (PyYAML) reads 1e-6 as a string (it wants 1.0e-6); such strings are numbers here
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


@dataclass(frozen=True)
class ModelSection:
    hf_dir: str = EMBEDDED  # "embedded" = SmolLM2-135M-Instruct from spade.models.embedded
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 on CUDA or a CPU with AMX/AVX512-BF16, else fp32 (printed)
    recompute: Literal["none", "full", "selective"] = "none"  # activation recompute in the backward pass
    # with recompute: full only (Megatron's --recompute-method / --recompute-num-layers); null = uniform, 1
    recompute_method: Optional[Literal["uniform", "block"]] = None
    recompute_num_layers: Optional[int] = None
    # without Transformer Engine: "sdpa" = PyTorch's fused attention (keeps no [b*heads, s, s] scores),
    # "unfused" = Megatron's DotProductAttention (spade.models.sdpa_attention)
    core_attention: Literal["sdpa", "unfused"] = "sdpa"
    # refuse, before loading, a local-spec (no Transformer Engine) GPU run whose estimated step memory
    # exceeds the device (spade.training.memory_plan)
    memory_check: bool = True
    # chat-template thinking switch for every role (enable_thinking of Qwen3's hybrid templates):
    # auto = the template's default, on/off need a template with the switch (YAML's bare on/off
    # arrive as booleans and are read as on/off)
    thinking: Literal["auto", "on", "off"] | bool = "auto"

    def __post_init__(self) -> None:
        for key in ("recompute_method", "recompute_num_layers"):
            require(getattr(self, key) is None or self.recompute == "full", f"model.{key}",
                    f"applies to model.recompute: full only (model.recompute is {self.recompute}); remove it")
        require(self.recompute_num_layers is None or self.recompute_num_layers >= 1, "model.recompute_num_layers",
                f"must be >= 1 (layers per recomputed group or block), got {self.recompute_num_layers}")
        if isinstance(self.thinking, bool):
            object.__setattr__(self, "thinking", "on" if self.thinking else "off")


@dataclass(frozen=True)
class ParallelSection:
    tp: int = 1  # tensor-parallel size
    pp: int = 1  # pipeline-parallel size
    ep: int = 1  # expert-parallel size (MoE models)
    etp: Optional[int] = None  # None: = tp
    sequence_parallel: bool = False  # shard layer-norm and dropout activations along the sequence over the TP group

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "ep"):
            require(getattr(self, key) >= 1, f"parallel.{key}", f"must be >= 1, got {getattr(self, key)}")
        require(self.etp is None or self.etp >= 1, "parallel.etp", f"must be >= 1 or null, got {self.etp}")
        require(not self.sequence_parallel or self.tp > 1, "parallel.sequence_parallel",
                "needs tensor parallelism (parallel.tp > 1)")

    def layout(self):
        from .models import ParallelLayout

        return ParallelLayout(tp=self.tp, pp=self.pp, ep=self.ep, etp=self.etp,
                              sequence_parallel=self.sequence_parallel)


RUN_LOGGERS = ("tensorboard", "wandb", "mlflow")
BEST_METRIC_DEFAULT = "eval/mean"


@dataclass(frozen=True)
class RunSection:
    steps: int = 400  # GRPO updates of the run (the paper: 400 for games)
    checkpoint_every: int = 16  # write a checkpoint every N updates (and after the last)
    seed: int = 1234  # seed of every random choice of the run (rollout sampling, corpus draws, seeds of plays)
    micro_batch_tokens: int = 16384  # token budget of one micro-batch (B * S padded)
    log_every: int = 1  # plain progress lines every N steps (metrics.jsonl gets every step)
    # checkpoints kept: the newest N, any marked best (RunDir.mark_best) and the one a resumed run
    # started from; 0 keeps all
    keep_checkpoints: int = 2
    # the checkpoint marked best (kept by pruning): the one whose in-loop evaluation (eval.every)
    # scored best on this metric: eval/mean (the suite average, the paper's checkpoint selection),
    # eval/<benchmark>, or none; only checkpointed steps that were evaluated take part
    best_metric: str = BEST_METRIC_DEFAULT
    best_mode: Literal["max", "min"] = "max"  # max: the highest score is best
    # experiment trackers each step's metrics and the config go to (metrics.jsonl always): tensorboard,
    # wandb, mlflow (docs/trackers.md)
    loggers: tuple[str, ...] = ("tensorboard",)
    # 1: step t+1's rollout runs while step t trains (one step off policy, docs/overlap.md; beyond
    # the paper); 0: the paper's synchronous steps
    overlap: int = 0

    def __post_init__(self) -> None:
        require(self.overlap in (0, 1), "run.overlap", f"allowed: 0 (synchronous steps) or 1 (one step off "
                                                       f"policy); got {self.overlap!r}")
        require(self.steps >= 0, "run.steps", f"must be >= 0, got {self.steps}")
        require(self.checkpoint_every >= 1, "run.checkpoint_every", f"must be >= 1, got {self.checkpoint_every}")
        require(self.micro_batch_tokens >= 2, "run.micro_batch_tokens", f"must be >= 2, got {self.micro_batch_tokens}")
        require(self.log_every >= 1, "run.log_every", f"must be >= 1, got {self.log_every}")
        require(self.keep_checkpoints >= 0, "run.keep_checkpoints", f"must be >= 0, got {self.keep_checkpoints}")
        require(self.best_metric == "none" or (self.best_metric.startswith("eval/") and "/" not in self.best_metric[5:]
                                                and len(self.best_metric) > 5),
                "run.best_metric", f"allowed: {BEST_METRIC_DEFAULT} (the in-loop evaluation's mean), "
                                   f"eval/<benchmark> or none; got {self.best_metric!r}")
        for name in self.loggers:
            require(name in RUN_LOGGERS, "run.loggers", f"unknown tracker {name!r}; allowed: {', '.join(RUN_LOGGERS)}")
        require(len(set(self.loggers)) == len(self.loggers), "run.loggers", f"lists a tracker twice: {list(self.loggers)}")


@dataclass(frozen=True)
class TrainConfig:
    """The whole configuration of one training run."""

    model: ModelSection = field(default_factory=ModelSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    loss: LossSettings = field(default_factory=LossSettings)
    selfplay: SelfPlaySettings = field(default_factory=SelfPlaySettings)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    engine: EngineSection = field(default_factory=EngineSection)
    corpus: CorpusSettings = field(default_factory=CorpusSettings)
    run: RunSection = field(default_factory=RunSection)
    eval: EvalSettings = field(default_factory=EvalSettings)

    def __post_init__(self) -> None:
        require(not (self.run.overlap and self.engine.kind == "sglang" and self.engine.sglang.colocated), "run.overlap",
                "1 with colocated SGLang servers: they hand the trainer their GPU memory during the update, "
                "when the overlapped rollout needs them; allowed: engine.kind: hf, or disaggregated servers "
                "(engine.sglang.urls), or run.overlap: 0 (docs/overlap.md)")
        require(not (self.run.overlap and self.selfplay.rollout_shards > 1), "run.overlap",
                f"1 with selfplay.rollout_shards: {self.selfplay.rollout_shards}; allowed: 0 with shards, or "
                "rollout_shards: 1 (the overlapped rollout runs beside the update on rank 0 alone)")
        metric = self.run.best_metric
        if metric not in ("none", BEST_METRIC_DEFAULT):
            names = benchmark_names(self.eval.suite, list(self.eval.benchmarks) or None)
            allowed = ", ".join([BEST_METRIC_DEFAULT, *(f"eval/{name}" for name in names), "none"])
            require(metric[len("eval/"):] in names, "run.best_metric",
                    f"{metric!r} is not a benchmark of the in-loop evaluation (eval.suite / eval.benchmarks); "
                    f"allowed: {allowed}")

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON-able data (tuples become lists) that ``from_dict`` reads back."""
        return {name: _plain(dataclasses.asdict(getattr(self, name))) for name in SECTIONS}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _numbers(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and _EXPONENT_FLOAT.match(value.strip()):
        return float(value)
    return value


def _section(cls: type, data: Mapping[str, Any], name: str) -> Any:
    value = _numbers(data.get(name))
    try:
        return from_mapping(cls, value, where=name)
    except ConfigError as exc:
        message = str(exc)
        # __post_init__ checks name their key without the section: add it
        if not message.startswith(f"{name}.") and not message.startswith(f"{name}:"):
            message = f"{name}.{message}"
        raise ConfigError(message) from None


# Keys earlier versions took and this one refuses, each with the reason (a config that still sets
# one would otherwise mean something the run no longer does).
REMOVED_KEYS = {
    ("loss", "temperature"): "removed: the trainer computes old, new and reference log-probs at the temperature each "
                             "sample was drawn with (selfplay.sampling.agent.temperature, selfplay.sampling.designer.temperature; 1 for "
                             "greedy), as the rollout engine's log-probs are, so a separate value could only make the "
                             "importance weights and the KL term disagree with the sampler; delete the key",
}


def _refuse_removed_keys(data: Mapping[str, Any]) -> None:
    for (section, key), reason in REMOVED_KEYS.items():
        values = data.get(section)
        if isinstance(values, Mapping) and key in values:
            raise ConfigError(f"{section}.{key}: {reason}")


def from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """Validate a whole config mapping (after includes and overrides)."""
    if not isinstance(data, Mapping):
        raise ConfigError("the config must be a mapping")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; allowed sections: {', '.join(SECTIONS)}")
    _refuse_removed_keys(data)
    data = _resolve_paths(data)
    return TrainConfig(
        model=_section(ModelSection, data, "model"),
        parallel=_section(ParallelSection, data, "parallel"),
        optimizer=_section(OptimizerSettings, data, "optimizer"),
        loss=_section(LossSettings, data, "loss"),
        selfplay=_section(SelfPlaySettings, data, "selfplay"),
        sandbox=_section(SandboxConfig, data, "sandbox"),
        engine=_section(EngineSection, data, "engine"),
        corpus=_section(CorpusSettings, data, "corpus"),
        run=_section(RunSection, data, "run"),
        eval=_section(EvalSettings, data, "eval"),
    )


# ---------------------------------------------------------------------------- files and overrides


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``; mappings merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_config_file(path: str | Path, _depth: int = 0) -> dict[str, Any]:
    """A YAML config with its ``include:`` files merged underneath it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    if _depth > MAX_INCLUDE_DEPTH:
        raise ConfigError(f"{path}: includes nested deeper than {MAX_INCLUDE_DEPTH} (a cycle?)")
    data = upgrade_sections(load_yaml(path))
    includes = data.pop("include", None)
    if includes is None:
        return data
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: include must be a file name or a list of file names")
    merged: dict[str, Any] = {}
    for include in includes:
        merged = deep_merge(merged, read_config_file(path.parent / include, _depth + 1))
    return deep_merge(merged, data)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], YAML-parsed value)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: expected key.sub=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: value {raw!r} is not valid YAML: {exc}") from None
    return key.split("."), value


def upgrade_sections(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with the moved keys of every section at their new paths (spade.config.upgrade_keys)."""
    sections = {"model": ModelSection, "parallel": ParallelSection, "optimizer": OptimizerSettings,
                "loss": LossSettings, "selfplay": SelfPlaySettings, "sandbox": SandboxConfig, "engine": EngineSection,
                "corpus": CorpusSettings, "run": RunSection, "eval": EvalSettings}
    return {name: upgrade_keys(sections[name], value, where=name)
            if name in sections and isinstance(value, Mapping) else value for name, value in data.items()}


def _leaves(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[list[str], Any]]:
    out: list[tuple[list[str], Any]] = []
    for key, value in data.items():
        if isinstance(value, Mapping):  # an empty one writes nothing (hint_sampling=shared)
            out.extend(_leaves(value, (*prefix, key)))
        else:
            out.append(([*prefix, key], value))
    return out


def _override_paths(parts: list[str], value: Any) -> list[tuple[list[str], Any]]:
    """Where one override writes: its own path, or the new paths of a moved key."""
    single: dict[str, Any] = {}
    node = single
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    upgraded = upgrade_sections(single)
    return [(parts, value)] if upgraded == single else _leaves(upgraded)


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    out = deep_merge({}, data)
    for text in overrides:
        parsed, parsed_value = parse_override(text)
        for parts, value in _override_paths(parsed, parsed_value):
            _set_path(out, parts, value)
    return out


def _set_path(out: dict[str, Any], parts: list[str], value: Any) -> None:
    node = out
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = {}
        elif not isinstance(child, Mapping):
            raise ConfigError(f"override {'.'.join(parts)}: {'.'.join(parts[:i + 1])} is not a section")
        node[part] = dict(child)
        node = node[part]
    node[parts[-1]] = value


def override_keys(overrides: Sequence[str]) -> list[str]:
    return [".".join(parse_override(text)[0]) for text in overrides]


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read ``path`` (with includes), apply ``overrides`` and validate."""
    return from_dict(apply_overrides(read_config_file(path), overrides))


# ---------------------------------------------------------------------------- paths


def resolve_path(value: str) -> str:
    """Absolute path for ``value``: as given, relative to the working directory, or relative to
    the repository root, the first that exists; unchanged when none does (reported on use)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    for base in (Path.cwd(), REPO_ROOT):
        candidate = base / path
        if candidate.exists():
            return str(candidate.resolve())
    return value


def _resolve_paths(data: Mapping[str, Any]) -> dict[str, Any]:
    out = deep_merge({}, data)
    model = out.get("model")
    if isinstance(model, Mapping) and isinstance(model.get("hf_dir"), str) and model["hf_dir"] != EMBEDDED:
        out["model"] = {**model, "hf_dir": resolve_path(model["hf_dir"])}
    corpus = out.get("corpus")
    if isinstance(corpus, Mapping):
        paths = corpus.get("paths")
        if isinstance(paths, str):
            paths = [paths]
        if isinstance(paths, (list, tuple)) and all(isinstance(p, str) for p in paths):
            out["corpus"] = {**corpus, "paths": [resolve_path(p) for p in paths]}
    selfplay = out.get("selfplay")
    if isinstance(selfplay, Mapping):
        for key in ("fixed_env_dir", "memory_seed_dir"):
            if isinstance(selfplay.get(key), str):
                selfplay = {**selfplay, key: resolve_path(selfplay[key])}
        out["selfplay"] = selfplay
    return out
