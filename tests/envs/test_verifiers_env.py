"""spade.envs.verifiers_env (issue 28): a pool as a verifiers 0.4 taskset + env.

Runs tests/verifiers_env_probe.py with .venv-verifiers' python (``make verifiers``); skips when
that venv is absent. The reference for each episode is SPEC 1.3's return computed by hand for a
scripted game, and the same actions replayed through spade's Gymnasium env in this process.
verifiers' own rollout loop against ``spade serve`` is tests/envs/test_verifiers_loop.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("SPADE_VERIFIERS_PYTHON", ROOT / ".venv-verifiers" / "bin" / "python"))

GAME = '''
class ScoreEnv:
    """0.25 per step; 'end X' ends with reward X; 'stop' truncates."""
    max_turns = 4

    def reset(self, seed=None):
        self.turn = 0
        return f"go {seed}", {}

    def step(self, action):
        self.turn += 1
        action = action.removeprefix(chr(92) + "boxed{").removesuffix("}")  # spade sends the box
        if action == "stop":
            return "stopped", 0.5, False, True, {}
        if action.startswith("end "):
            return "over", float(action[4:]), True, False, {}
        return "more", 0.25, False, False, {}
'''

SCRIPTS = [
    ["\\boxed{x}", "\\boxed{x}", "\\boxed{end 0.75}"],  # terminated: return 0.75
    ["\\boxed{end 5}"],                                 # terminated: clipped to 1
    ["\\boxed{x}", "\\boxed{stop}"],                    # truncated: 0
    ["\\boxed{x}"] * 6,                                 # the game's max_turns (4) runs out: 0
]
EXPECTED = [(0.75, 3), (1.0, 1), (0.0, 2), (0.0, 4)]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    if not PYTHON.is_file():
        pytest.skip(f"{PYTHON} is absent: build it with `make verifiers`")
    pool = tmp_path_factory.mktemp("pool")
    (pool / "score_env.py").write_text(GAME, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([str(PYTHON), str(ROOT / "tests" / "verifiers_env_probe.py"), str(pool),
                          json.dumps(SCRIPTS)], capture_output=True, text=True, timeout=240, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return pool, lines[0], lines[1:]


def test_load_environment_through_verifiers_loader(episodes):
    _, loaded, _ = episodes
    assert loaded == {"loaded": "SpadePoolEnv", "tasks": [f"score_env#{i}" for i in range(4)],
                      "harnesses": ["NullHarness"]}


def test_rollouts_play_the_sandboxed_game_and_score_the_spec_return(episodes):
    _, _, results = episodes
    assert [r["name"] for r in results] == [f"score_env#{i}" for i in range(4)]
    for result, (expected_return, turns) in zip(results, EXPECTED):
        assert result["prompt"] is None  # the env opens the exchange with the first observation
        assert result["reward"]["spade_return"] == [expected_return, 1.0]
        assert result["info"]["spade_turns"] == turns
    assert results[0]["first_user"].endswith("go 0") or "go 0" in results[0]["first_user"]
    assert results[1]["first_user"] and "go 1" in results[1]["first_user"]


def test_return_equals_replaying_the_actions_through_the_gymnasium_env(episodes):
    from spade.envs.gym import DesignedEnv

    pool, _, results = episodes
    env = DesignedEnv(pool / "score_env.py")
    try:
        for seed, result in enumerate(results):
            env.reset(seed=seed)
            info = {"episode_return": 0.0}
            for action in result["info"]["spade_actions"]:
                _, _, terminated, truncated, info = env.step(action)
                if terminated or truncated:
                    break
            assert info["episode_return"] == result["reward"]["spade_return"][0]
    finally:
        env.close()
