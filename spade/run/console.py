"""What ``spade train`` prints: known noise filtered out, one line per step, a summary at the end.

**Filtered noise** (:func:`quiet_known_noise`; ``spade train --show-warnings`` or
``SPADE_SHOW_WARNINGS=1`` leaves everything as it is): the Python warnings that Megatron-core
raises on every CPU run because Transformer Engine and Apex are absent (it falls back to torch
implementations, which is what a CPU run wants), its deprecation note about the CUDA-graph scope
that spade never sets, torch's deprecation notes on the checkpoint API that Megatron-core's loader uses when a run
resumes, and the progress bars of transformers and huggingface_hub (the GGUF
conversion of the embedded model and every model load). Only these named messages are hidden:
:data:`KNOWN_WARNINGS` lists them, anything else still shows.

**Step lines** (:func:`step_line`): what happened in a step, from its metrics, in the words of
the run's environment source (``selfplay.env_source``)::

    step 0 (1/3) | envs 3 admitted, 5 rejected (runtime_error 3, syntax_error 2) | 24 plays: return 0.31, with hint 0.45
      | trained 12 samples: loss 0.0123, grad norm 0.84 | designer: 2 released, reward 0.41 | 95 s
    step 0 (1/3) | 24 environments drawn from the pool | 192 plays: return 0.12 | trained ...        (fixed_pool)
    step 0 (1/3) | 16 problems (levels 0-3, mean level 1.4, highest environment level 3), 2 environments raised (5 checked) | ...  (rlve)

A step whose update had no learning signal (``train/no_signal``: every advantage 0, so loss 0 and
grad norm 0) says so after its update: ``| NO LEARNING SIGNAL: every advantage was 0 (4 groups with
equal returns)``.

**Summary** (:func:`run_summary`): read back from the run directory after the run: what was
trained, where the run lives and the commands to look at it or continue it; the set lines name
what the source did (designer attempts and admissions; pool draws; rlve problems, their levels
and the environments raised) and how many updates had no learning signal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..selfplay.step import Step

SHOW_WARNINGS_VARIABLE = "SPADE_SHOW_WARNINGS"

# (category, message regex matched at the start of the warning text, why it is harmless)
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (UserWarning, r"Transformer Engine and Apex are not installed",
     "Megatron-core falls back to torch optimizers and multi-tensor ops: what a CPU run uses"),
    (UserWarning, r"Apex is not installed\. Falling back to Torch Norm",
     "Megatron-core uses torch's LayerNorm/RMSNorm: what a CPU run uses"),
    (UserWarning, r"full scope is deprecated\. Use empty cuda_graph_scope",
     "Megatron-core's default CUDA-graph scope; spade does not capture CUDA graphs"),
    (UserWarning, r"Transformer Engine is not installed",
     "Megatron-core without Transformer Engine: the local (torch) layer specs are used"),
    (FutureWarning, r"`load_state_dict` is deprecated and will be removed",
     "torch.distributed.checkpoint API that Megatron-core's checkpoint loader still calls (resume)"),
    (FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor",
     "Megatron-core's distributed checkpoints are ShardedTensors (resume)"),
)
# Log records of these loggers whose message starts like one of KNOWN_WARNINGS are dropped too
# (Megatron logs some of the same notes through logging).
_KNOWN_LOGGERS = ("megatron", "megatron.core")
_PROGRESS_BAR_VARIABLES = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def show_warnings_requested(flag: bool = False) -> bool:
    """The ``--show-warnings`` flag, or ``SPADE_SHOW_WARNINGS`` set to something other than 0/empty."""
    return flag or os.environ.get(SHOW_WARNINGS_VARIABLE, "") not in ("", "0")


class _KnownNoise(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.patterns = [re.compile(pattern) for _, pattern, _ in KNOWN_WARNINGS]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is not ours to judge
            return True
        return not any(pattern.match(text) for pattern in self.patterns)


_FILTER = _KnownNoise()


def quiet_known_noise(show: bool = False) -> bool:
    """Hide the known harmless warnings and progress bars for the rest of the process, unless
    ``show`` (or ``SPADE_SHOW_WARNINGS``). Returns whether anything was hidden. Idempotent."""
    if show_warnings_requested(show):
        os.environ[SHOW_WARNINGS_VARIABLE] = "1"  # lower layers (the embedded model's conversion) look
        return False
    for category, pattern, _ in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name in _KNOWN_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    for name, value in _PROGRESS_BAR_VARIABLES.items():
        os.environ.setdefault(name, value)
    disable_progress_bars()
    return True


def disable_progress_bars() -> None:
    """transformers' and huggingface_hub's tqdm bars off (both read the setting when they draw)."""
    with contextlib.suppress(Exception):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    with contextlib.suppress(Exception):
        from huggingface_hub.utils import disable_progress_bars as hub_disable

        hub_disable()


# ---------------------------------------------------------------------------- step lines


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{float(value):.{digits}g}"


def rejection_reasons(metrics: Mapping[str, Any], top: int = 3) -> list[tuple[str, int]]:
    """The most frequent rejection kinds of a step (``env/rejected_KIND``), most frequent first."""
    counts = [(key[len("env/rejected_"):], int(value)) for key, value in metrics.items()
              if key.startswith("env/rejected_") and isinstance(value, (int, float)) and value]
    counts.sort(key=lambda item: (-item[1], item[0]))
    return counts[:top]


def source_of(metrics: Mapping[str, Any], env_source: str | None = None) -> str:
    """``env_source`` when given; else ``rlve`` when the metrics carry RLVE's keys, else ``designer``
    (a fixed-pool step's metrics look like a designer step's: say so with ``env_source``)."""
    if env_source:
        return env_source
    if any(key.startswith("spiral/") for key in metrics):
        return "spiral"
    return "rlve" if any(key.startswith("rlve/") for key in metrics) else "designer"


def _reasons_text(metrics: Mapping[str, Any]) -> str:
    reasons = rejection_reasons(metrics)
    return " (" + ", ".join(f"{kind} {count}" for kind, count in reasons) + ")" if reasons else ""


def set_text(metrics: Mapping[str, Any], env_source: str) -> str | None:
    """What a regeneration step's source produced; None on a step without a regeneration."""
    if not ("designer/attempts" in metrics or metrics.get("env/admitted") or metrics.get("env/rejected")):
        return None
    admitted, rejected = int(metrics.get("env/admitted") or 0), int(metrics.get("env/rejected") or 0)
    if env_source == "fixed_pool":
        text = f"{admitted} environments drawn from the pool"
        if rejected:
            text += f", {rejected} failing admission{_reasons_text(metrics)}"
        return text
    if env_source == "spice":  # the Challenger's questions: valid ones are played, invalid ones penalised
        text = f"questions {admitted} valid of {admitted + rejected}"
        if rejected:
            text += f", {rejected} invalid{_reasons_text(metrics)}"
        if metrics.get("spice/reasoner_accuracy") is not None:
            text += f", reasoner accuracy {_num(metrics['spice/reasoner_accuracy'], 2)}"
        return text
    if env_source == "spiral":
        return spiral_text(metrics) or f"{admitted} games"
    if env_source == "rlve":
        levels = []
        if metrics.get("rlve/problem_difficulty_min") is not None:
            low, high = int(metrics["rlve/problem_difficulty_min"]), int(metrics["rlve/problem_difficulty_max"])
            levels.append(f"level {low}" if low == high else f"levels {low}-{high}")
        if metrics.get("rlve/problem_difficulty_mean") is not None:
            levels.append(f"mean level {_num(metrics['rlve/problem_difficulty_mean'], 2)}")
        if metrics.get("rlve/difficulty_max") is not None:
            levels.append(f"highest environment level {int(metrics['rlve/difficulty_max'])}")
        text = f"{admitted} problems" + (f" ({', '.join(levels)})" if levels else "")
        if rejected:
            text += f", {rejected} failed to generate{_reasons_text(metrics)}"
        return text
    return f"envs {admitted} admitted, {rejected} rejected{_reasons_text(metrics)}"


