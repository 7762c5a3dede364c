"""SPIRAL through ``spade train`` on CPU: the train-loop tests' tiny random Qwen3 plays both seats of
TextArena's real Kuhn Poker for 2 steps, its seats' turns trained with role-conditioned advantages by
the real Megatron step. Checked: the per-seat figures, a real gradient (the weights move between
the two checkpoints), the role baselines in the checkpoint and restored on resume, ``spade
analyze`` reading the run, and both recipes (SPIRAL's published settings, the CPU smoke) loading.
With ``selfplay.spiral.designed`` on (spade's extension), a run whose designer is a canned
OpenAI-compatible endpoint answering with a hand-written TicTacToe: admitted in the real sandbox,
played on both seats by the tiny model and trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spade.designer.two_seat_prompts import TWO_SEAT_SYSTEM
from spade.train_config import load_train_config
from support.configs import write_config
from support.http import JsonHandler, LocalServer, chat_completion
from support.two_seat_games import tic_tac_toe
from test_train_loop import checkpoint_tensors, metrics, run_spade, tiny_hf  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]


def spiral_config_dict(model: Path, spiral: dict, **selfplay) -> dict:
    """The two runs' config: the tiny model on both seats, 2 steps, ``spiral`` as the SPIRAL section."""
    return {
        "model": {"hf_dir": model, "dtype": "float32"},
        "optimizer": {"lr": 1.0e-3},
        "selfplay": {"env_source": "spiral", "k": 1, "envs_per_set": 1, "g_hint": 0,
                     "sampling": {"agent": {"temperature": 1.0, "top_p": 1.0, "top_k": None, "max_tokens": 12}},
                     "max_context_tokens": 2048, "use_corpus": False, "use_memory": False,
                     "train_designer": False, **selfplay, "spiral": spiral},
        "engine": {"max_batch_size": 1},
        "run": {"steps": 2, "checkpoint_every": 1, "seed": 7, "micro_batch_tokens": 4096},
    }


@pytest.fixture(scope="module")
def spiral_config(tiny_hf, tmp_path_factory) -> Path:  # noqa: F811
    spiral = {"games": ["kuhn_poker"], "games_per_step": 2, "advantage": "rae", "invalid_move": "released"}
    return write_config(tmp_path_factory.mktemp("spiral_cfg") / "spiral.yaml", spiral_config_dict(tiny_hf, spiral))


