"""Making a pool directory (the format is :mod:`spade.selfplay.sources.fixed_pool`'s): generated once by a designer, or assembled
from the admitted environments of earlier runs.

**Generation** (:class:`PoolGenerator`, ``spade pool generate``) makes designer attempts through
the training's own :class:`~spade.selfplay.sources.designer_source.DesignerRound` (the same designer prompts with corpus
documents and memory as configured, the same admission, the same hint call), one attempt at a time
per concurrent worker, until ``n`` environments are admitted. Attempt ``a`` is the designer round's
slot 0 of pseudo-step ``a``, so its corpus document, memory draw and sampling seeds are derived from
``(seed, a)`` like a training attempt's; its skill is the requested skill furthest below its share
of ``n`` (counting attempts in flight), so the pool comes out balanced over the skills. An admitted
attempt becomes ``env_AAAAAA.py`` and ``env_AAAAAA.hint.txt``, then its manifest line (one whole-line
append, flushed); ``generation/state.json`` (written by rename) records which attempts are done.
Rejected attempts are kept as ``generation/rejected/step_AAAAAA/slot0_attempt0.json`` with their
reason, as in a run.

Rerunning with the same output directory continues: the environments of the manifest are kept, the
attempts already done are not made again, and an attempt that was in flight when the process died
is made again under its own number (its files, written before its manifest line, are removed).

**Assembly** (:func:`assemble_pool`, ``spade pool assemble``) copies ``RUN/envs/step_S/ENV_ID.py``,
``.hint.txt`` and ``.json`` of runs into a pool as ``RUNNAME-ENV_ID``, skipping sources already in
it, so a fixed-pool run's repeated sets or a rerun add nothing twice.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..designer.skills import Skill
from ..durable_files import atomic_write_text
from ..envs.admission import AdmissionVerdict
from ..envs.pool_files import HINT_SUFFIX, append_manifest, read_manifest
from ..selfplay.sources.designer_source import DesignerRound, EnvSpec, read_saved_sets
from ..selfplay.sources.fixed_pool import GENERATION_DIR
from ..selfplay.settings import SelfPlaySettings

STATE_FILE = "state.json"
NAME_PATTERN = re.compile(r"env_(\d{6})")
Report = Callable[[str], None]

# The timings of the attempt the current task is making (designer round calls report into it).
_TIMINGS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("pool_attempt_timings", default=None)


def pool_name(attempt: int) -> str:
    return f"env_{attempt:06d}"


class _TimedRound(DesignerRound):
    """The designer round, timing admission and the hint call of the attempt being made."""

    async def admit_response(self, response: str) -> AdmissionVerdict | None:
        started = time.perf_counter()
        verdict = await super().admit_response(response)
        timings = _TIMINGS.get()
        if timings is not None:
            timings["admission"] = time.perf_counter() - started
            if verdict is not None:
                timings["admission_ms"] = {k: round(v, 3) for k, v in verdict.timings_ms.items()}
        return verdict

    async def make_hint(self, source: str, step: int, slot: int) -> str:
        started = time.perf_counter()
        hint = await super().make_hint(source, step, slot)
        timings = _TIMINGS.get()
        if timings is not None:
            timings["hint"] = time.perf_counter() - started
        return hint


@dataclass
class GenerationSummary:
    admitted: int          # environments in the pool now
    requested: int
    attempts: int          # attempts done over every invocation
    attempts_now: int      # attempts this invocation made
    admitted_now: int

    @property
    def complete(self) -> bool:
        return self.admitted >= self.requested


@dataclass
class _Progress:
    done: set[int] = field(default_factory=set)
    per_skill: dict[str, int] = field(default_factory=dict)
    admitted: int = 0
    done_below: int = 0  # every attempt below this one is done


class PoolGenerator:
    """Generates a pool into ``out`` (see the module docstring).

    ``origin`` is what each manifest line says the environments came from (the designer model or
    URL); ``designer`` holds the :class:`DesignerRound` arguments other than the settings and the
    run directory (sandbox, engine, tokenizer, chat format, corpus, memory, seed, stop tokens).
    """

    def __init__(self, settings: SelfPlaySettings, out: Path, *, n: int, skills: list[Skill], concurrency: int,
                 origin: dict[str, Any], report: Report = print, **designer: Any):
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        if concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
        if not skills:
            raise ValueError("skills: at least one skill is needed")
        self.settings = dataclasses.replace(settings, max_attempts=1)  # one attempt per unit of work
        self.out = Path(out)
        self.work = self.out / GENERATION_DIR
        self.n = n
        self.skills = list(skills)
        self.concurrency = concurrency
        self.origin = origin
        self.report = report
        self.round = _TimedRound(self.settings, run_dir=self.work, **designer)

    # ------------------------------------------------------------------ state

    def _load(self) -> _Progress:
        progress = _Progress(per_skill={skill.name: 0 for skill in self.skills})
        state_path = self.work / STATE_FILE
        if state_path.is_file():
            state = json.loads(state_path.read_text())
            progress.done.update(range(int(state["done_below"])))
            progress.done.update(int(a) for a in state["done_above"])
        kept = set()
        for record in read_manifest(self.out):
            kept.add(record["name"])
            progress.admitted += 1
            if isinstance(record.get("attempt"), int):
                progress.done.add(record["attempt"])  # its manifest line was written, its state maybe not
            skill = record.get("skill")
            if skill in progress.per_skill:
                progress.per_skill[skill] += 1
        for path in list(self.out.glob("env_*.py")) + list(self.out.glob(f"env_*{HINT_SUFFIX}")):
            stem = path.name.split(".", 1)[0]
            if NAME_PATTERN.fullmatch(stem) and stem not in kept:
                path.unlink()  # written by an attempt that died before its manifest line
        return progress

    def _save(self, progress: _Progress) -> None:
        below = progress.done_below
        while below in progress.done:
            below += 1
        progress.done_below = below
        state = {"done_below": below, "done_above": sorted(a for a in progress.done if a > below),
                 "requested": self.n, "skills": [s.name for s in self.skills], "origin": self.origin,
                 "seed": self.round.seed}
        atomic_write_text(self.work / STATE_FILE, json.dumps(state))

    # ------------------------------------------------------------------ the loop

    def _next_skill(self, progress: _Progress, in_flight: dict[str, int]) -> Skill:
        quotas = {s.name: self.n // len(self.skills) + (1 if i < self.n % len(self.skills) else 0)
                  for i, s in enumerate(self.skills)}
        return max(self.skills, key=lambda s: (quotas[s.name] - progress.per_skill[s.name] - in_flight[s.name],
                                               -self.skills.index(s)))

    async def run(self, max_attempts: int | None = None) -> GenerationSummary:
        """Attempt until ``n`` environments are admitted, or ``max_attempts`` attempts were made
        by this call (None: no limit)."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        progress = self._load()
        self.round.seed_memory()
        in_flight: dict[asyncio.Task, tuple[int, Skill]] = {}
        skills_in_flight = {s.name: 0 for s in self.skills}
        started_here = admitted_here = 0
        next_attempt = 0
        try:
            while True:
                while (len(in_flight) < min(self.concurrency, self.n - progress.admitted)
                       and (max_attempts is None or started_here < max_attempts)):
                    while next_attempt in progress.done:
                        next_attempt += 1
                    skill = self._next_skill(progress, skills_in_flight)
                    task = asyncio.create_task(self._attempt(next_attempt, skill))
                    in_flight[task] = (next_attempt, skill)
                    skills_in_flight[skill.name] += 1
                    next_attempt += 1
                    started_here += 1
                if not in_flight:
                    break
                finished, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(finished, key=lambda t: in_flight[t][0]):
                    attempt, skill = in_flight.pop(task)
                    skills_in_flight[skill.name] -= 1
                    spec, rejection, timings = task.result()
                    if spec is not None:
                        self._store(attempt, spec, timings, progress)
                        admitted_here += 1
                    else:
                        self.report(f"  attempt {attempt} ({skill.name}) rejected: {rejection}")
                    progress.done.add(attempt)
                    self._save(progress)
        finally:
            for task in in_flight:
                task.cancel()
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)
        return GenerationSummary(progress.admitted, self.n, len(progress.done), started_here, admitted_here)

    async def _attempt(self, attempt: int, skill: Skill) -> tuple[EnvSpec | None, str, dict[str, Any]]:
        timings: dict[str, Any] = {}
        _TIMINGS.set(timings)  # this task's own context
        started = time.perf_counter()
        _, rejections, admitted = await self.round.fill_slot(attempt, 0, skill)
        timings["total"] = time.perf_counter() - started
        if admitted is None:
            reason = "; ".join(f"{r.kind.value} at {r.stage.value}: {r.message[:200]}" for r in rejections)
            return None, reason, timings
        return admitted[0], "", timings

    def _store(self, attempt: int, spec: EnvSpec, timings: dict[str, Any], progress: _Progress) -> None:
        name = pool_name(attempt)
        atomic_write_text(self.out / f"{name}.py", spec.source)
        atomic_write_text(self.out / f"{name}{HINT_SUFFIX}", spec.hint)
        total = timings.get("total", 0.0)
        admission, hint = timings.get("admission", 0.0), timings.get("hint", 0.0)
        record = {
            "name": name, "skill": spec.skill, "class_name": spec.class_name, "hint": spec.hint,
            "source": self.origin, "document": spec.document, "attempt": attempt, "max_turns": spec.max_turns,
            "domain": self.settings.domain,
            "timings_s": {"designer": round(max(0.0, total - admission - hint), 3), "admission": round(admission, 3),
                          "hint": round(hint, 3), "total": round(total, 3)},
            "admission_ms": timings.get("admission_ms", {}),
        }
        if spec.tool_report is not None:
            record["tool_report"] = spec.tool_report
        append_manifest(self.out, record)
        progress.admitted += 1
        progress.per_skill[spec.skill] = progress.per_skill.get(spec.skill, 0) + 1
        t = record["timings_s"]
        self.report(f"[{progress.admitted}/{self.n}] {name} {spec.skill} ({spec.class_name}, attempt {attempt}): "
                    f"designer {t['designer']:.1f} s, admission {t['admission']:.2f} s, hint {t['hint']:.1f} s")