def spiral_text(metrics: Mapping[str, Any]) -> str | None:
    """SPIRAL's games of the step: per game how many, each seat's mean return, the invalid-move share."""
    names = sorted(key.split("/")[1] for key in metrics if key.startswith("spiral/") and key.endswith("/games"))
    texts = []
    for name in names:
        stem = f"spiral/{name}"
        text = f"{name} {int(metrics[f'{stem}/games'])} games"
        seats = [metrics.get(f"{stem}/seat{seat}/return_mean") for seat in (0, 1)]
        if None not in seats:
            text += f", seat returns {_num(seats[0])} / {_num(seats[1])}"
        if metrics.get(f"{stem}/invalid_move_share"):
            text += f", {float(metrics[f'{stem}/invalid_move_share']):.0%} ended by an invalid move"
        texts.append(text)
    return "; ".join(texts) or None


def rlve_text(metrics: Mapping[str, Any]) -> str | None:
    """What RLVE's difficulty controller did after the step's plays."""
    if metrics.get("rlve/raised") is None:
        return None
    raised, checked = int(metrics["rlve/raised"]), int(metrics.get("rlve/checked") or 0)
    return f"{raised} environment{'' if raised == 1 else 's'} raised ({checked} checked)"


def step_label(step: int, total_steps: int) -> str:
    """``2 (3/4)``: the step's number, as in every file of the run (the updates done before it,
    docs/training_runs.md "Step numbers"), then which of the run's steps it is."""
    return f"{Step(step).updates_done} ({Step(step).ordinal}/{total_steps})"


