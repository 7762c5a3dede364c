"""spade.envs.gym: a designed environment as a Gymnasium Env (issue 28).

References: Gymnasium's own ``check_env``; the example games' scripted solvers played on the game
class directly (in this test process, as the reference), which the Gymnasium env must replay
identically through the sandbox; SPEC 1.3's return rule computed by hand."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import spade.envs.gym as spade_gym
from spade.envs.gym import DesignedEnv, DesignedEnvError

ROOT = Path(__file__).resolve().parents[2]
ENV_DIR = ROOT / "examples" / "envs"
_spec = importlib.util.spec_from_file_location("example_solvers_gym", ROOT / "examples" / "solvers.py")
solvers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(solvers)

# the sandbox's default limits (30 s per call): these games are well behaved, and a loaded CI machine
# must not turn a slow step into a timeout
SANDBOX: dict = {}


def _env_class(path: Path):
    spec = importlib.util.spec_from_file_location(f"reference_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (cls,) = [v for k, v in vars(module).items() if isinstance(v, type) and k.endswith("Env")
              and v.__module__ == module.__name__]
    return cls


def test_gymnasium_make_and_check_env_without_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = gymnasium.make(spade_gym.ENV_ID, source=str(ENV_DIR / "foggy_grid.py"), sandbox_config=SANDBOX)
        try:
            check_env(env.unwrapped)
            observation, info = env.reset(seed=5)
            assert observation in env.observation_space
            assert isinstance(env.observation_space, gymnasium.spaces.Text)
            assert env.observation_space.max_length == spade_gym.SandboxConfig().max_observation_chars
        finally:
            env.close()
    ours = [w for w in caught if "gymnasium" in str(w.filename) or "spade" in str(w.filename)]
    assert not ours, [str(w.message) for w in ours]


@pytest.mark.parametrize("stem", ["remainder_oracle", "switchboard"])
def test_solver_transcript_matches_the_class_played_directly(stem):
    path = ENV_DIR / f"{stem}.py"
    solve = solvers.SOLVERS[stem]
    env = DesignedEnv(path, sandbox_config=SANDBOX)
    try:
        for seed in (0, 3):
            expected = solve(_env_class(path)(), seed)
            got = solve(env, seed)
            assert got == expected
            assert got[-1][2] == 1.0 and got[-1][3]  # the solver wins
    finally:
        env.close()


RETURN_RULE_ENV = '''
class ScoreEnv:
    """Rewards 0.25 per step, then a last reward of the action's number; 'stop' truncates."""
    max_turns = 4

    def reset(self, seed=None):
        self.turn = 0
        return "go", {"seed": seed}

    def step(self, action):
        self.turn += 1
        if action == "stop":
            return "stopped", 0.5, False, True, {}
        if action.startswith("end "):
            return "over", float(action[4:]), True, False, {"n": self.turn}
        return "more", 0.25, False, False, {"n": self.turn}
