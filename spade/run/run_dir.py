"""The run directory: everything a training run needs to resume, written so that a kill at any
moment leaves a resumable directory.

Layout::

    RUN/
      config.yaml              the full resolved config (every default written out)
      metrics.jsonl            one JSON object per finished step ({"step": s, "agent/...": ...})
      tensorboard/             TensorBoard event files (when the tensorboard package is installed)
      memory.sqlite            the designer memory (spade.designer.memory)
      checkpoints/
        step_N/                a spade checkpoint (model, optimizer, RNG; spade.training.checkpoint)
          trainer_state.json   {"step": N, "orchestrator": ..., "scheduler": ..., ...}
        latest                 "step_N": the newest COMPLETE checkpoint (written last)
        best                   optional: the checkpoints pruning keeps whatever their age (below)
      ...                      whatever the orchestrator writes (environment sets, hints, rejects)

Step numbering: steps are 0-based; ``checkpoints/step_N`` is saved after steps ``0 .. N-1``
finished, so a resumed run starts at step ``N``. ``metrics.jsonl`` gets one line per finished
step, appended and fsync'ed; on resume the lines of steps ``>= N`` (finished after the checkpoint,
or torn by the kill) are dropped so the file again has exactly one line per step. The memory
database is rolled back to records of steps ``< N``.

A checkpoint counts only once ``latest`` names it: the model/optimizer/RNG save is atomic
(``save_checkpoint`` renames a finished temp directory), ``trainer_state.json`` is then written
atomically into it and recorded in the checkpoint's manifest (``spade_manifest.json``: every
file's size and CRC-32, rewritten last), and ``latest`` is replaced atomically last, only after the
checkpoint passed verification against its manifest.

``checkpoints/best`` is JSON ``{"steps": [...], "metric": M, "mode": "max"|"min", "scores":
{"N": score}}``: ``steps`` are checkpoints marked best by hand (``mark_best``), ``scores`` the
in-loop evaluation score ``M`` of each checkpoint evaluated (``record_score``, called by the
trainer for ``run.best_metric``); the best-scoring of them (the earliest on a tie) is marked best
too. It is the whole state of the comparison, so a resumed run continues it (``forget_scores_after``
drops the scores of steps the resumed run redoes). A plain JSON list of steps (the older form)
reads as ``steps``.

Resume takes ``newest_intact_checkpoint()``: the newest checkpoint at or before ``latest`` that
passes verification (every file of the manifest present, of its size and CRC-32, with
``trainer_state.json`` and ``spade_checkpoint.json`` among them); each newer one that fails is
skipped with a warning that names what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from ..training.checkpoint_info import INFO_FILE, CheckpointError, read_checkpoint_info
from ..training.checkpoint_manifest import add_to_manifest, verify_checkpoint
from ..durable_files import atomic_write_text

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest"
BEST_FILE = "best"  # the checkpoints pruning keeps whatever their age (BestRecord)
BEST_MODES = ("max", "min")
TRAINER_STATE_FILE = "trainer_state.json"


class RunDirError(RuntimeError):
    """A run directory that cannot be used as asked (exists, missing, incomplete)."""


def json_safe(value: Any) -> Any:
    """Non-finite floats become null (strict JSON); tensors and numpy scalars become numbers."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return json_safe(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


@dataclass
class BestRecord:
    """The content of ``checkpoints/best``: steps marked by hand and the evaluation scores."""

    steps: set[int] = field(default_factory=set)
    metric: Optional[str] = None
    mode: str = "max"
    scores: dict[int, float] = field(default_factory=dict)

    def best_scored(self) -> Optional[int]:
        """The step with the best score (the earliest of equals), None without scores."""
        if not self.scores:
            return None
        sign = 1.0 if self.mode == "max" else -1.0
        return min(self.scores, key=lambda step: (-sign * self.scores[step], step))

    def kept(self) -> set[int]:
        best = self.best_scored()
        return self.steps | ({best} if best is not None else set())

    def to_json(self) -> str:
        return json.dumps({"steps": sorted(self.steps), "metric": self.metric, "mode": self.mode,
                           "scores": {str(s): self.scores[s] for s in sorted(self.scores)}}) + "\n"

    @classmethod
    def from_json(cls, data: Any) -> "BestRecord":
        if isinstance(data, list):  # the older form: the marked steps only
            return cls(steps={int(step) for step in data})
        if not isinstance(data, dict):
            raise TypeError(f"a JSON object or list, got {type(data).__name__}")
        mode = data.get("mode", "max")
        if mode not in BEST_MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(BEST_MODES)}")
        return cls(steps={int(step) for step in data.get("steps", [])}, metric=data.get("metric"), mode=mode,
                   scores={int(step): float(score) for step, score in (data.get("scores") or {}).items()})


