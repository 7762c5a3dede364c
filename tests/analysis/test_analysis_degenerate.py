"""``spade analyze``'s share of admitted environments a degenerate policy wins (issue 23), on small
hand-built run directories: read from the run's admission when its probes were on, played after
the fact in the sandbox (``--probe``) when they were off, unknown otherwise."""

from __future__ import annotations

import json

import pytest

from conftest import FAST_LIMITS
from spade.analysis.degenerate_share import recorded_verdicts, run_probes_after_the_fact
from spade.analysis.embeddings import make_embedder
from spade.analysis.report import analyze
from spade.analysis.run_reader import read_run
from spade.cli import main
from spade.envs.sandbox.config import SandboxConfig
from test_analysis_fixture import example_source, make_run
from test_degenerate_probes import FREE_LUNCH
from test_tool_degenerate_probes import EXPLOITS as TOOL_EXPLOITS
from test_tool_degenerate_probes import HONEST as HONEST_TOOL


def _env(env_id: str, step: int, slot: int, source: str, class_name: str, **extra) -> dict:
    return {"env_id": env_id, "step": step, "slot": slot, "skill": "Logical Deduction", "class_name": class_name,
            "source": source, "hint": "", **extra}


def games_run(root, name: str, selfplay: str, rejected=()):
    """Step 0: remainder_oracle (honest) and FreeLunchEnv (any reply wins); step 2: switchboard."""
    run = make_run(root, name, [_env("s000000-e00", 0, 0, example_source("remainder_oracle"), "RemainderOracleEnv"),
                                _env("s000000-e01", 0, 1, FREE_LUNCH, "FreeLunchEnv"),
                                _env("s000002-e00", 2, 0, example_source("switchboard"), "SwitchboardEnv")],
                   rejected=list(rejected))
    (run / "config.yaml").write_text(f"selfplay:\n  k: 2\n  max_turns: 25\n{selfplay}run:\n  steps: 4\n")
    return run


@pytest.fixture(scope="module")
def sandbox_config():
    return SandboxConfig(**FAST_LIMITS)


def _analysis(runs, probed=None):
    return analyze(runs, make_embedder("hashing"), None, with_map=False, probed=probed).data


def test_a_run_without_probes_is_unknown_until_probed_after_the_fact(tmp_path, sandbox_config):
    run = read_run(games_run(tmp_path, "old", ""))  # a config from before the probes: no admission.probes key
    recorded = recorded_verdicts([run])
    assert all(v.won is None for v in recorded.values())
    data = _analysis([run])
    assert [s["degenerate_share"] for s in data["runs"][0]["steps"]] == [None, None]
    assert data["runs"][0]["whole_run"]["degenerate_known"] == 0

    probed = run_probes_after_the_fact([run], sandbox_config, only_unknown=recorded)
    data = _analysis([run], probed)
    first, second = data["runs"][0]["steps"]
    # step 0: FreeLunchEnv won, remainder_oracle not; step 2: switchboard not
    assert (first["degenerate_known"], first["degenerate_won"], first["degenerate_share"]) == (2, 1, 0.5)
    assert (second["degenerate_known"], second["degenerate_won"], second["degenerate_share"]) == (1, 0, 0.0)
    whole = data["runs"][0]["whole_run"]
    assert (whole["degenerate_won"], whole["degenerate_known"], whole["degenerate_from"]) == (1, 3, "probe")
    assert whole["degenerate_share"] == pytest.approx(1 / 3)
    rows = {r["env_id"]: r for r in data["envs"]}
    assert rows["s000000-e01"]["degenerate_won"] is True and rows["s000000-e01"]["degenerate_policy"] == "boxed_0"
    assert rows["s000000-e00"]["degenerate_won"] is False and rows["s000000-e00"]["degenerate_policy"] is None


