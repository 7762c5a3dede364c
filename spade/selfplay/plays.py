"""Playing the environment set (SPEC 1.2): no-hint plays every step, hinted plays at regeneration.

Every play opens a fresh sandboxed instance of its environment, runs ``play_episode`` with a new
:class:`EnginePolicy` and closes the instance. Seeds are derived from ``(seed, step, env_id, i)``:
play ``i`` of the hinted and of the no-hint arm reset the environment with the same seed (like for
like), and sample with different seeds. An :class:`InfrastructureFault` (sandbox failure) drops the
attempt and retries the play, up to ``max_play_retries`` times; a play that never gets through is
left out, never scored. Plays run concurrently, at most ``max_concurrent_episodes`` at a time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..envs.protocol import EnvFault, ErrorKind, InfrastructureFault, Sandbox
from ..agent.tool_calls import parser_for_template
from ..envs.runner import EndReason, EpisodeResult, Turn, play_episode, play_tool_episode
from ..rollout.conversation import ChatFormat
from ..rl.samples import Trajectory
from ..rollout.engine import RolloutEngine, SamplingParams
from .designer_source import EnvSpec
from .policy import EnginePolicy
from .seeds import derive_seed
from .settings import SelfPlaySettings
from .trajectories import trajectory_of


@dataclass
class Play:
    """One scored play. ``trajectory`` is the conversation's sequence (None when nothing was generated)."""

    env_id: str
    hinted: bool
    index: int
    episode_return: float
    turns: int
    end_reason: str
    trajectory: Trajectory | None
    seed: int | None = None  # the reset seed
    opening: str = ""  # the first user message, as the agent saw it
    turn_log: tuple[Turn, ...] = ()


async def open_game(sandbox: Sandbox, source: str, budget: int) -> Any:
    """Open a designed game for a play as the released loader does (``SyntheticGameEnv`` with
    ``respect_game_max_turns=True``, ``core/orchestrator.py``): built with its own ``max_turns`` default, which the runner caps
    at the run's ``budget`` (``selfplay.max_turns``, :func:`spade.envs.runner.turn_budget`); a class
    that cannot be built without the argument is built with ``max_turns=budget``."""
    try:
        return await sandbox.open(source)
    except EnvFault as fault:
        if fault.error.kind is not ErrorKind.INIT_ERROR or "max_turns" not in fault.error.message:
            raise
    return await sandbox.open(source, max_turns=budget)


@dataclass
class PlayRequest:
    env: EnvSpec
    hinted: bool
    index: int


class Player:
    def __init__(self, settings: SelfPlaySettings, *, sandbox: Sandbox, engine: RolloutEngine,
                 tokenizer: Any, chat_format: ChatFormat, seed: int, stop_token_ids: tuple[int, ...] = ()):
        self.settings = settings
        self.sandbox = sandbox
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.seed = seed
        self.stop_token_ids = stop_token_ids
        self.infrastructure_failures = 0  # plays dropped after every retry failed (cumulative)
        # tool use: the native tool-call parser of this model family, chosen by its chat template
        self.tool_parser = parser_for_template(getattr(tokenizer, "chat_template", None)) \
            if settings.domain == "tool_use" else None

    def requests(self, envs: list[EnvSpec], *, with_hint: bool) -> list[PlayRequest]:
        s = self.settings
        out = [PlayRequest(env, False, i) for env in envs for i in range(s.g_nohint)]
        if with_hint:
            out += [PlayRequest(env, True, i) for env in envs if env.hint for i in range(s.g_hint)]
        return out

    async def play_all(self, step: int, requests: list[PlayRequest]) -> list[Play]:
        """The scored plays, in the order of ``requests`` (dropped plays left out)."""
        semaphore = asyncio.Semaphore(self.settings.max_concurrent_episodes)

        async def bounded(request: PlayRequest) -> Play | None:
            async with semaphore:
                return await self._play(step, request)

        results = await asyncio.gather(*(bounded(r) for r in requests))
        return [play for play in results if play is not None]

    async def _play(self, step: int, request: PlayRequest) -> Play | None:
        s = self.settings
        env_seed = derive_seed(self.seed, "reset", step, request.env.env_id, request.index)
        arm = "hint" if request.hinted else "nohint"
        sampling = SamplingParams(temperature=s.agent_temperature, top_p=s.top_p, top_k=s.top_k,
                                  max_new_tokens=s.agent_max_tokens, stop_token_ids=self.stop_token_ids,
                                  seed=derive_seed(self.seed, "agent", step, request.env.env_id, arm, request.index))
        for _ in range(s.max_play_retries + 1):
            policy = EnginePolicy(self.engine, self.tokenizer, sampling, max_context_tokens=s.max_context_tokens,
                                  chat_format=self.chat_format)
            try:
                result = await self._episode(request, policy, env_seed)
            except InfrastructureFault:
                continue
            trajectory = None if policy.conversation is None else trajectory_of(
                policy.conversation, logprob_temperature=sampling.logprob_temperature)
            opening = next((m.content for m in result.messages if m.role == "user"), "")
            return Play(request.env.env_id, request.hinted, request.index, result.episode_return, len(result.turns),
                        result.end_reason.value, trajectory, seed=env_seed, opening=opening,
                        turn_log=tuple(result.turns))
        self.infrastructure_failures += 1
        return None

    async def _episode(self, request: PlayRequest, policy: EnginePolicy, env_seed: int) -> EpisodeResult:
        try:
            if self.tool_parser is None and self.settings.env_source == "designer":
                env = await open_game(self.sandbox, request.env.source, self.settings.max_turns)
            else:  # tool use, and the baselines' pools, are built with the run's budget
                env = await self.sandbox.open(request.env.source, max_turns=self.settings.max_turns)
        except InfrastructureFault:
            raise
        except EnvFault as fault:  # an admitted environment that no longer loads: scored as a failed play
            return EpisodeResult(env_seed, [], end_reason=EndReason.ENV_ERROR, error=fault.error)
        hint = request.env.hint if request.hinted else None
        try:
            if self.tool_parser is not None:
                return await play_tool_episode(env, policy, parser=self.tool_parser, seed=env_seed,
                                               max_turns=self.settings.max_turns, hint=hint,
                                               mask_malformed=self.settings.tool_mask_malformed_calls)
            return await play_episode(env, policy, seed=env_seed, max_turns=self.settings.max_turns,
                                      hint=hint)
        finally:
            await env.close()
