"""verifiers' own rollout loop on a spade pool against ``spade serve`` (issue 28).

``vf-eval`` (verifiers 0.4.0, from ``.venv-verifiers``; skipped when that venv is absent) evaluates
the ``spade_pool`` taskset: for every task it starts verifiers' ``null`` harness, a chat program in
a uv script environment (installed from the venv's uv cache, ``make verifiers``), whose model
calls go through verifiers' interception server to the model behind ``spade serve``'s HTTP server
(``ModelService`` on a real HTTP port, the real chat template and protocol), while spade's adapter
plays the game in spade's sandbox with each reply and scores SPEC 1.3's return.

The model is a scripted engine behind the server: two ``\\boxed{x}`` replies, then
``\\boxed{end 0.75}``, decided from the turns in the prompt the server rendered. A random tiny
model would not reach a known return; the reference is the hand-computed return of the scripted
game (0.75 after three turns) and the same actions replayed through spade's Gymnasium env.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from spade.envs.verifiers_uv import uv_environment
from scripted_engine import ScriptedEngine
from test_serve import MODEL_NAME, TOOLS_TEMPLATE
from test_verifiers_env import GAME

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SPADE_VERIFIERS_VENV", ROOT / ".venv-verifiers"))
SEEDS = 2
ACTIONS = ["\\boxed{x}", "\\boxed{x}", "\\boxed{end 0.75}"]
ASSISTANT = "<|im_start|>assistant"


class ScriptedPlayer(ScriptedEngine):
    """Replies ``ACTIONS[k]`` where ``k`` is the number of assistant turns already in the prompt."""

    def reply_ids(self, prompt: str) -> list[int]:
        return self.text_ids(ACTIONS[min(prompt.count(ASSISTANT) - 1, len(ACTIONS) - 1)])


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    if not (VENV / "bin" / "vf-eval").is_file():
        pytest.skip(f"{VENV} is absent: build it with `make verifiers`")
    from chat_templates import bpe_tokenizer
    from spade.serve.server import BackgroundServer
    from spade.serve.service import ModelService

    base = tmp_path_factory.mktemp("verifiers_loop")
    pool, shim, out = base / "pool", base / "shim", base / "out"
    pool.mkdir()
    shim.mkdir()
    (pool / "score_env.py").write_text(GAME, encoding="utf-8")
    # vf-eval imports a taskset id as a module exporting its classes (docs/export.md)
    (shim / "spade_pool.py").write_text("from spade.envs.verifiers_env import *  # noqa: F401,F403\n"
                                        "from spade.envs.verifiers_env import __all__  # noqa: F401\n",
                                        encoding="utf-8")
    tokenizer = bpe_tokenizer(TOOLS_TEMPLATE)
    engine = ScriptedPlayer(tokenizer)
    service = ModelService(engine, tokenizer, MODEL_NAME, max_context_tokens=2048,
                           eos_token_ids=[tokenizer.eos_token_id])
    with BackgroundServer(service) as server:
        env = uv_environment(VENV)
        env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(shim)]), SPADE_SERVE_KEY="unused")
        proc = subprocess.run(
            [str(VENV / "bin" / "vf-eval"), "spade_pool", "--env.taskset.source", str(pool),
             "--env.taskset.seeds", str(SEEDS), "-m", MODEL_NAME, "--client.base-url", server.url,
             "--client.api-key-var", "SPADE_SERVE_KEY", "--no-push", "--rich", "None", "-r", "1",
             "-o", str(out)],
            env=env, cwd=base, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    traces = [json.loads(line) for path in out.glob("*/traces.jsonl") for line in path.read_text().splitlines()]
    return pool, traces, engine.prompts


def test_every_task_ran_through_verifiers_loop_and_scored_the_spec_return(evaluated):
    _, episodes, _ = evaluated
    assert sorted(e["task"]["data"]["name"] for e in episodes) == [f"score_env#{i}" for i in range(SEEDS)]
    for episode in episodes:
        assert episode["ok"] and not episode["errors"], episode["errors"]
        (trace,) = episode["traces"]
        assert trace["rewards"] == {"spade_return": {"score": 0.75, "weight": 1.0}}  # by hand: the last reward
        assert trace["info"] == {"spade_turns": 3, "spade_actions": ACTIONS, "spade_end_reason": "terminated"}


def test_the_model_behind_spade_serve_saw_each_game_turn(evaluated):
    """Three requests per episode reached the engine, each after the observations verifiers'
    harness relayed: the seeded opening (``go <seed>``), then ``more`` after every non-final move."""
    _, _, prompts = evaluated
    assert len(prompts) == 3 * SEEDS
    openings = sorted(p for p in prompts if p.count(ASSISTANT) == 1)
    assert len(openings) == SEEDS
    assert [any(f"go {seed}" in p for p in openings) for seed in range(SEEDS)] == [True] * SEEDS
    for prompt in prompts:
        assert prompt.count("more") == prompt.count(ASSISTANT) - 1


def test_the_recorded_return_equals_replaying_the_actions_in_the_gymnasium_env(evaluated):
    from spade.envs.gym import DesignedEnv

    pool, episodes, _ = evaluated
    env = DesignedEnv(pool / "score_env.py")
    try:
        for episode in episodes:
            trace = episode["traces"][0]
            env.reset(seed=int(episode["task"]["data"]["name"].split("#")[1]))
            info = {"episode_return": None}
            for action in trace["info"]["spade_actions"]:
                _, _, terminated, truncated, info = env.step(action)
                if terminated or truncated:
                    break
            assert info["episode_return"] == trace["rewards"]["spade_return"]["score"]
    finally:
        env.close()
