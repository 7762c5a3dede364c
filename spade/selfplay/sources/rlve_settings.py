"""The Fixed-env RLVE baseline's numbers (``selfplay.rlve``), defaults = RLVE's released settings.

RLVE (arXiv 2511.07317) keeps one difficulty per environment, an integer that starts at
``initial_difficulty``. A problem of an environment at difficulty ``d`` is drawn from one of the
``difficulty_window`` levels ``d - window + 1 .. d`` (uniformly; the released "difficulty step"
4), each level being the parameters that environment's parameter controller gives after that many
``update()`` calls. Only plays of problems at the environment's current difficulty count toward
its accuracy; once ``accuracy_samples`` of them have been counted (released: 128 = 8 problems x 16
samples), the difficulty goes up by one if their accuracy is at least ``accuracy_threshold``
(0.9), and the count starts again either way. A play is accurate when its return reaches the
problem's ``passing_reward_threshold`` (1.0 in all but four of rlve-gym's 400 environments).

Which environments (``environments``): a named set or a list of rlve-gym identifiers.
``official16`` (the default) is the set the paper's released baseline launcher
(``cmd/games/train_fixed_rlve_*.sh``, ``RLVE_ENV_SET=official16``) trains on: the 16 environments of
RLVE's own 16-environment runs (its ``scripts/training/*/rlve/num-environment=16.sh``). rlve-gym
0.0.1 ships no such list, so it is written out here (:data:`OFFICIAL16`). ``all`` is every one
of rlve-gym's 400 (the launcher's ``RLVE_ENV_SET=all``); ``null``, which meant all of them before
issue 20 (an older run's config snapshot has it), is read as ``all``.

The return of a play (``reward``): ``verifier`` (default) is the problem's verifier reward in
[-1, 1] (partial credit, -1 for no answer), RLVE's own training reward; ``accuracy`` is 1 when
that reward reaches the passing threshold, else 0, which is what the paper's released adapter
(``spade/core/envs/rlve_adapter.py``) trained its baseline on. Either way a reply cut at its token
limit is verified as it stands (:mod:`spade.envs.rlve.sandbox`).

The rest are this project's: how many worker processes run rlve-gym (it reseeds the global random
generators, so it never runs in the trainer), and how long they may take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...config import require

_WHERE = "selfplay.rlve"

# RLVE's 16-environment set, in the order of its scripts and of the released launcher
OFFICIAL16: tuple[str, ...] = (
    "Division", "EuclidGame", "GCDOne_Counting", "HamiltonianPath", "LampChanging", "LargestConvexPolygon",
    "Multiplication", "PCPPermutation", "Path_NoGoingBack_Counting", "SAT", "ShortestPath", "Sorting",
    "SpiralMatrix", "SubsequenceReversalLNDS", "UndamagedSubmatrixCounting", "WYRLevelingGround",
)
EnvironmentSetName = Literal["official16", "all"]
ENVIRONMENT_SETS: tuple[str, ...] = ("official16", "all")


@dataclass(frozen=True)
class RLVESettings:
    """``selfplay.rlve``: RLVE's adaptive difficulty and its worker processes."""

    # a named set ("official16": the released baseline's 16, "all": rlve-gym's 400) or a list of
    # rlve-gym environment identifiers
    environments: EnvironmentSetName | tuple[str, ...] | None = "official16"
    # a play's return: the verifier's reward in [-1, 1] (RLVE's), or its 0/1 accuracy (the paper's
    # released adapter; see the module docstring)
    reward: Literal["verifier", "accuracy"] = "verifier"
    initial_difficulty: int = 0
    difficulty_window: int = 4         # levels a problem is drawn from, ending at the current one
    accuracy_samples: int = 128        # plays at the current level counted before each check
    accuracy_threshold: float = 0.9    # raise the level when the counted accuracy is at least this
    max_generation_attempts: int = 16  # problems drawn for a slot until one generates (else it stays empty)
    workers: int = 4                   # rlve-gym processes
    generation_timeout_s: float = 10.0  # rlve-gym's own timeout for generating one problem
    request_timeout_s: float = 60.0    # one answer from a worker (generation or verification)
    startup_timeout_s: float = 120.0   # a worker importing rlve-gym
    cache_size: int = 256              # generated problems each worker keeps

    def environment_names(self, known: list[str]) -> list[str]:
        """The configured environments, given every identifier rlve-gym has (``known``)."""
        if self.environments == "all":
            return list(known)
        if self.environments == "official16":
            return list(OFFICIAL16)
        return list(self.environments)

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{_WHERE}.{name}"

        if self.environments is None:  # before issue 20 null meant all of them
            object.__setattr__(self, "environments", "all")
        if isinstance(self.environments, str):
            require(self.environments in ENVIRONMENT_SETS, key("environments"),
                    f"{self.environments!r} is not allowed; choose one of: {', '.join(ENVIRONMENT_SETS)}, "
                    "or a list of rlve-gym environment identifiers")
        else:
            require(len(self.environments) > 0 and all(isinstance(e, str) and e for e in self.environments),
                    key("environments"), "must be a non-empty list of rlve-gym environment identifiers, "
                    f"or one of: {', '.join(ENVIRONMENT_SETS)}")
            require(len(set(self.environments)) == len(self.environments), key("environments"),
                    "lists an environment twice")
        require(self.reward in ("verifier", "accuracy"), key("reward"),
                f"{self.reward!r} is not allowed; choose one of: verifier, accuracy")
        for name, low in (("initial_difficulty", 0), ("difficulty_window", 1), ("accuracy_samples", 1),
                          ("max_generation_attempts", 1), ("workers", 1), ("cache_size", 1)):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= low, key(name),
                    f"must be an integer >= {low}, got {value!r}")
        require(0.0 < self.accuracy_threshold <= 1.0, key("accuracy_threshold"),
                f"must be in (0, 1], got {self.accuracy_threshold}")
        for name in ("generation_timeout_s", "request_timeout_s", "startup_timeout_s"):
            value = getattr(self, name)
            require(value > 0, key(name), f"must be > 0, got {value}")
        require(self.request_timeout_s > self.generation_timeout_s, key("request_timeout_s"),
                f"must exceed generation_timeout_s ({self.generation_timeout_s}), which the worker spends "
                f"at most on one generation, got {self.request_timeout_s}")