def step_line(step: int, total_steps: int, metrics: Mapping[str, Any], env_source: str | None = None) -> str:
    """One line that says what step ``step`` (0-based) did, from its metrics, in the words of
    ``env_source`` (``designer``, ``fixed_pool``, ``rlve``; None: see :func:`source_of`)."""
    source = source_of(metrics, env_source)
    parts = [f"step {step_label(step, total_steps)}"]
    made = set_text(metrics, source)
    controller = rlve_text(metrics) if source == "rlve" else None
    if made and controller:
        parts.append(f"{made}, {controller}")
    elif made or controller:
        parts.append(made or controller)
    episodes = int(metrics.get("agent/episodes") or 0)
    if episodes:
        text = f"{episodes} plays: return {_num(metrics.get('agent/return_mean'))}"
        if metrics.get("agent/hint_episodes"):
            text += f", with hint {_num(metrics.get('agent/hint_return_mean'))}"
        parts.append(text)
    else:
        parts.append("no plays")
    if metrics.get("train/skipped_no_samples"):
        parts.append("nothing to train on")
    elif metrics.get("train/loss") is not None:
        samples = int(metrics.get("train/samples") or 0)
        designer = int(metrics.get("designer/samples") or 0)
        who = f"{samples} samples" + (f" ({designer} designer)" if designer else "")
        parts.append(f"trained {who}: loss {_num(metrics.get('train/loss'))}, "
                     f"grad norm {_num(metrics.get('train/grad_norm'))}")
        if metrics.get("train/no_signal"):
            parts.append("NO LEARNING SIGNAL: " + no_signal_reason(metrics))
    released = int(metrics.get("designer/released") or 0)
    if source != "designer":
        pass  # no designer whose rewards are waiting
    elif released:
        parts.append(f"designer: {released} released, reward {_num(metrics.get('designer/reward_mean'))}")
    elif metrics.get("designer/pending"):
        parts.append(f"designer: {int(metrics['designer/pending'])} waiting")
    if metrics.get("time/step_s") is not None:
        parts.append(f"{float(metrics['time/step_s']):.0f} s")
    if metrics.get("memory/peak_rss_gb") is not None:
        parts.append(peak_memory_text(metrics))
    return " | ".join(parts)


def no_signal_reason(metrics: Mapping[str, Any]) -> str:
    """Why a step's update learned nothing (``train/no_signal``): every advantage was 0."""
    flat = int(metrics.get("agent/flat_groups") or 0)
    return "every advantage was 0" + (f" ({flat} group{'' if flat == 1 else 's'} with equal returns)" if flat else "")


def peak_memory_text(metrics: Mapping[str, Any]) -> str:
    """``peak RSS 3.1 GB in forward_backward``: the step's largest phase (``memory/peak_rss_gb/*``)."""
    prefix = "memory/peak_rss_gb/"
    phases = {key[len(prefix):]: float(value) for key, value in metrics.items()
              if key.startswith(prefix) and value is not None and key not in (prefix + "checkpoint", prefix + "build")}
    text = f"peak RSS {float(metrics['memory/peak_rss_gb']):.1f} GB"
    if phases:
        text += f" in {max(phases, key=phases.get)}"
    return text


# ---------------------------------------------------------------------------- summary


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows


def _memory_counts(path: Path) -> tuple[int, int]:
    """(records written by the run, seed examples) in a memory database; (0, 0) when unreadable."""
    if not path.is_file():
        return 0, 0
    try:
        from ..designer.memory import Memory

        with Memory.open_readonly(path) as memory:
            records = memory.list()
    except Exception:  # noqa: BLE001 - the summary must not fail the run
        return 0, 0
    seeds = sum(1 for r in records if r.metadata.get("seed"))
    return len(records) - seeds, seeds


def _env_source(root: Path) -> str:
    """``selfplay.env_source`` of the run's ``config.yaml`` (``designer`` when it cannot be read)."""
    try:
        import yaml

        config = yaml.safe_load((root / "config.yaml").read_text()) or {}
        selfplay = config.get("selfplay") or {}
    except Exception:  # noqa: BLE001 - the summary must not fail the run
        return "designer"
    source = selfplay.get("env_source")
    if isinstance(source, str) and source:
        return source
    return "fixed_pool" if selfplay.get("designer_enabled") is False else "designer"


def _saved_sets(root: Path) -> list[tuple[str, str]]:
    """(env_id, source text) of every environment saved under ``RUN/envs/step_*/``."""
    out = []
    directory = root / "envs"
    if directory.is_dir():
        for step in sorted(directory.glob("step_*")):
            for meta in sorted(step.glob("*.json")):
                with contextlib.suppress(OSError):
                    out.append((meta.stem, (step / f"{meta.stem}.py").read_text()))
    return out