def test_a_run_whose_admission_probed_reads_its_record(tmp_path):
    """Probes on at admission: every admitted environment passed them (even a file that would not
    today: what was recorded is what counts), and the rejections for it are counted per step."""
    rejected = [{"step": 0, "slot": 1, "attempt": i, "kind": "degenerate_win", "stage": "degenerate_probe",
                 "message": "the probe policy 'boxed_0' wins"} for i in range(2)]
    run = read_run(games_run(tmp_path, "new", "  admission: {probes: true, paper_exact: false}\n", rejected))
    data = _analysis([run])
    first, second = data["runs"][0]["steps"]
    assert (first["degenerate_known"], first["degenerate_won"], first["rejected_degenerate_win"]) == (2, 0, 2)
    assert first["degenerate_share"] == 0.0 and first["degenerate_from"] == "admission"
    assert (second["degenerate_known"], second["rejected_degenerate_win"]) == (1, 0)
    assert data["runs"][0]["whole_run"]["rejected_degenerate_win"] == 2
    # paper-exact admission ran no probes, whatever admission.probes said
    exact = read_run(games_run(tmp_path, "exact", "  admission: {probes: true, paper_exact: true}\n"))
    assert all(v.won is None for v in recorded_verdicts([exact]).values())
    # a run written before the admission section: its flat keys say the same
    flat = read_run(games_run(tmp_path, "flat", "  admission_probes: true\n  admission_paper_exact: false\n", rejected))
    def verdicts(r):
        return [(v.won, v.source) for v in recorded_verdicts([r]).values()]

    assert verdicts(flat) == verdicts(run) and verdicts(run)[0] == (False, "admission")
    flat_exact = read_run(games_run(tmp_path, "flat_exact", "  admission_probes: true\n  admission_paper_exact: true\n"))
    assert all(v.won is None for v in recorded_verdicts([flat_exact]).values())


def test_tool_runs_recorded_and_probed(tmp_path, sandbox_config):
    exploit = TOOL_EXPLOITS["one repeated call completes everything"][0]
    envs = [_env("s000000-e00", 0, 0, HONEST_TOOL, "ProbeTargetEnv"),
            _env("s000000-e01", 0, 1, exploit, "ProbeTargetEnv")]
    run_dir = make_run(tmp_path, "tools", envs)
    (run_dir / "config.yaml").write_text("selfplay:\n  k: 2\n  domain: tool_use\n  max_turns: 12\n"
                                         "  admission: {probes: false}\n")
    run = read_run(run_dir)
    probed = run_probes_after_the_fact([run], sandbox_config, only_unknown=recorded_verdicts([run]))
    assert probed["tools:0:s000000-e01"].won is True and probed["tools:0:s000000-e01"].policy == "repeat_read"
    assert probed["tools:0:s000000-e00"].won is False
    # a tool environment's saved admission report is read as it is
    meta_path = run_dir / "envs" / "step_000000" / "s000000-e00.json"
    meta = json.loads(meta_path.read_text())
    meta["tool_report"] = {"probe_report": {"winner": None, "policies": []}}
    meta_path.write_text(json.dumps(meta))
    recorded = recorded_verdicts([read_run(run_dir)])
    assert recorded["tools:0:s000000-e00"].won is False and recorded["tools:0:s000000-e00"].source == "admission"
    assert recorded["tools:0:s000000-e01"].won is None


def test_cli_probe_flag(tmp_path, capsys):
    run = games_run(tmp_path, "cli", "  admission: {probes: false}\n")
    out = tmp_path / "out"
    args = ["analyze", str(run), "--out", str(out), "--embedding", "hashing", "--no-gating", "--no-plots"]
    assert main(args) == 0
    assert "won by a degenerate policy: unknown (spade analyze --probe)" in capsys.readouterr().out
    assert main(args + ["--probe", "--isolation", "bubblewrap"]) == 0
    # FREE_LUNCH pays any reply: the constant family wins it, one environment of the three
    assert "won by a degenerate policy 0.333 (of 3, probe; 0 rejected for it; constant 0.333)" in \
        capsys.readouterr().out
    run_data = json.loads((out / "analysis.json").read_text())["runs"][0]
    assert run_data["whole_run"]["degenerate_share_by_family"] == {"constant": pytest.approx(1 / 3)}
    steps = run_data["steps"]
    assert [s["degenerate_share"] for s in steps] == [0.5, 0.0]
    assert "degenerate_share" in (out / "steps.csv").read_text().splitlines()[0]