class RunDir:
    """Paths and atomic writes of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root).absolute()

    # -- paths
    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step}"

    # -- creation
    def create(self, config_yaml: str) -> None:
        """A new run: refuse a directory that already holds a run."""
        if self.config_path.exists():
            raise RunDirError(f"{self.root} already holds a run ({CONFIG_FILE} exists): "
                              f"continue it with 'spade train --resume {self.root}' or choose another --run-dir")
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoints_dir.mkdir(exist_ok=True)
        atomic_write_text(self.config_path, config_yaml)

    def write_config(self, config_yaml: str) -> None:
        atomic_write_text(self.config_path, config_yaml)

    def require_existing(self) -> None:
        if not self.config_path.is_file():
            raise RunDirError(f"{self.root} is not a run directory ({CONFIG_FILE} is missing)")

    # -- metrics
    def append_metrics(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(json_safe(dict(record)), sort_keys=False)
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.is_file():
            return []
        out = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a kill
        return out

    def truncate_metrics(self, start_step: int) -> int:
        """Keep exactly one line per step ``< start_step`` (the last one written); returns how
        many lines were dropped."""
        if not self.metrics_path.is_file():
            return 0
        lines = self.metrics_path.read_text(encoding="utf-8").splitlines()
        by_step: dict[int, str] = {}
        for line in lines:
            try:
                step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            if isinstance(step, int) and step < start_step:
                by_step[step] = line
        kept = [by_step[s] for s in sorted(by_step)]
        if len(kept) != len(lines):
            atomic_write_text(self.metrics_path, "".join(line + "\n" for line in kept))
        return len(lines) - len(kept)

    # -- checkpoints
    def latest_step(self) -> Optional[int]:
        """The step of the newest complete checkpoint, or None."""
        pointer = self.checkpoints_dir / LATEST_FILE
        if not pointer.is_file():
            return None
        name = pointer.read_text().strip()
        if not name.startswith("step_"):
            raise RunDirError(f"{pointer}: unexpected content {name!r}")
        step = int(name[len("step_"):])
        directory = self.checkpoint_dir(step)
        if not (directory / TRAINER_STATE_FILE).is_file():
            raise RunDirError(f"{pointer} names {directory}, which has no {TRAINER_STATE_FILE}")
        return step

    def checkpoint_steps(self) -> list[int]:
        """The steps of all ``checkpoints/step_N`` directories, newest first (complete or not)."""
        if not self.checkpoints_dir.is_dir():
            return []
        return sorted((int(p.name[5:]) for p in self.checkpoints_dir.glob("step_*")
                       if p.name[5:].isdigit() and p.is_dir()), reverse=True)

    def write_trainer_state(self, step: int, state: Mapping[str, Any]) -> None:
        """Write ``trainer_state.json`` into a saved checkpoint and record it in its manifest."""
        directory = self.checkpoint_dir(step)
        atomic_write_text(directory / TRAINER_STATE_FILE, json.dumps(json_safe(dict(state)), indent=1))
        try:
            add_to_manifest(directory, [TRAINER_STATE_FILE])
        except CheckpointError as exc:
            raise RunDirError(f"cannot record {TRAINER_STATE_FILE} in checkpoint {directory}: {exc}") from None

    def read_trainer_state(self, step: int) -> dict[str, Any]:
        return json.loads((self.checkpoint_dir(step) / TRAINER_STATE_FILE).read_text())

    def checkpoint_problems(self, step: int, *, checksums: bool = True) -> list[str]:
        """What is wrong with ``checkpoints/step_N`` ([] when it can be resumed from)."""
        directory = self.checkpoint_dir(step)
        problems = verify_checkpoint(directory, checksums=checksums, require=(INFO_FILE, TRAINER_STATE_FILE))
        if problems:
            return problems
        try:
            info = read_checkpoint_info(directory)
        except CheckpointError as exc:
            return [str(exc)]
        if info.step != step:
            return [f"{directory}: {INFO_FILE} says step {info.step}"]
        try:
            state = self.read_trainer_state(step)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return [f"{directory}: {TRAINER_STATE_FILE} is unreadable: {exc}"]
        if not isinstance(state, dict) or state.get("step") != step:
            return [f"{directory}: {TRAINER_STATE_FILE} is not the state of step {step}"]
        return []

    def mark_latest(self, step: int) -> None:
        """Point ``latest`` at ``checkpoints/step_N``, which must pass verification (sizes and
        presence; the CRC-32s were computed from these very files a moment ago)."""
        problems = self.checkpoint_problems(step, checksums=False)
        if problems:
            raise RunDirError(f"not marking checkpoint step_{step} as latest, it is damaged: "
                              + "; ".join(problems))
        atomic_write_text(self.checkpoints_dir / LATEST_FILE, f"step_{step}\n")

    def newest_intact_checkpoint(self, *, checksums: bool = True) -> tuple[Optional[int], list[str]]:
        """The step of the newest checkpoint to resume from (None: start at step 0), and one
        warning per checkpoint skipped because it failed verification (what is wrong with it).

        Candidates are the checkpoints at or before the one ``latest`` names (a newer one was
        interrupted before it counted); all of them when ``latest`` is unreadable; none when it is
        missing (the first save was interrupted). When checkpoints exist but none is intact, the
        last warning says so and how to start over.
        """
        warnings: list[str] = []
        steps = self.checkpoint_steps()
        pointer = self.checkpoints_dir / LATEST_FILE
        bound: Optional[int] = None
        if pointer.is_file():
            name = pointer.read_text(errors="replace").strip()
            if name.startswith("step_") and name[5:].isdigit():
                bound = int(name[5:])
            else:
                warnings.append(f"{pointer}: unexpected content {name!r}; looking at every checkpoint")
        elif steps:
            return None, []  # no checkpoint counted yet: the first save was interrupted
        candidates = [s for s in steps if bound is None or s <= bound]
        if bound is not None and bound not in candidates:
            warnings.append(f"{pointer} names step_{bound}, which does not exist")
        for step in candidates:
            problems = self.checkpoint_problems(step, checksums=checksums)
            if not problems:
                return step, warnings
            warnings.append(f"skipping checkpoint step_{step}, it is damaged: " + "; ".join(problems))
        if candidates or bound is not None:
            warnings.append(
                f"no intact checkpoint in {self.checkpoints_dir}: to start this run over from step 0, "
                f"move that directory away and resume again, or start a new run with "
                f"'spade train --config {self.config_path} --run-dir NEW_DIR'")
        return None, warnings

    def read_best(self) -> BestRecord:
        """``checkpoints/best`` (an empty record when the file is missing)."""
        path = self.checkpoints_dir / BEST_FILE
        try:
            return BestRecord.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return BestRecord()
        except (ValueError, TypeError, AttributeError) as exc:
            raise RunDirError(f"{path}: not a record of the best checkpoints ({exc})") from exc

    def _write_best(self, record: BestRecord) -> None:
        atomic_write_text(self.checkpoints_dir / BEST_FILE, record.to_json())

    def best_steps(self) -> set[int]:
        """The checkpoints marked best: by hand and the best-scoring one; empty when none."""
        return self.read_best().kept()

    def mark_best(self, step: int) -> None:
        """Mark ``checkpoints/step_<step>`` best: pruning keeps it whatever its age."""
        if not self.checkpoint_dir(step).is_dir():
            raise RunDirError(f"no checkpoint {self.checkpoint_dir(step)} to mark best")
        record = self.read_best()
        record.steps.add(step)
        self._write_best(record)

    def record_score(self, step: int, score: float, *, metric: str, mode: str) -> bool:
        """Record checkpoint ``step``'s evaluation score on ``metric``; returns whether it is now the
        best-scoring checkpoint (``mode`` max: the highest). Scores recorded under another metric or
        mode are dropped first (they do not compare); a non-finite score is not recorded."""
        if mode not in BEST_MODES:
            raise RunDirError(f"best mode {mode!r} is not one of {', '.join(BEST_MODES)}")
        if not self.checkpoint_dir(step).is_dir():
            raise RunDirError(f"no checkpoint {self.checkpoint_dir(step)} to score")
        if not math.isfinite(score):
            return False
        record = self.read_best()
        if (record.metric, record.mode) != (metric, mode):
            record.metric, record.mode, record.scores = metric, mode, {}
        record.scores[step] = float(score)
        self._write_best(record)
        return record.best_scored() == step

    def forget_scores_after(self, step: int) -> None:
        """Drop the scores of checkpoints after ``step`` (a resumed run redoes those steps)."""
        record = self.read_best()
        later = [s for s in record.scores if s > step]
        if later:
            for s in later:
                del record.scores[s]
            self._write_best(record)

    def prune_checkpoints(self, keep: int, *, protect: Iterable[int] = ()) -> list[Path]:
        """Remove complete checkpoints older than ``latest`` except the newest ``keep`` of them
        (``latest`` included; 0 keeps all), the ones marked best and ``protect`` (the checkpoint a
        resumed run started from), and leftovers of interrupted saves. Directories newer than
        ``latest`` (a save under way or cut off) are left alone."""
        latest = self.latest_step()
        if latest is None:
            return []
        removed = []
        if keep:
            complete = [s for s in self.checkpoint_steps() if s <= latest]  # newest first
            spared = set(complete[:keep]) | self.best_steps() | set(protect) | {latest}
            for step in complete:
                if step not in spared:
                    shutil.rmtree(self.checkpoint_dir(step), ignore_errors=True)
                    removed.append(self.checkpoint_dir(step))
        for leftover in self.checkpoints_dir.glob("step_*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        return removed
