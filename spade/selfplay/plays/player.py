"""Playing the environment set (SPEC 1.2): no-hint plays every step, hinted plays at regeneration.

Every play opens a fresh sandboxed instance of its environment, runs ``play_episode`` with a new
:class:`EnginePolicy` and closes the instance. Seeds are derived from ``(seed, step, env_id, i)``:
play ``i`` of the hinted and of the no-hint arm reset the environment with the same seed (like for
like), and sample with different seeds; ``selfplay.plays.reset_seeds: independent`` gives the hinted
arm its own reset seeds (:func:`spade.selfplay.seeds.reset_seed`). An :class:`InfrastructureFault` (sandbox failure)
drops the attempt and retries the play, up to ``plays.max_retries`` times; a play that never gets
through is left out, never scored. Plays run concurrently, at most ``plays.max_concurrent`` at a time.

An environment that raises or times out during a play (load, reset, step) ends the play with
return 0 (``selfplay.plays.env_faults: score_zero``). With ``retry_then_drop`` (the released code,
:mod:`.play_rules`) a no-hint play that raised is played once more and then dropped, a timed-out
play is dropped and its environment marked hung (:attr:`Player.hung_envs`): its plays not yet
started are skipped, and :meth:`Player.requests` leaves it out until the set is replaced. The first
play of each environment and arm then runs before the others (the released canary), so one hung
environment costs one timed-out play, not a group of them.

Partial rollouts (:meth:`Player.play_groups`): no-hint groups, fresh or carried from earlier steps
(:mod:`.carried_plays`), play until enough groups are complete; then the rest stop at their next
policy call (an in-flight request is cancelled) and are handed back with their exact state.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ...envs.protocol import EnvFault, ErrorKind, InfrastructureFault, Sandbox
from ...agent.tool_calls import parser_for_template
from ...envs.runner import EndReason, EpisodeResult, ReplayDiverged, play_episode, play_tool_episode
from ...rollout.conversation import ChatFormat
from ...rollout.engine import RolloutEngine, SamplingParams
from .play_record import Play
from .carried_plays import CarriedGroup, CarriedPlay, CarryOver, conversation_state, restore_conversation
from ..sources.designer_source import EnvSpec
from .policy import EnginePolicy
from .play_bounds import PlayTimedOut, bounded_play, turn_bound
from .play_rules import RELEASED_FAULT_RETRIES
from .released_policy import released_hint_policy, scoped_mask_policy
from ..sources.role_thinking import role_chat_format
from .turn_samples import PerTurnPolicy, play_trajectories
from ..seeds import derive_seed, reset_seed
from ..settings import SelfPlaySettings
from ...rl.samples import Trajectory


def _timed_out(result: EpisodeResult) -> bool:
    """Whether the environment's load, reset or step ran past its sandbox timeout in this episode."""
    return result.end_reason is EndReason.ENV_ERROR and result.error is not None \
        and result.error.kind is ErrorKind.TIMEOUT


def _turn_samples(policy: EnginePolicy, trajectories: tuple[Trajectory, ...]) -> tuple[Trajectory, ...]:
    """The play's turn samples in the per-turn form (``Play.turn_samples``), else none."""
    return trajectories if isinstance(policy, PerTurnPolicy) else ()


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


def end_of_turn_stop_ids(chat_format: ChatFormat, tokenizer: Any) -> tuple[int, ...]:
    """The template's end-of-turn token as a stop token, when it is a special token."""
    first = chat_format.closing[0]
    return (first,) if first in set(getattr(tokenizer, "all_special_ids", ())) else ()


@dataclass
class PlayRequest:
    env: EnvSpec
    hinted: bool
    index: int


@dataclass
class GroupsOutcome:
    """What :meth:`Player.play_groups` hands back: the groups whose every play ended (their plays all
    in ``finished``), the groups to carry into the next step, and the plays dropped as aborted."""

    complete: list[CarriedGroup] = field(default_factory=list)
    carried: list[CarriedGroup] = field(default_factory=list)
    aborted: int = 0

    @property
    def carried_plays(self) -> int:
        return sum(len(group.unfinished) for group in self.carried)


class _Aborted(Exception):
    """A carried play whose environment did not replay as recorded."""


