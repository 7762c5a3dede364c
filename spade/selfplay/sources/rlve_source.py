"""The Fixed-env RLVE baseline's source (``selfplay.env_source: rlve``): rlve-gym's procedural
problems at a difficulty that adapts to the agent, per environment (:mod:`.rlve_settings`).

At each regeneration the slots get their environments from ``selfplay.rlve.environments`` (the
released baseline's ``official16`` by default) as the released sliding-window controller chooses
them: every environment of the set once when the set has no more environments than slots (16
and 16 in the released runs; with fewer environments than slots they go round again), else a
sample without replacement (:func:`slot_environments`). Each slot then gets one problem: a level
of its environment's difficulty window, a parameter of that level and a problem seed, all from
seeds derived from ``(seed, step, slot, attempt)``; the problem is generated in a worker process
(:mod:`spade.envs.rlve`). A problem that fails to generate is recorded as a rejection and the
slot draws again for the same environment (as the released adapter does), up to
``max_generation_attempts`` times. Each problem is one :class:`EnvSpec` (skill = the rlve-gym
environment identifier, no hint), played ``g_nohint`` times: one problem per GRPO group.

:meth:`RLVESource.observe` hears every step's no-hint returns and runs RLVE's difficulty rule
(:class:`DifficultyController`). Its state (each environment's difficulty and its running count)
is the source's ``state_dict``; every random draw is derived from the seed, so a resumed run
continues the same schedule.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config import ConfigError
from ...envs.protocol import ErrorKind, Stage
from ...envs.rlve import ProblemSpec, RLVESandbox, RLVEWorkers, WorkerDied, WorkerTimeout, prompt_digest
from .designer_source import EnvSpec, RegenerationResult, save_set, write_rejection
from .rlve_settings import RLVESettings
from ..seeds import derive_seed
from ..settings import SelfPlaySettings

STATE_VERSION = 1
# rlve-gym's verifier calls a reward accurate when it is within this of the passing threshold
ACCURACY_TOLERANCE = 1e-6


def slot_environments(environments: list[str], n_slots: int, rng: random.Random) -> list[str]:
    """The environment of each slot of one set: all of them, in order, when they do not outnumber
    the slots (round again for the slots left), else ``n_slots`` of them without replacement."""
    if len(environments) <= n_slots:
        return [environments[i % len(environments)] for i in range(n_slots)]
    return rng.sample(environments, n_slots)


def accurate(episode_return: float, threshold: float) -> bool:
    """Whether a play's return counts as solved (rlve-gym's ``accuracy`` of that reward)."""
    return episode_return >= threshold - ACCURACY_TOLERANCE


@dataclass
class Tally:
    """Plays of an environment at its current difficulty since the last check."""

    samples: int = 0
    correct: int = 0


@dataclass
class DifficultyController:
    """RLVE's adaptive difficulty, one integer per environment (see :mod:`.rlve_settings`)."""

    settings: RLVESettings
    difficulty: dict[str, int] = field(default_factory=dict)
    tallies: dict[str, Tally] = field(default_factory=dict)

    def level(self, environment: str) -> int:
        return self.difficulty.get(environment, self.settings.initial_difficulty)

    def record(self, environment: str, problem_difficulty: int, accuracies: list[bool]) -> None:
        """Count plays of a problem; plays below the environment's current level do not count."""
        if problem_difficulty < self.level(environment) or not accuracies:
            return
        tally = self.tallies.setdefault(environment, Tally())
        tally.samples += len(accuracies)
        tally.correct += sum(accuracies)

    def check(self) -> dict[str, float]:
        """After a batch of :meth:`record` calls: every environment with enough counted plays is
        checked once (raised by one when accurate enough) and its count restarts. Returns the
        accuracy of each environment checked."""
        checked = {}
        for environment in sorted(self.tallies):
            tally = self.tallies[environment]
            if tally.samples < self.settings.accuracy_samples:
                continue
            accuracy = tally.correct / tally.samples
            checked[environment] = accuracy
            if accuracy >= self.settings.accuracy_threshold:
                self.difficulty[environment] = self.level(environment) + 1
            del self.tallies[environment]
        return checked

    def state_dict(self) -> dict[str, Any]:
        return {"difficulty": dict(sorted(self.difficulty.items())),
                "tallies": {env: [t.samples, t.correct] for env, t in sorted(self.tallies.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.difficulty = {str(env): int(level) for env, level in state.get("difficulty", {}).items()}
        self.tallies = {str(env): Tally(int(n), int(c)) for env, (n, c) in state.get("tallies", {}).items()}


class RLVESource:
    """An :class:`~spade.selfplay.sources.env_source.EnvSource` over rlve-gym (see the module docstring)."""

    def __init__(self, settings: SelfPlaySettings, *, run_dir: Path, seed: int, workers: RLVEWorkers | None = None):
        """``workers``: processes to share (closed by their owner); by default the source starts
        ``selfplay.rlve.workers`` of its own, logging to ``RUN/logs/``, and :meth:`close` stops them."""
        self.settings = settings
        self.config = settings.rlve
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.controller = DifficultyController(self.config)
        self.last_metrics: dict[str, float] = {}
        self.owns_workers = workers is None
        if workers is None:
            workers = RLVEWorkers(self.config.workers, cache_size=self.config.cache_size,
                                  startup_timeout_s=self.config.startup_timeout_s, log_dir=self.run_dir / "logs")
        self.workers = workers
        self.sandbox = RLVESandbox(self.workers, generation_timeout_s=self.config.generation_timeout_s,
                                   request_timeout_s=self.config.request_timeout_s, reward=self.config.reward)
        self.environments: list[str] | None = None

    # ------------------------------------------------------------------ the set

    async def environment_list(self) -> list[str]:
        """The configured environments, checked against rlve-gym's (asked once, of worker 0)."""
        if self.environments is None:
            answer = await self._ask(0, {"op": "list"}, self.config.startup_timeout_s)
            known = list(answer["environments"])
            wanted = self.config.environment_names(known)
            unknown = [name for name in wanted if name not in set(known)]
            if unknown:
                raise ConfigError(f"selfplay.rlve.environments: rlve-gym has no environment {unknown[0]!r}"
                                  f"{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''}; "
                                  f"it has {len(known)}, e.g. {', '.join(known[:5])}; 'all' means all of them")
            self.environments = wanted
        return self.environments

    async def next_set(self, step: int) -> RegenerationResult:
        environments = await self.environment_list()
        result = RegenerationResult()
        chosen = slot_environments(environments, self.settings.envs_per_set,
                                   random.Random(derive_seed(self.seed, "rlve-set", step)))
        slots = await asyncio.gather(*(self._fill_slot(step, slot, environment, result)
                                       for slot, environment in enumerate(chosen)))
        result.envs = [env for env in slots if env is not None]
        save_set(self.run_dir, step, result.envs)
        return result

    async def _fill_slot(self, step: int, slot: int, environment: str,
                         result: RegenerationResult) -> EnvSpec | None:
        for attempt in range(self.config.max_generation_attempts):
            result.attempts += 1
            rng = random.Random(derive_seed(self.seed, "rlve", step, slot, attempt))
            problem_seed = derive_seed(self.seed, "rlve-problem", step, slot, attempt)
            request = {"op": "sample", "environment": environment, "max_difficulty": self.controller.level(environment),
                       "window": self.config.difficulty_window, "choice_seed": rng.getrandbits(31),
                       "problem_seed": problem_seed, "timeout_s": self.config.generation_timeout_s}
            record = {"step": step, "slot": slot, "attempt": attempt, "skill": environment, "document": None}
            try:
                answer = await self._ask(problem_seed, request, self.config.request_timeout_s)
            except (WorkerTimeout, WorkerDied) as exc:  # a generator that hangs or crashes its worker
                kind = ErrorKind.TIMEOUT if isinstance(exc, WorkerTimeout) else ErrorKind.CRASHED
                result.rejections.append(write_rejection(self.run_dir, record, kind, Stage.LOAD, str(exc), ""))
                continue
            if not answer.get("ok"):
                result.rejections.append(write_rejection(self.run_dir, record, ErrorKind.INIT_ERROR, Stage.LOAD,
                                                         str(answer.get("error")), ""))
                continue
            spec = ProblemSpec(environment=environment, seed=problem_seed, parameter=answer["parameter"],
                               difficulty=int(answer["difficulty"]), threshold=float(answer["threshold"]),
                               prompt_sha256=prompt_digest(answer["prompt"]))
            return EnvSpec(env_id=f"rlve-{step:06d}-{slot:02d}-{environment}", slot=slot, skill=environment,
                           source=spec.to_source(), hint="", class_name=environment, max_turns=1,
                           generated_step=step, document=None, attempts=attempt + 1)
        return None

    async def _ask(self, key: int, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """A worker request whose worker died is retried once on a fresh process."""
        try:
            return await self.workers.call(key, message, timeout_s)
        except WorkerDied:
            return await self.workers.call(key, message, timeout_s)

    # ------------------------------------------------------------------ the controller

    def observe(self, step: int, envs: list[EnvSpec], nohint_returns: dict[str, list[float]]) -> None:
        for env in envs:
            spec = ProblemSpec.from_source(env.source)
            accuracies = [accurate(r, spec.threshold) for r in nohint_returns.get(env.env_id, [])]
            self.controller.record(spec.environment, spec.difficulty, accuracies)
        before = dict(self.controller.difficulty)
        checked = self.controller.check()
        raised = sum(1 for env in checked if self.controller.level(env) > before.get(env, self.config.initial_difficulty))
        levels = list(self.controller.difficulty.values())
        problem_levels = [ProblemSpec.from_source(env.source).difficulty for env in envs]
        self.last_metrics = {
            "rlve/checked": float(len(checked)),
            "rlve/raised": float(raised),
            "rlve/envs_raised_total": float(sum(1 for level in levels if level > self.config.initial_difficulty)),
            "rlve/difficulty_max": float(max(levels, default=self.config.initial_difficulty)),
        }
        if problem_levels:
            self.last_metrics["rlve/problem_difficulty_mean"] = sum(problem_levels) / len(problem_levels)
            self.last_metrics["rlve/problem_difficulty_min"] = float(min(problem_levels))
            self.last_metrics["rlve/problem_difficulty_max"] = float(max(problem_levels))

    def metrics(self) -> dict[str, float]:
        """What the last :meth:`observe` found: environments checked and raised, levels reached."""
        return dict(self.last_metrics)

    def play_sandbox(self) -> RLVESandbox:
        return self.sandbox

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **self.controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"rlve source state version {state.get('version')!r}, expected {STATE_VERSION}")
        self.controller.load_state_dict(state)

    async def close(self) -> None:
        """Stop the worker processes (those the source started)."""
        if self.owns_workers:
            await self.sandbox.close()
