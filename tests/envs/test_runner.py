"""The episode runner: action parsing, turn budgets, the return rule, faults, through the sandbox."""

from __future__ import annotations

import textwrap

import pytest

from spade.envs.protocol import ErrorKind, episode_return
from spade.envs.runner import EndReason, Message, StopEpisode, play_episode, turn_budget

# Rewards 0.25 per correct guess in a row; the third correct one ends with a configurable payout.
LADDER = textwrap.dedent('''
    class LadderEnv:
        def __init__(self, max_turns=10, payout=1.0):
            self.max_turns = max_turns
            self.payout = payout

        def reset(self, seed=None):
            self.rung = 0
            self.seen = []
            return "Say the next rung number, starting at 1.", {}

        def step(self, action):
            self.seen.append(action)
            if action != "\\\\boxed{%d}" % (self.rung + 1):
                return "no, start again", 0.0, False, False, {"seen": self.seen}
            self.rung += 1
            if self.rung == 3:
                return "top", self.payout, True, False, {"seen": self.seen}
            return f"rung {self.rung}", 0.25 * self.rung, False, False, {"seen": self.seen}
''')


def scripted(*responses: str):
    queue = list(responses)
    seen: list[list[Message]] = []

    async def policy(messages: list[Message]) -> str:
        seen.append(messages)
        return queue.pop(0) if queue else "\\boxed{wait}"

    policy.seen = seen  # type: ignore[attr-defined]
    return policy


def play(sandbox, source: str, policy, **kwargs):
    async def go():
        env = await sandbox.service.open(source, max_turns=kwargs.pop("env_max_turns", None))
        try:
            return await play_episode(env, policy, **kwargs)
        finally:
            await env.close()

    return sandbox.run(go())


def test_winning_episode_scores_last_reward_not_the_sum(sandbox):
    policy = scripted("Let me think... \\boxed{1}", "\\boxed{2} is next", "final: \\boxed{3}")
    result = play(sandbox, LADDER, policy, seed=0)
    assert result.end_reason is EndReason.TERMINATED
    assert result.rewards == [0.25, 0.5, 1.0]
    assert result.episode_return == 1.0
    assert [turn.action for turn in result.turns] == ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"]


def test_conversation_shape_and_hint(sandbox):
    policy = scripted("\\boxed{1}", "\\boxed{2}", "\\boxed{3}")
    result = play(sandbox, LADDER, policy, hint="count upwards", system_prompt="be brief")
    roles = [m.role for m in result.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    opening = result.messages[1].content
    assert "\\boxed{" in opening and "Say the next rung number" in opening
    assert opening.rstrip().endswith("HINT: count upwards")
    assert result.messages[3].content == "rung 1"
    # The policy saw the growing conversation, never its own future turns.
    assert [len(m) for m in policy.seen] == [2, 4, 6]


def test_payout_is_clipped_to_unit_interval(sandbox):
    source = LADDER.replace("payout=1.0", "payout=7.5")
    result = play(sandbox, source, scripted("\\boxed{1}", "\\boxed{2}", "\\boxed{3}"))
    assert result.rewards[-1] == 7.5 and result.episode_return == 1.0
    negative = LADDER.replace("payout=1.0", "payout=-3.0")
    assert play(sandbox, negative, scripted("\\boxed{1}", "\\boxed{2}", "\\boxed{3}")).episode_return == -1.0


def test_turn_budget_ends_with_zero_even_after_partial_rewards(sandbox):
    result = play(sandbox, LADDER, scripted("\\boxed{1}", "\\boxed{2}"), max_turns=2)
    assert result.end_reason is EndReason.TURN_BUDGET
    assert result.rewards == [0.25, 0.5] and result.episode_return == 0.0


def test_environments_smaller_max_turns_wins(sandbox):
    result = play(sandbox, LADDER, scripted(), max_turns=25, env_max_turns=4)
    assert len(result.turns) == 4 and result.end_reason is EndReason.TURN_BUDGET
    assert turn_budget(25, 4) == 4 and turn_budget(3, 10) == 3 and turn_budget(25, None) == 25


def test_environment_truncation_scores_zero(sandbox):
    source = LADDER.replace('return "no, start again", 0.0, False, False', 'return "give up", 0.4, False, True')
    result = play(sandbox, source, scripted("\\boxed{9}"))
    assert result.end_reason is EndReason.TRUNCATED and result.episode_return == 0.0


def test_policy_can_stop_the_episode(sandbox):
    async def policy(messages):
        raise StopEpisode("context budget spent")

    result = play(sandbox, LADDER, policy)
    assert result.end_reason is EndReason.POLICY_STOPPED and result.stop_detail == "context budget spent"
    assert result.episode_return == 0.0 and result.turns == []


def test_environment_fault_mid_episode_is_recorded(sandbox):
    source = LADDER.replace("self.rung += 1", "self.rung += 1\n        if self.rung == 2:\n            raise KeyError('oops')")
    result = play(sandbox, source, scripted("\\boxed{1}", "\\boxed{2}"))
    assert result.end_reason is EndReason.ENV_ERROR
    assert result.error.kind is ErrorKind.STEP_ERROR and "KeyError" in result.error.message
    assert result.episode_return == 0.0 and len(result.turns) == 1


def test_raw_text_without_a_box_is_the_action(sandbox):
    result = play(sandbox, LADDER, scripted("  just words  "), max_turns=1)
    assert result.turns[0].action == "just words"


@pytest.mark.parametrize("rewards, terminated, expected", [
    ([0.1, 0.2, 0.7], True, 0.7),
    ([0.1, 0.2, 0.7], False, 0.0),
    ([5.0], True, 1.0),
    ([-2.0], True, -1.0),
    ([], True, 0.0),
    ([float("nan")], True, 0.0),
])
def test_episode_return_rule(rewards, terminated, expected):
    assert episode_return(rewards, terminated) == expected


def test_game_prompt_and_action_extraction_reach_the_episode(sandbox):
    """selfplay.agent_game_prompt and selfplay.action_extraction (issue 39) through play_episode."""
    from spade.agent.prompts import first_user_message

    reply = "\\boxed{1} is what I start with; not \\boxed{9}"  # the first box is right, the last wrong
    spade_way = play(sandbox, LADDER, scripted(reply), seed=0, max_turns=1, hint="climb")
    assert spade_way.turns[0].action == "\\boxed{9}" and spade_way.turns[0].reward == 0.0
    assert spade_way.messages[0].content == first_user_message("Say the next rung number, starting at 1.", "climb")

    released = play(sandbox, LADDER, scripted(reply), seed=0, max_turns=1, hint="climb",
                    game_prompt="paper", action_extraction="first_flat_box")
    assert released.turns[0].action == "\\boxed{1}" and released.turns[0].reward == 0.25
    assert released.messages[0].content.startswith(
        "You are playing a text game. Take valid actions and win it.\n"
        "Observation: Say the next rung number, starting at 1.\n\nHINT: climb\n")
