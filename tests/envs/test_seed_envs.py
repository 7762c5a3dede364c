"""The memory seed examples (``examples/seed_envs``) follow the games contract the designer prompt
asks for (issue 29): admitted as generated games are, their own ``max_turns`` default,
``solution()`` and ``close()``, the action syntax in every observation, partial rewards, and
termination only at the goal. Admitted through the real sandbox, played in process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spade.envs.admission import admit

SEED_DIR = Path(__file__).resolve().parents[2] / "examples" / "seed_envs"
SEEDS = sorted(SEED_DIR.glob("*.py"))
BOX = re.compile(r"\\boxed\{[^}]*\}")


def test_there_are_two_seed_examples():
    assert [p.name for p in SEEDS] == ["guess_number.py", "thermostat.py"]


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_seed_is_admitted_with_its_own_turn_default(sandbox, path):
    verdict = sandbox.run(admit(sandbox.service, path.read_text()))  # no max_turns: the class's own
    assert verdict.admitted, verdict.error
    assert verdict.max_turns == 6


def _session(path, seed):
    """A local (in-process) instance for method-level checks, with the hidden value read off
    ``solution()``."""
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    cls = next(v for k, v in namespace.items() if k.endswith("Env") and isinstance(v, type))
    env = cls()
    first, info = env.reset(seed=seed)
    target = int(re.search(r"\d+", env.solution()).group())
    return env, first, target


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_solution_wins_in_one_action_of_its_own_syntax(path):
    for seed in range(5):
        env, first, _ = _session(path, seed)
        assert BOX.search(first)  # the opening observation states the action syntax
        answer = env.solution()
        assert BOX.fullmatch(answer) and answer not in first  # the answer is not given away
        observation, reward, terminated, truncated, info = env.step(answer)
        assert (reward, terminated, truncated, info) == (1.0, True, False, {})
        assert env.close() is None


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_only_the_goal_terminates_and_every_observation_reminds_the_syntax(path):
    env, _, target = _session(path, seed=3)
    far = 1 if target > 25 else 50  # outside the winning band of either game
    rewards = []
    for turn in range(1, env.max_turns + 1):
        observation, reward, terminated, truncated, _ = env.step(f"\\boxed{{{far}}}")
        assert not terminated and BOX.search(observation)
        assert truncated == (turn == env.max_turns)
        rewards.append(reward)
    assert rewards[0] == 0.1 and set(rewards[1:]) == {0.0}  # progress only when closer than before
    env, _, _ = _session(path, seed=3)
    observation, reward, terminated, truncated, _ = env.step("no number here")
    assert not terminated and reward == 0.0 and BOX.search(observation)


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_a_near_miss_inside_the_band_wins_with_a_partial_reward(path):
    env, _, target = _session(path, seed=7)
    near = target + 1 if target < 30 else target - 1
    _, reward, terminated, _, _ = env.step(f"\\boxed{{{near}}}")
    assert terminated and 0.0 < reward < 1.0
