"""Hand-built run directories in the format a run keeps (docs/analysis.md), and the reader on them.

Other analysis tests import ``make_run`` / ``solved_episode`` from here.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from spade.analysis.run_reader import read_run, read_runs, run_names, signature

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "envs"
PREAMBLE = ("You are playing an interactive text game. Read the situation below, think it through, and reply with "
            "exactly one action per turn. Put the action inside \\boxed{...}; only the last box in your reply counts. "
            "The game answers each action with a new observation until it ends.\n\n")


def example_source(name: str) -> str:
    return (EXAMPLES / f"{name}.py").read_text()


def solved_episode(name: str, seed: int, arm: str = "nohint", step: int = 0, index: int = 0, hint: str = "") -> dict[str, Any]:
    """An ``episode`` line: the scripted solver of examples/solvers.py playing example ``name`` in process."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    solvers_spec = importlib.util.spec_from_file_location("example_solvers", ROOT / "examples" / "solvers.py")
    solvers = importlib.util.module_from_spec(solvers_spec)
    solvers_spec.loader.exec_module(solvers)
    env_class = next(v for k, v in vars(module).items() if k.endswith("Env") and isinstance(v, type))
    env = env_class()
    opening, _ = env.reset(seed=seed)
    transcript = getattr(solvers, f"solve_{name}")(env_class(), seed)
    turns = [{"action": a, "observation": o, "reward": r, "terminated": t, "truncated": u} for a, o, r, t, u in transcript]
    final = turns[-1]
    episode_return = max(-1.0, min(1.0, final["reward"])) if final["terminated"] else 0.0
    text = PREAMBLE + opening + (f"\n\nHINT: {hint}" if hint else "")
    return {"kind": "episode", "step": step, "arm": arm, "index": index, "seed": seed, "opening": text,
            "turns": turns, "return": episode_return, "end_reason": "terminated"}


def lost_episode(opening: str, actions: list[str], rewards: list[float], arm: str = "nohint", step: int = 0,
                 index: int = 0, seed: int = 1) -> dict[str, Any]:
    turns = [{"action": a, "observation": f"after {a}", "reward": r, "terminated": False, "truncated": i == len(actions) - 1}
             for i, (a, r) in enumerate(zip(actions, rewards))]
    return {"kind": "episode", "step": step, "arm": arm, "index": index, "seed": seed, "opening": PREAMBLE + opening,
            "turns": turns, "return": 0.0, "end_reason": "truncated"}


