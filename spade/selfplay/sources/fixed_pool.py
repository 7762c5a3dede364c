"""The Fixed-env GRPO baseline's source (``selfplay.env_source: fixed_pool``): a pool of environments
written once, drawn from instead of designing new ones (the paper: 24 environments per step from a
pool of 7,872 written by a frontier model). No designer calls, no designer samples.

**Pool directory** (``selfplay.fixed_env_dir``; ``spade pool generate`` and ``spade pool assemble``
write one)::

    NAME.py           the environment's source, one per environment (NAME: the file stem)
    NAME.hint.txt     its privileged hint (optional; no file: no hint)
    pool.jsonl        the manifest (optional): one JSON object per line, one line per environment
    generation/       spade pool generate's own records (state, rejected attempts); never read here

A manifest line holds ``name`` (the stem of ``NAME.py``) and ``skill`` (the skill it was written
for), and, as written by the pool commands: ``class_name``, ``hint`` (a copy of ``NAME.hint.txt``,
which is what training reads), ``source`` (where it came from: ``{"designer": MODEL_DIR or URL,
"model": NAME}`` or ``{"run": RUN_DIR, "env_id": ..., "step": ...}``), ``document`` (the corpus
document's key), ``attempt`` (the generation attempt that produced it), ``timings_s``
(``designer``, ``admission``, ``hint``, ``total``), ``admission_ms`` (admission's time per stage) and
``max_turns``. Only ``name`` and ``skill`` are read when drawing; a line whose ``name`` has no
``NAME.py`` is ignored, a ``NAME.py`` without a line has no known skill. A line cut short by a crash
(the last one) is ignored. A plain directory of ``.py`` files without a manifest is a pool too.

**Drawing** (``selfplay.pool``, :mod:`.pool_settings`). Every regeneration (the baseline recipe:
every step, ``k: 1``) takes ``envs_per_set`` environments.

* ``draw: shuffle`` (default; the released trainer's rule, :class:`ShuffleSampler`): one
  ``random.Random(selfplay.pool.seed)`` shuffles the sorted names, and each set is the next
  ``envs_per_set`` names of that order. When fewer are left, the set takes them, the same generator
  shuffles the whole pool again (the next *pass*), the names just taken are struck from that pass,
  and the set is filled from its front. Skills play no part: each draw is labelled with its manifest
  skill, or ``unknown``. A pool smaller than a set gives the whole pool, newly shuffled, every time.
* ``draw: balanced`` (this project's variant, :class:`PoolSampler`): a pass visits the pool in an
  order shuffled under a seed derived from ``(seed, pass number)``; slot ``i`` wants the
  curriculum's ``slot_skills(active, envs_per_set)[i]`` and gets the first undrawn environment of
  that skill in the pass's order; when the pass has none of that skill left (or the manifest does
  not name it) the slot takes the first undrawn environment of any skill, a *fallback*, counted in
  the set's draw record. Without a manifest every slot takes the next undrawn environment and is
  labelled with its slot's skill. A pool of at most ``envs_per_set`` environments is played whole
  at every regeneration, in file-name order.

Each drawn file goes through the same admission as a designed environment (the verdict is cached
per file for the life of the process; with ``selfplay.pool.released_loader_names`` the game is
loaded, at admission and in its plays, with the names the released loader binds, through
:class:`ReleasedLoaderSandbox`); a rejected one leaves its slot empty and is written under
``rejected/`` like a designer attempt. The set is saved as ``envs/step_S/fixed-NAME.*`` and the draw
as ``pool_draws/step_S.json`` (slot, name, wanted and given skill, fallback, pass), and the step's
metrics get ``pool/fallbacks``, ``pool/pass``, ``pool/drawn_in_pass`` and ``pool/size``. The draw state
(the pass number and how far into it, per sampler) is in :meth:`FixedPool.state_dict`, so a resumed
run draws exactly what the straight run would; resuming on a pool whose file names changed, or under
another ``selfplay.pool`` draw or seed, is refused.

A pool directory that is missing or holds no ``.py`` file is refused with :func:`missing_pool_message`,
which names the key and the commands that make a pool: the baseline never falls back to the example
games.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from ...config import ConfigError
from ...durable_files import atomic_write_text
from ...designer.skills import slot_skills
from ...envs.admission import AdmissionVerdict
from ...envs.pool_files import HINT_SUFFIX, manifest_path, read_manifest
from ...envs.protocol import ErrorKind, Sandbox, Stage
from .designer_source import EnvSpec, RegenerationResult, admit_candidate, save_set, tool_report_of, write_rejection
from ..seeds import derive_seed
from ..settings import SelfPlaySettings
from ..step import Step

Screen = Callable[[str, list[dict[str, Any]]], Awaitable[bool | None]]

GENERATION_DIR = "generation"
STATE_VERSION = 2  # 1: the balanced draw only (no "draw" key)
UNKNOWN_SKILL = "unknown"  # the label of a drawn environment no manifest line names a skill for


# ---------------------------------------------------------------------------- the directory


@dataclass(frozen=True)
class PoolEntry:
    """One environment of a pool directory."""

    name: str
    path: Path
    skill: str | None  # from the manifest; None: not named there (or no manifest)
    record: dict[str, Any] = field(default_factory=dict, compare=False)

    def hint(self) -> str:
        hint_path = self.path.with_name(self.name + HINT_SUFFIX)
        return hint_path.read_text().strip() if hint_path.is_file() else ""


def read_pool(directory: Path | str) -> list[PoolEntry]:
    """Every ``NAME.py`` of ``directory``, sorted by name, with its manifest skill."""
    directory = Path(directory)
    records = {record["name"]: record for record in read_manifest(directory)}
    entries = []
    for path in sorted(directory.glob("*.py")):
        record = records.get(path.stem, {})
        skill = record.get("skill")
        entries.append(PoolEntry(path.stem, path, skill if isinstance(skill, str) else None, record))
    return entries


def pool_fingerprint(entries: list[PoolEntry]) -> str:
    return hashlib.sha256("\n".join(e.name for e in entries).encode()).hexdigest()[:16]


def missing_pool_message(directory: Path | str) -> str:
    """Why ``directory`` cannot be the Fixed-env GRPO pool, and how to make one."""
    return (f"selfplay.fixed_env_dir: {directory} is not a pool (a directory of environment .py files). "
            "The Fixed-env GRPO baseline trains on a pool made beforehand: pass selfplay.fixed_env_dir=DIR "
            "with DIR made by one of\n"
            "  spade pool import --from RELEASED_POOL_DIR --out DIR   (the paper's 7,872 games: "
            "hf download spare-rl/spare-gpt55-static-corpus --repo-type dataset --local-dir RELEASED_POOL_DIR)\n"
            "  spade pool generate --designer (MODEL_DIR | URL) --n 7872 --out DIR [--config YAML]\n"
            "  spade pool assemble --from RUN_DIR [RUN_DIR ...] --out DIR\n"
            "(docs/pool.md). The six example games are a pool only when asked for by name "
            "(selfplay.fixed_env_dir=examples/envs, a smoke test).")


# ---------------------------------------------------------------------------- drawing


@dataclass(frozen=True)
class Draw:
    slot: int
    entry: PoolEntry
    wanted: str | None  # the slot's curriculum skill (the balanced draw; None: the released draw)
    skill: str          # the skill the environment is labelled with
    fallback: bool
    pass_number: int


class ShuffleSampler:
    """The released trainer's draw (module docstring, ``draw: shuffle``).

    State: the pass number ``p``, how many names of pass ``p``'s order were taken (``taken``), and the
    names struck from that order because the set that opened it had already taken them (``carried``).
    Pass ``p``'s order is the ``p + 1``-th shuffle of the sorted names by one ``Random(seed)``, so the
    state rebuilds the generator and the order exactly.
    """

    draw_name = "shuffle"

    def __init__(self, entries: list[PoolEntry], seed: int):
        if not entries:
            raise ValueError("the pool is empty")
        self.entries = {e.name: e for e in entries}
        # the released trainer sorts the files' paths (one directory): by file name, not by stem
        self.names = [e.name for e in sorted(entries, key=lambda e: e.path.name)]
        self.seed = seed
        self.pass_number = 0
        self.taken = 0
        self.carried: list[str] = []
        self._rebuild()

    def _rebuild(self) -> None:
        self._rng = random.Random(self.seed)
        for _ in range(self.pass_number + 1):
            order = list(self.names)
            self._rng.shuffle(order)
        carried = set(self.carried)
        self._order = [name for name in order if name not in carried]

    @property
    def drawn_in_pass(self) -> int:
        return min(self.taken, len(self._order))

    def draw(self, n: int) -> list[Draw]:
        chosen = self._order[self.taken:self.taken + n]
        passes = [self.pass_number] * len(chosen)
        self.taken += len(chosen)
        if len(chosen) < n:  # the pass ran out: the next one, less what this set already took
            fresh = list(self.names)
            self._rng.shuffle(fresh)
            self.pass_number += 1
            self.carried = list(chosen)
            taken = set(chosen)
            self._order = [name for name in fresh if name not in taken]
            need = n - len(chosen)
            added = self._order[:need]
            chosen += added
            passes += [self.pass_number] * len(added)
            self.taken = need
        out = []
        for slot, (name, pass_number) in enumerate(zip(chosen, passes)):
            entry = self.entries[name]
            out.append(Draw(slot, entry, None, entry.skill or UNKNOWN_SKILL, False, pass_number))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"draw": self.draw_name, "seed": self.seed, "pass": self.pass_number, "taken": self.taken,
                "carried": list(self.carried)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [name for name in state["carried"] if name not in self.entries]
        if missing:
            raise ValueError(f"the pool has no environment {missing[0]!r} any more, which the checkpoint drew")
        self.pass_number = int(state["pass"])
        self.taken = int(state["taken"])
        self.carried = list(state["carried"])
        self._rebuild()


class PoolSampler:
    """Draws sets from a pool without replacement, pass after pass, skills balanced by slot (the
    ``draw: balanced`` variant; see the module docstring).

    Deterministic given ``seed`` and the state (``pass_number`` and the names drawn in that pass):
    the order of pass ``p`` is the sorted names shuffled by ``Random(derive_seed(seed, "pool", p))``.
    """

    def __init__(self, entries: list[PoolEntry], seed: int):
        if not entries:
            raise ValueError("the pool is empty")
        self.entries = entries
        self.seed = seed
        self.has_skills = any(e.skill is not None for e in entries)
        self.pass_number = 0
        self.drawn: list[str] = []
        self._order_cache: tuple[int, list[PoolEntry]] | None = None

    def order(self, pass_number: int) -> list[PoolEntry]:
        if self._order_cache is None or self._order_cache[0] != pass_number:
            order = list(self.entries)
            random.Random(derive_seed(self.seed, "pool", pass_number)).shuffle(order)
            self._order_cache = (pass_number, order)
        return self._order_cache[1]

    def draw(self, wanted: list[str]) -> list[Draw]:
        """One environment per slot (``wanted[i]``: slot i's skill), all distinct; fewer than
        ``len(wanted)`` only when the pool itself is smaller."""
        drawn = set(self.drawn)
        chosen: set[str] = set()
        out: list[Draw] = []
        for slot, skill in enumerate(wanted):
            pick = self._pick(skill, drawn, chosen)
            if pick is None:  # this pass is used up: the next one starts
                self.pass_number += 1
                self.drawn, drawn = [], set()
                pick = self._pick(skill, drawn, chosen)
                if pick is None:
                    break
            entry, fallback = pick
            chosen.add(entry.name)
            drawn.add(entry.name)
            self.drawn.append(entry.name)
            label = entry.skill if entry.skill is not None else skill
            out.append(Draw(slot, entry, skill, label, fallback, self.pass_number))
        return out

    def _pick(self, skill: str, drawn: set[str], chosen: set[str]) -> tuple[PoolEntry, bool] | None:
        free = [e for e in self.order(self.pass_number) if e.name not in drawn and e.name not in chosen]
        if not free:
            return None
        if not self.has_skills:
            return free[0], False
        for entry in free:
            if entry.skill == skill:
                return entry, False
        return free[0], True

    draw_name = "balanced"

    @property
    def drawn_in_pass(self) -> int:
        return len(self.drawn)

    def state_dict(self) -> dict[str, Any]:
        return {"draw": self.draw_name, "seed": self.seed, "pass": self.pass_number, "drawn": list(self.drawn)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = {e.name for e in self.entries}
        missing = [name for name in state["drawn"] if name not in names]
        if missing:
            raise ValueError(f"the pool has no environment {missing[0]!r} any more, which the checkpoint drew")
        self.pass_number = int(state["pass"])
        self.drawn = list(state["drawn"])


# ---------------------------------------------------------------------------- the source


def pool_load_sandbox(settings: SelfPlaySettings, sandbox: Sandbox) -> Sandbox:
    """Where pool games are admitted and played (every rollout shard builds the same view)."""
    return ReleasedLoaderSandbox(sandbox) if settings.pool.released_loader_names else sandbox


class ReleasedLoaderSandbox:
    """A sandbox whose every ``open`` asks the sandboxed child to bind the released loader's
    standard-library names in the game's module before running it (the ``released_loader_names``
    field of the load request; the names are :mod:`spade.envs.sandbox.runtime.loader_names`'s fixed
    table, filtered by the sandbox's import allow-list). Admission's load stage and the plays both
    open through it, so a pool game is admitted and played under the same names."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def open(self, source: str, *, max_turns: int | None = None) -> Any:
        return await self.inner.open(source, max_turns=max_turns, released_loader_names=True)


class FixedPool:
    """An :class:`~spade.selfplay.sources.env_source.EnvSource` over a pool directory (module docstring)."""

    def __init__(self, settings: SelfPlaySettings, *, sandbox: Sandbox, run_dir: Path, seed: int,
                 screen: Screen | None = None):
        assert settings.fixed_env_dir is not None
        self.settings = settings
        self.sandbox = sandbox
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.directory = Path(settings.fixed_env_dir)
        self.screen = screen
        self.entries = read_pool(self.directory) if self.directory.is_dir() else []
        if not self.entries:
            raise ConfigError(missing_pool_message(self.directory))
        self.draw_mode = settings.pool.draw
        pool_seed = seed if settings.pool.seed is None else settings.pool.seed
        self.whole = self.draw_mode == "balanced" and len(self.entries) <= settings.envs_per_set
        self.sampler: ShuffleSampler | PoolSampler = (
            ShuffleSampler(self.entries, pool_seed) if self.draw_mode == "shuffle" else PoolSampler(self.entries, pool_seed))
        # Where pool games are admitted and played: the run's sandbox, or its view that binds the
        # released loader's names in each game's module (selfplay.pool.released_loader_names).
        self.load_sandbox: Sandbox = pool_load_sandbox(settings, sandbox)
        self._verdicts: dict[str, AdmissionVerdict] = {}
        self._draw_metrics: tuple[int, dict[str, float]] | None = None  # (regeneration step, its metrics)
        self._observed: int | None = None

    def draw(self, step: int) -> list[Draw]:
        """The environments of the set of regeneration ``step`` (advances the draw state)."""
        s = self.settings
        if isinstance(self.sampler, ShuffleSampler):
            return self.sampler.draw(s.envs_per_set)
        active = [skill.name for skill in s.skills.active(s.domain, Step(step).regeneration(s.k))]
        if self.whole:
            wanted = slot_skills(active, len(self.entries))
            return [Draw(slot, entry, wanted[slot], entry.skill or wanted[slot], False, 0)
                    for slot, entry in enumerate(self.entries)]
        return self.sampler.draw(slot_skills(active, s.envs_per_set))

    async def next_set(self, step: int) -> RegenerationResult:
        draws = self.draw(step)
        verdicts = await asyncio.gather(*(self._admit(d.entry) for d in draws))
        result = RegenerationResult()
        for d, verdict in zip(draws, verdicts):
            result.attempts += 1
            path = d.entry.path
            record = {"step": step, "slot": d.slot, "attempt": 0, "skill": d.skill, "document": str(path)}
            if verdict is None or not verdict.admitted:
                error = None if verdict is None else verdict.error
                result.rejections.append(write_rejection(
                    self.run_dir, record, ErrorKind.CRASHED if error is None else error.kind,
                    Stage.SERVICE if error is None else error.stage,
                    "sandbox failure" if error is None else error.message, path.read_text()))
                continue
            result.envs.append(EnvSpec(env_id=f"fixed-{d.entry.name}", slot=d.slot, skill=d.skill,
                                       source=verdict.code, hint=d.entry.hint(),
                                       class_name=verdict.class_name or "", max_turns=verdict.max_turns,
                                       generated_step=step, document=str(path), tool_report=tool_report_of(verdict)))
        save_set(self.run_dir, step, result.envs)
        self._write_draw_record(step, draws, verdicts)
        self._draw_metrics = (step, {"pool/fallbacks": float(sum(d.fallback for d in draws)),
                                     "pool/pass": float(self.sampler.pass_number),
                                     "pool/drawn_in_pass": float(self.sampler.drawn_in_pass),
                                     "pool/size": float(len(self.entries))})
        return result

    async def _admit(self, entry: PoolEntry) -> AdmissionVerdict | None:
        cached = self._verdicts.get(entry.name)
        if cached is not None:
            return cached
        s = self.settings
        verdict = await admit_candidate(self.load_sandbox, s, entry.path.read_text(),
                                        screen=self.screen if s.domain == "tool_use" else None)
        if verdict is not None:  # an infrastructure failure is tried again next time
            self._verdicts[entry.name] = verdict
        return verdict

    def _write_draw_record(self, step: int, draws: list[Draw], verdicts: list[AdmissionVerdict | None]) -> None:
        directory = self.run_dir / "pool_draws"
        directory.mkdir(parents=True, exist_ok=True)
        data = {
            "step": step, "pool": str(self.directory), "pool_size": len(self.entries), "whole_pool": self.whole,
            "draw": self.draw_mode, "pass": self.sampler.pass_number, "fallbacks": sum(d.fallback for d in draws),
            "draws": [{"slot": d.slot, "name": d.entry.name, "wanted": d.wanted, "skill": d.skill,
                       "fallback": d.fallback, "pass": d.pass_number,
                       "admitted": bool(v is not None and v.admitted)} for d, v in zip(draws, verdicts)],
        }
        atomic_write_text(directory / f"step_{step:06d}.json", json.dumps(data, indent=1))

    def observe(self, step: int, envs: list[EnvSpec], nohint_returns: dict[str, list[float]]) -> None:
        self._observed = step

    def metrics(self) -> dict[str, float]:
        """At a regeneration step, how its draw went: fallbacks (slots that got another skill than
        they wanted), the pass number, environments drawn in that pass so far, the pool's size."""
        if self._draw_metrics is None or self._draw_metrics[0] != self._observed:
            return {}
        return dict(self._draw_metrics[1])

    def play_sandbox(self) -> Sandbox | None:
        return self.load_sandbox if self.load_sandbox is not self.sandbox else None

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "pool_size": len(self.entries),
                "pool_fingerprint": pool_fingerprint(self.entries), **self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # a checkpoint from before the pool was sampled: nothing drawn yet
            return
        if state.get("pool_fingerprint") != pool_fingerprint(self.entries):
            raise ValueError(f"selfplay.fixed_env_dir: the pool {self.directory} changed since the checkpoint "
                             f"({state.get('pool_size')} environments then, {len(self.entries)} now, or other "
                             "names): resuming would not draw what the interrupted run would have")
        drawn_by = state.get("draw", "balanced")  # version 1 had the balanced draw only
        if drawn_by != self.draw_mode:
            raise ValueError(f"selfplay.pool.draw: the checkpoint drew with {drawn_by!r}, the config says "
                             f"{self.draw_mode!r}: resuming would not draw what the interrupted run would have")
        if "seed" in state and state["seed"] != self.sampler.seed:
            raise ValueError(f"selfplay.pool.seed: the checkpoint drew under seed {state['seed']}, the config "
                             f"gives {self.sampler.seed}: resuming would not draw what the interrupted run would have")
        self.sampler.load_state_dict(state)
