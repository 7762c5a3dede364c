"""Per-gate rejection metrics (issue 23): a step whose set lost a game to the degenerate-policy
probes logs ``env/rejected_degenerate_win``; the counter is there (0) on every regeneration step
while the probes are on, and absent when they are off; tool sets count admitted environments in
which a probe policy completed some instruction (``env/tool_probe_partial``)."""

from __future__ import annotations

from spade.selfplay.sources.designer_source import EnvSpec, RegenerationResult
from spade.selfplay.step_figures import regeneration_figures
from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings
from spade.selfplay.step import Step

from test_degenerate_probes import FREE_LUNCH
from test_orchestrator import EXAMPLE_SOURCE, engine, make, tokenizer  # noqa: F401 - fixtures


def _pool(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "free_lunch.py").write_text(FREE_LUNCH)
    (pool / "remainder_oracle.py").write_text(EXAMPLE_SOURCE)
    return pool


def test_a_step_with_a_degenerate_game_rejected_logs_the_counter(sandbox, engine, tokenizer, tmp_path):  # noqa: F811
    orch = make(sandbox, engine, tokenizer, tmp_path / "run", None, designer_enabled=False,
                fixed_env_dir=str(_pool(tmp_path)), admission=AdmissionSettings(probes=True))
    out = sandbox.run(orch.run_step(Step(0)), timeout=180)
    m = out.metrics
    assert m["env/admitted"] == 1 and m["env/rejected"] == 1 and m["env/rejected_degenerate_win"] == 1
    assert [env.env_id for env in orch.envs] == ["fixed-remainder_oracle"]


def test_the_counter_is_zero_while_the_probes_are_on_and_absent_when_off():
    def metrics(**settings):
        out: dict[str, float] = {}
        out.update(regeneration_figures(SelfPlaySettings(**settings), RegenerationResult(attempts=1)))
        return out

    assert metrics()["env/rejected_degenerate_win"] == 0.0
    assert "env/rejected_degenerate_win" not in metrics(admission=AdmissionSettings(probes=False))
    assert "env/rejected_degenerate_win" not in metrics(admission=AdmissionSettings(paper_exact=True))
    assert "env/rejected_degenerate_win" not in metrics(env_source="rlve")


def test_tool_sets_count_partial_completions_by_a_probe_policy():
    def spec(slot: int, completed: list[list[int]] | None) -> EnvSpec:
        probes = None if completed is None else {"policies": [{"policy": f"p{i}", "completed": c}
                                                              for i, c in enumerate(completed)]}
        return EnvSpec(env_id=f"e{slot}", slot=slot, skill="s", source="", hint="", class_name="E", max_turns=5,
                       generated_step=0, tool_report={"true_at_reset": [], "unchangeable": [], "trivial": [],
                                                      "screen": None, "probe_report": probes})

    out: dict[str, float] = {}
    regen = RegenerationResult(envs=[spec(0, [[0, 0], [1, 0]]), spec(1, [[0, 0], [0, 0]]), spec(2, [[2, 1]])])
    out.update(regeneration_figures(SelfPlaySettings(domain="tool_use"), regen))
    assert out["env/tool_probe_partial"] == 2.0
    out = {}
    out.update(regeneration_figures(SelfPlaySettings(domain="tool_use"), RegenerationResult(envs=[spec(0, None)])))
    assert "env/tool_probe_partial" not in out