'''


def test_info_carries_the_spec_return_and_the_turn_budget_truncates():
    env = DesignedEnv(code=RETURN_RULE_ENV, sandbox_config=SANDBOX, max_turns=25)
    try:
        assert env.turn_budget == 4  # the environment's own max_turns is smaller than 25
        env.reset(seed=1)
        _, reward, terminated, truncated, info = env.step("x")
        assert (reward, terminated, truncated, info["episode_return"], info["turn"]) == (0.25, False, False, 0.0, 1)
        _, reward, terminated, truncated, info = env.step("end 5")
        # the step's own reward is passed through; the SPEC return is the last reward clipped to [-1, 1]
        assert (reward, terminated, truncated) == (5.0, True, False)
        assert info["episode_return"] == 1.0 and info["end_reason"] == "terminated" and info["env"] == {"n": 2}
        with pytest.raises(DesignedEnvError, match="reset"):
            env.step("x")
        env.reset(seed=1)
        _, _, _, _, info = env.step("end -0.4")
        assert info["episode_return"] == -0.4
        env.reset(seed=1)
        _, reward, terminated, truncated, info = env.step("stop")
        assert (reward, terminated, truncated, info["episode_return"], info["end_reason"]) == \
            (0.5, False, True, 0.0, "truncated")  # not terminated: the return is 0
        env.reset()
        for _ in range(3):
            assert env.step("x")[3] is False
        _, _, terminated, truncated, info = env.step("x")
        assert (terminated, truncated, info["end_reason"], info["episode_return"]) == (False, True, "turn_budget", 0.0)
    finally:
        env.close()


def test_unseeded_resets_draw_from_np_random():
    env = DesignedEnv(code=RETURN_RULE_ENV, sandbox_config=SANDBOX)
    try:
        _, first = env.reset(seed=11)
        assert first["seed"] == 11 and first["env"] == {"seed": 11}
        seeds = [env.reset()[1]["seed"] for _ in range(2)]
        env.reset(seed=11)
        assert [env.reset()[1]["seed"] for _ in range(2)] == seeds
        with pytest.raises(ValueError, match="options"):
            env.reset(options={"hint": True})
    finally:
        env.close()


MARKER_ENV = '''
import random

random.SPADE_GYM_MARKER = "loaded"  # visible in whichever interpreter runs this module


class MarkerEnv:
    def reset(self, seed=None):
        return getattr(random, "SPADE_GYM_MARKER", "absent"), {}

    def step(self, action):
        return "done", 1.0, True, False, {}
'''


def test_the_class_runs_in_the_sandbox_and_close_stops_it():
    import random

    env = DesignedEnv(code=MARKER_ENV, sandbox_config=SANDBOX)
    runner = env._runner
    process = runner.service._process
    observation, _ = env.reset(seed=0)
    assert observation == "loaded"  # the module ran where reset ran ...
    assert not hasattr(random, "SPADE_GYM_MARKER")  # ... and that was not this interpreter
    env.close()
    assert process.poll() is not None  # the supervisor (and its sandboxes) exited
    assert not runner.thread.is_alive()
    env.close()  # twice is fine


def test_tool_use_environments_are_refused():
    path = ENV_DIR / "tool_use" / "banking.py"
    with pytest.raises(DesignedEnvError, match="tool-use"):
        DesignedEnv(path, sandbox_config=SANDBOX)


def test_a_pool_entry_by_name_with_its_hint_and_skill(tmp_path):
    (tmp_path / "env_000001.py").write_text((ENV_DIR / "switchboard.py").read_text())
    (tmp_path / "env_000001.hint.txt").write_text("flip each switch once\n")
    (tmp_path / "pool.jsonl").write_text(json.dumps({"name": "env_000001", "skill": "Causal Inference"}) + "\n")
    with pytest.raises(ValueError, match="name=NAME"):
        DesignedEnv(tmp_path, sandbox_config=SANDBOX)
    env = DesignedEnv(tmp_path, name="env_000001", sandbox_config=SANDBOX)
    try:
        assert env.hint == "flip each switch once" and env.skill == "Causal Inference"
        assert env.class_name == "SwitchboardEnv"
    finally:
        env.close()


def test_a_broken_source_fails_at_make_with_the_classified_error():
    with pytest.raises(DesignedEnvError) as caught:
        DesignedEnv(code="class Broken(:\n", sandbox_config=SANDBOX)
    assert caught.value.error.kind.value == "syntax_error"


NEEDS_MAX_TURNS_ENV = '''
class StrictEnv:
    def __init__(self, max_turns):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return f"budget {self.max_turns}", {}

    def step(self, action):
        return "again", 0.0, False, False, {}
'''


def test_a_class_that_needs_max_turns_is_built_with_the_budget_as_in_training():
    env = DesignedEnv(code=NEEDS_MAX_TURNS_ENV, sandbox_config=SANDBOX, max_turns=3)
    try:
        assert env.reset(seed=0)[0] == "budget 3" and env.turn_budget == 3
        assert [env.step("x")[3] for _ in range(3)] == [False, False, True]
    finally:
        env.close()
