"""Accuracy of an ``env_source: rlve`` run per difficulty level and per rlve-gym environment.

Each saved problem (``RUN/envs/step_S/ENV_ID.py``) is a JSON :class:`~spade.envs.rlve.ProblemSpec`:
its rlve-gym environment identifier, the level it was drawn at and the reward that counts as
solved. A play is *accurate* by RLVE's own rule (:func:`spade.selfplay.sources.rlve_source.accurate`:
return at least the problem's threshold), the rule the difficulty controller counts. From the
no-hint returns of every step (``env_returns`` lines):

* ``by_level``: per (step, level): problems played, plays, accurate plays, accuracy, mean return;
  the curve of accuracy by level over steps;
* ``by_environment``: per environment identifier over the whole run: problems, plays, accuracy,
  the levels its problems were drawn at, and its accuracy per level;
* ``controller``: per step, what the controller did (``rlve/*`` keys of ``metrics.jsonl``:
  environments checked and raised, environments above the initial level, highest level, mean
  problem level).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..envs.protocol import EnvFault
from ..envs.rlve import ProblemSpec
from ..selfplay.sources.rlve_source import accurate

CONTROLLER_KEYS = ("checked", "raised", "envs_raised_total", "difficulty_max", "problem_difficulty_mean")


def problem_of(source: str) -> ProblemSpec | None:
    """The spec of a saved rlve problem; None for anything else (a Python environment)."""
    try:
        return ProblemSpec.from_source(source)
    except EnvFault:
        return None


@dataclass
class Tally:
    problems: int = 0
    plays: int = 0
    accurate: int = 0
    return_sum: float = 0.0

    def add(self, returns: list[float], threshold: float) -> None:
        self.problems += 1
        self.plays += len(returns)
        self.accurate += sum(1 for r in returns if accurate(r, threshold))
        self.return_sum += sum(returns)

    def to_json(self) -> dict[str, Any]:
        return {"problems": self.problems, "plays": self.plays, "accurate": self.accurate,
                "accuracy": self.accurate / self.plays if self.plays else None,
                "return_mean": self.return_sum / self.plays if self.plays else None}


def accuracy(returns: list[float], threshold: float) -> float | None:
    return sum(1 for r in returns if accurate(r, threshold)) / len(returns) if returns else None


def rlve_summary(envs: Iterable[Any], metrics: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``envs``: ``run_reader.EnvRecord`` of one run; ``metrics``: its metrics rows."""
    by_level: dict[tuple[int, int], Tally] = {}
    by_env: dict[str, Tally] = {}
    by_env_level: dict[tuple[str, int], Tally] = {}
    problems: dict[tuple[str, int | None], set[str]] = {}  # distinct problems (a problem plays k steps)
    for env in envs:
        spec = problem_of(env.source)
        if spec is None:
            continue
        by_env.setdefault(spec.environment, Tally())
        for key in ((spec.environment, None), (spec.environment, spec.difficulty)):
            problems.setdefault(key, set()).add(env.uid)
        for step, returns in sorted(env.nohint_returns.items()):
            if not returns:
                continue
            by_level.setdefault((step, spec.difficulty), Tally()).add(returns, spec.threshold)
            by_env[spec.environment].add(returns, spec.threshold)
            by_env_level.setdefault((spec.environment, spec.difficulty), Tally()).add(returns, spec.threshold)
    environments = []
    for name in sorted(by_env):
        levels = sorted(level for env, level in by_env_level if env == name)
        environments.append({"environment": name, **by_env[name].to_json(), "problems": len(problems[(name, None)]),
                             "levels": levels,
                             "by_level": {str(level): {**by_env_level[(name, level)].to_json(),
                                                       "problems": len(problems[(name, level)])}
                                          for level in levels}})
    controller = []
    for row in metrics:
        values = {key: row.get(f"rlve/{key}") for key in CONTROLLER_KEYS}
        if any(v is not None for v in values.values()):
            controller.append({"step": row["step"], **values})
    return {"by_level": [{"step": step, "level": level, **tally.to_json()}
                         for (step, level), tally in sorted(by_level.items())],
            "by_environment": environments, "controller": controller,
            "levels": sorted({level for _, level in by_level}),
            "distinct_environments": len(by_env)}