def _rlve_problems(root: Path) -> list[dict[str, Any]]:
    """The saved rlve problem specs (``{"rlve": {"environment", "difficulty", ...}}``)."""
    problems = []
    for _, text in _saved_sets(root):
        with contextlib.suppress(ValueError, TypeError, KeyError):
            problems.append(dict(json.loads(text)["rlve"]))
    return problems


def set_summary(root: Path, rows: list[dict[str, Any]], env_source: str) -> str:
    """The summary's line on where the sets came from."""

    def total(key: str) -> int:
        return int(sum(float(r.get(key) or 0) for r in rows))

    admitted, rejected = total("env/admitted"), total("env/rejected")
    regenerations = sum(1 for r in rows if "designer/attempts" in r)
    over = f" over {regenerations} regeneration{'' if regenerations == 1 else 's'}"
    if env_source == "fixed_pool":
        distinct = len({env_id for env_id, _ in _saved_sets(root)})
        failing = f", {rejected} failing admission" if rejected else ""
        return f"  pool       {admitted} environments drawn from the pool{over} ({distinct} distinct{failing})"
    if env_source == "rlve":
        problems = _rlve_problems(root)
        levels = sorted({int(p.get("difficulty", 0)) for p in problems})
        names = {str(p.get("environment")) for p in problems}
        detail = [f"levels {levels[0]}-{levels[-1]}" if levels else "no saved problems",
                  f"{len(names)} rlve-gym environment{'' if len(names) == 1 else 's'}"]
        if rejected:
            detail.append(f"{rejected} failed to generate")
        raised = total("rlve/raised")
        top = next((r["rlve/difficulty_max"] for r in reversed(rows) if r.get("rlve/difficulty_max") is not None), None)
        return (f"  rlve       {admitted} problems{over} ({', '.join(detail)}); {raised} environment"
                f"{'' if raised == 1 else 's'} raised" + (f", highest environment level {int(top)}" if top is not None else ""))
    attempts = total("designer/attempts")
    rate = f" ({admitted / attempts:.0%} of attempts)" if attempts else ""
    return f"  designer   {attempts} attempts, {admitted} environments admitted{rate}"


def run_summary(run_dir: str | Path, *, wall_s: float | None = None, command: str = "spade") -> str:
    """A short account of the run in ``run_dir`` and what to do next, in the words of its
    ``selfplay.env_source``."""
    root = Path(run_dir)
    rows = _read_metrics(root / "metrics.jsonl")
    source = _env_source(root)
    designed = source == "designer"

    def total(key: str) -> int:
        return int(sum(float(r.get(key) or 0) for r in rows))

    trained = [r for r in rows if r.get("train/loss") is not None and not r.get("train/skipped_no_samples")]
    records, seeds = _memory_counts(root / "memory.sqlite")
    lines = [f"spade train: {len(rows)} steps" + (f" in {wall_s / 60:.1f} min" if wall_s is not None else "")]
    lines.append(set_summary(root, rows, source))
    if source == "rlve":
        lines.append(f"  agent      {total('agent/episodes')} plays (rlve problems have no hint)")
    else:
        lines.append(f"  agent      {total('agent/episodes')} plays without hint, {total('agent/hint_episodes')} with hint")
    if trained:
        last = trained[-1]
        designer = f" ({total('designer/samples')} designer)" if designed or total("designer/samples") else ""
        lines.append(f"  trained    {len(trained)} GRPO updates on {total('train/samples')} samples{designer}; "
                     f"last loss {_num(last.get('train/loss'))}, grad norm {_num(last.get('train/grad_norm'))}")
    else:
        lines.append("  trained    nothing: no step produced samples (see the rejections under rejected/)")
    silent = [r for r in trained if r.get("train/no_signal")]
    if silent:
        steps = ", ".join(str(int(r["step"])) for r in silent[:8]) + (", ..." if len(silent) > 8 else "")
        lines.append(f"  signal     {len(silent)} of {len(trained)} updates had no learning signal: every advantage "
                     f"was 0 (each group's returns were equal), loss 0 and grad norm 0 (steps {steps})")
    released = total("designer/released")
    if released:
        lines.append(f"  designer   {released} environments rewarded after k steps (delay buffer)")
    show_memory = designed or records or seeds
    if show_memory:
        lines.append(f"  memory     {records} records" + (f" (+{seeds} seed examples)" if seeds else ""))
    lines.append(f"  run dir    {root}")
    lines.append("next:")
    lines.append(f"  tensorboard --logdir {root / 'tensorboard'}")
    if show_memory:
        lines.append(f"  {command} memory list {root}")
    lines.append(f"  {command} analyze {root}")
    lines.append(f"  {command} train --resume {root} run.steps={len(rows) + 2}")
    lines.append(f"  ls {root / 'envs'}  {root / 'rejected'}")
    return "\n".join(lines)
