"""State gating (SPEC 6: the share of environments that pay out only after earlier actions changed
hidden state; 43.5% early -> 55.3% late), measured by replay in the real sandbox.

For an environment with won episodes among its kept trajectories (return > 0), take up to
``MAX_REPLAYS`` of them (no-hint arm first). For each: reset a fresh instance with the episode's
seed and submit the episode's final (winning) action as the *first* action. If that step
terminates with a positive reward, the win did not need earlier interaction. The environment is
**state-gated** when none of the replayed winning actions wins as a first action; it is **not
gated** as soon as one does (a won one-turn episode is that already, without a replay).
Environments that were never won, or whose replays all failed in the sandbox, are undetermined
and left out of the share (their count is reported).

Admission checked that a reset with the same seed gives the same first observation, so the
replay starts from the state the episode started from.

Runs whose source has no multi-turn code to replay (``env_source: rlve``, :mod:`.sources`) are
not replayed: their verdict is undetermined with the reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

from ..envs.protocol import EnvFault, InfrastructureFault, episode_return

MAX_REPLAYS = 3
CONCURRENCY = 4


@dataclass
class GatingVerdict:
    gated: bool | None  # None: undetermined
    replays: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"state_gated": self.gated, "gating_replays": self.replays, "gating_reason": self.reason}


def winning_episodes(episodes: Sequence[Any], limit: int = MAX_REPLAYS) -> list[Any]:
    won = [e for e in episodes if e.won and e.turns and e.final_action]
    won.sort(key=lambda e: (e.arm != "nohint", e.step, e.index))
    return won[:limit]


async def first_action_wins(service: Any, source: str, seed: int | None, action: str,
                            max_turns: int | None = None) -> bool:
    env = await service.open(source, max_turns=max_turns)
    try:
        await env.reset(seed=seed)
        result = await env.step(action)
        return episode_return([result.reward], result.terminated) > 0
    finally:
        await env.close()


async def gate_env(service: Any, source: str, episodes: Sequence[Any], max_turns: int | None = None,
                   limit: int = MAX_REPLAYS) -> GatingVerdict:
    won = winning_episodes(episodes, limit)
    if not won:
        return GatingVerdict(None, 0, "never won")
    if any(len(e.turns) == 1 for e in won):
        return GatingVerdict(False, 0, "won in one turn")
    replays = failures = 0
    for episode in won:
        try:
            replays += 1
            if await first_action_wins(service, source, episode.seed, episode.final_action, max_turns):
                return GatingVerdict(False, replays, "the winning action wins as the first action")
        except (EnvFault, InfrastructureFault, ValueError):
            failures += 1
    if failures == replays:
        return GatingVerdict(None, replays, "every replay failed in the sandbox")
    return GatingVerdict(True, replays, "the winning action does not win as the first action")


async def gate_envs(service: Any, envs: Sequence[Any], concurrency: int = CONCURRENCY) -> dict[str, GatingVerdict]:
    """Verdict per ``EnvRecord.uid``."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(env: Any) -> tuple[str, GatingVerdict]:
        async with semaphore:
            return env.uid, await gate_env(service, env.source, env.episodes, env.max_turns)

    return dict(await asyncio.gather(*(one(env) for env in envs)))


def run_gating(envs: Sequence[Any], sandbox_config: Any = None) -> dict[str, GatingVerdict]:
    """Start a sandbox service, replay, stop it. Raises SandboxUnavailable when it cannot start."""
    from ..envs.sandbox.client import SandboxService

    from .sources import applies, not_applicable

    source = {e.uid: getattr(e, "env_source", "designer") for e in envs}
    skipped = {uid: GatingVerdict(None, 0, not_applicable(kind)["state_gating"])
               for uid, kind in source.items() if not applies("state_gating", kind)}
    needed = [e for e in envs if e.uid not in skipped and winning_episodes(e.episodes)]

    async def main() -> dict[str, GatingVerdict]:
        if not needed:
            return {}
        async with await SandboxService.start(sandbox_config) as service:
            return await gate_envs(service, needed)

    verdicts = {**asyncio.run(main()), **skipped}
    for env in envs:
        verdicts.setdefault(env.uid, GatingVerdict(None, 0, "never won"))
    return verdicts