class Player:
    def __init__(self, settings: SelfPlaySettings, *, sandbox: Sandbox, engine: RolloutEngine,
                 tokenizer: Any, chat_format: ChatFormat, seed: int, stop_token_ids: tuple[int, ...] = ()):
        self.settings = settings
        self.sandbox = sandbox
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        # the hinted arm's prompts: selfplay.sampling.agent.hinted_thinking (the released games runs: off)
        self.hint_arm_format = chat_format if chat_format is None else role_chat_format(
            tokenizer, chat_format, settings.sampling.agent.hinted_thinking, "selfplay.sampling.agent.hinted_thinking")
        self.seed = seed
        self.stop_token_ids = stop_token_ids
        self.infrastructure_failures = 0  # plays dropped after every retry failed (cumulative)
        # env_faults retry_then_drop: plays dropped for an environment fault, and environments that
        # timed out (left out until the set is replaced; env ids are unique across sets)
        self.fault_drops = 0
        self.hung_envs: set[str] = set()
        # environments whose load, reset or step timed out in a play of either arm, whatever
        # env_faults says (env ids are unique across sets): selfplay.rewards.step_timeout_penalty
        self.timed_out_envs: set[str] = set()
        self.play_timeouts = 0  # no-hint plays dropped for running past plays.nohint_play_timeout_s
        # the games' hinted arm sees the engine with each reply bounded (plays.hint_turn_timeout_s)
        self.hint_engine = turn_bound(engine, settings.plays.hint_turn_timeout_s)
        # tool use: the native tool-call parser of this model family, chosen by its chat template
        self.tool_parser = parser_for_template(getattr(tokenizer, "chat_template", None)) \
            if settings.domain == "tool_use" else None

    def step_metrics(self) -> dict[str, float]:
        """Figures of the plays since the last call beyond their records (none for one process)."""
        return {}

    def requests(self, envs: list[EnvSpec], *, with_hint: bool) -> list[PlayRequest]:
        s = self.settings
        envs = [env for env in envs if env.env_id not in self.hung_envs]
        out = [PlayRequest(env, False, i) for env in envs for i in range(s.nohint_plays(len(envs)))]
        if with_hint:
            out += [PlayRequest(env, True, i) for env in envs if env.hint for i in range(s.g_hint)]
        return out

    async def play_all(self, step: int, requests: list[PlayRequest]) -> list[Play]:
        """The scored plays, in the order of ``requests`` (dropped plays left out)."""
        semaphore = asyncio.Semaphore(self.settings.plays.max_concurrent)
        canary = self.settings.plays.drops_faults  # the released canary: play 0 of a group first
        first_done = {(r.env.env_id, r.hinted): asyncio.Event() for r in requests}

        async def bounded(request: PlayRequest) -> Play | None:
            gate = first_done[(request.env.env_id, request.hinted)]
            if canary and request.index != 0 and any(r.index == 0 and r.env is request.env and r.hinted == request.hinted
                                                      for r in requests):
                await gate.wait()
            try:
                async with semaphore:
                    if request.env.env_id in self.hung_envs:
                        return None  # a hung environment's plays not yet started are left out
                    return await self._play(step, request)
            finally:
                if request.index == 0:
                    gate.set()

        results = await asyncio.gather(*(bounded(r) for r in requests))
        return [play for play in results if play is not None]

    def fresh_groups(self, step: int, envs: list[EnvSpec]) -> list[CarriedGroup]:
        """This step's no-hint groups, not started (their reset seeds as :meth:`_play` derives them)."""
        return [CarriedGroup(env, step, 0, [], [CarriedPlay(i, derive_seed(self.seed, "reset", step, env.env_id, i))
                                               for i in range(self.settings.nohint_plays(len(envs)))]) for env in envs]

    async def play_groups(self, groups: list[CarriedGroup], *, stop_after: int | None) -> GroupsOutcome:
        """Play every unfinished no-hint play of ``groups``; once ``stop_after`` groups are complete
        (None: never) the others stop and are carried, unless carried ``max_carry_steps`` times
        already: then they are dropped as aborted, like a group whose replay diverged."""
        s = self.settings
        semaphore = asyncio.Semaphore(s.plays.max_concurrent)
        stop = asyncio.Event()
        remaining = [len(group.unfinished) for group in groups]
        complete = [0]

        def resolved(g: int) -> None:
            remaining[g] -= 1
            if remaining[g] == 0:
                complete[0] += 1
                if stop_after is not None and complete[0] >= stop_after:
                    stop.set()

        async def bounded(g: int, play: CarriedPlay) -> Play | CarriedPlay | _Aborted | None:
            async with semaphore:
                if stop.is_set():
                    return play
                try:
                    result = await self._continue(groups[g], play, stop)
                except ReplayDiverged as diverged:
                    return _Aborted(str(diverged))
                if not isinstance(result, CarriedPlay):
                    resolved(g)  # before the next play is admitted: it must see a stop this sets
                return result

        if stop_after is not None and stop_after <= sum(1 for r in remaining if r == 0):
            stop.set()
        jobs = [(g, play) for g, group in enumerate(groups) for play in group.unfinished]
        results = await asyncio.gather(*(bounded(g, play) for g, play in jobs))
        by_group: dict[int, list[Any]] = {g: [] for g in range(len(groups))}
        for (g, _), result in zip(jobs, results):
            by_group[g].append(result)
        outcome = GroupsOutcome()
        for g, group in enumerate(groups):
            results_g = by_group[g]
            if any(isinstance(r, _Aborted) for r in results_g):
                outcome.aborted += group.size
                continue
            finished = group.finished + [r for r in results_g if isinstance(r, Play)]
            unfinished = [r for r in results_g if isinstance(r, CarriedPlay)]
            if not unfinished:
                finished.sort(key=lambda play: play.index)
                outcome.complete.append(CarriedGroup(group.env, group.origin_step, group.carries, finished, []))
            elif group.carries + 1 > s.partial_rollouts.max_carry_steps:
                outcome.aborted += group.size
            else:
                outcome.carried.append(CarriedGroup(group.env, group.origin_step, group.carries + 1, finished,
                                                    unfinished))
        return outcome

    async def _continue(self, group: CarriedGroup, carried: CarriedPlay, stop: asyncio.Event) -> Play | CarriedPlay | None:
        """Play (or go on playing) one no-hint play of ``group``; a stopped play comes back carried."""
        s = self.settings
        sampling = s.engine_sampling(self.stop_token_ids, derive_seed(self.seed, "agent", group.origin_step,
                                                                      group.env.env_id, "nohint", carried.index))
        request = PlayRequest(group.env, False, carried.index)
        for _ in range(s.plays.max_retries + 1):
            policy_class = PerTurnPolicy if s.plays.sample_form == "per_turn" else EnginePolicy
            policy = policy_class(self.engine, self.tokenizer, sampling, max_context_tokens=s.max_context_tokens,
                                  chat_format=self.chat_format, stop=stop)
            if carried.conversation is not None:
                policy.restore(restore_conversation(carried.conversation, self.tokenizer, self.chat_format))
            episode = carried.episode()
            try:
                result = await self._episode(request, policy, carried.env_seed, episode=episode)
            except InfrastructureFault:
                continue
            except CarryOver:
                state = None if policy.conversation is None else conversation_state(policy.conversation)
                return CarriedPlay(carried.index, carried.env_seed, list(episode.messages), list(episode.turns), state)
            if _timed_out(result):
                self.timed_out_envs.add(group.env.env_id)
            trajectories = play_trajectories(policy, logprob_temperature=sampling.logprob_temperature)
            trajectory = trajectories[-1] if trajectories else None
            opening = next((m.content for m in result.messages if m.role == "user"), "")
            return Play(group.env.env_id, False, carried.index, result.episode_return, len(result.turns),
                        result.end_reason.value, trajectory, seed=carried.env_seed, opening=opening,
                        turn_log=tuple(result.turns), turn_samples=_turn_samples(policy, trajectories))
        self.infrastructure_failures += 1
        return None

    async def _play(self, step: int, request: PlayRequest) -> Play | None:
        s = self.settings
        env_seed = reset_seed(self.seed, step, request.env.env_id, request.index, hinted=request.hinted,
                              paired=s.plays.reset_seeds == "paired")
        arm = "hint" if request.hinted else "nohint"
        sampling = s.engine_sampling(self.stop_token_ids,
                                     derive_seed(self.seed, "agent", step, request.env.env_id, arm, request.index))
        faults = infrastructure = 0
        while infrastructure <= s.plays.max_retries:
            policy = self._policy(sampling, hinted=request.hinted)
            bound = None if request.hinted else s.plays.nohint_play_timeout_s
            try:
                result = await bounded_play(self._episode(request, policy, env_seed), bound)
            except InfrastructureFault:
                infrastructure += 1
                continue
            except PlayTimedOut:  # dropped, not retried (released)
                self.play_timeouts += 1
                return None
            if _timed_out(result):
                self.timed_out_envs.add(request.env.env_id)
            verdict = self._fault_verdict(request, result, faults)
            if verdict == "retry":
                faults += 1
                continue
            if verdict == "drop":
                self.fault_drops += 1
                return None
            trajectories = play_trajectories(policy, logprob_temperature=sampling.logprob_temperature)
            trajectory = trajectories[-1] if trajectories else None
            opening = next((m.content for m in result.messages if m.role == "user"), "")
            return Play(request.env.env_id, request.hinted, request.index, result.episode_return, len(result.turns),
                        result.end_reason.value, trajectory, seed=env_seed, opening=opening,
                        turn_log=tuple(result.turns), turn_samples=_turn_samples(policy, trajectories))
        self.infrastructure_failures += 1
        return None

    def _policy(self, sampling: SamplingParams, *, hinted: bool) -> EnginePolicy:
        """A fresh policy for one attempt: the released hinted arm's budgets and the tool-use mask
        scope where ``selfplay.plays`` asks for them (:mod:`.released_policy`)."""
        s = self.settings
        rules = s.plays
        chat_format = self.hint_arm_format if hinted else self.chat_format
        engine = self.hint_engine if hinted and self.tool_parser is None else self.engine
        if hinted and rules.hint_arm_budgets == "released" and self.tool_parser is None:
            return released_hint_policy(engine, self.tokenizer, sampling, chat_format=chat_format)
        if self.tool_parser is not None and rules.tool_mask_scope == "tool_call_block":
            return scoped_mask_policy(engine, self.tokenizer, sampling, max_context_tokens=s.max_context_tokens,
                                      chat_format=chat_format)
        if not hinted and s.plays.sample_form == "per_turn":
            return PerTurnPolicy(engine, self.tokenizer, sampling, max_context_tokens=s.max_context_tokens,
                                 chat_format=chat_format)
        return EnginePolicy(engine, self.tokenizer, sampling, max_context_tokens=s.max_context_tokens,
                            chat_format=chat_format)

    def _fault_verdict(self, request: PlayRequest, result: EpisodeResult, faults: int) -> str:
        """``keep`` (score the play), ``retry`` or ``drop``: what ``selfplay.plays.env_faults`` makes of
        an episode its environment ended. A timeout marks the environment hung in either arm; the
        hinted arm keeps its faults scored, as the released hint plays did."""
        if result.end_reason is not EndReason.ENV_ERROR or not self.settings.plays.drops_faults:
            return "keep"
        timed_out = _timed_out(result)
        if timed_out:
            self.hung_envs.add(request.env.env_id)
        if request.hinted:
            return "keep"
        if timed_out or faults >= RELEASED_FAULT_RETRIES:
            return "drop"
        return "retry"

    async def _episode(self, request: PlayRequest, policy: EnginePolicy, env_seed: int,
                       episode: EpisodeResult | None = None) -> EpisodeResult:
        try:
            if self.tool_parser is None and self.settings.env_source == "designer":
                env = await open_game(self.sandbox, request.env.source, self.settings.max_turns)
            else:  # tool use, and the baselines' pools, are built with the run's budget
                env = await self.sandbox.open(request.env.source, max_turns=self.settings.max_turns)
        except InfrastructureFault:
            raise
        except EnvFault as fault:  # an admitted environment that no longer loads: scored as a failed play
            if episode is not None and episode.messages:  # a carried play's environment cannot be rebuilt
                raise ReplayDiverged(f"the environment no longer loads: {fault.error.message}") from None
            return EpisodeResult(env_seed, [], end_reason=EndReason.ENV_ERROR, error=fault.error)
        hint = request.env.hint if request.hinted else None
        try:
            if self.tool_parser is not None:
                return await play_tool_episode(env, policy, parser=self.tool_parser, seed=env_seed,
                                               max_turns=self.settings.max_turns, hint=hint,
                                               mask_malformed=self.settings.plays.tool_mask_malformed_calls)
            return await play_episode(env, policy, seed=env_seed, max_turns=self.settings.max_turns,
                                      hint=hint, episode=episode, game_prompt=self.settings.agent_game_prompt,
                                      action_extraction=self.settings.action_extraction)
        finally:
            await env.close()
