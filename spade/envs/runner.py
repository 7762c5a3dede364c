"""Playing one episode of a sandboxed environment with a policy (SPEC section 4).

The policy is an async callback from the conversation so far to the next assistant message. The
runner parses the action out of it, steps the environment, applies the turn budget, and scores
the episode with the return rule: the last reward, clipped to [-1, 1], if and only if the episode
terminated.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..agent.actions import parse_action
from ..agent.prompts import first_tool_message, first_user_message, later_user_message
from ..agent.tool_calls import ToolCallError
from .tool_use.replies import ToolTurn, read_tool_turn
from .sandbox.client import ActionRefused
from .sandbox.runtime.tool_base import FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD
from .protocol import EnvError, EnvFault, EnvInstance, InfrastructureFault, episode_return

DEFAULT_MAX_TURNS = 25


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user", "assistant" or "tool"
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


Policy = Callable[[list[Message]], Awaitable[str]]


class StopEpisode(Exception):
    """Raised by a policy that cannot go on (context budget spent, response cut off without EOS).

    The episode ends unterminated, so its return is 0. ``response`` is the cut-off reply, if any:
    it is recorded in the conversation but not played, unless the environment says it scores
    cut-off replies itself (``scores_cut_off_replies = True``, RLVE's problems, whose verifier
    reads whatever the reply holds): then it is played like any reply (an empty one when there is
    none) and the episode ends as the environment says.
    """

    def __init__(self, reason: str, response: str | None = None):
        super().__init__(reason)
        self.response = response


class EndReason(str, enum.Enum):
    TERMINATED = "terminated"
    TRUNCATED = "truncated"  # the environment said so
    TURN_BUDGET = "turn_budget"
    POLICY_STOPPED = "policy_stopped"
    ENV_ERROR = "env_error"


@dataclass(frozen=True)
class Turn:
    response: str
    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    tool_calls: tuple[dict, ...] = ()  # tool episodes: each call with its result


@dataclass
class EpisodeResult:
    seed: int | None
    messages: list[Message]
    turns: list[Turn] = field(default_factory=list)
    end_reason: EndReason = EndReason.TURN_BUDGET
    error: EnvError | None = None
    stop_detail: str = ""

    @property
    def rewards(self) -> list[float]:
        return [turn.reward for turn in self.turns]

    @property
    def terminated(self) -> bool:
        return self.end_reason is EndReason.TERMINATED

    @property
    def episode_return(self) -> float:
        return episode_return(self.rewards, self.terminated)


def turn_budget(configured: int, env_max_turns: int | None) -> int:
    """The configured budget, or the environment's own ``max_turns`` when that is smaller."""
    if env_max_turns is not None and 0 < env_max_turns < configured:
        return env_max_turns
    return configured


class ReplayDiverged(Exception):
    """A continued episode's environment answered a recorded action differently (see ``play_episode``)."""