# ---------------------------------------------------------------------------- assembly


@dataclass
class AssemblySummary:
    added: int
    skipped_duplicates: int
    runs: int


def parse_steps(text: str | None) -> tuple[int | None, int | None]:
    """``a:b`` (steps a <= s < b; either side may be empty) or a single step ``a``."""
    if text is None:
        return None, None
    parts = text.split(":")
    try:
        if len(parts) == 1:
            step = int(parts[0])
            return step, step + 1
        if len(parts) == 2:
            return (int(parts[0]) if parts[0] else None), (int(parts[1]) if parts[1] else None)
    except ValueError:
        pass
    raise ValueError(f"--steps: {text!r} is not a step range; give a:b (a <= step < b, either may be empty) or one step")


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def assemble_pool(runs: list[Path], out: Path, *, steps: tuple[int | None, int | None] = (None, None),
                  report: Report = print) -> AssemblySummary:
    """Copy the admitted environments of ``runs`` (``RUN/envs/step_S/``) into the pool ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lo, hi = steps
    names = {path.stem for path in out.glob("*.py")}
    seen = {_digest(path.read_text()) for path in out.glob("*.py")}
    added = duplicates = 0
    labels: dict[str, int] = {}
    for run in runs:
        run = Path(run)
        envs = run / "envs"
        if not envs.is_dir():
            raise ValueError(f"--from: {run} is not a run directory (no envs/ in it)")
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", run.resolve().name) or "run"
        labels[label] = labels.get(label, 0) + 1
        if labels[label] > 1:
            label = f"{label}{labels[label]}"
        for saved in read_saved_sets(run):
            if (lo is not None and saved.step < lo) or (hi is not None and saved.step >= hi):
                continue
            digest = _digest(saved.source)
            if digest in seen:
                duplicates += 1
                continue
            meta = saved.meta
            name = f"{label}-{saved.env_id}"
            while name in names:
                name += "_"
            atomic_write_text(out / f"{name}.py", saved.source)
            atomic_write_text(out / f"{name}{HINT_SUFFIX}", saved.hint)
            append_manifest(out, {
                "name": name, "skill": meta.get("skill"), "class_name": meta.get("class_name"), "hint": saved.hint,
                "source": {"run": str(run.resolve()), "env_id": saved.env_id, "step": saved.step},
                "document": meta.get("document"), "max_turns": meta.get("max_turns"),
            })
            names.add(name)
            seen.add(digest)
            added += 1
            report(f"[{added}] {name} {meta.get('skill')} ({meta.get('class_name')}) from {run} step {saved.step}")
    return AssemblySummary(added, duplicates, len(runs))