def make_run(root: Path, name: str, envs: list[dict[str, Any]], *, k: int = 2, rejected: list[dict[str, Any]] = (),
             metrics: list[dict[str, Any]] = ()) -> Path:
    """A run directory. Each env dict: env_id, step, slot, skill, class_name, source, hint, and optional
    ``returns`` {step: (nohint list, hint list)} and ``episodes`` (episode lines without env fields)."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"selfplay:\n  k: {k}\nrun:\n  steps: 8\n")
    lines_by_step: dict[int, list[dict[str, Any]]] = {}
    for env in envs:
        directory = run / "envs" / f"step_{env['step']:06d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{env['env_id']}.py").write_text(env["source"])
        (directory / f"{env['env_id']}.hint.txt").write_text(env.get("hint", ""))
        meta = {"env_id": env["env_id"], "slot": env["slot"], "skill": env["skill"], "class_name": env["class_name"],
                "max_turns": env.get("max_turns"), "generated_step": env["step"],
                "document": env.get("document", "a corpus excerpt"), "attempts": 1}
        (directory / f"{env['env_id']}.json").write_text(json.dumps(meta))
        for step, (nohint, hint) in env.get("returns", {}).items():
            lines_by_step.setdefault(step, []).append(
                {"kind": "env_returns", "step": step, "env_id": env["env_id"], "skill": env["skill"],
                 "generated_step": env["step"], "nohint_returns": nohint, "hint_returns": hint})
        for episode in env.get("episodes", []):
            lines_by_step.setdefault(episode["step"], []).append(
                {**episode, "env_id": env["env_id"], "skill": env["skill"]})
    for step, lines in lines_by_step.items():
        path = run / "trajectories" / f"step_{step:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for r in rejected:
        directory = run / "rejected" / f"step_{r['step']:06d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"slot{r['slot']}_attempt{r['attempt']}.json").write_text(json.dumps(
            {"step": r["step"], "slot": r["slot"], "attempt": r["attempt"], "skill": r.get("skill", "Optimization"),
             "document": "doc", "reason": {"kind": r["kind"], "stage": r.get("stage", "syntax"), "message": r["message"]},
             "response": r.get("response", "```python\nclass Broken(\n```")}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run


def two_env_run(root: Path, name: str = "run-a") -> Path:
    """Step 0: switchboard (won by the solver) and remainder_oracle; step 2: a copy of switchboard
    under the same env id scheme; one rejected candidate at step 0; metrics for steps 0-3."""
    won = solved_episode("switchboard", seed=7)
    guess = solved_episode("remainder_oracle", seed=3)
    envs = [
        {"env_id": "s000000-e00", "step": 0, "slot": 0, "skill": "Causal Inference", "class_name": "SwitchboardEnv",
         "source": example_source("switchboard"), "hint": "Flip each switch once to learn its wires.",
         "returns": {0: ([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]), 1: ([0.0, 1.0, 0.0, 0.0], [])},
         "episodes": [won, {**won, "arm": "hint", "opening": won["opening"] + "\n\nHINT: flip each switch once"}]},
        {"env_id": "s000000-e01", "step": 0, "slot": 1, "skill": "Mathematical Reasoning", "class_name": "RemainderOracleEnv",
         "source": example_source("remainder_oracle"), "hint": "Ask the largest moduli first.",
         "returns": {0: ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])}, "episodes": [guess]},
        {"env_id": "s000002-e00", "step": 2, "slot": 0, "skill": "Causal Inference", "class_name": "SwitchboardEnv",
         "source": example_source("switchboard"), "hint": "",
         "returns": {2: ([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])}},
    ]
    rejected = [{"step": 0, "slot": 1, "attempt": 0, "kind": "syntax_error", "message": "line 1: '(' was never closed"}]
    metrics = [{"step": s, "agent/return_mean": 0.1 * s, "env/admitted": 2.0} for s in range(4)]
    return make_run(root, name, envs, rejected=rejected, metrics=metrics)


def test_reader_reads_envs_returns_episodes_rejections_and_metrics(tmp_path: Path) -> None:
    run = read_run(two_env_run(tmp_path))
    assert [e.uid for e in run.envs] == ["run-a:0:s000000-e00", "run-a:0:s000000-e01", "run-a:2:s000002-e00"]
    board = run.envs[0]
    assert board.win_rate == 0.25 and board.window_win == 0.25
    assert board.regret == pytest.approx(0.75 - 0.25)
    assert [e.arm for e in board.episodes] == ["nohint", "hint"] and board.episodes[0].won
    assert run.envs[1].win_rate == 0.0 and run.envs[1].regret == 0.0
    assert [(r.step, r.kind) for r in run.rejections] == [(0, "syntax_error")]
    assert [m["step"] for m in run.metrics] == [0, 1, 2, 3]
    assert run.regeneration_steps == [0, 2] and run.k == 2


def test_reader_tolerates_a_run_in_progress(tmp_path: Path) -> None:
    path = two_env_run(tmp_path)
    with (path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 4, "agent/ret')  # a line being written
    (path / "envs" / "step_000004").mkdir()
    (path / "envs" / "step_000004" / "s000004-e00.json").write_text('{"env_id": "s000004-e00"}')  # .py not yet there
    (path / "trajectories" / "step_000004.jsonl").write_text('{"kind": "env_returns", "step": 4, "env_id": "nope"}\n{"kin')
    before = signature([path])
    run = read_run(path)
    assert len(run.envs) == 3 and [m["step"] for m in run.metrics] == [0, 1, 2, 3]
    (path / "envs" / "step_000004" / "s000004-e00.py").write_text("class XEnv: pass\n")
    assert signature([path]) != before


def test_fixed_pool_ids_repeat_across_regenerations_and_stay_apart(tmp_path: Path) -> None:
    source = example_source("switchboard")
    envs = [{"env_id": "fixed-switchboard", "step": s, "slot": 0, "skill": "Causal Inference", "class_name": "SwitchboardEnv",
             "source": source, "returns": {s: ([float(s == 2)] * 2, []), s + 1: ([0.0] * 2, [])},
             "episodes": [lost_episode("o", ["\\boxed{flip A}"], [0.0], step=s + 1)]} for s in (0, 2)]
    run = read_run(make_run(tmp_path, "fixed", envs))
    first, second = run.envs
    assert (first.win_rate, second.win_rate) == (0.0, 1.0)
    assert [e.step for e in first.episodes] == [1] and [e.step for e in second.episodes] == [3]


def test_run_names_are_distinct(tmp_path: Path) -> None:
    assert run_names([tmp_path / "a" / "run", tmp_path / "b" / "run"]) == ["a/run", "b/run"]
    assert [r.name for r in read_runs([two_env_run(tmp_path / "x"), two_env_run(tmp_path / "y")])] == \
        ["x/run-a", "y/run-a"]