async def play_episode(env: EnvInstance, policy: Policy, *, seed: int | None = None,
                       max_turns: int = DEFAULT_MAX_TURNS, hint: str | None = None,
                       system_prompt: str | None = None, episode: EpisodeResult | None = None,
                       game_prompt: str = "spade", action_extraction: str = "last_box") -> EpisodeResult:
    """Play until the environment ends the episode or a budget runs out.

    ``game_prompt`` lays out the opening (``selfplay.agent_game_prompt``, :func:`first_user_message`);
    ``action_extraction`` picks the box of each reply (``selfplay.action_extraction``, :func:`parse_action`).

    An environment fault ends the episode with return 0 and is recorded in ``error``;
    an :class:`InfrastructureFault` propagates, since the episode must be retried, not scored.
    An action the sandbox refuses to send (``ActionRefused``: longer than
    ``sandbox.max_action_chars``) is the policy's: the episode stops unterminated (return 0,
    ``POLICY_STOPPED``, the reason in ``stop_detail``).

    ``episode``: the record to play into (the caller keeps a live view of its messages and turns).
    One that already holds its opening user message is a stopped episode to continue (partial rollouts): the fresh
    ``env`` is reset with ``seed`` and its recorded actions are replayed; an opening, observation,
    reward or end flag that differs from the recording raises :class:`ReplayDiverged`; then the
    play goes on from the recorded messages, with the turns already played counted in the budget.
    """
    if episode is None:
        episode = EpisodeResult(seed, [Message("system", system_prompt)] if system_prompt else [])
    messages = episode.messages
    resumed = any(m.role == "user" for m in messages)  # a fresh record holds at most the system prompt
    try:
        first = await env.reset(seed=seed)
    except InfrastructureFault:
        raise
    except EnvFault as fault:
        if resumed:
            raise ReplayDiverged(f"reset failed on replay: {fault.error.message}") from None
        episode.end_reason, episode.error = EndReason.ENV_ERROR, fault.error
        return episode
    opening = Message("user", first_user_message(first.observation, hint, game_prompt))
    if resumed:
        await _replay(env, episode, opening)
    else:
        messages.append(opening)
    for _ in range(turn_budget(max_turns, env.max_turns) - len(episode.turns)):
        try:
            response = await policy(list(messages))
        except StopEpisode as stop:
            if stop.response is not None:
                messages.append(Message("assistant", stop.response))
            episode.end_reason, episode.stop_detail = EndReason.POLICY_STOPPED, str(stop)
            if not getattr(env, "scores_cut_off_replies", False):
                return episode
            # an environment whose verifier scores a cut-off reply as it stands (RLVE): played as the
            # reply it is (none: an empty one); the episode then ends as the environment says
            response, cut_off = stop.response or "", True
        else:
            messages.append(Message("assistant", response))
            cut_off = False
        action = parse_action(response, action_extraction)
        try:
            result = await env.step(action)
        except InfrastructureFault:
            raise
        except EnvFault as fault:
            episode.end_reason, episode.error = EndReason.ENV_ERROR, fault.error
            return episode
        except ActionRefused as refused:  # an action the sandbox cannot take: the policy's, not played
            episode.end_reason, episode.stop_detail = EndReason.POLICY_STOPPED, str(refused)
            return episode
        episode.turns.append(Turn(response, action, result.observation, result.reward,
                                  result.terminated, result.truncated))
        if result.terminated or result.truncated:
            episode.end_reason = EndReason.TERMINATED if result.terminated else EndReason.TRUNCATED
            return episode
        if cut_off:  # a scored cut-off reply the environment did not end on: nothing can follow
            episode.end_reason = EndReason.POLICY_STOPPED
            return episode
        messages.append(Message("user", later_user_message(result.observation)))
    episode.end_reason = EndReason.TURN_BUDGET
    return episode


async def _replay(env: EnvInstance, episode: EpisodeResult, opening: Message) -> None:
    """Bring a fresh, reset ``env`` to the recorded episode's state by stepping its actions."""
    recorded_opening = next((m for m in episode.messages if m.role == "user"), None)
    if recorded_opening != opening:
        raise ReplayDiverged("the reset observation differs from the recorded one")
    for number, turn in enumerate(episode.turns):
        try:
            result = await env.step(turn.action)
        except InfrastructureFault:
            raise
        except EnvFault as fault:
            raise ReplayDiverged(f"turn {number} failed on replay: {fault.error.message}") from None
        if (result.observation, result.reward, result.terminated, result.truncated) != (
                turn.observation, turn.reward, turn.terminated, turn.truncated):
            raise ReplayDiverged(f"turn {number}'s outcome differs from the recorded one")


# -- tool use (SPEC 4, "Tool use") --------------------------------------------------------------


