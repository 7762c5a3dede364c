"""A run too short for a curve (issue 43): one regeneration step is named on the plot with its value,
not drawn as a lone dot; a run of two steps beside it is still a line."""

from __future__ import annotations

from spade.analysis.embeddings import make_embedder
from spade.analysis.plots import TOO_SHORT, _curve, _pyplot, plot_all
from spade.analysis.report import analyze
from spade.analysis.run_reader import read_runs
from test_analysis_fixture import example_source, make_run, two_env_run

PNG = b"\x89PNG\r\n\x1a\n"


def one_step_run(root):
    """Step 0 only: switchboard (no-hint win rate 0.25, in the learnable band) and remainder_oracle (0.0)."""
    envs = [
        {"env_id": "s000000-e00", "step": 0, "slot": 0, "skill": "Causal Inference", "class_name": "SwitchboardEnv",
         "source": example_source("switchboard"), "hint": "Flip each switch once.",
         "returns": {0: ([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0])}},
        {"env_id": "s000000-e01", "step": 0, "slot": 1, "skill": "Mathematical Reasoning",
         "class_name": "RemainderOracleEnv", "source": example_source("remainder_oracle"), "hint": "",
         "returns": {0: ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])}},
    ]
    return make_run(root, "short", envs, metrics=[{"step": 0, "agent/return_mean": 0.0}])


def test_a_one_step_run_is_named_not_dotted(tmp_path):
    runs = read_runs([one_step_run(tmp_path / "short"), two_env_run(tmp_path / "long", "long")])
    data = analyze(runs, make_embedder("hashing"), None).data
    plt = _pyplot()
    fig, ax = plt.subplots()
    try:
        _curve(ax, data, "learnable_share", "")
        # the two-step run is a line through steps 0 and 2; the one-step run draws nothing
        (line,) = ax.lines
        assert line.get_label() == "long" and list(line.get_xdata()) == [0, 2]
        notes = [t.get_text() for t in ax.texts if t.get_gid() == TOO_SHORT]
        # learnable share at step 0: one of two environments has a win rate in [0.2, 0.8]
        assert notes == ["short: one step (step 0, 0.5), too short for a curve"]
    finally:
        plt.close(fig)

    written = plot_all(data, None, tmp_path / "plots")
    assert all(path.read_bytes()[:8] == PNG for path in written)
