"""``spade analyze`` end to end on two hand-built runs: files written, numbers as built, plots drawn."""

from __future__ import annotations

import csv
import json

from spade.cli import main
from test_analysis_fixture import two_env_run
from test_train_loop import tiny_hf, train_config  # noqa: F401  (fixtures)

PNG = b"\x89PNG\r\n\x1a\n"


def test_analyze_two_runs_writes_json_csv_and_overlaid_plots(tmp_path, capsys) -> None:
    a, b = two_env_run(tmp_path / "a", "base"), two_env_run(tmp_path / "b", "ablation")
    out = tmp_path / "out"
    assert main(["analyze", str(a), str(b), "--out", str(out), "--embedding", "hashing"]) == 0
    printed = capsys.readouterr().out
    assert "base: 3 envs" in printed and f"wrote 16 files to {out}" in printed

    data = json.loads((out / "analysis.json").read_text())
    assert [r["name"] for r in data["runs"]] == ["base", "ablation"] and data["state_gating"] is True
    run = data["runs"][0]
    first, second = run["steps"]
    assert (first["step"], first["n_envs"], second["step"], second["n_envs"]) == (0, 2, 2, 1)
    assert first["learnable_share"] == 0.5  # win rates 0.25 (in the band) and 0.0
    assert first["win_rate"]["mean"] == 0.125
    assert first["rejected"] == 1 and first["rejected_by_kind"] == {"syntax_error": 1}
    assert first["state_gated_share"] == 0.5 and first["state_gating_known"] == 2
    assert second["vendi_per_n"] == 1.0 and second["learnable_share"] == 0.0
    assert run["collapse"]["longest_streak"] == 1  # switchboard, oracle, switchboard: never two in a row
    envs = {e["uid"]: e for e in data["envs"]}
    board = envs["base:0:s000000-e00"]
    assert board["state_gated"] is True and board["regret"] == 0.5 and board["physics"] is False
    assert board["state_variables"] > 3 and board["reward_levels"] >= 2 and 0 <= board["x"] <= 1

    with (out / "steps.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["run"], r["step"]) for r in rows] == [("base", "0"), ("base", "2"), ("ablation", "0"), ("ablation", "2")]
    with (out / "envs.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 6
    for name in ("vendi", "learnable", "win_rate", "regret", "reward_levels", "reveal_gating", "program_size",
                 "collapse", "hint_leakage", "tsne", "distributions", "admission"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG, name


def test_analyze_refuses_a_missing_directory(tmp_path, capsys) -> None:
    assert main(["analyze", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_analyze_a_real_run_directory(train_config, tmp_path, capsys) -> None:  # noqa: F811
    """A real three-step ``spade train`` (tiny random Qwen3, the real sandbox and engine, k 2) whose
    designer is served by a canned OpenAI-compatible endpoint (the real client; it always writes
    remainder_oracle.py, so every regeneration admits the same class), then ``spade analyze`` on its
    directory: the numbers must match what the run wrote, and the repeats must show as collapse."""
    from test_external_designer import MODEL, CannedEndpoint
    from test_train_loop import run_spade

    server = CannedEndpoint(key=None)
    try:
        text = train_config.read_text()
        pool = next(line for line in text.splitlines() if "fixed_env_dir:" in line)
        text = text.replace(pool + "\n", "").replace("designer_enabled: false", "designer_enabled: true")
        text = text.replace("selfplay:\n", "selfplay:\n  train_designer: false\n  no_corpus_prompt: corpus_without_document\n"
                            f"  designer_endpoint: {{url: '{server.url}', model: {MODEL}, api_key_env: null}}\n")
        config = tmp_path / "designed.yaml"
        config.write_text(text)
        run = tmp_path / "run"
        run_spade("--config", str(config), "--run-dir", str(run), "run.steps=3")
    finally:
        server.close()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [int(r["env/admitted"]) for r in records if r["step"] in (0, 2)] == [2, 2], records

    out = tmp_path / "out"
    assert main(["analyze", str(run), "--out", str(out), "--embedding", "hashing"]) == 0
    data = json.loads((out / "analysis.json").read_text())
    (only,) = data["runs"]
    assert [(s["step"], s["n_envs"]) for s in only["steps"]] == [(0, 2), (2, 2)]
    assert only["collapse"]["longest_streak"] == 4  # one class, four environments in a row
    envs = data["envs"]
    assert len(envs) == 4 and {e["class_name"] for e in envs} == {"RemainderOracleEnv"}
    at_generation = {}  # the no-hint returns of each environment at the step that generated it
    for path in sorted((run / "trajectories").glob("step_*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry["kind"] == "env_returns" and entry["step"] == entry["generated_step"]:
                at_generation[entry["env_id"]] = entry["nohint_returns"]
    assert {e["env_id"]: e["n_nohint_plays"] for e in envs} == {k: len(v) for k, v in at_generation.items()}
    assert {e["env_id"]: e["win_rate"] for e in envs} == \
        {k: sum(r > 0 for r in v) / len(v) for k, v in at_generation.items()}
    assert all(e["kept_episodes"] > 0 for e in envs)