async def play_tool_episode(env: Any, policy: Any, *, parser: Any, seed: int | None = None,
                            max_turns: int = DEFAULT_MAX_TURNS, hint: str | None = None,
                            system_prompt: str | None = None,
                            mask_malformed: bool = True) -> EpisodeResult:
    """Play a tool environment with native tool calls (the released orchestrator's
    ``_play_game_tool_use_async``).

    The conversation opens with one user message, the first instruction (with ``HINT: ...`` for
    the hinted arm, :func:`first_tool_message`), and no system message: the tools reach the model
    through the chat template's ``tools=``. ``system_prompt`` adds one in front (not the paper's
    protocol; nothing in training passes it). The policy is called as
    ``policy(messages, tools=schemas)``. Each reply is read with ``parser`` (chosen by the chat
    format) after its reasoning is set aside (``spade.envs.tool_use.replies``; a policy whose
    ``prompt_opened_reasoning`` is true had its template pre-fill ``<think>``): an answer is
    checked first, then the valid tool calls run through ``env.call_tool`` and come back as
    ``tool`` messages, all results of one turn together. The next instruction is not a message
    of its own: it ends the tool result of the call that completed the current one
    (``[STEP n COMPLETE — NEW INSTRUCTION] ...``, then ``[ALL STEPS COMPLETE] ...``, written by
    the environment). ``<answer>..</answer>`` goes to the environment's ``step`` (1.0 and
    terminated when accepted, else its feedback as a user message); anything else is a format
    error (``FORMAT_ERROR_REWARD``, not terminal), and with ``mask_malformed`` the policy is asked
    to drop that reply's tokens from the loss (``policy.mask_last_turn()``). Return rule and
    budgets as in :func:`play_episode`.

    No reply ends the play with an exception: reading it never raises (``read_tool_turn``), and a
    call or answer the sandbox refuses to send (``ActionRefused``: arguments that are not strict
    JSON, too deep or too large, an answer over ``sandbox.max_action_chars``) does not run and is
    reported like a malformed block; a turn in which no call ran is a format error.
    """
    messages = [Message("system", system_prompt)] if system_prompt else []
    episode = EpisodeResult(seed, messages)
    try:
        first = await env.reset(seed=seed)
        schemas = await env.tools()
    except InfrastructureFault:
        raise
    except EnvFault as fault:
        episode.end_reason, episode.error = EndReason.ENV_ERROR, fault.error
        return episode
    tools = schemas.tools
    messages.append(Message("user", first_tool_message(first.observation, hint)))
    for _ in range(turn_budget(max_turns, env.max_turns)):
        try:
            response = await policy(list(messages), tools=tools)
        except StopEpisode as stop:
            if stop.response is not None:
                messages.append(Message("assistant", stop.response))
            episode.end_reason, episode.stop_detail = EndReason.POLICY_STOPPED, str(stop)
            return episode
        messages.append(Message("assistant", response))
        # a policy that knows its rendered prompt says whether the template left <think> open
        opened = bool(getattr(policy, "prompt_opened_reasoning", False))
        turn = read_tool_turn(response, parser, tools, inside_reasoning=opened)
        try:
            if turn.kind == "calls":
                log, replies, refused = [], [], []
                for call in turn.calls:
                    try:
                        result = await env.call_tool(call.name, call.arguments)
                    except ActionRefused as exc:  # not sent: reported like a malformed block
                        refused.append(ToolCallError(str(exc), call.name))
                        continue
                    replies.append(Message("tool", result.output))
                    log.append({"name": call.name, "arguments": call.arguments, **result.to_json()})
                if log:
                    ran = [{"name": entry["name"], "arguments": entry["arguments"]} for entry in log]
                    episode.turns.append(Turn(response, json.dumps(ran), "\n".join(m.content for m in replies),
                                              0.0, False, False, tuple(log)))
                    messages.extend(replies)
                    continue
                turn = ToolTurn("format_error", errors=turn.errors + tuple(refused))
            if turn.kind == "answer":
                action = f"<answer>{turn.answer}</answer>"
                try:
                    outcome = await env.step(action)
                except ActionRefused as exc:
                    turn = ToolTurn("format_error", errors=(ToolCallError(str(exc), ""),))
                else:
                    observation, reward = outcome.observation, outcome.reward
                    terminated, truncated = outcome.terminated, outcome.truncated
            if turn.kind == "format_error":
                if mask_malformed and hasattr(policy, "mask_last_turn"):
                    policy.mask_last_turn()
                detail = "; ".join(e.message for e in turn.errors)
                action, reward, terminated, truncated = "", FORMAT_ERROR_REWARD, False, False
                observation = FORMAT_ERROR_MESSAGE + (f" ({detail})" if detail else "")
        except InfrastructureFault:
            raise
        except EnvFault as fault:
            episode.end_reason, episode.error = EndReason.ENV_ERROR, fault.error
            return episode
        episode.turns.append(Turn(response, action, observation, reward, terminated, truncated))
        if terminated or truncated:
            episode.end_reason = EndReason.TERMINATED if terminated else EndReason.TRUNCATED
            return episode
        messages.append(Message("user", observation))
    episode.end_reason = EndReason.TURN_BUDGET
    return episode