@pytest.fixture(scope="module")
def spiral_run(spiral_config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("spiral_run") / "run"
    run_spade("--config", str(spiral_config), "--run-dir", str(run))
    return run


def role_baselines(run: Path, step: int) -> list:
    state = json.loads((run / "checkpoints" / f"step_{step}" / "trainer_state.json").read_text())
    return state["orchestrator"]["env_source"]["role_baselines"]["baselines"]


def test_two_steps_of_kuhn_poker_train_both_seats(spiral_run):
    records = metrics(spiral_run)
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        assert record["spiral/kuhn_poker/games"] == 2.0 and record["agent/episodes"] == 4.0  # 2 games x 2 seats
        for seat in (0, 1):
            for figure in ("return_mean", "win_share", "baseline"):
                assert f"spiral/kuhn_poker/seat{seat}/{figure}" in record, (seat, figure)
        # zero-sum: the seats' mean returns cancel, or the released invalid-move shaping (-1.5 / +0.5)
        total = record["spiral/kuhn_poker/seat0/return_mean"] + record["spiral/kuhn_poker/seat1/return_mean"]
        assert total == pytest.approx(-1.0 * record["spiral/kuhn_poker/invalid_move_share"])
        assert record["agent/samples"] > 0 and record["train/grad_norm"] > 0 and record["time/step_s"] > 0
    before = checkpoint_tensors(spiral_run / "checkpoints" / "step_1")
    after = checkpoint_tensors(spiral_run / "checkpoints" / "step_2")
    weights = [k for k in before if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert weights and any(not torch.equal(before[k], after[k]) for k in weights)
    # the games were TextArena's: its Kuhn Poker rules in the kept episodes' openings
    kept = [json.loads(line) for line in (spiral_run / "trajectories" / "step_000000.jsonl").read_text().splitlines()]
    episodes = [e for e in kept if e["kind"] == "episode"]
    assert episodes and all("Kuhn Poker" in e["opening"] for e in episodes if e["turns"])
    # the baselines are in every checkpoint, one per seat, each having taken one return per game
    assert [(game, seat, n) for game, seat, _, n in role_baselines(spiral_run, 1)] == \
        [("kuhn_poker", 0, 2), ("kuhn_poker", 1, 2)]
    assert [(game, seat, n) for game, seat, _, n in role_baselines(spiral_run, 2)] == \
        [("kuhn_poker", 0, 4), ("kuhn_poker", 1, 4)]


def test_resume_restores_the_role_baselines(spiral_run, spiral_config, tmp_path):
    run = tmp_path / "run"
    run_spade("--config", str(spiral_config), "--run-dir", str(run), "run.steps=1")
    assert role_baselines(run, 1) == role_baselines(spiral_run, 1)
    proc = run_spade("--resume", str(run), "run.steps=2")
    assert "resumed from" in proc.stderr
    # four returns folded into each seat's average: step 1 began from the checkpointed ones
    assert role_baselines(run, 2) == role_baselines(spiral_run, 2)


def test_spade_analyze_reads_the_run(spiral_run, tmp_path):
    from spade.cli import main

    out = tmp_path / "analysis"
    assert main(["analyze", str(spiral_run), "--out", str(out), "--embedding", "hashing"]) == 0
    data = json.loads((out / "analysis.json").read_text())
    (only,) = data["runs"]
    assert [s["step"] for s in only["steps"]] == [0, 1]
    assert {e["skill"] for e in data["envs"]} == {"kuhn_poker"}


@pytest.mark.parametrize("name, games, per_game", [
    ("qwen3_4b_base_kuhn_8gpu.yaml", ("kuhn_poker",), 12),
    ("qwen3_4b_base_three_games_8gpu.yaml", ("tic_tac_toe", "kuhn_poker", "simple_negotiation"), 4),
])
def test_the_recipes_load_with_spirals_settings(name, games, per_game):
    recipe = load_train_config(ROOT / "examples" / "recipes" / "spiral" / name, [])
    sp = recipe.selfplay
    agent = sp.sampling("agent")
    assert sp.env_source == "spiral" and not sp.designer_enabled and not sp.train_designer and sp.g_hint == 0
    assert (sp.spiral.games, sp.spiral.advantage, sp.spiral.rae_decay, sp.spiral.invalid_move, sp.spiral.max_turns) \
        == (games, "rae", 0.95, "released", 50)
    assert sp.spiral.drop_zero_advantage and not sp.spiral.designed.enabled  # SPIRAL's games only
    assert sp.envs_per_set == len(games) and sp.spiral.games_per_step * len(games) == 12  # ~128 moves a step
    assert (agent.temperature, agent.top_p, agent.top_k, agent.max_tokens) == (1.0, 1.0, None, 4096)
    assert sp.max_context_tokens == 12800 and recipe.run.steps == 400 and recipe.loss.kl_coef == 0.0
    assert recipe.optimizer.lr == 1.0e-6 and recipe.optimizer.schedule == "constant"
    assert recipe.model.hf_dir.endswith("Qwen3-4B-Base")
    smoke = load_train_config(ROOT / "examples" / "spiral_smoke_cpu.yaml", [])
    assert smoke.selfplay.env_source == "spiral" and smoke.model.hf_dir == "embedded"
    assert smoke.engine.kind == "hf" and smoke.run.steps == 2


class CannedDesigner:
    """An OpenAI-compatible endpoint (``GET /v1/models``, ``POST /v1/chat/completions``) that
    answers every two-seat designer request with the honest TicTacToe."""

    def __init__(self):
        self.requests: list[dict] = []
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                self.send_json(200, {"object": "list", "data": [{"id": "canned", "object": "model", "created": 0,
                                                                 "owned_by": "test"}]})

            def do_POST(self):
                body = self.read_json(default={})
                outer.requests.append(body)
                system = body["messages"][0]["content"]
                text = f"```python\n{tic_tac_toe()}\n```" if system == TWO_SEAT_SYSTEM else "no"
                self.send_json(200, chat_completion(body["model"], text))

        self.server = LocalServer(Handler)


@pytest.fixture(scope="module")
def designed_run(tiny_hf, tmp_path_factory):  # noqa: F811  (fixture)
    canned = CannedDesigner()
    directory = tmp_path_factory.mktemp("spiral_designed")
    spiral = {"games": [], "games_per_step": 2, "advantage": "rae", "max_turns": 20,
              "designed": {"enabled": True, "games": 1}}
    endpoint = {"url": f"{canned.server.url}/v1", "model": "canned", "api_key_env": None}
    config = write_config(directory / "spiral_designed.yaml",
                          spiral_config_dict(tiny_hf, spiral, designer_endpoint=endpoint))
    run = directory / "run"
    try:
        run_spade("--config", str(config), "--run-dir", str(run))
    finally:
        canned.server.close()
    return run, canned


def test_spade_train_plays_and_trains_a_designed_game(designed_run):
    run, canned = designed_run
    assert [r["messages"][0]["content"] for r in canned.requests] == [TWO_SEAT_SYSTEM, TWO_SEAT_SYSTEM]  # k: 1
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        assert record["spiral/designed_0/games"] == 2.0 and record["agent/episodes"] == 4.0  # 2 games x 2 seats
        for seat in (0, 1):
            assert f"spiral/designed_0/seat{seat}/baseline" in record
        assert record["agent/samples"] > 0 and record["train/grad_norm"] > 0
    before = checkpoint_tensors(run / "checkpoints" / "step_1")
    after = checkpoint_tensors(run / "checkpoints" / "step_2")
    weights = [k for k in before if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert weights and any(not torch.equal(before[k], after[k]) for k in weights)
    saved = sorted((run / "envs").glob("step_*/spiral-*-designed_0.py"))
    assert len(saved) == 2 and "class TicTacToeEnv" in saved[0].read_text()
    kept = [json.loads(line) for line in (run / "trajectories" / "step_000000.jsonl").read_text().splitlines()]
    assert any("Tic-tac-toe" in e["opening"] for e in kept if e["kind"] == "episode" and e["turns"])
