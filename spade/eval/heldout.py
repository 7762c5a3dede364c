"""The held-out measure of the learning check (docs/learning.md): the training environments played
on reset seeds that training never uses, by the real episode runner at the agent's sampling settings.

**The split.** Every reset seed a training play uses comes from :func:`spade.selfplay.seeds.derive_seed`
(``reset_seed``, :meth:`Player.fresh_groups`), whose values lie in ``[0, 2**31)``. The held-out seeds
are ``2**31 + offset + i``: above that range, so the two sets are disjoint by construction, whatever
the run's seed, step count or environment names. Play ``i`` of an environment draws its sampling
seed from ``(sample_seed, environment, i)``, so an evaluation before and one after training play
the same problems with the same sampling seeds (a paired comparison).

**The evaluator.** :func:`evaluate_heldout` opens each environment in the sandbox for each seed and
plays one episode with a fresh :class:`~spade.selfplay.plays.policy.EnginePolicy`, as a training no-hint
play does (``selfplay.sampling.agent``: temperature, top-p, top-k, token budget; ``max_turns``, ``max_context_tokens``, ``agent_game_prompt``, ``action_extraction``), at most
``plays.max_concurrent`` at a time. An environment fault scores 0, as in training; a sandbox
failure is retried ``plays.max_retries`` times and then left out (counted in ``dropped``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..envs.protocol import EnvFault, InfrastructureFault, Sandbox
from ..envs.runner import play_episode
from ..rollout.conversation import ChatFormat
from ..rollout.engine import RolloutEngine
from ..selfplay.plays.player import end_of_turn_stop_ids
from ..selfplay.plays.policy import EnginePolicy
from ..selfplay.seeds import derive_seed
from ..selfplay.settings import SelfPlaySettings

# derive_seed's values, and so every training reset seed, lie below this
TRAINING_SEED_LIMIT = 2 ** 31


def is_training_seed(seed: int) -> bool:
    """Whether ``seed`` lies in the range training's reset seeds are drawn from."""
    return 0 <= seed < TRAINING_SEED_LIMIT


@dataclass(frozen=True)
class HeldOutSplit:
    """``episodes_per_env`` held-out reset seeds, the same for every environment."""

    episodes_per_env: int
    offset: int = 0

    def __post_init__(self) -> None:
        if self.episodes_per_env < 1:
            raise ValueError(f"episodes_per_env must be >= 1, got {self.episodes_per_env}")
        if self.offset < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset}")

    def seeds(self) -> tuple[int, ...]:
        start = TRAINING_SEED_LIMIT + self.offset
        return tuple(range(start, start + self.episodes_per_env))

    def holds(self, seed: int) -> bool:
        start = TRAINING_SEED_LIMIT + self.offset
        return start <= seed < start + self.episodes_per_env


@dataclass(frozen=True)
class HeldOutEnv:
    """One environment of the set: its name and source (a pool file)."""

    name: str
    source: str

    @classmethod
    def from_file(cls, path: Path) -> "HeldOutEnv":
        return cls(Path(path).stem, Path(path).read_text())


def pool_envs(directory: Path) -> list[HeldOutEnv]:
    """The environments of a pool directory (``NAME.py`` files), in file-name order."""
    return [HeldOutEnv.from_file(path) for path in sorted(Path(directory).glob("*.py"))]


@dataclass(frozen=True)
class HeldOutEpisode:
    env: str
    seed: int
    episode_return: float
    end_reason: str
    reply: str = ""  # the last reply of the episode (what the model answered)


@dataclass(frozen=True)
class HeldOutResult:
    episodes: tuple[HeldOutEpisode, ...]
    dropped: int = 0

    def returns(self) -> list[float]:
        """Returns in (environment, seed) order, so two results of one split pair up index by index."""
        return [e.episode_return for e in sorted(self.episodes, key=lambda e: (e.env, e.seed))]

    @property
    def mean(self) -> float:
        values = self.returns()
        return sum(values) / len(values) if values else 0.0

    def by_env(self) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for e in self.episodes:
            out.setdefault(e.env, []).append(e.episode_return)
        return {name: sum(v) / len(v) for name, v in sorted(out.items())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HeldOutResult":
        """The inverse of :meth:`to_dict`."""
        return cls(tuple(HeldOutEpisode(str(e[0]), int(e[1]), float(e[2]), str(e[3]), str(e[4]) if len(e) > 4 else "")
                         for e in data["episodes"]), dropped=int(data.get("dropped", 0)))

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "dropped": self.dropped, "by_env": self.by_env(),
                "episodes": [[e.env, e.seed, e.episode_return, e.end_reason, e.reply] for e in self.episodes]}


async def evaluate_heldout(engine: RolloutEngine, tokenizer: Any, settings: SelfPlaySettings,
                           envs: Sequence[HeldOutEnv], split: HeldOutSplit, *, sandbox: Sandbox,
                           sample_seed: int, chat_format: ChatFormat | None = None) -> HeldOutResult:
    """Every environment of ``envs`` played once on every seed of ``split`` (module docstring)."""
    s = settings
    chat_format = chat_format or ChatFormat(tokenizer, None)
    stop_ids = end_of_turn_stop_ids(chat_format, tokenizer)
    semaphore = asyncio.Semaphore(s.plays.max_concurrent)

    async def one(env: HeldOutEnv, index: int, seed: int) -> HeldOutEpisode | None:
        sampling = s.engine_sampling(stop_ids, derive_seed(sample_seed, "heldout", env.name, index))
        async with semaphore:
            for _ in range(s.plays.max_retries + 1):
                policy = EnginePolicy(engine, tokenizer, sampling, max_context_tokens=s.max_context_tokens,
                                      chat_format=chat_format)
                try:
                    instance = await sandbox.open(env.source, max_turns=s.max_turns)
                except InfrastructureFault:
                    continue
                except EnvFault:
                    return HeldOutEpisode(env.name, seed, 0.0, "env_error")
                try:
                    result = await play_episode(instance, policy, seed=seed, max_turns=s.max_turns,
                                                game_prompt=s.agent_game_prompt, action_extraction=s.action_extraction)
                except InfrastructureFault:
                    continue
                finally:
                    await instance.close()
                replies = [m.content for m in result.messages if m.role == "assistant"]
                return HeldOutEpisode(env.name, seed, result.episode_return, result.end_reason.value,
                                      replies[-1] if replies else "")
            return None

    jobs = [one(env, i, seed) for env in envs for i, seed in enumerate(split.seeds())]
    results = await asyncio.gather(*jobs)
    kept = tuple(r for r in results if r is not None)
    return HeldOutResult(kept, dropped=len(results) - len(kept))
