"""State gating by replay in the real sandbox: one gated and one ungated example environment.

Switchboard needs at least three flips, so its winning (last) flip does not win on a fresh reset:
gated. Remainder oracle is won by ``guess N``, which wins just as well as the first action once N
is known: not gated (the win did not need the questions, only the knowledge).
"""

from __future__ import annotations

import pytest

from spade.analysis.run_reader import read_run
from spade.analysis.state_gating import GatingVerdict, gate_env, run_gating, winning_episodes
from test_analysis_fixture import example_source, lost_episode, make_run, solved_episode, two_env_run


def as_episode(line: dict, tmp_path, name: str):
    env = {"env_id": "e", "step": 0, "slot": 0, "skill": "s", "class_name": "", "source": example_source(name),
           "episodes": [line]}
    return read_run(make_run(tmp_path, f"r-{name}-{line['seed']}", [env])).envs[0]


def test_switchboard_is_gated_and_remainder_oracle_is_not(sandbox, tmp_path) -> None:
    board = as_episode(solved_episode("switchboard", seed=11), tmp_path, "switchboard")
    assert len(board.episodes[0].turns) >= 3 and board.episodes[0].won
    oracle = as_episode(solved_episode("remainder_oracle", seed=5), tmp_path, "remainder_oracle")
    assert len(oracle.episodes[0].turns) >= 2 and oracle.episodes[0].won

    gated = sandbox.run(gate_env(sandbox.service, board.source, board.episodes))
    assert gated == GatingVerdict(True, 1, "the winning action does not win as the first action")
    ungated = sandbox.run(gate_env(sandbox.service, oracle.source, oracle.episodes))
    assert ungated.gated is False and ungated.replays == 1


def test_never_won_and_one_turn_wins_need_no_replay(tmp_path) -> None:
    lost = as_episode(lost_episode("o", ["\\boxed{flip A}"], [0.0]), tmp_path, "switchboard")
    assert winning_episodes(lost.episodes) == []
    one_turn = {**solved_episode("switchboard", seed=11), "turns": [{"action": "\\boxed{flip A}", "reward": 1.0}], "return": 1.0}
    quick = as_episode(one_turn, tmp_path, "switchboard")

    class NoSandbox:
        async def open(self, *args, **kwargs):
            raise AssertionError("no replay expected")

    import asyncio
    assert asyncio.run(gate_env(NoSandbox(), lost.source, lost.episodes)).gated is None
    assert asyncio.run(gate_env(NoSandbox(), quick.source, quick.episodes)) == GatingVerdict(False, 0, "won in one turn")


def test_run_gating_starts_its_own_sandbox_for_a_run(tmp_path) -> None:
    run = read_run(two_env_run(tmp_path))
    verdicts = run_gating(run.envs)
    assert verdicts["run-a:0:s000000-e00"].gated is True
    assert verdicts["run-a:0:s000000-e01"].gated is False
    assert verdicts["run-a:2:s000002-e00"].gated is None  # no kept episodes
